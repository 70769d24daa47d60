"""The optimizer of a run: Adam or AdamW, with weight decay on exactly the weight matrices of linear layers."""

from __future__ import annotations

from typing import Any, Literal

import torch


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


def build_optimizer(
    model: torch.nn.Module,
    kind: Literal["adamw", "adam"],
    lr: float,
    betas: tuple[float, float] | None,
    eps: float | None,
    weight_decay: float,
    decay_embeddings: bool,
    fused: bool,
) -> torch.optim.Optimizer:
    """Adam (the paper's: betas (0.9, 0.98), eps 1e-9 unless given, no decay) or AdamW (betas (0.9, 0.95), eps 1e-8,
    decay on weight_decay_groups' first group), fused or foreach."""
    decay, no_decay = weight_decay_groups(model, decay_embeddings)
    adam = kind == "adam"
    betas = betas or ((0.9, 0.98) if adam else (0.9, 0.95))
    kwargs: dict[str, Any] = {"lr": lr, "betas": tuple(betas), "eps": eps or (1e-9 if adam else 1e-8)}
    kwargs["fused" if fused else "foreach"] = True
    if adam:
        return torch.optim.Adam(decay + no_decay, **kwargs)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, **kwargs)
