"""The paper's encoder-decoder as a Hugging Face ``MarianMTModel``, with the same logits.

Why Marian and not FSMT (both are Post-LN, sqrt(d)-scaled, without final LayerNorms): FSMT's sinusoids use the
tensor2tensor frequencies 10000^(-i / (d/2 - 1)), not the paper's 10000^(-2i / d), and it recomputes them, so no
weight file can carry ours. Marian's frequencies are the paper's; it only lays them out differently: sines in the first
half of the vector and cosines in the second, where the paper interleaves them (sin, cos, sin, cos, ...).

A permutation of the residual stream's coordinates is an exact equivalence: permute the embedding columns, the input
columns of every matrix that reads the stream, the output rows and biases of every matrix that writes it, and the
LayerNorm gains and biases (LayerNorm's mean and variance do not depend on the order). With P = (0, 2, 4, ..., 1, 3, ...)
our interleaved table becomes Marian's exactly, and every hidden state of the Marian model is ours, permuted by P.
Attention heads and the feed-forward's inner units are untouched.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import torch
from tokenizers import Tokenizer

from lit_transformer.checkpoints.files import follow_umask
from lit_transformer.config import TransformerConfig
from lit_transformer.data.marian_tokenizers import (  # noqa: F401 - the Marian readers of tokenizers live below data
    decoder_start_token_id,
    is_marian_folder,
    load_hf_marian_tokenizers,
    marian_decoder_start_token_id,
    spm_tokenizer,
)
from lit_transformer.data.text import read_tokenizer
from lit_transformer.errors import BadFileError, ConfigError, MissingFileError
from lit_transformer.interop.hf_files import (
    HF_SWITCHES_OFF,
    cannot_save,
    full_heads_qkv,
    read_state_dict,
    save_hf_tokenizer,
    switch_problems,
)
from lit_transformer.interop.hf_gpt2 import pad_rows
from lit_transformer.model import Transformer

# Marian's names for our activations: gelu_pytorch_tanh is F.gelu(approximate="tanh"), the very function we call;
# OPUS-MT's models use swish, which is SiLU.
TO_HF_ACTIVATION = {"relu": "relu", "relu2": "relu2", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "silu": "swish"}
FROM_HF_ACTIVATION = {v: k for k, v in TO_HF_ACTIVATION.items()} | {
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "silu": "silu",
}

MARIAN_SHAPE = {
    "topology": ("encoder_decoder", "Marian is an encoder-decoder; save decoder-only models with save_hf_gpt2"),
    "norm_position": ("post", "Marian's layers are Post-LN: LayerNorm(x + Sublayer(x)), no final LayerNorm"),
    "positions": ("sinusoidal", "Marian has fixed sinusoidal positions only"),
    "source": ("tokens", "Marian's encoder reads token ids through an embedding, not images or feature vectors"),
    "norm": ("layernorm", "Marian's norms are LayerNorms, with a gain and a bias"),
    "bias": (True, "Marian's projections and LayerNorms always carry biases"),
    "layer_norm_eps": (1e-5, "Marian's LayerNorms use torch's default epsilon"),
}


def marian_problems(cfg: TransformerConfig) -> list[str]:
    """Why `cfg` cannot be a MarianMTModel, one line per field; [] when it can."""
    problems = [
        f"{name}={getattr(cfg, name)!r}: Marian can only express {name}={value!r} ({why})"
        for name, (value, why) in MARIAN_SHAPE.items()
        if getattr(cfg, name) != value
    ]
    if cfg.pad_token_id is None:
        problems.append("pad_token_id=None: Marian needs a padding token (it pads and masks sources with it)")
    if cfg.bos_token_id is None:
        problems.append("bos_token_id=None: our decoder starts from BOS; Marian needs it as decoder_start_token_id")
    if cfg.activation not in TO_HF_ACTIVATION:
        problems.append(f"activation={cfg.activation!r}: Marian can only express {', '.join(TO_HF_ACTIVATION)} here")
    return problems + switch_problems(cfg, "Marian")


def stream_permutation(d_model: int) -> torch.Tensor:
    """Marian coordinate j holds our coordinate P[j]: the even ones (sines), then the odd ones (cosines)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def to_hf_config(cfg: TransformerConfig) -> dict:
    """MarianConfig fields; decoding starts from our BOS and nothing is forced (our generate forces nothing)."""
    return dict(
        architectures=["MarianMTModel"],
        vocab_size=cfg.vocab_size,
        decoder_vocab_size=cfg.tgt_vocab_size,
        share_encoder_decoder_embeddings=cfg.shares_embeddings,
        tie_word_embeddings=cfg.tie_embeddings,
        d_model=cfg.d_model,
        encoder_layers=cfg.encoder_layers,
        decoder_layers=cfg.decoder_layers,
        encoder_attention_heads=cfg.n_heads,
        decoder_attention_heads=cfg.n_heads,
        encoder_ffn_dim=cfg.ff_dim,
        decoder_ffn_dim=cfg.ff_dim,
        activation_function=TO_HF_ACTIVATION[cfg.activation],
        max_position_embeddings=cfg.max_seq_len,
        scale_embedding=cfg.scale_embeddings,
        dropout=cfg.dropout,
        attention_dropout=cfg.attn_dropout,
        activation_dropout=0.0,
        init_std=cfg.init_std,
        pad_token_id=cfg.pad_token_id,
        bos_token_id=cfg.bos_token_id,
        eos_token_id=cfg.eos_token_id,
        decoder_start_token_id=cfg.bos_token_id,
        forced_eos_token_id=None,
    )


