"""Which optional extra of nearsight brings a module, for the one line a command says when it
needs one that is not installed (``pip install .`` is the serving set only)."""

from __future__ import annotations

# import name -> the smallest extra in pyproject.toml that installs it
# (tests/app/test_error_guidance.py checks that every requirement of [train] and [data] is here)
EXTRA_MODULES = {
    "torch": "train",
    "torchvision": "train",
    "onnx": "train",
    "pytorch_metric_learning": "train",
    "sklearn": "train",
    "scipy": "data",  # CARS196's cars_annos.mat; [train] brings it too
    "pyarrow": "data",  # Parquet metadata for index import
    "tensorboard": "train",
    "timm": "train",
    "safetensors": "train",
    "umap": "map",
    "cleanlab": "inspect",  # inspect labels
    "imagehash": "inspect",  # inspect duplicates
}


def missing_extra(error: ImportError) -> str | None:
    """The line for an import that failed because an extra is not installed, or None when the
    missing module is not one of an extra's (a real bug: keep its traceback)."""
    if not isinstance(error, ModuleNotFoundError):
        return None
    module = (error.name or "").split(".")[0]
    extra = EXTRA_MODULES.get(module)
    if extra is None:
        return None
    return (
        f"{module} is not installed; it comes with nearsight's [{extra}] extra: "
        f"pip install 'nearsight[{extra}]'"
    )
