"""On-disk cache for data preparation: keys are content hashes plus settings, writes are atomic and locked.

A key changes whenever an input byte or a setting changes, so a stale entry is never reused; two processes that race
for the same entry wait on one lock and the loser reads the winner's file.

Data preparation tokenizes in processes started with multiprocessing's spawn method, which import the main script
again; a script that prepares data at import time (no `if __name__ == "__main__":` guard) would wait forever for
the cache lock its parent holds. `spawn_guard`, entered wherever a cache lock is taken, turns that into an error.
"""

from __future__ import annotations

import errno
import hashlib
import json
import multiprocessing
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from filelock import FileLock

from lit_transformer.errors import UserError, WriteError


class UnguardedMainError(UserError, RuntimeError):
    """A spawned worker re-imported a main script that prepares data at import time."""


def _report_path(parent_pid: int) -> Path:
    """Where a worker leaves its error for the parent: no channel to the parent exists while a worker imports."""
    return Path(tempfile.gettempdir()) / f"lit_transformer-unguarded-main-{parent_pid}.txt"


def _importing_main_in_spawned_worker() -> bool:
    # The flag multiprocessing itself reads (spawn._check_not_importing_main) to refuse starting processes while a
    # spawned process imports the main module; it is set only during that import.
    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


def unguarded_main_message(what: str) -> str:
    # While a spawned process imports the main script, runpy runs it with sys.argv[0] set to the script's path.
    script = sys.argv[0] if sys.argv and sys.argv[0].endswith(".py") else "The main script"
    return (
        f"{script} {what} when it is imported, with no `if __name__ == '__main__':` guard. Data preparation "
        "tokenizes in worker processes started with multiprocessing's spawn method, and each worker imports the main "
        "script again: it would prepare the same data again and wait forever for the cache lock its parent holds. "
        "Fix: wrap your script's entry point in `if __name__ == '__main__':` (Python's multiprocessing docs: "
        "'Safe importing of main module')."
    )


@contextmanager
def spawn_guard() -> Iterator[None]:
    """Enter before taking a cache lock. In a spawned worker still importing the main script: raise
    `UnguardedMainError` (and leave the message for the parent). In the parent: a worker pool broken by that error
    inside the block surfaces as the same `UnguardedMainError` instead of a bare BrokenProcessPool."""
    if _importing_main_in_spawned_worker():
        message = unguarded_main_message("starts preparing data (takes a cache lock)")
        try:
            _report_path(os.getppid()).write_text(message, encoding="utf-8")
        except OSError:
            pass  # the parent still fails (BrokenProcessPool); this worker's traceback carries the message
        raise UnguardedMainError(message)
    report, entered = _report_path(os.getpid()), time.time()
    try:
        yield
    except BrokenProcessPool as error:
        try:
            fresh = report.stat().st_mtime >= entered - 1  # not left by an earlier process with this id
        except OSError:
            fresh = False
        if not fresh:
            raise
        message = report.read_text(encoding="utf-8")
        report.unlink(missing_ok=True)
        raise UnguardedMainError(f"A tokenizing worker stopped: {message}") from error


# ---------------------------------------------------------------------------------------------------- the cache

CACHE_ENV = "LIT_TRANSFORMER_CACHE"


def resolve_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """The cache root: the argument, else $LIT_TRANSFORMER_CACHE, else ~/.cache/lit_transformer."""
    root = cache_dir or os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "lit_transformer"
    path = Path(root).expanduser()
    with unwritable_cache(path):
        path.mkdir(parents=True, exist_ok=True)
    return path


# The errors of a write the folder's permissions or its file system refuse (not a full disk: shards.WRITE_FAILURES).
UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)


@contextmanager
def unwritable_cache(path: Path) -> Iterator[None]:
    """A write into the cache that its folder refuses (read-only, no permission) becomes a WriteError naming the
    folder and how to give another: it was a traceback from deep inside the preparation."""
    try:
        yield
    except OSError as error:
        if error.errno not in UNWRITABLE:
            raise
        where = error.filename or path
        raise WriteError(
            f"cannot write the data cache: {where}: {error.strerror}. The tokenizers and token shards are cached "
            f"there (--data.init_args.cache_dir, else ${CACHE_ENV}, else ~/.cache/lit_transformer); give a folder "
            f"you can write, e.g. --data.init_args.cache_dir /tmp/lit_transformer_cache, or prepare the data once "
            "where the cache is writable (a read-only cache serves the data it already holds)"
        ) from None


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
    with spawn_guard():  # a worker re-importing an unguarded script: an error
        with unwritable_cache(path.parent):  # only the cache's own writes: not those of the body
            path.parent.mkdir(parents=True, exist_ok=True)
            lock = FileLock(str(path) + ".lock")
            lock.acquire()
        try:
            yield
        finally:
            lock.release()


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """Call `write(tmp_path)`, then rename into place: readers never see a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    os.close(fd)
    from lit_transformer.checkpoints.files import follow_umask

    follow_umask(tmp)  # mkstemp's 0600: a cache shared by several accounts (a team's, a cluster's nodes) reads too
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def cached(
    path: Path, build: Callable[[], Any], save: Callable[[Any, str], None], load: Callable[[Path], Any], what: str = ""
) -> Any:
    """Load `path` if present, else build, save atomically under a lock, and return the built value.

    An entry that cannot be loaded (emptied or cut short outside this module's atomic writes: a copy, a restore, a
    user's `: > file`) is built again, with a warning naming it: it is a cache entry, so nothing of the user's is
    lost. `what` names the entry in that warning ("cached tokenizer")."""
    warned = False
    if path.exists():
        value = _load_entry(path, load, what)
        if value is not _DAMAGED:
            return value
        warned = True
    with locked(path):
        if path.exists():  # another process built it while we waited, or it is the damaged entry
            value = _load_entry(path, load, what, warn=not warned)
            if value is not _DAMAGED:
                return value
        value = build()
        atomic_write(path, lambda tmp: save(value, tmp))
        return value


_DAMAGED = object()


def _load_entry(path: Path, load: Callable[[Path], Any], what: str, warn: bool = True) -> Any:
    """The entry `load` reads, or _DAMAGED (warned of, once: not again under the lock) where it cannot be read."""
    try:
        return load(path)
    except Exception as error:  # whatever the reader raises (tokenizers raises a bare Exception): rebuilt
        if warn:
            detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            size = path.stat().st_size if path.exists() else 0
            warnings.warn(
                f"{what or 'cache entry'} {path} cannot be read ({size:,} bytes; {detail}): building it again",
                stacklevel=3,
            )
        return _DAMAGED


def cached_json(path: Path, build: Callable[[], Any]) -> Any:
    def save(value: Any, tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(value, handle, ensure_ascii=False)

    return cached(path, build, save, lambda p: json.loads(p.read_text(encoding="utf-8")))
