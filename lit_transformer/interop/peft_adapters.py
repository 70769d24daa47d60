"""A LoRA checkpoint's adapters in peft's own format: `export --format peft` writes peft's adapter folder
(adapter_config.json and adapter_model.safetensors), which `PeftModel.from_pretrained(base, folder)` applies to the
Hugging Face model the run started from (`--model.init_from`, a GPT-2 or Llama folder or hub name), with the adapted
model's logits.

Only the adapters are written, renamed from our layers to the Hugging Face model's: GPT-2's fused Conv1D layers are
ours one for one (c_attn is our qkv, c_proj our out, c_fc and mlp.c_proj our up and down; `fan_in_fan_out`, as peft
needs for Conv1D); Llama splits what we fuse, so an adapter of our qkv becomes three of q_proj, k_proj and v_proj that
share its A and each take their rows of its B (exactly the same update), and a gated `up` becomes gate_proj and
up_proj the same way. Nothing of the base is read (the checkpoint's config says its shape), except a
`base` given where it is now, whose fingerprint is checked.

Refused, in one line that points to the merged export (`--format hf`): a base with no Hugging Face form (a .ckpt of
ours), an encoder-decoder (Marian) or encoder-only model, and a run that also trained other weights in full
(lora.trainable, a new head), which an adapter folder would silently leave out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

import torch

from lit_transformer.config import TransformerConfig
from lit_transformer.errors import UserError

MERGED = "export the merged model instead: --format hf (or safetensors)"
# Our layer (in a block) -> the Hugging Face modules it becomes, each with its share of the adapter's output rows.
GPT2_LAYERS = {"self_attn.qkv": ["attn.c_attn"], "self_attn.out": ["attn.c_proj"], "ff.up": ["mlp.c_fc"],
               "ff.down": ["mlp.c_proj"]}  # fmt: skip
LLAMA_LAYERS = {"self_attn.qkv": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
                "self_attn.out": ["self_attn.o_proj"], "ff.up": ["mlp.gate_proj", "mlp.up_proj"],
                "ff.down": ["mlp.down_proj"]}  # fmt: skip
BLOCKS = {"gpt2": "transformer.h", "llama": "model.layers"}
ADAPTER_KEY = re.compile(r"model\.decoder_blocks\.(\d+)\.(.+)\.lora_([AB])\.default\.weight")


def family(config: TransformerConfig, base: str, what: str) -> str:
    """ "gpt2" or "llama": the Hugging Face model the adapters' base is, or a refusal naming why there is none."""
    from lit_transformer.interop.hf_gpt2 import gpt2_problems
    from lit_transformer.interop.hf_llama import llama_problems

    if str(base).endswith(".ckpt"):
        raise UserError(
            f"{what} adapts {base}, a checkpoint of ours with no Hugging Face form for peft to load: {MERGED}"
        )
    if config.topology != "decoder_only":
        kind = "an encoder-decoder (Marian)" if config.is_encoder_decoder else "an encoder-only"
        raise UserError(f"{what} adapts {kind} model; --format peft writes GPT-2 and Llama adapters: {MERGED}")
    folder = Path(base) / "config.json"
    model_type = json.loads(folder.read_text()).get("model_type") if folder.is_file() else None
    if model_type in BLOCKS:
        return model_type
    if not llama_problems(config):
        return "llama"
    if not gpt2_problems(config):
        return "gpt2"
    raise UserError(f"{what} adapts {base}, which is neither a GPT-2 nor a Llama model: {MERGED}")


def split_rows(config: TransformerConfig, kind: str, layer: str) -> list[int] | None:
    """How our adapter's output rows divide among the Hugging Face modules of `layer` (None: one module, all rows)."""
    if kind != "llama":
        return None
    if layer == "self_attn.qkv":
        q, kv = config.n_heads * config.head_dim, config.kv_heads * config.head_dim
        return [q, kv, kv]
    if layer == "ff.up":
        return [config.ff_dim, config.ff_dim]  # gate, then up (a gated up's two halves)
    return None


