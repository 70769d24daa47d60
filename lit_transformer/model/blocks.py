"""Encoder and decoder blocks. Norm placement (pre/post) lives here and only here.

post (the paper):  x = Norm(x + Dropout(Sublayer(x)))
pre  (GPT-2):      x = x + Dropout(Sublayer(Norm(x)))   (the model adds a final Norm)

Norm is LayerNorm or RMSNorm (config.norm); the feed-forward sublayer is plain or gated (swiglu, geglu). Blocks
return their self-attention's own values beside their output, so that a stack can hand its first layer's values
to the later layers (value_residual).
"""

from __future__ import annotations

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
    if activation == "relu2":  # ReLU squared (So et al. 2021, Primer)
        return F.relu(h).square()
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

    def _residual(self, x: Tensor, out: Tensor, norm: nn.Module) -> Tensor:
        """The residual connection around a sublayer whose output is `out` (its input was `norm(x)` with pre-LN, `x`
        with post-LN). Dropout is skipped outside training, where it is the identity: a decoding step saves a call
        per sublayer. Blocks call their sublayers inline, with no closures: the per-token path stays short."""
        x = x + (self.dropout(out) if self.training else out)
        return x if self.pre_norm else norm(x)


class EncoderBlock(_Block):
    """Bidirectional self-attention, then feed-forward. mixes_values: see SelfAttention (value_residual)."""

    def __init__(self, cfg: TransformerConfig, mixes_values: bool = False) -> None:
        super().__init__(cfg)
        self.self_attn = SelfAttention(cfg, mixes_values)
        self.self_attn_norm = layer_norm(cfg)
        self.ff = FeedForward(cfg)
        self.ff_norm = layer_norm(cfg)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        need_weights: bool = False,
        rope: Rope = None,
        first_values: Tensor | None = None,
    ) -> tuple[Tensor, Weights, Tensor]:
        """Returns (x, self-attention weights or None, the self-attention's own values)."""
        pre = self.pre_norm
        out, weights, values = self.self_attn(
            self.self_attn_norm(x) if pre else x, mask, need_weights=need_weights, rope=rope, first_values=first_values
        )
        x = self._residual(x, out, self.self_attn_norm)
        x = self._residual(x, self.ff(self.ff_norm(x) if pre else x), self.ff_norm)
        return x, weights, values


class DecoderBlock(_Block):
    """Causal self-attention, cross-attention to the encoder's memory (encoder-decoder only), then feed-forward."""

    def __init__(self, cfg: TransformerConfig, cross_attention: bool, mixes_values: bool = False) -> None:
        super().__init__(cfg)
        self.self_attn = SelfAttention(cfg, mixes_values)
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
        first_values: Tensor | None = None,
    ) -> tuple[Tensor, Weights, Weights, Tensor]:
        """Returns (x, self-attention weights, cross-attention weights, the self-attention's own values of the new
        tokens); weights are None unless asked for. rope rotates self-attention only: cross-attention relates a
        target token to source tokens, not positions."""
        pre = self.pre_norm
        self_cache = cache.self_attn if cache is not None else None
        out, self_weights, values = self.self_attn(
            self.self_attn_norm(x) if pre else x, mask, is_causal, self_cache, need_weights, rope, first_values
        )
        x = self._residual(x, out, self.self_attn_norm)
        cross_weights = None
        if self.cross_attn is not None:
            cross_cache = cache.cross_attn if cache is not None else None
            out, cross_weights = self.cross_attn(
                self.cross_attn_norm(x) if pre else x, memory, memory_mask, cross_cache, need_weights
            )
            x = self._residual(x, out, self.cross_attn_norm)
        x = self._residual(x, self.ff(self.ff_norm(x) if pre else x), self.ff_norm)
        return x, self_weights, cross_weights, values


BLOCK_CLASSES = (EncoderBlock, DecoderBlock)
