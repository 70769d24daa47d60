"""Where text comes from: local files (txt, jsonl/json, csv/tsv, parquet), folders, globs, or Hugging Face hub names.

Everything arrives as a `datasets.DatasetDict`. Undecodable bytes are replaced and counted in a warning that names
the file; a hub name while offline fails within seconds and says how to use local files instead.
"""

from __future__ import annotations

import glob
import json
import os
import socket
import threading
import warnings
from pathlib import Path

import datasets

from .cache import atomic_write, hash_file

TEXT_SUFFIXES = (".txt", ".text", ".md")
BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".tsv": "csv", ".parquet": "parquet"}
SPLIT_ALIASES = {
    "train": "train",
    "valid": "validation",
    "validation": "validation",
    "val": "validation",
    "dev": "validation",
    "test": "test",
}


class OfflineError(ConnectionError):
    """The hub cannot be reached and the requested name is not a local path."""


def _hub_reachable(timeout: float = 3.0) -> bool:
    """A quick TCP probe of the hub in a thread, so a hanging resolver cannot stall us past `timeout`."""
    result: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection(("huggingface.co", 443), timeout=timeout):
                result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(result and result[0])


def _offline_flag() -> bool:
    return any(
        os.environ.get(v, "").lower() in ("1", "true", "yes", "on") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def ensure_online(what: str, hint: str) -> None:
    """Fail at once, with a useful message, when `what` needs the hub and the machine is offline."""
    if _offline_flag() or not _hub_reachable():
        raise OfflineError(
            f"Cannot load {what} from the Hugging Face hub: this machine is offline "
            f"(HF_HUB_OFFLINE/HF_DATASETS_OFFLINE set, or huggingface.co unreachable). {hint}"
        )


LOCAL_HINT = (
    "Point the DataModule at local files instead, e.g. --data.dataset path/to/corpus.txt, a folder, a glob "
    "('data/*.jsonl'), or .csv/.tsv/.parquet files (a folder's train*/valid*/test* files become the splits); "
    "or use an embedded corpus (shakespeare, kjv-rv1909)."
)


def read_text(path: str | os.PathLike) -> str:
    """A file's text as UTF-8, undecodable bytes replaced by U+FFFD and counted in a warning naming the file."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("utf-8", errors="replace")
        bad = text.count("\ufffd") - data.count("\ufffd".encode())
        warnings.warn(f"{path}: {bad} undecodable byte sequence(s) replaced with U+FFFD", stacklevel=2)
        return text


def _repaired(path: str, cache_dir: Path) -> str:
    """A UTF-8-clean copy of a json/csv file when it has undecodable bytes (the builders would fail on them)."""
    data = Path(path).read_bytes()
    try:
        data.decode("utf-8")
        return path
    except UnicodeDecodeError:
        text = read_text(path)
    target = cache_dir / "repaired" / f"{hash_file(path)}{Path(path).suffix}"
    if not target.exists():
        atomic_write(target, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return str(target)


def is_local(spec: str) -> bool:
    return os.path.exists(spec) or any(ch in spec for ch in "*?[")


def local_files(spec: str) -> list[str]:
    if os.path.isdir(spec):
        files = sorted(str(p) for p in Path(spec).rglob("*") if p.is_file() and not p.name.startswith("."))
    elif os.path.isfile(spec):
        files = [spec]
    else:
        files = sorted(f for f in glob.glob(spec, recursive=True) if os.path.isfile(f))
    files = [f for f in files if Path(f).suffix.lower() in TEXT_SUFFIXES + tuple(BUILDERS)]
    if not files:
        raise FileNotFoundError(
            f"No data files found for {spec!r} (looked for {', '.join(TEXT_SUFFIXES + tuple(BUILDERS))})"
        )
    return files


def split_of(path: str) -> str:
    stem = Path(path).stem.lower()
    for prefix, split in SPLIT_ALIASES.items():
        if stem.startswith(prefix):
            return split
    return "train"


def load_local(spec: str, cache_dir: Path, text_column: str = "text") -> datasets.DatasetDict:
    """Local files as a DatasetDict; splits from train*/valid*/test* file names, else everything is train.

    Plain-text files become one row per file (a document) in `text_column`.
    """
    files = local_files(spec)
    by_split: dict[str, list[str]] = {}
    for f in files:
        by_split.setdefault(split_of(f) if len(files) > 1 else "train", []).append(f)
    if "train" not in by_split:
        raise ValueError(f"{spec!r} has no training file (names starting with train/valid/test pick the split)")
    suffixes = {Path(f).suffix.lower() for f in files}
    if suffixes <= set(TEXT_SUFFIXES):
        return datasets.DatasetDict(
            {
                split: datasets.Dataset.from_dict({text_column: [read_text(f) for f in fs]})
                for split, fs in by_split.items()
            }
        )
    builders = {BUILDERS.get(s) for s in suffixes}
    if len(builders) != 1 or None in builders:
        raise ValueError(f"{spec!r} mixes file types {sorted(suffixes)}; use one type per dataset")
    builder = builders.pop()
    kwargs = {"sep": "\t"} if suffixes == {".tsv"} else {}
    data_files = {
        split: [_repaired(f, cache_dir) if builder != "parquet" else f for f in fs] for split, fs in by_split.items()
    }
    return datasets.load_dataset(builder, data_files=data_files, cache_dir=str(cache_dir / "hf"), **kwargs)


def load_hub(name: str, config: str | None, cache_dir: Path) -> datasets.DatasetDict:
    """A hub dataset (all its splits), failing fast and clearly when offline."""
    what = f"dataset {name!r}" + (f" (config {config!r})" if config else "")
    ensure_online(what, LOCAL_HINT)
    try:
        loaded = datasets.load_dataset(name, config, cache_dir=str(cache_dir / "hf"))
    except ConnectionError as error:
        raise OfflineError(f"Cannot load {what} from the hub: {error}. {LOCAL_HINT}") from error
    if isinstance(loaded, datasets.Dataset):
        loaded = datasets.DatasetDict({"train": loaded})
    return loaded


def load_any(spec: str, config: str | None, cache_dir: Path, text_column: str = "text") -> datasets.DatasetDict:
    return load_local(spec, cache_dir, text_column) if is_local(spec) else load_hub(spec, config, cache_dir)


def read_inputs(path: str | Path, field: str = "text") -> list[str]:
    """The inputs of a predict run: a .jsonl/.json file's `field` per line, or else every line of a text file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"predict_file {str(path)!r} does not exist; give a text file with one input per line")
    lines = path.read_text(encoding="utf-8").splitlines()
    if path.suffix not in (".jsonl", ".json"):
        return lines
    texts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number} is not valid JSON ({error.msg}); write one object per line") from None
        if not isinstance(row, dict) or not isinstance(row.get(field), str):
            raise ValueError(f'{path}:{number} has no string field "{field}"; write lines like {{"{field}": "..."}}')
        texts.append(row[field])
    if not texts:
        raise ValueError(f"predict_file {str(path)!r} holds no input")
    return texts
