"""HostMemoryMonitor: the host RSS every N optimizer steps, to the loggers and to a JSON-lines file."""

from __future__ import annotations

import json
import sys

import lightning as L
import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers import Logger

from lit_transformer.engine.monitoring import HostMemoryMonitor

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


class Recorder(Logger):
    def __init__(self) -> None:
        super().__init__()
        self.metrics: list[tuple[int, dict]] = []

    name = "recorder"
    version = 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        if any(key.startswith("host/") for key in metrics):
            self.metrics.append((step, dict(metrics)))


def test_records_every_n_optimizer_steps(tmp_path):
    torch.set_num_threads(1)
    path = tmp_path / "rss.jsonl"
    logger = Recorder()
    trainer = L.Trainer(
        max_steps=6,
        accumulate_grad_batches=2,  # 12 batches, 6 optimizer steps: one record per step, not per batch
        accelerator="cpu",
        logger=logger,
        callbacks=[HostMemoryMonitor(every_n_steps=3, path=str(path))],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(BoringModel())
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(row["stage"], row["step"]) for row in rows] == [("setup", 0), ("train", 3), ("train", 6)]
    for row in rows:
        assert (
            row["rank"] == 0
            and row["peak_rss_mb"] >= row["rss_mb"] > 10
            and row["children_rss_mb"] >= 0
            and row["time"] > 0
        )
    assert [step for step, _ in logger.metrics] == [3, 6]
    assert logger.metrics[-1][1]["host/rss_mb"] == rows[-1]["rss_mb"]


def test_rejects_a_step_interval_below_one():
    with pytest.raises(ValueError, match="every_n_steps"):
        HostMemoryMonitor(every_n_steps=0)
