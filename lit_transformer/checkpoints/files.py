"""Checkpoint files without Lightning: `load_checkpoint` never executes code from a file, `atomic_save` never leaves
a torn one, and the architecture checks turn a mismatch into a message naming the fields.

Below the DataModules (a tokenizer may come from a .ckpt) and the engine (resuming, averaging, loading a model), so
both read checkpoints one way. `torch.load(weights_only=True)` accepts tensors and plain data only; our own plain types
(`TransformerConfig`, paths) are allowlisted by name; nothing else is.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import pickle
import re
import secrets
import socket
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

from lit_transformer.config import GenerationConfig, TransformerConfig
from lit_transformer.errors import BadFileError, MissingFileError, WriteError

# Plain data types that Lightning checkpoints of this package may hold in ``hyper_parameters``: each is rebuilt from
# its fields or its string parts and runs no code of the file's choosing. Add a type here only if that holds for it.
SAFE_GLOBALS: list[type] = [
    TransformerConfig,
    GenerationConfig,  # the decoding settings a run records (model.generation)
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


class CheckpointError(BadFileError):
    """A checkpoint is torn, hostile, not a checkpoint, or belongs to another task or architecture; the message says
    which and what to do. (A missing one is a MissingCheckpointError, a FileNotFoundError too.)"""


class MissingCheckpointError(MissingFileError, CheckpointError):
    """A checkpoint path that does not exist or is a folder: the message lists the checkpoints there are."""


@contextmanager
def safe_globals() -> Iterator[None]:
    """Allow our own plain types (``SAFE_GLOBALS``) during a ``weights_only`` load, and nothing more.

    Not torch's ``safe_globals`` context: on exit it removes the types it was given even when they were registered
    before, which would undo the process-wide registration above and break Lightning's later loads.
    """
    _allow_safe_globals()
    yield


def load_checkpoint(path: str | os.PathLike, map_location: Any = "cpu", *, mmap: bool = False) -> dict[str, Any]:
    """Load a checkpoint without ever executing code from it; raise ``CheckpointError`` with a clear message.

    mmap: the tensors stay in the file, mapped, and are read only when touched: for what needs the hyperparameters or
    the tokenizer alone (a checkpoint of the legacy, non-zip format is read whole all the same)."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise MissingCheckpointError(_missing_message(path))
    head = _refuse_other_kinds(path)
    mmap = mmap and head.startswith(CHECKPOINT_MAGIC[0])
    try:
        with safe_globals():
            checkpoint = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except (pickle.UnpicklingError, RuntimeError, EOFError, KeyError, ValueError, OSError, AttributeError) as error:
        offenders = _disallowed_globals(path, error)
        if offenders:
            raise CheckpointError(_refused_message(path, offenders)) from error
        raise CheckpointError(
            f"Checkpoint {path} ({path.stat().st_size:,} bytes) is truncated, corrupt or not a checkpoint, and cannot "
            f"be read: {_load_error_detail(error)}\n"
            "It was probably cut short by a crash, a full disk or an incomplete copy. Checkpoints written by this "
            "package are renamed into place only once complete, so an older checkpoint in the same folder should be "
            f"whole: {_nearby_checkpoints(path)}"
        ) from error
    if not isinstance(checkpoint, dict):
        raise CheckpointError(f"Checkpoint {path} holds a {type(checkpoint).__name__}, not a checkpoint dictionary.")
    return checkpoint


# What torch.save writes starts with one of these: a zip archive (every torch since 1.6), or a bare pickle (older).
CHECKPOINT_MAGIC = (b"PK\x03\x04", b"\x80")


def _refuse_other_kinds(path: pathlib.Path) -> bytes:
    """A file that does not even start as torch.save's output (text, JSON, an image, empty) is named as what it
    is, not as a torn checkpoint. Returns the file's first bytes."""
    with open(path, "rb") as handle:
        head = handle.read(64)
    if not head or any(head.startswith(magic) for magic in CHECKPOINT_MAGIC):
        return head  # a checkpoint, or one cut short before its first byte: load_checkpoint says which
    try:
        first = head.decode("utf-8").strip().split("\n")[0][:40]
    except UnicodeDecodeError:  # cut inside a character, or not text at all
        first = None
    if first is not None and first.isprintable():
        what = f"text (it starts {first!r})"
    else:
        what = f"other bytes (it starts {head[:8]!r})"
    raise CheckpointError(
        f"{path} is {what}, not a checkpoint: give a .ckpt file that `fit` wrote (runs/<name>/checkpoints/last.ckpt; "
        f"{_nearby_checkpoints(path)})"
    )


