"""Lightning's ModelCheckpoint, whose record of a run's checkpoints survives a resume: from a moved folder, with
another saving interval, and from the last.ckpt of a validated step.

A ModelCheckpoint saves, inside each checkpoint, the absolute paths of the files it wrote (last, best, the top k) and
its folder. Resumed from a folder that was moved, copied to another machine or mounted elsewhere, Lightning's own
sees another folder and keeps none of that record but `best_model_path`: the resumed run then writes `last-v1.ckpt`
beside the `last.ckpt` it resumed from (which stays the old model, under the name every page calls the final one),
takes its first validation as the best whatever its score, and reports a best checkpoint in the old place.

Here a resume whose checkpoint lies in this callback's folder is read as the run's own folder, moved: each recorded
path of the old folder whose file is in this one is this one's. A resume from a checkpoint elsewhere (a run branched
into a new folder) is left to Lightning, which starts a new record. A record saved with another interval
(`every_n_train_steps`, part of Lightning's key for it) is this callback's too, if it watched the same metric.

And Lightning writes a step's last.ckpt at the end of its training batch, before the validation of the same step
(Lightning issues 7694, "won't fix", and 18687). The file then records the best checkpoint as it was before that
validation, while the validation writes a new best beside it: resumed from it, a run forgot that best. And a run
killed during that validation resumed from it past the validation, which Lightning takes as run: no val numbers at
that step, and for the final step no final validation at all, its best checkpoint named by an older score. Here the
save of a step that is validated waits for the end of its validation (Lightning's own deferral, which it applies to
monitored metrics only), after the other checkpoint callbacks (the CLI orders them so), so the file holds their
record; a run killed during the validation resumes from the save before it and runs it. A file written at a batch's
end before its step's validation all the same (a preemption checkpoint, a time-based interval) records the last step
validated, and a run resumed from it validates first.

Checkpoints are written where an optimizer step ends: with `accumulate_grad_batches`, a validation between the
batches of one step (a `val_check_interval` that is no multiple of it) writes no last.ckpt, as the gradients gathered
so far are in no checkpoint. And the run's final step is written at the end of training whatever the interval.
"""

from __future__ import annotations

import os
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info

from lit_transformer.checkpoints.files import load_checkpoint

_PATH_KEYS = ("best_model_path", "kth_best_model_path", "last_model_path")


