"""Training that survives trouble: non-finite losses, preemption signals, exact randomness on resume, device checks.

Each piece is a Lightning callback (or a plain function for the CLI) that works on its own:

- ``NonFiniteLossGuard`` skips optimizer steps whose gradients are NaN/inf, counts and logs them, and stops the run
  with a clear error after ``max_consecutive`` in a row; the weights never take a non-finite step.
- ``PreemptionCheckpoint`` turns SIGTERM/SIGINT into "finish this batch, save ``last.ckpt``, exit 0"; before the first
  optimizer step (and, with ``exit_on_signals``, from the command line's start) a signal ends the process at once.
- ``StepSeed`` reseeds python, numpy and torch from (seed, epoch, batch, rank) before every training batch, so dropout
  after a resume is exactly what it would have been, whatever consumed random numbers in between.
- ``gradient_norm`` is the step's total gradient norm, computed once and shared by the guard, logging and clipping
  (``clip_gradients``).
- ``check_device_options`` refuses GPU-only options on a machine without a GPU, naming the option and the fix.
- ``lost_peer_message`` turns a collective that failed because another rank died or hung into one line (which rank,
  how to resume); ``resume_after_restart`` resumes a run under torchrun --max-restarts from its last checkpoint.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn
from weakref import WeakKeyDictionary

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lit_transformer.lightning_compat import collective_timeout

_NORMS: WeakKeyDictionary[torch.optim.Optimizer, tuple[int, torch.Tensor]] = WeakKeyDictionary()


def _torch_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer a LightningOptimizer wraps (or `optimizer` itself)."""
    return optimizer.optimizer if isinstance(optimizer, LightningOptimizer) else optimizer


def gradient_norm(trainer: pl.Trainer, optimizer: torch.optim.Optimizer) -> torch.Tensor:
    """The L2 norm of every gradient ``optimizer`` steps with, computed once per optimizer step and then reused.

    Ask for it between the backward and the step (on_before_optimizer_step, gradient clipping): it is the norm before
    clipping. Under sharding each rank holds pieces: FSDP's root module reduces the norm over its ranks (hybrid
    sharding included), and DTensor gradients (FSDP2, tensor parallelism) over their mesh. DDP's gradients are whole
    on every rank once all-reduced, so the local norm is the global one.
    """
    optimizer = _torch_optimizer(optimizer)
    cached = _NORMS.get(optimizer)
    if cached is not None and cached[0] == trainer.global_step:
        return cached[1]
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.tensor import DTensor

    root = getattr(trainer.strategy, "model", None)
    if isinstance(root, FullyShardedDataParallel):
        norm = root.clip_grad_norm_(float("inf"))  # a collective; with an infinite limit it only measures
    else:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
    _NORMS[optimizer] = (trainer.global_step, norm)
    return norm


def clip_gradients(
    trainer: pl.Trainer, optimizer: torch.optim.Optimizer, clip_val: float | None, algorithm: str | None
) -> bool:
    """Clip as LightningModule.configure_gradient_clipping would, where Lightning cannot; False: Lightning's own.

    Norm clipping uses the step's one gradient norm (see gradient_norm), which is the global norm under FSDP too,
    where Lightning refuses norm clipping; value clipping and fp16 with an unscaling optimizer go to Lightning.
    """
    from lightning.pytorch.plugins.precision import MixedPrecision, Precision
    from lightning.pytorch.utilities import GradClipAlgorithmType

    algorithm = GradClipAlgorithmType(algorithm or GradClipAlgorithmType.NORM)
    plugin = trainer.precision_plugin
    scaler = getattr(plugin, "scaler", None)
    # A fused Adam/AdamW unscales fp16 gradients inside its step (what Lightning's private
    # _optimizer_handles_unscaling tests); `defaults["fused"]` is torch's public record of that choice.
    unscales_itself = scaler is not None and bool(optimizer.defaults.get("fused"))
    if clip_val and algorithm == GradClipAlgorithmType.NORM and not unscales_itself:
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        torch.nn.utils.clip_grads_with_norm_(params, clip_val, gradient_norm(trainer, optimizer))
        return True
    if clip_val and isinstance(plugin, MixedPrecision) and scaler is None:
        # bf16 autocast has no loss scaler, so clipping before a fused step is exact; Lightning's mixed-precision
        # plugin refuses any fused optimizer, so clip with the plain precision plugin's code.
        Precision.clip_gradients(plugin, optimizer, clip_val, algorithm)
        return True
    return False


