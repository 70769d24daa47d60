"""Suite-wide settings. Under pytest-xdist (`-n 2`, as CI runs) each worker keeps to one thread: two workers of two
threads each on a 2-core machine oversubscribe it, and torch then runs many times slower than with one."""

import gc
import json
import math
import os
from pathlib import Path

if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"  # read when torch is first imported, here and in every subprocess

# glibc's malloc keeps what a training step frees for the next step (no fresh pages for the kernel to zero at every
# step: test_compiled_shapes' system time went from 27 s to 3 s), in this process as the training commands set it in
# theirs (lit_transformer/engine/host_allocator.py): tests that run fit in-process train as the command does, and a
# subprocess that runs a training command sets it itself.
from lit_transformer.engine.host_allocator import keep_freed_memory  # noqa: E402

keep_freed_memory()

# scikit-learn and joblib put two OpenMP variables in os.environ when first imported (the digits corpus imports
# scikit-learn), so an environment built from os.environ differed with the tests a worker happened to run before. A
# warm interpreter is keyed by the variables read at start-up (tests/_forked.py), and each difference started one
# more (3 of a run's 8, about 3 s of CPU each). Set from the start, with those libraries' values, they are the same
# in every environment.
for name, value in (("KMP_DUPLICATE_LIB_OK", "True"), ("KMP_INIT_AT_FORK", "FALSE")):
    os.environ.setdefault(name, value)

# Python's cyclic collector waits until the tests are collected (pytest_collection_finish): the imports and the
# collection make objects that live as long as the session, which its passes walked again and again (2.4 s of CPU of
# a worker's 7.8 s of collection, measured), as the program's collector_paused explains for a command's imports.
gc.disable()

# Lightning gives its loggers a StreamHandler bound to sys.stderr as it is when Lightning is first imported. Imported
# here, that is the session's own stderr; first imported by a test that captures stderr (capsys, a redirect), the
# handler would keep that test's stream, closed when the test ends, and a later test's "Seed set to" line would print
# "--- Logging error ---" (test_front_door.py alone in one process did).
import lightning  # noqa: E402,F401

# The longest files go first, so that under `--dist loadfile` no worker starts one of them while the other is
# finishing (test_readme runs every command of the README and the docs pages in order on one worker): each file's
# seconds as `python -m lit_transformer bench suite-time` last measured them, from empty caches as on a new machine
# (it rewrites the file). A file it has not timed yet goes first: it may be long, and a short one costs nothing there.
FILE_SECONDS = json.loads((Path(__file__).parent / "file_seconds.json").read_text())


def pytest_configure(config) -> None:
    # xdist would hand out files by their number of tests instead (its --loadscope-reorder, on by default), which
    # starts a file of few long tests (test_readme) late, and then the other worker waits for it at the end.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    if getattr(config.option, "numprocesses", None) and not os.environ.get("PYTEST_XDIST_WORKER"):
        gc.enable()  # xdist's controller, which collects nothing: its workers do


def pytest_collection_finish(session) -> None:
    # What the session imported and collected (torch, Lightning, transformers, onnx, every test's parameters) lives
    # until it ends: frozen, the collector skips it from now on. Otherwise each of its full passes walked it all again:
    # about 30 a worker, 0.5 s of CPU each (measured).
    gc.freeze()
    # A full pass at most every 100 passes of the middle generation, not Python's 10: what the tests leave alive
    # between them (module fixtures' models, datasets, exported graphs) was walked again by each. Measured over a whole
    # run: 145 full passes (23 s of CPU) became 24 (8 s); the largest process's peak RSS went from 1.67 to 1.75 GB.
    # Cycles of young objects are still collected as often as before.
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, 100)
    gc.enable()


def pytest_collection_modifyitems(items: list) -> None:
    items.sort(key=lambda item: -FILE_SECONDS.get(item.path.name, math.inf))  # stable: a file's own order stays
