"""Suite-wide settings. Under pytest-xdist (`-n 2`, as CI runs) each worker keeps to one thread: two workers of two
threads each on a 2-core machine oversubscribe it, and torch then runs many times slower than with one."""

import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"  # read when torch is first imported, here and in every subprocess

# The longest files go first, so that under `--dist loadfile` no worker starts one of them while the other is
# finishing: test_readme runs every command of the README and the docs pages in order on one worker (about a
# third of the suite).
FIRST = ("test_readme.py", "test_variants.py", "test_own_data.py", "test_cli.py", "test_multinode.py")


def pytest_collection_modifyitems(items: list) -> None:
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))  # stable: the order within a file stays
