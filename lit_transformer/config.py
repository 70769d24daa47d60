"""One typed config describes an architecture: every switch of the paper and of GPT-2 is a field.

Field docstrings (the string under each field) become the CLI's ``--help`` text.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

Topology = Literal["decoder_only", "encoder_decoder"]
NormPosition = Literal["pre", "post"]
Positions = Literal["sinusoidal", "learned"]
Activation = Literal["relu", "gelu", "gelu_tanh"]
Init = Literal["gpt2", "xavier"]


@dataclass
class TransformerConfig:
    """The architecture of a Transformer, decoder-only (GPT-2) or encoder-decoder (Vaswani et al. 2017)."""

    topology: Topology = "decoder_only"
    """decoder_only: a causal language model (GPT-2); encoder_decoder: the paper's translation model."""
    norm_position: NormPosition = "pre"
    """post: LayerNorm(x + Dropout(Sublayer(x))) as in the paper; pre: x + Dropout(Sublayer(LayerNorm(x))) and a final LayerNorm."""
    positions: Positions = "learned"
    """sinusoidal: the paper's fixed encoding (works past max_seq_len); learned: a trained table (GPT-2)."""
    vocab_size: int = 8192
    """Vocabulary size (source and target when shared). Linked from the tokenizer by the CLI."""
    target_vocab_size: int | None = None
    """encoder_decoder only: a separate target vocabulary size; None shares vocab_size."""
    d_model: int = 384
    """Width of the residual stream."""
    n_heads: int = 6
    """Attention heads; d_model must be divisible by it."""
    n_layers: int = 6
    """Blocks per stack (decoder-only depth; encoder and decoder depth unless set apart below)."""
    n_encoder_layers: int | None = None
    """encoder_decoder only: encoder depth; None uses n_layers."""
    n_decoder_layers: int | None = None
    """encoder_decoder only: decoder depth; None uses n_layers."""
    d_ff: int | None = None
    """Inner width of the feed-forward sublayer; None uses 4 * d_model."""
    max_seq_len: int = 256
    """Longest sequence: the size of a learned position table and of the KV cache."""
    dropout: float = 0.1
    """Dropout on sublayer outputs and on embeddings + positions (the paper's P_drop)."""
    attention_dropout: float | None = None
    """Dropout on attention weights; None uses dropout."""
    activation: Activation = "gelu_tanh"
    """Feed-forward activation: relu (paper), gelu (exact), gelu_tanh (GPT-2's tanh approximation)."""
    bias: bool = True
    """Biases in linear layers and LayerNorms."""
    tie_embeddings: bool = True
    """Tie the output projection to the (target) input embedding."""
    share_embeddings: bool | None = None
    """encoder_decoder: one embedding matrix for source and target (with tie_embeddings, the paper's three-way tying); None shares when the vocabulary is shared."""
    scale_embeddings: bool = False
    """Multiply token embeddings by sqrt(d_model), as in the paper."""
    layer_norm_eps: float = 1e-5
    """Epsilon of every LayerNorm."""
    pad_token_id: int | None = 0
    """Padding token: masked out of attention and of the loss. Linked from the tokenizer by the CLI."""
    bos_token_id: int | None = 1
    """Beginning-of-sequence token: starts the decoder in translation. Linked from the tokenizer by the CLI."""
    eos_token_id: int | None = 2
    """End-of-sequence token: ends generation. Linked from the tokenizer by the CLI."""
    init: Init = "gpt2"
    """gpt2: normal(0, init_std), residual projections scaled by 1/sqrt(2 * layers); xavier: the paper's Xavier uniform."""
    init_std: float = 0.02
    """Standard deviation of the gpt2 initialisation."""

    def __post_init__(self) -> None:
        problems = list(self._problems())
        if problems:
            raise ValueError("Invalid TransformerConfig:\n  - " + "\n  - ".join(problems))

    def _problems(self):
        def choices(name: str, allowed: tuple[str, ...]):
            value = getattr(self, name)
            if value not in allowed:
                yield f"{name}={value!r} is not one of {', '.join(repr(a) for a in allowed)}"

        yield from choices("topology", ("decoder_only", "encoder_decoder"))
        yield from choices("norm_position", ("pre", "post"))
        yield from choices("positions", ("sinusoidal", "learned"))
        yield from choices("activation", ("relu", "gelu", "gelu_tanh"))
        yield from choices("init", ("gpt2", "xavier"))
        for name in ("vocab_size", "d_model", "n_heads", "n_layers", "max_seq_len"):
            if getattr(self, name) < 1:
                yield f"{name}={getattr(self, name)} must be a positive integer"
        for name in ("target_vocab_size", "n_encoder_layers", "n_decoder_layers", "d_ff"):
            value = getattr(self, name)
            if value is not None and value < 1:
                yield f"{name}={value} must be a positive integer or None"
        if self.n_heads >= 1 and self.d_model % self.n_heads:
            divisors = [h for h in range(1, min(self.d_model, 64) + 1) if self.d_model % h == 0]
            yield f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; valid n_heads: {divisors}"
        for name in ("dropout", "attention_dropout"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value < 1.0:
                yield f"{name}={value} must lie in [0, 1)"
        if self.layer_norm_eps <= 0:
            yield f"layer_norm_eps={self.layer_norm_eps} must be positive"
        if self.init_std <= 0:
            yield f"init_std={self.init_std} must be positive"
        if self.topology == "decoder_only":
            for name in ("target_vocab_size", "n_encoder_layers", "n_decoder_layers", "share_embeddings"):
                if getattr(self, name) is not None:
                    yield f"{name} applies to topology='encoder_decoder' only; leave it None for 'decoder_only'"
        elif self.share_embeddings and self.target_vocab_size not in (None, self.vocab_size):
            yield (
                f"share_embeddings=True needs one vocabulary, but target_vocab_size={self.target_vocab_size} differs "
                f"from vocab_size={self.vocab_size}; set target_vocab_size=None or share_embeddings=False"
            )
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < min(self.vocab_size, self.tgt_vocab_size):
                yield f"{name}={value} lies outside the vocabulary (0..{min(self.vocab_size, self.tgt_vocab_size) - 1})"

    # Derived sizes: one place decides what None means.
    @property
    def is_encoder_decoder(self) -> bool:
        return self.topology == "encoder_decoder"

    @property
    def tgt_vocab_size(self) -> int:
        return self.target_vocab_size or self.vocab_size

    @property
    def encoder_layers(self) -> int:
        return self.n_encoder_layers or self.n_layers

    @property
    def decoder_layers(self) -> int:
        return self.n_decoder_layers or self.n_layers

    @property
    def ff_dim(self) -> int:
        return self.d_ff or 4 * self.d_model

    @property
    def attn_dropout(self) -> float:
        return self.dropout if self.attention_dropout is None else self.attention_dropout

    @property
    def shares_embeddings(self) -> bool:
        if not self.is_encoder_decoder:
            return False
        if self.share_embeddings is None:
            return self.target_vocab_size in (None, self.vocab_size)
        return self.share_embeddings

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def replace(self, **changes: Any) -> TransformerConfig:
        """A copy with some fields changed, validated again."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> TransformerConfig:
        """A named architecture (see PRESETS), with optional field overrides."""
        if name not in PRESETS:
            raise KeyError(f"Unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})


_PAPER = dict(
    topology="encoder_decoder",
    norm_position="post",
    positions="sinusoidal",
    vocab_size=37000,
    n_layers=6,
    activation="relu",
    bias=True,
    tie_embeddings=True,
    scale_embeddings=True,
    init="xavier",
    max_seq_len=1024,
)

PRESETS: dict[str, dict[str, Any]] = {
    # Vaswani et al. 2017, Table 3 "base": 65M parameters.
    "paper-base": {**_PAPER, "d_model": 512, "d_ff": 2048, "n_heads": 8, "dropout": 0.1},
    # Table 3 "big": 213M parameters.
    "paper-big": {**_PAPER, "d_model": 1024, "d_ff": 4096, "n_heads": 16, "dropout": 0.3},
    # The released GPT-2 small: 124,439,808 parameters.
    "gpt2-small": dict(
        topology="decoder_only",
        norm_position="pre",
        positions="learned",
        vocab_size=50257,
        d_model=768,
        n_heads=12,
        n_layers=12,
        d_ff=3072,
        max_seq_len=1024,
        dropout=0.1,
        activation="gelu_tanh",
        bias=True,
        tie_embeddings=True,
        pad_token_id=None,
        bos_token_id=50256,
        eos_token_id=50256,
        init="gpt2",
    ),
    # For tests and debugging: seconds on a CPU.
    "tiny": dict(vocab_size=128, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_seq_len=64, dropout=0.0),
}
