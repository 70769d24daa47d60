"""Suite-wide settings. Under pytest-xdist (`-n 2`, as CI runs) each worker keeps to one thread: two workers of two
threads each on a 2-core machine oversubscribe it, and torch then runs many times slower than with one."""

import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"  # read when torch is first imported, here and in every subprocess
