"""Checkpoints that never tear and never run code: atomic saving, safe loading, and clear errors.

- ``atomic_save`` writes each checkpoint to a temporary file in the same folder, fsyncs it, renames it over the target
  and fsyncs the folder, so a crash at any moment leaves the previous file whole (Lightning's side of it,
  ``AtomicCheckpointIO``, is in checkpoint_io.py: this module imports no Lightning, for the commands that do not train).
- ``load_checkpoint`` (checkpoint_file.py) reads with ``torch.load(weights_only=True)``: a file can hold tensors and plain data, never code.
  Our own plain types (``TransformerConfig``, paths) are allowlisted by name; nothing else is.
- ``check_architecture`` turns a ``load_state_dict`` mismatch into a message that names the parameters and the config
  fields that differ.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

from lit_transformer.checkpoint_file import (  # noqa: F401 - re-exported: the engine's readers import them here
    SAFE_GLOBALS,
    CheckpointError,
    load_checkpoint,
    safe_globals,
)
from lit_transformer.config import TransformerConfig


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` that replaces ``path`` only with a complete, fsynced file (same-folder temp file + rename)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # The temporary name does not end in .ckpt, so neither `ckpt_path=last` nor a glob ever picks up a torn file.
    handle, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            torch.save(obj, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp_name, path)
    except BaseException:
        with _ignore_os_errors():
            os.unlink(temp_name)
        raise
    _fsync_folder(path.parent)


def _fsync_folder(folder: pathlib.Path) -> None:
    # Makes the rename itself durable across a power loss; not possible (nor needed) on every platform.
    with _ignore_os_errors():
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


@contextmanager
def _ignore_os_errors() -> Iterator[None]:
    try:
        yield
    except OSError:
        pass


def non_finite_tensors(state_dict: Mapping[str, Any]) -> list[str]:
    """Names of floating-point tensors holding NaN or infinity."""
    return [
        name
        for name, value in state_dict.items()
        if isinstance(value, torch.Tensor) and value.is_floating_point() and not torch.isfinite(value).all()
    ]


def config_differences(saved: Any, current: Any) -> list[str]:
    """``field: saved -> current`` for each config field that differs (configs as dataclasses or dicts)."""
    saved_fields, current_fields = _as_dict(saved), _as_dict(current)
    return [
        f"{name}: checkpoint {saved_fields.get(name)!r} vs now {current_fields.get(name)!r}"
        for name in sorted(set(saved_fields) | set(current_fields))
        if saved_fields.get(name) != current_fields.get(name)
    ]


def _as_dict(config: Any) -> dict[str, Any]:
    if config is None:
        return {}
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    return dict(config)


def saved_config(checkpoint: Mapping[str, Any], key: str = "config") -> Any:
    """The model config stored in a Lightning checkpoint's ``hyper_parameters`` (or None)."""
    return (checkpoint.get("hyper_parameters") or {}).get(key)


def check_architecture(
    state_dict: Mapping[str, torch.Tensor],
    model: torch.nn.Module,
    saved: Any = None,
    current: Any = None,
    source: str = "checkpoint",
) -> None:
    """Raise ``CheckpointError`` naming mismatched parameters (with shapes) and differing config fields, if any."""
    expected = model.state_dict()
    missing = [name for name in expected if name not in state_dict]
    unexpected = [name for name in state_dict if name not in expected]
    reshaped = [
        f"{name}: {source} {tuple(state_dict[name].shape)} vs model {tuple(expected[name].shape)}"
        for name in expected
        if name in state_dict
        and isinstance(state_dict[name], torch.Tensor)
        and tuple(state_dict[name].shape) != tuple(expected[name].shape)
    ]
    if not (missing or unexpected or reshaped):
        return
    lines = [f"The {source} was saved by a different architecture than the model built now."]
    differences = config_differences(saved, current) if saved is not None and current is not None else []
    if differences:
        lines.append("Config fields that differ:\n    " + "\n    ".join(differences))
    for title, names in (
        ("Shape mismatches", reshaped),
        ("Missing in the " + source, missing),
        ("Unexpected in the " + source, unexpected),
    ):
        if names:
            lines.append(
                f"{title} ({len(names)}):\n    " + "\n    ".join(names[:10]) + ("\n    …" if len(names) > 10 else "")
            )
    lines.append(
        "Build the model with the checkpoint's config (it is stored under hyper_parameters), or start a new run."
    )
    raise CheckpointError("\n".join(lines))


def load_model_state(
    model: torch.nn.Module, checkpoint: Mapping[str, Any], current: Any = None, prefix: str = ""
) -> None:
    """Load ``checkpoint["state_dict"]`` into ``model``; a mismatch raises ``CheckpointError`` that explains it.

    ``prefix`` strips a key prefix (``"model."`` when ``model`` is the bare Transformer inside LitTransformer).
    """
    state_dict = checkpoint.get("state_dict", checkpoint)
    if prefix:
        state_dict = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
    check_architecture(state_dict, model, saved_config(checkpoint), current)
    model.load_state_dict(state_dict)


def check_tokenizer_vocabulary(tokenizer_vocab_size: int, config: TransformerConfig, what: str = "tokenizer") -> None:
    """Refuse a tokenizer whose ids do not fit the model's vocabulary: its true size, config.vocab_size, even when
    the tables are padded (pad_vocab_to_multiple_of) beyond it, since logits never cover the padded ids."""
    if tokenizer_vocab_size > config.vocab_size:
        raise CheckpointError(
            f"The {what} has {tokenizer_vocab_size} tokens but the model's vocabulary holds {config.vocab_size} "
            f"(config.vocab_size): token ids {config.vocab_size}..{tokenizer_vocab_size - 1} have no embedding. "
            "Use the tokenizer saved with the checkpoint (checkpoint['tokenizer']) or build the model from this tokenizer."
        )


def __getattr__(name: str):
    # Run configs saved before checkpoint_io.py name the plugin lit_transformer.checkpointing.AtomicCheckpointIO.
    if name == "AtomicCheckpointIO":
        from lit_transformer.checkpoint_io import AtomicCheckpointIO

        return AtomicCheckpointIO
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
