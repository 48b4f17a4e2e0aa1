"""``nearsight reproduce``: train, export, index and evaluate a config, then compare with its paper.

The run folder holds one folder or file per stage, each written atomically, so a stage whose
output is there is complete and is skipped on the next run::

    RUN/reproduce.json   what is being reproduced (config, root, overrides) and stage timings
    RUN/train/           the training run; result.json once it has finished. A run killed
                         part way resumes from its last.pt (nearsight/training/trainer.py)
    RUN/model.onnx       best.pt exported and parity-checked
    RUN/gallery/         the test split indexed (a killed build reuses its finished chunks)
    RUN/metrics.json     the paper's protocol on the gallery (Recall@k, NMI as the paper
                         defines it where it reports one, MAP@R)
    RUN/reproduction.md, RUN/reproduction.json   the paper's row beside ours

Under torchrun, training is distributed data parallel and the index is built one shard per
process; export, evaluation and the report are process 0's.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nearsight.core.atomic import atomic_file
from nearsight.core.errors import NearsightError
from nearsight.index.catalog.store import CATALOG_FILE
from nearsight.training.paper import PaperRow, protocol_metrics, read_paper

SELECTIONS = ("test", "val")
# the held-out share of training classes that chooses best.pt under --selection val, unless
# data.val_classes is set
DEFAULT_VAL_CLASSES = 0.1
STAGES = ("train", "export", "index", "eval")


@dataclass
class Reproduction:
    config: str  # a config file, or a shipped config's name
    root: Path
    out: Path
    overrides: dict[str, Any] = field(default_factory=dict)  # --set
    selection: str = "test"  # test: best.pt by test Recall@1 (the papers); val: held out
    workers: int | None = None  # image decoding processes of the index build
    device_kind: str = "cpu"  # "cuda" when training runs on CUDA (the process group's backend)

    @property
    def rank(self) -> int:
        return int(os.environ.get("RANK", "0"))

    @property
    def world(self) -> int:
        return int(os.environ.get("WORLD_SIZE", "1"))

    # -- the settings -----------------------------------------------------------------------
    def training_overrides(self) -> dict[str, Any]:
        overrides = dict(self.overrides)
        overrides["data.root"] = str(self.root)
        # the training's evaluations (the final-step and best-test rows) report NMI as the
        # paper defines it
        overrides["nmi_average"] = read_paper(self.config).nmi
        if self.selection == "val":
            overrides.setdefault("data.val_classes", DEFAULT_VAL_CLASSES)
        elif overrides.get("data.val_classes", 0):
            raise NearsightError(
                "--selection test chooses best.pt on the test split: drop data.val_classes, "
                "or use --selection val"
            )
        else:
            overrides["data.val_classes"] = 0
        return overrides

    def identity(self) -> dict[str, Any]:
        """What makes two invocations the same reproduction (so the second may resume)."""
        return {
            "config": self.config,
            "root": str(self.root),
            "overrides": self.overrides,
            "selection": self.selection,
        }

    # -- the run ------------------------------------------------------------------------------
    def run(self) -> dict[str, Any] | None:
        """Every stage not yet complete, then the report (process 0); returns the report.
        Whether a stage is complete is read from its files, so every process of a torchrun
        agrees on which stages to run."""
        from nearsight.training.config import load_config

        paper = read_paper(self.config)
        config = load_config(self.config, self.training_overrides())  # bad settings fail here
        self.device_kind = "cuda" if config.device != "cpu" and _cuda() else "cpu"
        from nearsight.data.datasets import load_dataset

        load_dataset(config.data.dataset, self.root, "test")  # a wrong --root: before any file
        if not (self.out / "train" / "result.json").is_file():
            _check_pretrained(config)  # missing ImageNet weights: before any file too
        state = self._start()
        self._train(config, state)
        self._barrier()
        if self.rank == 0:
            self._stage(state, "export", self.out / "model.onnx", self._export)
        self._barrier()
        gallery = self.out / "gallery" / CATALOG_FILE
        self._stage(state, "index", gallery, lambda: self._index(config.data.dataset))
        if self.rank != 0:
            return None
        metrics = self.out / "metrics.json"
        self._stage(state, "eval", metrics, lambda: self._evaluate(config.data.dataset, paper))
        from nearsight.app.reproduce.table import write_report

        return write_report(self, paper, config, state)

    def _state_path(self) -> Path:
        return self.out / "reproduce.json"

    def _start(self) -> dict[str, Any]:
        """The state of this run folder: new, or the same reproduction as before (checked by
        process 0; the others wait for it)."""
        path = self._state_path()
        if self.rank != 0:
            self._barrier()
            return {"identity": self.identity(), "stages": {}}
        if path.is_file():
            state = json.loads(path.read_text())
            if state.get("identity") != self.identity():
                raise NearsightError(
                    f"{self.out} holds a reproduction of other settings "
                    f"({json.dumps(state.get('identity'))}): choose a new --out"
                )
            self._barrier()
            return state
        if self.out.exists() and (not self.out.is_dir() or any(self.out.iterdir())):
            raise NearsightError(
                f"--out {self.out} exists and is not a reproduction: choose a new one"
            )
        state = {"identity": self.identity(), "stages": {}}
        self._save_state(state)
        self._barrier()
        return state

    def _save_state(self, state: dict[str, Any]) -> None:
        if self.rank == 0:
            with atomic_file(self._state_path(), "w") as handle:
                json.dump(state, handle, indent=2)

    def _stage(self, state: dict[str, Any], name: str, output: Path, work) -> None:
        """Run ``work`` unless its ``output`` (written last, atomically) is there; record its
        time."""
        if output.exists():
            _say(f"{name}: complete, skipped")
            return
        started = time.perf_counter()
        extra = work() or {}
        if self.rank == 0:
            state["stages"][name] = {"seconds": round(time.perf_counter() - started, 2), **extra}
            self._save_state(state)

    def _train(self, config, state: dict[str, Any]) -> None:
        folder = self.out / "train"
        done = folder / "result.json"
        if done.is_file():
            _say("train: complete, skipped")
            return
        from nearsight.training.run import resume_config, train

        resume = (folder / "last.pt").is_file()
        if resume:
            config = resume_config(folder)  # the settings the run started with
            _say(f"train: resuming {folder}")
        started = time.perf_counter()
        result = train(config, folder, resume=resume)
        if self.rank == 0:
            with atomic_file(done, "w") as handle:
                json.dump(result.to_dict(), handle, indent=2)
            state["stages"]["train"] = {
                "seconds": round(time.perf_counter() - started, 2),
                "train_seconds": round(result.train_seconds, 2),
                "device": _device(config.device),
                "precision": result.precision,  # bf16 or fp32: what this invocation ran
                "precision_detail": result.precision_detail,
                "processes": self.world,
                "resumed": resume,  # seconds counts this invocation only
            }
            self._save_state(state)

    def _export(self) -> dict[str, Any]:
        from nearsight.models.export import export

        report = export(
            self.out / "train" / "best.pt",
            self.out / "model.onnx",
            log=lambda line: _say(f"export: {line}"),
        )
        return {"max_abs_diff": report.max_abs_diff}

    def _index(self, dataset: str) -> None:
        """The test split embedded by the exported model: the builder ``nearsight index build``
        runs (resumable chunks; one shard per process under torchrun), with its defaults."""
        from nearsight.index.gallery.build import build_gallery
        from nearsight.index.gallery.defaults import DEFAULT_WORKERS
        from nearsight.index.gallery.keys import declared_meta_types
        from nearsight.index.gallery.sources import dataset_source
        from nearsight.models.loading import load_embedder

        model = self.out / "model.onnx"
        source = dataset_source(dataset, self.root, "test", declared_meta_types(None))
        workers = DEFAULT_WORKERS if self.workers is None else self.workers
        report = build_gallery(load_embedder(model), source, self.out / "gallery",
                               model_path=model, workers=workers)  # fmt: skip
        _say(f"index: {report.summary()}")

    def _evaluate(self, dataset: str, paper: PaperRow) -> None:
        from nearsight.index.gallery.core import Gallery
        from nearsight.search.evaluate import evaluate_gallery

        protocol = {int(m[7:]) for m in protocol_metrics(dataset) if m.startswith("recall@")}
        ks = sorted(protocol | set(paper.ks()))  # the protocol's k and any the paper adds
        with Gallery.open(self.out / "gallery") as gallery:
            metrics = evaluate_gallery(gallery, ks, nmi_average=paper.nmi)
        with atomic_file(self.out / "metrics.json", "w") as handle:
            json.dump({"nmi_average": paper.nmi, "metrics": _finite(metrics)}, handle, indent=2)

    def _barrier(self) -> None:
        """Wait for every process of a torchrun, joining the process group the trainer would
        (NCCL for CUDA training, else gloo) if none exists yet."""
        if self.world <= 1:
            return
        import torch
        import torch.distributed as dist

        from nearsight.training.distributed import init_distributed

        info = init_distributed(self.device_kind)
        if dist.get_backend() == "nccl":
            torch.cuda.set_device(info.local_rank)
            dist.barrier(device_ids=[info.local_rank])
        else:
            dist.barrier()


def _check_pretrained(config) -> None:
    """The weights the training starts from are at hand: cached ImageNet weights, or else
    downloaded now, or a one-line error naming --pretrained none and --pretrained FILE.pth;
    a weights file that can be read."""
    from nearsight.models.weights import imagenet_cache_path, is_imagenet, resolve_pretrained

    pretrained, arch = config.model.pretrained, config.model.arch
    if pretrained in ("none", "auto"):
        return
    if pretrained == "hub":  # a timm trunk's weights: the Hugging Face cache, or a download
        from nearsight.models.timm_weights import hub_weights_file

        hub_weights_file(arch)
        return
    if is_imagenet(pretrained) and imagenet_cache_path(arch, pretrained).is_file():
        return
    resolve_pretrained(pretrained, arch)


def _finite(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and v != v else v) for k, v in metrics.items()}


def _cuda() -> bool:
    from nearsight.training.distributed import cuda_available

    return cuda_available()


def _device(setting: str) -> str:
    import torch

    if setting != "cpu" and torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)} (CUDA)"
    return f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
