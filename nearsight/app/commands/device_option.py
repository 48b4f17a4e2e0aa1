"""The one ``--device`` option: where a command's model runs (or trains)."""

from __future__ import annotations

from typing import Any, Protocol

DEVICES = ("auto", "cpu", "cuda")


class ArgumentTarget(Protocol):
    """A parser or one of its argument groups."""

    def add_argument(self, *names: str, **options: Any) -> Any: ...


def add_device_option(parser: ArgumentTarget, default: str | None = "auto") -> None:
    """``--device {auto,cpu,cuda}`` (auto: CUDA where onnxruntime or torch has it, else the
    CPU); ``default=None`` leaves it to a config file (``train``)."""
    parser.add_argument(
        "--device",
        default=default,
        choices=DEVICES,
        help="auto (CUDA where present, else the CPU) | cpu | cuda",
    )
