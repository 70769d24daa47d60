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
from pathlib import Path

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
