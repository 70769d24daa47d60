"""LoRA in a training run: the component LitTransformer applies from outside (a ModelTransform, see parallelize.py).

lora.py holds LoRA on a model (adapters in and merged, checkpoints cut and completed); this module adds what a run
does with it: adapters in at configure_model, the parameter and size reports, checkpoints cut on save and completed on
load. It reads the base through interop/pretrained.py, which itself reads LoRA checkpoints through lora.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lit_transformer.lora import (
    LoraOptions,
    apply_lora,
    complete_checkpoint,
    count,
    describe,
    fingerprint,
    merged,
    options_dict,
    report_checkpoint,
    strip_checkpoint,
)
from lit_transformer.parallelize import ModelTransform


class LoraAdapters(ModelTransform):
    """All that LoRA does in a run, applied to LitTransformer's model from outside (see ModelTransform): adapters in,
    the rest frozen (configure_model); the parameter report (fit start) and the checkpoint's size (fit end); a
    checkpoint cut to what trains plus the base's fingerprint (save), completed from the base read again (load)."""

    rereads_base = True

    def __init__(self, options: LoraOptions | Mapping[str, Any], base: str | None) -> None:
        """`base`: the init_from the adapters adapt; it must exist (a checkpoint's base that moved, or a typo)."""
        from lit_transformer.interop.pretrained import locate_lora_base

        self.options = LoraOptions.of(options)
        if not base:
            raise ValueError(
                "model.lora adapts pretrained weights: give them with --model.init_from (a Hugging Face GPT-2, Llama or "
                "Marian folder, or a .ckpt of ours)"
            )
        locate_lora_base(base, None, "model.lora", "--model.init_from PATH (load_from_checkpoint(..., init_from=PATH))")
        self.base = base
        self.keys: list[str] = []  # state-dict keys (model-relative) of what trains, once applied
        self.record: dict[str, Any] | None = None  # the base's init_from and fingerprint, the counts, once applied

    @classmethod
    def given(cls, options: LoraOptions | Mapping[str, Any] | None, base: str | None) -> list[LoraAdapters]:
        """[the component] where `options` (LitTransformer's `lora`) ask for LoRA; [] where they are None."""
        return [] if options is None else [cls(options, base)]

    def hparams(self) -> dict[str, Any]:
        return {"lora": options_dict(self.options)}

    def apply(self, module: Any) -> None:
        if self.record is not None:
            return
        from lit_transformer.interop.pretrained import new_parameters

        self.keys = apply_lora(module.model, self.options, new_parameters(module.model, self.base))
        trainable, total = count(module.model)
        self.record = {"base": self.base, "fingerprint": fingerprint(module.model),
                       "trainable_params": trainable, "total_params": total}  # fmt: skip

    def on_fit_start(self, module: Any) -> None:
        if module.trainer.is_global_zero:
            print("LoRA: " + describe(*count(module.model), self.record), flush=True)

    def on_fit_end(self, module: Any) -> None:
        if self.record is not None and module.trainer.is_global_zero:
            report_checkpoint(module.trainer, self.record)

    def on_save_checkpoint(self, module: Any, checkpoint: dict[str, Any]) -> None:
        if self.record is not None:  # the adapters and extras only, and the base they belong to
            strip_checkpoint(checkpoint, self.keys, self.record, prefix="model.")

    def on_load_checkpoint(self, module: Any, checkpoint: dict[str, Any]) -> None:
        """The base tensors, loaded again from init_from, if they are the adapters' base."""
        self.apply(module)
        complete_checkpoint(checkpoint, module.state_dict(), self.record["fingerprint"], base=self.base)

    def to_plain(self, module: Any) -> None:
        if self.record is not None:  # int8 layers take plain Linear weights: the adapters merged in
            merged(module.model)
