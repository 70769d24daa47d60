"""Elastic, exact resume through the CLI: a run checkpointed with N processes (DDP on CPU, gloo) resumes with M.

The training loader reads a global stream of blocks (order a function of seed, epoch and global sample index) and
each step takes the next batch_size x processes samples, so whatever the process counts, the samples trained are
exactly 0, 1, 2, ... in the stream: none repeated, none skipped. Each batch carries its global sample indices, which
tests/_samples.py records per rank.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

TESTS = Path(__file__).parent
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))
import _samples  # noqa: E402
from _forked import HARNESS_ENV, warm_python  # noqa: E402

pytestmark = pytest.mark.slow
BATCH = 8
ENV = HARNESS_ENV


def _fit(root: Path, devices: int, max_steps: int, *extra: str) -> None:
    config = {
        "trainer": {
            "default_root_dir": str(root),
            "max_steps": max_steps,
            "limit_val_batches": 0,
            "num_sanity_val_steps": 0,
            "enable_progress_bar": False,
            "devices": devices,
            "logger": False,
            "callbacks": [{"class_path": "_samples.SampleRecorder", "init_args": {"path": str(root / "samples")}}],
        },
        "data": {"init_args": {"batch_size": BATCH, "cache_dir": str(root.parent / "cache")}},
        "checkpoint": {"dirpath": str(root / "ckpt"), "every_n_train_steps": 1, "monitor": None, "save_top_k": 0},
    }
    if devices > 1:
        config["trainer"].update(strategy="ddp", accelerator="cpu")
    root.mkdir(parents=True, exist_ok=True)
    (root / "run.yaml").write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "lit_transformer", "fit", "--config", "configs/presets/tiny.yaml"]
    command += ["--config", str(root / "run.yaml"), *extra]
    result = warm_python(ENV).run(command, cwd=REPO, timeout=300, text=True)  # forked: tests/_forked.py
    assert result.returncode == 0, result.stderr[-3000:]


def test_a_checkpoint_of_n_processes_resumes_with_m_on_the_same_global_sample_sequence(tmp_path):
    """1 process for 5 steps, resumed on 2 processes to step 9 (1 -> 2), resumed on 1 process to step 12 (2 -> 1):
    the samples are the next ones of the global stream at every step, and their tokens are those an uninterrupted
    1-process run of the same 96 samples reads (a stream whose order depended on the process count would carry the
    same position tags over other blocks)."""
    run = tmp_path / "run"
    phases = [(1, 5), (2, 9), (1, 12)]  # (processes, last step)
    for i, (devices, last) in enumerate(phases):
        _fit(run, devices, last, *(["--ckpt_path", "last"] if i else []))
    rows = _samples.read_samples(run / "samples")
    assert sorted({r["step"] for r in rows}) == list(range(1, 13))
    expected, first = [], 1
    for devices, last in phases:
        for step in range(first, last + 1):
            assert sorted(r["rank"] for r in rows if r["step"] == step) == list(range(devices)), step
            at_step = sorted(s for r in rows if r["step"] == step for s in r["samples"])
            assert at_step == list(range(len(expected), len(expected) + BATCH * devices)), step  # the next samples
            expected += at_step
        first = last + 1
    assert sorted(s for r in rows for s in r["samples"]) == list(range(BATCH * (5 + 2 * 4 + 3)))  # each once
    _fit(tmp_path / "uninterrupted", 1, 5 + 2 * 4 + 3)
    assert tokens_by_sample(rows) == tokens_by_sample(_samples.read_samples(tmp_path / "uninterrupted" / "samples"))


def tokens_by_sample(rows: list[dict]) -> dict[int, str]:
    """Global sample index -> digest of its tokens."""
    return {s: t for r in rows for s, t in zip(r["samples"], r["tokens"], strict=True)}