def _load_error_detail(error: Exception) -> str:
    """The line of torch.load's error that says what is wrong: for weights_only loads, the unpickler's own line
    after torch's paragraph about the weights_only default (which is not the problem here)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    marker = next((i for i, line in enumerate(lines) if "WeightsUnpickler error" in line), None)
    if marker is not None:
        after = lines[marker].split("WeightsUnpickler error:", 1)[1].strip()
        detail = after or (lines[marker + 1] if marker + 1 < len(lines) else "")
    else:
        detail = lines[0] if lines else ""
    return f"{type(error).__name__}: {detail or '(no detail)'}"


def _listed_checkpoints(folder: pathlib.Path, but: pathlib.Path | None = None) -> str:
    """The .ckpt files of `folder` in the order of their numbers (step=2 before step=10), at most 20: the first and
    the last 10 of more."""
    import re

    def natural(name: str) -> list:
        return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]

    names = sorted((p.name for p in folder.glob("*.ckpt") if p != but), key=natural)
    if len(names) > 20:
        names = [*names[:10], f"… {len(names) - 20} more …", *names[-10:]]
    return ", ".join(names)


def _nearby_checkpoints(path: pathlib.Path) -> str:
    folder = path.parent if path.parent.is_dir() else None
    found = _listed_checkpoints(folder, but=path) if folder else ""
    if not found:
        return f"no other .ckpt files in {path.parent}"
    return f".ckpt files in {folder}: {found}"


def sharded_checkpoint_message(path: pathlib.Path) -> str | None:
    """What a folder that is a sharded checkpoint is, and the command that makes one file of it; None for any other
    path. DeepSpeed and FSDP with state_dict_type "sharded" save `last.ckpt` as a folder (one file a rank):
    generate, export and average read one file, and refused it as a folder that is no model."""
    if not path.is_dir():
        return None
    if (path / "latest").is_file() or (path / "checkpoint").is_dir():  # DeepSpeed's layout
        return (
            f"{path} is a DeepSpeed checkpoint, a folder of ZeRO shards: make one file of it first, "
            'python -c "from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict '
            f"as c; c('{path}', '{path.with_suffix('')}.consolidated.ckpt')\", then give that file"
        )
    if any(path.glob("*.distcp")) or (path / "meta.pt").is_file():  # torch.distributed.checkpoint's (FSDP sharded)
        return (
            f"{path} is a sharded checkpoint (FSDP with state_dict_type sharded), a folder of shards: make one file of "
            f"it first, python -m lightning.pytorch.utilities.consolidate_checkpoint {path} --output_file "
            f"{path.with_suffix('')}.consolidated.ckpt, then give that file"
        )
    return None


def _missing_message(path: pathlib.Path) -> str:
    sharded = sharded_checkpoint_message(path)
    if sharded:
        return sharded
    kind = "is a folder, not a checkpoint file" if path.is_dir() else "does not exist"
    where = path if path.is_dir() else path.parent
    run = path / "checkpoints"
    if path.is_dir() and run.is_dir() and any(run.glob("*.ckpt")):  # a run folder: its checkpoints are a level down
        example = run / "last.ckpt" if (run / "last.ckpt").is_file() else next(iter(sorted(run.glob("*.ckpt"))))
        return (
            f"Checkpoint {path} is a run folder, not a checkpoint file: its checkpoints are in {run}: "
            f"{_listed_checkpoints(run)}. Give one, e.g. {example}."
        )
    listing = _listed_checkpoints(where) if where.is_dir() else ""
    hint = (
        f"Checkpoints found in {where}: {listing}"
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


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` that replaces ``path`` only with a complete, fsynced file (same-folder temp file + rename).
    The file's mode follows the umask, as every other file a run writes. A write that fails (a full disk, a
    file-size limit) raises ``WriteError`` naming the path and the checkpoint that is still whole."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # The temporary name does not end in .ckpt, so neither `ckpt_path=last` nor a glob ever picks up a torn file.
    _remove_stale_temporaries(path.parent)
    handle, temp_name = _create_temporary(path)
    try:
        with os.fdopen(handle, "wb") as file:
            torch.save(obj, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp_name, path)
    except BaseException as error:
        with _ignore_os_errors():
            os.unlink(temp_name)
        if isinstance(error, OSError) or _is_write_failure(error):
            raise WriteError(_write_failure_message(path, error)) from error
        raise
    _fsync_folder(path.parent)


def _create_temporary(path: pathlib.Path) -> tuple[int, str]:
    """A new file beside `path` (O_EXCL, a random name), created with mode 0o666 so that the umask decides, as for
    any file a program opens (tempfile.mkstemp would make it 0600). Its name says which host and process write it
    (`.last.ckpt.HOST.PID.RANDOM.tmp`), so that a later save can tell the file of a writer that was killed."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        name = str(path.parent / f".{path.name}.{_HOST}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(name, flags, 0o666), name
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


