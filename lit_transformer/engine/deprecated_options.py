"""LitTransformer's arguments from before `model.optim` and `model.task`: still accepted (YAMLs, command lines and
checkpoints written with them load), each passed to its new home with a FutureWarning that names the new key."""

from __future__ import annotations

import warnings
from typing import Any, Literal

from typing_extensions import TypedDict

from lit_transformer.engine.optimizers import OPTIMIZATION_FIELDS, Optimization
from lit_transformer.engine.schedules import ScheduleName


class DeprecatedOptions(TypedDict, total=False):
    """The old flat arguments: each is now a field of model.optim (Optimization) or of the task (model.task)."""

    optimizer: Literal["adamw", "adam"]
    """Deprecated: model.optim.optimizer."""
    lr: float
    """Deprecated: model.optim.lr."""
    betas: tuple[float, float] | None
    """Deprecated: model.optim.betas."""
    eps: float | None
    """Deprecated: model.optim.eps."""
    weight_decay: float
    """Deprecated: model.optim.weight_decay."""
    decay_embeddings: bool
    """Deprecated: model.optim.decay_embeddings."""
    fused: bool | None
    """Deprecated: model.optim.fused."""
    schedule: ScheduleName
    """Deprecated: model.optim.schedule."""
    warmup_steps: int
    """Deprecated: model.optim.warmup_steps."""
    schedule_steps: int | None
    """Deprecated: model.optim.schedule_steps."""
    min_lr_ratio: float
    """Deprecated: model.optim.min_lr_ratio."""
    label_smoothing: float | None
    """Deprecated: model.task.init_args.label_smoothing (every task's)."""
    class_weights: list[float] | Literal["balanced"] | None
    """Deprecated: model.task.init_args.class_weights (the classification task's)."""
    mlm_probability: float | None
    """Deprecated: model.task.init_args.mlm_probability (the masked_lm task's)."""


DEPRECATED_NAMES = tuple(DeprecatedOptions.__annotations__)


def split_deprecated(optim: Optimization | dict | None, options: dict[str, Any]) -> tuple[Optimization, dict[str, Any]]:
    """(the run's Optimization, the task options) of LitTransformer's `optim` and its old flat arguments. A flat
    optimizer field other than its default warns (the default itself, as every old checkpoint records it, is quiet)."""
    unknown = sorted(set(options) - set(DEPRECATED_NAMES))
    if unknown:
        raise TypeError(f"LitTransformer got unexpected arguments {unknown}")
    flat = {name: options[name] for name in OPTIMIZATION_FIELDS if name in options}
    defaults = Optimization()
    for name, value in flat.items():
        if value != getattr(defaults, name):
            warnings.warn(f"model.{name} is deprecated: set model.optim.{name}", FutureWarning, stacklevel=3)
    task_options = {name: value for name, value in options.items() if name not in OPTIMIZATION_FIELDS}
    return Optimization.of(optim, **flat), task_options
