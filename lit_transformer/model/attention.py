"""Multi-head attention: fused projections, F.scaled_dot_product_attention, optional weights, KV cache.

Masks broadcast to (B, H, T_q, T_k) and follow F.scaled_dot_product_attention: boolean, True means "may attend";
or float, added to the scores (ALiBi's bias, with -inf where attending is forbidden). No mask is built when
``is_causal`` alone describes the pattern. Rotary positions rotate queries and keys before the cache; grouped-query
attention caches n_kv_heads K/V heads and shares each among a group of query heads. With qk_norm, queries and keys
are RMS-normalised per head first (the cache keeps normalised, rotated keys); with value_residual, a layer's values
are mixed with the first layer's before they are cached.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_transformer.config import TransformerConfig
from lit_transformer.model.positions import rotate

Rope = tuple[Tensor, Tensor] | None


class KVCache:
    """Keys and values of one attention layer, kept across decoding steps.

    With ``max_len`` the buffers are preallocated on the first append (B, H, max_len, head_dim) and filled step by step
    (self-attention). With ``max_len=None`` the first keys and values are stored as they are and reused (cross-attention,
    whose memory never changes).
    """

    def __init__(self, max_len: int | None = None) -> None:
        self.max_len = max_len
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.length = 0
        self._spare: tuple[Tensor, Tensor] | None = None  # beam search's reorder target (see reorder)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store (B, H, t, D) new keys and values; return all keys and values so far."""
        if self.max_len is None:  # static: stored once
            self.k, self.v, self.length = k, v, k.shape[2]
            return k, v
        if self.k is None:
            batch, heads, _, dim = k.shape
            self.k = k.new_empty(batch, heads, self.max_len, dim)
            self.v = v.new_empty(batch, heads, self.max_len, dim)
        end = self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache overflow: {end} positions, preallocated {self.max_len}")
        self.k[:, :, self.length : end] = k
        self.v[:, :, self.length : end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def reorder(self, index: Tensor) -> None:
        """Select batch rows (beam search keeps the histories of the surviving beams). A preallocated cache gathers
        its filled positions only, into a second buffer that then swaps with the first: every step reads and writes
        what is filled, not the whole max_len buffer, and allocates nothing after the first reorder."""
        if self.k is None:
            return
        if self.max_len is None or index.shape[0] != self.k.shape[0]:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)
            return
        if self._spare is None:
            self._spare = (torch.empty_like(self.k), torch.empty_like(self.v))
        spare = self._spare
        for current, target in zip((self.k, self.v), spare, strict=True):
            torch.index_select(current.narrow(2, 0, self.length), 0, index, out=target.narrow(2, 0, self.length))
        self._spare = (self.k, self.v)
        self.k, self.v = spare


def attend(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, dropout_p: float, need_weights: bool
) -> tuple[Tensor, Tensor | None]:
    """softmax(q k^T / sqrt(d) + bias) v over (B, H, T, D) tensors; the weights (B, H, T_q, T_k) only when asked.

    k and v may have fewer heads than q (grouped-query attention): each serves H_q / H_kv consecutive query heads.
    """
    if k.shape[1] != q.shape[1]:  # (B, H_kv, T, D) -> (B, H_q, T, D): a view, then one copy; exports anywhere
        group = q.shape[1] // k.shape[1]
        k, v = (t[:, :, None].expand(-1, -1, group, -1, -1).flatten(1, 2) for t in (k, v))
    if mask is not None and mask.is_floating_point():
        mask = mask.to(q.dtype)
    if not need_weights:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal), None
    # The explicit path, for visualisation: same mathematics, weights materialised.
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if is_causal:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        scores = scores + mask if mask.is_floating_point() else scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return F.dropout(weights, dropout_p) @ v, weights


VALUE_MIX_INIT = 0.5
"""value_residual's lambda at initialisation: the first layer's values and a layer's own, equally (ResFormer's and
the speedrun's)."""


def qk_norms(cfg: TransformerConfig) -> tuple[nn.Module | None, nn.Module | None]:
    """The query and key norms of qk_norm: RMSNorm over each head's channels, a gain of head_dim shared by the heads."""
    if not cfg.qk_norm:
        return None, None
    return nn.RMSNorm(cfg.head_dim, eps=cfg.layer_norm_eps), nn.RMSNorm(cfg.head_dim, eps=cfg.layer_norm_eps)


