"""Masked-LM pretraining (BERT, Devlin et al. 2019): choose 15% of the real, non-special tokens as targets; of those,
80% become [MASK], 10% a random token and 10% stay as they are. The loss is taken at the chosen positions only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor

from lit_transformer.errors import ConfigError
from lit_transformer.tasks.base import Loss, Task
from lit_transformer.tasks.losses import IGNORE_INDEX, smoothed_cross_entropy


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
    """(inputs, labels) for a (B, T) batch: labels hold the original token at chosen positions and IGNORE_INDEX
    elsewhere.

    Padding (attention_mask False) and special tokens are never chosen, so a target is always a real word piece.
    The random 10% draw from the whole vocabulary, as BERT does; keeping 10% unchanged teaches the model that an
    unmasked token may also be a target, so its representation of every token stays informative.
    """
    if not 0.0 < probability < 1.0:
        raise ConfigError(f"probability={probability} must lie in (0, 1)")

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


class MaskedLM(Task):
    """An encoder_only model with the masked_lm head, on any batch of {"input_ids", "attention_mask"?}: the
    classification data's passages, or the language-model data's packed blocks (whose next-token labels it ignores).
    Training draws the corruption from torch's generator (seeded per step by StepSeed); each evaluation batch masks
    the same positions every time (a generator seeded by its index), so validations compare."""

    cannot_predict: ClassVar[str | None] = (
        "a masked LM has no labels to predict: fine-tune it into a classifier (fit --config presets/classify-genre "
        "--model.init_from THIS.ckpt, with your labelled data), then predict with that run's checkpoint"
    )

    name: ClassVar[str] = "masked_lm"
    fullgraph: ClassVar[bool] = False  # the corruption draws on a generator
    architecture: ClassVar[dict[str, str]] = {"topology": "encoder_only", "head": "masked_lm"}

    def __init__(self, label_smoothing: float = 0.0, mlm_probability: float = 0.15) -> None:
        """
        Args:
            label_smoothing: Label smoothing of the loss; perplexity is always the unsmoothed one.
            mlm_probability: The fraction of real tokens chosen as targets (BERT's 0.15; 80/10/10 rule).
        """
        super().__init__(label_smoothing)
        self.mlm_probability = mlm_probability

    def loss(self, model, batch: dict[str, Tensor], generator: torch.Generator | None = None) -> Loss:
        cfg = model.config
        tokens, mask = batch["input_ids"], batch.get("attention_mask")
        special = [
            i for i in (cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id, cfg.mask_token_id) if i is not None
        ]
        inputs, labels = mask_tokens(
            tokens,
            cfg.mask_token_id,
            cfg.vocab_size,
            probability=self.mlm_probability,
            attention_mask=mask,
            special_ids=special,
            generator=generator,
        )
        logits = model(inputs, attention_mask=mask)
        return Loss(*smoothed_cross_entropy(logits, labels, self.label_smoothing), logits, labels)

    def eval_generator(self, module: Any, batch_idx: int) -> torch.Generator:
        return torch.Generator(module.device).manual_seed(batch_idx)

    def predict(self, module: Any, batch: dict[str, Any]) -> list[dict[str, Any]]:
        raise ConfigError(self.cannot_predict)
