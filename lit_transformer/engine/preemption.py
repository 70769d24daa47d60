"""Signals end a run without losing work.

``PreemptionCheckpoint`` turns SIGTERM/SIGINT into "finish this batch, save ``last.ckpt``, exit 0"; before the first
optimizer step (and, with ``exit_on_signals``, from the command line's start) a signal ends the process at once.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lit_transformer.checkpoints.run_checkpoint import optimizer_stepped
from lit_transformer.engine.lightning_compat import log_step_metrics_now
from lit_transformer.errors import ConfigError


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
    ``fit --ckpt_path last`` resumes at the next batch; with ``accumulate_grad_batches``, at the end of the batch that
    completes the step (a checkpoint between its batches would lose the gradients gathered so far). With several processes, ranks agree on stopping every
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
            raise ConfigError(f"sync_every_n_batches={sync_every_n_batches} must be at least 1")
        self.dirpath = Path(dirpath)
        self.filename = filename
        self.signals = tuple(getattr(signal, name) for name in signals)
        self.sync_every_n_batches = sync_every_n_batches
        self.received: int | None = None
        self._previous: dict[int, Any] = {}
        self._trainer: pl.Trainer | None = None
        self._start_step: int | None = None  # global_step when training started (after a resume: the resumed one)
        self._stopping = False  # a signal was received (on some rank): save at the end of the next optimizer step
        self._pid = os.getpid()  # the process whose handler this is (DataLoader workers inherit it)

    @property
    def path(self) -> Path:
        return self.dirpath / self.filename

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # As early as a callback can: set-up, sanity check and the first (compiled) step run under our handler.
        self._trainer, self._start_step, self.received, self._stopping = trainer, None, None, False
        self._install()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Again here, after Lightning registered its own SIGTERM handler, so ours is the one that runs.
        self._start_step = trainer.global_step
        self._install()

    def _install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        self._pid = os.getpid()
        for signum in self.signals:
            if signum not in self._previous:
                self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._handle)

    @property
    def _stepped(self) -> bool:
        """Whether this run took an optimizer step, so that a checkpoint would hold something new."""
        trainer, start = self._trainer, self._start_step
        return trainer is not None and start is not None and trainer.global_step > start

    def _handle(self, signal_number: int, frame: Any) -> None:
        if os.getpid() != self._pid:  # a DataLoader worker forked with our handler: the main process saves and stops
            return
        self._on_signal(signal_number, frame)

    def _on_signal(self, signum: int, frame: Any) -> None:
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
        stop = self._stopping or self.received is not None
        if trainer.world_size > 1 and not self._stopping:
            if (batch_idx + 1) % self.sync_every_n_batches:
                return  # every rank skips the same batches, so all meet at the same collectives
            stop = trainer.strategy.reduce_boolean_decision(stop, all=False)
        if not stop:
            return
        self._stopping = True  # agreed: every rank saves at the same batch, the first that ends a step
        if not optimizer_stepped(trainer):
            return  # between batches of an accumulated step: its gradients so far are in no checkpoint
        name = signal.Signals(self.received).name if self.received is not None else "a signal on another rank"
        self._record_as_last(trainer)
        trainer.save_checkpoint(self.path, weights_only=False)
        log_step_metrics_now(trainer)  # this step's train/loss and the rest, which Lightning logs after this hook
        rank_zero_info(f"Received {name}: saved {self.path} at step {trainer.global_step}; exiting.")
        self._restore_handlers()
        raise SIGTERMException(0)  # a SystemExit: Lightning tears down cleanly and the process exits with status 0

    def _record_as_last(self, trainer: pl.Trainer) -> None:
        """The checkpoint callback whose last.ckpt this file is records it as its own, in the file too: resumed from
        a preemption before the callback's first save, Lightning found a last.ckpt outside its record and wrote the
        run's later ones as last-v1.ckpt, leaving last.ckpt (the final model, say the pages) at the preempted step."""
        for callback in trainer.checkpoint_callbacks:
            if getattr(callback, "save_last", None) and getattr(callback, "dirpath", None):
                name = f"{callback.CHECKPOINT_NAME_LAST}{callback.FILE_EXTENSION}"
                if os.path.abspath(os.path.join(callback.dirpath, name)) == os.path.abspath(self.path):
                    callback.last_model_path = str(self.path)

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
