"""Our own portable format: a folder with model.safetensors (our parameter names), config.json (TransformerConfig)
and tokenizer.json (plus target_tokenizer.json for a separate target vocabulary). No pickle anywhere. An int8 model
(lit_transformer.transforms.int8) is written as int8 weights with per-channel scales and loads back int8."""

from __future__ import annotations

import json
import os
from pathlib import Path

from safetensors.torch import load_file, load_model, save_file, save_model
from tokenizers import Tokenizer

from lit_transformer.checkpoints.files import follow_umask
from lit_transformer.config import TransformerConfig
from lit_transformer.errors import BadFileError
from lit_transformer.model import Transformer

FORMAT = "lit_transformer"


def save_safetensors(
    model: Transformer,
    directory: str | os.PathLike,
    tokenizer: Tokenizer | None = None,
    target_tokenizer: Tokenizer | None = None,
    task: dict | None = None,
) -> Path:
    """Write the folder; tied matrices are stored once (safetensors refuses aliased tensors). `task`: the training
    task's record as a checkpoint holds it ({"task": its spec, and what it learned from the data, e.g. label_names}),
    written as task.json so that a folder is served, generated from or predicted with as its checkpoint is."""
    from lit_transformer.transforms.int8 import is_quantized, quantized_state

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = {"format": FORMAT, **model.config.to_dict()}
    metadata = {"format": "pt", "library": FORMAT}
    if is_quantized(model):  # int8 weights with per-channel scales, as plain tensors (see transforms/int8.py)
        config["quantization"] = dict(model.quantization)
        save_file(quantized_state(model), os.fspath(directory / "model.safetensors"), metadata=metadata)
    else:
        save_model(model, os.fspath(directory / "model.safetensors"), metadata=metadata)
    follow_umask(directory / "model.safetensors")
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save(os.fspath(directory / "tokenizer.json"))
    if target_tokenizer is not None and target_tokenizer is not tokenizer:
        target_tokenizer.save(os.fspath(directory / "target_tokenizer.json"))
    if task is not None:
        (directory / "task.json").write_text(json.dumps(task, indent=2) + "\n")
    return directory


def load_safetensors(directory: str | os.PathLike) -> Transformer:
    """The Transformer (eval mode) saved by save_safetensors; tokenizers are plain files beside it."""
    directory = Path(directory)
    config = json.loads((directory / "config.json").read_text())
    if config.pop("format", None) != FORMAT:
        raise BadFileError(f"{directory}/config.json was not written by lit_transformer's safetensors export")
    quantization = config.pop("quantization", None)
    model = Transformer(TransformerConfig(**config))
    if quantization is not None:  # an int8 export: the model comes back int8 (CPU)
        from lit_transformer.transforms.int8 import load_quantized_state

        tensors = load_file(os.fspath(directory / "model.safetensors"))
        return load_quantized_state(model, tensors, lm_head=quantization["lm_head"])
    load_model(model, os.fspath(directory / "model.safetensors"))
    return model.eval()
