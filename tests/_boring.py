"""A tiny, self-contained Lightning training script for the reliability tests (run in-process or as a subprocess).

It needs none of the package's model or data code: a two-layer MLP with dropout, a deterministic dataset, and a
minimal resumable batch source (the real one belongs to the DataModules), so these tests pin down the reliability
pieces alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from lit_transformer.checkpoints.atomic_io import AtomicCheckpointIO
from lit_transformer.engine.nonfinite_guard import NonFiniteLossGuard
from lit_transformer.engine.preemption import PreemptionCheckpoint
from lit_transformer.engine.step_seed import StepSeed


class ResumableBatches:
    """Batches of a fixed tensor, shuffled per epoch by a (seed, epoch) generator; remembers how far the model got."""

    def __init__(self, data: torch.Tensor, batch_size: int, seed: int = 0) -> None:
        self.data, self.batch_size, self.seed = data, batch_size, seed
        self.epoch, self.consumed, self._start = 0, 0, 0

    def __len__(self) -> int:
        return len(self.data) // self.batch_size

    def __iter__(self):
        # The epoch advances when an iterator starts, not when it runs out: Lightning stops a sized loader after
        # len() batches without exhausting it.
        start, self._start, self.consumed = self._start, 0, self._start
        self.current_epoch, self.epoch = self.epoch, self.epoch + 1
        order = torch.randperm(len(self.data), generator=torch.Generator().manual_seed(self.seed + self.current_epoch))
        for i in range(start, len(self)):
            yield self.data[order[i * self.batch_size : (i + 1) * self.batch_size]]

    def state_dict(self) -> dict:
        if self.consumed >= len(self):  # the epoch is used up: resume at the start of the next one
            return {"epoch": self.current_epoch + 1, "consumed": 0}
        return {"epoch": self.current_epoch, "consumed": self.consumed}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self._start = state["epoch"], state["consumed"]


class TinyModule(pl.LightningModule):
    def __init__(
        self, nan_at: tuple[int, ...] = (), nan_from: int | None = None, sleep: float = 0.0, fused: bool = False
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1)
        )
        self.batches: ResumableBatches | None = None

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        if self.hparams.sleep:
            time.sleep(self.hparams.sleep)
        loss = (self.net(batch[:, :8]).squeeze(-1) - batch[:, 8]).pow(2).mean()
        step = self.trainer.global_step
        if step in self.hparams.nan_at or (self.hparams.nan_from is not None and step >= self.hparams.nan_from):
            loss = loss * float("nan")
        self.batches.consumed += 1
        return loss

    def train_dataloader(self) -> ResumableBatches:
        data = torch.randn(64, 9, generator=torch.Generator().manual_seed(1234))
        self.batches = ResumableBatches(data, batch_size=4)
        return self.batches

    def configure_optimizers(self):
        # fused: the kernel that skips a step on the device (NonFiniteLossGuard's path on GPUs), which CPUs have too
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-2, fused=self.hparams.fused or None)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step) ** 0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class LossRecorder(Callback):
    """Appends one JSON line per optimizer step (rank 0): global step, loss and a weight checksum."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.is_global_zero:
            checksum = sum(float(p.detach().double().sum()) for p in pl_module.parameters())
            line = {"step": trainer.global_step, "loss": float(outputs["loss"]), "weights": checksum}
            with open(self.path, "a") as f:
                f.write(json.dumps(line) + "\n")
                f.flush()
            print(f"STEP {trainer.global_step}", flush=True)


class RankParameters(Callback):
    """At the end of training, each rank writes its global step and parameters to ``dirpath/rank{r}.pt``."""

    def __init__(self, dirpath: str) -> None:
        self.dirpath = Path(dirpath)

    def on_train_end(self, trainer, pl_module) -> None:
        self.dirpath.mkdir(parents=True, exist_ok=True)
        params = {n: p.detach().cpu().clone() for n, p in pl_module.named_parameters()}
        state = {"rank": trainer.global_rank, "world_size": trainer.world_size, "step": trainer.global_step}
        torch.save({**state, "params": params}, self.dirpath / f"rank{trainer.global_rank}.pt")


class BlockAtStep(Callback):
    """Announces BLOCKED and sleeps at the start of one training batch: a step that takes minutes, as the first
    compiled step does (torch.compile builds it), in which no step boundary comes."""

    def __init__(self, step: int, seconds: float = 600.0) -> None:
        self.step, self.seconds = step, seconds

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            print("BLOCKED", flush=True)
            time.sleep(self.seconds)


def make_trainer(root: Path, max_steps: int, devices: int = 1, extra_callbacks=(), **kwargs) -> pl.Trainer:
    root.mkdir(parents=True, exist_ok=True)
    callbacks = [
        StepSeed(seed=7),
        NonFiniteLossGuard(max_consecutive=kwargs.pop("max_consecutive", 3)),
        LossRecorder(root / "losses.jsonl"),
        PreemptionCheckpoint(root / "checkpoints"),  # after the recorder, so the step it saves at is recorded
        ModelCheckpoint(dirpath=root / "checkpoints", every_n_train_steps=1, save_top_k=0, save_last=True),
        *extra_callbacks,
    ]
    return pl.Trainer(
        default_root_dir=root,
        max_steps=max_steps,
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        plugins=[AtomicCheckpointIO()],
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
        **kwargs,
    )


def read_losses(root: Path) -> dict[int, float]:
    """Per-step losses; a step recorded twice (once before a crash, once after resume) keeps the later value."""
    path = root / "losses.jsonl"
    if not path.exists():
        return {}
    return {entry["step"]: entry["loss"] for entry in map(json.loads, path.read_text().splitlines())}


def slow_saves_from(count: int) -> None:
    """From the ``count``-th torch.save on, write half of the bytes, announce it, then hang (for kill-during-save tests)."""
    import lit_transformer.checkpoints.files as checkpointing  # where atomic_save calls torch.save

    real_save, calls = torch.save, [0]

    def slow_save(obj, file, *args, **kwargs):
        calls[0] += 1
        if calls[0] < count:
            return real_save(obj, file, *args, **kwargs)
        import io

        buffer = io.BytesIO()
        real_save(obj, buffer)
        file.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
        file.flush()
        print("SAVING", flush=True)
        time.sleep(120)

    checkpointing.torch.save = slow_save


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root", type=Path)
    parser.add_argument("--max-steps", type=int, default=12)
    parser.add_argument("--ckpt-path", default=None)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--slow-save-from", type=int, default=0)
    parser.add_argument("--block-at-step", type=int, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.slow_save_from:
        slow_saves_from(args.slow_save_from)
    pl.seed_everything(7, verbose=False)
    blocks = [] if args.block_at_step is None else [BlockAtStep(args.block_at_step)]
    trainer = make_trainer(args.root, args.max_steps, devices=args.devices, extra_callbacks=blocks)
    trainer.fit(TinyModule(sleep=args.sleep), ckpt_path=args.ckpt_path)
    print("DONE", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
