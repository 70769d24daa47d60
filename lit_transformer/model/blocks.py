"""Encoder and decoder blocks. Norm placement (pre/post) lives here and only here.

post (the paper):  x = Norm(x + Dropout(Sublayer(x)))
pre  (GPT-2):      x = x + Dropout(Sublayer(Norm(x)))   (the model adds a final Norm)

Norm is LayerNorm or RMSNorm (config.norm); the feed-forward sublayer is plain or gated (swiglu, geglu).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

from lit_transformer.config import TransformerConfig
from lit_transformer.model.attention import CrossAttention, KVCache, Rope, SelfAttention

Weights = Tensor | None
NORM_CLASSES = (nn.LayerNorm, nn.RMSNorm)


def layer_norm(cfg: TransformerConfig) -> nn.LayerNorm | nn.RMSNorm:
    """The configured norm layer: LayerNorm (with a bias when cfg.bias) or RMSNorm (a gain only), eps from the config."""
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(cfg.d_model, eps=cfg.layer_norm_eps)
    return nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps, bias=cfg.bias)


def activate(h: Tensor, activation: str) -> Tensor:
    """The non-gated activations by name; a gated one's nonlinearity (silu for swiglu, gelu for geglu) elsewhere."""
    if activation == "relu":
        return F.relu(h)
    if activation in ("silu", "swiglu"):  # silu: swish, OPUS-MT's Marian models
        return F.silu(h)
    return F.gelu(h, approximate="tanh" if activation == "gelu_tanh" else "none")


def dropout(p: float) -> nn.Module:
    """nn.Dropout, or nothing at p == 0 (on GPU a zero-rate dropout still launches a kernel)."""
    return nn.Dropout(p) if p > 0 else nn.Identity()


class FeedForward(nn.Module):
    """Position-wise Linear -> activation -> Linear. Dropout is on the sublayer output only, as in the paper.

    Gated (Shazeer 2020): down(act(x W_gate) * (x W_value)), with W_gate and W_value fused into one `up` Linear of
    2 * d_ff outputs, gate rows first (one matmul; Llama's gate_proj and up_proj stacked).
    """

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.gated = cfg.is_gated
        self.up = nn.Linear(cfg.d_model, (2 if self.gated else 1) * cfg.ff_dim, bias=cfg.bias)
        self.down = nn.Linear(cfg.ff_dim, cfg.d_model, bias=cfg.bias)
        self.activation = "gelu" if cfg.activation == "geglu" else cfg.activation

    def forward(self, x: Tensor) -> Tensor:
        h = self.up(x)
        if self.gated:
            gate, value = h.chunk(2, dim=-1)
            return self.down(activate(gate, self.activation) * value)
        return self.down(activate(h, self.activation))


@dataclass
class LayerCache:
    """A decoder block's KV caches: self-attention grows per step, cross-attention is computed once."""

    self_attn: KVCache
    cross_attn: KVCache | None = None


class _Block(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.pre_norm = cfg.norm_position == "pre"
        self.dropout = dropout(cfg.dropout)

    def _sublayer(
        self, x: Tensor, norm: nn.Module, sublayer: Callable[[Tensor], tuple[Tensor, Weights]]
    ) -> tuple[Tensor, Weights]:
        out, weights = sublayer(norm(x) if self.pre_norm else x)
        x = x + self.dropout(out)
        return (x if self.pre_norm else norm(x)), weights


class EncoderBlock(_Block):
    """Bidirectional self-attention, then feed-forward."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__(cfg)
        self.self_attn = SelfAttention(cfg)
        self.self_attn_norm = layer_norm(cfg)
        self.ff = FeedForward(cfg)
        self.ff_norm = layer_norm(cfg)

    def forward(
        self, x: Tensor, mask: Tensor | None = None, need_weights: bool = False, rope: Rope = None
    ) -> tuple[Tensor, Weights]:
        x, weights = self._sublayer(
            x, self.self_attn_norm, lambda h: self.self_attn(h, mask, need_weights=need_weights, rope=rope)
        )
        x, _ = self._sublayer(x, self.ff_norm, lambda h: (self.ff(h), None))
        return x, weights


class DecoderBlock(_Block):
    """Causal self-attention, cross-attention to the encoder's memory (encoder-decoder only), then feed-forward."""

    def __init__(self, cfg: TransformerConfig, cross_attention: bool) -> None:
        super().__init__(cfg)
        self.self_attn = SelfAttention(cfg)
        self.self_attn_norm = layer_norm(cfg)
        self.cross_attn = CrossAttention(cfg) if cross_attention else None
        self.cross_attn_norm = layer_norm(cfg) if cross_attention else None
        self.ff = FeedForward(cfg)
        self.ff_norm = layer_norm(cfg)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        is_causal: bool = True,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
        cache: LayerCache | None = None,
        need_weights: bool = False,
        rope: Rope = None,
    ) -> tuple[Tensor, Weights, Weights]:
        """Returns (x, self-attention weights, cross-attention weights); weights are None unless asked for. rope
        rotates self-attention only: cross-attention relates a target token to source tokens, not positions."""
        self_cache = cache.self_attn if cache is not None else None
        x, self_weights = self._sublayer(
            x, self.self_attn_norm, lambda h: self.self_attn(h, mask, is_causal, self_cache, need_weights, rope)
        )
        cross_weights = None
        if self.cross_attn is not None:
            cross_cache = cache.cross_attn if cache is not None else None
            x, cross_weights = self._sublayer(
                x, self.cross_attn_norm, lambda h: self.cross_attn(h, memory, memory_mask, cross_cache, need_weights)
            )
        x, _ = self._sublayer(x, self.ff_norm, lambda h: (self.ff(h), None))
        return x, self_weights, cross_weights


BLOCK_CLASSES = (EncoderBlock, DecoderBlock)
