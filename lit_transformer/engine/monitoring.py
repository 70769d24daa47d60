"""What Lightning lacks for watching a run: tokens/s, samples/s and MFU on any device (with the matmul rate it is
measured against), a progress bar that never waits for the device, the learning rate of every group, and the host
memory of the process and its workers."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import LearningRateMonitor, TQDMProgressBar
from lightning.pytorch.utilities import rank_zero_info

from lit_transformer.engine.lightning_compat import compute_dtype, trainer_logs_now
from lit_transformer.engine.schedules import run_ends_first_note, schedule_length, schedule_length_note, warmup_note
from lit_transformer.errors import ConfigError
from lit_transformer.records import process_rss_mb
from lit_transformer.tasks.losses import IGNORE_INDEX


class TokenThroughputMonitor(L.Callback):
    """Training throughput in tokens/s, samples/s and MFU, per logging interval, on any device.

    Lightning's ThroughputMonitor synchronises the GPU after every batch to time it, which stalls the pipeline the
    step is meant to keep full. Here the batches' token counts add up on the device, and the clock is read (after one
    synchronisation) only at the steps the trainer logs: the figures are means over the interval since the last log.
    Tags are Lightning's: train/device/items_per_sec (tokens), train/device/samples_per_sec, train/device/mfu, ...
    Lightning knows the peak FLOP/s of datacenter GPUs only; elsewhere (a CPU) the peak is given or measured here with
    a matmul, so that MFU is reported against what this machine can actually do.
    """

    def __init__(self, peak_flops: float | None = None) -> None:
        """
        Args:
            peak_flops: The device's peak FLOP/s for MFU (model FLOPs utilisation: the share of that peak the
                model's arithmetic uses); None uses Lightning's table, else measures a matmul.
        """
        if peak_flops is not None and not peak_flops > 0:
            raise ConfigError(
                f"throughput.peak_flops={peak_flops} must be a positive FLOP/s figure (or null)",
                keys=["throughput.peak_flops"],
            )
        self.peak_flops = peak_flops
        self.available_flops: float | None = None
        self.tokens_per_sec: float | None = None
        self._step_before = -1  # global_step when this batch began
        self._reset(None)

    def _reset(self, start: float | None) -> None:
        self._start = start
        self._batches = self._samples = 0
        self._flops = 0.0
        self._tokens: torch.Tensor | int = 0

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        from lightning.fabric.utilities.throughput import get_available_flops

        if stage != "fit":
            return
        device, dtype = trainer.strategy.root_device, compute_dtype(trainer.precision_plugin)
        self._device, self._dtype = device, dtype
        self.available_flops = self.peak_flops or get_available_flops(device, dtype)
        if self.available_flops is None and device.type == "cuda":
            self.available_flops = measured_peak_flops(device, dtype)  # now, while the GPU's memory is free
        # Elsewhere (a CPU) at the first step that logs MFU: a run that logs none (a few steps, no logger) spends no
        # time on it; the matmuls take longer than a tiny run's training (about 0.3 s on one core).

    def _now(self, trainer: L.Trainer) -> float:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize()  # the one synchronisation per logging interval
        return time.perf_counter()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._reset(self._now(trainer))

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self._step_before = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, *args) -> None:
        self._batches += 1
        self._samples += _batch_size(batch)
        self._tokens = self._tokens + _token_count(batch)  # a tensor on the batch's device: nothing is read
        self._flops += getattr(pl_module, "flops_per_batch", None) or 0.0
        # An optimizer step ended this batch (not one of the micro-batches it accumulates) if global_step moved.
        if trainer.global_step == self._step_before or not trainer_logs_now(trainer, step_taken=True):
            return
        now = self._now(trainer)
        elapsed = now - self._start
        tokens = int(self._tokens)
        rates = {
            "batches_per_sec": self._batches / elapsed,
            "samples_per_sec": self._samples / elapsed,
            "items_per_sec": tokens / elapsed,
        }
        if self._flops:
            rates["flops_per_sec"] = self._flops / elapsed
            if self.available_flops is None:
                self.available_flops = measured_peak_flops(self._device, self._dtype)
                now = self._now(trainer)  # the next interval starts after the measurement
            if self.available_flops:
                rates["mfu"] = rates["flops_per_sec"] / self.available_flops
        metrics = {f"train/device/{name}": value for name, value in rates.items()}
        if trainer.world_size > 1:  # every rank runs the same step: the job's rate is world_size times one rank's
            metrics.update({f"train/{name}": value * trainer.world_size for name, value in rates.items()})
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)
        self.tokens_per_sec = rates["items_per_sec"]  # shown by SyncFreeProgressBar
        self._reset(now)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Validation time is not training time: the next interval starts when training resumes.
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._reset(self._now(trainer))


class SyncFreeProgressBar(TQDMProgressBar):
    """Lightning's TQDM bar, showing the training loss and tokens/s read only at the steps the trainer logs.

    Reading a logged tensor makes the host wait for the GPU. Lightning converts every `prog_bar=True` tensor to a
    number after every batch, so the training step logs nothing to the bar; this bar moves its counter every batch
    and reads train/loss (and the TokenThroughputMonitor's rate) with the logs.
    """

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        if trainer.training:
            loss = trainer.callback_metrics.get("train/loss")
            if loss is not None:
                metrics["loss"] = f"{float(loss):.4g}"
            monitor = next((c for c in trainer.callbacks if isinstance(c, TokenThroughputMonitor)), None)
            if monitor is not None and monitor.tokens_per_sec is not None:
                metrics["tok/s"] = f"{monitor.tokens_per_sec:,.0f}"
        return metrics

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        n = batch_idx + 1
        bar = self.train_progress_bar
        if bar is None or not self._should_update(n, bar.total):
            return
        if not bar.disable:
            bar.n = n
            bar.refresh()
        if trainer_logs_now(trainer, step_taken=True):
            bar.set_postfix(self.get_metrics(trainer, pl_module))


def _batch_size(batch: dict[str, torch.Tensor]) -> int:
    return len(batch["labels"] if "labels" in batch else batch["input_ids"])


def _token_count(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Target tokens of a language-model or translation batch; input tokens of a batch that carries an attention_mask
    (predict inputs and classification passages, whose labels are one per example). A tensor: never read here."""
    if "labels" in batch and "attention_mask" not in batch:
        return (batch["labels"] != IGNORE_INDEX).sum()
    return batch["attention_mask"].sum()


class LearningRateLogger(LearningRateMonitor):
    """Lightning's LearningRateMonitor, per step, that stands aside when a run has no logger (`--trainer.logger false`).
    And the length of a cosine or wsd schedule, in the checkpoint: a run resumed with another one (a larger max_steps
    to train on) follows the new schedule from its next step, which a note says with both rates."""

    def __init__(self) -> None:
        super().__init__(logging_interval="step")
        self._resumed_length: int | None = None

    @staticmethod
    def _length(trainer: L.Trainer, module: Any) -> int | None:
        optim = getattr(module, "optim", None)
        if optim is None or getattr(optim, "schedule", None) not in ("cosine", "wsd"):
            return None
        return schedule_length(optim, trainer.max_steps)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        length = self._length(trainer, pl_module)
        if length is not None:
            checkpoint["schedule_steps"] = length

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        self._resumed_length = checkpoint.get("schedule_steps")

    def on_train_start(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        module = trainer.lightning_module
        length, scheduler = self._length(trainer, module), trainer.lr_scheduler_configs
        if scheduler:
            name = module.optim.schedule if length is not None else ""
            note = schedule_length_note(name, self._resumed_length, length, trainer.global_step, scheduler[0].scheduler)
            if note:
                rank_zero_info(note)
            optim = module.optim
            total = length if length is not None else trainer.max_steps
            note = warmup_note(optim.schedule, optim.warmup_steps, total)
            if note and trainer.global_step == 0:
                rank_zero_info(note)
            epochs = trainer.max_epochs
            if length is not None and trainer.global_step == 0 and epochs is not None and epochs > 0:
                note = run_ends_first_note(name, length, trainer.estimated_stepping_batches, epochs)
                if note:
                    rank_zero_info(note)
        if trainer.loggers:
            super().on_train_start(trainer, *args, **kwargs)

    def on_train_batch_start(self, trainer: L.Trainer, module: Any, batch: Any, batch_idx: int) -> None:
        # once a step: with accumulated batches, Lightning's logged the same step's rate once per micro-batch
        if trainer.loggers and batch_idx % trainer.accumulate_grad_batches == 0:
            super().on_train_batch_start(trainer, module, batch, batch_idx)

    def on_train_epoch_start(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        if trainer.loggers:
            super().on_train_epoch_start(trainer, *args, **kwargs)


class HostMemoryMonitor(L.Callback):
    """The host's resident memory of this process (and of its child processes: DataLoader workers) every N steps.

    Off by default; add it where memory growth over a long run is in question, e.g.
    `--trainer.callbacks+=lit_transformer.engine.monitoring.HostMemoryMonitor`. It logs host/rss_mb and host/children_rss_mb
    to the trainer's loggers, and with `path` also appends one JSON line per record to that file
    ({"stage", "step", "rank", "time", "rss_mb", "peak_rss_mb", "children_rss_mb"}; peak_rss_mb is this process's
    high-water mark so far): a "setup" record once the data is prepared and
    the model built, then one "train" record every `every_n_steps` optimizer steps. Linux only (/proc); elsewhere it
    records nothing.
    """

    def __init__(self, every_n_steps: int = 100, path: str | None = None) -> None:
        """
        Args:
            every_n_steps: Record every this many optimizer steps.
            path: A file to append JSON lines to (each rank writes its own records, tagged with its rank).
        """
        if every_n_steps < 1:
            raise ConfigError(f"every_n_steps must be at least 1, not {every_n_steps}")
        self.every_n_steps = every_n_steps
        self.path = path
        self._last_step: int | None = None

    def _record(self, trainer: L.Trainer, stage: str) -> dict[str, Any] | None:
        rss = process_rss_mb()
        if rss is None:
            return None
        children = 0.0
        try:
            with open(f"/proc/self/task/{os.getpid()}/children") as handle:  # the main thread's children
                pids = handle.read().split()
        except OSError:
            pids = []
        for pid in pids:
            children += process_rss_mb(pid) or 0.0
        record = {"stage": stage, "step": trainer.global_step, "rank": trainer.global_rank, "time": time.time(),
                  "rss_mb": round(rss, 1), "peak_rss_mb": round(process_rss_mb(field="VmHWM") or rss, 1),
                  "children_rss_mb": round(children, 1)}  # fmt: skip
        if self.path is not None:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")
        return record

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._record(trainer, "setup")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step == 0 or step == self._last_step or step % self.every_n_steps:  # accumulation: one record a step
            return
        self._last_step = step
        record = self._record(trainer, "train")
        if record is not None and trainer.is_global_zero:
            metrics = {"host/rss_mb": record["rss_mb"], "host/children_rss_mb": record["children_rss_mb"]}
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=step)


_MEASURED: dict[tuple[str, torch.dtype, int], float] = {}


def measured_peak_flops(device: torch.device, dtype: torch.dtype) -> float:
    """matmul_peak_flops, measured once per process for a device, dtype and thread count: every fit of a process
    (an in-process grid, a notebook) then reports MFU against the same reference, and pays for it once."""
    key = (str(device), dtype, torch.get_num_threads())
    if key not in _MEASURED:
        _MEASURED[key] = matmul_peak_flops(device, dtype)
    return _MEASURED[key]


def matmul_peak_flops(
    device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, size: int | None = None, repeats: int = 8
) -> float:
    """The matmul FLOP/s this device reaches now in `dtype`: the MFU reference where no spec sheet is known.

    The default size is 1024 on a CPU (enough to reach its peak) and 8192 on a GPU (smaller ones leave SMs idle).
    """
    import time

    device = torch.device(device)
    size = size or (8192 if device.type == "cuda" else 1024)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best
