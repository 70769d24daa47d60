"""The learning rate a run actually gets: a tiny `fit` through the command line, every schedule, with and without
gradient accumulation, the rate the optimizer holds at each optimizer step (and after the last) read by a callback,
against each schedule's formula written out here (not lit_transformer/engine/schedules.py's)."""

from __future__ import annotations

import json
import math
import typing
from pathlib import Path

import lightning as L
import pytest
from test_cli import CONFIGS, ROOT, _cli

from lit_transformer.engine.schedules import ScheduleName

LR, WARMUP, STEPS, D_MODEL, MIN_RATIO, DECAY, MUON_LR = 2e-3, 3, 10, 32, 0.2, 0.4, 0.05


class LearningRates(L.Callback):
    """Writes the learning rate of every parameter group at each optimizer step (just before the optimizer uses it)
    and once training ends (where the schedule left it, at step max_steps), as JSON {step: [lr per group]}."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.rates: dict[int, list[float]] = {}
        self.batches = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.batches += 1

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.rates[trainer.global_step] = [group["lr"] for group in optimizer.param_groups]

    def on_train_end(self, trainer, pl_module) -> None:
        self.rates[trainer.global_step] = [group["lr"] for group in trainer.optimizers[0].param_groups]
        Path(self.path).write_text(json.dumps({"rates": self.rates, "batches": self.batches}))


def expected_lr(schedule: str, step: int) -> float:
    """The rate at optimizer step `step` (0-based), as each schedule's documentation defines it."""
    if schedule == "noam":  # Vaswani et al. 2017, eq. 3, steps counted from 1, scaled by the base rate
        n = step + 1
        return LR * D_MODEL**-0.5 * min(n**-0.5, n * WARMUP**-1.5)
    if schedule == "cosine":  # linear warmup to LR, then half a cosine to MIN_RATIO * LR at max_steps
        if step < WARMUP:
            return LR * (step + 1) / WARMUP
        progress = (step - WARMUP) / (STEPS - WARMUP)
        return LR * (MIN_RATIO + (1 - MIN_RATIO) * (1 + math.cos(math.pi * progress)) / 2)
    if schedule == "constant":  # linear warmup, then flat
        return LR * min(1.0, (step + 1) / WARMUP)
    if schedule == "wsd":  # linear warmup, flat, then down to MIN_RATIO * LR as 1 - sqrt over the last DECAY of the run
        if step < WARMUP:
            return LR * (step + 1) / WARMUP
        start = STEPS - round(DECAY * STEPS)
        if step < start:
            return LR
        progress = min(1.0, (step - start) / (STEPS - start))
        return LR * (MIN_RATIO + (1 - MIN_RATIO) * (1 - math.sqrt(progress)))
    raise AssertionError(f"no formula written for the schedule {schedule!r}: add it here")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("schedule_cache")


def _fit(schedule: str, accumulate: int, cache: Path, tmp_path: Path, *extra: str) -> tuple[dict, dict]:
    """A tiny fit with the schedule; (the trace's record, {step: [lr per group]})."""
    trace = tmp_path / "lr.json"
    callback = {"class_path": f"{__name__}.LearningRates", "init_args": {"path": str(trace)}}
    _cli(
        "fit", "--config", str(CONFIGS / "presets" / "tiny.yaml"),
        "--trainer.max_steps", str(STEPS), "--trainer.accumulate_grad_batches", str(accumulate),
        "--trainer.limit_val_batches", "0", "--trainer.logger", "false", "--checkpoint.every_n_train_steps", "0",
        "--trainer.default_root_dir", str(tmp_path), "--checkpoint.dirpath", str(tmp_path / "ckpt"),
        "--data.init_args.cache_dir", str(cache), "--data.init_args.max_chars", "20000",
        "--model.optim.lr", str(LR), "--model.optim.schedule", schedule, "--model.optim.warmup_steps", str(WARMUP),
        "--model.optim.min_lr_ratio", str(MIN_RATIO), "--model.config.d_model", str(D_MODEL),
        "--model.optim.decay_fraction", str(DECAY), f"--trainer.callbacks+={json.dumps(callback)}", *extra,
        cwd=ROOT,
    )  # fmt: skip
    seen = json.loads(trace.read_text())
    return seen, {int(step): lrs for step, lrs in seen["rates"].items()}


