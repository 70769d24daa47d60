"""Hugging Face GPT-2 folders (``GPT2LMHeadModel``) to and from our ``Transformer``, with exact logits.

GPT-2 is one point of our variant space: decoder-only, Pre-LN with a final LayerNorm, learned positions, biases, tied
embeddings, no embedding scaling. Its ``Conv1D`` layers store weights as (in, out), the transpose of ``nn.Linear``.
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
    full_heads_qkv,
    read_hf_folder,
    switch_problems,
    write_hf_folder,
)
from lit_transformer.model import Transformer

log = logging.getLogger(__name__)

# Our activation -> GPT-2's name. GPT-2's "gelu_new" is the tanh approximation; "gelu" is the exact erf GELU.
TO_HF_ACTIVATION = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "relu2": "relu2"}
# GPT-2 names that compute the same function as one of ours (the tanh approximation has three spellings).
FROM_HF_ACTIVATION = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh"} | {
    "gelu": "gelu",
    "relu": "relu",
    "relu2": "relu2",  # transformers' ReLUSquaredActivation
}

# Field -> (the only value GPT-2 can express, why).
GPT2_SHAPE = {
    "topology": ("decoder_only", "GPT-2 has no encoder; export encoder-decoder models with save_hf_marian"),
    "norm_position": ("pre", "GPT-2 normalises before each sublayer (ln_1, ln_2) and once at the end (ln_f)"),
    "norm": ("layernorm", "GPT-2's ln_1, ln_2 and ln_f are LayerNorms, with a gain and a bias"),
    "positions": ("learned", "GPT-2 adds a learned position table (wpe): no sinusoids, rotary, ALiBi or none"),
    "scale_embeddings": (False, "GPT-2 adds token and position embeddings unscaled"),
    "bias": (True, "GPT-2's Conv1D projections and LayerNorms always carry biases"),
    "tie_embeddings": (True, "GPT2LMHeadModel ties lm_head to the token embedding wte"),
}
# What we refuse to load: GPT-2 options with no counterpart in our model. (option, value we support).
HF_OPTIONS = {
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "add_cross_attention": False,
    "tie_word_embeddings": True,
}


def gpt2_problems(cfg: TransformerConfig) -> list[str]:
    """Why `cfg` cannot be a GPT-2 model: one line per field, naming it; [] when it can."""
    problems = [
        f"{name}={getattr(cfg, name)!r}: GPT-2 can only express {name}={value!r} ({why})"
        for name, (value, why) in GPT2_SHAPE.items()
        if getattr(cfg, name) != value
    ]
    if cfg.activation not in TO_HF_ACTIVATION:
        problems.append(f"activation={cfg.activation!r}: GPT-2 can only express {', '.join(TO_HF_ACTIVATION)} here")
    return problems + switch_problems(cfg, "GPT-2")


def _check_gpt2(cfg: TransformerConfig) -> None:
    problems = gpt2_problems(cfg)
    if problems:
        raise cannot_save("GPT-2", problems)


def to_hf_config(cfg: TransformerConfig) -> dict:
    """config.json fields of GPT2Config for `cfg` (architectures names the class that loads the weights)."""
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.max_seq_len,
        "n_embd": cfg.d_model,
        "n_layer": cfg.n_layers,
        "n_head": cfg.n_heads,
        "n_inner": cfg.ff_dim,
        "activation_function": TO_HF_ACTIVATION[cfg.activation],
        "resid_pdrop": cfg.dropout,
        "embd_pdrop": cfg.dropout,
        "attn_pdrop": cfg.attn_dropout,
        "layer_norm_epsilon": cfg.layer_norm_eps,
        "initializer_range": cfg.init_std,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id,
        "pad_token_id": cfg.pad_token_id,
        "tie_word_embeddings": True,
    }


def from_hf_config(hf: Mapping, base: TransformerConfig | None = None) -> TransformerConfig:
    """Our config for a GPT-2 config.json. The folder decides the architecture and special token ids; dropout and
    initialisation come from `base` when given (they are training choices), else from the folder."""
    if hf.get("model_type", "gpt2") != "gpt2":
        raise BadFileError(f"config.json describes model_type={hf.get('model_type')!r}, not a GPT-2 ('gpt2')")
    problems = [
        f"{option}={hf[option]!r} (we support only {option}={value!r})"
        for option, value in HF_OPTIONS.items()
        if option in hf and hf[option] != value
    ]
    activation = hf.get("activation_function", "gelu_new")
    if activation not in FROM_HF_ACTIVATION:
        problems.append(f"activation_function={activation!r} (we support {', '.join(FROM_HF_ACTIVATION)})")
    if problems:
        raise BadFileError("This GPT-2 cannot be represented by our Transformer:\n  - " + "\n  - ".join(problems))
    eos = hf.get("eos_token_id", 50256)
    architecture = dict(
        topology="decoder_only",
        norm_position="pre",
        positions="learned",
        norm="layernorm",
        vocab_size=hf.get("vocab_size", 50257),
        d_model=hf.get("n_embd", 768),
        n_heads=hf.get("n_head", 12),
        n_kv_heads=None,  # c_attn holds a key and a value head per query head
        n_layers=hf.get("n_layer", 12),
        d_ff=hf.get("n_inner") or 4 * hf.get("n_embd", 768),
        max_seq_len=hf.get("n_positions", 1024),
        activation=FROM_HF_ACTIVATION[activation],
        bias=True,
        tie_embeddings=True,
        scale_embeddings=False,
        layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        pad_token_id=hf.get("pad_token_id"),
        bos_token_id=hf.get("bos_token_id", 50256),
        eos_token_id=eos[0] if isinstance(eos, list) else eos,
        **HF_SWITCHES_OFF,
    )
    if base is None:
        dropout = hf.get("resid_pdrop", 0.1)
        attn = hf.get("attn_pdrop", 0.1)
        training = dict(
            dropout=dropout,
            attention_dropout=None if attn == dropout else attn,
            init="gpt2",
            init_std=hf.get("initializer_range", 0.02),
        )
        return TransformerConfig(**architecture, **training)
    changed = {k: (getattr(base, k), v) for k, v in architecture.items() if getattr(base, k) != v}
    if changed:
        log.info("Architecture taken from the pretrained config.json: %s", changed)
    return base.replace(**architecture, target_vocab_size=None, n_encoder_layers=None, n_decoder_layers=None)


def to_hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """GPT2LMHeadModel's parameter names (lm_head is tied to wte, so not stored, as save_pretrained does). wte holds
    the true vocabulary: padded rows (pad_vocab_to_multiple_of) are ours alone and are dropped. Grouped-query
    attention is written as the multi-head attention that computes it (full_heads_qkv)."""
    s = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    out = {
        "transformer.wte.weight": s["tgt_embed.weight"][: model.config.vocab_size],
        "transformer.wpe.weight": s["tgt_positions.weight"],
        "transformer.ln_f.weight": s["decoder_norm.weight"],
        "transformer.ln_f.bias": s["decoder_norm.bias"],
    }
    for i in range(model.config.n_layers):
        ours, theirs = f"decoder_blocks.{i}.", f"transformer.h.{i}."
        for our_name, hf_name in _BLOCK_NAMES.items():
            tensor = s[ours + our_name]
            if our_name.startswith("self_attn.qkv."):  # GPT-2 has no grouped-query attention: K/V heads repeated
                tensor = full_heads_qkv(tensor, model.config)
            # Conv1D weights are (in, out): the transpose of nn.Linear's.
            out[theirs + hf_name] = tensor.T if hf_name in _CONV1D_WEIGHTS else tensor
    return {k: v.contiguous() for k, v in out.items()}


def from_hf_state_dict(state: Mapping[str, torch.Tensor], cfg: TransformerConfig) -> dict[str, torch.Tensor]:
    """Our parameter names from GPT-2's; accepts the `transformer.` prefix or none (the original hub files). A
    padded config (pad_vocab_to_multiple_of) gets wte with zero rows appended, as a fresh padded model has."""
    s = {k.removeprefix("transformer."): v for k, v in state.items()}
    out = {
        "tgt_embed.weight": pad_rows(s["wte.weight"], cfg.padded_vocab_size),
        "tgt_positions.weight": s["wpe.weight"],
        "decoder_norm.weight": s["ln_f.weight"],
        "decoder_norm.bias": s["ln_f.bias"],
    }
    for i in range(cfg.n_layers):
        for our_name, hf_name in _BLOCK_NAMES.items():
            tensor = s[f"h.{i}.{hf_name}"]
            out[f"decoder_blocks.{i}.{our_name}"] = tensor.T if hf_name in _CONV1D_WEIGHTS else tensor
    out["lm_head.weight"] = out["tgt_embed.weight"]
    return out


def pad_rows(table: torch.Tensor, rows: int) -> torch.Tensor:
    """`table` with zero rows appended up to `rows` (a padded vocabulary); unchanged when it has them already."""
    if table.shape[0] >= rows:
        return table
    return torch.cat([table, table.new_zeros(rows - table.shape[0], *table.shape[1:])])


_BLOCK_NAMES = {
    "self_attn_norm.weight": "ln_1.weight",
    "self_attn_norm.bias": "ln_1.bias",
    "self_attn.qkv.weight": "attn.c_attn.weight",
    "self_attn.qkv.bias": "attn.c_attn.bias",
    "self_attn.out.weight": "attn.c_proj.weight",
    "self_attn.out.bias": "attn.c_proj.bias",
    "ff_norm.weight": "ln_2.weight",
    "ff_norm.bias": "ln_2.bias",
    "ff.up.weight": "mlp.c_fc.weight",
    "ff.up.bias": "mlp.c_fc.bias",
    "ff.down.weight": "mlp.c_proj.weight",
    "ff.down.bias": "mlp.c_proj.bias",
}
_CONV1D_WEIGHTS = {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"}


def save_hf_gpt2(model: Transformer, directory: str | os.PathLike, tokenizer: Tokenizer | None = None) -> Path:
    """Write a folder that ``transformers.GPT2LMHeadModel.from_pretrained`` loads: config.json, model.safetensors and,
    with a tokenizer, its files (tokenizer.json, tokenizer_config.json). Refuses models GPT-2 cannot express."""
    cfg = model.config
    _check_gpt2(cfg)
    return write_hf_folder(directory, to_hf_config(cfg), to_hf_state_dict(model), tokenizer, cfg)


def load_hf_gpt2(directory: str | os.PathLike, base: TransformerConfig | None = None) -> Transformer:
    """Our Transformer (eval mode) from a GPT-2 folder or, when online, a hub name such as "gpt2".

    The folder's config.json sets the architecture; `base`, when given, supplies dropout and initialisation.
    """
    hf, state = read_hf_folder(directory, what="GPT-2 model")
    cfg = from_hf_config(hf, base)
    model = Transformer(cfg)
    model.load_state_dict(from_hf_state_dict(state, cfg))
    return model.eval()
