"""A plain command prints no warning: a newcomer reads every warning as an error, so each one must be something the
user can act on. The README's main command (`fit --config configs/base.yaml`, cut to 2 steps) and then `test`,
`predict` and `generate` on its checkpoint run as processes, as a user runs them, and their stderr is read."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "configs" / "base.yaml"
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"} | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _warnings(stderr: str) -> list[str]:
    """Lines that read as a warning: Python's `...Warning: message` lines and log records that say warn."""
    return [line for line in stderr.splitlines() if re.search(r"warn", line, re.IGNORECASE)]


def _command(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", "lit_transformer", *args], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


def _overrides(run: Path) -> list[str]:
    """Where the run writes (a temporary folder), nothing else: what base.yaml sets stays as it is."""
    return [
        "--trainer.default_root_dir", str(run),
        "--trainer.logger.init_args.save_dir", str(run),
        "--checkpoint.dirpath", str(run / "checkpoints"),
        "--data.init_args.cache_dir", str(run / "cache"),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def base_fit(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """`fit --config configs/base.yaml` for 2 steps, a checkpoint at the second: start-up and training as the
    README's command runs them (tokenizer training and data preparation included)."""
    run = tmp_path_factory.mktemp("base")
    short = ["--trainer.max_steps", "2", "--checkpoint.every_n_train_steps", "2"]
    return run, _command("fit", "--config", str(BASE), *_overrides(run), *short, cwd=run)


def test_fit_with_the_base_config_prints_no_warning(base_fit) -> None:
    run, result = base_fit
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert _warnings(result.stderr) == [], result.stderr[-5000:]


def test_test_predict_and_generate_print_no_warning(base_fit) -> None:
    run, _ = base_fit
    checkpoint = str(run / "checkpoints" / "last.ckpt")
    common = ["--config", str(BASE), *_overrides(run), "--ckpt_path", checkpoint]
    (run / "prompts.txt").write_text("ROMEO:\nJULIET:\n")
    results = {
        "test": _command("test", *common, "--trainer.limit_test_batches", "2", cwd=run),
        "predict": _command(
            "predict",
            *common,
            "--data.init_args.predict_file",
            "prompts.txt",
            "--predictions.output",
            str(run / "predictions.jsonl"),
            "--model.generation.max_new_tokens",
            "4",
            cwd=run,
        ),  # fmt: skip
        "generate": _command(
            "generate", "--checkpoint", checkpoint, "--prompt", "ROMEO:", "--max_new_tokens", "4", cwd=run
        ),
    }
    assert "test/bpc" in results["test"].stdout and (run / "predictions.jsonl").is_file()
    assert results["generate"].stdout.startswith("ROMEO:")
    printed = {command: _warnings(result.stderr) for command, result in results.items()}
    assert printed == {command: [] for command in results}, {c: r.stderr[-3000:] for c, r in results.items()}
