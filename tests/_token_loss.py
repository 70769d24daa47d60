"""Uneven micro-batches for the loss-normalisation tests, and a script that takes one 2-process DDP step on them.

Run as ``python tests/_token_loss.py OUT``: Lightning's DDP launcher starts the second rank by running this file again;
each rank writes the gradient its optimizer stepped with to ``OUT/grads_rank{r}.pt`` and its parameters after the
step to ``OUT/params_rank{r}.pt``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader

from lit_transformer.config import TransformerConfig
from lit_transformer.engine.lightning_module import LitTransformer
from lit_transformer.tasks.losses import IGNORE_INDEX

CONFIG = TransformerConfig.preset("tiny")  # dropout 0: the gradient is a function of the batches alone
# (rows, length, ignored label positions per row) of each micro-batch: different token counts on purpose.
SHAPES = {0: [(2, 5, 1), (3, 9, 0)], 1: [(1, 12, 4), (4, 3, 0)]}


def micro_batches(rank: int) -> list[dict[str, torch.Tensor]]:
    """Decoder-only batches of rank ``rank``, tokens >= 3 (0 is padding), the last few labels of each row ignored."""
    g = torch.Generator().manual_seed(100 + rank)
    out = []
    for rows, length, ignored in SHAPES[rank]:
        ids = torch.randint(3, CONFIG.vocab_size, (rows, length + 1), generator=g)
        labels = ids[:, 1:].clone()
        if ignored:
            labels[:, -ignored:] = IGNORE_INDEX
        out.append({"input_ids": ids[:, :-1], "labels": labels})
    return out


def one_batch(batches: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The rows of every batch in one, right-padded with token 0 and ignored labels (padding changes no logit)."""
    length = max(b["input_ids"].size(1) for b in batches)

    def pad(t: torch.Tensor, value: int) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, length - t.size(1)), value=value)

    return {
        "input_ids": torch.cat([pad(b["input_ids"], 0) for b in batches]),
        "labels": torch.cat([pad(b["labels"], IGNORE_INDEX) for b in batches]),
    }


def per_token_gradient(module: LitTransformer, batches: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The reference: the gradient of (sum of every token's loss) / (number of target tokens), by hand."""
    module.zero_grad()
    tokens = sum(int((b["labels"] != IGNORE_INDEX).sum()) for b in batches)
    for batch in batches:
        logits = module(batch)
        loss = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
        )
        (loss / tokens).backward()
    return {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}


class GradientRecorder(L.Callback):
    """The gradient the optimizer steps with (all hooks before clipping see it), per optimizer step."""

    def __init__(self) -> None:
        self.grads: list[dict[str, torch.Tensor]] = []

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        self.grads.append({n: p.grad.clone() for n, p in pl_module.named_parameters() if p.grad is not None})


class RankBatches(L.LightningDataModule):
    """Each rank reads its own micro-batches (known only once the trainer has set the rank)."""

    tokenizer = None

    def train_dataloader(self) -> DataLoader:
        return DataLoader(micro_batches(self.trainer.global_rank), batch_size=None)


def module(**kwargs) -> LitTransformer:
    torch.manual_seed(0)
    return LitTransformer(CONFIG, lr=1e-2, warmup_steps=0, schedule="constant", **kwargs)


def main(out: Path) -> None:
    torch.set_num_threads(1)
    recorder = GradientRecorder()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=1,
        accumulate_grad_batches=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        callbacks=[recorder],
    )
    lit = module()
    trainer.fit(lit, datamodule=RankBatches())
    rank = trainer.global_rank
    torch.save(recorder.grads[0], out / f"grads_rank{rank}.pt")
    torch.save({n: p.detach().clone() for n, p in lit.named_parameters()}, out / f"params_rank{rank}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
