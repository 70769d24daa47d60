"""The Transformer in plain PyTorch (no Lightning): config in, logits and generated tokens out."""

from lit_transformer.model.blocks import BLOCK_CLASSES, DecoderBlock, EncoderBlock
from lit_transformer.model.transformer import ENCODER_PREFIXES, Transformer

__all__ = ["BLOCK_CLASSES", "ENCODER_PREFIXES", "DecoderBlock", "EncoderBlock", "Transformer"]
