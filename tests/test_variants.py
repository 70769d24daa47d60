"""Every file of configs/variants composes with every preset (and configs/base.yaml): each pair parses, builds its
model (shrunk to a few thousand parameters; vocabulary, labels and special tokens as a DataModule would link them)
and takes one forward and backward pass, or is refused with a message that names why (REFUSED). Each variant also
trains one real optimizer step through the CLI on a preset it makes sense for (tiny, or tiny-translate for the
encoder-decoder ones). Also: one run folder (`--trainer.default_root_dir` alone moves every output, and `--ckpt_path
last` resumes from it) and the context length set once (block_size <-> max_seq_len).
"""

from __future__ import annotations

import contextlib
import io
import os
import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml

from lit_transformer.checkpoints.files import load_checkpoint
from lit_transformer.cli.lightning_cli import (
    TransformerCLI,
    _trainer_defaults,
    link_context_length,
    resolve_run_folder,
    run_cli,
)
from lit_transformer.config import TransformerConfig
from lit_transformer.engine.lightning_module import LitTransformer
from lit_transformer.engine.optimizers import Optimization, build_optimizer
from lit_transformer.model.transformer import Transformer
from lit_transformer.tasks import build_task

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = sorted(p.name for p in (ROOT / "configs" / "variants").glob("*.yaml"))
PRESETS = ["base.yaml"] + sorted(f"presets/{p.name}" for p in (ROOT / "configs" / "presets").glob("*.yaml"))

# (variant, preset) pairs that make no sense, and the words of the refusal.
REFUSED: dict[tuple[str, str], str] = {}
for _preset in PRESETS:
    if any(name in _preset for name in ("caption", "classify", "mlm", "translate", "paper")):
        # NoPE: only a causal mask orders tokens without positions; an encoder is bidirectional.
        REFUSED[("nope.yaml", _preset)] = "(NoPE) needs topology='decoder_only'"
# Image patches need 2-D positions (sinusoidal or learned); rotary and ALiBi order a 1-D sequence.
REFUSED[("alibi.yaml", "presets/caption-digits.yaml")] = "orders a 1-D sequence only"
REFUSED[("rope.yaml", "presets/caption-digits.yaml")] = "orders a 1-D sequence only"


class ParseOnly(TransformerCLI):
    """The CLI's parser, built once; nothing is instantiated or run."""

    def before_instantiate_classes(self) -> None:
        pass

    def instantiate_classes(self) -> None:
        pass

    def _run_subcommand(self, subcommand: str | None) -> None:
        pass


@pytest.fixture(scope="module")
def parser():
    with contextlib.chdir(ROOT):
        cli = ParseOnly(
            LitTransformer,
            L.LightningDataModule,
            subclass_mode_data=True,
            trainer_defaults=_trainer_defaults(),
            args=["fit", "--config", "configs/presets/tiny.yaml"],
            auto_configure_optimizers=False,
        )
    return cli.parser


@pytest.fixture(scope="module")
def fit_parser(parser):
    """The fit subcommand's own parser: what `fit --config P --config V` parses, the same namespace without the
    subcommand dispatch, in half the time (the matrix below parses hundreds of times)."""
    return parser._subcommands_action._name_parser_map["fit"]


def shrunk(config: dict) -> TransformerConfig:
    """The pair's architecture at a tiny size, with what the DataModule would link in."""
    config = dict(config)
    head_dim = 8
    config.update(d_model=head_dim * config["n_heads"], n_layers=1, vocab_size=64, pad_token_id=0)
    for key in ("n_encoder_layers", "n_decoder_layers"):
        config[key] = 1 if config.get(key) else config.get(key)
    if config.get("d_ff") is not None:
        config["d_ff"] = 32
    config["max_seq_len"] = min(config["max_seq_len"], 64)
    config["target_vocab_size"] = 64 if config.get("target_vocab_size") else None
    if config["topology"] == "encoder_only":
        config["num_labels"] = 3 if config.get("head") == "classification" else None
        config["mask_token_id"] = 3
    return TransformerConfig(**config)


