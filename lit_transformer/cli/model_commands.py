"""generate, translate, export and average: each command's options, parsed before torch is imported.

So `--help` and a mistyped flag answer at once, and a command that only decodes never imports Lightning. Each
`*_main(argv)` parses, then hands the parsed options to the module that does the work (inference.py, export_command.py,
checkpoints/averaging.py).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from typing import Literal

from jsonargparse import SUPPRESS, ArgumentParser
from jsonargparse.typing import PositiveInt

from lit_transformer.cli.arguments import command_parser, parse
from lit_transformer.config import GenerationConfig, field_docs

Format = Literal["hf", "onnx", "safetensors", "peft"]
"""export --format: a Hugging Face folder, ONNX graphs, safetensors with config.json, tokenizer.json and task.json, or
a LoRA run's adapters as peft's adapter folder."""
Weights = Literal["saved", "trained"]
"""average --weights: saved: each checkpoint's state_dict (what test/translate load; with an EMA callback, the EMA
weights); trained: the optimizer's own weights, which an EMA (WeightAveraging) callback moves to current_model_state."""

CHECKPOINT_HELP = (
    "A .ckpt written by `fit`, or a model folder: one `export --format safetensors|hf` wrote, or a Hugging Face "
    "GPT-2, Llama or Marian folder, or its hub name (downloaded, or offline read from the Hugging Face cache)."
)


def decoding_parser(command: str, description: str) -> ArgumentParser:
    """--checkpoint, --device, and every GenerationConfig field as a flag (unset flags keep the task's defaults,
    GenerationConfig.for_task)."""
    description += (
        " Decoding flags left unset (null) keep the defaults of the model's task, GenerationConfig.for_task: a"
        " language model samples at temperature 0.8 among the 50 most likely tokens, a translation model decodes"
        " by the Transformer paper's rules (4 beams, GNMT length penalty 0.6, source length + 50, early stopping)."
    )
    parser = command_parser(command, description)
    parser.add_argument("--checkpoint", type=str, required=True, help=CHECKPOINT_HELP)
    parser.add_argument("--device", type=str, default="auto", help="cpu, cuda (or cuda:N), mps, or auto.")
    add_base_argument(parser)
    add_quantize_argument(parser)
    hints, docs = typing.get_type_hints(GenerationConfig), field_docs(GenerationConfig)
    for field in dataclasses.fields(GenerationConfig):
        hint = hints[field.name]
        if typing.get_origin(hint) is list:  # one value may be given without list syntax: --stop END
            hint = hint | typing.get_args(hint)[0]
        # Unset flags stay out of the namespace (a given null, as --max_source_offset null, replaces the task's value).
        parser.add_argument(f"--{field.name}", type=hint | None, default=SUPPRESS, help=docs[field.name])
    return parser


def add_base_argument(parser: ArgumentParser) -> None:
    """--base PATH, shared by generate, translate and export: where a LoRA checkpoint's base is now."""
    parser.add_argument(
        "--base",
        type=str | None,
        default=None,
        help="A LoRA checkpoint's base (its init_from) where it is now, if it moved from the path the checkpoint "
        "records; its fingerprint is checked as the recorded one's would be.",
    )


def add_quantize_argument(parser: ArgumentParser) -> None:
    """--quantize none|int8, shared by generate, translate and export."""
    parser.add_argument(
        "--quantize",
        type=Literal["none", "int8"],
        default="none",
        help="int8: dynamic int8 Linear layers (lit_transformer.transforms.int8), CPU only; faster decoding on a CPU.",
    )


def generate_main(argv: Sequence[str]) -> None:
    """`generate`: continue prompts with a decoder-only model, printing tokens as they are produced."""
    parser = decoding_parser("generate", "Continue a prompt with a trained decoder-only model.")
    parser.add_argument(
        "--prompt", type=str | None, default=None, help="Text to continue; unset: a sample from a newline."
    )
    parser.add_argument("--prompt_file", type=str | None, default=None, help="A file of prompts, one per line.")
    parser.add_argument("--num_samples", type=PositiveInt, default=1, help="Samples per prompt.")
    args = parse(parser, argv)
    from lit_transformer.inference import run_generate

    run_generate(args)


def translate_main(argv: Sequence[str]) -> None:
    """`translate`: translate sentences with an encoder-decoder model (beam search by default)."""
    parser = decoding_parser("translate", "Translate text with a trained encoder-decoder model.")
    parser.add_argument("--text", type=str | None, default=None, help="A sentence to translate.")
    parser.add_argument("--input", type=str | None, default=None, help="A file of sentences, one per line.")
    parser.add_argument("--batch_size", type=PositiveInt, default=16, help="Sentences translated at once.")
    args = parse(parser, argv)
    from lit_transformer.inference import run_translate

    run_translate(args)


def export_main(argv: Sequence[str]) -> None:
    """`export`: write a checkpoint as a Hugging Face folder, ONNX graphs, safetensors or peft adapters."""
    parser = command_parser(
        "export",
        "Export a checkpoint: hf (GPT2LMHeadModel, LlamaForCausalLM or MarianMTModel folder), onnx "
        "(decoding graphs with past keys and values for decoder-only and encoder-decoder models, the logits graph "
        "for decoder-only and encoder-only ones, onnx.json describing them; with --quantize int8, onnxruntime's int8 "
        "graphs), safetensors (our weights + config.json + tokenizer.json; with --quantize int8, int8 weights and "
        "their scales), peft (a LoRA run's adapters as peft's adapter folder, for PeftModel.from_pretrained on the "
        "Hugging Face GPT-2 or Llama model the run started from).",
    )
    parser.add_argument("--checkpoint", type=str, required=True, help=CHECKPOINT_HELP)
    parser.add_argument("--format", type=Format, required=True, help="hf, onnx, safetensors or peft.")
    parser.add_argument("--out", type=str, required=True, help="Output folder (created if missing).")
    add_base_argument(parser)
    add_quantize_argument(parser)
    args = parse(parser, argv)
    from lit_transformer.cli.export_command import run_export

    run_export(args)


def average_main(argv: Sequence[str]) -> None:
    """`average`: write the mean of several checkpoints' weights as one checkpoint."""
    parser = command_parser(
        "average",
        "Average the weights of checkpoints of one model (the paper averages the last 5). The result "
        "loads wherever a checkpoint does (test, translate, generate, predict, export); it holds no optimizer state.",
    )
    parser.add_argument(
        "--checkpoints",
        type=str,
        nargs="+",
        required=True,
        help="Checkpoint files and/or folders (every *.ckpt inside).",
    )
    parser.add_argument("--last", type=int | None, default=None, help="Average the newest N distinct steps.")
    parser.add_argument(
        "--steps", type=str | None, default=None, help="Average the steps within FIRST:LAST (both included)."
    )
    parser.add_argument(
        "--weights",
        type=Weights,
        default="saved",
        help="saved: each file's state_dict (EMA weights when an EMA callback wrote it); trained: the optimizer's "
        "weights (current_model_state, where an EMA callback put them).",
    )
    parser.add_argument("--output", type=str, required=True, help="The .ckpt to write.")
    args = parse(parser, argv)
    from lit_transformer.checkpoints.averaging import run_average

    run_average(args)
