"""LitTransformer inside a real Trainer: precision, fused optimizers and clipping; callbacks under sharding."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy
from torch.utils.data import DataLoader

from lit_transformer.callbacks import GenerateSamples, _sharded_across_ranks
from lit_transformer.config import TransformerConfig
from lit_transformer.module import LitTransformer

sys.path.insert(0, str(Path(__file__).parent))
from _token_loss import GradientRecorder, micro_batches, one_batch, per_token_gradient  # noqa: E402
from _token_loss import module as token_module  # noqa: E402


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


# ---- loss normalisation: per target token of the optimizer step -------------------------------------------------


def _first_step_gradient(lit: LitTransformer, batches: list[dict[str, torch.Tensor]], accumulate: int) -> dict:
    recorder = GradientRecorder()
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=1,
        accumulate_grad_batches=accumulate,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[recorder],
    )
    trainer.fit(lit, train_dataloaders=DataLoader(batches, batch_size=None))
    return recorder.grads[0]


def _assert_same_gradients(actual: dict, expected: dict, atol: float = 1e-6) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], atol=atol, rtol=0, msg=name)


def test_uneven_accumulated_micro_batches_give_the_gradient_of_one_batch_holding_both() -> None:
    """A micro-batch weighs by its target tokens: two of 8 and 27 tokens accumulate to the 35-token batch's gradient."""
    batches = micro_batches(0)
    accumulated = _first_step_gradient(token_module(), batches, accumulate=2)
    together = _first_step_gradient(token_module(), [one_batch(batches)], accumulate=1)
    _assert_same_gradients(accumulated, together)
    _assert_same_gradients(accumulated, per_token_gradient(token_module(), batches))


def test_per_batch_normalization_averages_the_micro_batch_means() -> None:
    """loss_normalization='batch': the mean over micro-batches of each one's per-token mean."""
    batches = micro_batches(0)
    reference = token_module()
    per_batch = [per_token_gradient(reference, [b]) for b in batches]
    expected = {name: (per_batch[0][name] + per_batch[1][name]) / 2 for name in per_batch[0]}
    _assert_same_gradients(_first_step_gradient(token_module(loss_normalization="batch"), batches, 2), expected)


@pytest.mark.slow
def test_ddp_two_processes_normalize_by_the_tokens_of_both_ranks(tmp_path) -> None:
    """2 CPU ranks x 2 uneven micro-batches: both ranks step with the gradient of all four batches' tokens, and end
    with equal parameters."""
    tests = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": f"{tests.parent}{os.pathsep}{tests}", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, str(tests / "_token_loss.py"), str(tmp_path)],
        cwd=tests.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    expected = per_token_gradient(token_module(), micro_batches(0) + micro_batches(1))
    for rank in (0, 1):
        _assert_same_gradients(torch.load(tmp_path / f"grads_rank{rank}.pt"), expected)
    params = [torch.load(tmp_path / f"params_rank{rank}.pt") for rank in (0, 1)]
    _assert_same_gradients(params[1], params[0], atol=0)