class RunCheckpoint(ModelCheckpoint):
    """ModelCheckpoint whose record survives a resume (see the module's docstring); otherwise the same, and its state
    is saved under ModelCheckpoint's key, so either class resumes the other's checkpoints."""

    _resumed_from: str | None = None
    _fitting = True
    _validated_step: int | None = None  # the step of the fit's last validation (saved in the checkpoint)

    @property
    def state_key(self) -> str:
        return super().state_key.replace(type(self).__qualname__, ModelCheckpoint.__qualname__, 1)

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # Called before load_state_dict, which is given the callback's state alone.
        self._resumed_from, self._fitting = trainer.ckpt_path, trainer.state.fn == TrainerFn.FITTING
        states = checkpoint.get("callbacks")
        if self._fitting and isinstance(states, dict) and self.state_key not in states:
            # Lightning's key holds the saving interval too: resumed with another --checkpoint.every_n_train_steps,
            # its callback found no state, kept no record and wrote last-v1.ckpt beside a stale last.ckpt. The record
            # of the same metric and mode is this callback's, whatever the interval it was saved with.
            prefix = f"{ModelCheckpoint.__qualname__}{{'monitor': {self.monitor!r}, 'mode': {self.mode!r},"
            same = [key for key in states if isinstance(key, str) and key.startswith(prefix)]
            if len(same) == 1:
                states[self.state_key] = states.pop(same[0])

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        every = self._every_n_train_steps
        due = every >= 1 and trainer.global_step % every == 0 and self._last_global_step_saved != trainer.global_step
        if due and validation_follows(trainer) and optimizer_stepped(trainer):
            self._defer_save_until_validation = True  # Lightning's own flag: on_validation_end writes the files
            return
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if self._final_step_unsaved(trainer) and not validation_follows(trainer):  # else: at the validation's end
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def _final_step_unsaved(self, trainer: pl.Trainer) -> bool:
        """Whether the run stops after this step (max_steps reached; max_time or early stopping set should_stop)
        and its last.ckpt is not written yet. Written here, at the batch's (or its validation's) end, the file is a
        mid-epoch checkpoint like any other; written in on_train_end, after Lightning closed the epoch the run stopped
        in, it recorded that epoch as done: a run resumed from it to train longer counted one epoch more than a run
        never stopped (max_epochs ended it an epoch early; the dropout of every later step, seeded by epoch, differed).
        """
        # should_stop alone is no stop: before min_steps/min_epochs Lightning trains on (and the flag stays set, so
        # every later step would write last.ckpt again)
        can_stop = getattr(trainer.fit_loop, "_can_stop_early", True)
        stops = (trainer.should_stop and can_stop) or 0 < trainer.max_steps <= trainer.global_step
        fitting = trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking and not trainer.fast_dev_run
        return (
            stops
            and fitting
            and self.save_last is True
            and self._last_global_step_saved != trainer.global_step
            and optimizer_stepped(trainer)
        )

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        note = mid_step_validation_note(trainer.val_check_interval, trainer.accumulate_grad_batches)
        if note and self.monitor and trainer.global_step == 0:
            rank_zero_info(note)
        resumed = trainer.ckpt_path is not None and self.save_last is True and self._validated_step is not None
        restarted = trainer.fit_loop.epoch_loop.restarted_on_train_batch_end  # the file: written at a batch's end
        if resumed and restarted and self._validated_step != trainer.global_step and validation_follows(trainer):
            rank_zero_info(
                f"The checkpoint was written before the validation of step {trainer.global_step} (a preemption "
                "checkpoint): validating now."
            )
            self._last_global_step_saved = trainer.global_step  # the file resumed from: written again after it
            validate_within_fit(trainer)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        wrote_last = self._last_global_step_saved == trainer.global_step  # before this validation, at this step
        fitting = trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking and not trainer.fast_dev_run
        if fitting:
            self._validated_step = trainer.global_step
        super().on_validation_end(trainer, pl_module)
        # A file written before this validation (a time-based interval): written again, with its record. Not between
        # the batches of an accumulated step (see the module's docstring).
        if wrote_last and fitting and self.save_last is True and self.last_model_path and optimizer_stepped(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
        elif fitting and self._final_step_unsaved(trainer):  # the run's final step, validated
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The run's final step in last.ckpt, whatever the interval: a run whose max_steps is no multiple of
        every_n_train_steps, or that max_time, max_epochs or early stopping ended, kept the model of the last
        multiple as its "final" checkpoint, and lost the steps after it."""
        super().on_train_end(trainer, pl_module)
        newer = trainer.global_step > self._last_global_step_saved
        if self.save_last is True and newer and not trainer.fast_dev_run and optimizer_stepped(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def state_dict(self) -> dict[str, Any]:
        # -1: none yet (a file without the key predates it, and is not read as pending a validation)
        return {**super().state_dict(), "validated_step": -1 if self._validated_step is None else self._validated_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not self._fitting:  # validate, test and predict save nothing: the record is not theirs to read (or warn of)
            return
        self._validated_step = state_dict.get("validated_step")
        old, resumed = state_dict.get("dirpath"), self._resumed_from
        here = os.path.realpath(self.dirpath) if self.dirpath else None
        if old and here and old != self.dirpath and resumed and os.path.dirname(os.path.realpath(resumed)) == here:
            state_dict = moved_record(state_dict, old, self.dirpath)
        super().load_state_dict(state_dict)


def moved_record(state: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    """The callback state with each path under `old` that names a file present under `new` moved there, and `new` as
    its folder. A path whose file did not come along (only last.ckpt was copied) keeps its old place, as Lightning
    would; ModelCheckpoint deletes nothing outside its own folder."""

    def moved(path: Any) -> Any:
        if not isinstance(path, str) or not path:
            return path
        relative = os.path.relpath(path, old)
        if relative.startswith(os.pardir) or os.path.isabs(relative):
            return path
        there = os.path.join(new, relative)
        return there if os.path.isfile(there) else path

    state = {**state, "dirpath": new}
    for key in _PATH_KEYS:
        if key in state:
            state[key] = moved(state[key])
    if isinstance(state.get("best_k_models"), dict):
        state["best_k_models"] = {moved(path): score for path, score in state["best_k_models"].items()}
    return state


def recorded_best(dirpath: str | os.PathLike, monitor: str | None = None) -> str | None:
    """The best checkpoint that a run folder's last.ckpt records (`--ckpt_path best` in a new process, where no
    callback remembers one): the record of the checkpoint callback that monitors `monitor` (any that keeps a best
    when None), followed to this folder if the run's folder moved; None where there is no such file."""
    last = last_checkpoint(dirpath)
    if last is None:
        return None
    records = (load_checkpoint(last, mmap=True).get("callbacks") or {}).items()
    named = [state for key, state in records if key.startswith(f"{ModelCheckpoint.__qualname__}{{'monitor': ")]
    preferred = [s for s in named if monitor is not None and s.get("monitor", monitor) == monitor] or named
    for state in preferred:
        path = state.get("best_model_path")
        for candidate in (path, os.path.join(dirpath, os.path.basename(path or ""))):
            if path and os.path.isfile(candidate):
                return candidate
    return None


