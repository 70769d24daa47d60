"""Translation: source and target inputs, the right-padding check, BLEU with its signature, beam-searched samples."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch

from lit_transformer.config import TRANSLATION_DECODING
from lit_transformer.data.text import encode_input
from lit_transformer.tasks.base import STAGES, Task, generated_rows, log_reduced, token_labels


def check_right_padded(mask: torch.Tensor) -> None:
    """Refuse target masks with padding anywhere but on the right: training attends targets with is_causal alone."""
    mask = mask.bool()
    if not bool((mask[:, 1:] <= mask[:, :-1]).all()):
        raise ValueError(
            "tgt_mask pads targets on the left or in the middle; translation training attends targets causally with no "
            "mask, which is exact only for right padding. Pad target rows on the right (as TranslationDataModule does)."
        )


def _real_tokens(batch: dict[str, Any], key: str, mask_key: str, pad: int | None) -> torch.Tensor:
    """The first row's real tokens: where its mask is True, else (a batch without masks) its ids other than pad."""
    ids, mask = batch[key][0], batch.get(mask_key)
    if mask is not None:
        return ids[mask[0].bool()]
    return ids if pad is None else ids[ids != pad]


class Translation(Task):
    """An encoder-decoder model on {"src", "src_mask", "tgt_in", "tgt_mask"?, "labels"} batches; validation and test
    batches with "ref_text" are also translated and scored by BLEU (validation: the DataModule's bleu_samples)."""

    name: ClassVar[str] = "translation"
    reads: ClassVar[tuple[str, ...]] = ("bleu_samples",)
    command: ClassVar[str | None] = "translate"
    generation_defaults: ClassVar[dict[str, Any]] = TRANSLATION_DECODING
    architecture: ClassVar[dict[str, str]] = {"topology": "encoder_decoder", "source": "tokens"}

    def __init__(self, label_smoothing: float = 0.0) -> None:
        """
        Args:
            label_smoothing: Label smoothing of the loss (the paper's 0.1); perplexity is always the unsmoothed one.
        """
        super().__init__(label_smoothing)
        self._bleu_samples: int | None = None
        self._bleu_budget: int | None = None

    def attach(self, module: Any, data: dict[str, Any]) -> None:
        super().attach(module, data)
        self._bleu_samples = data.get("bleu_samples")

    def build_metrics(self, config) -> None:
        from lit_transformer.tasks.corpus_bleu import CorpusBLEU  # torchmetrics: seconds of imports a model's use lacks

        super().build_metrics(config)
        for stage in STAGES:
            setattr(self, f"{stage}_bleu", CorpusBLEU(tokenize="13a"))

    def tokens(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return batch["tgt_in"]

    def logits(self, model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        # Targets are padded on the right (TranslationDataModule's layout, checked once by check_batch): under causal
        # attention no real position sees a padded one, and padded positions have no label, so is_causal alone is
        # exact there and keeps the fastest attention kernels; the source keeps its mask.
        return model(batch["src"], batch["tgt_in"], src_mask=batch["src_mask"])

    def check_batch(self, batch: dict[str, torch.Tensor]) -> None:
        if batch.get("tgt_mask") is not None:
            check_right_padded(batch["tgt_mask"])  # one read of the device, on the first batch only

    def epoch_start(self, module: Any, stage: str) -> None:
        if stage == "val":
            self._bleu_budget = self._bleu_samples

    def evaluate(self, module: Any, stage: str, batch: dict[str, Any], batch_idx: int):
        out = super().evaluate(module, stage, batch, batch_idx)
        if "ref_text" not in batch or (stage == "val" and self._bleu_budget == 0):
            return out
        # Validation: BLEU on the first bleu_samples pairs (the DataModule's setting), as beam search is slow.
        budget = self._bleu_budget if stage == "val" else None
        rows = len(batch["ref_text"]) if budget is None else min(budget, len(batch["ref_text"]))
        translations = module.generate_text(batch["src"][:rows], batch["src_mask"][:rows])
        getattr(self, f"{stage}_bleu").update(translations, [[r] for r in batch["ref_text"][:rows]])
        if budget is not None:
            self._bleu_budget = budget - rows
        return out

    def epoch_end(self, module: Any, stage: str) -> None:
        super().epoch_end(module, stage)
        bleu = getattr(self, f"{stage}_bleu", None)
        if bleu is not None and bleu.update_called:
            log_reduced(module, f"{stage}/bleu", bleu.compute() * 100, prog_bar=True)
            self._log_bleu_signature(module, stage, bleu.signature)
            bleu.reset()

    @staticmethod
    def _log_bleu_signature(module: Any, stage: str, signature: str | None) -> None:
        """sacreBLEU's signature beside the score, so a reported BLEU says how it was computed."""
        for logger in module.loggers:
            if signature and module.trainer.is_global_zero and hasattr(logger.experiment, "add_text"):
                logger.experiment.add_text(f"{stage}/bleu_signature", signature, module.global_step)

    def predict(self, module: Any, batch: dict[str, Any]) -> list[dict[str, Any]]:
        return generated_rows(module, batch)

    @classmethod
    def encode_input(cls, tokenizer, text: str, eos_token_id: int | None) -> list[int]:
        """A source sentence: its tokens, then EOS."""
        return encode_input(tokenizer, text, encoder_decoder=True, eos_token_id=eos_token_id)

    def samples(self, module: Any, callback: Any, first_batch: Callable[[], dict | None]) -> list[str]:
        """The first validation sources, translated as BLEU translates them, beside their references."""
        batch = first_batch()
        n = callback.num_translations
        if batch is None or "src_text" not in batch or n <= 0:
            return []
        outputs = module.generate_text(batch["src"][:n].to(module.device), batch["src_mask"][:n].to(module.device))
        refs = batch.get("ref_text", [""] * len(outputs))
        return [f"source: {s}\n\nmodel: {o}\n\nreference: {r}" for s, o, r in zip(batch["src_text"], outputs, refs)]

    def attention(self, module: Any, batch: dict[str, Any], max_tokens: int) -> tuple[dict, dict]:
        # The masks say what is padding: OPUS-MT's targets start from the pad token itself.
        pad = module.config.pad_token_id
        source = _real_tokens(batch, "src", "src_mask", pad)
        src = source[:max_tokens]
        tgt = _real_tokens(batch, "tgt_in", "tgt_mask", pad)[:max_tokens]  # causal: its first tokens are exact alone
        # The encoder reads the whole source (its eos too), as it does for this pair; its weights and the
        # cross-attention's are then cut to the first source tokens (rows sum to less than 1 where later ones draw).
        _, attentions = module.model(source[None].to(module.device), tgt[None].to(module.device), return_attention=True)
        n = len(src)
        attentions = {
            "encoder": [w[..., :n, :n] for w in attentions["encoder"]],
            "self": attentions["self"],
            "cross": [w[..., :n] for w in attentions["cross"]],
        }
        src_tokens = token_labels(module.tokenizer, src)
        tgt_tokens = token_labels(module.target_tokenizer, tgt)
        axes = {
            "encoder": (src_tokens, src_tokens),
            "self": (tgt_tokens, tgt_tokens),
            "cross": (tgt_tokens, src_tokens),
        }
        return attentions, axes
