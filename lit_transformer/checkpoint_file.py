"""Reading a checkpoint file without ever executing code from it: `load_checkpoint` and its clear errors.

Below the DataModules (a tokenizer may come from a .ckpt) and the engine (resuming, averaging, loading a model), so
both read checkpoints one way. `torch.load(weights_only=True)` accepts tensors and plain data only; our own plain types
(`TransformerConfig`, paths) are allowlisted by name; nothing else is.
"""

from __future__ import annotations

import os
import pathlib
import pickle
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from lit_transformer.config import TransformerConfig

# Plain data types that Lightning checkpoints of this package may hold in ``hyper_parameters``: each is rebuilt from
# its fields or its string parts and runs no code of the file's choosing. Add a type here only if that holds for it.
SAFE_GLOBALS: list[type] = [
    TransformerConfig,
    pathlib.Path,
    pathlib.PosixPath,
    pathlib.PurePosixPath,
    pathlib.WindowsPath,
    pathlib.PureWindowsPath,
]


def _allow_safe_globals() -> None:
    """Registered process-wide, so Lightning's own weights_only loads (LightningCLI reading hyper_parameters from
    --ckpt_path, load_from_checkpoint) accept our configs too. The allowlist stays exactly SAFE_GLOBALS."""
    allowed = torch.serialization.get_safe_globals()
    torch.serialization.add_safe_globals([t for t in SAFE_GLOBALS if t not in allowed])


_allow_safe_globals()


class CheckpointError(ValueError):
    """A checkpoint is missing, torn, hostile, or belongs to another architecture; the message says which and what to do."""


@contextmanager
def safe_globals() -> Iterator[None]:
    """Allow our own plain types (``SAFE_GLOBALS``) during a ``weights_only`` load, and nothing more.

    Not torch's ``safe_globals`` context: on exit it removes the types it was given even when they were registered
    before, which would undo the process-wide registration above and break Lightning's later loads.
    """
    _allow_safe_globals()
    yield


def load_checkpoint(path: str | os.PathLike, map_location: Any = "cpu") -> dict[str, Any]:
    """Load a checkpoint without ever executing code from it; raise ``CheckpointError`` with a clear message."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise CheckpointError(_missing_message(path))
    try:
        with safe_globals():
            checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, KeyError, ValueError, OSError, AttributeError) as error:
        offenders = _disallowed_globals(path, error)
        if offenders:
            raise CheckpointError(_refused_message(path, offenders)) from error
        detail = str(error).strip().splitlines()[0] if str(error).strip() else "(no detail)"
        raise CheckpointError(
            f"Checkpoint {path} ({path.stat().st_size:,} bytes) is truncated or corrupt and cannot be read: "
            f"{type(error).__name__}: {detail}\n"
            "It was probably cut short by a crash, a full disk or an incomplete copy. Checkpoints written by this "
            "package are renamed into place only once complete, so an older checkpoint in the same folder should be "
            f"whole: {_nearby_checkpoints(path)}"
        ) from error
    if not isinstance(checkpoint, dict):
        raise CheckpointError(f"Checkpoint {path} holds a {type(checkpoint).__name__}, not a checkpoint dictionary.")
    return checkpoint


def _nearby_checkpoints(path: pathlib.Path) -> str:
    folder = path.parent if path.parent.is_dir() else None
    found = sorted(p.name for p in folder.glob("*.ckpt") if p != path) if folder else []
    if not found:
        return f"no other .ckpt files in {path.parent}"
    return f".ckpt files in {folder}: " + ", ".join(found[:20]) + (" …" if len(found) > 20 else "")


def _missing_message(path: pathlib.Path) -> str:
    kind = "is a folder, not a checkpoint file" if path.is_dir() else "does not exist"
    where = path if path.is_dir() else path.parent
    listing = sorted(p.name for p in where.glob("*.ckpt")) if where.is_dir() else []
    hint = (
        f"Checkpoints found in {where}: {', '.join(listing[:20])}"
        if listing
        else f"No .ckpt files in {where}" + ("" if where.is_dir() else " (the folder does not exist either)")
    )
    return f"Checkpoint {path} {kind} (looked for {path.resolve()}). {hint}."


def _disallowed_globals(path: pathlib.Path, error: Exception) -> list[str]:
    """The globals (importable names) a file asked for that the weights_only unpickler refused; [] if none."""
    if not isinstance(error, pickle.UnpicklingError):
        return []
    allowed = {_qualname(t) for t in SAFE_GLOBALS}
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # not a zip checkpoint: read the names from torch's message
        names = re.findall(r"GLOBAL ([\w.]+)", str(error))
    return [name for name in names if name not in allowed]


def _refused_message(path: pathlib.Path, offenders: list[str]) -> str:
    return (
        f"Refused to load {path}: it asks the unpickler to import or call {', '.join(offenders)}, which is not an "
        "allowed type. Checkpoints are read with torch.load(weights_only=True), which accepts tensors and plain data "
        "only, so that a checkpoint can never run code on this machine; this refusal is that protection working. "
        "A file from an untrusted source may be an attack. If you wrote this file yourself and trust it, convert it "
        "once in a separate, trusted step (torch.load(weights_only=False) and save its state_dict again)."
    )


def _qualname(t: type) -> str:
    return f"{t.__module__}.{t.__qualname__}"