def last_checkpoint(dirpath: str | os.PathLike) -> str | None:
    """The file `--ckpt_path last` resumes from, as Lightning picks it: the newest `last*.ckpt` of the folder
    (last.ckpt, or a last-v1.ckpt that Lightning wrote beside it), a sharded one's folder too (DeepSpeed, FSDP
    sharded: left out, a run resumed with `last` started afresh without a word); None where there is none."""
    if not os.path.isdir(dirpath):
        return None
    found = [e.path for e in os.scandir(dirpath) if e.name.startswith("last") and e.name.endswith(".ckpt")]
    return max(found, key=os.path.getmtime, default=None)


def optimizer_stepped(trainer: pl.Trainer) -> bool:
    """At a training batch's end (on_train_batch_end, on_validation_end of a validation after it): whether that batch
    took an optimizer step, rather than leaving its gradients to accumulate with the next batches' (a checkpoint
    written then would lose them). Lightning's rule (the epoch loop's private `_should_accumulate`) in public
    attributes: every accumulate_grad_batches batches of the epoch, and at its last batch."""
    loop = trainer.fit_loop.epoch_loop
    progress = loop.batch_progress.current
    accumulated = progress.ready % trainer.accumulate_grad_batches == 0  # ready: this epoch's batches so far
    final = progress.ready == trainer.num_training_batches or loop.batch_progress.is_last_batch
    return accumulated or (final and not trainer.strategy.handles_gradient_accumulation)


def validation_follows(trainer: pl.Trainer) -> bool:
    """At a training batch's end: whether the fit validates after it. Lightning's rule (the epoch loop's private
    `_should_check_val_fx`) in public attributes, for batch-count intervals (a time-based `val_check_interval` is not
    read). After a resume, before training goes on, it reads the batch the checkpoint was written at."""
    if not trainer.enable_validation or trainer.sanity_checking:
        return False
    every = trainer.check_val_every_n_epoch
    if every is not None and (trainer.current_epoch + 1) % every:
        return False
    if trainer.val_dataloaders is not None and not sum(trainer.num_val_batches or [0]):
        return False
    progress = trainer.fit_loop.epoch_loop.batch_progress
    if progress.is_last_batch:
        return True
    interval = trainer.val_check_batch
    if interval is None or interval == float("inf"):
        return False
    iteration = progress.total.ready - 1 if every is None else progress.current.ready - 1
    return (iteration + 1) % int(interval) == 0


def validate_within_fit(trainer: pl.Trainer) -> None:
    """Run the fit's validation loop now (as the epoch loop runs it after a batch): its metrics are logged at this
    step, and checkpoint callbacks see its end."""
    trainer.validating = True
    try:
        trainer.fit_loop.epoch_loop.val_loop.run()
    finally:
        trainer.training = True


def mid_step_validation_note(interval: Any, accumulate: int) -> str | None:
    """Lightning counts val_check_interval in batches: with gradient accumulation, an interval that is no multiple of
    it validates between the micro-batches of one optimizer step, and a best checkpoint written then resumes
    mid-step (its step's earlier micro-batches are not in the file). The note that says so; None otherwise."""
    if not isinstance(interval, int) or isinstance(interval, bool) or accumulate <= 1 or interval % accumulate == 0:
        return None
    below, above = interval - interval % accumulate, interval - interval % accumulate + accumulate
    return (
        f"note: trainer.val_check_interval={interval} counts batches, and with accumulate_grad_batches={accumulate} "
        f"it validates inside an optimizer step (after {interval / accumulate:g} steps): a best checkpoint written "
        f"then resumes mid-step. A multiple of {accumulate} ({' or '.join(str(n) for n in (below, above) if n)}) "
        "validates between steps."
    )
