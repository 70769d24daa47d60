"""Transforms of the plain model applied from outside: the ModelTransform protocol (base.py), LoRA's adapters
(lora.py), int8 inference (int8.py), activation checkpointing and compilation.

options.py holds what a run's config says of its transforms (the option types, read by LitTransformer's signature);
`build_transforms`, which turns them into the transforms the engine applies: the engine holds them in order and
calls their hooks, never asking which it holds, and imports none of their modules. A new transform is a
ModelTransform, its option type in options.py and a line of build_transforms.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from lit_transformer.transforms.options import LoraOptions, Quantize

__all__ = ["LoraOptions", "Quantize", "build_transforms"]

if TYPE_CHECKING:
    from lit_transformer.transforms.base import ModelTransform


def build_transforms(
    lora: LoraOptions | Mapping[str, Any] | None, quantize: Quantize | None, init_from: str | None
) -> list[ModelTransform]:
    """The transforms a run's options ask for, in the order their hooks run: LoRA's adapters (on init_from's weights)
    before int8, which folds them into plain layers. None, or quantize "none", asks for nothing."""
    transforms: list[ModelTransform] = []
    if lora is not None:
        from lit_transformer.transforms.lora import LoraAdapters

        transforms.append(LoraAdapters(lora, init_from))
    if quantize not in ("none", None):
        from lit_transformer.transforms.int8 import Int8Inference

        transforms.append(Int8Inference())
    return transforms
