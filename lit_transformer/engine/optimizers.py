"""The optimizer of a run and its schedule: Adam or AdamW, with weight decay on exactly the weight matrices of linear
layers, and the learning-rate schedule (`model.optim` in the YAML)."""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any, Literal

import torch

from lit_transformer.engine.schedules import ScheduleName


@dataclass
class Optimization:
    """How the weights move: the optimizer and its learning-rate schedule (`--model.optim.lr 1e-3`)."""

    optimizer: Literal["adamw", "adam"] = "adamw"
    """adamw (decoupled weight decay, none on biases, norms and embeddings) or adam (the paper's)."""
    lr: float = 3e-4
    """Peak learning rate; with schedule=noam, a multiplier of the paper's formula (1.0 is the paper's)."""
    betas: tuple[float, float] | None = None
    """Adam betas; None uses (0.9, 0.95) for adamw and the paper's (0.9, 0.98) for adam."""
    eps: float | None = None
    """Adam epsilon; None uses 1e-8 for adamw and the paper's 1e-9 for adam."""
    weight_decay: float | None = None
    """AdamW weight decay, on the weight matrices of linear layers only (see weight_decay_groups); None: 0.1. Plain
    adam (the paper's) has none: a weight decay given with it is ignored, with a warning."""
    decay_embeddings: bool = False
    """Decay the token and position tables too (nanoGPT does; off by default)."""
    fused: bool | None = None
    """Use the fused optimizer kernel; None picks fused on CUDA and foreach elsewhere."""
    schedule: ScheduleName = "cosine"
    """noam (the paper's), cosine (warmup + cosine decay), constant (warmup, then flat)."""
    warmup_steps: int = 100
    """Optimizer steps of linear warmup (noam: the paper's warmup_steps, 4000)."""
    schedule_steps: int | None = None
    """Length of the cosine schedule in optimizer steps; None uses trainer.max_steps."""
    min_lr_ratio: float = 0.1
    """Where the cosine schedule ends, as a fraction of lr."""

    @classmethod
    def of(cls, value: Optimization | dict | None, **flat: Any) -> Optimization:
        """The Optimization of `value` (an object, its dict as checkpoints record it, or None: the defaults), with
        the fields given flat (LitTransformer's arguments before model.optim) set over it."""
        base = cls(**value) if isinstance(value, dict) else value or cls()
        return dataclasses.replace(base, **flat)


OPTIMIZATION_FIELDS = tuple(field.name for field in dataclasses.fields(Optimization))


def weight_decay_groups(
    model: torch.nn.Module, decay_embeddings: bool = False
) -> tuple[list[torch.nn.Parameter], list[torch.nn.Parameter]]:
    """(decayed, not decayed), decided by the role of each tensor, each tensor once.

    Decayed: the weight matrices of Linear layers. Never decayed: biases and norms. Token and position tables
    (``nn.Embedding`` and ``LearnedPositions``, also when the output projection is tied to one) are decayed only with
    ``decay_embeddings`` (nanoGPT decays them; the paper's and GPT-2's Adam applied no decay at all).
    """
    from lit_transformer.model.positions import LearnedPositions

    tables: set[int] = set()
    matrices: set[int] = set()
    for module in model.modules():
        if isinstance(module, (torch.nn.Embedding, LearnedPositions)):
            tables.add(id(module.weight))
        elif isinstance(module, torch.nn.Linear):
            matrices.add(id(module.weight))
    decayed_ids = (matrices - tables) | (tables if decay_embeddings else set())
    decay, no_decay, seen = [], [], set()
    for param in model.parameters():
        if id(param) in seen or not param.requires_grad:
            continue
        seen.add(id(param))
        (decay if id(param) in decayed_ids else no_decay).append(param)
    return decay, no_decay


def warn_no_effect_with_adam(optim: Optimization) -> None:
    """Plain Adam has no weight decay: say so once when a run sets one, and how to get it."""
    ignored = [f"weight_decay={optim.weight_decay}"] if optim.weight_decay else []
    ignored += ["decay_embeddings=true"] if optim.decay_embeddings else []
    if ignored:
        warnings.warn(
            f"model.optim.{' and '.join(ignored)} has no effect with optimizer adam (the paper's Adam decays no "
            "weight): set model.optim.optimizer adamw to decay the weights, or model.optim.weight_decay null to "
            "silence this",
            UserWarning,
            stacklevel=3,
        )


def build_optimizer(model: torch.nn.Module, optim: Optimization, fused: bool) -> torch.optim.Optimizer:
    """Adam (the paper's: betas (0.9, 0.98), eps 1e-9 unless given, no decay) or AdamW (betas (0.9, 0.95), eps 1e-8,
    decay on weight_decay_groups' first group), fused or foreach."""
    decay, no_decay = weight_decay_groups(model, optim.decay_embeddings)
    adam = optim.optimizer == "adam"
    if adam:
        warn_no_effect_with_adam(optim)
    betas = optim.betas or ((0.9, 0.98) if adam else (0.9, 0.95))
    kwargs: dict[str, Any] = {"lr": optim.lr, "betas": tuple(betas), "eps": optim.eps or (1e-9 if adam else 1e-8)}
    kwargs["fused" if fused else "foreach"] = True
    if adam:
        return torch.optim.Adam(decay + no_decay, **kwargs)
    weight_decay = 0.1 if optim.weight_decay is None else optim.weight_decay
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, **kwargs)
