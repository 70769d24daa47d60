"""Callbacks that end a run at a chosen moment, as a crash (`kill -9`, a lost node) would: an exception no callback
writes a checkpoint for, raised from inside the loop (given by class path: `--trainer.callbacks+=_interrupt.X`)."""

from __future__ import annotations

import lightning as L


class Crash(RuntimeError):
    """The planted crash."""


class CrashDuringValidation(L.Callback):
    """Crash in the middle of the validation that follows optimizer step `step` (not the sanity check)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if not trainer.sanity_checking and trainer.global_step == self.step and trainer.state.fn == "fit":
            raise Crash(f"crash during the validation of step {self.step}")


class CrashAtBatch(L.Callback):
    """Crash at the start of training batch `batch` (counted over the run, from 0)."""

    def __init__(self, batch: int) -> None:
        self.batch = batch

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.fit_loop.total_batch_idx == self.batch:
            raise Crash(f"crash at batch {self.batch}")


class SignalAtBatch(L.Callback):
    """Send this process `signal` (a name) at the start of training batch `batch`, as a scheduler's SIGTERM would."""

    def __init__(self, batch: int, signal: str = "SIGTERM") -> None:
        self.batch, self.signal = batch, signal

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        import os
        import signal

        if trainer.fit_loop.total_batch_idx == self.batch:
            os.kill(os.getpid(), getattr(signal, self.signal))
