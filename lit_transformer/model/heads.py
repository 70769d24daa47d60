"""Encoder-only task heads: pooling over real tokens and the classification head.

The masked-LM head is the model's `lm_head` (a Linear tied to the token embedding), as for the other topologies.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lit_transformer.config import TransformerConfig
from lit_transformer.model.blocks import activate, dropout


def pool(hidden: Tensor, keep: Tensor | None, how: str) -> Tensor:
    """(B, T, D) -> (B, D) over real tokens only, so padding never changes a row's result.

    cls: position 0 (the model prepends the [CLS] token there); mean: the average of real tokens; max: their
    elementwise maximum. keep is the (B, T) mask of real tokens, None when nothing is padded.
    """
    if how == "cls":
        return hidden[:, 0]
    if how == "mean":
        if keep is None:
            return hidden.mean(dim=1)
        weights = keep.to(hidden.dtype)[..., None]  # (B, T, 1)
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
    if how == "max":
        if keep is None:
            return hidden.amax(dim=1)
        return hidden.masked_fill(~keep[..., None], torch.finfo(hidden.dtype).min).amax(dim=1)
    raise ValueError(f"Unknown pooling {how!r}; choose mean, cls or max")


class ClassificationHead(nn.Module):
    """Linear -> activation -> Dropout -> Linear, from a pooled (B, d_model) vector to (B, num_labels) logits: the
    seed's sentiment head (a hidden layer lets the pooled features combine non-linearly before the decision)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        hidden = cfg.classifier_hidden or cfg.d_model
        self.dense = nn.Linear(cfg.d_model, hidden, bias=cfg.bias)
        self.dropout = dropout(cfg.head_dropout)
        self.out = nn.Linear(hidden, cfg.num_labels or 1, bias=True)
        # A gated activation's nonlinearity alone: the head has one hidden layer, not a gate.
        self.activation = "gelu" if cfg.activation == "geglu" else cfg.activation

    def forward(self, pooled: Tensor) -> Tensor:
        return self.out(self.dropout(activate(self.dense(pooled), self.activation)))
