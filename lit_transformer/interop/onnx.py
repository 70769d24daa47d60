"""ONNX export of a decoder-only model: input_ids (batch, sequence) -> logits (batch, sequence, vocab), both axes
dynamic. The graph is the plain causal forward pass (no KV cache, no padding mask: feed unpadded rows).

An encoder-only model exports as input_ids and attention_mask (batch, sequence) -> logits: (batch, num_labels) for a
classifier, (batch, sequence, vocab) for a masked LM; the mask is an input, so padded batches run as in PyTorch.
`vocab` is the true vocabulary: a padded output layer (pad_vocab_to_multiple_of) is sliced inside the graph."""

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


class EncoderLogits(nn.Module):
    """The encoder-only forward with the attention mask always applied (no branch on whether it pads anything)."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.model.encoder_only(input_ids, attention_mask)


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
    encoder = cfg.is_encoder_only
    wrapper = (EncoderLogits(model) if encoder else CausalLogits(model)).eval()
    # Up to max_seq_len (one less when a [CLS] is prepended): the learned table ends there, and the sinusoidal one is
    # traced from its cached table.
    longest = cfg.max_seq_len - (cfg.is_classifier and cfg.pooling == "cls")
    example = torch.full((2, min(8, longest)), cfg.eos_token_id or 0, dtype=torch.long)
    axes = {0: torch.export.Dim("batch", min=1), 1: torch.export.Dim("sequence", min=1, max=longest)}
    args: tuple[Tensor, ...] = (example,)
    names = ["input_ids"]
    dynamic = {"input_ids": axes}
    if encoder:
        args += (torch.ones_like(example, dtype=torch.bool),)
        names.append("attention_mask")
        dynamic["attention_mask"] = axes
    with torch.no_grad():
        program = torch.onnx.export(
            wrapper,
            args,
            input_names=names,
            output_names=["logits"],
            dynamic_shapes=dynamic,
            opset_version=opset,
            dynamo=True,
            external_data=False,
        )
    program.save(os.fspath(path))
    return path
