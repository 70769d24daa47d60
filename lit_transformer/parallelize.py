"""Activation checkpointing and compilation, applied to the plain model from outside (torchtitan's way).

The model code knows nothing of either: both act on the block classes by name, and both keep the parameter names,
so a checkpoint written with them loads without them and the other way round.
"""

from __future__ import annotations

from collections.abc import Callable

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


def compile_blocks(model: nn.Module, mode: str | None = None) -> None:
    """torch.compile each block in place: one graph serves every layer, and parameter names do not change."""
    for block in blocks(model):
        block.compile(mode=mode)


def compile_function(fn: Callable, mode: str | None = None, fullgraph: bool = False) -> Callable:
    """torch.compile a function (a training step's forward and loss): the one place the package calls it, so a test
    can choose a faster backend."""
    return torch.compile(fn, mode=mode, fullgraph=fullgraph)


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