@pytest.mark.slow
@pytest.mark.parametrize("accumulate", [1, 2])
@pytest.mark.parametrize("schedule", typing.get_args(ScheduleName))
def test_the_optimizer_sees_the_schedules_formula(schedule: str, accumulate: int, cache: Path, tmp_path: Path):
    seen, rates = _fit(schedule, accumulate, cache, tmp_path)
    assert seen["batches"] == STEPS * accumulate  # each optimizer step took `accumulate` micro-batches
    assert sorted(rates) == list(range(STEPS + 1))
    for step, lrs in rates.items():  # every parameter group (decayed or not) on the same curve
        assert lrs == pytest.approx([expected_lr(schedule, step)] * len(lrs), rel=1e-9), step
    # The landmarks: the first step, the peak at the end of warmup, the middle, and where max_steps leaves it.
    landmarks = {0: rates[0][0], WARMUP - 1: rates[WARMUP - 1][0], STEPS // 2: rates[STEPS // 2][0]}
    if schedule == "cosine":
        assert landmarks[WARMUP - 1] == pytest.approx(LR) and rates[STEPS][0] == pytest.approx(MIN_RATIO * LR)
    if schedule == "constant":
        assert landmarks[STEPS // 2] == pytest.approx(LR) == rates[STEPS][0]
    if schedule == "wsd":  # flat in the middle, the decay ending where cosine's does
        assert landmarks[WARMUP - 1] == landmarks[STEPS // 2] == pytest.approx(LR)
        assert rates[STEPS][0] == pytest.approx(MIN_RATIO * LR)


@pytest.mark.slow
def test_muon_and_adamw_groups_each_follow_the_curve_from_their_own_rate(cache: Path, tmp_path: Path):
    """With model.optim.optimizer muon the hidden matrices' group starts from muon_lr, AdamW's from lr: the schedule
    scales both alike, at every optimizer step of an accumulated run."""
    seen, rates = _fit(
        "wsd", 2, cache, tmp_path, "--model.optim.optimizer", "muon", "--model.optim.muon_lr", str(MUON_LR)
    )
    assert seen["batches"] == STEPS * 2 and sorted(rates) == list(range(STEPS + 1))
    for step, lrs in rates.items():  # AdamW's two groups (decayed, not), then Muon's
        factor = expected_lr("wsd", step) / LR
        assert lrs == pytest.approx([LR * factor, LR * factor, MUON_LR * factor], rel=1e-9), step


def test_the_rate_is_logged_once_a_step_with_accumulated_batches(cache: Path, tmp_path: Path):
    """Lightning's LearningRateMonitor logged the rate at each micro-batch: with 3 accumulated batches, every step's
    rate three times at the same step (TensorBoard drew each point thrice). Once a step now."""
    import csv

    logger = {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(tmp_path / "csv")}}
    _cli(
        "fit", "--config", str(CONFIGS / "presets" / "tiny.yaml"), "--trainer.max_steps", "4",
        "--trainer.accumulate_grad_batches", "3", "--trainer.log_every_n_steps", "1", "--trainer.limit_val_batches", "0",
        "--trainer.logger", json.dumps(logger), "--trainer.default_root_dir", str(tmp_path),
        "--data.init_args.cache_dir", str(cache), "--data.init_args.max_chars", "20000", cwd=ROOT,
    )  # fmt: skip
    (metrics,) = (tmp_path / "csv").rglob("metrics.csv")
    rows = [row for row in csv.DictReader(metrics.open()) if any(k.startswith("lr-") and v for k, v in row.items())]
    steps = [int(row["step"]) for row in rows]
    assert steps == sorted(set(steps)) and len(steps) == 4, steps
