"""The tasks (lit_transformer/tasks): each one's loss contract, metrics and identity, the same checks for all four;
the deprecated LitTransformer options that reach them; and a fifth task, written here, trained through the CLI."""

from __future__ import annotations

import warnings

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from test_cli import CONFIGS, ROOT, _cli

from lit_transformer.config import TransformerConfig
from lit_transformer.engine.lightning_module import LitTransformer
from lit_transformer.engine.optimizers import Optimization
from lit_transformer.errors import ConfigError
from lit_transformer.tasks import (
    IGNORE_INDEX,
    TASKS,
    Classification,
    LanguageModeling,
    Loss,
    MaskedLM,
    Task,
    Translation,
    build_task,
)
from lit_transformer.tasks.losses import classification_loss, smoothed_cross_entropy

ARCHITECTURES = {
    "language_modeling": {},
    "translation": {"topology": "encoder_decoder"},
    "classification": {"topology": "encoder_only", "num_labels": 3},
    "masked_lm": {"topology": "encoder_only", "head": "masked_lm", "mask_token_id": 3},
    "captioning": {"topology": "encoder_decoder", "source": "features", "source_dim": 5},
}


def _config(name: str) -> TransformerConfig:
    return TransformerConfig.preset("tiny", **ARCHITECTURES[name])


