"""Spawned worker processes and the script that started them: an unguarded entry point becomes an error, not a hang.

Data preparation tokenizes in processes started with multiprocessing's spawn method. A spawned process imports the
main script again before it runs its task. A script that prepares data at import time (no
``if __name__ == "__main__":`` guard) then starts preparing again in every worker, and the worker waits forever for
the cache lock its parent holds while the parent waits for the worker: nothing is printed. `spawn_guard`, entered
wherever a cache lock is taken, turns that into an error in the worker and, through the broken pool, in the parent.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from pathlib import Path


class UnguardedMainError(RuntimeError):
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