def leaves(tree: dict, prefix: str = "") -> dict[str, object]:
    """A YAML's settings as dotted keys (`model.config.positions`) and their values."""
    out: dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def one_pass(model: Transformer, config: TransformerConfig) -> None:
    tokens = torch.randint(4, config.vocab_size, (2, 12))
    if config.topology == "decoder_only":
        out = model(tokens)
    elif config.topology == "encoder_only":
        out = model(tokens, attention_mask=torch.ones_like(tokens, dtype=torch.bool))
    else:
        if config.source == "patches":
            source = torch.rand(2, config.image_channels, *config.image_size)
        else:
            source = torch.randint(4, config.vocab_size, (2, 10))
        out = model(source, tokens)
    out = out[0] if isinstance(out, tuple) else out
    out.float().sum().backward()


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_composes_with_preset(fit_parser, variant: str, preset: str) -> None:
    args = ["--config", f"configs/{preset}", "--config", f"configs/variants/{variant}"]
    with contextlib.chdir(ROOT):
        fit = fit_parser.parse_args(args)
    resolve_run_folder(fit)
    link_context_length(fit, "fit")
    refusal = REFUSED.get((variant, preset))
    try:
        config = shrunk(fit.model.config.as_dict())
        task = fit.model.task
        task = task.as_dict() if hasattr(task, "as_dict") else task
        build_task(task, config)
        optim = Optimization(**fit.model.optim.as_dict())
        model = Transformer(config)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a variant's optimizer warning is tested below
            optimizer = build_optimizer(model, optim, fused=False)
        one_pass(model, config)
        optimizer.step()  # every group of the variant's optimizer (Muon's hidden matrices too) takes the gradients
    except ValueError as error:
        assert refusal, f"{variant} with {preset} refused: {error}"
        assert refusal in str(error), error
        return
    assert not refusal, f"{variant} with {preset} should be refused ({refusal})"
    # The variant did what it says (what its YAML sets is in the parsed config), and the run folder followed.
    sets = leaves(yaml.safe_load((ROOT / "configs" / "variants" / variant).read_text()))
    assert sets, f"{variant} sets nothing"
    assert {key: fit.get(key) for key in sets} == sets, f"{preset} overrides what {variant} sets"
    assert fit.checkpoint.dirpath == f"{fit.trainer.default_root_dir or '.'}/checkpoints"


def tiny_run(tmp_path: Path, *args: str) -> None:
    """One optimizer step through the CLI, in-process, in tmp_path."""
    small = ["--trainer.max_steps", "1", "--trainer.limit_val_batches", "0", "--trainer.num_sanity_val_steps", "0"]
    small += ["--trainer.enable_progress_bar", "false", "--samples.prompts", "[]", "--attention.max_layers", "0"]
    with contextlib.chdir(tmp_path), contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_cli(["fit", *args, *small])


ENCODER_DECODER = {"label_smoothing.yaml", "noam.yaml", "post_ln.yaml", "sinusoidal.yaml", "scale_embeddings.yaml"}


@pytest.fixture
def configs_here(tmp_path: Path) -> Path:
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    return tmp_path


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_trains_one_step(configs_here: Path, variant: str) -> None:
    preset = "tiny-translate" if variant in ENCODER_DECODER else "tiny"
    tiny_run(configs_here, "--config", f"configs/presets/{preset}.yaml", "--config", f"configs/variants/{variant}")
    checkpoint = load_checkpoint(configs_here / "runs" / preset / "checkpoints" / "last.ckpt")
    assert checkpoint["global_step"] == 1


def test_label_smoothing_keeps_a_translation_task(parser) -> None:
    with contextlib.chdir(ROOT):
        parsed = parser.parse_args(
            [
                "fit",
                "--config",
                "configs/presets/tiny-translate.yaml",
                "--config",
                "configs/variants/label_smoothing.yaml",
            ]
        )
    config = shrunk(parsed.fit.model.config.as_dict())
    task = build_task(parsed.fit.model.task.as_dict(), config)
    assert type(task).__name__ == "Translation" and task.label_smoothing == 0.1
    with contextlib.chdir(ROOT):  # over a config that names no task: the architecture's own task, smoothed
        parsed = parser.parse_args(
            ["fit", "--config", "configs/base.yaml", "--config", "configs/variants/label_smoothing.yaml"]
        )
    task = build_task(parsed.fit.model.task.as_dict(), shrunk(parsed.fit.model.config.as_dict()))
    assert type(task).__name__ == "LanguageModeling" and task.label_smoothing == 0.1


def test_no_warmup_keeps_the_schedule(parser) -> None:
    for preset, schedule in (
        ("base.yaml", "wsd"),
        ("presets/shakespeare-2017.yaml", "cosine"),
        ("presets/translate-en-es.yaml", "noam"),
    ):
        with contextlib.chdir(ROOT):
            parsed = parser.parse_args(
                ["fit", "--config", f"configs/{preset}", "--config", "configs/variants/no_warmup.yaml"]
            )
        assert parsed.fit.model.optim.schedule == schedule and parsed.fit.model.optim.warmup_steps == 0


