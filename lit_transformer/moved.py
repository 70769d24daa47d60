"""Where each module of earlier releases lives now, so that what a user saved keeps resolving.

Run configs, checkpoints' hyperparameters, YAMLs and scripts name classes by module path
(`lit_transformer.callbacks.LearningRateLogger`, `lit_transformer.checkpointing.AtomicCheckpointIO`, ...). An import
of a path in MOVED gives a module whose names resolve from their new homes, in the order listed. Installed by the
package's __init__, after Python's own finders, so a real module of that name always wins.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

MOVED: dict[str, tuple[str, ...]] = {
    "lit_transformer.commands": ("lit_transformer.cli.program",),
    "lit_transformer.arguments": ("lit_transformer.cli.arguments",),
    "lit_transformer.model_commands": ("lit_transformer.cli.model_commands",),
    "lit_transformer.prepare": ("lit_transformer.cli.prepare_command",),
    "lit_transformer.export": ("lit_transformer.cli.export_command",),
    "lit_transformer.console": ("lit_transformer.cli.console",),
    "lit_transformer.module": (
        "lit_transformer.engine.lightning_module",
        "lit_transformer.engine.lightning_compat",
        "lit_transformer.engine.optimizers",
    ),
    "lit_transformer.optim": ("lit_transformer.engine.optimizers",),
    "lit_transformer.schedules": ("lit_transformer.engine.schedules",),
    "lit_transformer.deprecated": ("lit_transformer.engine.deprecated_options",),
    "lit_transformer.lightning_compat": ("lit_transformer.engine.lightning_compat",),
    "lit_transformer.callbacks": ("lit_transformer.engine.monitoring", "lit_transformer.engine.task_outputs"),
    "lit_transformer.reliability": (
        "lit_transformer.engine.gradients",
        "lit_transformer.engine.nonfinite_guard",
        "lit_transformer.engine.preemption",
        "lit_transformer.engine.step_seed",
        "lit_transformer.engine.devices",
    ),
    "lit_transformer.parallelize": (
        "lit_transformer.transforms.base",
        "lit_transformer.transforms.activation_checkpointing",
        "lit_transformer.transforms.compilation",
        "lit_transformer.engine.attention_kernels",
        "lit_transformer.engine.monitoring",
    ),
    "lit_transformer.checkpoint_file": ("lit_transformer.checkpoints.files",),
    "lit_transformer.checkpointing": ("lit_transformer.checkpoints.atomic_io", "lit_transformer.checkpoints.files"),
    "lit_transformer.averaging": ("lit_transformer.checkpoints.averaging",),
    "lit_transformer.quantization": ("lit_transformer.transforms.int8",),
    "lit_transformer.lora": ("lit_transformer.transforms.lora",),
    "lit_transformer.lora_adapters": ("lit_transformer.transforms.lora",),
    "lit_transformer.text_stream": ("lit_transformer.data.text",),
    "lit_transformer.ablate": ("lit_transformer.recipes.ablate",),
    "lit_transformer.translation_recipe": ("lit_transformer.recipes.translation_recipe",),
    "lit_transformer.digit_strips": ("lit_transformer.recipes.digit_strips",),
    "lit_transformer.docgen": ("lit_transformer.pages.docgen",),
    "lit_transformer.plots": ("lit_transformer.pages.plots",),
    "lit_transformer.model.sources": ("lit_transformer.model.encoder_inputs",),
}


class MovedModule(types.ModuleType):
    """An old module path: each name is looked up in the new homes, in order, when first asked for."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        for home in MOVED[self.__name__]:
            module = importlib.import_module(home)
            if hasattr(module, name):
                return getattr(module, name)
        raise AttributeError(
            f"module {self.__name__!r} (now {', '.join(MOVED[self.__name__])}) has no attribute {name!r}"
        )

    def __dir__(self) -> list[str]:
        return sorted({n for home in MOVED[self.__name__] for n in dir(importlib.import_module(home))})


class MovedFinder:
    """A meta path finder and loader for the paths of MOVED."""

    def find_spec(self, fullname: str, path=None, target=None):
        return importlib.util.spec_from_loader(fullname, self) if fullname in MOVED else None

    def create_module(self, spec) -> types.ModuleType:
        return MovedModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing runs: names resolve on first use."""


def install() -> None:
    if not any(isinstance(finder, MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedFinder())
