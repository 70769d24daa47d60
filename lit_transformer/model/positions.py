"""Where a token is, told to the model in one of two ways.

Added to the input (``positions(start, length, position_ids) -> (..., length, d_model)``): sinusoidal and learned.
Inside attention, from the position ids of queries and keys: rope rotates queries and keys (so their dot product
depends on the distance alone), alibi adds a per-head penalty linear in the distance to the scores. positions='none'
(NoPE) has neither. build_positions gives the additive module or None; Transformer builds the attention-side ones.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_transformer.config import TransformerConfig
from lit_transformer.errors import ConfigError


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

    def __init__(self, cfg: TransformerConfig, n_positions: int | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_positions or cfg.max_seq_len, cfg.d_model))

    def table(self, n_positions: int) -> Tensor:
        if n_positions > self.weight.shape[0]:
            raise ConfigError(
                f"A sequence of {n_positions} positions exceeds max_seq_len={self.weight.shape[0]}: learned positions "
                "cannot extrapolate; raise max_seq_len or use positions='sinusoidal'",
                keys=["model.config.max_seq_len"],
            )
        return self.weight[:n_positions]


def build_positions(cfg: TransformerConfig) -> PositionEmbedding | None:
    """The table added to token embeddings; None when positions act inside attention (rope, alibi) or not at all."""
    if cfg.positions == "sinusoidal":
        return SinusoidalPositions(cfg)
    if cfg.positions == "learned":
        return LearnedPositions(cfg)
    return None


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (Su et al. 2021) in Llama's "rotate half" layout: channel i of a head is paired with
    channel i + head_dim/2 and the pair is rotated by the angle position * theta^(-2i/head_dim). Queries and keys are
    rotated before the cache, so a cached key keeps the rotation of its own position and q.k depends only on the
    distance. No table is kept: cos and sin are computed for the positions at hand, so any length works."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        dim = cfg.head_dim
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos and sin for positions (B, T) or (T,), as (B or 1, 1, T, head_dim): they broadcast over heads."""
        if positions.dim() == 1:
            positions = positions[None]
        angles = positions[..., None].float() * self.inv_freq  # (B, T, head_dim / 2)
        angles = torch.cat([angles, angles], dim=-1)[:, None]  # (B, 1, T, head_dim)
        return angles.cos(), angles.sin()


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Apply the rotation to (B, H, T, head_dim) queries or keys: x cos + rotate_half(x) sin, in x's dtype."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


def alibi_slopes(n_heads: int) -> Tensor:
    """Press et al. (2021): the geometric sequence 2^(-8/n), 2^(-16/n), ... for n a power of two; otherwise the
    slopes of the nearest lower power of two, then every other slope of the next power of two (their code)."""

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        return torch.tensor(power_of_two(n_heads))
    closest = 2 ** math.floor(math.log2(n_heads))
    return torch.tensor(power_of_two(closest) + power_of_two(2 * closest)[0::2][: n_heads - closest])


class AlibiBias(nn.Module):
    """The attention bias -slope_h * |i - j| between query position i and key position j, composed with a boolean
    mask into the float mask F.scaled_dot_product_attention adds to its scores (-inf where the mask forbids).
    Distances come from position ids, so left padding and cached keys get the distances their tokens really have."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(cfg.n_heads), persistent=False)

    def forward(self, q_positions: Tensor, k_positions: Tensor, allowed: Tensor | None) -> Tensor:
        """(B or 1, H, T_q, T_k) float mask; positions (B, T) or (T,); allowed broadcasts to it (None: all)."""
        if q_positions.dim() == 1:
            q_positions = q_positions[None]
        if k_positions.dim() == 1:
            k_positions = k_positions[None]
        distance = (q_positions[:, :, None] - k_positions[:, None, :]).abs()  # (B, T_q, T_k)
        bias = -self.slopes[:, None, None] * distance[:, None].float()  # (B, H, T_q, T_k)
        if allowed is None:
            return bias
        return bias.masked_fill(~allowed, float("-inf"))
