"""glibc's malloc set for training on a CPU: memory a step frees is kept for the next step, not given back.

PyTorch's CPU tensors come from malloc. glibc serves a block of 128 KiB or more with a fresh mmap, unmapped again at
free (the threshold rises with the blocks freed, to 32 MiB at most), and gives the top of its heap back to the system
once more than twice that threshold is free there. A training step frees its activations and the next step allocates
the same sizes again: by default every step maps fresh pages, and the kernel zero-fills each at its first touch
(system time, and a minor page fault per 4 KiB). With blocks below 1 GiB served from the heap and the heap never
trimmed, a step reuses the pages of the one before: the main job and the translation preset train about a tenth
faster for a few percent more peak memory, measured by `python -m lit_transformer bench allocator`
(docs/performance.md, "Host memory").

`keep_freed_memory()` is what the training commands (fit, validate, test, predict) call first. It leaves glibc as it
is when the user chose: `LIT_TRANSFORMER_MALLOC=glibc`, glibc's own MALLOC_*_ variables or GLIBC_TUNABLES for malloc,
or another allocator preloaded (jemalloc, tcmalloc, mimalloc); and where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Mapping

from lit_transformer.errors import ConfigError

log = logging.getLogger(__name__)

MALLOC_ENV = "LIT_TRANSFORMER_MALLOC"
"""`reuse` (the default): freed memory kept for reuse; `glibc`: glibc's own settings."""

CHOICES = ("reuse", "glibc")

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (malloc.h)

MMAP_THRESHOLD = 1 << 30
"""Blocks below 1 GiB come from the heap: every activation of the shipped presets on a CPU."""

FALLBACK_MMAP_THRESHOLD = 32 << 20
"""glibc's own ceiling for its rising threshold, where the C library refuses MMAP_THRESHOLD."""

TRIM_THRESHOLD = 2**31 - 1
"""The largest value mallopt takes (an int): the heap's free top is kept."""

USER_MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")


def choice(environ: Mapping[str, str] = os.environ) -> str:
    """The value of LIT_TRANSFORMER_MALLOC (default `reuse`); another value is refused, naming the choices."""
    value = environ.get(MALLOC_ENV, "reuse").strip().lower() or "reuse"
    if value not in CHOICES:
        raise ConfigError(
            f"{MALLOC_ENV}={environ[MALLOC_ENV]!r} is not one of {', '.join(CHOICES)}",
            hint=f"Unset it (freed memory kept for reuse, the default), or set {MALLOC_ENV}=glibc for glibc's own "
            "malloc settings.",
        )
    return value


def left_alone(environ: Mapping[str, str] = os.environ) -> str | None:
    """Why glibc's malloc is left as it is (the user's choice in `environ`, or no glibc), or None when it is to be
    set."""
    if choice(environ) == "glibc":
        return f"{MALLOC_ENV}=glibc"
    given = [name for name in USER_MALLOC_ENV if name in environ]
    if given:
        return f"{given[0]} is set"
    if "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES sets malloc"
    preloaded = environ.get("LD_PRELOAD", "")
    other = next((name for name in OTHER_ALLOCATORS if name in preloaded), None)
    if other:
        return f"{other} is preloaded"
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION")
    except (AttributeError, ValueError, OSError):  # not a POSIX system, or no such name
        libc = None
    if not libc or not libc.startswith("glibc"):
        return "the C library is not glibc"
    return None


def keep_freed_memory() -> bool:
    """Set glibc's malloc to keep freed memory for reuse (see the module's docstring); whether it was set."""
    reason = left_alone()
    if reason is not None:
        log.debug("malloc left as it is: %s", reason)
        return False
    libc = ctypes.CDLL(None)
    # An older glibc refuses a threshold above 32 MiB (half its heap size); the trim threshold is set only with one,
    # since a fixed trim threshold alone also fixes the mmap threshold at 128 KiB: every block an mmap of its own.
    for threshold in (MMAP_THRESHOLD, FALLBACK_MMAP_THRESHOLD):
        if libc.mallopt(M_MMAP_THRESHOLD, threshold) == 1:
            done = libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
            log.debug("malloc keeps freed memory (blocks below %d bytes from the heap): %s", threshold, done)
            return done
    log.debug("malloc left as it is: mallopt refused the thresholds")
    return False
