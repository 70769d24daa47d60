"""glibc's malloc as the training commands set it (lit_transformer/engine/host_allocator.py): a block freed and
allocated again reuses its pages instead of faulting in fresh ones; the user's own choice is left alone; a mistyped
LIT_TRANSFORMER_MALLOC is refused by the command in a line naming the choices."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from lit_transformer.engine import host_allocator
from lit_transformer.engine.host_allocator import MALLOC_ENV, choice, left_alone

pytestmark = pytest.mark.skipif(
    not os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc"), reason="glibc's malloc: Linux with glibc"
)

# A 64 MiB block (above glibc's own highest mmap threshold, 32 MiB) written, freed and allocated again, four times:
# the minor page faults of the last three rounds. Pages reused fault no more; a fresh mapping faults every page.
REALLOCATE = """
import ctypes, resource, sys
from lit_transformer.engine.host_allocator import keep_freed_memory
print("SET", keep_freed_memory())
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
size, faults = 64 << 20, []
for _ in range(4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    libc.free(block)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print("FAULTS", sum(faults[1:]))
"""

PAGES = (64 << 20) // os.sysconf("SC_PAGE_SIZE")


def _reallocate(**env: str) -> tuple[str, int]:
    mine = (MALLOC_ENV, "GLIBC_TUNABLES", "LD_PRELOAD", *host_allocator.USER_MALLOC_ENV)  # glibc as it starts
    clean = {k: v for k, v in os.environ.items() if k not in mine}
    done = subprocess.run([sys.executable, "-c", REALLOCATE], env={**clean, **env}, capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    return lines["SET"], int(lines["FAULTS"])


def test_a_freed_block_is_reused_by_default_and_mapped_afresh_under_glibcs_settings():
    set_, faults = _reallocate()
    assert set_ == "True" and faults < PAGES // 10, faults  # three rounds, fewer faults than a tenth of one block
    set_, faults = _reallocate(**{MALLOC_ENV: "glibc"})
    assert set_ == "False" and faults >= 3 * PAGES * 0.9, faults  # every page of every round a fresh one


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        ({MALLOC_ENV: "glibc"}, f"{MALLOC_ENV}=glibc"),
        ({MALLOC_ENV: " GLIBC "}, f"{MALLOC_ENV}=glibc"),
        ({"MALLOC_TRIM_THRESHOLD_": "1000000"}, "MALLOC_TRIM_THRESHOLD_ is set"),
        ({"MALLOC_MMAP_THRESHOLD_": "131072"}, "MALLOC_MMAP_THRESHOLD_ is set"),
        ({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=131072"}, "GLIBC_TUNABLES sets malloc"),
        ({"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}, "jemalloc is preloaded"),
        ({"LD_PRELOAD": "libtcmalloc_minimal.so.4"}, "tcmalloc is preloaded"),
        ({"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX512F"}, None),  # not malloc's
        ({MALLOC_ENV: "reuse"}, None),
        ({}, None),
    ],
)
def test_the_users_own_allocator_choice_is_left_alone(monkeypatch, env: dict[str, str], reason: str | None):
    for name in (MALLOC_ENV, "GLIBC_TUNABLES", "LD_PRELOAD", *host_allocator.USER_MALLOC_ENV):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert left_alone() == reason


def test_another_c_library_is_left_alone(monkeypatch):
    for name in (MALLOC_ENV, "GLIBC_TUNABLES", "LD_PRELOAD", *host_allocator.USER_MALLOC_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(host_allocator.os, "confstr", lambda name: None)  # musl has no CS_GNU_LIBC_VERSION
    assert left_alone() == "the C library is not glibc"
    assert host_allocator.keep_freed_memory() is False


@pytest.mark.parametrize("command", ["fit", "test"])
def test_a_mistyped_value_is_refused_by_the_training_commands_in_a_few_lines(monkeypatch, capsys, command: str):
    from lit_transformer.cli.program import main

    monkeypatch.setenv(MALLOC_ENV, "reuse-it")
    with pytest.raises(SystemExit) as done:
        main([command, "--config", "configs/base.yaml"])
    err = capsys.readouterr().err
    assert done.value.code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 2, err
    assert f"{MALLOC_ENV}='reuse-it' is not one of reuse, glibc" in err and f"{MALLOC_ENV}=glibc" in err
    monkeypatch.setenv(MALLOC_ENV, "")
    assert choice() == "reuse"
