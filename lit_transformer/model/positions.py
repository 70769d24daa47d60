"""Position embeddings behind one interface: ``positions(start, length, position_ids) -> (..., length, d_model)``."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_transformer.config import TransformerConfig


def sinusoids(n_positions: int, d_model: int) -> Tensor:
    """The paper's table: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))."""
    position = torch.arange(n_positions, dtype=torch.float32)[:, None]
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.zeros(n_positions, d_model + d_model % 2)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq)
    return table[:, :d_model]


class PositionEmbedding(nn.Module):
    """Adds nothing itself: returns the position vectors that the model adds to its token embeddings."""

    def table(self, n_positions: int) -> Tensor:
        """Vectors for positions 0..n_positions-1, (n_positions, d_model)."""
        raise NotImplementedError

    def forward(self, start: int, length: int, position_ids: Tensor | None = None) -> Tensor:
        """Positions start..start+length-1, (length, d_model); or, given position_ids (B, length) whose values lie
        below start + length (left padding shifts rows), (B, length, d_model)."""
        table = self.table(start + length)
        return table[start:] if position_ids is None else F.embedding(position_ids, table)


class SinusoidalPositions(PositionEmbedding):
    """Fixed sinusoids; a table for max_seq_len is kept, longer inputs get theirs computed on the fly."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.d_model = cfg.d_model
        self.register_buffer("cached", sinusoids(cfg.max_seq_len, cfg.d_model), persistent=False)

    def table(self, n_positions: int) -> Tensor:
        if n_positions <= self.cached.shape[0]:
            return self.cached[:n_positions]
        return sinusoids(n_positions, self.d_model).to(self.cached)


class LearnedPositions(PositionEmbedding):
    """A trained table of max_seq_len vectors (GPT-2); it cannot extrapolate, so longer inputs are refused."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.max_seq_len, cfg.d_model))

    def table(self, n_positions: int) -> Tensor:
        if n_positions > self.weight.shape[0]:
            raise ValueError(
                f"A sequence of {n_positions} positions exceeds max_seq_len={self.weight.shape[0]}: learned positions "
                "cannot extrapolate; raise max_seq_len or use positions='sinusoidal'"
            )
        return self.weight[:n_positions]


def build_positions(cfg: TransformerConfig) -> PositionEmbedding:
    return SinusoidalPositions(cfg) if cfg.positions == "sinusoidal" else LearnedPositions(cfg)