class NonFiniteLossError(RuntimeError):
    """Training produced non-finite losses/gradients too many optimizer steps in a row."""


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
            raise ValueError(f"max_consecutive={max_consecutive} must be at least 1")
        if check_every_n_steps is not None and check_every_n_steps < 1:
            raise ValueError(f"check_every_n_steps={check_every_n_steps} must be at least 1 (or None)")
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
        torch_optimizer = _torch_optimizer(optimizer)
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


class SignalExit(SystemExit):
    """A signal ended the process before there was anything to save: exit status 128 + the signal's number, as a
    shell reports a process that the signal killed."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


def _say(message: str) -> None:
    # os.write, not print: a signal handler may interrupt a print to the same stream (a reentrant call fails).
    os.write(2, (message + "\n").encode())


def _stop_now(signum: int, when: str) -> NoReturn:
    _say(
        f"Received {signal.Signals(signum).name} {when}: stopping now, nothing to save yet "
        "(a preemption checkpoint is written only once an optimizer step has run)."
    )
    raise SignalExit(signum)


def _end_at_once(signum: int) -> None:
    """Give the signals back to the operating system, so the next one ends the process at once (even while it runs C
    code, where a Python handler would wait for the interpreter)."""
    for other in (signal.SIGTERM, signal.SIGINT, signum):
        signal.signal(other, signal.SIG_DFL)


def _exit_now(signum: int, frame: Any) -> None:
    _end_at_once(signum)
    _stop_now(signum, "before training started")


@contextmanager
def exit_on_signals(signals: tuple[str, ...] = ("SIGTERM", "SIGINT")) -> Iterator[None]:
    """Inside, until training starts (argument parsing, tokenizer training, data preparation), a signal ends the
    process within seconds with a message (exit status 128 + signum), and a second one at once.

    Without it SIGTERM kills the process where it stands, orphaning the data preparation's worker processes, and
    Ctrl-C becomes a KeyboardInterrupt that Lightning answers by ignoring further Ctrl-Cs while it shuts down.
    `PreemptionCheckpoint` takes the signals over while the trainer runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    numbers = [getattr(signal, name) for name in signals]
    previous = {signum: signal.getsignal(signum) for signum in numbers}
    for signum in numbers:
        signal.signal(signum, _exit_now)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            if signal.getsignal(signum) is _exit_now:  # not after a signal (then the OS has them: see _end_at_once)
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def _call_previous(handler: Any, signum: int, frame: Any) -> None:
    if callable(handler):
        handler(signum, frame)
    elif handler != signal.SIG_IGN:  # SIG_DFL (or a handler not set from Python): what the OS does
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)


