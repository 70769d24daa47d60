"""Checkpoints written before tasks became objects (issue 26) load, evaluate and predict as they did then.

tests/fixtures/old_checkpoints/ holds, per task, a checkpoint that the code of commit 1f2c802 wrote through the CLI
after 2 training steps, one validation batch and one predict batch, and what that code computed from them
(expected.json; make.py wrote them all and says how)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from lit_transformer.config import GenerationConfig
from lit_transformer.engine.lightning_module import LitTransformer
from lit_transformer.inference import load_model
from lit_transformer.tasks import Classification, LanguageModeling, MaskedLM, Translation

FIXTURES = Path(__file__).parent / "fixtures" / "old_checkpoints"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
TASKS = {"language_modeling": LanguageModeling, "translation": Translation, "classification": Classification,
         "masked_lm": MaskedLM}  # fmt: skip


def _load(name: str) -> LitTransformer:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the deprecated options an old checkpoint records
        module = LitTransformer.load_from_checkpoint(FIXTURES / f"{name}.ckpt").eval()
    module.generation = GenerationConfig.for_task(module.task, max_new_tokens=6, temperature=0.0)
    return module


@pytest.mark.parametrize("name", TASKS)
def test_an_old_checkpoint_computes_the_same_loss(name: str) -> None:
    """The deprecated options it records (label smoothing, class weights, the masking rate) reach its task."""
    module = _load(name)
    assert type(module.task) is TASKS[name]
    options = {"translation": ("label_smoothing", 0.1), "classification": ("class_weights", "balanced")}
    if name in options:
        option, value = options[name]
        assert getattr(module.task, option) == value
    batches = torch.load(FIXTURES / f"{name}.batches.pt", weights_only=True)
    with torch.no_grad():  # the masked LM's corruption drawn from the same generator as then
        out = module.task.loss(module.model, batches["validation"], torch.Generator().manual_seed(0))
    expected = EXPECTED[name]
    assert float(out.loss_sum) == pytest.approx(expected["loss_sum"], rel=1e-5)
    assert float(out.nll_sum) == pytest.approx(expected["nll_sum"], rel=1e-5)
    assert float(out.count) == expected["count"]


@pytest.mark.parametrize("name", [name for name in TASKS if name != "masked_lm"])
def test_an_old_checkpoint_predicts_the_same_rows(name: str) -> None:
    module = _load(name)
    batch = torch.load(FIXTURES / f"{name}.batches.pt", weights_only=True)["predict"]
    with torch.no_grad():
        rows = module.predict_step(batch, 0)
    expected = EXPECTED[name]["predict"]
    if name != "classification":
        assert rows == expected
        return
    assert [r["label"] for r in rows] == [r["label"] for r in expected]
    for row, old in zip(rows, expected, strict=True):
        assert row["probabilities"] == pytest.approx(old["probabilities"], rel=1e-5)


@pytest.mark.parametrize("name", TASKS)
def test_inference_reads_the_task_of_an_old_checkpoint(name: str) -> None:
    assert type(load_model(FIXTURES / f"{name}.ckpt").task) is TASKS[name]


def test_the_command_line_validates_and_resumes_an_old_checkpoint(tmp_path) -> None:
    """Its hyperparameters (the flat optimizer arguments, no task) parse as this LitTransformer's; fit resumes it."""
    from test_cli import CONFIGS, _cli

    ckpt = FIXTURES / "language_modeling.ckpt"
    where = ["--trainer.default_root_dir", str(tmp_path), "--trainer.logger", "false"]
    where += ["--checkpoint.dirpath", str(tmp_path / "ckpt"), "--data.init_args.cache_dir", str(tmp_path / "cache")]
    tiny = ["--config", str(CONFIGS / "presets" / "tiny.yaml"), *where, "--data.init_args.max_chars", "20000"]
    out = _cli("validate", *tiny, "--ckpt_path", str(ckpt), cwd=tmp_path).stdout
    assert "val/nll" in out and "val/bpc" in out
    _cli("fit", *tiny, "--ckpt_path", str(ckpt), "--trainer.max_steps", "3", "--trainer.limit_val_batches", "0",
         "--checkpoint.every_n_train_steps", "3", cwd=tmp_path)  # fmt: skip
    from lit_transformer.checkpoints.files import load_checkpoint

    resumed = load_checkpoint(tmp_path / "ckpt" / "last.ckpt")
    assert resumed["global_step"] == 3
    assert resumed["hyper_parameters"]["task"]["class_path"].endswith("LanguageModeling")
    assert "lr" not in resumed["hyper_parameters"] and resumed["hyper_parameters"]["optim"]["lr"] == 3e-3


