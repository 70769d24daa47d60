"""What every transform of the plain model shares: the ModelTransform protocol the engine calls, and the blocks that
activation checkpointing and compile wrap."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from lit_transformer.model import BLOCK_CLASSES

if TYPE_CHECKING:  # annotations only: decoding a checkpoint (generate, translate, serve) never imports Lightning
    import lightning as L


def blocks(model: nn.Module) -> list[nn.Module]:
    """Every encoder and decoder block of the model, in order."""
    return [m for m in model.modules() if isinstance(m, BLOCK_CLASSES)]


class ModelTransform:
    """A change applied to the plain model from outside that also has a part in the run around it: LoRA's adapters
    (transforms/lora.py), int8 inference (transforms/int8.py). LitTransformer calls each hook at its own of the same
    name, in order; the defaults do nothing, so a transform defines only the hooks it needs and the engine never asks
    which it holds (it receives them from `lit_transformer.transforms.build_transforms`)."""

    rereads_base = False
    """True where checkpoints hold no base weights, so loading reads init_from again (it is kept in hyperparameters)."""

    def hparams(self) -> dict[str, Any]:
        """What the hyperparameters record of this transform, as plain values (checkpoints load with weights_only)."""
        return {}

    def apply(self, module: L.LightningModule) -> None:
        """Change module.model in place, once (later calls do nothing), before checkpointing and compile wrap it."""

    def setup(self, module: L.LightningModule, stage: str) -> None:
        """At the module's setup: refuse a stage the transform cannot take (before any data is prepared)."""

    def on_fit_start(self, module: L.LightningModule) -> None: ...

    def on_fit_end(self, module: L.LightningModule) -> None: ...

    def on_save_checkpoint(self, module: L.LightningModule, checkpoint: dict[str, Any]) -> None: ...

    def on_load_checkpoint(self, module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        """Before the state dict is loaded into module: the checkpoint may be completed here."""

    def on_inference_start(self, module: L.LightningModule) -> None:
        """Once the weights are loaded, before `validate` (not the validation inside fit), `test` or `predict`."""

    def to_plain(self, module: L.LightningModule) -> None:
        """Fold the transform into plain layers (before int8 quantization swaps every Linear)."""