class PreemptionCheckpoint(Callback):
    """On SIGTERM or SIGINT: finish the current batch, save ``dirpath/filename``, and exit cleanly (status 0).

    Before the first optimizer step of the run (data preparation, model set-up, the first step being compiled) there
    is nothing to save and no step boundary may come for minutes: a signal then ends the process within seconds,
    with a message and exit status 128 + signum. After it, the handler only sets a flag, so a save in progress is
    never cut. A second signal ends the process at once, whatever it is doing.
    The checkpoint is written at the end of a training batch, the same point ``ModelCheckpoint`` saves at, so
    ``fit --ckpt_path last`` resumes at the next batch. With several processes, ranks agree on stopping every
    ``sync_every_n_batches`` batches (one tiny all-reduce, which makes the host wait for the GPU: not every batch), so a
    signal that reaches only one rank still stops all of them at the same step, at most that many batches later.
    Lightning's own SIGTERM handling is replaced while training runs (SLURM's SIGUSR1 requeue is left alone).
    """

    def __init__(
        self,
        dirpath: str | Path,
        filename: str = "last.ckpt",
        signals: tuple[str, ...] = ("SIGTERM", "SIGINT"),
        sync_every_n_batches: int = 10,
    ):
        """
        Args:
            dirpath: The checkpoint folder (the CLI links it to --checkpoint.dirpath).
            filename: The checkpoint's name in it; last.ckpt is what `--ckpt_path last` resumes.
            signals: Names of the signals that save and stop.
            sync_every_n_batches: With several processes, how often ranks agree on stopping (a collective).
        """
        if sync_every_n_batches < 1:
            raise ValueError(f"sync_every_n_batches={sync_every_n_batches} must be at least 1")
        self.dirpath = Path(dirpath)
        self.filename = filename
        self.signals = tuple(getattr(signal, name) for name in signals)
        self.sync_every_n_batches = sync_every_n_batches
        self.received: int | None = None
        self._previous: dict[int, Any] = {}
        self._trainer: pl.Trainer | None = None
        self._start_step: int | None = None  # global_step when training started (after a resume: the resumed one)

    @property
    def path(self) -> Path:
        return self.dirpath / self.filename

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # As early as a callback can: set-up, sanity check and the first (compiled) step run under our handler.
        self._trainer, self._start_step, self.received = trainer, None, None
        self._install()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Again here, after Lightning registered its own SIGTERM handler, so ours is the one that runs.
        self._start_step = trainer.global_step
        self._install()

    def _install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in self.signals:
            if signum not in self._previous:
                self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._handle)

    @property
    def _stepped(self) -> bool:
        """Whether this run took an optimizer step, so that a checkpoint would hold something new."""
        trainer, start = self._trainer, self._start_step
        return trainer is not None and start is not None and trainer.global_step > start

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received is not None:
            _call_previous(signal.SIG_DFL, signum, frame)  # a second signal: end at once
            return
        if self._trainer is None:  # a run that ended without restoring us (Lightning re-installs what it found)
            _call_previous(self._previous.get(signum), signum, frame)
            return
        self.received = signum
        _end_at_once(signum)
        if not self._stepped:
            _stop_now(signum, "before the first optimizer step")
        _say(f"Received {signal.Signals(signum).name}: saving {self.path} after this step, then exiting "
             "(a second signal ends the process at once).")  # fmt: skip

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        stop = self.received is not None
        if trainer.world_size > 1:
            if (batch_idx + 1) % self.sync_every_n_batches:
                return  # every rank skips the same batches, so all meet at the same collectives
            stop = trainer.strategy.reduce_boolean_decision(stop, all=False)
        if not stop:
            return
        name = signal.Signals(self.received).name if self.received is not None else "a signal on another rank"
        trainer.save_checkpoint(self.path)
        rank_zero_info(f"Received {name}: saved {self.path} at step {trainer.global_step}; exiting.")
        self._restore_handlers()
        raise SIGTERMException(0)  # a SystemExit: Lightning tears down cleanly and the process exits with status 0

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._restore_handlers()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._restore_handlers()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._restore_handlers()  # again: Lightning's teardown re-installed the handlers it found (ours)
        self._previous = {}

    def _restore_handlers(self) -> None:
        """Give the signals back to the handlers found at set-up; after a signal, leave them to the OS (see
        _end_at_once), so a second one still ends the process at once."""
        self._trainer = None
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, handler in self._previous.items():
            if self.received is None and signal.getsignal(signum) == self._handle:
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


