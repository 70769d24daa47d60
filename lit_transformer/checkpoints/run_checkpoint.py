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
(Lightning issues 7694, "won't fix", and 18687): the file then records the best checkpoint as it was before that
validation, while the validation writes a new best beside it. Resumed from it, a run forgot that best: the file stayed
on disk outside the record, and later validations were compared with the older, worse score. Every preset validates
at steps where last.ckpt is written. Here last.ckpt is written again once that validation is over (one more write
per such validation), after the other checkpoint callbacks (the CLI orders them so), so it holds their record.
"""

from __future__ import annotations

import os
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn

from lit_transformer.checkpoints.files import load_checkpoint

_PATH_KEYS = ("best_model_path", "kth_best_model_path", "last_model_path")


class RunCheckpoint(ModelCheckpoint):
    """ModelCheckpoint whose record survives a resume (see the module's docstring); otherwise the same, and its state
    is saved under ModelCheckpoint's key, so either class resumes the other's checkpoints."""

    _resumed_from: str | None = None
    _fitting = True

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

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        wrote_last = self._last_global_step_saved == trainer.global_step  # before this validation, at this step
        super().on_validation_end(trainer, pl_module)
        fitting = trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking and not trainer.fast_dev_run
        if wrote_last and fitting and self.save_last is True and self.last_model_path:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not self._fitting:  # validate, test and predict save nothing: the record is not theirs to read (or warn of)
            return
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
    (last.ckpt, or a last-v1.ckpt that Lightning wrote beside it); None where there is none."""
    if not os.path.isdir(dirpath):
        return None
    found = [
        e.path for e in os.scandir(dirpath) if e.is_file() and e.name.startswith("last") and e.name.endswith(".ckpt")
    ]
    return max(found, key=os.path.getmtime, default=None)
