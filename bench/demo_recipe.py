"""The demo's recipe, one choice at a time: Recall@1 on the unseen synthetic classes at a fixed
number of steps, and the training images/s, for the shipped recipe and each variant.

Every run is the real trainer (``training.run.train``) on the demo's dataset (100 classes x 24
images at 96 px, seed 0: 50 classes to train on, 50 unseen test classes), from scratch, with
the demo's own config (``app.commands.demo.demo_config``) and one change. Comparing at a fixed
step count keeps the comparison fair on a shared, loaded CPU; images/s says what a step costs.

    python bench/demo_recipe.py --steps 300                    # every variant
    python bench/demo_recipe.py --steps 300 --variants demo constant-lr
    python bench/demo_recipe.py --steps 150 --variants demo fp32 --seeds 0 1 2   # bf16 vs fp32
    python bench/demo_recipe.py --steps 300 --threads 1 --variants demo one-head &
    python bench/demo_recipe.py --steps 300 --threads 1 --variants normsoftmax 64px

Two 1-thread processes side by side use both cores for twice the runs per hour; their Recall@1
is what compares, not their images/s. Each result carries the load averages as it began and
ended. The recipe itself is nearsight/training/configs/demo.yaml; results: docs/demo.md, "How
the recipe was chosen", with the load they ran under.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from nearsight.app.commands.demo import demo_config
from nearsight.data.datasets.synthetic import write_synthetic
from nearsight.training.config import apply_override, validate
from nearsight.training.run import train

# the demo before this recipe: one head on layer4, the galleries on its embedding
ONE_HEAD = {"model.heads": ["layer4"], "model.embedding": "last"}
NORMSOFTMAX = {"loss.name": "normsoftmax", "optim.loss_lr": 1e-2}

# each against the shipped demo recipe (ICE, heads on layer2/3/4, concatenated)
VARIANTS: dict[str, dict[str, Any]] = {
    "demo": {},
    # the precision the hardware chooses (bf16 + channels_last where native) against fp32
    "fp32": {"amp": False, "channels_last": False},
    "constant-lr": {"optim.schedule": "constant", "optim.warmup_steps": 0},
    "64px": {"data.image_size": 64},
    "no-cache": {"data.cache_images": False},
    "crop-0.16": {"data.crop_scale": [0.16, 1.0]},
    "rll": {"loss.name": "rll"},
    "normsoftmax": NORMSOFTMAX,
    "normsoftmax-64px": {**NORMSOFTMAX, "data.image_size": 64},
    # this round's candidates for a better recipe (issue 41)
    "lr-2e-3": {"optim.lr": 2e-3, "optim.head_lr": 2e-3},
    "lr-1.5e-3": {"optim.lr": 1.5e-3, "optim.head_lr": 1.5e-3},
    "56px": {"data.image_size": 56},
    "four-heads": {"model.heads": ["layer1", "layer2", "layer3", "layer4"]},
    "64px-four-heads": {
        "data.image_size": 64,
        "model.heads": ["layer1", "layer2", "layer3", "layer4"],
    },
    "four-heads-wsd-0.5": {
        "model.heads": ["layer1", "layer2", "layer3", "layer4"],
        "optim.decay_start": 0.5,
    },
    "ice-scale-32": {"loss.params.scale": 32},
    "ice-scale-16": {"loss.params.scale": 16},
    "ice-symmetric": {"loss.params.symmetric": True},
    "wsd-0.5": {"optim.decay_start": 0.5},
    "crop-0.8": {"data.crop_scale": [0.8, 1.0]},
    "crop-0.4": {"data.crop_scale": [0.4, 1.0]},
    "16x2": {"sampler.classes_per_batch": 16, "sampler.per_class": 2},
    "16x4": {"sampler.classes_per_batch": 16},
    "dim-64": {"model.dim": 64},
    "dim-256": {"model.dim": 256},
    "wd-5e-4": {"optim.weight_decay": 5e-4},
    "no-flip": {"data.flip": False},
    "one-head": ONE_HEAD,
    "one-head-32px": {**ONE_HEAD, "data.image_size": 32},
    "one-head-16x4": {**ONE_HEAD, "sampler.classes_per_batch": 16},
    "one-head-lr-3e-3": {**ONE_HEAD, "optim.lr": 3e-3, "optim.head_lr": 3e-3},
    "one-head-proxyanchor": {**ONE_HEAD, "loss.name": "proxyanchor", "optim.loss_lr": 1e-2},
    "one-head-normsoftmax": {**ONE_HEAD, **NORMSOFTMAX},
    "one-head-normsoftmax-64px": {**ONE_HEAD, **NORMSOFTMAX, "data.image_size": 64},
    "one-head-normsoftmax-no-crop": {**ONE_HEAD, **NORMSOFTMAX, "data.crop_scale": [1.0, 1.0]},
    "one-head-normsoftmax-lr-5e-4": {
        **ONE_HEAD,
        **NORMSOFTMAX,
        "optim.lr": 5e-4,
        "optim.head_lr": 5e-4,
    },
}


def run_variant(
    data: Path, out: Path, name: str, steps: int, workers: int, seed: int = 0
) -> dict[str, Any]:
    args = argparse.Namespace(
        image_size=None, workers=workers, loss=None, classes=100, steps=steps, train_seconds=None
    )
    config = demo_config(args, data)
    for key, value in {**VARIANTS[name], "seed": seed}.items():
        apply_override(config, key, value)
    validate(config)
    load_before = _load()
    result = train(config, out)
    evaluations = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rates = [json.loads(x)["images_per_s"] for x in (out / "train.jsonl").read_text().splitlines()]
    return {
        "variant": name,
        "seed": seed,
        "steps": result.steps,
        "train_seconds": round(result.train_seconds, 1),
        "images_per_s": round(statistics.median(rates[2:] or rates), 1),
        "untrained_recall@1": evaluations[0]["recall@1"],
        "trained_recall@1": result.last["recall@1"],
        "trained_recall@8": result.last.get("recall@8"),
        # the load averages (1, 5, 15 min) as the run began and ended: what its time means
        "load_before": load_before,
        "load_after": _load(),
    }


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="one run per seed")
    parser.add_argument("--data", type=Path, help="the demo's synthetic dataset (made if missing)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--threads", type=int, help="torch threads (two 1-thread runs side by side use 2 cores)"
    )
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data or Path(tmp) / "synth"
        if not (data / "synthetic.json").exists():
            write_synthetic(data, classes=100, per_class=24, size=96, seed=0)
        for seed in args.seeds:
            for name in args.variants:
                out = Path(tmp) / f"run-{name}-{seed}"
                results.append(run_variant(data, out, name, args.steps, args.workers, seed))
                print(json.dumps(results[-1]), flush=True)
    print(
        f"\n{'variant':<14}{'seed':>5}{'steps':>6}{'seconds':>9}{'img/s':>7}{'R@1 before':>12}"
        f"{'R@1 after':>11}"
    )
    for r in results:
        print(
            f"{r['variant']:<14}{r['seed']:>5}{r['steps']:>6}{r['train_seconds']:>9}"
            f"{r['images_per_s']:>7}{r['untrained_recall@1']:>12.4f}{r['trained_recall@1']:>11.4f}"
        )
    for name in args.variants:
        after = [r["trained_recall@1"] for r in results if r["variant"] == name]
        spread = f" +- {statistics.stdev(after):.4f}" if len(after) > 1 else ""
        print(
            f"{name}: mean R@1 after {statistics.mean(after):.4f}{spread} over {len(after)} seeds"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
