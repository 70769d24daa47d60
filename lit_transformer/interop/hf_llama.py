"""Hugging Face Llama folders (``LlamaForCausalLM``) to and from our ``Transformer``, with exact logits.

Llama is one point of our variant space: decoder-only, Pre-norm with RMSNorm and a final RMSNorm, rotary positions in
the "rotate half" layout, SwiGLU, grouped-query attention, no embedding scaling. Our fused projections split into
Llama's: ``qkv`` rows are [q_proj, k_proj, v_proj] and a gated ``up`` is [gate_proj, up_proj].
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

import torch
from tokenizers import Tokenizer

from lit_transformer.config import TransformerConfig
from lit_transformer.errors import BadFileError
from lit_transformer.interop.hf_files import (
    HF_SWITCHES_OFF,
    cannot_save,
    read_hf_folder,
    switch_problems,
    write_hf_folder,
)
from lit_transformer.interop.hf_gpt2 import pad_rows
from lit_transformer.model import Transformer

log = logging.getLogger(__name__)

# Field -> (the only value Llama can express, why).
LLAMA_SHAPE = {
    "topology": ("decoder_only", "LlamaForCausalLM has no encoder"),
    "norm_position": ("pre", "Llama normalises before each sublayer and once at the end (model.norm)"),
    "positions": ("rope", "Llama rotates queries and keys; it has no position table or attention bias"),
    "norm": ("rmsnorm", "Llama's norms are RMSNorm (a gain, no bias)"),
    "activation": ("swiglu", "Llama's MLP is down(silu(gate(x)) * up(x))"),
    "scale_embeddings": (False, "Llama feeds token embeddings unscaled"),
}
# Llama options we can only read at one value: (option, value we support, why).
HF_OPTIONS = {
    "hidden_act": ("silu", "our swiglu gate is silu"),
    "pretraining_tp": (1, "tensor-parallel slicing of the projections changes the arithmetic"),
}


def llama_problems(cfg: TransformerConfig) -> list[str]:
    """Why `cfg` cannot be a Llama model: one line per field, naming it; [] when it can."""
    return [
        f"{name}={getattr(cfg, name)!r}: Llama can only express {name}={value!r} ({why})"
        for name, (value, why) in LLAMA_SHAPE.items()
        if getattr(cfg, name) != value
    ] + switch_problems(cfg, "Llama")


def to_hf_config(cfg: TransformerConfig) -> dict:
    """config.json fields of LlamaConfig for `cfg`."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.ff_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.layer_norm_eps,
        "rope_theta": cfg.rope_theta,  # transformers < 5
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "attention_bias": cfg.bias,
        "mlp_bias": cfg.bias,
        "attention_dropout": cfg.attn_dropout,
        "initializer_range": cfg.init_std,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id,
        "pad_token_id": cfg.pad_token_id,
        "pretraining_tp": 1,
    }


def _rope_theta(hf: Mapping) -> float:
    """rope_theta from either layout (transformers 5 nests it in rope_parameters); refuses scaled variants."""
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise BadFileError(
            f"This Llama uses rope_type={kind!r} (scaled rotary frequencies); we implement the default rotary only"
        )
    return float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))


