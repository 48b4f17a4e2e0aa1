"""The training step under ``torch.compile``: the embedding network (forward and, through
AOTAutograd, backward) and the loss, each compiled for the static shapes of the batch design.

``compile`` in the training config: ``auto`` (on CUDA: ``default``; on a CPU: off, where the
compile time is not won back), ``off``, or a ``torch.compile`` mode (``default``,
``reduce-overhead`` for CUDA graphs, ``max-autotune-no-cudagraphs``, ``max-autotune``).

A loss whose step has data-dependent shapes says so with a class attribute ``compile_note``
(why it cannot be one graph); the trainer then compiles the network alone and runs that loss
eagerly. The optimiser is not compiled: on CUDA it is the fused kernel already.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import torch
from torch import nn

from nearsight.training.config_checks import COMPILE_SETTINGS

__all__ = ["COMPILE_SETTINGS", "CompiledStep", "loss_compile_note", "resolve_compile"]

log = logging.getLogger(__name__)
Result = TypeVar("Result")

CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def resolve_compile(setting: bool | str, *, cuda: bool, world: int = 1) -> str | None:
    """The ``torch.compile`` mode the step runs under, or None for eager (``off``/false;
    true is mode ``default``). Several processes (DDP) stay eager: its bucketed graph
    splitting is not what the GPU check measured."""
    if setting is False or setting == "off" or world > 1:
        return None
    if setting is True:
        return "default"
    if setting == "auto":
        return "default" if cuda else None
    return setting


def loss_compile_note(loss: nn.Module) -> str | None:
    """Why ``loss`` is not compiled into the step (None: it is), from its ``compile_note``
    (a per-head loss answers for its heads)."""
    heads = getattr(loss, "heads", None)
    if isinstance(heads, nn.ModuleList) and len(heads):
        return loss_compile_note(heads[0])
    note = getattr(loss, "compile_note", None)
    return str(note) if note else None


class CompiledStep:
    """The step's network and loss calls, compiled under ``mode``; :meth:`fall_back` returns
    them to eager for the rest of the run when compiling fails."""

    def __init__(self, model: nn.Module, loss: nn.Module, mode: str | None):
        self.mode = mode
        self.eager_model, self.eager_loss = model, loss
        self.loss_note = loss_compile_note(loss)
        self.model: Callable[..., Any] = model
        self.loss: Callable[..., Any] = loss
        self._ran: set[Hashable] = set()  # the kinds of step that ran compiled
        if mode is not None:
            options: dict[str, Any] = {"mode": mode, "dynamic": False}
            self.model = torch.compile(model, **options)
            if self.loss_note is None:
                self.loss = torch.compile(loss, **options)
            else:
                log.info("loss not compiled (%s)", self.loss_note)

    @property
    def compiled(self) -> bool:
        return self.mode is not None

    def begin(self) -> None:
        """Before each step: CUDA graphs' outputs of the previous step may be overwritten."""
        if self.mode in CUDA_GRAPH_MODES:
            torch.compiler.cudagraph_mark_step_begin()

    def guarded(self, run: Callable[[], Result], kind: Hashable) -> Result:
        """``run()`` one step; the first step of each ``kind`` (a graph of its own, e.g.
        RankMI's critic batches) compiles, and when that fails it runs again, as does the rest
        of the run, eagerly: the failure happens while compiling, before anything changed."""
        if self.mode is None or kind in self._ran:
            return run()
        try:
            result = run()
        except Exception as error:  # a compiler's failure: the run is not lost, only slower
            self.fall_back(error)
            return run()
        self._ran.add(kind)
        return result

    def fall_back(self, error: BaseException) -> None:
        line = " ".join(str(error).split())[:300]
        log.warning(
            "torch.compile failed, the step runs eagerly: %s: %s", type(error).__name__, line
        )
        self.mode = None
        self.model, self.loss = self.eager_model, self.eager_loss
