"""The former home of the encoding helpers, kept for code that imports them from here (README's ONNX example): they
live in lit_transformer.data.text."""

from .text import IGNORE_INDEX, encode_input, line_pieces, pad_right, token_ids

__all__ = ["IGNORE_INDEX", "encode_input", "line_pieces", "pad_right", "token_ids"]