def _batch(name: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """A batch of 3 rows of 7 tokens as the task's DataModule lays it out, the last row right-padded by 2."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, 128, (3, 8), generator=g)
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[2, 5:] = False
    if name == "translation":
        labels = ids[:, 1:].masked_fill(~mask, IGNORE_INDEX)
        return {"src": ids[:, 1:], "src_mask": mask, "tgt_in": ids[:, :-1], "tgt_mask": mask, "labels": labels}
    if name == "captioning":  # 3 images of 7 feature vectors, the last with 5 real ones; captions as translation's
        labels = ids[:, 1:].masked_fill(~mask, IGNORE_INDEX)
        features = torch.randn(3, 7, 5, generator=g)
        return {"src": features, "src_mask": mask, "tgt_in": ids[:, :-1], "tgt_mask": mask, "labels": labels}
    if name == "classification":
        return {"input_ids": ids[:, :-1], "attention_mask": mask, "labels": torch.tensor([0, 2, 1])}
    if name == "masked_lm":
        return {"input_ids": ids[:, :-1], "attention_mask": mask}
    return {"input_ids": ids[:, :-1], "labels": ids[:, 1:].masked_fill(~mask, IGNORE_INDEX)}


@pytest.mark.parametrize("name", TASKS)
def test_the_task_follows_the_architecture_or_its_name(name: str) -> None:
    assert type(LitTransformer(_config(name)).task) is TASKS[name]
    assert type(LitTransformer(_config(name), task=name).task) is TASKS[name]


@pytest.mark.parametrize("name", TASKS)
def test_the_loss_sums_over_the_targets(name: str) -> None:
    """(loss_sum, nll_sum, count): the NLL's mean is torch's cross-entropy over the targets (tokens or examples)."""
    module = LitTransformer(_config(name))
    with torch.no_grad():
        out = module.task.loss(module.model, _batch(name), torch.Generator().manual_seed(0))
    kept = out.labels != IGNORE_INDEX
    expected_count = kept.sum() if out.labels.dim() > 1 else len(out.labels)
    assert float(out.count) == float(expected_count) > 0
    mean = F.cross_entropy(out.logits.flatten(0, -2), out.labels.flatten(), ignore_index=IGNORE_INDEX)
    assert float(out.nll_sum / out.count) == pytest.approx(float(mean), rel=1e-5)
    assert float(out.loss_sum) == pytest.approx(float(out.nll_sum))  # no smoothing: the loss is the NLL


# What each task logs at validation and test, value by value: tests/test_task_metrics.py.


@pytest.mark.parametrize("name", TASKS)
def test_a_tasks_spec_rebuilds_it(name: str) -> None:
    """Hyperparameters record the task as {class_path, init_args}: a checkpoint rebuilds the same task."""
    task = TASKS[name](label_smoothing=0.2)
    spec = LitTransformer(_config(name), task=task).hparams["task"]
    assert spec == {"class_path": f"{type(task).__module__}.{type(task).__name__}", "init_args": task.init_args()}
    rebuilt = build_task(spec, _config(name))
    assert type(rebuilt) is type(task) and rebuilt.init_args() == task.init_args()


@pytest.mark.parametrize("smoothing", [-0.1, 1.0, 10.0])
def test_label_smoothing_outside_0_1_is_refused(smoothing: float) -> None:
    """eps >= 1 weighs the NLL by 1 - eps <= 0, so training pushed the targets' probability down (a typed 10 for 0.1
    trained on without a word, train perplexity rising); torch's cross_entropy refuses such a value too. Refused when
    the task is built, and by the losses themselves (the deprecated flat option sets the attribute afterwards)."""
    for name in TASKS:
        with pytest.raises(ConfigError, match="label_smoothing"):
            TASKS[name](label_smoothing=smoothing)
    logits, labels = torch.randn(2, 3, 5), torch.randint(0, 5, (2, 3))
    with pytest.raises(ConfigError, match="label_smoothing"):
        smoothed_cross_entropy(logits, labels, smoothing)
    with pytest.raises(ConfigError, match="label_smoothing"):
        classification_loss(logits[:, 0], labels[:, 0], smoothing)
    with pytest.warns(FutureWarning, match="label_smoothing is deprecated"):  # the deprecated flat option
        with pytest.raises(ConfigError, match="label_smoothing"):
            LitTransformer(_config("language_modeling"), label_smoothing=smoothing)


@pytest.mark.parametrize(
    ("name", "option", "value"),
    [
        ("translation", "label_smoothing", 0.1),
        ("classification", "class_weights", [1.0, 2.0, 3.0]),
        ("masked_lm", "mlm_probability", 0.3),
    ],
)
def test_a_deprecated_option_reaches_the_task_with_a_warning_naming_the_new_key(name, option, value) -> None:
    with pytest.warns(FutureWarning, match=f"model.task.init_args.{option}"):
        module = LitTransformer(_config(name), **{option: value})
    assert getattr(module.task, option) == value
    assert option not in module.hparams and module.hparams["task"]["init_args"][option] == value


def test_the_old_flat_optimizer_arguments_set_model_optim_with_a_warning() -> None:
    """LitTransformer(config, lr=..., warmup_steps=...) and --model.lr still work; hyperparameters record optim."""
    with pytest.warns(FutureWarning, match="model.optim.lr"):
        module = LitTransformer(_config("language_modeling"), lr=1e-2, warmup_steps=0, schedule="constant")
    assert (module.optim.lr, module.optim.warmup_steps) == (1e-2, 0)
    assert module.hparams["optim"]["lr"] == 1e-2 and "lr" not in module.hparams
    assert module.configure_optimizers()["optimizer"].param_groups[0]["lr"] == 1e-2
    module = LitTransformer(
        _config("language_modeling"), optim=Optimization(lr=5e-3, schedule="constant", warmup_steps=0)
    )
    assert module.configure_optimizers()["optimizer"].param_groups[0]["lr"] == 5e-3


def test_an_old_configs_multi_label_reaches_the_classification_task() -> None:
    with pytest.warns(FutureWarning, match="model.task.init_args.multi_label"):
        module = LitTransformer(_config("classification").replace(multi_label=True))
    assert module.task.multi_label is True


def test_options_of_another_task_and_their_old_defaults_pass_in_silence() -> None:
    """Every old checkpoint records label_smoothing 0.0, class_weights None and mlm_probability 0.15, whatever its
    task: those say nothing, and no warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module = LitTransformer(_config("language_modeling"), label_smoothing=0.0, mlm_probability=0.15)
        LitTransformer(_config("language_modeling"), class_weights=[1.0])
    assert module.task.init_args() == {"label_smoothing": 0.0, "fused_loss": False}