class SelfAttention(nn.Module):
    """Multi-head self-attention with one fused QKV projection: rows [Q (n_heads), K (n_kv_heads), V (n_kv_heads)]
    heads of head_dim each, so with n_kv_heads == n_heads it is GPT-2's c_attn layout.

    mixes_values: value_residual in a layer after the first, whose `value_mix` (lambda) weighs the first layer's
    values against its own."""

    def __init__(self, cfg: TransformerConfig, mixes_values: bool = False) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.dropout = cfg.attn_dropout
        self.split_sizes = (cfg.d_model, cfg.kv_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim)
        self.qkv = nn.Linear(cfg.d_model, sum(self.split_sizes), bias=cfg.bias)
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.q_norm, self.k_norm = qk_norms(cfg)
        # A (1,) tensor rather than a scalar: sharded strategies split every parameter along its first dimension.
        self.value_mix = nn.Parameter(torch.full((1,), VALUE_MIX_INIT)) if mixes_values else None

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        is_causal: bool = False,
        cache: KVCache | None = None,
        need_weights: bool = False,
        rope: Rope = None,
        first_values: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor]:
        """rope: (cos, sin) of the new tokens' positions, applied to queries and keys (cached keys are rotated).
        first_values: the first layer's values (B, H_kv, T, D) of these tokens, mixed in when this layer mixes.
        Returns (output, weights or None, this layer's own values of the new tokens before any mixing)."""
        B, T, C = x.shape
        D = self.head_dim
        if self.n_kv_heads == self.n_heads:  # (B, T, 3C) -> (3, B, H, T, D): one matmul, views only
            q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, D).permute(2, 0, 3, 1, 4).unbind(0)
        else:  # (B, T, C + 2 H_kv D) -> (B, H, T, D), (B, H_kv, T, D) twice
            q, k, v = self.qkv(x).split(self.split_sizes, dim=-1)
            q = q.view(B, T, self.n_heads, D).transpose(1, 2)
            k, v = (t.view(B, T, self.n_kv_heads, D).transpose(1, 2) for t in (k, v))
        own_values = v
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = rotate(q, *rope), rotate(k, *rope)
        if self.value_mix is not None and first_values is not None:
            v = v + self.value_mix.to(v.dtype) * (first_values - v)  # (1 - lambda) v + lambda v_1
        if cache is not None:
            k, v = cache.append(k, v)
        p = self.dropout if self.training else 0.0
        y, weights = attend(q, k, v, mask, is_causal, p, need_weights)
        return self.out(y.transpose(1, 2).reshape(B, T, C)), weights, own_values


class CrossAttention(nn.Module):
    """Multi-head attention from the decoder to the encoder's memory: a Q projection and one fused KV projection."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.dropout = cfg.attn_dropout
        self.q = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.kv = nn.Linear(cfg.d_model, 2 * cfg.d_model, bias=cfg.bias)
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.q_norm, self.k_norm = qk_norms(cfg)

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values (B, H, S, D) of the memory (B, S, C): what a decoding cache keeps for every step (keys
        normalised with qk_norm)."""
        B, S, C = memory.shape
        k, v = self.kv(memory).view(B, S, 2, self.n_heads, C // self.n_heads).permute(2, 0, 3, 1, 4).unbind(0)
        return (k if self.k_norm is None else self.k_norm(k)), v

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        mask: Tensor | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        B, T, C = x.shape
        D = C // self.n_heads
        q = self.q(x).view(B, T, self.n_heads, D).transpose(1, 2)
        if self.q_norm is not None:
            q = self.q_norm(q)
        if cache is not None and cache.length:  # the memory's keys and values are computed once per generation
            k, v = cache.k, cache.v
        else:
            k, v = self.memory_kv(memory)
            if cache is not None:
                cache.append(k, v)
        p = self.dropout if self.training else 0.0
        y, weights = attend(q, k, v, mask, False, p, need_weights)
        return self.out(y.transpose(1, 2).reshape(B, T, C)), weights
