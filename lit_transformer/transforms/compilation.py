"""torch.compile, applied from outside the model code: each block in place, or the training step's forward and loss
as one function. Both keep the parameter names, so checkpoints are the same with and without it."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from lit_transformer.errors import ConfigError
from lit_transformer.transforms.base import blocks


def _backend() -> str:
    """torch.compile's backend: inductor, unless $LIT_TRANSFORMER_COMPILE_BACKEND names another (`aot_eager` makes a
    CPU dry run of a compiled fit take seconds instead of inductor's minutes of C++ builds)."""
    return os.environ.get("LIT_TRANSFORMER_COMPILE_BACKEND", "inductor")


def compile_blocks(model: nn.Module, mode: str | None = None) -> None:
    """torch.compile each block in place: one graph serves every layer, and parameter names do not change."""
    for block in blocks(model):
        block.compile(mode=mode, backend=_backend())


def compile_function(fn: Callable, mode: str | None = None, fullgraph: bool = False) -> Callable:
    """torch.compile a function (a training step's forward and loss): the one place the package calls it, so a test
    can choose a faster backend."""
    return torch.compile(fn, mode=mode, fullgraph=fullgraph, backend=_backend())


class CompiledStep:
    """A compiled training step `fn(batch) -> tensors` whose number of graphs stays bounded when batch shapes vary.

    Token-budget batches (translation, classification) bring a new (rows, source length, target length) at almost
    every step. Left to itself, torch.compile specialises a first graph on the first batch's sizes and compiles a
    second, dynamic one at the first new shape (measured on 200 batches of translate-en-es: 2 graphs, so two cold
    compiles before step 2; on a GPU each is tens of seconds for the paper's model, and any size guard the second
    graph picks up, an alignment or sizes equal by chance, costs one more). With `dynamic`, every dimension of the
    first batch's tensors is marked dynamic before the first call: one graph with symbolic sizes serves every batch
    (measured: 1 graph), with no padding, so the loss is eager's. Batches of one fixed shape (language-model blocks)
    pass dynamic=False and keep a static graph.

    Under mode="reduce-overhead" (CUDA graphs) each call begins a new CUDA-graph step, so the outputs of the step
    before (kept by the caller for logging) are never overwritten by a replay.
    """

    def __init__(self, fn: Callable, mode: str | None = None, fullgraph: bool = False, dynamic: bool = False) -> None:
        self.compiled = compile_function(fn, mode=mode, fullgraph=fullgraph)
        self.dynamic = dynamic
        self.cuda_graphs = mode is not None and "reduce-overhead" in mode
        self._marked = False

    def __call__(self, batch: dict[str, Any]) -> Any:
        if self.dynamic and not self._marked:
            for value in batch.values():
                if isinstance(value, torch.Tensor):
                    for dim in range(value.dim()):
                        # maybe_: a size of 0 or 1 may still specialise (a graph for it) instead of raising.
                        torch._dynamo.maybe_mark_dynamic(value, dim)
            self._marked = True
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        return self.compiled(batch)


def check_compile_mode(mode: str) -> None:
    """torch.compile's mode, judged by torch itself before any data is read: an unknown one (a typo) raised a
    RuntimeError at the first compiled step, after the data was prepared."""
    from torch._inductor import list_mode_options

    try:
        list_mode_options(mode)
    except RuntimeError as error:
        known = str(error).split("should be one of:", 1)[-1].strip()
        raise ConfigError(
            f"model.compile_mode={mode!r} is not a torch.compile mode: give one of {known}, or null (torch's default)",
            keys=["model.compile_mode"],
        ) from error
