"""`python -m lit_transformer export --checkpoint PATH --format hf|onnx|safetensors --out DIR`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from jsonargparse import ArgumentParser

from lit_transformer.inference import LoadedModel, add_quantize_argument, load_model, quantize_loaded

Format = Literal["hf", "onnx", "safetensors"]


def export(loaded: LoadedModel, fmt: Format, out: str | Path) -> Path:
    """Write `loaded` to the folder `out`; returns the main file or folder written."""
    from lit_transformer import interop
    from lit_transformer.quantization import is_quantized

    out = Path(out)
    model, source, target = loaded.model.cpu().eval(), loaded.tokenizer, loaded.target_tokenizer
    if is_quantized(model) and fmt != "safetensors":
        raise ValueError(
            f"an int8 model exports as --format safetensors (int8 weights and their scales, our layout); --format "
            f"{fmt} writes fp32 weights: export without --quantize"
        )
    if fmt == "safetensors":
        return interop.save_safetensors(model, out, source, target)
    if fmt == "hf":
        if model.config.is_encoder_only:
            raise ValueError(
                "--format hf covers GPT-2, Llama and Marian layouts; an encoder_only model exports as onnx or safetensors "
                "(BERT's layout differs: an embedding LayerNorm, token-type embeddings and a transform before its "
                "masked-LM output, see docs/classification.md)"
            )
        if model.config.is_encoder_decoder:
            return interop.save_hf_marian(model, out, source, target)
        if model.config.positions == "rope":  # the Llama family; save_hf_llama names any field Llama cannot express
            return interop.save_hf_llama(model, out, source)
        return interop.save_hf_gpt2(model, out, source)
    path = interop.export_onnx(model, out / "model.onnx")
    source.save(str(out / "tokenizer.json"))
    return path


def export_main(argv: Sequence[str]) -> None:
    """Parse the arguments of `export` and write the export."""
    parser = ArgumentParser(
        prog="python -m lit_transformer export",
        description="Export a checkpoint: hf (GPT2LMHeadModel, LlamaForCausalLM or MarianMTModel folder), onnx "
        "(decoder-only or encoder-only logits graph, dynamic batch and sequence), safetensors (our weights + "
        "config.json + tokenizer.json; with --quantize int8, int8 weights and their scales).",
    )
    parser.add_argument("--checkpoint", type=str, required=True, help="A .ckpt written by `fit`.")
    parser.add_argument("--format", type=Format, required=True, help="hf, onnx or safetensors.")
    parser.add_argument("--out", type=str, required=True, help="Output folder (created if missing).")
    add_quantize_argument(parser)
    args = parser.parse_args(list(argv))
    if args.quantize != "none" and args.format != "safetensors":
        raise SystemExit(f"error: --quantize {args.quantize} exports as --format safetensors only, not {args.format}")
    loaded = quantize_loaded(load_model(args.checkpoint), args.quantize)
    path = export(loaded, args.format, args.out)
    print(f"Wrote {path}")
