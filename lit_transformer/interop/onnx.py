"""ONNX export of a decoder-only model: input_ids (batch, sequence) -> logits (batch, sequence, vocab), both axes
dynamic. The graph is the plain causal forward pass (no KV cache, no padding mask: feed unpadded rows)."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import Tensor, nn

from lit_transformer.model import Transformer


class CausalLogits(nn.Module):
    """The decoder alone, without the padding-mask inference that reads token values (a data-dependent branch)."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.model.decode(input_ids)


def export_onnx(model: Transformer, path: str | os.PathLike, opset: int = 18) -> Path:
    """Write `path` (.onnx) with dynamic batch and sequence axes (sequence up to max_seq_len), via torch.export."""
    cfg = model.config
    if cfg.is_encoder_decoder:
        raise ValueError(
            "ONNX export covers decoder-only models; for the encoder-decoder use --format hf (a MarianMTModel), "
            "which Hugging Face Optimum can turn into ONNX encoder and decoder graphs"
        )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    wrapper = CausalLogits(model).eval()
    example = torch.full((2, min(8, cfg.max_seq_len)), cfg.eos_token_id or 0, dtype=torch.long)
    # Up to max_seq_len: the learned table ends there, and the sinusoidal one is traced from its cached table.
    seq = torch.export.Dim("sequence", min=1, max=cfg.max_seq_len)
    dynamic = {"input_ids": {0: torch.export.Dim("batch", min=1), 1: seq}}
    with torch.no_grad():
        program = torch.onnx.export(
            wrapper,
            (example,),
            input_names=["input_ids"],
            output_names=["logits"],
            dynamic_shapes=dynamic,
            opset_version=opset,
            dynamo=True,
            external_data=False,
        )
    program.save(os.fspath(path))
    return path
