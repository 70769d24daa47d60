"""On-disk cache for data preparation: keys are content hashes plus settings, writes are atomic and locked.

A key changes whenever an input byte or a setting changes, so a stale entry is never reused; two processes that race
for the same entry wait on one lock and the loser reads the winner's file.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from filelock import FileLock

from .workers import spawn_guard

CACHE_ENV = "LIT_TRANSFORMER_CACHE"


def resolve_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """The cache root: the argument, else $LIT_TRANSFORMER_CACHE, else ~/.cache/lit_transformer."""
    root = cache_dir or os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "lit_transformer"
    path = Path(root).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def fingerprint(*parts: Any) -> str:
    """A short stable hash of JSON-serialisable settings and content digests."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:20]


def hash_texts(texts: Iterable[str]) -> str:
    """Content hash of a sequence of strings (boundaries included, so ["ab"] and ["a", "b"] differ)."""
    digest = hashlib.sha256()
    for text in texts:
        data = text.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()[:20]


def hash_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:20]


@contextmanager
def locked(path: Path):
    """Hold an inter-process lock beside `path` (so only one process builds a cache entry)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with spawn_guard(), FileLock(str(path) + ".lock"):  # a worker re-importing an unguarded script: an error
        yield


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """Call `write(tmp_path)`, then rename into place: readers never see a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def cached(path: Path, build: Callable[[], Any], save: Callable[[Any, str], None], load: Callable[[Path], Any]) -> Any:
    """Load `path` if present, else build, save atomically under a lock, and return the built value."""
    if path.exists():
        return load(path)
    with locked(path):
        if path.exists():  # another process built it while we waited
            return load(path)
        value = build()
        atomic_write(path, lambda tmp: save(value, tmp))
        return value


def cached_json(path: Path, build: Callable[[], Any]) -> Any:
    def save(value: Any, tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(value, handle, ensure_ascii=False)

    return cached(path, build, save, lambda p: json.loads(p.read_text(encoding="utf-8")))