def _attention(ours: dict, prefix: str, fused: str, d: int) -> dict[str, torch.Tensor]:
    """Marian's q/k/v/out projections from our fused ones (self: qkv; cross: q and kv)."""
    if fused == "qkv":
        w, b = ours["qkv.weight"].split(d), ours["qkv.bias"].split(d)
    else:
        w = (ours["q.weight"], *ours["kv.weight"].split(d))
        b = (ours["q.bias"], *ours["kv.bias"].split(d))
    out = {}
    for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
        out[f"{prefix}.{name}.weight"], out[f"{prefix}.{name}.bias"] = w[i], b[i]
    out[f"{prefix}.out_proj.weight"], out[f"{prefix}.out_proj.bias"] = ours["out.weight"], ours["out.bias"]
    return out


def _sub(state: dict, prefix: str) -> dict:
    return {k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}


def _block(state: dict, ours: str, theirs: str, d: int, cross: bool) -> dict[str, torch.Tensor]:
    out = _attention(_sub(state, ours + "self_attn."), theirs + "self_attn", "qkv", d)
    norms = {"self_attn_norm": "self_attn_layer_norm", "ff_norm": "final_layer_norm"}
    if cross:
        out |= _attention(_sub(state, ours + "cross_attn."), theirs + "encoder_attn", "q_kv", d)
        norms["cross_attn_norm"] = "encoder_attn_layer_norm"
    for our_norm, hf_norm in norms.items():
        for p in ("weight", "bias"):
            out[f"{theirs}{hf_norm}.{p}"] = state[f"{ours}{our_norm}.{p}"]
    for our_fc, hf_fc in (("up", "fc1"), ("down", "fc2")):
        for p in ("weight", "bias"):
            out[f"{theirs}{hf_fc}.{p}"] = state[f"{ours}ff.{our_fc}.{p}"]
    return out


# Which tensors read the residual stream (permute input columns) and which write it (permute rows / vector).
_READS = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "fc1.weight", "embed_tokens.weight", "lm_head.weight")
_WRITES = ("out_proj.weight", "out_proj.bias", "fc2.weight", "fc2.bias", "layer_norm.weight", "layer_norm.bias")


