"""Suite-wide settings. Under pytest-xdist (`-n 2`, as CI runs) each worker keeps to one thread: two workers of two
threads each on a 2-core machine oversubscribe it, and torch then runs many times slower than with one."""

import ctypes
import os
import sys

if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"  # read when torch is first imported, here and in every subprocess

# glibc's malloc serves a block over 32 MB (a batch's logits: 2,048 tokens x 6,000 words) with fresh pages from the
# kernel, and returns them when it is freed: every training step then pays again for the kernel to zero its largest
# tensors (seconds of system time over a few hundred steps). Without mmap the heap keeps them for the next step. Speed
# only, as the threads above: here through mallopt (this process has started), in subprocesses through the variables
# glibc reads at start-up.
if sys.platform.startswith("linux"):
    os.environ.setdefault("MALLOC_MMAP_MAX_", "0")
    os.environ.setdefault("MALLOC_TRIM_THRESHOLD_", str(256 << 20))
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-4, int(os.environ["MALLOC_MMAP_MAX_"]))  # M_MMAP_MAX
        libc.mallopt(-1, int(os.environ["MALLOC_TRIM_THRESHOLD_"]))  # M_TRIM_THRESHOLD
    except (OSError, AttributeError, ValueError):  # not glibc: its own allocator, left as it is
        pass

# Lightning gives its loggers a StreamHandler bound to sys.stderr as it is when Lightning is first imported. Imported
# here, that is the session's own stderr; first imported by a test that captures stderr (capsys, a redirect), the
# handler would keep that test's stream, closed when the test ends, and a later test's "Seed set to" line would print
# "--- Logging error ---" (test_front_door.py alone in one process did).
import lightning  # noqa: E402,F401

# The longest files go first, so that under `--dist loadfile` no worker starts one of them while the other is
# finishing (test_readme runs every command of the README and the docs pages in order on one worker). Longest by
# CPU time, measured: a compiling file counts its inductor builds from an empty cache, as on a new machine.
FIRST = (
    "test_readme.py",
    "test_multinode.py",
    "test_own_data.py",
    "test_compiled_decoding.py",
    "test_variants.py",
    "test_lora.py",
    "test_compiled_shapes.py",
    "test_front_door.py",
    "test_onnx_generation.py",
    "test_resume.py",
    "test_spawn_guard.py",
    "test_ablate.py",
)


def pytest_configure(config) -> None:
    # xdist would hand out files by their number of tests instead (its --loadscope-reorder, on by default), which
    # starts a file of few long tests (test_readme) late, and then the other worker waits for it at the end.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list) -> None:
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))  # stable: the order within a file stays
