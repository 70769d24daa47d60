"""One typed config describes an architecture: every switch of the paper and of GPT-2 is a field.

Field docstrings (the string under each field) become the CLI's ``--help`` text.
"""

from __future__ import annotations

import dataclasses
import numbers
import re
from dataclasses import dataclass
from typing import Any, Literal

from lit_transformer.errors import ConfigError

Topology = Literal["decoder_only", "encoder_decoder", "encoder_only"]
Head = Literal["classification", "masked_lm"]
Pooling = Literal["mean", "cls", "max"]
NormPosition = Literal["pre", "post"]
Positions = Literal["sinusoidal", "learned", "rope", "alibi", "none"]
Norm = Literal["layernorm", "rmsnorm"]
Activation = Literal["relu", "relu2", "gelu", "gelu_tanh", "silu", "swiglu", "geglu"]
GATED_ACTIVATIONS = ("swiglu", "geglu")
Init = Literal["gpt2", "xavier"]
Source = Literal["tokens", "features", "patches"]
# The fields each source reads besides the token ones: a field of another source is not this model's concern.
SOURCE_FIELDS: dict[str, tuple[str, ...]] = {
    "features": ("source_dim",),
    "patches": ("image_size", "patch_size", "image_channels"),
}


@dataclass
class TransformerConfig:
    """The architecture of a Transformer: decoder-only (GPT-2), encoder-decoder (Vaswani et al. 2017) or encoder-only
    (a sequence classifier, or a BERT-style masked language model)."""

    topology: Topology = "decoder_only"
    """decoder_only: a causal language model (GPT-2); encoder_decoder: the paper's translation model; encoder_only: a
    bidirectional encoder with the task head chosen by `head`."""
    norm_position: NormPosition = "pre"
    """post: LayerNorm(x + Dropout(Sublayer(x))) as in the paper; pre: x + Dropout(Sublayer(LayerNorm(x))) and a final LayerNorm."""
    positions: Positions = "learned"
    """sinusoidal: the paper's fixed encoding (works past max_seq_len); learned: a trained table (GPT-2); rope: rotary
    embeddings of queries and keys (Su et al. 2021, Llama); alibi: a per-head linear distance penalty on attention
    scores (Press et al. 2021); none: no position signal at all (NoPE: decoder_only, where the causal mask alone
    orders tokens)."""
    rope_theta: float = 10000.0
    """rope: the base of the rotary frequencies, theta^(-2i/head_dim) (Llama 2: 10,000; Llama 3: 500,000)."""
    vocab_size: int = 8192
    """Vocabulary size (source and target when shared). Linked from the tokenizer by the CLI."""
    target_vocab_size: int | None = None
    """encoder_decoder only: a separate target vocabulary size; None shares vocab_size."""
    pad_vocab_to_multiple_of: int | None = None
    """Allocate embedding tables and the output layer with rows rounded up to a multiple of this (64: GPT-2's 50,257
    becomes 50,304, nanoGPT's size), as GPU matmuls run fastest at such widths. Token ids and logits stay within
    the true vocabulary: the extra rows are zero, never looked up, and sliced off every output. None: no padding."""
    d_model: int = 384
    """Width of the residual stream."""
    n_heads: int = 6
    """Attention heads; d_model must be divisible by it."""
    n_kv_heads: int | None = None
    """Key/value heads of self-attention (grouped-query attention, Ainslie et al. 2023): n_heads must be divisible
    by it, each group of n_heads / n_kv_heads query heads shares one K/V head, and the KV cache stores only these;
    1 is multi-query attention; None uses n_heads (standard multi-head attention)."""
    n_layers: int = 6
    """Blocks per stack (decoder-only depth; encoder and decoder depth unless set apart below)."""
    n_encoder_layers: int | None = None
    """encoder_decoder only: encoder depth; None uses n_layers."""
    n_decoder_layers: int | None = None
    """encoder_decoder only: decoder depth; None uses n_layers."""
    d_ff: int | None = None
    """Inner width of the feed-forward sublayer; None uses 4 * d_model. With a gated activation (swiglu, geglu) it is
    the width of each of the two input projections (gate and value: 3 * d_model * d_ff weights, Llama's
    intermediate_size), and None uses gated_d_ff(4 * d_model), the parameters of the 4 * d_model non-gated MLP."""
    max_seq_len: int = 256
    """Longest sequence: the size of a learned position table and of the KV cache."""
    dropout: float = 0.1
    """Dropout on sublayer outputs and on embeddings + positions (the paper's P_drop)."""
    attention_dropout: float | None = None
    """Dropout on attention weights; None uses dropout."""
    activation: Activation = "gelu_tanh"
    """Feed-forward activation: relu (paper), relu2 (ReLU squared, relu(x)^2: So et al. 2021, the modded-nanogpt
    speedrun), gelu (exact), gelu_tanh (GPT-2's tanh approximation), silu (swish, OPUS-MT's Marian models); gated
    (Shazeer 2020): swiglu is silu(x W) * (x V) (Llama), geglu is gelu(x W) * (x V)."""
    bias: bool = True
    """Biases in linear layers and LayerNorms (RMSNorm has none)."""
    tie_embeddings: bool = True
    """Tie the output projection to the (target) input embedding."""
    share_embeddings: bool | None = None
    """encoder_decoder: one embedding matrix for source and target (with tie_embeddings, the paper's three-way tying: the output layer is that matrix too); None shares when the vocabulary is shared."""
    source: Source = "tokens"
    """encoder_decoder: what the encoder reads. tokens: ids through an embedding table (translation); features:
    (B, S, source_dim) vectors, e.g. CNN region features, projected to d_model by a Linear layer (a key-padding
    mask marks a varying number of them); patches: (B, image_channels, H, W) images cut into patch_size squares,
    each projected to d_model (ViT's strided convolution), positions 2-D sinusoidal or learned. The decoder and every
    other switch are the same for all three: text attends to the source through cross-attention."""
    source_dim: int | None = None
    """source='features': the width of each feature vector (2048 for bottom-up region features)."""
    source_positions: bool = True
    """source='features': add the position signal by feature index (a grid or a sequence of vectors); False for an
    unordered set of regions. Patches always carry theirs (2-D with sinusoidal, a learned table with learned)."""
    image_size: tuple[int, int] | None = None
    """source='patches': (height, width) of the images, each a multiple of patch_size."""
    patch_size: int = 16
    """source='patches': the side of each square patch, in pixels."""
    image_channels: int = 3
    """source='patches': channels of the images (3 for RGB, 1 for greyscale)."""
    scale_embeddings: bool = False
    """Multiply token embeddings by sqrt(d_model), as in the paper."""
    norm: Norm = "layernorm"
    """Every normalisation layer: layernorm (centre and scale, with a gain and a bias) or rmsnorm (scale by the root
    mean square only, with a gain: Zhang & Sennrich 2019, Llama)."""
    layer_norm_eps: float = 1e-5
    """Epsilon of every norm layer (LayerNorm or RMSNorm)."""
    pad_token_id: int | None = None
    """Padding token: what fills padded batches and finished rows in generation. Padding itself is said by an
    attention mask, never inferred from this id (a real vocabulary may use it). Linked from the tokenizer by the CLI."""
    bos_token_id: int | None = 1
    """Beginning-of-sequence token: starts the decoder in translation. Linked from the tokenizer by the CLI."""
    eos_token_id: int | None = 2
    """End-of-sequence token: ends generation. Linked from the tokenizer by the CLI."""
    head: Head = "classification"
    """encoder_only: classification gives (B, num_labels) logits from tokens pooled over real tokens; masked_lm gives
    (B, T, V) logits through an output layer tied to the token embedding (BERT's pretraining)."""
    num_labels: int | None = None
    """encoder_only classification: the number of classes (or of labels, multi-label). Linked from the data by the CLI."""
    pooling: Pooling = "mean"
    """encoder_only classification: mean or max over real tokens, or cls (the output of a [CLS] token, bos_token_id,
    that the model prepends itself, so inputs are the same for every pooling)."""
    classifier_hidden: int | None = None
    """Inner width of the classification head Linear -> activation -> Dropout -> Linear; None uses d_model."""
    classifier_dropout: float | None = None
    """Dropout inside the classification head; None uses dropout."""
    multi_label: bool | None = None
    """Deprecated, never read by the model: the classification task's option (model.task.init_args.multi_label,
    which follows the data by default). True here is passed on to the task with a warning (older configs)."""
    mask_token_id: int | None = None
    """masked_lm: the [MASK] token. Linked from the tokenizer by the CLI (the classification data adds <mask>)."""
    init: Init = "gpt2"
    """gpt2: normal(0, init_std), residual projections scaled by 1/sqrt(2 * layers); xavier: the paper's Xavier uniform."""
    init_std: float = 0.02
    """Standard deviation of the gpt2 initialisation."""
    qk_norm: bool = False
    """RMSNorm of each head's queries and keys before their dot product (and before the rotary embedding), in self-
    and cross-attention, with a learnable gain per head channel shared by the heads (Qwen 3's form; Dehghani et al.
    2023): the attention logits stay bounded whatever the weights grow to, and the gain still sets their sharpness."""
    zero_init_output: bool = False
    """Start every attention and feed-forward output projection and the output layer (a classifier's last layer) at
    zero (the modded-nanogpt speedrun): each block starts as the identity and the first logits are uniform. Needs
    tie_embeddings=False wherever the model has a token output layer (a zero output layer would zero the embedding
    it is tied to). An initialisation only: a trained model is an ordinary model and exports like one."""
    logit_softcap: float | None = None
    """Soft-cap the output logits to (-cap, cap): cap * tanh(logits / cap) (Gemma 2; the speedrun's 30, later 15), in
    training, evaluation and generation alike (a classifier's logits too); None: no cap."""
    value_residual: bool = False
    """Value residual learning (Zhou et al. 2024, ResFormer): the self-attention of every layer after the first mixes
    its values with the first layer's values of the same tokens, v = (1 - lambda) v + lambda v_1, lambda a learned
    scalar per layer starting at 0.5; per stack (the encoder's and the decoder's own first layer). The mixed values
    are what the KV cache keeps; with grouped-query attention they mix per K/V head. Cross-attention's values (the
    encoder's memory) are not mixed."""

    def __post_init__(self) -> None:
        problems = list(self._problems())
        if problems:
            raise ConfigError(
                _listed("TransformerConfig", problems), keys=_fields_named(self, problems, "model.config.")
            )

    @classmethod
    def check(cls, values: dict[str, Any], unknown: set[str] | frozenset[str] = frozenset()) -> None:
        """Refuse, as construction would, the problems of a config of `values` (the others at their defaults) that
        name no field of `unknown`: the fields the data decides later (vocab_size, special ids, num_labels) are
        not known yet when the command line is judged, and its other mistakes need not wait for them."""
        config = object.__new__(cls)
        for field in dataclasses.fields(cls):
            default = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
            setattr(config, field.name, values.get(field.name, default))
        try:
            problems = [p for p in config._problems() if not _fields_named(config, [p], "", only=unknown)]
        except TypeError:  # a value of another type: the parser or the construction names it
            return
        if problems:
            keys = _fields_named(config, problems, "model.config.")
            raise ConfigError(_listed("TransformerConfig", problems), keys=keys)

    def _problems(self):
        typed = list(_type_problems(self))
        if typed:  # the checks below compare values, which a value of another type cannot be
            yield from typed
            return

        def choices(name: str, allowed: tuple[str, ...]):
            value = getattr(self, name)
            if value not in allowed:
                yield f"{name}={value!r} is not one of {', '.join(repr(a) for a in allowed)}"

        yield from choices("topology", ("decoder_only", "encoder_decoder", "encoder_only"))
        yield from choices("head", ("classification", "masked_lm"))
        yield from choices("pooling", ("mean", "cls", "max"))
        yield from choices("norm_position", ("pre", "post"))
        yield from choices("positions", ("sinusoidal", "learned", "rope", "alibi", "none"))
        yield from choices("norm", ("layernorm", "rmsnorm"))
        yield from choices("activation", ("relu", "relu2", "gelu", "gelu_tanh", "silu", "swiglu", "geglu"))
        yield from choices("init", ("gpt2", "xavier"))
        yield from choices("source", ("tokens", "features", "patches"))
        for name in ("vocab_size", "d_model", "n_heads", "n_layers", "max_seq_len"):
            if getattr(self, name) < 1:
                yield f"{name}={getattr(self, name)} must be a positive integer"
        for name in (
            "target_vocab_size",
            "pad_vocab_to_multiple_of",
            "n_encoder_layers",
            "n_decoder_layers",
            "d_ff",
            "num_labels",
            "classifier_hidden",
            "n_kv_heads",
        ):
            value = getattr(self, name)
            if value is not None and value < 1:
                yield f"{name}={value} must be a positive integer or None"
        if self.n_heads >= 1 and self.d_model % self.n_heads:
            divisors = [h for h in range(1, min(self.d_model, 64) + 1) if self.d_model % h == 0]
            yield f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; valid n_heads: {divisors}"
        if self.n_kv_heads is not None and self.n_kv_heads >= 1 and self.n_heads % self.n_kv_heads:
            divisors = [h for h in range(1, self.n_heads + 1) if self.n_heads % h == 0]
            yield (
                f"n_heads={self.n_heads} is not divisible by n_kv_heads={self.n_kv_heads}: each K/V head serves a "
                f"whole group of query heads; valid n_kv_heads: {divisors}"
            )
        if self.positions == "rope" and self.n_heads >= 1 and self.d_model % self.n_heads == 0 and self.head_dim % 2:
            yield (
                f"positions='rope' rotates pairs of channels, but the head dimension d_model / n_heads = "
                f"{self.d_model} / {self.n_heads} = {self.head_dim} is odd; choose d_model and n_heads with an even quotient"
            )
        if self.positions == "rope" and self.rope_theta <= 1:
            yield f"rope_theta={self.rope_theta} must be greater than 1"
        if self.positions == "none" and self.topology != "decoder_only":
            yield (
                f"positions='none' (NoPE) needs topology='decoder_only': only a causal mask orders tokens without a "
                f"position signal, and {self.topology!r} has a bidirectional encoder; use sinusoidal, learned, rope or alibi"
            )
        for name in ("dropout", "attention_dropout", "classifier_dropout"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value < 1.0:
                yield f"{name}={value} must lie in [0, 1)"
        if not self.layer_norm_eps > 0:  # nan too
            yield f"layer_norm_eps={self.layer_norm_eps} must be positive"
        if not self.init_std > 0:  # nan too
            yield f"init_std={self.init_std} must be positive"
        if self.logit_softcap is not None and not self.logit_softcap > 0:
            yield f"logit_softcap={self.logit_softcap} must be positive (the largest logit), or None for no cap"
        if self.zero_init_output and self.tie_embeddings and not self.is_classifier:
            yield (
                "zero_init_output=True starts the output layer at zero, and tie_embeddings=True shares that matrix "
                "with the token embedding, which would start at zero too (every token the same vector); set "
                "tie_embeddings=False (the speedrun's untied head)"
            )
        if self.topology != "encoder_decoder":
            for name in ("target_vocab_size", "n_decoder_layers", "share_embeddings"):
                if getattr(self, name) is not None:
                    yield f"{name} applies to topology='encoder_decoder' only; leave it None for {self.topology!r}"
        if self.topology == "decoder_only" and self.n_encoder_layers is not None:
            yield "n_encoder_layers applies to topology='encoder_decoder' or 'encoder_only'; leave it None for 'decoder_only'"
        if self.is_encoder_only and self.head == "classification":
            if self.num_labels is None:
                yield "encoder_only with head='classification' needs num_labels (the CLI links it from the data)"
            if self.pooling == "cls" and self.bos_token_id is None:
                yield "pooling='cls' prepends bos_token_id as the [CLS] token; set bos_token_id"
        if self.is_encoder_only and self.head == "masked_lm" and self.mask_token_id is None:
            yield (
                "encoder_only with head='masked_lm' needs mask_token_id, which the CLI links from the tokenizer's "
                "<mask> token: the language-model data adds one with --data.init_args.mask_token true"
            )
        if self.is_encoder_decoder and self.share_embeddings and self.target_vocab_size not in (None, self.vocab_size):
            yield (
                f"share_embeddings=True needs one vocabulary, but target_vocab_size={self.target_vocab_size} differs "
                f"from vocab_size={self.vocab_size}; set target_vocab_size=None or share_embeddings=False"
            )
        yield from self._source_problems()
        for name in ("pad_token_id", "bos_token_id", "eos_token_id", "mask_token_id"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < min(self.vocab_size, self.tgt_vocab_size):
                yield f"{name}={value} lies outside the vocabulary (0..{min(self.vocab_size, self.tgt_vocab_size) - 1})"

    def _source_problems(self):
        if self.source not in ("features", "patches"):  # tokens, or a typo that choices() names
            if self.source != "tokens":
                return
            for name in ("source_dim", "image_size"):
                if getattr(self, name) is not None:
                    yield f"{name} applies to source='features' or 'patches' only; leave it None for source='tokens'"
            return
        if self.topology != "encoder_decoder":
            yield f"source={self.source!r} needs topology='encoder_decoder' (an encoder reading it, a decoder writing text)"
        if self.share_embeddings:
            yield f"share_embeddings=True shares a token table between source and target, but source={self.source!r} has none"
        if self.source == "features":
            if self.source_dim is None or self.source_dim < 1:
                yield "source='features' needs source_dim, the width of each feature vector (e.g. 2048)"
            if self.image_size is not None:
                yield "image_size applies to source='patches'; source='features' reads vectors of width source_dim"
            return
        if self.source_dim is not None:
            yield "source_dim applies to source='features'; source='patches' reads images (image_size, image_channels)"
        if self.positions in ("rope", "alibi"):
            yield (
                f"source='patches' takes sinusoidal (2-D) or learned positions; positions={self.positions!r} orders a "
                "1-D sequence only"
            )
        if self.patch_size < 1 or self.image_channels < 1:
            yield f"patch_size={self.patch_size} and image_channels={self.image_channels} must be positive integers"
        elif self.image_size is None or len(self.image_size) != 2:
            yield "source='patches' needs image_size: [height, width], each a multiple of patch_size"
        elif any(side < 1 or side % self.patch_size for side in self.image_size):
            yield (
                f"image_size={list(self.image_size)} is not a multiple of patch_size={self.patch_size} on each side: "
                "resize the images or choose a patch_size that divides both"
            )

    # Derived sizes: one place decides what None means.
    @property
    def is_encoder_decoder(self) -> bool:
        return self.topology == "encoder_decoder"

    @property
    def is_encoder_only(self) -> bool:
        return self.topology == "encoder_only"

    @property
    def is_classifier(self) -> bool:
        """An encoder-only model with the classification head: outputs (B, num_labels), not token logits."""
        return self.is_encoder_only and self.head == "classification"

    @property
    def head_dropout(self) -> float:
        return self.dropout if self.classifier_dropout is None else self.classifier_dropout

    @property
    def tgt_vocab_size(self) -> int:
        return self.target_vocab_size or self.vocab_size

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the (source or shared) embedding table: vocab_size rounded up to pad_vocab_to_multiple_of."""
        return _round_up(self.vocab_size, self.pad_vocab_to_multiple_of)

    @property
    def padded_tgt_vocab_size(self) -> int:
        """Rows of the target embedding and of the output layer: tgt_vocab_size rounded up likewise."""
        return _round_up(self.tgt_vocab_size, self.pad_vocab_to_multiple_of)

    @property
    def encoder_layers(self) -> int:
        return self.n_encoder_layers or self.n_layers

    @property
    def decoder_layers(self) -> int:
        return self.n_decoder_layers or self.n_layers

    @property
    def is_gated(self) -> bool:
        return self.activation in GATED_ACTIVATIONS

    @property
    def ff_dim(self) -> int:
        """The feed-forward inner width; for a gated activation, the width of each of its two input projections."""
        if self.d_ff:
            return self.d_ff
        return gated_d_ff(4 * self.d_model) if self.is_gated else 4 * self.d_model

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def attn_dropout(self) -> float:
        return self.dropout if self.attention_dropout is None else self.attention_dropout

    @property
    def shares_embeddings(self) -> bool:
        if not self.is_encoder_decoder or self.source != "tokens":
            return False
        if self.share_embeddings is None:
            # A target_vocab_size is a separate vocabulary even at the source's size (two tokenizers of one size:
            # shared_vocab false): id i names another piece on each side, so one matrix would serve both.
            return self.target_vocab_size is None
        return self.share_embeddings

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def patch_grid(self) -> tuple[int, int]:
        """source='patches': (rows, columns) of patches per image."""
        assert self.image_size is not None, "patch_grid is defined for source='patches'"
        return self.image_size[0] // self.patch_size, self.image_size[1] // self.patch_size

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


def _type_problems(config: Any):
    """Values of another type than the field's: a string where a bool goes would be taken as True ("false" too), and
    a float where an int goes fails deep inside torch (building the model, decoding)."""
    for field in dataclasses.fields(config):
        kind, _, optional = str(field.type).partition(" | ")
        value = getattr(config, field.name)
        if kind not in ("int", "float", "bool") or (value is None and optional == "None"):
            continue
        if kind == "bool" and isinstance(value, str):
            yield f"{field.name}={value!r} must be True or False (a bool, not a string)"
        elif kind == "int" and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
            yield f"{field.name}={value!r} must be an integer"
        elif kind == "float" and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
            yield f"{field.name}={value!r} must be a number"


def _listed(what: str, problems: list[str]) -> str:
    """One problem on the line that names the config; several, one a line below it."""
    if len(problems) == 1:
        return f"Invalid {what}: {problems[0]}"
    return f"Invalid {what}:\n  - " + "\n  - ".join(problems)


def _fields_named(config: Any, problems: list[str], prefix: str, only: Any = None) -> list[str]:
    """The config's fields the problems name (those of `only`, when given), as keys under `prefix`: the command line
    says where each was given."""
    text = "\n".join(problems)
    names = [f.name for f in dataclasses.fields(config) if only is None or f.name in only]
    return [prefix + name for name in names if re.search(rf"\b{name}\b", text)]


def _round_up(n: int, multiple: int | None) -> int:
    return n if not multiple else -(-n // multiple) * multiple


def gated_d_ff(d_ff: int, multiple_of: int = 1) -> int:
    """The d_ff of a gated MLP (swiglu, geglu) with the weights of a non-gated one of inner width `d_ff`.

    A non-gated MLP has two d_model x d_ff matrices, a gated one three of d_model x h: equal weights at h = 2 d_ff / 3
    (Shazeer 2020; Llama rounds it up to a multiple of 256). Rounded to the nearest multiple of `multiple_of`, so the
    counts agree to within 1.5 * multiple_of * d_model weights (0.1% for d_ff = 512).
    """
    return max(multiple_of, multiple_of * round(2 * d_ff / 3 / multiple_of))


_PAPER = dict(
    topology="encoder_decoder",
    norm_position="post",
    positions="sinusoidal",
    vocab_size=37000,
    pad_vocab_to_multiple_of=64,  # 37,056 rows: a GPU-friendly output width
    n_layers=6,
    activation="relu",
    bias=True,
    tie_embeddings=True,
    scale_embeddings=True,
    init="xavier",
    max_seq_len=1024,
)

PRESETS: dict[str, dict[str, Any]] = {
    # Vaswani et al. 2017, Table 3 "base": 65M parameters (63,082,496 counted unpadded, 63,111,168 allocated).
    "paper-base": {**_PAPER, "d_model": 512, "d_ff": 2048, "n_heads": 8, "dropout": 0.1},
    # Table 3 "big": 213M parameters (214,245,376 counted unpadded, 214,302,720 allocated).
    "paper-big": {**_PAPER, "d_model": 1024, "d_ff": 4096, "n_heads": 16, "dropout": 0.3},
    # The released GPT-2 small: 124,439,808 parameters; 124,475,904 allocated with the vocabulary padded to 50,304.
    "gpt2-small": dict(
        topology="decoder_only",
        norm_position="pre",
        positions="learned",
        vocab_size=50257,
        pad_vocab_to_multiple_of=64,
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
    # A small Llama (Touvron et al. 2023): RoPE, RMSNorm, SwiGLU, grouped-query attention (4 K/V heads for 12 query
    # heads), no biases, untied output; GPT-2 small's width and depth, 2,048 = gated_d_ff(4 * 768). 124.7M parameters.
    "llama-small": dict(
        topology="decoder_only",
        norm_position="pre",
        positions="rope",
        rope_theta=10000.0,
        norm="rmsnorm",
        layer_norm_eps=1e-5,
        vocab_size=32000,
        d_model=768,
        n_heads=12,
        n_kv_heads=4,
        n_layers=12,
        d_ff=2048,
        max_seq_len=2048,
        dropout=0.0,
        activation="swiglu",
        bias=False,
        tie_embeddings=False,
        pad_token_id=None,
        bos_token_id=1,
        eos_token_id=2,
        init="gpt2",
    ),
    # For tests and debugging: seconds on a CPU.
    "tiny": dict(
        vocab_size=128, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_seq_len=64, dropout=0.0, pad_token_id=0
    ),
}


# Vaswani et al. 2017, section 6.1: "beam search with a beam size of 4 and length penalty alpha = 0.6 ... maximum
# output length ... input length + 50, but terminate early when possible"; the penalty is GNMT's (Wu et al. 2016).
TRANSLATION_DECODING: dict[str, Any] = dict(
    num_beams=4, length_penalty=0.6, length_penalty_form="gnmt", max_source_offset=50, early_stopping=True
)


@dataclass
class GenerationConfig:
    """How to decode: the one home of every decoding default (Transformer.generate, the generate, translate and
    predict commands, the TensorBoard samples, validation BLEU). ``GenerationConfig.for_task`` gives the defaults
    of a task (lit_transformer.tasks.generation_defaults: of an architecture's task); any field can be overridden."""

    max_new_tokens: int = 200
    """Tokens to generate at most (EOS included)."""
    temperature: float = 0.0
    """0 is greedy (argmax); above 0, sample from softmax(logits / temperature)."""
    top_k: int | None = None
    """Sample among the k most likely tokens only; None (or 0) keeps all."""
    top_p: float | None = None
    """Nucleus sampling: sample from the smallest set of tokens whose probability reaches top_p; None keeps all."""
    num_beams: int = 1
    """Beam search with this many beams when above 1 (deterministic; temperature, top_k and top_p are ignored)."""
    length_penalty: float = 1.0
    """Beam search's alpha: a hypothesis scores log p / lp(|Y|), lp as length_penalty_form says (0 ranks by log p
    alone)."""
    length_penalty_form: Literal["length", "gnmt"] = "length"
    """Beam search: length: lp = |Y| ** alpha (Hugging Face's, and a bare GenerationConfig's); gnmt: lp =
    ((5 + |Y|) / 6) ** alpha, Wu et al. 2016, the form the Transformer paper's alpha = 0.6 refers to."""
    early_stopping: bool = False
    """Beam search: True ends a row as soon as num_beams hypotheses have finished (the paper's rule); False also
    waits until no live beam, scored at the current length, could beat the worst of them (Hugging Face's default)."""
    repetition_penalty: float = 1.0
    """Above 1, the logits of tokens already in the sequence (prompt included) shrink: divided by it when positive,
    multiplied when negative (Keskar et al. 2019, as Hugging Face does; with num_beams above 1 the logits are
    penalised before the log-softmax, where Hugging Face's beam search penalises the log-probabilities)."""
    stop: list[str] = dataclasses.field(default_factory=list)
    """Stop strings: a row ends when its generated text contains one, which is cut from the output (text commands)."""
    stop_token_ids: list[int] = dataclasses.field(default_factory=list)
    """Token ids that end a row as EOS does (kept in the output), besides eos_token_id."""
    eos_token_id: int | None = None
    """The token that ends a row; None uses the model config's eos_token_id; -1: none does, every row runs to
    max_new_tokens."""
    max_source_offset: int | None = 50
    """encoder_decoder: a translation is at most its source's length + this many tokens (the paper's +50); None
    bounds it by max_new_tokens alone."""
    window_keep: int | None = None
    """decoder_only, once a sequence outgrows max_seq_len: the model conditions on its last max_seq_len tokens; with
    the KV cache, the window is refilled from its last window_keep tokens and then grows again, so the cost of a
    slide is paid once per (max_seq_len - window_keep) tokens. None keeps half the context; max_seq_len crops to
    exactly the last max_seq_len tokens before every token (nanoGPT's rule, one full window pass per token)."""
    seed: int | None = None
    """Seed of the sampling generator; None draws from torch's global generator."""
    use_cache: bool = True
    """Decode with the KV cache; False recomputes the whole window every step (slow; a reference for tests)."""
    compile: bool = False
    """Run the model's encoder and decoder passes through torch.compile (inductor, CPU-measured): a step becomes a
    few fused kernels, so each token costs less, above all with --quantize int8 (docs/inference.md, "Compiled
    decoding"). The first call in a process compiles (tens of seconds on 2 cores; seconds once inductor's on-disk
    cache holds the graphs): worth it for many inputs or long outputs. The same model: int8 layers compute the same
    integers, fp32 sums may round in another order, so near-tied candidates can rank differently."""

    def __post_init__(self) -> None:
        # One stop string or id given alone (stop="\n\n") is one, not each of its characters.
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if isinstance(self.stop_token_ids, int):
            self.stop_token_ids = [self.stop_token_ids]
        problems = list(_type_problems(self))
        if problems:
            raise ConfigError(_listed("GenerationConfig", problems))
        if self.max_new_tokens < 0:
            problems.append(f"max_new_tokens={self.max_new_tokens} must be >= 0")
        if not self.temperature >= 0:  # nan too
            problems.append(f"temperature={self.temperature} must be >= 0 (0 is greedy)")
        if self.top_k is not None and self.top_k < 0:
            problems.append(f"top_k={self.top_k} must be >= 1, or 0 or None for all tokens")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            problems.append(f"top_p={self.top_p} must lie in (0, 1] or be None")
        if self.num_beams < 1:
            problems.append(f"num_beams={self.num_beams} must be >= 1")
        if self.length_penalty_form not in ("length", "gnmt"):
            problems.append(f"length_penalty_form={self.length_penalty_form!r} must be 'length' or 'gnmt'")
        if not self.repetition_penalty > 0:  # nan too
            problems.append(f"repetition_penalty={self.repetition_penalty} must be positive (1 is none)")
        if self.max_source_offset is not None and self.max_source_offset < 1:
            problems.append(f"max_source_offset={self.max_source_offset} must be >= 1 or None")
        if self.window_keep is not None and self.window_keep < 1:
            problems.append(f"window_keep={self.window_keep} must be >= 1 or None")
        if self.eos_token_id is not None and self.eos_token_id < -1:
            problems.append(f"eos_token_id={self.eos_token_id} must be a token id, -1 (none) or None")
        if any(t < 0 for t in self.stop_token_ids):
            problems.append(f"stop_token_ids={self.stop_token_ids} must be token ids (0 or more)")
        if problems:
            raise ConfigError(_listed("GenerationConfig", problems))

    def replace(self, **changes: Any) -> GenerationConfig:
        """A copy with some fields changed, validated again."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def for_task(cls, task: Any, **overrides: Any) -> GenerationConfig:
        """The decoding defaults of a task (its class or object: Task.generation_defaults): a language model samples
        (temperature 0.8, top-k 50); a translation model decodes by the Transformer paper's rules (beam 4, GNMT
        length penalty alpha = 0.6, at most source length + 50 tokens, a row ends once its 4 beams have finished).
        Overrides with the value None are ignored, so CLI flags left unset keep the defaults."""
        base = cls(**task.generation_defaults)
        return base.replace(**{name: value for name, value in overrides.items() if value is not None})


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each dataclass field: the one description of a field, shown as its --help text (and as
    its description in `serve`'s request schema)."""
    import ast
    import inspect

    body = ast.parse(inspect.getsource(cls)).body[0].body
    docs = {}
    for field, doc in zip(body, body[1:]):
        if isinstance(field, ast.AnnAssign) and isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant):
            docs[field.target.id] = " ".join(str(doc.value.value).split())
    return docs
