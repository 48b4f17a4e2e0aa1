"""Starting an onnxruntime session: which providers (CUDA only when a GPU really works here),
how many threads, and a quiet fall back to the CPU when a GPU provider cannot start.

No torch here: serving an ONNX model must not need it.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nearsight.core.errors import NearsightError
from nearsight.core.threads import physical_cores, worker_threads  # noqa: F401  (re-exported)


def _cuda_works() -> bool:
    """onnxruntime-gpu lists CUDAExecutionProvider even on a machine without a GPU; ask the
    CUDA driver (libcuda) whether it sees a device. No torch: serving must not need it."""
    import ctypes
    import ctypes.util

    name = "nvcuda.dll" if os.name == "nt" else "libcuda.so.1"
    try:
        driver = ctypes.CDLL(ctypes.util.find_library("cuda") or name)
        count = ctypes.c_int(0)
        return (
            driver.cuInit(0) == 0
            and driver.cuDeviceGetCount(ctypes.byref(count)) == 0
            and count.value > 0
        )
    except (OSError, AttributeError):  # no driver, or a broken one
        return False


def default_providers(device: str = "auto") -> list[str]:
    """The providers to ask onnxruntime for: CUDA first when it really works here."""
    import onnxruntime as ort

    if device not in ("auto", "cpu", "cuda"):
        raise NearsightError(f"device must be auto, cpu or cuda, got {device!r}")
    cuda_listed = "CUDAExecutionProvider" in ort.get_available_providers()
    if device == "cuda" and not (cuda_listed and _cuda_works()):
        raise NearsightError("--device cuda: no working CUDA GPU for onnxruntime here")
    if device != "cpu" and cuda_listed and _cuda_works():
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


@functools.cache
def _preload_cuda_libraries() -> None:
    """onnxruntime-gpu finds CUDA/cuDNN (cuBLAS, cuRAND...) in the nvidia-* pip packages only
    when told to; torch does not load all of them (cuRAND), so the CUDA provider would fail."""
    import onnxruntime as ort

    with contextlib.suppress(Exception):
        ort.preload_dlls()


def open_session(path: Path, options: Any, providers: list[str]) -> Any:
    """An onnxruntime session on ``providers``; a GPU provider that fails to start falls back to
    the CPU without onnxruntime's multi-line "EP Error ... Falling back" (one note line instead
    when a GPU is there: :func:`_note_gpu_fallback`); a file onnxruntime cannot read is
    NearsightError."""
    import onnxruntime as ort

    try:
        if providers == ["CPUExecutionProvider"]:
            return ort.InferenceSession(str(path), options, providers=providers)
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _preload_cuda_libraries()
            # a GPU provider that cannot start logs through the default logger; quiet it for
            # this attempt (then back to onnxruntime's default, warnings)
            ort.set_default_logger_severity(4)
            try:
                session = ort.InferenceSession(str(path), options, providers=providers)
            except Exception:
                cpu = ["CPUExecutionProvider"]
                session = ort.InferenceSession(str(path), options, providers=cpu)
            finally:
                ort.set_default_logger_severity(2)
        _note_gpu_fallback(providers, session.get_providers())
        return session
    except Exception as error:
        reason = " ".join(str(error).split())[:200]
        raise NearsightError(
            f"{path} is not a nearsight model: onnxruntime cannot read it ({reason})"
        ) from None


def _note_gpu_fallback(wanted: Sequence[Any], started: Sequence[str]) -> None:
    """One line on stderr when a GPU is there but onnxruntime could not start the GPU provider
    asked for first (a CUDA/cuDNN mismatch...), so serving on the CPU is not a silent surprise.
    Nothing on a machine without a GPU: there the CPU is what ``auto`` means."""
    first = wanted[0] if isinstance(wanted[0], str) else wanted[0][0]
    if first == "CPUExecutionProvider" or first in started or not _cuda_works():
        return
    print(
        f"nearsight: note: onnxruntime could not start {first} on this GPU (see onnxruntime's "
        "CUDA and cuDNN requirements); running on the CPU",
        file=sys.stderr,
    )