# ---------------------------------------------------------------------------------------------- the flat layout's files

OLD_LAYOUT = Path(__file__).parent / "fixtures" / "old_layout"


def test_a_run_config_and_checkpoint_of_the_flat_layout_resume(tmp_path, monkeypatch):
    """tests/fixtures/old_layout/ holds what commit ed5e012 (the package's modules still side by side at the top)
    wrote for `fit --config configs/presets/tiny.yaml --trainer.max_steps 4` with three callbacks named by their class
    paths of then (lit_transformer.callbacks.*, lit_transformer.parallelize.AttentionKernels): its run config, whose
    trainer plugin is lit_transformer.checkpointing.AtomicCheckpointIO, and its last.ckpt. The config's class paths
    resolve to today's classes, and the run resumes from the checkpoint where it stopped."""
    from lit_transformer.checkpoints.atomic_io import AtomicCheckpointIO
    from lit_transformer.cli.lightning_cli import run_cli
    from lit_transformer.engine.attention_kernels import AttentionKernels
    from lit_transformer.engine.monitoring import HostMemoryMonitor, LearningRateLogger

    monkeypatch.chdir(tmp_path)
    run = run_cli(
        ["fit", "--config", str(OLD_LAYOUT / "config.yaml"), "--ckpt_path", str(OLD_LAYOUT / "last.ckpt"),
         "--trainer.max_steps", "6", "--trainer.val_check_interval", "6", "--trainer.enable_progress_bar", "false"]
    )  # fmt: skip
    kinds = {type(c) for c in run.trainer.callbacks}
    assert {LearningRateLogger, HostMemoryMonitor, AttentionKernels} <= kinds
    assert isinstance(run.trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    assert run.trainer.global_step == 6
    assert (tmp_path / "runs" / "old_layout" / "checkpoints" / "last.ckpt").is_file()


def test_a_checkpoint_of_the_flat_layout_loads_and_decodes():
    """The same last.ckpt loads through the Python API and the inference path, with the tokenizer it holds."""
    module = LitTransformer.load_from_checkpoint(OLD_LAYOUT / "last.ckpt", map_location="cpu")
    assert module.hparams["optim"]["lr"] == 3.0e-3 and module.tokenizer is not None
    loaded = load_model(OLD_LAYOUT / "last.ckpt")
    prompt = torch.tensor([loaded.tokenizer.encode("ROMEO:").ids])
    logits = loaded.model(prompt)
    assert logits.shape == (1, prompt.size(1), loaded.model.config.vocab_size)
    assert torch.allclose(logits, module.model.eval()(prompt), atol=1e-6)


def test_a_translation_run_of_two_tokenizers_of_one_size_resumes_with_its_one_embedding_matrix():
    """Before, target_vocab_size equal to vocab_size (shared_vocab false, both tokenizers at the size cap) gave both
    sides one embedding matrix; now only an unset target_vocab_size does. Such a checkpoint's weights and optimizer
    state are of one matrix: its hyperparameters read as it was trained (shared), where its two tables are one."""
    from lit_transformer.cli.lightning_cli import keep_one_embedding

    config = {"topology": "encoder_decoder", "vocab_size": 16, "target_vocab_size": 16, "share_embeddings": None}
    table = torch.randn(16, 4)
    one = {"state_dict": {"model.src_embed.weight": table, "model.tgt_embed.weight": table.clone()}}
    hparams = {"config": dict(config)}
    keep_one_embedding(hparams, one)
    assert hparams["config"]["share_embeddings"] is True
    two = {"state_dict": {"model.src_embed.weight": table, "model.tgt_embed.weight": torch.randn(16, 4)}}
    for checkpoint, given in (
        (two, config),
        (one, {**config, "share_embeddings": False}),
        (one, {**config, "target_vocab_size": None}),
    ):
        hparams = {"config": dict(given)}
        keep_one_embedding(hparams, checkpoint)
        assert hparams["config"] == given
