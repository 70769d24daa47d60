"""Causal language modelling: next-token loss, perplexity, bits per character, prompt samples, generated text."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from lit_transformer.tasks.base import Loss, Task, generated_rows, log_reduced


class LanguageModeling(Task):
    """A decoder-only model predicts each next token of {"input_ids", "labels"} blocks."""

    name: ClassVar[str] = "language_modeling"
    reads: ClassVar[tuple[str, ...]] = ("characters_per_token",)
    command: ClassVar[str | None] = "generate"
    architecture: ClassVar[dict[str, str]] = {"topology": "decoder_only"}
    static_shapes: ClassVar[bool] = True  # packed blocks of block_size tokens

    def __init__(self, label_smoothing: float = 0.0, fused_loss: bool = False) -> None:
        """
        Args:
            label_smoothing: Label smoothing of the loss; perplexity and bits per character are always unsmoothed.
            fused_loss: Training on CUDA: the output layer and the cross-entropy in one liger-kernel kernel
                (lit_transformer/tasks/fused_loss.py, `pip install -e '.[gpu]'`) that never materialises the logits; the
                same loss. Evaluation keeps the plain loss (its metrics read the logits). Refused on a CPU.
        """
        super().__init__(label_smoothing)
        self.fused_loss = fused_loss
        self._characters_per_token: Callable[[str], float] | None = None
        self._cut_short: set[str] = set()  # the stages whose evaluation scores part of their split

    def attach(self, module: Any, data: dict[str, Any]) -> None:
        super().attach(module, data)
        self._characters_per_token = data.get("characters_per_token")
        if self.fused_loss and module.trainer.state.fn == "fit":
            from lit_transformer.tasks.fused_loss import require_fused_loss

            require_fused_loss(module.trainer.strategy.root_device)

    def loss(self, model, batch: dict[str, torch.Tensor], generator: torch.Generator | None = None) -> Loss:
        if not (self.fused_loss and model.training):
            return super().loss(model, batch, generator)
        from lit_transformer.tasks.fused_loss import fused_linear_cross_entropy

        tokens, labels = batch["input_ids"], batch["labels"]
        hidden = model.decode(tokens, tgt_mask=model.key_mask(tokens, batch.get("attention_mask")), project=False)
        cfg = model.config
        sums = fused_linear_cross_entropy(
            hidden, model.lm_head.weight, labels, cfg.tgt_vocab_size, self.label_smoothing, cfg.logit_softcap
        )
        return Loss(*sums, hidden, labels)  # no logits exist: the hidden states stand in (training reads only sums)

    def build_metrics(self, config) -> None:
        from torchmetrics import SumMetric

        super().build_metrics(config)
        for stage in ("val", "test"):  # the characters and tokens scored, where the split is cut short
            setattr(self, f"{stage}_characters", SumMetric())
            setattr(self, f"{stage}_targets", SumMetric())

    def epoch_start(self, module: Any, stage: str) -> None:
        super().epoch_start(module, stage)
        self._cut_short.discard(stage)
        if stage in ("val", "test") and _cut_short(module.trainer, stage):
            self._cut_short.add(stage)

    def update_metrics(self, module: Any, stage: str, out: Loss) -> None:
        super().update_metrics(module, stage, out)
        if stage in self._cut_short and module.tokenizer is not None:
            # The characters of the scored targets, as the tokenizer decodes them (special tokens, which the split's
            # character count leaves out, too): bits per character of the text scored, not of the whole split.
            rows = [[t for t in row if t >= 0] for row in out.labels.tolist()]
            characters = sum(map(len, module.tokenizer.decode_batch(rows, skip_special_tokens=True)))
            getattr(self, f"{stage}_characters").update(torch.tensor(float(characters), device=out.labels.device))
            getattr(self, f"{stage}_targets").update(torch.tensor(float(sum(map(len, rows))), device=out.labels.device))

    def log_nll_numbers(self, module: Any, stage: str, nll: torch.Tensor) -> None:
        super().log_nll_numbers(module, stage, nll)
        characters = getattr(self, f"{stage}_characters", None)
        if stage in self._cut_short and characters is not None and characters.update_called:
            # Part of the split (limit_val_batches, limit_test_batches): its own characters per token, which may
            # differ from the whole split's by several percent over its first batches.
            scored, targets = characters.compute(), getattr(self, f"{stage}_targets").compute()
            characters.reset()
            getattr(self, f"{stage}_targets").reset()
            if scored > 0:
                log_reduced(module, f"{stage}/bpc", nll / math.log(2) / (scored / targets), prog_bar=stage == "val")
                return
        if self._characters_per_token is not None:
            # Bits per character: one scale for any tokenizer (and for character-level models such as nanoGPT's).
            split = "validation" if stage == "val" else "test"
            log_reduced(
                module, f"{stage}/bpc", nll / math.log(2) / self._characters_per_token(split), prog_bar=stage == "val"
            )

    def predict(self, module: Any, batch: dict[str, Any]) -> list[dict[str, Any]]:
        return generated_rows(module, batch)

    def samples(self, module: Any, callback: Any, first_batch: Callable[[], dict | None]) -> list[str]:
        """The callback's prompts continued, each with the same seed, so successive samples differ only by what the
        model learned."""
        from lit_transformer.config import GenerationConfig
        from lit_transformer.data.text import decode_after

        generator = torch.Generator(device=module.device).manual_seed(callback.seed)
        generation = callback.generation or GenerationConfig.for_task(self)
        texts = []
        for prompt in callback.prompts:
            ids = self.encode_input(module.tokenizer, prompt, module.config.eos_token_id)
            out = module.model.generate(torch.tensor([ids], device=module.device), generation, generator=generator)
            new = out[0].tolist()
            eos = module.config.eos_token_id
            new = new[: new.index(eos)] if eos is not None and eos in new else new
            texts.append(prompt + decode_after(module.tokenizer, ids, new))  # after the prompt's ids: its spacing
        return texts


def _cut_short(trainer: Any, stage: str) -> bool:
    """Whether this evaluation scores fewer batches than its dataloader holds (limit_val_batches or
    limit_test_batches, fast_dev_run)."""
    counts = trainer.num_val_batches if stage == "val" else trainer.num_test_batches
    loaders = trainer.val_dataloaders if stage == "val" else trainer.test_dataloaders
    if not counts or loaders is None or isinstance(loaders, list | tuple | dict):
        return False
    try:
        return counts[0] < len(loaders)
    except TypeError:  # an iterable dataset without a length: nothing to compare
        return False
