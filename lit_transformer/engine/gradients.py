"""The step's one gradient norm and clipping with it.

``gradient_norm`` is the step's total gradient norm, computed once and shared by the non-finite guard, logging and
clipping (``clip_gradients``), global under sharded strategies too.
"""

from __future__ import annotations

from typing import Any
from weakref import WeakKeyDictionary

import lightning.pytorch as pl
import torch
from lightning.pytorch.core.optimizer import LightningOptimizer

_NORMS: WeakKeyDictionary[torch.optim.Optimizer, tuple[int, torch.Tensor]] = WeakKeyDictionary()


def unwrapped_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer a LightningOptimizer wraps (or `optimizer` itself)."""
    return optimizer.optimizer if isinstance(optimizer, LightningOptimizer) else optimizer


def gradient_norm(trainer: pl.Trainer, optimizer: torch.optim.Optimizer) -> torch.Tensor:
    """The L2 norm of every gradient ``optimizer`` steps with, computed once per optimizer step and then reused.

    Ask for it between the backward and the step (on_before_optimizer_step, gradient clipping): it is the norm before
    clipping. Under sharding each rank holds pieces: FSDP's root module reduces the norm over its ranks (hybrid
    sharding included), and DTensor gradients (FSDP2, tensor parallelism) over their mesh. DDP's gradients are whole
    on every rank once all-reduced, so the local norm is the global one.
    """
    optimizer = unwrapped_optimizer(optimizer)
    cached = _NORMS.get(optimizer)
    if cached is not None and cached[0] == trainer.global_step:
        return cached[1]
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.tensor import DTensor

    root = getattr(trainer.strategy, "model", None)
    if isinstance(root, FullyShardedDataParallel):
        norm = root.clip_grad_norm_(float("inf"))  # a collective; with an infinite limit it only measures
    else:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
    scale = _pending_loss_scale(trainer, optimizer)
    if scale is not None:  # the gradients are still scaled: their norm is the loss scale times the true one's
        norm = norm / scale.to(norm.device)
    _NORMS[optimizer] = (trainer.global_step, norm)
    return norm


def _unscales_itself(trainer: pl.Trainer, optimizer: torch.optim.Optimizer) -> bool:
    """Whether fp16 gradients reach the optimizer still scaled: a GradScaler and a fused Adam/AdamW, which unscales
    inside its step (Lightning then leaves the unscaling to it; `defaults["fused"]` is torch's record of that)."""
    scaler = getattr(getattr(trainer, "precision_plugin", None), "scaler", None)
    return scaler is not None and bool(optimizer.defaults.get("fused"))


def _pending_loss_scale(trainer: pl.Trainer, optimizer: torch.optim.Optimizer) -> torch.Tensor | None:
    """The GradScaler's scale (a device tensor: no host synchronisation) where the gradients still carry it."""
    if not _unscales_itself(trainer, optimizer):
        return None
    scaler = trainer.precision_plugin.scaler
    scale = scaler._get_scale_async() if hasattr(scaler, "_get_scale_async") else None
    return scale if scale is not None else torch.tensor(scaler.get_scale())


def scale_gradients(optimizer: torch.optim.Optimizer, scale: float | torch.Tensor) -> None:
    """Multiply every gradient ``optimizer`` steps with by ``scale`` (a tensor stays on the device: no host sync)."""
    grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if grads:
        torch._foreach_mul_(grads, scale.to(grads[0].device) if isinstance(scale, torch.Tensor) else scale)


def clip_gradients(
    trainer: pl.Trainer, optimizer: torch.optim.Optimizer, clip_val: float | None, algorithm: str | None
) -> bool:
    """Clip as LightningModule.configure_gradient_clipping would, where Lightning cannot; False: Lightning's own.

    Norm clipping uses the step's one gradient norm (see gradient_norm), which is the global norm under FSDP too,
    where Lightning refuses norm clipping; value clipping and fp16 with an unscaling optimizer go to Lightning.
    """
    from lightning.pytorch.plugins.precision import MixedPrecision, Precision
    from lightning.pytorch.utilities import GradClipAlgorithmType

    algorithm = GradClipAlgorithmType(algorithm or GradClipAlgorithmType.NORM)
    plugin = trainer.precision_plugin
    scaler = getattr(plugin, "scaler", None)
    # A fused Adam/AdamW unscales fp16 gradients inside its step (what Lightning's private
    # _optimizer_handles_unscaling tests); `defaults["fused"]` is torch's public record of that choice.
    unscales_itself = _unscales_itself(trainer, optimizer)
    if clip_val and algorithm == GradClipAlgorithmType.NORM and not unscales_itself:
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        torch.nn.utils.clip_grads_with_norm_(params, clip_val, gradient_norm(trainer, optimizer))
        return True
    if clip_val and isinstance(plugin, MixedPrecision) and scaler is None:
        # bf16 autocast has no loss scaler, so clipping before a fused step is exact; Lightning's mixed-precision
        # plugin refuses any fused optimizer, so clip with the plain precision plugin's code.
        Precision.clip_gradients(plugin, optimizer, clip_val, algorithm)
        return True
    return False
