"""What a model is trained to do: one object per task (see base.Task), chosen by `model.task` in the YAML.

`model.task` takes a short name (language_modeling, translation, classification, masked_lm) or a
{class_path, init_args} of any Task subclass; absent, the task follows from model.config (topology and head).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import types
import warnings
from typing import TYPE_CHECKING, Any

from lit_transformer.errors import ConfigError
from lit_transformer.tasks.base import Loss, Task, data_fields
from lit_transformer.tasks.captioning import Captioning
from lit_transformer.tasks.classification import Classification
from lit_transformer.tasks.language_modeling import LanguageModeling
from lit_transformer.tasks.losses import IGNORE_INDEX, check_label_smoothing
from lit_transformer.tasks.masked_lm import MaskedLM
from lit_transformer.tasks.translation import Translation

if TYPE_CHECKING:
    from lit_transformer.config import GenerationConfig, TransformerConfig

__all__ = [
    "IGNORE_INDEX",
    "TASKS",
    "Captioning",
    "Classification",
    "LanguageModeling",
    "Loss",
    "MaskedLM",
    "Task",
    "Translation",
    "build_task",
    "data_fields",
    "default_task",
    "generation_defaults",
]

TASKS: dict[str, type[Task]] = {
    cls.name: cls for cls in (LanguageModeling, Translation, Classification, MaskedLM, Captioning)
}

# The options LitTransformer took before tasks were objects, with the default each had there: a value other than that
# default is passed to the task (with a warning naming the new key); the default itself is what every old checkpoint
# records, for every task, and is dropped in silence.
DEPRECATED_OPTIONS: dict[str, Any] = {"label_smoothing": 0.0, "class_weights": None, "mlm_probability": 0.15}


def default_task(config: TransformerConfig) -> type[Task]:
    """The task of an architecture when `model.task` is not given: the built-in task whose `architecture` it has."""
    for task in TASKS.values():
        if all(getattr(config, name) == value for name, value in task.architecture.items()):
            return task
    raise ConfigError(f"no built-in task trains topology={config.topology} head={config.head}; set model.task")


def generation_defaults(config: TransformerConfig, **overrides: Any) -> GenerationConfig:
    """The decoding defaults of the task that `config`'s architecture implies (GenerationConfig.for_task)."""
    from lit_transformer.config import GenerationConfig

    return GenerationConfig.for_task(default_task(config), **overrides)


def _task_class(name: str) -> type[Task]:
    if name in TASKS:
        return TASKS[name]
    module, _, attr = name.rpartition(".")
    cls = getattr(importlib.import_module(module), attr, None) if module else None
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise ConfigError(
            f"model.task {name!r} is neither one of {sorted(TASKS)} nor the import path of a Task subclass"
        )
    return cls


def task_class_of(hparams: dict[str, Any]) -> type[Task] | None:
    """The task class a checkpoint's hyperparameters record (their `task`, else, for older checkpoints, the one their
    architecture implies); None where they say neither."""
    from lit_transformer.config import TransformerConfig

    spec = hparams.get("task")
    if spec:
        return _task_class(dict(spec)["class_path"] if isinstance(spec, dict) or hasattr(spec, "class_path") else spec)
    config = hparams.get("config")
    if config is None:
        return None
    if not isinstance(config, TransformerConfig):  # its architecture fields are all default_task reads
        defaults = {f.name: f.default for f in dataclasses.fields(TransformerConfig)}
        config = types.SimpleNamespace(**{**defaults, **dict(config)})
    return default_task(config)


def build_task(task: Task | str | dict | None, config: TransformerConfig, **deprecated: Any) -> Task:
    """The task object of `model.task` (an object, a short name or import path, or {class_path, init_args}; None:
    the architecture's default), with the deprecated LitTransformer options passed through, checked against the
    architecture."""
    if isinstance(task, Task):
        obj = task
    elif isinstance(task, dict) or hasattr(task, "class_path"):
        spec = dict(task)
        cls = _task_class(spec["class_path"])
        # Options without a task (a variant's `model.task.init_args.label_smoothing` over a config that names no task:
        # the parser fills in the base class) are options of the architecture's default task.
        obj = (default_task(config) if cls is Task else cls)(**dict(spec.get("init_args") or {}))
    else:
        obj = (_task_class(task) if task else default_task(config))()
    legacy = {k: v for k, v in deprecated.items() if v is not None and v != DEPRECATED_OPTIONS.get(k)}
    if getattr(config, "multi_label", None):  # an old config's field
        legacy["multi_label"] = True
    accepted = inspect.signature(type(obj).__init__).parameters
    for name, value in legacy.items():
        if name not in accepted:
            continue  # as before: an option of another task did nothing
        where = "model.config" if name == "multi_label" else "model"
        warnings.warn(
            f"{where}.{name} is deprecated: it is an option of the {type(obj).__name__} task; set "
            f"model.task.init_args.{name} (with model.task.class_path {obj.spec()['class_path']})",
            FutureWarning,
            stacklevel=3,
        )
        setattr(obj, name, value)
    check_label_smoothing(obj.label_smoothing)  # the deprecated flat option bypassed the task's own check
    obj.check_config(config)
    return obj