def from_hf_config(hf: Mapping, base: TransformerConfig | None = None) -> TransformerConfig:
    """Our config for a Llama config.json. The folder decides the architecture and special token ids; dropout and
    initialisation come from `base` when given (they are training choices), else from the folder."""
    if hf.get("model_type", "llama") != "llama":
        raise BadFileError(f"config.json describes model_type={hf.get('model_type')!r}, not a Llama ('llama')")
    problems = [
        f"{option}={hf[option]!r} (we support only {option}={value!r}: {why})"
        for option, (value, why) in HF_OPTIONS.items()
        if option in hf and hf[option] != value
    ]
    d_model, n_heads = hf["hidden_size"], hf["num_attention_heads"]
    if hf.get("head_dim") not in (None, d_model // n_heads):
        problems.append(f"head_dim={hf['head_dim']} (we support only hidden_size / num_attention_heads)")
    if hf.get("attention_bias", False) != hf.get("mlp_bias", False):
        problems.append("attention_bias != mlp_bias (our `bias` switch sets both)")
    if problems:
        raise BadFileError("This Llama cannot be represented by our Transformer:\n  - " + "\n  - ".join(problems))
    eos = hf.get("eos_token_id", 2)
    architecture = dict(
        topology="decoder_only",
        norm_position="pre",
        positions="rope",
        rope_theta=_rope_theta(hf),
        norm="rmsnorm",
        activation="swiglu",
        vocab_size=hf["vocab_size"],
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=hf.get("num_key_value_heads") or n_heads,
        n_layers=hf["num_hidden_layers"],
        d_ff=hf["intermediate_size"],
        max_seq_len=hf.get("max_position_embeddings", 2048),
        bias=bool(hf.get("attention_bias", False)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        scale_embeddings=False,
        layer_norm_eps=hf.get("rms_norm_eps", 1e-6),
        pad_token_id=hf.get("pad_token_id"),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=eos[0] if isinstance(eos, list) else eos,
        **HF_SWITCHES_OFF,
    )
    if base is None:
        attn = hf.get("attention_dropout", 0.0)
        return TransformerConfig(
            **architecture,
            dropout=0.0,
            attention_dropout=attn or None,
            init="gpt2",
            init_std=hf.get("initializer_range", 0.02),
        )
    changed = {k: (getattr(base, k), v) for k, v in architecture.items() if getattr(base, k) != v}
    if changed:
        log.info("Architecture taken from the pretrained config.json: %s", changed)
    return base.replace(**architecture, target_vocab_size=None, n_encoder_layers=None, n_decoder_layers=None)


_NORMS = {"self_attn_norm.weight": "input_layernorm.weight", "ff_norm.weight": "post_attention_layernorm.weight"}
_OUT = {"self_attn.out": "self_attn.o_proj", "ff.down": "mlp.down_proj"}


def to_hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """LlamaForCausalLM's parameter names (lm_head left out when tied, as save_pretrained does). Vocabulary matrices
    keep their true rows: padded ones (pad_vocab_to_multiple_of) are ours alone and are dropped."""
    cfg = model.config
    s = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    embed = s["tgt_embed.weight"][: cfg.vocab_size]
    out = {"model.embed_tokens.weight": embed, "model.norm.weight": s["decoder_norm.weight"]}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = s["lm_head.weight"][: cfg.vocab_size]
    sizes = model.decoder_blocks[0].self_attn.split_sizes
    kinds = ["weight", "bias"] if cfg.bias else ["weight"]
    for i in range(cfg.n_layers):
        ours, theirs = f"decoder_blocks.{i}.", f"model.layers.{i}."
        for our_name, hf_name in _NORMS.items():
            out[theirs + hf_name] = s[ours + our_name]
        for kind in kinds:
            for name, part in zip(("q_proj", "k_proj", "v_proj"), s[f"{ours}self_attn.qkv.{kind}"].split(sizes)):
                out[f"{theirs}self_attn.{name}.{kind}"] = part
            gate, up = s[f"{ours}ff.up.{kind}"].chunk(2)
            out[f"{theirs}mlp.gate_proj.{kind}"], out[f"{theirs}mlp.up_proj.{kind}"] = gate, up
            for our_name, hf_name in _OUT.items():
                out[f"{theirs}{hf_name}.{kind}"] = s[f"{ours}{our_name}.{kind}"]
    return {k: v.contiguous() for k, v in out.items()}


def from_hf_state_dict(state: Mapping[str, torch.Tensor], cfg: TransformerConfig) -> dict[str, torch.Tensor]:
    """Our parameter names from Llama's; a padded config (pad_vocab_to_multiple_of) gets zero rows appended."""
    s = dict(state)
    embed = pad_rows(s["model.embed_tokens.weight"], cfg.padded_vocab_size)
    out = {"tgt_embed.weight": embed, "decoder_norm.weight": s["model.norm.weight"]}
    out["lm_head.weight"] = embed if cfg.tie_embeddings else pad_rows(s["lm_head.weight"], cfg.padded_vocab_size)
    kinds = ["weight", "bias"] if cfg.bias else ["weight"]
    for i in range(cfg.n_layers):
        ours, theirs = f"decoder_blocks.{i}.", f"model.layers.{i}."
        for our_name, hf_name in _NORMS.items():
            out[ours + our_name] = s[theirs + hf_name]
        for kind in kinds:
            qkv = [s[f"{theirs}self_attn.{name}.{kind}"] for name in ("q_proj", "k_proj", "v_proj")]
            out[f"{ours}self_attn.qkv.{kind}"] = torch.cat(qkv)
            gated = [s[f"{theirs}mlp.{name}.{kind}"] for name in ("gate_proj", "up_proj")]
            out[f"{ours}ff.up.{kind}"] = torch.cat(gated)
            for our_name, hf_name in _OUT.items():
                out[f"{ours}{our_name}.{kind}"] = s[f"{theirs}{hf_name}.{kind}"]
    return out


def save_hf_llama(model: Transformer, directory: str | os.PathLike, tokenizer: Tokenizer | None = None) -> Path:
    """Write a folder that ``transformers.LlamaForCausalLM.from_pretrained`` loads: config.json, model.safetensors
    and, with a tokenizer, its files. Refuses models Llama cannot express, naming the fields."""
    cfg = model.config
    problems = llama_problems(cfg)
    if problems:
        raise cannot_save("Llama", problems)
    return write_hf_folder(directory, to_hf_config(cfg), to_hf_state_dict(model), tokenizer, cfg)


def load_hf_llama(directory: str | os.PathLike, base: TransformerConfig | None = None) -> Transformer:
    """Our Transformer (eval mode) from a Llama folder or, when online, a hub name.

    The folder's config.json sets the architecture; `base`, when given, supplies dropout and initialisation.
    """
    hf, state = read_hf_folder(directory, what="Llama model")
    cfg = from_hf_config(hf, base)
    model = Transformer(cfg)
    model.load_state_dict(from_hf_state_dict(state, cfg))
    return model.eval()
