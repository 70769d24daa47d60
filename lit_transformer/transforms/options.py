"""What a run's config says of its transforms: the option types LitTransformer's signature reads (so the engine
imports no transform's module), and the layer names LoRA targets."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from lit_transformer.errors import ConfigError

Quantize = Literal["none", "int8"]
"""The values of every `--quantize` flag: int8 swaps in dynamic int8 Linear layers (transforms/int8.py)."""

ATTENTION = ("qkv", "q", "kv", "out")
"""The attention projections, by the model's names: self-attention's fused qkv and out, cross-attention's q, kv, out."""
FEED_FORWARD = ("up", "down")
"""The feed-forward layers (a gated one's up holds both halves)."""


@dataclass
class LoraOptions:
    """Low-rank adapters on the chosen Linear layers; everything else frozen (`--model.lora.rank 16`)."""

    rank: int = 8
    """The adapters' rank r: each targeted (out, in) weight gains r * (in + out) trainable parameters."""
    alpha: float = 16.0
    """The update is scaled by alpha / rank (peft's lora_alpha)."""
    dropout: float = 0.0
    """Dropout on the adapters' input (peft's lora_dropout)."""
    target_modules: list[str] = field(default_factory=lambda: list(ATTENTION))
    """Linear layers inside the blocks that get adapters, by the end of their names: qkv, q, kv, out (attention, the
    default), up, down (feed-forward); a dotted ending narrows it (self_attn.out, cross_attn.q)."""
    trainable: list[str] = field(default_factory=list)
    """Other parameters that train in full: norms, biases, or names and globs (classifier, lm_head, decoder_norm,
    'decoder_blocks.3.*'). A head that init_from does not supply trains whatever this says."""

    @classmethod
    def of(cls, value: LoraOptions | Mapping[str, Any] | None) -> LoraOptions | None:
        """The options of `value` (an object, its dict as checkpoints record it, or None: no LoRA)."""
        if value is None or isinstance(value, LoraOptions):
            return value
        return cls(**dict(value))

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ConfigError(
                f"lora.rank={self.rank}: the adapters need a rank of at least 1", keys=["model.lora.rank"]
            )
        if not self.alpha > 0:
            raise ConfigError(
                f"lora.alpha={self.alpha} must be positive: the update is scaled by alpha / rank",
                keys=["model.lora.alpha"],
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"lora.dropout={self.dropout} must lie in [0, 1)", keys=["model.lora.dropout"])
        if not self.target_modules:
            raise ConfigError("lora.target_modules is empty: name the Linear layers to adapt (qkv, out, up, down, ...)")
