"""Plug-ins for the multi-node tests (tests/test_multinode.py): a rank that is lost at a given step, as a node that
dies or hangs would be, and a checkpoint writer that records who wrote what."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import torch.distributed as dist
from lightning.pytorch.callbacks import Callback

from lit_transformer.checkpoints.atomic_io import AtomicCheckpointIO


class LoseRank(Callback):
    """At the end of optimizer step `step`, global rank `rank` sends itself `signal` (SIGKILL: its node died;
    SIGSTOP: its node hangs). Under torchrun only in the first attempt (TORCHELASTIC_RESTART_COUNT 0 on its node),
    so that a restarted run goes on."""

    def __init__(self, step: int, rank: int = 1, signal: str = "SIGKILL") -> None:
        self.step, self.rank, self.signal = step, rank, signal

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        first_attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0
        if trainer.global_step == self.step and trainer.global_rank == self.rank and first_attempt:
            os.kill(os.getpid(), getattr(signal, self.signal))


class RecordedCheckpointIO(AtomicCheckpointIO):
    """AtomicCheckpointIO that appends (rank, step, file name) to `log` for every checkpoint it writes."""

    def __init__(self, log: str) -> None:
        super().__init__()
        self.log = Path(log)

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        super().save_checkpoint(checkpoint, path, storage_options)
        rank = dist.get_rank() if dist.is_initialized() else 0
        row = {"rank": rank, "step": checkpoint["global_step"], "file": Path(path).name}
        with open(self.log, "a") as handle:
            handle.write(json.dumps(row) + "\n")
