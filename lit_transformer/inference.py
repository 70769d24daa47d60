"""Load a trained checkpoint for inference and the `generate` / `translate` commands.

A checkpoint holds everything needed: the architecture (hyper_parameters.config) and the tokenizer(s) as JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from jsonargparse import ArgumentParser
from tokenizers import Tokenizer

from lit_transformer.config import TransformerConfig
from lit_transformer.model import Transformer


@dataclass
class LoadedModel:
    model: Transformer
    tokenizer: Tokenizer
    target_tokenizer: Tokenizer

    @property
    def config(self) -> TransformerConfig:
        return self.model.config

    def decode(self, ids: torch.Tensor) -> list[str]:
        """Generated target ids to text, cut at the first EOS."""
        eos = self.config.eos_token_id
        rows = [row[: row.index(eos)] if eos is not None and eos in row else row for row in ids.tolist()]
        return self.target_tokenizer.decode_batch(rows, skip_special_tokens=True)


def config_from_checkpoint(checkpoint: dict) -> TransformerConfig:
    """The architecture a Lightning checkpoint was trained with."""
    try:
        config = checkpoint["hyper_parameters"]["config"]
    except KeyError:
        raise ValueError(
            "The checkpoint has no hyper_parameters.config: it was not written by lit_transformer's LitTransformer"
        ) from None
    return config if isinstance(config, TransformerConfig) else TransformerConfig(**dict(config))


def load_model(path: str | Path, device: str | torch.device = "cpu") -> LoadedModel:
    """A Transformer in eval mode with its tokenizer(s), from a checkpoint loaded without running code from it."""
    from lit_transformer.checkpointing import CheckpointError, load_checkpoint, load_model_state

    checkpoint = load_checkpoint(path, map_location="cpu")
    config = config_from_checkpoint(checkpoint)
    model = Transformer(config)
    load_model_state(model, checkpoint, current=config, prefix="model.")
    if "tokenizer" not in checkpoint:
        raise CheckpointError(f"{path} holds no tokenizer: it was saved without a DataModule; retrain with one")
    tokenizer = Tokenizer.from_str(checkpoint["tokenizer"])
    target = checkpoint.get("target_tokenizer")
    target_tokenizer = Tokenizer.from_str(target) if target else tokenizer
    return LoadedModel(model.to(device).eval(), tokenizer, target_tokenizer)


def _device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {name} asks for a GPU, but none is available here; use --device cpu")
    return name


def _common_parser(prog: str, description: str) -> ArgumentParser:
    parser = ArgumentParser(prog=f"python -m lit_transformer {prog}", description=description)
    parser.add_argument("--checkpoint", type=str, required=True, help="A .ckpt written by `fit`.")
    parser.add_argument("--max_new_tokens", type=int, default=200, help="Tokens to generate at most.")
    parser.add_argument("--device", type=str, default="auto", help="cpu, cuda, or auto.")
    parser.add_argument("--seed", type=int, default=1337, help="Seed of the sampling generator.")
    return parser


def generate_main(argv: Sequence[str]) -> None:
    """`generate`: continue a prompt with a decoder-only model."""
    parser = _common_parser("generate", "Continue a prompt with a trained decoder-only model.")
    parser.add_argument("--prompt", type=str, default="\n", help="Text to continue.")
    parser.add_argument("--num_samples", type=int, default=1, help="Independent samples to print.")
    parser.add_argument("--temperature", type=float, default=0.8, help="0 is greedy; higher is more random.")
    parser.add_argument("--top_k", type=int | None, default=50, help="Sample among the k most likely tokens.")
    parser.add_argument("--top_p", type=float | None, default=None, help="Nucleus sampling threshold.")
    args = parser.parse_args(list(argv))
    loaded = load_model(args.checkpoint, _device(args.device))
    if loaded.config.is_encoder_decoder:
        raise SystemExit("This checkpoint is an encoder-decoder model: use `python -m lit_transformer translate`")
    ids = loaded.tokenizer.encode(args.prompt).ids or [loaded.config.bos_token_id]
    device = next(loaded.model.parameters()).device
    prompt = torch.tensor([ids] * args.num_samples, device=device)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    with torch.no_grad():
        out = loaded.model.generate(
            prompt,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            generator=generator,
        )
    for i, text in enumerate(loaded.decode(out)):
        if args.num_samples > 1:
            print(f"--- sample {i}")
        print(args.prompt + text)


def translate_main(argv: Sequence[str]) -> None:
    """`translate`: beam-search translation with an encoder-decoder model."""
    parser = _common_parser("translate", "Translate text with a trained encoder-decoder model (beam search).")
    parser.add_argument("--text", type=str | None, default=None, help="A sentence to translate.")
    parser.add_argument("--input", type=str | None, default=None, help="A file of sentences, one per line.")
    parser.add_argument("--num_beams", type=int, default=4, help="Beam width (1 is greedy).")
    parser.add_argument("--length_penalty", type=float, default=1.0, help="Beam-search length penalty.")
    args = parser.parse_args(list(argv))
    loaded = load_model(args.checkpoint, _device(args.device))
    if not loaded.config.is_encoder_decoder:
        raise SystemExit("This checkpoint is a decoder-only model: use `python -m lit_transformer generate`")
    if (args.text is None) == (args.input is None):
        raise SystemExit("translate needs exactly one of --text SENTENCE or --input FILE")
    texts = [args.text] if args.text is not None else Path(args.input).read_text().splitlines()
    pad = loaded.config.pad_token_id
    # Sources are encoded as in training: the text's tokens, then EOS.
    eos = [] if loaded.config.eos_token_id is None else [loaded.config.eos_token_id]
    encoded = [loaded.tokenizer.encode(t).ids + eos for t in texts]
    width = max(len(e) for e in encoded)
    device = next(loaded.model.parameters()).device
    src = torch.tensor([e + [pad] * (width - len(e)) for e in encoded], device=device)
    with torch.no_grad():
        out = loaded.model.generate(
            src, max_new_tokens=args.max_new_tokens, num_beams=args.num_beams, length_penalty=args.length_penalty
        )
    for text in loaded.decode(out):
        print(text)
