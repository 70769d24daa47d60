"""Activation checkpointing and compilation, applied to the plain model from outside (torchtitan's way).

The model code knows nothing of either: both act on the block classes by name, and both keep the parameter names,
so a checkpoint written with them loads without them and the other way round.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from torch import nn

from lit_transformer.model import BLOCK_CLASSES


def blocks(model: nn.Module) -> list[nn.Module]:
    """Every encoder and decoder block of the model, in order."""
    return [m for m in model.modules() if isinstance(m, BLOCK_CLASSES)]


# What the "selective" mode keeps of a block: the attention outputs, the costliest values per byte to recompute
# (4 * T * d_model FLOPs per stored number, against 2 * d_model for a projection's). Everything else is recomputed in
# the backward pass, which stops as soon as the tensors it needs are back (the last matmul of a block never reruns).
_SAVED_OPS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
}


def _keep_attention(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if op in _SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def apply_activation_checkpointing(model: nn.Module, mode: str = "selective") -> None:
    """Recompute activations in the backward pass instead of storing them (non-reentrant).

    block: keep only each block's input, recompute the whole block (least memory, about +1/3 compute).
    selective: as block, but keep each attention output (see _SAVED_OPS): a little more memory, less recompute.
    """
    from functools import partial

    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        checkpoint_wrapper,
    )
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing as _apply,
    )
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    if mode not in ("block", "selective"):
        raise ValueError(f"activation checkpointing mode={mode!r} is not 'block' or 'selective'")
    kwargs = {}
    if mode == "selective":
        kwargs["context_fn"] = partial(create_selective_checkpoint_contexts, _keep_attention)

    def wrapper(module: nn.Module) -> nn.Module:
        return checkpoint_wrapper(module, checkpoint_impl=CheckpointImpl.NO_REENTRANT, **kwargs)

    # The wrapper's state-dict hooks strip its prefix, so parameter names stay those of the plain model.
    _apply(model, checkpoint_wrapper_fn=wrapper, check_fn=lambda m: isinstance(m, BLOCK_CLASSES))


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


def matmul_peak_flops(
    device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, size: int | None = None, repeats: int = 8
) -> float:
    """The matmul FLOP/s this device reaches now in `dtype`: the MFU reference where no spec sheet is known.

    The default size is 1024 on a CPU (enough to reach its peak) and 8192 on a GPU (smaller ones leave SMs idle).
    """
    import time

    device = torch.device(device)
    size = size or (8192 if device.type == "cuda" else 1024)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


# The kernels F.scaled_dot_product_attention may pick, by the names a config uses.
ATTENTION_KERNELS = ("cudnn", "flash", "efficient", "math")


def attention_kernels(names: list[str] | tuple[str, ...]):
    """A context in which scaled_dot_product_attention uses only `names`, tried in that order (cudnn, flash,
    efficient, math): torch.nn.attention.sdpa_kernel with set_priority."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    unknown = [name for name in names if name not in ATTENTION_KERNELS]
    if unknown or not names:
        raise ValueError(f"attention kernels {list(names)}: choose one or more of {list(ATTENTION_KERNELS)}")
    backend = {
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }
    return sdpa_kernel([backend[name] for name in names], set_priority=True)


class AttentionKernels(L.Callback):
    """Pick the attention kernels for a whole run (fit, validate, test, predict), in priority order: the switch is
    the trainer's, so the model code never learns of it. configs/trainer/attention_cudnn.yaml puts cuDNN first.

    The compiled step is traced inside the choice too, so a graph keeps the kernel it was traced with."""

    def __init__(self, kernels: list[str] | None = None) -> None:
        """
        Args:
            kernels: Kernels allowed, the first preferred: cudnn, flash, efficient, math (all four by default).
        """
        self.kernels = list(kernels or ATTENTION_KERNELS)
        self._context = None
        attention_kernels(self.kernels)  # refuse a bad name when the config is read, not at the first step

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._context is None:
            self._context = attention_kernels(self.kernels)
            self._context.__enter__()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._context is not None:
            context, self._context = self._context, None
            context.__exit__(None, None, None)


class ModelTransform:
    """A change applied to the plain model from outside that also has a part in the run around it (LoRA's adapters:
    lit_transformer.lora.LoraAdapters). LitTransformer calls each hook at its own of the same name, in order; the
    defaults do nothing, so a transform defines only the hooks it needs and the engine never asks which it holds."""

    rereads_base = False
    """True where checkpoints hold no base weights, so loading reads init_from again (it is kept in hyperparameters)."""

    def hparams(self) -> dict[str, Any]:
        """What the hyperparameters record of this transform, as plain values (checkpoints load with weights_only)."""
        return {}

    def apply(self, module: L.LightningModule) -> None:
        """Change module.model in place, once (later calls do nothing), before checkpointing and compile wrap it."""

    def on_fit_start(self, module: L.LightningModule) -> None: ...

    def on_fit_end(self, module: L.LightningModule) -> None: ...

    def on_save_checkpoint(self, module: L.LightningModule, checkpoint: dict[str, Any]) -> None: ...

    def on_load_checkpoint(self, module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        """Before the state dict is loaded into module: the checkpoint may be completed here."""

    def to_plain(self, module: L.LightningModule) -> None:
        """Fold the transform into plain layers (before int8 quantization swaps every Linear)."""
