"""bench/gpu_check.py part ``timm``: bench/timm_backbones.py on the GPU. For each family (CNN:
ResNet-50, ConvNeXt-T, ViT-S/16; timm's test_* models in --cpu-smoke), the training step of
nearsight's network under ICE against the bare timm model under cross-entropy (bf16 autocast,
batch 64, on the GPU), and the ONNX export with its parity, int8 cosine and onnxruntime CPU
images/s (fp32, int8)."""

from __future__ import annotations

import argparse

from gpu_check_common import Context, Part
from timm_backbones import FAMILIES, SMOKE_FAMILIES, export_rows, train_rows

FULL_BATCH = 64
# --cpu-smoke runs this part's own code with one family: bench/timm_backbones.py --smoke (the
# bench smoke tests) runs the same train step and export of every family at the same sizes
SMOKE_RUN = ("cnn",)


def run_timm(ctx: Context, part: Part) -> None:
    ctx.require_gpu("the timm train step")
    args = argparse.Namespace(
        image_size=ctx.sizes.image_size,
        batch=4 if ctx.smoke else FULL_BATCH,
        rounds=1 if ctx.smoke else 5,
        warmup=1 if ctx.smoke else 2,
        calibration=4 if ctx.smoke else 32,
        device=ctx.device,
    )
    from nearsight.data.datasets.synthetic import write_synthetic

    data = ctx.workdir / "timm_calibration"
    if not data.exists():
        write_synthetic(data, classes=8, per_class=4, size=max(64, args.image_size), seed=0)
    images = sorted(data.rglob("*.png"))
    for family, arch in (SMOKE_FAMILIES if ctx.smoke else FAMILIES).items():
        if ctx.smoke and family not in SMOKE_RUN:
            part.skip_row(f"{family} ({arch[5:]})", "not run in --cpu-smoke: bench/"
                          "timm_backbones.py --smoke runs its train step and export")  # fmt: skip
            continue
        work = ctx.workdir / "timm" / family
        work.mkdir(parents=True, exist_ok=True)
        train = train_rows(arch, args)
        part.row(
            f"{family} train step ({arch[5:]})",
            train["train_images_per_s"],
            "img/s",
            peer=train["bare_train_images_per_s"],
            note="peer: the bare timm model under cross-entropy (goal: ratio >= 0.9)",
        )
        export = export_rows(arch, args, work, images)
        part.row(
            f"{family} export + parity",
            export["export_seconds"],
            "s",
            note=f"max |torch - onnxruntime| {export['parity_max_abs_diff']:.1e}",
        )
        part.row(
            f"{family} onnxruntime CPU int8",
            export["ort_int8_images_per_s"],
            "img/s",
            peer=export["ort_fp32_images_per_s"],
            note=f"peer: fp32; int8 cosine to fp32 {export['int8_cosine_mean']:.4f}",
        )