def adapter_tensors(state: Mapping[str, torch.Tensor], config: TransformerConfig, kind: str, what: str):
    """peft's state dict of the adapters (base_model.model.<module>.lora_A/B.weight) and the modules they adapt."""
    layers = GPT2_LAYERS if kind == "gpt2" else LLAMA_LAYERS
    extras = [key.removeprefix("model.") for key in state if not ADAPTER_KEY.fullmatch(key)]
    if extras:
        shown = ", ".join(extras[:3]) + (", ..." if len(extras) > 3 else "")
        raise UserError(
            f"{what} also trained {shown} in full (lora.trainable, or a new head): an adapter folder holds only the "
            f"adapters, so peft would load the base's weights there; {MERGED}"
        )
    tensors: dict[str, torch.Tensor] = {}
    modules: list[str] = []
    for key, tensor in state.items():
        block, layer, factor = ADAPTER_KEY.fullmatch(key).groups()
        if layer not in layers:
            raise UserError(f"{what} adapts {layer}, which the Hugging Face {kind} model has no layer for: {MERGED}")
        names = [f"{BLOCKS[kind]}.{block}.{name}" for name in layers[layer]]
        rows = split_rows(config, kind, layer)
        parts = [tensor] * len(names) if factor == "A" or rows is None else list(tensor.split(rows))
        for name, part in zip(names, parts, strict=True):
            tensors[f"base_model.model.{name}.lora_{factor}.weight"] = part.detach().cpu().clone()  # A: a copy each
            if factor == "A":
                modules.append(name)
    return tensors, sorted(modules)


def target_modules(modules: list[str], kind: str, layers: int) -> list[str]:
    """peft's target_modules: each adapted layer's name in a block (`attn.c_attn`) when every block has it adapted,
    else the modules' full names (peft matches a name by its ending)."""
    prefix = re.compile(rf"{re.escape(BLOCKS[kind])}\.\d+\.")
    endings: dict[str, int] = {}
    for name in modules:
        ending = prefix.sub("", name, count=1)
        endings[ending] = endings.get(ending, 0) + 1
    if all(count == layers for count in endings.values()):
        return sorted(endings)
    return modules


def save_peft_adapter(
    checkpoint: Mapping, out: str | Path, base: str | None = None, what: str = "the checkpoint"
) -> Path:
    """Write the LoRA checkpoint's adapters as peft's adapter folder at `out`; returns the folder. `base`: where the
    base is now (recorded in adapter_config.json's base_model_name_or_path), by default the recorded init_from."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    from lit_transformer.checkpoints.files import follow_umask, saved_config
    from lit_transformer.transforms.options import LoraOptions

    record = checkpoint.get("lora")
    if record is None:
        raise UserError(
            f"{what} holds no LoRA adapters (a full model): --format peft writes a LoRA run's adapters; a full model "
            "exports with --format hf"
        )
    config = saved_config(checkpoint)
    if config is None:
        raise UserError(f"{what} has no hyper_parameters.config: it was not written by `fit`")
    config = config if isinstance(config, TransformerConfig) else TransformerConfig(**dict(config))
    options = LoraOptions.of((checkpoint.get("hyper_parameters") or {}).get("lora")) or LoraOptions()
    if base:  # where the base is now: the adapters' own base, by its fingerprint (as generate and export --base check)
        from lit_transformer.interop.pretrained import checkpoint_weights

        checkpoint_weights(dict(checkpoint), config, what, str(base))
    base = str(base or record.get("base") or "")
    kind = family(config, base, what)
    tensors, modules = adapter_tensors(checkpoint["state_dict"], config, kind, what)
    if not tensors:
        raise UserError(f"{what} holds no adapter weights")
    lora = LoraConfig(
        r=options.rank,
        lora_alpha=options.alpha,
        lora_dropout=options.dropout,
        target_modules=target_modules(modules, kind, config.n_layers),
        fan_in_fan_out=kind == "gpt2",  # GPT-2's Conv1D stores its weight as (in, out)
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base,
        inference_mode=True,
    )
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    lora.save_pretrained(str(out))
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    follow_umask(out / "adapter_model.safetensors")  # safetensors writes it 0600 through a temporary file
    return out
