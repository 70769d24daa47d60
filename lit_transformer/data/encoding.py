"""The one way text becomes model input, in training and in inference alike."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tokenizers import Tokenizer

IGNORE_INDEX = -100
"""The label of a position without a target (padding, a masked LM's unchosen tokens): torch's ignore_index."""
PIECE_CHARS = 1 << 14  # a long text is encoded in pieces of about this many characters, cut at line boundaries


def line_pieces(text: str, size: int = PIECE_CHARS) -> list[str]:
    """A long text in pieces of about `size` characters, each ending at a line boundary, so that the pieces of one
    document encode in parallel (tokenizers' encode_batch)."""
    if len(text) <= size:
        return [text]
    pieces, start = [], 0
    while start < len(text):
        end = text.find("\n", start + size)
        end = len(text) if end < 0 else end + 1
        pieces.append(text[start:end])
        start = end
    return pieces


def token_ids(tokenizer: Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """The ids of each text, without the tokenizer's own special tokens: the DataModules place BOS/EOS themselves,
    and a tokenizer with a post-processor (a Marian or BERT export) would otherwise add them a second time."""
    return [encoding.ids for encoding in tokenizer.encode_batch(list(texts), add_special_tokens=False)]


def encode_input(tokenizer: Tokenizer, text: str, *, encoder_decoder: bool, eos_token_id: int | None) -> list[int]:
    """One model input as training builds it. A translation source is its tokens then EOS. A language-model prompt
    is its tokens; an empty one is EOS alone, the document boundary that precedes every document in training."""
    ids = token_ids(tokenizer, [text])[0]
    eos = [] if eos_token_id is None else [eos_token_id]
    if encoder_decoder:
        return ids + eos
    return ids or eos


def pad_right(rows: Sequence[Sequence[int]], pad_token_id: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention_mask), both (len(rows), longest): rows padded on the right, the mask True on real tokens.

    The mask, not the filler, says what is padding; without a pad token the filler is id 0."""
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), 0 if pad_token_id is None else pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for b, row in enumerate(rows):
        ids[b, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[b, : len(row)] = True
    return ids, mask
