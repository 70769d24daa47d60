"""BERT's masked-LM corruption (Devlin et al. 2019): choose 15% of the real, non-special tokens as targets; of those,
80% become [MASK], 10% a random token and 10% stay as they are. The loss is taken at the chosen positions only."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

IGNORE_INDEX = -100


def mask_tokens(
    tokens: Tensor,
    mask_token_id: int,
    vocab_size: int,
    *,
    probability: float = 0.15,
    attention_mask: Tensor | None = None,
    special_ids: Sequence[int] = (),
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """(inputs, labels) for a (B, T) batch: labels hold the original token at chosen positions and -100 elsewhere.

    Padding (attention_mask False) and special tokens are never chosen, so a target is always a real word piece.
    The random 10% draw from the whole vocabulary, as BERT does; keeping 10% unchanged teaches the model that an
    unmasked token may also be a target, so its representation of every token stays informative.
    """
    if not 0.0 < probability < 1.0:
        raise ValueError(f"probability={probability} must lie in (0, 1)")

    def uniform() -> Tensor:
        return torch.rand(tokens.shape, generator=generator, device=tokens.device)

    candidates = torch.ones_like(tokens, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    if special_ids:
        candidates = candidates & ~torch.isin(tokens, torch.tensor(list(special_ids), device=tokens.device))
    chosen = (uniform() < probability) & candidates
    labels = tokens.masked_fill(~chosen, IGNORE_INDEX)
    rule = uniform()  # one draw decides mask (< 0.8), random (< 0.9) or keep
    random_ids = torch.randint(vocab_size, tokens.shape, generator=generator, device=tokens.device)
    inputs = torch.where(chosen & (rule < 0.8), torch.full_like(tokens, mask_token_id), tokens)
    inputs = torch.where(chosen & (rule >= 0.8) & (rule < 0.9), random_ids, inputs)
    return inputs, labels
