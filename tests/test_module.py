"""LitTransformer inside a real Trainer: precision, fused optimizers and clipping; callbacks under sharding."""

from __future__ import annotations

from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy
from torch.utils.data import DataLoader

from lit_transformer.callbacks import GenerateSamples, _sharded_across_ranks
from lit_transformer.config import TransformerConfig
from lit_transformer.module import LitTransformer


def _batches(vocab: int, n: int = 4, batch: int = 2, length: int = 16) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        ids = torch.randint(0, vocab, (batch, length + 1), generator=g)
        out.append({"input_ids": ids[:, :-1], "labels": ids[:, 1:]})
    return out


class _GradNormAfterStep(L.Callback):
    """Records the gradient norm the optimizer stepped with (clipping has happened by then)."""

    def __init__(self) -> None:
        self.norms: list[float] = []

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        def record(optimizer, *args) -> None:
            grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            self.norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))

        trainer.optimizers[0].register_step_post_hook(record)


def test_bf16_mixed_with_a_fused_optimizer_clips_gradients(tmp_path) -> None:
    """Lightning's mixed-precision plugin refuses to clip for fused optimizers; bf16 has no scaler, so we clip."""
    cfg = TransformerConfig.preset("tiny", dropout=0.0)
    module = LitTransformer(cfg, fused=True, lr=1e-3, warmup_steps=0, schedule="constant")
    recorder = _GradNormAfterStep()
    trainer = L.Trainer(
        accelerator="cpu",
        precision="bf16-mixed",
        gradient_clip_val=1e-3,
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[recorder],
    )
    trainer.fit(module, train_dataloaders=DataLoader(_batches(cfg.vocab_size), batch_size=None))
    assert trainer.global_step == 3
    assert trainer.optimizers[0].defaults["fused"]
    assert len(recorder.norms) == 3 and all(n <= 1e-3 * 1.01 for n in recorder.norms), recorder.norms


def test_flops_per_token_does_not_read_parameters_after_construction() -> None:
    """FSDP replaces parameters by flat views mid-run: the count is taken once, before."""
    model = LitTransformer(TransformerConfig.preset("tiny")).model
    before = model.flops_per_token(32)
    for name, _ in list(model.named_parameters()):
        module_path, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(module_path) if module_path else model, leaf, None)
    assert model.flops_per_token(32) == before


@pytest.mark.parametrize(
    "strategy, world_size, skipped",
    [(FSDPStrategy(), 2, True), (FSDPStrategy(), 1, False), (DDPStrategy(), 2, False)],
)
def test_model_running_callbacks_stand_aside_when_parameters_are_sharded(strategy, world_size, skipped) -> None:
    trainer = SimpleNamespace(strategy=strategy, world_size=world_size)
    if skipped:
        with pytest.warns(UserWarning, match="GenerateSamples is skipped"):
            assert _sharded_across_ranks(trainer, GenerateSamples())
    else:
        assert not _sharded_across_ranks(trainer, GenerateSamples())