def _permute(name: str, tensor: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    if name.endswith(_READS) or name == "model.shared.weight":
        return tensor[:, perm]
    if name.endswith(_WRITES):
        return tensor[perm]
    return tensor


def to_hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """MarianMTModel's parameters for `model`, in Marian's coordinate order (see the module docstring). Vocabulary
    matrices keep their true rows: padded ones (pad_vocab_to_multiple_of) are ours alone and are dropped."""
    cfg = model.config
    d = cfg.d_model
    s = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    # Marian has no grouped-query attention: written as the multi-head attention that computes it.
    s |= {k: full_heads_qkv(v, cfg) for k, v in s.items() if ".self_attn.qkv." in k}
    s["src_embed.weight"] = s["src_embed.weight"][: cfg.vocab_size]
    s["tgt_embed.weight"] = s["tgt_embed.weight"][: cfg.tgt_vocab_size]
    s["lm_head.weight"] = s["lm_head.weight"][: cfg.tgt_vocab_size]
    out: dict[str, torch.Tensor] = {}
    for i in range(cfg.encoder_layers):
        out |= _block(s, f"encoder_blocks.{i}.", f"model.encoder.layers.{i}.", d, cross=False)
    for i in range(cfg.decoder_layers):
        out |= _block(s, f"decoder_blocks.{i}.", f"model.decoder.layers.{i}.", d, cross=True)
    if cfg.shares_embeddings:
        out["model.shared.weight"] = s["src_embed.weight"]
    out["model.encoder.embed_tokens.weight"] = s["src_embed.weight"]
    out["model.decoder.embed_tokens.weight"] = s["tgt_embed.weight"]
    out["lm_head.weight"] = s["lm_head.weight"]
    perm = stream_permutation(d)
    return {k: _permute(k, v, perm).contiguous() for k, v in out.items()}


def save_hf_marian(
    model: Transformer,
    directory: str | os.PathLike,
    tokenizer: Tokenizer | None = None,
    target_tokenizer: Tokenizer | None = None,
) -> Path:
    """Write a folder that ``MarianMTModel.from_pretrained`` (and AutoModelForSeq2SeqLM) loads, with our logits.

    The tokenizer is saved to end every source with EOS, as our sources are. A separate target vocabulary's
    tokenizer goes to target_tokenizer/ (decode generated ids with it; AutoTokenizer picks up the source one).
    """
    from transformers import MarianConfig, MarianMTModel

    cfg = model.config
    problems = marian_problems(cfg)
    if problems:
        raise cannot_save("MarianMTModel", problems)
    hf = MarianMTModel(MarianConfig(**to_hf_config(cfg)))
    state = to_hf_state_dict(model)
    missing, unexpected = hf.load_state_dict(state, strict=False)
    # The position tables are Marian's own sinusoids (recomputed on load), the logits bias is zero.
    missing = [k for k in missing if not k.endswith(("embed_positions.weight", "final_logits_bias"))]
    if missing or unexpected:
        raise RuntimeError(f"Marian mapping is incomplete: missing {missing}, unexpected {unexpected}")
    directory = Path(directory)
    hf.save_pretrained(os.fspath(directory))
    follow_umask(*directory.glob("*.safetensors"))  # written 0600 through a temporary file, as safetensors does
    if tokenizer is not None:
        save_hf_tokenizer(tokenizer, directory, cfg, append_eos=True)
    if target_tokenizer is not None and target_tokenizer is not tokenizer:
        save_hf_tokenizer(target_tokenizer, directory / "target_tokenizer", cfg)
    return directory


# ---- the way back: a Marian folder (ours, or OPUS-MT's) as our Transformer -------------------------------------


def from_hf_config(hf: Mapping, base: TransformerConfig | None = None) -> TransformerConfig:
    """Our config for a Marian config.json. The folder decides the architecture and the special ids (decoding starts
    from its decoder_start_token_id: OPUS-MT's is its pad token); dropout and initialisation come from `base` when
    given (training choices), else from the folder. Refuses what our Transformer cannot compute, naming the fields."""
    problems = []
    if hf.get("model_type", "marian") != "marian":
        problems.append(f"model_type={hf.get('model_type')!r}: not a Marian model")
    for ours, theirs in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if hf.get(ours) != hf.get(theirs):
            problems.append(f"{ours}={hf.get(ours)} and {theirs}={hf.get(theirs)}: we use one value for both sides")
    activation = hf.get("activation_function", "swish")
    if activation not in FROM_HF_ACTIVATION:
        problems.append(f"activation_function={activation!r}: we support {', '.join(FROM_HF_ACTIVATION)}")
    for option, value in (("normalize_before", False), ("add_final_layer_norm", False), ("normalize_embedding", False)):
        if hf.get(option, value) != value:
            problems.append(f"{option}={hf[option]!r}: Marian as we read it has {option}={value!r}")
    if problems:
        raise BadFileError(
            "This Marian model cannot be represented by our Transformer:\n  - " + "\n  - ".join(problems)
        )
    vocab = hf["vocab_size"]
    target_vocab = hf.get("decoder_vocab_size") or vocab
    start = decoder_start_token_id(hf)
    share = hf.get("share_encoder_decoder_embeddings", True)
    architecture = dict(
        topology="encoder_decoder",
        norm_position="post",
        positions="sinusoidal",
        norm="layernorm",
        vocab_size=vocab,
        target_vocab_size=None if target_vocab == vocab else target_vocab,
        # Stated only where it differs from our default (shared when the vocabularies are one).
        share_embeddings=None if share == (target_vocab == vocab) else share,
        tie_embeddings=hf.get("tie_word_embeddings", True),
        d_model=hf["d_model"],
        n_heads=hf["encoder_attention_heads"],
        n_kv_heads=None,  # k_proj and v_proj hold a head per query head
        n_layers=hf["encoder_layers"],
        n_encoder_layers=None,
        n_decoder_layers=None if hf["decoder_layers"] == hf["encoder_layers"] else hf["decoder_layers"],
        d_ff=hf["encoder_ffn_dim"],
        max_seq_len=hf.get("max_position_embeddings", 512),
        activation=FROM_HF_ACTIVATION[activation],
        bias=True,
        scale_embeddings=hf.get("scale_embedding", True),
        layer_norm_eps=1e-5,
        pad_token_id=hf["pad_token_id"],
        bos_token_id=start,
        eos_token_id=hf["eos_token_id"],
        **HF_SWITCHES_OFF,
    )
    if base is None:
        dropout, attention = hf.get("dropout", 0.1), hf.get("attention_dropout", 0.0)
        training = dict(dropout=dropout, attention_dropout=attention, init_std=hf.get("init_std", 0.02))
        return TransformerConfig(**architecture, **training)
    return base.replace(**architecture)


def _inverse_permute(name: str, tensor: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """Undo _permute: Marian's coordinate j back to our coordinate perm[j]."""
    inverse = torch.argsort(perm)
    return _permute(name, tensor, inverse)


# Tensors of a Marian folder that hold no weight of ours: the sinusoid tables (ours are computed) and the logits bias
# (checked to be zero).
_NOT_WEIGHTS = ("embed_positions.weight", "final_logits_bias")
# The embedding tables, each optional: save_pretrained keeps one of those it ties.
_EMBEDDINGS = ("shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight")


def from_hf_state_dict(state: Mapping[str, torch.Tensor], cfg: TransformerConfig) -> dict[str, torch.Tensor]:
    """Our parameters from MarianMTModel's (the inverse of to_hf_state_dict): coordinates permuted back to the
    paper's interleaved order, q/k/v fused; a padded config (pad_vocab_to_multiple_of) gets zero rows appended. A
    non-zero final_logits_bias is refused: our output has no bias; so is a tensor this reads nowhere (a Marian variant
    we do not compute), which would otherwise be dropped without a word."""
    bias = state.get("final_logits_bias")
    if bias is not None and bool(bias.abs().max() > 0):
        raise BadFileError(
            "final_logits_bias is not zero in this Marian model: our output layer has no bias, so the logits would "
            "differ; this model cannot be loaded exactly"
        )
    perm = stream_permutation(cfg.d_model)
    named = {k.removeprefix("model.") if k != "lm_head.weight" else k: k for k in state}  # -> the folder's name
    s = {k: state[name] for k, name in named.items()}
    s = {k: _inverse_permute(f"model.{k}" if k == "shared.weight" else k, v, perm) for k, v in s.items()}
    out: dict[str, torch.Tensor] = {}
    read = set(_EMBEDDINGS)

    def take(name: str) -> torch.Tensor:
        if name not in s:
            raise BadFileError(f"The Marian weights lack model.{name}, which its config.json describes")
        read.add(name)
        return s[name]

    def attention(ours: str, theirs: str, fused: str) -> None:
        w = [take(f"{theirs}.{n}_proj.weight") for n in "qkv"]
        b = [take(f"{theirs}.{n}_proj.bias") for n in "qkv"]
        if fused == "qkv":
            out[f"{ours}.qkv.weight"], out[f"{ours}.qkv.bias"] = torch.cat(w), torch.cat(b)
        else:
            out[f"{ours}.q.weight"], out[f"{ours}.q.bias"] = w[0], b[0]
            out[f"{ours}.kv.weight"], out[f"{ours}.kv.bias"] = torch.cat(w[1:]), torch.cat(b[1:])
        out[f"{ours}.out.weight"], out[f"{ours}.out.bias"] = (
            take(f"{theirs}.out_proj.weight"),
            take(f"{theirs}.out_proj.bias"),
        )

    for side, count in (("encoder", cfg.encoder_layers), ("decoder", cfg.decoder_layers)):
        for i in range(count):
            ours, theirs = f"{side}_blocks.{i}.", f"{side}.layers.{i}."
            attention(ours + "self_attn", theirs + "self_attn", "qkv")
            norms = {"self_attn_norm": "self_attn_layer_norm", "ff_norm": "final_layer_norm"}
            if side == "decoder":
                attention(ours + "cross_attn", theirs + "encoder_attn", "q_kv")
                norms["cross_attn_norm"] = "encoder_attn_layer_norm"
            for our_norm, hf_norm in norms.items():
                for p in ("weight", "bias"):
                    out[f"{ours}{our_norm}.{p}"] = take(f"{theirs}{hf_norm}.{p}")
            for our_fc, hf_fc in (("up", "fc1"), ("down", "fc2")):
                for p in ("weight", "bias"):
                    out[f"{ours}ff.{our_fc}.{p}"] = take(f"{theirs}{hf_fc}.{p}")
    unread = sorted(named[k] for k in s if k not in read and not k.endswith(_NOT_WEIGHTS))
    if unread:
        raise BadFileError(
            f"The Marian weights hold {unread[:5]}, which our Transformer has no place for: a Marian variant it does "
            "not compute, or a config.json that describes other layers than the weights"
        )
    shared = s.get("shared.weight")
    src = s.get("encoder.embed_tokens.weight", shared)
    tgt = s.get("decoder.embed_tokens.weight", shared)
    # save_pretrained leaves out tied tensors: the output layer is then the target embedding.
    head = s.get("lm_head.weight", tgt)
    for name, table, rows in (
        ("src_embed.weight", src, cfg.padded_vocab_size),
        ("tgt_embed.weight", tgt, cfg.padded_tgt_vocab_size),
        ("lm_head.weight", head, cfg.padded_tgt_vocab_size),
    ):
        if table is not None:  # else load_hf_marian names it as missing
            out[name] = pad_rows(table, rows)
    return {k: v.contiguous() for k, v in out.items()}


def load_hf_marian(directory: str | os.PathLike, base: TransformerConfig | None = None) -> Transformer:
    """Our Transformer (eval mode) from a Marian folder: one written by save_hf_marian, an OPUS-MT download, or any
    MarianMTModel.save_pretrained. config.json sets the architecture; `base`, when given, dropout and initialisation.
    Its tokenizers: load_hf_marian_tokenizers."""
    folder = Path(directory)
    if not (folder / "config.json").is_file():
        raise MissingFileError(f"{folder} holds no config.json: give the folder of a Marian model (e.g. opus-mt-en-es)")
    if base is not None and base.source != "tokens":
        raise ConfigError(
            f"model.config.source={base.source!r}, but the Marian model in {folder} reads tokens: its encoder has no "
            "input layer for images or feature vectors. Start such a model from scratch or from a .ckpt of one",
            keys=["model.config.source"],
        )
    cfg = from_hf_config(json.loads((folder / "config.json").read_text()), base)
    model = Transformer(cfg)
    state = from_hf_state_dict(read_state_dict(folder), cfg)
    # Every weight ours and only ours, of our shapes: anything else is a mismatch to say, never weights to drop or
    # leave as initialised (the sinusoid tables are buffers of ours, not in the state dict).
    expected = model.state_dict()
    problems = {
        "missing": [k for k in expected if k not in state],
        "unexpected": [k for k in state if k not in expected],
        "of another shape": [
            f"{k} {tuple(v.shape)} for {tuple(expected[k].shape)}"
            for k, v in state.items()
            if k in expected and v.shape != expected[k].shape
        ],
    }
    found = [f"{what} {names[:5]}" for what, names in problems.items() if names]
    if found:
        raise BadFileError(
            f"{folder}: the Marian weights do not fit the model its config.json describes (as our parameters: "
            f"{'; '.join(found)})"
        )
    model.load_state_dict(state)
    return model.eval()


def marian_tokenizer_json(directory: str | os.PathLike) -> str:
    """The source tokenizer of a Marian folder as the JSON string a DataModule reading DIR/tokenizer.json holds
    (to check that fine-tuning data uses it); OPUS-MT's SentencePiece one, converted, when there is no tokenizer.json
    (save it with ``load_hf_marian_tokenizers(DIR)[0].save("tokenizer.json")``)."""
    path = Path(directory) / "tokenizer.json"
    if path.is_file():
        return read_tokenizer(path).to_str()
    return load_hf_marian_tokenizers(directory)[0].to_str()
