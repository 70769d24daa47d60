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

import os
from pathlib import Path

import torch
from tokenizers import Tokenizer

from lit_transformer.config import TransformerConfig
from lit_transformer.interop.hf_files import save_hf_tokenizer
from lit_transformer.model import Transformer

# Marian's names for our activations: gelu_pytorch_tanh is F.gelu(approximate="tanh"), the very function we call.
TO_HF_ACTIVATION = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh"}
FROM_HF_ACTIVATION = {v: k for k, v in TO_HF_ACTIVATION.items()} | {"gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh"}

MARIAN_SHAPE = {
    "topology": ("encoder_decoder", "Marian is an encoder-decoder; save decoder-only models with save_hf_gpt2"),
    "norm_position": ("post", "Marian's layers are Post-LN: LayerNorm(x + Sublayer(x)), no final LayerNorm"),
    "positions": ("sinusoidal", "Marian has fixed sinusoidal positions only"),
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
    return problems


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
        raise ValueError("This model cannot be saved as a Hugging Face MarianMTModel:\n  - " + "\n  - ".join(problems))
    hf = MarianMTModel(MarianConfig(**to_hf_config(cfg)))
    state = to_hf_state_dict(model)
    missing, unexpected = hf.load_state_dict(state, strict=False)
    # The position tables are Marian's own sinusoids (recomputed on load), the logits bias is zero.
    missing = [k for k in missing if not k.endswith(("embed_positions.weight", "final_logits_bias"))]
    if missing or unexpected:
        raise RuntimeError(f"Marian mapping is incomplete: missing {missing}, unexpected {unexpected}")
    directory = Path(directory)
    hf.save_pretrained(os.fspath(directory))
    if tokenizer is not None:
        save_hf_tokenizer(tokenizer, directory, cfg, append_eos=True)
    if target_tokenizer is not None and target_tokenizer is not tokenizer:
        save_hf_tokenizer(target_tokenizer, directory / "target_tokenizer", cfg)
    return directory
