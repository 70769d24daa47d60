"""``NonFiniteLossGuard`` skips optimizer steps whose gradients are NaN/inf, counts and logs them, and stops the run
with a clear error after ``max_consecutive`` in a row; the weights never take a non-finite step."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn

from lit_transformer.engine.gradients import gradient_norm, unwrapped_optimizer
from lit_transformer.errors import ConfigError, UserError


class NonFiniteLossError(UserError, RuntimeError):
    """Training produced non-finite losses/gradients too many optimizer steps in a row: the run cannot go on, and the
    message says what to change (exit status 1, as a run that fails)."""

    status = 1


class NonFiniteLossGuard(Callback):
    """Skip optimizer steps with non-finite gradients; stop after ``max_consecutive`` of them in a row.

    Works with automatic optimization, gradient accumulation and DDP: the check runs once per optimizer step on the
    accumulated (and, under DDP, already all-reduced, hence identical on every rank) gradients. Under fp16 with a
    GradScaler, the scaler already skips overflowing steps; only a non-finite loss counts then.

    Nothing here makes the host wait for the GPU in the steady state. The verdict is a flag on the device: a fused
    Adam/AdamW (the default on CUDA) takes it as ``found_inf`` and skips the update inside its kernel (parameters,
    moments and step count unchanged), as it does for AMP's GradScaler. Any other optimizer needs the verdict on the
    host before its step: the flag is read then (one synchronisation per step) and a skipped step sets every gradient
    to None. The counts (steps skipped, the longest run in a row) stay on the device too and are read every
    ``check_every_n_steps`` steps, where the run stops if a run reached ``max_consecutive``; the weights never took
    any of those steps. The LR scheduler and ``global_step`` advance over skipped steps, as with GradScaler.
    """

    def __init__(self, max_consecutive: int = 10, check_every_n_steps: int | None = None) -> None:
        """
        Args:
            max_consecutive: Non-finite optimizer steps in a row that stop the run.
            check_every_n_steps: How often the counts are read (and warned about); None: every step on a CPU, where
                reading is free, and every trainer.log_every_n_steps steps on an accelerator.
        """
        if max_consecutive < 1:
            raise ConfigError(f"max_consecutive={max_consecutive} must be at least 1")
        if check_every_n_steps is not None and check_every_n_steps < 1:
            raise ConfigError(f"check_every_n_steps={check_every_n_steps} must be at least 1 (or None)")
        self.max_consecutive = max_consecutive
        self.check_every_n_steps = check_every_n_steps
        self.skipped = 0
        self.consecutive = 0
        self.first_bad_step: int | None = None
        # On the device: [skipped, consecutive, longest run, first step of the current run, its longest run's first]
        self._counts: torch.Tensor | None = None
        self._loss_non_finite: torch.Tensor | None = None
        self._reported = 0  # skips already warned about

    def _interval(self, trainer: pl.Trainer) -> int:
        if self.check_every_n_steps is not None:
            return self.check_every_n_steps
        return 1 if trainer.strategy.root_device.type == "cpu" else max(1, trainer.log_every_n_steps)

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor) -> None:
        bad = ~torch.isfinite(loss.detach()).all()
        self._loss_non_finite = bad if self._loss_non_finite is None else self._loss_non_finite | bad

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        norm = gradient_norm(trainer, optimizer)
        if getattr(trainer.precision_plugin, "scaler", None) is not None:
            # The GradScaler handles overflowing fp16 gradients itself; a non-finite loss is ours to count.
            bad = self._loss_non_finite if self._loss_non_finite is not None else torch.zeros((), dtype=torch.bool)
            bad = bad.to(norm.device)
        else:
            bad = ~torch.isfinite(norm)
        self._loss_non_finite = None
        torch_optimizer = unwrapped_optimizer(optimizer)
        if _skips_on_device(torch_optimizer) and getattr(trainer.precision_plugin, "scaler", None) is None:
            torch_optimizer.found_inf = bad.float()  # read by the fused kernel; removed after the step
        elif bool(bad):  # the host must know before a non-fused step: one read
            for group in optimizer.param_groups:
                for p in group["params"]:
                    p.grad = None
        self._count(trainer, bad)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        for optimizer in trainer.optimizers:
            if hasattr(optimizer, "found_inf"):
                del optimizer.found_inf

    def _count(self, trainer: pl.Trainer, bad: torch.Tensor) -> None:
        step = trainer.global_step
        if self._counts is None or self._counts.device != bad.device:
            counts = [self.skipped, self.consecutive, self.consecutive, self.first_bad_step or 0, 0]
            self._counts = torch.tensor(counts, dtype=torch.long, device=bad.device)
        skipped, consecutive, longest, run_start, longest_start = self._counts.unbind()
        bad = bad.long()
        consecutive = (consecutive + 1) * bad
        run_start = torch.where(consecutive == 1, step, run_start)
        longer = consecutive > longest
        longest = torch.maximum(longest, consecutive)
        longest_start = torch.where(longer, run_start, longest_start)
        self._counts = torch.stack([skipped + bad, consecutive, longest, run_start, longest_start])
        if (step + 1) % self._interval(trainer) == 0:
            self._check(trainer)

    def _read(self) -> tuple[int, int, int, int, int]:
        values = self._counts.tolist() if self._counts is not None else [self.skipped, self.consecutive, 0, 0, 0]
        skipped, self.consecutive, longest, run_start, longest_start = values
        self.first_bad_step = run_start if self.consecutive else None
        return skipped, longest, run_start, longest_start, self.consecutive

    def _check(self, trainer: pl.Trainer) -> None:
        """Read the counts (one synchronisation), warn about new skips, stop after too many in a row."""
        before = self._reported
        skipped, longest, _, longest_start, _ = self._read()
        self.skipped = self._reported = skipped
        if skipped == before:
            return
        module = trainer.lightning_module
        module.log("train/skipped_steps", float(skipped), on_step=True, on_epoch=False, sync_dist=False)
        rank_zero_warn(
            f"Non-finite loss or gradients: {skipped - before} optimizer step(s) skipped by step {trainer.global_step} "
            f"({self.consecutive} in a row now, {skipped} in all; limit {self.max_consecutive} in a row)."
        )
        if longest >= self.max_consecutive:
            raise NonFiniteLossError(
                f"Training stopped: the loss or gradients were NaN/inf for {longest} optimizer steps in a row "
                f"(steps {longest_start}..{longest_start + longest - 1}; {skipped} skipped in all). "
                "Those steps were skipped, so the weights and the last saved checkpoint are from the last finite step. "
                "Usual fixes: a lower learning rate or longer warmup, gradient clipping (trainer.gradient_clip_val), "
                "fp32 instead of 16-bit precision, or inspect the data near this step."
            )

    def state_dict(self) -> dict[str, Any]:
        if self._counts is not None:
            self.skipped = self._read()[0]
        return {"skipped": self.skipped, "consecutive": self.consecutive, "first_bad_step": self.first_bad_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.skipped = state_dict["skipped"]
        self.consecutive = state_dict["consecutive"]
        self.first_bad_step = state_dict["first_bad_step"]
        self._reported = self.skipped
        self._counts = None


def _skips_on_device(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimizer's step honours a ``found_inf`` flag on the device (torch's fused Adam, AdamW, SGD)."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False)) and bool(optimizer.defaults.get("fused"))