# This machine as a temporary file's name holds it: letters, digits and dashes (never a dot, which ends it).
_HOST = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:32] or "host"
_TEMPORARY = re.compile(r"\.(?P<target>.+)\.(?P<host>[A-Za-z0-9-]+)\.(?P<pid>\d+)\.[0-9a-f]{8}\.tmp")
_TEMPORARY_WITHOUT_WRITER = re.compile(r"\.(?P<target>.+)\.[0-9a-f]{8}\.tmp")  # as the versions before named them
# A temporary file whose writer cannot be checked (another machine's, over a shared folder, or one named without its
# writer) is stale after this long without a write: a save writes without pause until its rename.
STALE_AFTER_S = 24 * 3600
# And that of a writer of this machine that is gone, after this long: a write in progress under another process
# namespace (a container of the same name) still touches its file within it.
GONE_AFTER_S = 60


def _remove_stale_temporaries(folder: pathlib.Path) -> None:
    """Remove the temporary files of writers that were killed mid-save (kill -9, a lost node, the OOM killer): each
    is a checkpoint's size, and a job that crashes again and again would fill the disk. Only files named exactly as
    `_create_temporary` names them, and never one whose writer may still be writing: another rank's, another run's
    or another save's of this process. Whatever fails here (a file another process removed first) is left alone."""
    now = time.time()
    with _ignore_os_errors():
        entries = list(os.scandir(folder))
        for entry in entries:
            if not (entry.name.startswith(".") and entry.name.endswith(".tmp")) or not entry.is_file():
                continue
            with _ignore_os_errors():
                idle = now - entry.stat().st_mtime
                named = _TEMPORARY.fullmatch(entry.name)
                if named and named["host"] == _HOST and os.name == "posix":
                    stale = idle >= GONE_AFTER_S and not _running(int(named["pid"]))
                else:
                    stale = bool(named or _TEMPORARY_WITHOUT_WRITER.fullmatch(entry.name)) and idle >= STALE_AFTER_S
                if stale:
                    os.unlink(entry.path)


def _running(pid: int) -> bool:
    """Whether process `pid` exists on this machine (signal 0 checks without signalling; POSIX only)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: another user's process, running
        return True
    return True


def _is_write_failure(error: BaseException) -> bool:
    """torch.save wraps the writer's OSError in a RuntimeError ("... file write failed ...")."""
    return (
        isinstance(error, RuntimeError)
        and isinstance(error.__cause__ or error.__context__, OSError)
        or (isinstance(error, RuntimeError) and "write failed" in str(error))
    )


def _write_failure_message(path: pathlib.Path, error: BaseException) -> str:
    cause = error if isinstance(error, OSError) else (error.__cause__ or error.__context__ or error)
    reason = getattr(cause, "strerror", None) or str(cause).splitlines()[0]
    if path.is_file():
        kept = f"{path} is the previous one, still whole"
    else:
        others = sorted(p.name for p in path.parent.glob("*.ckpt")) if path.parent.is_dir() else []
        kept = (
            f"the checkpoints still whole in {path.parent}: {', '.join(others)}"
            if others
            else "none was written before"
        )
    return f"could not write {path}: {reason}; {kept}. Free disk space (or raise the file-size limit) and run again"


def follow_umask(*paths: str | os.PathLike) -> None:
    """Give files that a library created 0600 (safetensors writes through a temporary file) the mode the umask
    gives any new file, as everything else the program writes has."""
    mode = 0o666 & ~current_umask()
    for path in paths:
        with _ignore_os_errors():
            os.chmod(path, mode)


def current_umask() -> int:
    """The process's umask, read without changing it where Linux says it (/proc), else set and restored at once."""
    try:
        for line in pathlib.Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


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
        lines.append("Config fields that differ: " + _some(differences, 6))
    found = [(f"{len(names)} shape mismatches", names) for names in [reshaped] if names]
    found += [(f"{len(names)} missing in the {source}", names) for names in [missing] if names]
    found += [(f"{len(names)} unexpected in the {source}", names) for names in [unexpected] if names]
    if found:
        lines.append("Parameters: " + "; ".join(f"{title} ({_some(names, 3)})" for title, names in found))
    raise CheckpointError(
        "\n".join(lines),
        hint="Build the model with the checkpoint's config (it is stored under hyper_parameters), or start a new run.",
    )


def _some(items: list[str], n: int) -> str:
    """The first n items on one line, and how many more there are."""
    more = f", and {len(items) - n} more" if len(items) > n else ""
    return ", ".join(items[:n]) + more


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
