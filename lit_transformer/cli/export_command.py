"""`python -m lit_transformer export --checkpoint PATH --format hf|onnx|safetensors|peft --out DIR`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from lit_transformer.errors import ConfigError, check_folder_can_be_made
from lit_transformer.inference import (
    LoadedModel,
    load_model,
    quantize_loaded,
)
from lit_transformer.transforms.int8 import Quantize

Format = Literal["hf", "onnx", "safetensors", "peft"]


def export(loaded: LoadedModel, fmt: Format, out: str | Path, onnx_quantize: Quantize = "none") -> Path:
    """Write `loaded` to the folder `out`; returns the main file or folder written. onnx_quantize="int8" quantizes
    the ONNX graphs with onnxruntime's own tools (the PyTorch int8 model does not export to ONNX)."""
    from lit_transformer.interop.hf_gpt2 import save_hf_gpt2
    from lit_transformer.interop.hf_llama import save_hf_llama
    from lit_transformer.interop.hf_marian import save_hf_marian
    from lit_transformer.interop.native import save_safetensors
    from lit_transformer.interop.onnx import export_onnx_folder
    from lit_transformer.transforms.int8 import is_quantized

    if fmt == "peft":
        raise ValueError("peft adapters are a LoRA checkpoint's, not a loaded model's: export_peft(checkpoint, out)")
    out = Path(out)
    model, source, target = loaded.model.cpu().eval(), loaded.tokenizer, loaded.target_tokenizer
    if is_quantized(model) and fmt != "safetensors":
        raise ConfigError(
            f"an int8 PyTorch model exports as --format safetensors (int8 weights and their scales, our layout); "
            f"--format {fmt} takes the fp32 model (for int8 ONNX graphs: export(..., onnx_quantize='int8'), or "
            "`export --format onnx --quantize int8`)"
        )
    if fmt == "safetensors":
        record = {"task": loaded.task.spec()}  # as a checkpoint records the task: its spec, then what it learned
        loaded.task.on_save_checkpoint(record)
        return save_safetensors(model, out, source, target, task=record)
    if fmt == "hf":
        if model.config.is_encoder_only:
            raise ConfigError(
                "--format hf covers GPT-2, Llama and Marian layouts; an encoder_only model exports as onnx or safetensors "
                "(BERT's layout differs: an embedding LayerNorm, token-type embeddings and a transform before its "
                "masked-LM output, see docs/classification.md)"
            )
        if model.config.is_encoder_decoder:
            return save_hf_marian(model, out, source, target)
        if model.config.positions == "rope":  # the Llama family; save_hf_llama names any field Llama cannot express
            return save_hf_llama(model, out, source)
        return save_hf_gpt2(model, out, source)
    if model.config.source != "tokens":  # its encoder reads images or feature vectors: no graph is traced for them
        raise ConfigError(
            f"--format onnx exports models of text; this one's encoder reads {model.config.source} (source="
            f"{model.config.source!r}), which no ONNX graph here takes yet: export it as --format safetensors"
        )
    return export_onnx_folder(model, out, source, target, quantize=onnx_quantize)


def export_peft(checkpoint: str, out: str, base: str | None = None) -> Path:
    """A LoRA checkpoint's adapters as peft's adapter folder (interop/peft_adapters.py); the base is not read."""
    import importlib.util

    from lit_transformer.checkpoints.files import load_checkpoint
    from lit_transformer.errors import UserError

    if importlib.util.find_spec("peft") is None:
        raise UserError("--format peft writes with peft, an optional dependency: pip install -e '.[lora]'")
    from lit_transformer.interop.peft_adapters import save_peft_adapter

    return save_peft_adapter(load_checkpoint(checkpoint), out, base, what=str(checkpoint))


def run_export(args) -> None:
    """`export` with its parsed options (model_commands.export_main): write the export."""
    if Path(args.out).exists() and not Path(args.out).is_dir():  # FileExistsError at the first folder it made
        raise ConfigError(f"--out {args.out} is a file: export writes a folder; give a new or existing one")
    if args.quantize != "none" and args.format in ("hf", "peft"):
        raise ConfigError(f"--quantize {args.quantize} exports as --format safetensors or onnx, not {args.format}")
    check_folder_can_be_made(args.out, "--out")  # before the checkpoint is loaded; made once the export is sure
    if args.format == "peft":
        print(f"Wrote {export_peft(args.checkpoint, args.out, args.base)}")
        return
    loaded = load_model(args.checkpoint, base=args.base)
    if args.format == "onnx":  # the fp32 graphs are traced, then onnxruntime quantizes them
        path = export(loaded, args.format, args.out, onnx_quantize=args.quantize)
    else:
        path = export(quantize_loaded(loaded, args.quantize), args.format, args.out)
    print(f"Wrote {path}")