def test_weight_decay_with_plain_adam_is_warned_once_naming_the_fix() -> None:
    model = Transformer(TransformerConfig.preset("tiny"))
    with pytest.warns(UserWarning, match="no effect with optimizer adam.*optimizer adamw"):
        build_optimizer(model, Optimization(optimizer="adam", weight_decay=0.1), fused=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_optimizer(model, Optimization(optimizer="adam"), fused=False)  # the paper's Adam, nothing to say
        build_optimizer(model, Optimization(optimizer="adamw", weight_decay=0.1), fused=False)


def test_context_length_is_set_once(parser) -> None:
    def context(*flags: str) -> tuple[int, int]:
        with contextlib.chdir(ROOT):
            fit = parser.parse_args(["fit", "--config", "configs/base.yaml", *flags]).fit
        link_context_length(fit, "fit")
        return fit.data.init_args.block_size, fit.model.config.max_seq_len

    assert context() == (128, 128)
    assert context("--data.init_args.block_size", "64") == (64, 64)  # the model follows the data
    with contextlib.chdir(ROOT):
        fit = parser.parse_args(
            ["fit", "--config", "configs/presets/tiny.yaml", "--model.config.max_seq_len", "32"]
        ).fit
    with pytest.raises(ValueError, match=r"block_size=64 and model.config.max_seq_len=32 disagree"):
        link_context_length(fit, "fit")  # both given, different: refused, naming both
    link_context_length(fit, "validate")  # validate may read longer blocks (length extrapolation)
    assert (fit.data.init_args.block_size, fit.model.config.max_seq_len) == (64, 32)
    fit.data.init_args.block_size = None  # the data's default: not given
    link_context_length(fit, "fit")
    assert fit.data.init_args.block_size == 32  # the data follow the model
    fit.data.init_args.block_size, fit.model.config.max_seq_len = None, 256  # neither given: the model's default
    link_context_length(fit, "fit")
    assert (fit.data.init_args.block_size, fit.model.config.max_seq_len) == (256, 256)


def test_a_given_block_size_is_kept_even_when_it_equals_the_models_default_context(parser) -> None:
    """Length extrapolation reads a 128-token model's validation split in blocks of 256, 512, 1024: 256, the value
    TransformerConfig defaults to, is given like the others (it was once taken for "not given" and silently replaced
    by the model's 128, so a grid's N = 256 column repeated N = 128)."""
    for n in (256, 512):
        with contextlib.chdir(ROOT):
            given = parser.parse_args(
                ["fit", "--config", "configs/base.yaml", "--model.config.max_seq_len", "128",
                 "--data.init_args.block_size", str(n)]
            ).fit  # fmt: skip
        link_context_length(given, "validate")
        assert (given.data.init_args.block_size, given.model.config.max_seq_len) == (n, 128)
    with contextlib.chdir(ROOT):
        fit = parser.parse_args(["fit", "--config", "configs/base.yaml", "--data.init_args.block_size", "256"]).fit
    link_context_length(fit, "fit")  # the model follows
    assert (fit.data.init_args.block_size, fit.model.config.max_seq_len) == (256, 256)


@pytest.mark.slow
def test_one_run_folder_holds_everything_and_resumes(configs_here: Path) -> None:
    """`--trainer.default_root_dir DIR` alone: logs, TensorBoard, config and checkpoints all under DIR, nothing
    else written beside it; `--ckpt_path last` then resumes from DIR's last.ckpt."""
    before = set(os.listdir(configs_here))
    tiny_run(configs_here, "--config", "configs/presets/tiny.yaml", "--trainer.default_root_dir", "elsewhere/run")
    assert set(os.listdir(configs_here)) - before == {"elsewhere"}
    written = {
        p.relative_to(configs_here / "elsewhere/run").parts[0] for p in (configs_here / "elsewhere/run").rglob("*")
    }
    assert written == {"checkpoints", "tensorboard"}
    assert (configs_here / "elsewhere/run/checkpoints/last.ckpt").is_file()
    assert list((configs_here / "elsewhere/run/tensorboard").glob("version_0/events.out.tfevents.*"))
    with contextlib.chdir(configs_here), contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_cli(
            ["fit", "--config", "configs/presets/tiny.yaml", "--trainer.default_root_dir", "elsewhere/run"]
            + ["--ckpt_path", "last", "--trainer.max_steps", "2", "--trainer.limit_val_batches", "0"]
            + ["--trainer.enable_progress_bar", "false", "--samples.prompts", "[]", "--attention.max_layers", "0"]
        )
    assert load_checkpoint(configs_here / "elsewhere/run/checkpoints/last.ckpt")["global_step"] == 2
    assert set(os.listdir(configs_here)) - before == {"elsewhere"}


# The frontier ablation's cell that configs/base.yaml is (docs/ablations.md quotes its figure as the main job's).
MAIN_JOB_CELL = ("frontier_recipe.yaml", "wsd + muon 0.0025, adamw 1.2e-2, vocab 3072, 2,900 steps, decay 30%")


def test_the_main_job_is_the_ablations_measured_cell(fit_parser, tmp_path: Path) -> None:
    """configs/base.yaml trains what the ablation measured: the same model, optimizer, schedule, data and steps as
    its cell (the seed, the run folder and the grid's logging-only flags apart), so no figure of the page is of a
    recipe the main job does not run."""
    from lit_transformer.recipes import ablate

    grid = ablate.Grid.load(ROOT / "configs" / "ablations" / MAIN_JOB_CELL[0])
    run = next(r for r in grid.runs(tmp_path, extra=[]) if r.cell == MAIN_JOB_CELL[1])
    with contextlib.chdir(ROOT):
        cell = fit_parser.parse_args(run.command("fit")[4:])
        main = fit_parser.parse_args(["--config", "configs/base.yaml"])
    assert cell.model == main.model
    seedless = [{k: v for k, v in vars(ns.data.init_args).items() if k != "seed"} for ns in (cell, main)]
    assert seedless[0] == seedless[1] and cell.data.class_path == main.data.class_path
    for key in ("max_steps", "val_check_interval", "limit_val_batches", "precision", "gradient_clip_val"):
        assert cell.trainer[key] == main.trainer[key], key