def test_a_task_refuses_an_architecture_it_cannot_train() -> None:
    with pytest.raises(ValueError, match="topology encoder_decoder"):
        LitTransformer(_config("language_modeling"), task="translation")
    with pytest.raises(ValueError, match="masked_lm"):
        LitTransformer(_config("classification"), task=MaskedLM())
    with pytest.raises(ValueError, match="classification"):
        LitTransformer(_config("masked_lm"), task=Classification())
    with pytest.raises(ValueError, match="decoder_only"):
        LitTransformer(_config("translation"), task=LanguageModeling())
    with pytest.raises(ValueError, match="neither one of"):
        LitTransformer(_config("translation"), task="translate")
    assert isinstance(LitTransformer(_config("translation"), task=Translation()).task, Translation)


# ---- a fifth task, in a few lines, trained by the command line -------------------------------------------------


class EchoTask(Task):
    """A toy task: a decoder-only model says again each token it reads (the labels are its inputs)."""

    def loss(self, model, batch, generator=None) -> Loss:
        logits, labels = model(batch["input_ids"]), batch["input_ids"]
        return Loss(*smoothed_cross_entropy(logits, labels, self.label_smoothing), logits, labels)


def test_a_new_task_trains_through_the_cli_without_touching_the_package(tmp_path) -> None:
    from lit_transformer.checkpoints.files import load_checkpoint

    where = ["--trainer.default_root_dir", str(tmp_path), "--trainer.logger", "false"]
    where += ["--checkpoint.dirpath", str(tmp_path / "ckpt"), "--data.init_args.cache_dir", str(tmp_path / "cache")]
    tiny = ["--config", str(CONFIGS / "presets" / "tiny.yaml"), *where, "--data.init_args.max_chars", "20000"]
    task = ["--model.task", f"{__name__}.EchoTask", "--model.task.init_args.label_smoothing", "0.05"]
    _cli("fit", *tiny, *task, "--trainer.max_steps", "30", "--model.lr", "1e-2", cwd=ROOT)
    checkpoint = load_checkpoint(tmp_path / "ckpt" / "last.ckpt")
    spec = checkpoint["hyper_parameters"]["task"]
    assert spec == {"class_path": f"{__name__}.EchoTask", "init_args": {"label_smoothing": 0.05}}
    out = _cli("validate", *tiny, "--ckpt_path", str(tmp_path / "ckpt" / "last.ckpt"), cwd=ROOT).stdout
    accuracy = float(out.split("val/accuracy")[1].split()[1])
    assert accuracy > 0.9  # an echo is learnt at once; a next-token model of Shakespeare's characters is far below


# ---- the tokenizer in checkpoints -----------------------------------------------------------------------------------


class _TokenData(L.LightningDataModule):
    """Language-model batches; its own state holds only what is its own, as the package's DataModules keep it (the
    LightningModule saves the tokenizer)."""

    def __init__(self) -> None:
        super().__init__()
        from tokenizers import Tokenizer
        from tokenizers.models import WordLevel

        self.tokenizer = Tokenizer(WordLevel({f"w{i}": i for i in range(128)}, unk_token="w0"))
        self.restored: dict | None = None

    def train_dataloader(self):
        return torch.utils.data.DataLoader([_batch("language_modeling", seed) for seed in range(2)], batch_size=None)

    def state_dict(self) -> dict:
        return {"other": 1}

    def load_state_dict(self, state: dict) -> None:
        self.restored = state


def test_a_checkpoint_holds_the_tokenizer_once_and_the_datamodule_its_own_state(tmp_path) -> None:
    from lit_transformer.checkpoints.files import load_checkpoint

    def trainer(steps: int) -> L.Trainer:
        return L.Trainer(accelerator="cpu", max_steps=steps, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False)  # fmt: skip

    data, module = _TokenData(), LitTransformer(_config("language_modeling"), optim=Optimization(schedule="constant"))
    run = trainer(1)
    run.fit(module, datamodule=data)
    run.save_checkpoint(tmp_path / "a.ckpt")
    checkpoint = load_checkpoint(tmp_path / "a.ckpt")
    assert checkpoint["tokenizer"] == data.tokenizer.to_str()
    assert checkpoint["_TokenData"] == {"other": 1} and "tokenizer_copies" not in checkpoint
    data = _TokenData()
    trainer(2).fit(LitTransformer(_config("language_modeling")), datamodule=data, ckpt_path=tmp_path / "a.ckpt")
    assert data.restored == {"other": 1}
