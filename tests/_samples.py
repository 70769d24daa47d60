"""Callbacks for the elastic-resume tests: each rank appends what it trained at every step, the global sample
indices and a digest of each sample's tokens (the content read, not only its position tag)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback


class SampleRecorder(Callback):
    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        row = {"step": trainer.global_step, "rank": trainer.global_rank, "samples": batch["sample_index"].tolist()}
        tokens = torch.cat([batch["input_ids"], batch["labels"][:, -1:]], dim=1).cpu().numpy()
        row["tokens"] = [hashlib.sha1(sample.tobytes()).hexdigest()[:16] for sample in tokens]
        with open(self.path.with_suffix(f".rank{trainer.global_rank}.jsonl"), "a") as handle:
            handle.write(json.dumps(row) + "\n")


def read_samples(path: Path) -> list[dict]:
    rows = []
    for file in sorted(path.parent.glob(path.stem + ".rank*.jsonl")):
        rows += [json.loads(line) for line in file.read_text().splitlines()]
    return rows


class BatchRecorder(Callback):
    """For batches without sample indices (translation): each rank appends a digest of every step's batch."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        import hashlib

        digest = hashlib.sha1(batch["src"].cpu().numpy().tobytes() + batch["tgt_in"].cpu().numpy().tobytes())
        row = {"step": trainer.global_step, "rank": trainer.global_rank, "batch": digest.hexdigest()[:16]}
        with open(self.path.with_suffix(f".rank{trainer.global_rank}.jsonl"), "a") as handle:
            handle.write(json.dumps(row) + "\n")