class StepSeed(Callback):
    """Reseed python, numpy and torch before every training batch from (seed, epoch, batch index, global rank).

    Lightning checkpoints hold no random-number state, and anything between two batches (a validation loader's
    iterator, a logger) may draw random numbers; reseeding per batch makes dropout a pure function of the batch's
    position, so a resumed run draws exactly the masks the uninterrupted run drew. Ranks get different streams.
    The data order must not come from these global generators: shuffle with a generator seeded by (seed, epoch).
    """

    def __init__(self, seed: int | None = None) -> None:
        self.seed = seed

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.seed is None:
            self.seed = int(os.environ.get("PL_GLOBAL_SEED", torch.initial_seed()))

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        seed = step_seed(self.seed or 0, trainer.current_epoch, batch_idx, trainer.global_rank)
        random.seed(seed)
        np.random.seed(seed % 2**32)
        # What torch.manual_seed does for the generators a run uses, without its per-call stack capture for every
        # backend not yet initialised (XPU, MTIA: measured ~0.5 ms of host time per step).
        torch.default_generator.manual_seed(seed)
        if torch.cuda.is_initialized():
            torch.cuda.manual_seed_all(seed)

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.seed = state_dict["seed"]


def step_seed(seed: int, epoch: int, batch_idx: int, rank: int) -> int:
    """A 63-bit seed that differs for every (seed, epoch, batch, rank); stable across processes and versions."""
    digest = hashlib.blake2b(f"{seed}/{epoch}/{batch_idx}/{rank}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class DeviceOptionError(ValueError):
    """An option needs hardware this machine lacks."""


_GPU_ONLY_STRATEGIES = ("fsdp", "deepspeed")
_SLOW_ON_CPU_PRECISIONS = ("16-mixed", "bf16-mixed", "16-true", "bf16-true", "16", "bf16", 16)


def check_device_options(accelerator: Any = "auto", strategy: Any = "auto", precision: Any = None) -> None:
    """Fail fast, naming the option and the fix, when a GPU-only option meets a machine without a GPU.

    16-bit precision on CPU is allowed but warned about: it runs, far slower than fp32 (measured ~40x for bf16).
    """
    has_gpu = torch.cuda.is_available()
    accelerator_name = str(accelerator).lower()
    if accelerator_name in ("gpu", "cuda") and not has_gpu:
        raise DeviceOptionError(
            f"trainer.accelerator={accelerator!r} needs a CUDA GPU, and this machine has none "
            "(torch.cuda.is_available() is False). Use --trainer.accelerator=cpu (or auto)."
        )
    on_cpu = accelerator_name == "cpu" or not has_gpu
    if not on_cpu:
        return
    strategy_name = strategy if isinstance(strategy, str) else type(strategy).__name__
    if any(name in str(strategy_name).lower() for name in _GPU_ONLY_STRATEGIES):
        raise DeviceOptionError(
            f"trainer.strategy={strategy_name!r} needs a GPU accelerator, and this run is on CPU. "
            "Use --trainer.strategy=ddp (several CPU processes, gloo backend) or auto, or run on a CUDA machine."
        )
    if precision in _SLOW_ON_CPU_PRECISIONS:
        warnings.warn(
            f"trainer.precision={precision!r} on CPU runs but is far slower than fp32 (bf16 matmuls measured ~40x "
            "slower here; 16-mixed falls back to bf16). Use --trainer.precision=32-true on CPU.",
            stacklevel=2,
        )


# ---------------------------------------------------------------------------------------------------- lost peers

# What gloo, NCCL and the c10d store say when the other end of a collective died (its sockets closed) or hung (no
# answer within the process group's timeout).
_PEER_DIED = re.compile(r"Connection (reset|closed) by peer|Broken pipe|Connection refused|remote process exited", re.I)
_PEER_HUNG = re.compile(
    r"Timed out waiting|timeout caused pair closure|collective operation timeout|Timed out initializing", re.I
)
_PROBE = "lit_transformer/alive"


def lost_peer_message(error: BaseException, trainer: pl.Trainer, probe_s: float = 5.0) -> str | None:
    """One line for a collective that failed because another rank died or hung: which rank, and how to resume;
    None when `error` is anything else (or there is no process group), so that it is raised as it was.

    With two ranks the lost one is the other; with more, the survivors check in through the rendezvous store for
    `probe_s` seconds and those that do not are named."""
    import torch.distributed as dist

    if not isinstance(error, RuntimeError) or not (dist.is_available() and dist.is_initialized()):
        return None
    text = str(error)
    died = bool(_PEER_DIED.search(text))
    if not died and not _PEER_HUNG.search(text):
        return None
    rank, world = dist.get_rank(), dist.get_world_size()
    if world < 2:
        return None
    lost = [1 - rank] if world == 2 else _silent_ranks(rank, world, probe_s)
    per_node = max(1, trainer.num_devices)
    if lost is None:
        who = "the rendezvous host (rank 0, node 0)"
    elif lost:
        who = ", ".join(f"rank {r} (node {r // per_node})" for r in lost)
    else:
        who = "a peer"
    timeout = collective_timeout(trainer.strategy)
    why = (
        "its connection closed (the process or its node died)"
        if died
        else "no answer within the collective timeout"
        + (f" (--collective_timeout {timeout.total_seconds():g} s)" if timeout is not None else "")
        + ": it hung, was stopped or is unreachable"
    )
    last = _last_checkpoint(trainer)
    if last is None:
        resume = "No checkpoint was saved yet: run the same command again on every node"
    elif _torchrun_restarts():
        resume = f"While --max-restarts allows, torchrun restarts the workers and they resume from {last} by themselves"
    else:
        resume = f"To resume from {last}, run the same command again on every node with --ckpt_path last"
    return f"Lost {who} of {world} at step {trainer.global_step}: {why}. {resume}."


def _silent_ranks(rank: int, world: int, probe_s: float) -> list[int] | None:
    """The ranks that do not check in through the default store within `probe_s` seconds; None when the store itself
    is gone (its host, global rank 0's process or torchrun's agent on node 0, went with it)."""
    from torch.distributed import distributed_c10d

    try:
        store = distributed_c10d._get_default_store()
        store.set_timeout(timedelta(seconds=probe_s))
        store.set(f"{_PROBE}/{rank}", "1")
        others = [r for r in range(world) if r != rank]
        deadline = time.monotonic() + probe_s
        while True:
            missing = [r for r in others if not store.check([f"{_PROBE}/{r}"])]
            if not missing or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        store.set(f"{_PROBE}/{rank}/done", "1")
        if rank == 0:  # the store may live in this process: let the others read their answer before it exits
            for r in others:
                if r not in missing:
                    while not store.check([f"{_PROBE}/{r}/done"]) and time.monotonic() < deadline + probe_s:
                        time.sleep(0.2)
        return missing
    except (RuntimeError, ValueError):  # the store does not answer: its host is gone
        return None


def _last_checkpoint(trainer: pl.Trainer) -> Path | None:
    """The last.ckpt of the run's checkpointers, if one was written."""
    for callback in trainer.checkpoint_callbacks:
        if getattr(callback, "dirpath", None) and (path := Path(callback.dirpath) / "last.ckpt").is_file():
            return path
    return None


def _torchrun_restarts() -> bool:
    """Whether torchrun started this worker with --max-restarts above 0."""
    return int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0) > 0


def resume_after_restart(ckpt_path: str | None, dirpath: str | Path | None) -> str | None:
    """The checkpoint a fit resumes from: "last" when torchrun may restart the workers (--max-restarts above 0), no
    checkpoint was asked for and the run's checkpoint folder holds a last.ckpt; else `ckpt_path` as given.

    Not TORCHELASTIC_RESTART_COUNT > 0: torchrun counts only the restarts of a node whose own worker failed (a node
    restarted because another left keeps its count), so the nodes would disagree on whether to resume. The run's
    own last.ckpt is what every node sees alike; a new run under --max-restarts needs a new checkpoint folder."""
    if ckpt_path is not None or not dirpath or not _torchrun_restarts():
        return ckpt_path
    last = Path(dirpath) / "last.ckpt"
    if not last.is_file():
        return ckpt_path
    count = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    rank_zero_info(f"torchrun --max-restarts (restart {count} on this node): resuming from {last} (--ckpt_path last).")
    return "last"
