"""The command line end to end: every YAML parses, a tiny run trains, logs, checkpoints, and its checkpoint generates."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import traceback
from pathlib import Path

import jsonargparse
import numpy as np
import pytest
import torch
from _forked import warm_python
from PIL import Image

from lit_transformer.cli.lightning_cli import main, run_cli

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
FRAGMENTS = sorted(p for p in CONFIGS.rglob("*.yaml") if p.parent.name in ("variants", "trainer"))
# configs/ablations holds grids for `python -m lit_transformer ablate`, not CLI configs (tests/test_ablate.py covers them).
STANDALONE = sorted(
    p
    for p in CONFIGS.rglob("*.yaml")
    if p.parent.name not in ("variants", "trainer") and "ablations" not in p.relative_to(CONFIGS).parts
)
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _print_config(*args: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        run_cli(["fit", *args, "--print_config"])
    assert exit_info.value.code in (0, None)
    return out.getvalue()


@pytest.mark.parametrize("path", STANDALONE, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_standalone_config_parses(path: Path):
    assert "model:" in _print_config("--config", str(path))


@pytest.mark.parametrize("path", FRAGMENTS, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_fragment_composes_with_the_base(path: Path):
    printed = _print_config("--config", str(CONFIGS / "base.yaml"), "--config", str(path))
    # The fragment's values win over the base's.
    import yaml

    fragment = yaml.safe_load(path.read_text())
    merged = yaml.safe_load(printed)

    def check(expected: dict, actual: dict, where: str) -> None:
        for key, value in expected.items():
            if isinstance(value, dict) and "class_path" not in value:
                check(value, actual[key], f"{where}.{key}")
            elif not isinstance(value, dict):
                assert actual[key] == value, f"{where}.{key}"

    check(fragment, merged, "")


def test_a_variant_is_one_flag_too():
    printed = _print_config("--config", str(CONFIGS / "base.yaml"), "--model.config.norm_position", "post")
    assert "norm_position: post" in printed


def _error_of(*args: str) -> str:
    """The refusal the command line prints for `fit --config presets/tiny ARGS`: exit status 2, a few lines."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(CONFIGS / "presets" / "tiny.yaml"), *args, "--print_config"])
    assert exit_info.value.code == 2
    assert len(err.getvalue().strip().splitlines()) <= 3, err.getvalue()
    return err.getvalue()


def test_a_typo_in_a_key_is_named_with_where_and_the_nearest_key(tmp_path: Path):
    message = _error_of("--model.config.d_modle", "64")
    assert "unknown key model.config.d_modle (the flag --model.config.d_modle)" in message
    assert "Did you mean model.config.d_model" in message
    typo = tmp_path / "typo.yaml"
    typo.write_text("model:\n  config:\n    norm_positon: post\n")
    message = _error_of("--config", str(typo))
    assert f"unknown key model.config.norm_positon (in {typo}, key model.config.norm_positon)" in message
    assert "Did you mean model.config.norm_position" in message


def test_a_value_outside_the_choices_names_them():
    message = _error_of("--model.config.norm_position", "middle")
    assert (
        "model.config.norm_position: 'middle' is not one of pre, post (the flag --model.config.norm_position)"
        in message
    )


def test_a_task_given_by_its_short_name_takes_its_options_from_a_later_flag_or_config(tmp_path: Path):
    """`--model.task translation --model.task.init_args.label_smoothing 0.1` (docs/config.md's example) and a variant
    that sets only the task's option (configs/variants/label_smoothing.yaml) over a config that names the task by its
    short name were refused: "model.task: expected Task or a string or null"."""
    import yaml

    def task(*args: str) -> dict:
        return yaml.safe_load(_print_config(*args))["model"]["task"]

    translate = ["--config", str(CONFIGS / "presets" / "tiny-translate.yaml")]
    given = task(*translate, "--model.task", "translation", "--model.task.init_args.label_smoothing", "0.3")
    assert given["class_path"].endswith("Translation") and given["init_args"]["label_smoothing"] == 0.3
    named = tmp_path / "task.yaml"
    named.write_text("model:\n  task: language_modeling\n")
    given = task("--config", str(CONFIGS / "presets" / "tiny.yaml"), "--config", str(named),
                 "--config", str(CONFIGS / "variants" / "label_smoothing.yaml"))  # fmt: skip
    assert given["class_path"].endswith("LanguageModeling") and given["init_args"]["label_smoothing"] == 0.1
    assert task("--config", str(CONFIGS / "presets" / "tiny.yaml"), "--config", str(named)) == "language_modeling"


def test_a_checkpoint_folder_that_follows_checkpoint_dirpath_is_refused_not_dropped(tmp_path: Path):
    """best_checkpoint.dirpath and preemption.dirpath are linked to checkpoint.dirpath: a flag was refused in words
    that did not say so ("str | pathlib.Path is not callable"), and a config's value was dropped in silence."""
    message = _error_of("--preemption.dirpath", str(tmp_path))
    assert "preemption.dirpath cannot be set" in message and "--checkpoint.dirpath DIR" in message
    config = tmp_path / "folders.yaml"
    config.write_text(f"best_checkpoint:\n  dirpath: {tmp_path / 'best'}\n")
    message = _error_of("--config", str(config))
    assert (
        "best_checkpoint.dirpath cannot be set" in message and f"given: best_checkpoint.dirpath in {config}" in message
    )


def test_a_run_folder_with_a_variable_or_home_is_one_folder(tmp_path: Path, monkeypatch):
    """`--trainer.default_root_dir '$RUNS/a'` (a YAML's value is never expanded by a shell) put the checkpoints in a
    folder named `$RUNS` under the working folder and TensorBoard's logs in $RUNS/a; with `~/a`, the TensorBoard
    version was claimed in a folder named `~` under the working folder."""
    from lit_transformer.data.cache import resolve_cache_dir

    monkeypatch.setenv("LIT_TRANSFORMER_CACHE", str(resolve_cache_dir()))  # the cache stays where it was
    monkeypatch.setenv("LIT_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    for root, expanded in (("$LIT_RUNS/a", tmp_path / "runs" / "a"), ("~/b", tmp_path / "home" / "b")):
        _cli("fit", "--config", str(CONFIGS / "presets" / "tiny.yaml"), "--trainer.max_steps", "1",
             "--trainer.default_root_dir", root, cwd=cwd)  # fmt: skip
        assert (expanded / "checkpoints" / "last.ckpt").is_file()
        assert (expanded / "tensorboard" / "version_0" / "config.yaml").is_file()
    assert list(cwd.iterdir()) == []


def test_a_data_file_and_init_from_with_a_variable_or_home_are_read_there(tmp_path: Path, monkeypatch):
    """`dataset: ~/corpus.txt` or `$DATA/corpus.txt` in a user's YAML (no shell expands it) was "does not exist", as
    was a `.ckpt` init_from so written, while cache_dir and a Hugging Face init_from folder were expanded."""
    from lit_transformer.cli.lightning_cli import expand_user_paths

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LIT_DATA", str(tmp_path / "data"))
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "corpus.txt").write_text("To be, or not to be, that is the question.\n" * 200)
    args = ["--config", str(CONFIGS / "presets" / "tiny.yaml"), "--data.init_args.dataset", "~/corpus.txt",
            "--trainer.default_root_dir", str(tmp_path / "run")]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        cli = run_cli(args, run=False)
    assert cli.datamodule.dataset == str(tmp_path / "home" / "corpus.txt")
    config = jsonargparse.Namespace(
        data=jsonargparse.Namespace(init_args=jsonargparse.Namespace(tokenizer="byte_bpe",
                                                                     predict_file="$LIT_DATA/prompts.txt")),
        model=jsonargparse.Namespace(init_from="~/runs/a/last.ckpt"),
    )  # fmt: skip
    expand_user_paths(config)
    assert config.data.init_args.predict_file == str(tmp_path / "data" / "prompts.txt")
    assert config.model.init_from == str(tmp_path / "home" / "runs" / "a" / "last.ckpt")
    assert config.data.init_args.tokenizer == "byte_bpe"  # a kind, a hub name: left as given


# ---- one real run, shared by the tests below --------------------------------------------------------------------


def _process(*args: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    """`python -m lit_transformer ARGS` as a process of its own, for what needs one (DDP starts its ranks): forked
    from a warm interpreter (tests/_forked.py), as is the second rank Lightning's launcher starts."""
    command = [sys.executable, "-m", "lit_transformer", *args]
    result = warm_python(env).run(command, cwd=cwd, env=env, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _cli(*args: str, cwd: Path, ok: bool = True) -> subprocess.CompletedProcess:
    """`python -m lit_transformer ARGS` run in this process, with what a process would give: its exit code, stdout,
    and stderr, where an uncaught exception appears as a Traceback. (A process of its own costs seconds of imports
    per command; tests/test_readme.py runs the README's commands as processes.)"""
    out, err, code = io.StringIO(), io.StringIO(), 0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as OMP_NUM_THREADS=1 would: two threads on a shared 2-core machine oversubscribe it
    try:
        with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(list(args))
            except SystemExit as exit_:  # what a process prints and returns for each kind of exit code
                if isinstance(exit_.code, str):
                    print(exit_.code, file=sys.stderr)
                code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
            except Exception:
                print(traceback.format_exc(), file=sys.stderr)
                code = 1
    finally:
        torch.set_num_threads(threads)
    result = subprocess.CompletedProcess(["lit_transformer", *args], code, out.getvalue(), err.getvalue())
    assert (result.returncode == 0) == ok, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("tiny")
    _cli(
        "fit",
        "--config",
        str(CONFIGS / "presets" / "tiny.yaml"),
        "--trainer.default_root_dir",
        str(run),
        "--trainer.logger.init_args.save_dir",
        str(run),
        "--checkpoint.dirpath",
        str(run / "checkpoints"),
        "--data.init_args.cache_dir",
        str(run / "cache"),
        cwd=ROOT,
    )
    return run


def test_fit_writes_a_last_checkpoint_with_the_tokenizer(tiny_run: Path):
    from lit_transformer.checkpoints.files import load_checkpoint

    checkpoint = load_checkpoint(tiny_run / "checkpoints" / "last.ckpt")
    assert checkpoint["global_step"] == 20
    assert "tokenizer" in checkpoint
    assert checkpoint["hyper_parameters"]["config"]["d_model"] == 32


def test_tensorboard_shows_curves_samples_attention_and_hparams(tiny_run: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = {p.parent for p in tiny_run.rglob("events.out.tfevents.*")}
    acc = EventAccumulator(str(events), size_guidance={"tensors": 0, "images": 0, "scalars": 0})
    acc.Reload()
    tags = acc.Tags()
    scalars = set(tags["scalars"])
    expected_scalars = ("train/loss", "train/ppl", "train/grad_norm", "val/loss", "val/ppl", "val/bpc")
    for expected in (*expected_scalars, "train/device/items_per_sec"):
        assert expected in scalars, (expected, sorted(scalars))
    assert any(s.startswith("lr-AdamW") for s in scalars), sorted(scalars)
    assert any("mfu" in s for s in scalars), sorted(scalars)
    assert any(t.startswith("samples/") for t in tags["tensors"]), tags["tensors"]
    assert any(t.startswith("attention/self/layer_0") for t in tags["images"]), tags["images"]
    logged = acc.Images("attention/self/layer_0")[-1]  # an RGB PNG of the heads, as AttentionMaps.images drew it
    pixels = np.asarray(Image.open(io.BytesIO(logged.encoded_image_string)))
    assert pixels.shape == (logged.height, logged.width, 3) and pixels.dtype == np.uint8
    assert pixels.min() < 64 and pixels.max() == 255  # dark labels and cells on white
    assert (events / "hparams.yaml").exists()


def test_validate_and_test_run_from_the_checkpoint(tiny_run: Path):
    common = _tiny_common(tiny_run)
    for command in ("validate", "test"):
        out = _cli(command, *common, cwd=tiny_run).stdout
        assert f"{'val' if command == 'validate' else 'test'}/ppl" in out
        assert f"{'val' if command == 'validate' else 'test'}/bpc" in out


def test_validate_scores_a_checkpoint_at_another_context_length(tiny_run: Path):
    """The evaluation of a trained model at context N is `validate` with blocks of N tokens (`python -m lit_transformer ablate`'s
    `evaluate`); the tiny run's learned position table (64) refuses 128-token blocks, saying why."""
    common = _tiny_common(tiny_run)
    failed = _cli("validate", *common, "--data.init_args.block_size", "128", cwd=tiny_run, ok=False)
    assert "learned positions cannot extrapolate" in failed.stderr + failed.stdout


@pytest.mark.parametrize(
    ("preset", "flags", "model_expected", "samples_expected"),
    [
        ("tiny", ["--model.generation.top_k", "10", "--samples.generation.max_new_tokens", "40"],
         {"temperature": 0.8, "top_k": 10}, {"max_new_tokens": 40, "temperature": 0.8, "top_k": 50}),
        ("tiny", ["--model.generation.temperature", "0"], {"temperature": 0.0, "top_k": 50}, None),
        ("tiny-translate", [], {"num_beams": 2, "length_penalty": 0.6, "length_penalty_form": "gnmt",
                                "early_stopping": True, "max_source_offset": 50}, None),
    ],
)  # fmt: skip
def test_a_decoding_field_given_keeps_the_tasks_other_defaults(tiny_run, tmp_path, preset, flags, model_expected,
                                                               samples_expected):  # fmt: skip
    """`predict --model.generation.top_k 10` decoded a language model greedily (every field not given took a bare
    GenerationConfig's default, temperature 0), `--samples.generation.max_new_tokens 40` turned the samples greedy,
    and tiny-translate's `generation: {num_beams: 2}` ranked beams by the plain length penalty 1.0, not the paper's
    GNMT 0.6 with early stopping: the fields given now start from the task's defaults, as generate's flags do, and
    the run records the merged values."""
    from lit_transformer.engine.task_outputs import GenerateSamples

    args = ["--config", str(CONFIGS / "presets" / f"{preset}.yaml"), "--trainer.default_root_dir", str(tmp_path)]
    args += ["--data.init_args.cache_dir", str(tiny_run / "cache"), *flags]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        cli = run_cli(args, run=False)
    for name, value in model_expected.items():
        assert getattr(cli.model.generation, name) == value, name
        assert cli.config.model.generation[name] == value and cli.model.hparams["generation"][name] == value
    (samples,) = [c for c in cli.trainer.callbacks if isinstance(c, GenerateSamples)]
    for name, value in (samples_expected or {}).items():
        assert getattr(samples.generation, name) == value and cli.config.samples.generation[name] == value, name


def test_the_merged_decoding_settings_keep_the_runs_checkpoints_loadable(tiny_run, tmp_path):
    """The merged model.generation went into the hyperparameters as a GenerationConfig object, which a weights_only
    load refuses: every checkpoint of a run with a `generation:` block (tiny-translate, translate-en-es) was refused
    by test --ckpt_path, translate, average and fit --ckpt_path. It is recorded as plain data, as LightningCLI's are."""
    from lit_transformer.checkpoints.files import load_checkpoint

    args = ["--config", str(CONFIGS / "presets" / "tiny-translate.yaml"), "--trainer.default_root_dir", str(tmp_path)]
    args += ["--data.init_args.cache_dir", str(tiny_run / "cache")]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        cli = run_cli(args, run=False)
    torch.save({"hyper_parameters": dict(cli.model.hparams)}, tmp_path / "hparams.ckpt")
    saved = load_checkpoint(tmp_path / "hparams.ckpt")["hyper_parameters"]["generation"]
    assert saved["num_beams"] == 2 and saved["length_penalty_form"] == "gnmt"


def test_the_runs_config_yaml_records_the_merged_decoding_settings(tiny_run, tmp_path):
    """config.yaml is written from a clone of the config (RunConfigFile keeps RUN_FOLDER), taken before the decoding
    fields were merged over the task's defaults: tiny-translate's run recorded length_penalty 1.0, form length and no
    early stopping, so the file given again with --config decoded otherwise than the run it came from."""
    import yaml
    from lightning.pytorch.cli import SaveConfigCallback

    args = ["--config", str(CONFIGS / "presets" / "tiny-translate.yaml"), "--trainer.default_root_dir", str(tmp_path)]
    args += ["--data.init_args.cache_dir", str(tiny_run / "cache")]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        cli = run_cli(args, run=False)
    (saver,) = [c for c in cli.trainer.callbacks if isinstance(c, SaveConfigCallback)]
    recorded = yaml.safe_load(saver.parser.dump(saver.config, skip_none=False))["model"]["generation"]
    assert recorded["num_beams"] == 2 and recorded["length_penalty_form"] == "gnmt"
    assert recorded["length_penalty"] == 0.6 and recorded["early_stopping"] is True


@pytest.mark.parametrize(
    ("preset", "flags", "group", "expected"),
    [
        ("tiny-translate", [], "model", {"num_beams": 2, "length_penalty": 0.6, "length_penalty_form": "gnmt",
                                         "early_stopping": True}),
        ("tiny", ["--model.generation.top_k", "10"], "model", {"temperature": 0.8, "top_k": 10}),
        ("tiny-translate", ["--samples.generation.max_new_tokens", "40"], "samples",
         {"max_new_tokens": 40, "num_beams": 4, "length_penalty_form": "gnmt"}),
    ],
)  # fmt: skip
def test_print_config_prints_the_decoding_the_run_would_use(tiny_run, tmp_path, preset, flags, group, expected):
    """`fit --print_config` (Lightning's way to start a config of one's own) printed a bare GenerationConfig's fields:
    tiny-translate's printed config, given back with --config, ranked beams by length penalty 1.0 without early
    stopping (not the translation task's GNMT 0.6), and a language model's `top_k: 10` printed temperature 0 (greedy).
    It prints what the run decodes with, and the printed file given back decodes so too."""
    import yaml

    base = ["--config", str(CONFIGS / "presets" / f"{preset}.yaml"), *flags]
    out = io.StringIO()
    with pytest.raises(SystemExit), contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        run_cli([*base, "--print_config"], run=False)
    printed = yaml.safe_load(out.getvalue())[group]["generation"]
    assert {name: printed[name] for name in expected} == expected
    (tmp_path / "printed.yaml").write_text(out.getvalue())
    args = ["--config", str(tmp_path / "printed.yaml"), "--trainer.default_root_dir", str(tmp_path / "run")]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        cli = run_cli([*args, "--data.init_args.cache_dir", str(tiny_run / "cache")], run=False)
    owner = cli.model if group == "model" else next(c for c in cli.trainer.callbacks if hasattr(c, "num_translations"))
    assert {name: getattr(owner.generation, name) for name in expected} == expected


def test_evaluation_tokenizes_with_the_checkpoints_tokenizer(tiny_run: Path):
    """validate, test and predict read their data with the tokenizer saved in --ckpt_path: trained again from these
    data settings (a shorter sample of the corpus), the char tokenizer would hold other characters under other ids."""
    from lit_transformer.checkpoints.files import load_checkpoint

    saved = load_checkpoint(tiny_run / "checkpoints" / "last.ckpt")["tokenizer"]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        cli = run_cli(["validate", *_tiny_common(tiny_run), "--data.init_args.max_chars", "20000"])
    assert cli.datamodule.tokenizer.to_str() == saved and cli.model.tokenizer.to_str() == saved
    assert "val/ppl" in cli.trainer.callback_metrics


def test_resuming_with_data_settings_that_train_another_tokenizer_is_refused(tiny_run: Path, tmp_path: Path):
    """Before any data is prepared or any step taken, naming the flag that keeps the checkpoint's tokenizer."""
    import shutil

    (tmp_path / "checkpoints").mkdir()
    last = shutil.copy(tiny_run / "checkpoints" / "last.ckpt", tmp_path / "checkpoints" / "last.ckpt")
    before = Path(last).read_bytes()
    common = _tiny_common(tiny_run)[:-2] + ["--checkpoint.dirpath", str(tmp_path / "checkpoints")]
    refused = _cli("fit", *common, "--ckpt_path", "last", "--data.init_args.max_chars", "20000", cwd=tmp_path, ok=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert "resumes a run whose tokenizer is not the one this run's data settings give" in refused.stderr
    assert f"--data.init_args.tokenizer {last}" in refused.stderr
    assert Path(last).read_bytes() == before
    assert _cli("fit", *common, "--ckpt_path", "last", "--trainer.max_steps", "22", cwd=tmp_path).returncode == 0


def test_with_a_checkpoint_the_command_lines_run_choices_apply(tiny_run: Path, tmp_path: Path, caplog):
    """How a run computes is its own choice, not the checkpoint's: resumed with activation checkpointing the blocks
    recompute (and the run's checkpoints record it), validated with compile the model says so; the architecture and
    the recipe stay the checkpoint's, and a line names each setting of the command line they replaced."""
    import shutil

    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    from lit_transformer.checkpoints.files import load_checkpoint

    (tmp_path / "checkpoints").mkdir()
    shutil.copy(tiny_run / "checkpoints" / "last.ckpt", tmp_path / "checkpoints" / "last.ckpt")
    common = _tiny_common(tiny_run)[:-2] + ["--checkpoint.dirpath", str(tmp_path / "checkpoints")]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        cli = run_cli(
            ["fit", *common, "--ckpt_path", "last", "--trainer.max_steps", "22", "--trainer.limit_val_batches", "0"]
            + ["--model.activation_checkpointing", "true", "--model.config.n_layers", "5", "--model.optim.lr", "1"]
        )
    assert any(isinstance(m, CheckpointWrapper) for m in cli.model.model.modules())
    assert cli.trainer.global_step == 22
    saved = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert saved["global_step"] == 22 and saved["hyper_parameters"]["activation_checkpointing"] is True
    trained = load_checkpoint(tiny_run / "checkpoints" / "last.ckpt")["hyper_parameters"]
    assert saved["hyper_parameters"]["config"]["n_layers"] == trained["config"]["n_layers"] != 5
    assert saved["hyper_parameters"]["optim"]["lr"] == trained["optim"]["lr"] != 1
    (notice,) = [r.getMessage() for r in caplog.records if "settings are not used" in r.getMessage()]
    assert f"model.config.n_layers 5 (the checkpoint's: {trained['config']['n_layers']})" in notice
    assert f"model.optim.lr 1.0 (the checkpoint's: {trained['optim']['lr']})" in notice
    assert "--model.init_from" in notice and "activation_checkpointing" not in notice
    caplog.clear()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        cli = run_cli(["validate", *_tiny_common(tiny_run), "--model.compile", "true", "--model.optim.lr", "1"])
    assert cli.model.hparams.compile is True and "val/ppl" in cli.trainer.callback_metrics
    assert not [r for r in caplog.records if "not used" in r.getMessage()]  # evaluation reads no optimizer setting
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        run_cli(["validate", *_tiny_common(tiny_run), "--model.config.positions", "rope"])
    (notice,) = [r.getMessage() for r in caplog.records if "not used" in r.getMessage()]
    assert "model.config.positions rope (the checkpoint's: learned)" in notice and "init_from" not in notice


def test_init_from_beside_a_full_checkpoint_is_named_as_unused(tiny_run: Path, caplog):
    """--model.init_from with --ckpt_path of a full (not LoRA) checkpoint: the checkpoint's weights are the model, so
    init_from is never read; it was dropped without a word, like the architecture settings the notice names."""
    other = str(tiny_run / "checkpoints" / "last.ckpt")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        run_cli(["validate", *_tiny_common(tiny_run), "--model.init_from", other])
    (notice,) = [r.getMessage() for r in caplog.records if "not used" in r.getMessage()]
    assert f"model.init_from {other} (the checkpoint's: None)" in notice


def test_ckpt_path_best_scores_the_best_checkpoint_the_run_recorded(tiny_run: Path, tmp_path: Path):
    """In a new process no callback remembers a best: the run folder's last.ckpt records it. Without such a record
    the command ends in one line naming the folder (it was a traceback from inside Lightning)."""
    common = _tiny_common(tiny_run)[:-2] + ["--checkpoint.dirpath", str(tiny_run / "checkpoints")]
    (best,) = (tiny_run / "checkpoints").glob("best-*.ckpt")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        cli = run_cli(["test", *common, "--ckpt_path", "best"])
    assert cli.trainer.ckpt_path == str(best) and "test/ppl" in cli.trainer.callback_metrics
    refused = _cli("test", *common[:-2], "--trainer.default_root_dir", str(tmp_path), "--ckpt_path", "best",
                   cwd=tmp_path, ok=False)  # fmt: skip
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert f"--ckpt_path best: no last.ckpt in {tmp_path}/checkpoints (checkpoint.dirpath) records" in refused.stderr


def test_a_model_folder_given_as_ckpt_path_is_answered_with_the_flags_that_score_it(tiny_run: Path, tmp_path: Path):
    """An export (or a Hugging Face folder) holds weights, not a run: --model.init_from scores it, as the checkpoint
    it came from scores."""
    from lit_transformer.cli.model_commands import export_main

    export_main(["--checkpoint", str(tiny_run / "checkpoints" / "last.ckpt"), "--format", "hf", "--out", str(tmp_path)])
    common = _tiny_common(tiny_run)[:-2]
    refused = _cli("validate", *common, "--ckpt_path", str(tmp_path), cwd=tmp_path, ok=False)
    fix = f"--model.init_from {tmp_path} --data.init_args.tokenizer {tmp_path / 'tokenizer.json'}, without --ckpt_path"
    assert "is a model folder, not a checkpoint" in refused.stderr and fix in refused.stderr, refused.stderr
    scores = []
    for args in (["--ckpt_path", str(tiny_run / "checkpoints" / "last.ckpt")], fix.split(", ")[0].split()):
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            scores.append(run_cli(["validate", *common, *args]).trainer.callback_metrics["val/nll"].item())
    assert scores[0] == pytest.approx(scores[1], abs=1e-5)


def test_evaluation_with_a_tokenizer_file_other_than_the_checkpoints_is_refused(tiny_run: Path, tmp_path: Path):
    from lit_transformer.data.text import train_tokenizer

    other = tmp_path / "other.json"
    train_tokenizer(["To be, or not to be, that is the question."], "char", 256).save(str(other))
    refused = _cli("test", *_tiny_common(tiny_run), "--data.init_args.tokenizer", str(other), cwd=tmp_path, ok=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert f"was trained with another tokenizer than data.init_args.tokenizer {other} gives" in refused.stderr


@pytest.mark.parametrize("content", [None, "", '{"text": "ROMEO:"}\n{"txt": 1}\n'], ids=["missing", "empty", "bad"])
def test_predict_inputs_are_refused_before_any_data_is_prepared(tiny_run: Path, tmp_path: Path, content):
    """A missing, empty or malformed predict_file is refused in one line before the corpus is read (its preparation
    can take minutes): the data cache stays empty."""
    inputs = tmp_path / ("prompts.jsonl" if content and "{" in content else "prompts.txt")
    if content is not None:
        inputs.write_text(content)
    common = _tiny_common(tiny_run)
    common[common.index(str(tiny_run / "cache"))] = str(tmp_path / "cache")
    refused = _cli("predict", *common, "--data.init_args.predict_file", str(inputs), cwd=tmp_path, ok=False)
    assert refused.returncode in (1, 2) and "Traceback" not in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) <= 3 and str(inputs) in refused.stderr, refused.stderr
    assert not (tmp_path / "cache").exists()


def test_predict_writes_one_json_line_per_input_line(tiny_run: Path):
    """predict reads prompts (one per line; an empty line is a prompt too), generates with any GenerationConfig field
    from the command line, and writes {"input", "output", "tokens"} per line, in order."""
    import json

    prompts = ["ROMEO:", "", "First Citizen: We are", "Good"]
    (tiny_run / "prompts.txt").write_text("\n".join(prompts) + "\n")
    output = tiny_run / "predictions.jsonl"
    args = ["--data.init_args.predict_file", "prompts.txt", "--data.init_args.predict_batch_size", "3"]
    args += ["--predictions.output", str(output), "--model.generation.max_new_tokens", "7"]
    args += ["--model.generation.temperature", "0"]
    _cli("predict", *_tiny_common(tiny_run), *args, cwd=tiny_run)
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert [r["input"] for r in rows] == prompts
    from lit_transformer.inference import load_model

    loaded = load_model(tiny_run / "checkpoints" / "last.ckpt")
    for row in rows:
        assert len(row["tokens"]) <= 7 and row["output"] == loaded.target_tokenizer.decode(row["tokens"])
        # greedy: the same tokens as the Python API gives for that prompt alone
        alone = loaded.model.generate(torch.tensor([loaded.encode(row["input"])]), max_new_tokens=7)[0].tolist()
        eos = loaded.config.eos_token_id
        assert row["tokens"] == (alone[: alone.index(eos)] if eos in alone else alone)
    # a JSONL input with a text field works the same; a malformed line is named
    (tiny_run / "prompts.jsonl").write_text("".join(json.dumps({"text": p}) + "\n" for p in prompts[:2]))
    args[1] = "prompts.jsonl"
    _cli("predict", *_tiny_common(tiny_run), *args, cwd=tiny_run)
    assert [json.loads(line)["input"] for line in output.read_text().splitlines()] == prompts[:2]
    (tiny_run / "bad.jsonl").write_text('{"text": "a"}\n{"txt": "b"}\n')
    args[1] = "bad.jsonl"
    failed = _cli("predict", *_tiny_common(tiny_run), *args, cwd=tiny_run, ok=False)
    assert 'bad.jsonl:2 has no string field "text"' in failed.stderr
    failed = _cli("predict", *_tiny_common(tiny_run), cwd=tiny_run, ok=False)
    assert "predict needs inputs: --data.init_args.predict_file FILE" in failed.stderr


def test_predict_output_in_the_run_folder_placeholder_is_written_there(tiny_run: Path, tmp_path: Path):
    """`predictions.output: ${trainer.default_root_dir}/preds.jsonl`, written as config.yaml writes the checkpoints'
    and TensorBoard's folders, made a folder named `${trainer.default_root_dir}` in the working folder."""
    (tmp_path / "prompts.txt").write_text("ROMEO:\n")
    config = tmp_path / "predict.yaml"
    config.write_text("predictions:\n  output: ${trainer.default_root_dir}/preds.jsonl\n")
    args = ["--data.init_args.predict_file", str(tmp_path / "prompts.txt"), "--config", str(config)]
    args += ["--model.generation.max_new_tokens", "2", "--trainer.default_root_dir", str(tmp_path / "run")]
    _cli("predict", *_tiny_common(tiny_run), *args, cwd=tmp_path)
    assert (tmp_path / "run" / "preds.jsonl").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["predict.yaml", "prompts.txt", "run"]


@pytest.mark.parametrize(
    "inputs, output, refusal",
    [
        ("folder", "out.jsonl", "predict_file 'folder' is a folder: give a file with one input per line"),
        ("in.txt", "folder", "--predictions.output folder is a folder: give the file to write"),
        ("in.txt", "in.txt", "--predictions.output in.txt is the predict_file: the predictions would overwrite"),
    ],
    ids=["predict_file-folder", "output-folder", "output-is-input"],
)
def test_predict_refuses_a_folder_or_its_own_inputs_for_a_file(tiny_run: Path, inputs, output, refusal):
    """A folder as predict_file was called missing; as the output, an IsADirectoryError traceback; the predict_file
    as the output was overwritten by its own predictions."""
    (tiny_run / "folder").mkdir(exist_ok=True)
    (tiny_run / "in.txt").write_text("ROMEO:\n")
    args = ["--data.init_args.predict_file", inputs, "--predictions.output", output]
    failed = _cli("predict", *_tiny_common(tiny_run), *args, cwd=tiny_run, ok=False)
    assert refusal in failed.stderr and "Traceback" not in failed.stderr, failed.stderr
    assert (tiny_run / "in.txt").read_text() == "ROMEO:\n"


def test_predict_reads_no_training_data(tiny_run: Path, tmp_path: Path):
    """predict needs the checkpoint (its tokenizer) and the predict_file alone: it prepared the whole training corpus
    first, and refused to run where the corpus was not (a checkpoint taken to another machine). With the dataset
    gone and an empty cache, the predictions are the same, and nothing is prepared."""
    (tmp_path / "prompts.txt").write_text("ROMEO:\nJULIET:\n")
    args = ["--data.init_args.predict_file", "prompts.txt", "--model.generation.temperature", "0"]
    args += ["--model.generation.max_new_tokens", "6"]
    _cli("predict", *_tiny_common(tiny_run), *args, "--predictions.output", "with.jsonl", cwd=tmp_path)
    common = _tiny_common(tiny_run)
    common[common.index(str(tiny_run / "cache"))] = str(tmp_path / "cache")
    gone = ["--data.init_args.dataset", str(tmp_path / "gone.txt"), "--predictions.output", "without.jsonl"]
    _cli("predict", *common, *args, *gone, cwd=tmp_path)
    assert (tmp_path / "without.jsonl").read_text() == (tmp_path / "with.jsonl").read_text()
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]  # no shard, no tokenizer


def _tiny_common(tiny_run: Path) -> list[str]:
    return [
        "--config",
        str(CONFIGS / "presets" / "tiny.yaml"),
        "--trainer.logger",
        "false",
        "--data.init_args.cache_dir",
        str(tiny_run / "cache"),
        "--ckpt_path",
        str(tiny_run / "checkpoints" / "last.ckpt"),
    ]


def test_generate_prints_a_continuation(tiny_run: Path):
    out = _cli(
        "generate",
        "--checkpoint",
        str(tiny_run / "checkpoints" / "last.ckpt"),
        "--prompt",
        "ROMEO:",
        "--max_new_tokens",
        "20",
        "--temperature",
        "1.0",
        "--seed",
        "3",
        cwd=tiny_run,
    ).stdout
    assert out.startswith("ROMEO:") and len(out.strip()) > len("ROMEO:"), out


def test_generate_runs_past_the_context_and_serves_people(tiny_run: Path):
    """The tiny model's context is 64 tokens: 200 new tokens slide past it. Prompt files, several samples, stop
    strings, and a prompt longer than the context (a note, not a traceback)."""
    from lit_transformer.inference import load_model

    checkpoint = str(tiny_run / "checkpoints" / "last.ckpt")
    loaded = load_model(checkpoint)
    common = ["generate", "--checkpoint", checkpoint, "--seed", "3", "--eos_token_id=-1"]  # -1: no EOS ends a row
    out = _cli(*common, "--prompt", "ROMEO:", "--max_new_tokens", "200", cwd=tiny_run).stdout
    assert out.startswith("ROMEO:")
    # 200 tokens of a character tokenizer; special tokens sampled by the untrained model print nothing
    assert len(loaded.encode(out[len("ROMEO:") :].rstrip("\n"))) > 2 * loaded.config.max_seq_len
    (tiny_run / "two.txt").write_text("ROMEO:\nJULIET:\n")
    out = _cli(*common, "--prompt_file", "two.txt", "--num_samples", "2", "--max_new_tokens", "5", cwd=tiny_run).stdout
    headers = [line for line in out.splitlines() if line.startswith("--- prompt")]
    assert headers == [
        "--- prompt 1, sample 1",
        "--- prompt 1, sample 2",
        "--- prompt 2, sample 1",
        "--- prompt 2, sample 2",
    ]
    out = _cli(*common, "--prompt", "ROMEO:", "--max_new_tokens", "60", "--stop", "e", cwd=tiny_run).stdout
    assert "e" not in out[len("ROMEO:") :]  # generation ended at the first "e", which is cut
    long_prompt = "ROMEO: " * 200
    result = _cli(*common, "--prompt", long_prompt, "--max_new_tokens", "5", cwd=tiny_run)
    assert "more than the model's context of 64" in result.stderr and "Traceback" not in result.stderr
    (tiny_run / "prompts").mkdir(exist_ok=True)  # a folder was called missing
    result = _cli(*common, "--prompt_file", "prompts", cwd=tiny_run, ok=False)
    assert "--prompt_file prompts is a folder: give a text file with one prompt per line" in result.stderr
    for empty in ("empty.txt", "empty.jsonl"):  # refused naming this command's flag (not predict's predict_file)
        (tiny_run / empty).write_text("\n" if empty.endswith("jsonl") else "")
        result = _cli(*common, "--prompt_file", empty, cwd=tiny_run, ok=False)
        assert f"--prompt_file {empty} is empty: write one prompt per line" in result.stderr, result.stderr
    result = _cli(*common, "--prompt", "ROMEO:", "--prompt_file", "two.txt", cwd=tiny_run, ok=False)
    assert "generate takes --prompt TEXT or --prompt_file FILE, not both" in result.stderr  # --prompt was dropped
    out = _cli(*common, "--max_new_tokens", "5", cwd=tiny_run).stdout  # no prompt: a sample from a newline
    assert out.startswith("\n") and len(out) > 1


@pytest.mark.parametrize("flag", ["--input", "--prompt_file"])
def test_an_input_file_not_in_utf8_is_refused_with_a_fix_the_command_has(tmp_path: Path, flag):
    """`translate --input` and `generate --prompt_file` read UTF-8 and have no encoding setting: the refusal of a
    Latin-1 file named predict's --data.init_args.encoding, which both commands reject as an unknown key."""
    from lit_transformer.data.sources import DataFileError
    from lit_transformer.inference import _inputs

    path = tmp_path / "latin.txt"
    path.write_bytes("caf\u00e9\n".encode("latin-1"))
    with pytest.raises(DataFileError) as refused:
        _inputs(flag, str(path), "sentence")
    message = str(refused.value)
    assert "--data.init_args.encoding" not in message
    assert f"{path}:1 is not utf-8 text" in message and f"{flag} reads UTF-8" in message and "iconv" in message


@pytest.mark.parametrize("num_beams", ["1", "2"])
def test_generate_s_text_ends_before_the_eos_token_id_it_is_given(tiny_run: Path, num_beams):
    """--eos_token_id naming a token the model writes ends the text before it, greedy or beams, as predict's and
    serve's rows end: greedy decoding printed that token's text too."""
    import torch

    from lit_transformer.inference import load_model

    checkpoint = str(tiny_run / "checkpoints" / "last.ckpt")
    loaded = load_model(checkpoint)
    common = ["--max_new_tokens", "12", "--temperature", "0", "--num_beams", num_beams]
    special = {loaded.config.pad_token_id, loaded.config.bos_token_id, loaded.config.eos_token_id}
    for text in ("ROMEO:", "The king is ", "And "):  # a prompt the briefly trained model continues with text
        ids = torch.tensor([loaded.encode(text)])
        free = loaded.model.generate(ids, max_new_tokens=12, eos_token_id=-1, num_beams=int(num_beams))[0].tolist()
        written = [t for t in free if t not in special]
        if written:
            break
    eos = written[0]  # the first token with text of its own
    out = _cli("generate", "--checkpoint", checkpoint, "--prompt", text, "--eos_token_id", str(eos), *common,
               cwd=tiny_run).stdout  # fmt: skip
    ended = loaded.model.generate(ids, max_new_tokens=12, eos_token_id=eos, num_beams=int(num_beams))[0].tolist()
    expected = loaded.target_tokenizer.decode(ended[: ended.index(eos)], skip_special_tokens=True)
    assert out == text + expected + "\n", (out, expected, loaded.target_tokenizer.decode([eos]))


@pytest.mark.parametrize(
    "flags, refusal",
    [
        (["--window_keep", "100"], "window_keep=100 exceeds max_seq_len=64"),
        (["--stop_token_ids", "500"], "eos_token_id/stop_token_ids [500] are not tokens of this model"),
        (["--device", "tpu"], "--device tpu is not a device decoding runs on: give cpu, cuda (or cuda:N), mps or auto"),
        (["--num_beams", "3", "--num_samples", "2"], "beam search is deterministic, so every sample would be the same"),
    ],
    ids=["window_keep", "stop_token_ids", "device", "beams-samples"],
)
def test_generate_refuses_settings_the_model_cannot_use_before_printing(tiny_run: Path, flags, refusal):
    """A window past the context was refused once the window slid, after the prompt had been printed (on the line of
    the refusal); a device torch does not know was a RuntimeError traceback; samples of beam search were the same."""
    checkpoint = str(tiny_run / "checkpoints" / "last.ckpt")
    result = _cli("generate", "--checkpoint", checkpoint, "--prompt", "ROMEO:", "--max_new_tokens", "80", *flags,
                  cwd=tiny_run, ok=False)  # fmt: skip
    assert result.returncode == 2 and refusal in result.stderr, result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr


def test_base_is_refused_for_a_checkpoint_that_is_not_a_lora_runs(tiny_run: Path):
    """--base (where a LoRA checkpoint's base is now) was ignored for a full checkpoint, without a word."""
    checkpoint = str(tiny_run / "checkpoints" / "last.ckpt")
    result = _cli("generate", "--checkpoint", checkpoint, "--base", checkpoint, cwd=tiny_run, ok=False)
    assert f"--base {checkpoint}: {checkpoint} is not a LoRA checkpoint" in result.stderr, result.stderr


def test_generate_names_the_sampling_flags_beam_search_does_not_read(tiny_run: Path):
    checkpoint = str(tiny_run / "checkpoints" / "last.ckpt")
    common = ["generate", "--checkpoint", checkpoint, "--prompt", "ROMEO:", "--max_new_tokens", "5", "--num_beams", "2"]
    result = _cli(*common, "--top_k", "5", "--temperature", "0.5", cwd=tiny_run)
    assert "note: --num_beams 2 decodes deterministically: --temperature, --top_k are not read" in result.stderr
    assert "note:" not in _cli(*common, cwd=tiny_run).stderr  # the task's sampling defaults are not the user's


@pytest.mark.parametrize(
    ("command", "argv", "field", "value"),
    [
        ("translate", [], "max_source_offset", 50),
        ("translate", ["--max_source_offset", "null"], "max_source_offset", None),
        ("translate", ["--max_source_offset", "7"], "max_source_offset", 7),
        ("generate", [], "top_k", 50),
        ("generate", ["--top_k", "null"], "top_k", None),
        ("generate", ["--temperature", "null"], "temperature", 0.8),  # a field without None: its default
    ],
)
def test_a_decoding_flag_given_as_null_replaces_the_task_default(command, argv, field, value):
    """--help says max_source_offset None bounds a translation by max_new_tokens alone and top_k None keeps every
    token: given as null, both were dropped as if unset, and the task's +50 cap and top-k 50 stayed."""
    from lit_transformer.cli.arguments import parse
    from lit_transformer.cli.model_commands import decoding_parser
    from lit_transformer.inference import _settings
    from lit_transformer.tasks import LanguageModeling, Translation

    args = parse(decoding_parser(command, command), ["--checkpoint", "x.ckpt", *argv])
    task = Translation if command == "translate" else LanguageModeling
    assert getattr(_settings(args, task), field) == value


def test_generate_refuses_a_missing_checkpoint_or_another_kind_of_file(tmp_path: Path):
    result = _cli("generate", "--checkpoint", str(tmp_path / "nope.ckpt"), cwd=tmp_path, ok=False)
    assert "nope.ckpt" in result.stderr and "Traceback" not in result.stderr
    (tmp_path / "hf").mkdir()
    result = _cli("generate", "--checkpoint", str(tmp_path / "hf"), cwd=tmp_path, ok=False)
    assert "is a folder without a config.json, not a model" in result.stderr and "Traceback" not in result.stderr
    (tmp_path / "hf" / "config.json").write_text('{"model_type": "bert"}')
    result = _cli("generate", "--checkpoint", str(tmp_path / "hf"), cwd=tmp_path, ok=False)
    assert "config.json describes a bert: give a folder `export" in result.stderr and "Traceback" not in result.stderr
    (tmp_path / "hf" / "config.json").write_text('{"model_type": "gpt2"')
    result = _cli("generate", "--checkpoint", str(tmp_path / "hf"), cwd=tmp_path, ok=False)
    assert "config.json is not JSON" in result.stderr and "Traceback" not in result.stderr
    (tmp_path / "model.safetensors").write_bytes(b"x" * 16)
    result = _cli("generate", "--checkpoint", str(tmp_path / "model.safetensors"), cwd=tmp_path, ok=False)
    assert "is a .safetensors file of an export, not a checkpoint: give its folder" in result.stderr


def test_a_model_of_two_vocabularies_is_evaluated_with_both_whatever_shared_vocab_says(tmp_path: Path):
    """Trained with --data.init_args.shared_vocab false, then validated with the preset's settings (shared): the data
    is read with the checkpoint's source and target tokenizers, each on its side."""
    from lit_transformer.checkpoints.files import load_checkpoint

    common = ["--config", str(CONFIGS / "presets" / "tiny-translate.yaml"), "--trainer.logger", "false"]
    common += ["--data.init_args.cache_dir", str(tmp_path / "cache"), "--data.init_args.max_pairs", "300"]
    short = ["--trainer.max_steps", "2", "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "1"]
    short += ["--checkpoint.dirpath", str(tmp_path / "ckpt"), "--trainer.num_sanity_val_steps", "0"]
    _cli("fit", *common, *short, "--data.init_args.shared_vocab", "false", cwd=tmp_path)
    saved = load_checkpoint(tmp_path / "ckpt" / "last.ckpt")
    assert saved["tokenizer"] != saved["target_tokenizer"]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        cli = run_cli(
            [
                "validate",
                *common,
                "--trainer.limit_val_batches",
                "1",
                "--ckpt_path",
                str(tmp_path / "ckpt" / "last.ckpt"),
            ]
        )
    assert [t.to_str() for t in cli.datamodule.tokenizers] == [saved["tokenizer"], saved["target_tokenizer"]]
    assert "val/nll" in cli.trainer.callback_metrics


def test_translation_trains_logs_bleu_and_translates(tmp_path: Path):
    run = tmp_path
    _cli(
        "fit",
        "--config",
        str(CONFIGS / "presets" / "tiny-translate.yaml"),
        "--trainer.logger.init_args.save_dir",
        str(run),
        "--checkpoint.dirpath",
        str(run / "checkpoints"),
        "--data.init_args.cache_dir",
        str(run / "cache"),
        cwd=ROOT,
    )
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = {p.parent for p in run.rglob("events.out.tfevents.*")}
    acc = EventAccumulator(str(events), size_guidance={"images": 0, "scalars": 0})
    acc.Reload()
    assert "val/bleu" in acc.Tags()["scalars"]
    assert any(t.startswith("val/bleu_signature") for t in acc.Tags()["tensors"]), acc.Tags()["tensors"]
    assert {"attention/encoder/layer_0", "attention/cross/layer_0"} <= set(acc.Tags()["images"])
    out = _cli(
        "translate",
        "--checkpoint",
        str(run / "checkpoints" / "last.ckpt"),
        "--text",
        "In the beginning God created the heaven and the earth.",
        "--max_new_tokens",
        "12",
        "--num_beams",  # greedy: the paper's length penalty makes a 20-step model's beams prefer the empty output
        "1",
        cwd=run,
    )
    assert out.stdout.strip()
    # predict: one JSON line per source line, equal to `translate --input` on the same file
    import json

    sources = ["In the beginning God created the heaven and the earth.", "And God said, Let there be light."]
    (run / "sources.txt").write_text("\n".join(sources) + "\n")
    args = ["--config", str(CONFIGS / "presets" / "tiny-translate.yaml"), "--trainer.logger", "false"]
    args += ["--data.init_args.cache_dir", str(run / "cache"), "--ckpt_path", str(run / "checkpoints" / "last.ckpt")]
    args += ["--data.init_args.predict_file", "sources.txt", "--predictions.output", "out.jsonl"]
    # A data setting that shapes the tokenizer's sample (fit read 2,000 pairs) would train another BPE of the same
    # size: predict reads with the checkpoint's (no second tokenizer is trained), as translate does.
    args += ["--data.init_args.max_pairs", "300"]
    _cli("predict", *args, "--model.generation.max_new_tokens", "12", cwd=run)
    assert len(list((run / "cache" / "tokenizers").glob("*.json"))) == 1
    rows = [json.loads(line) for line in (run / "out.jsonl").read_text().splitlines()]
    assert [r["input"] for r in rows] == sources
    translated = _cli(
        "translate",
        "--checkpoint",
        str(run / "checkpoints" / "last.ckpt"),
        "--input",
        "sources.txt",
        "--max_new_tokens",
        "12",
        "--num_beams",
        "2",
        cwd=run,
    ).stdout.splitlines()
    assert [r["output"] for r in rows] == translated
    # A stop string, which translate's flags offer, cuts its output as it cuts predict's (translate ignored it).
    stop = max(translated, key=len)[1:3]
    assert len(stop) == 2, translated
    _cli("predict", *args, "--model.generation.max_new_tokens", "12", f'--model.generation.stop=["{stop}"]', cwd=run)
    rows = [json.loads(line) for line in (run / "out.jsonl").read_text().splitlines()]
    common = ["--checkpoint", str(run / "checkpoints" / "last.ckpt"), "--max_new_tokens", "12", "--num_beams", "2"]
    stopped = _cli("translate", *common, "--input", "sources.txt", "--stop", stop, cwd=run).stdout.splitlines()
    assert [r["output"] for r in rows] == stopped and all(stop not in line for line in stopped)
    assert stopped != translated


@pytest.mark.parametrize(
    "typed, meant",
    [
        ("\\n\\n", "\n\n"),
        ("a\\tb", "a\tb"),
        ("\\u00bf", "¿"),
        ("¿", "¿"),
        ("é", "é"),
        ("。", "。"),
        ("Qué\\n", "Qué\n"),
    ],
)
def test_a_stop_string_keeps_its_characters_and_reads_typed_escapes(typed, meant):
    """--stop "¿" was read through unicode_escape alone, which takes the UTF-8 bytes for Latin-1: "Â¿", a string the
    text never holds, so generation never stopped there (a Spanish or Chinese stop string did nothing)."""
    from lit_transformer.inference import typed_escapes

    assert typed_escapes(typed) == meant


def test_predict_with_several_processes_writes_one_file_in_input_order(tmp_path: Path) -> None:
    """Two ranks' predictions (the distributed sampler interleaves the inputs and repeats one to even the shares):
    one predictions.jsonl, each input once, in input order, and no part file left. Each rank wrote a `.rankN` file of
    its own, in the sampler's order, which no page named."""
    from types import SimpleNamespace

    from lit_transformer.engine.task_outputs import PredictionWriter

    output = tmp_path / "predictions.jsonl"
    shares = {0: [0, 2, 4], 1: [1, 3, 0]}  # 5 inputs over 2 ranks: rank 1's last is input 0 again
    writers = {}
    for rank, indices in shares.items():
        trainer = SimpleNamespace(world_size=2, global_rank=rank, is_global_zero=rank == 0, datamodule=None,
                                  default_root_dir=str(tmp_path), strategy=SimpleNamespace(barrier=lambda *a: None))  # fmt: skip
        writer = writers[rank] = (PredictionWriter(str(output)), trainer)
        writer[0].on_predict_start(trainer, None)
        rows = [{"input": f"line {i}", "output": str(i)} for i in indices]
        writer[0].write_on_batch_end(trainer, None, rows[:2], indices[:2], {}, 0, 0)
        writer[0].write_on_batch_end(trainer, None, rows[2:], indices[2:], {}, 1, 0)
    for rank in (1, 0):  # the first rank merges once every rank's part is whole (a barrier in a real run)
        writers[rank][0].on_predict_end(writers[rank][1], None)
    import json

    lines = [json.loads(line) for line in output.read_text().splitlines()]
    assert [row["output"] for row in lines] == ["0", "1", "2", "3", "4"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["predictions.jsonl"]


def test_ddp_spawn_with_a_callback_pickle_refuses_is_one_line(tmp_path):
    """ddp_spawn pickles the trainer to start its processes; Lightning's EMA callback holds a local function, which
    ended the run in a 24-frame traceback from multiprocessing."""
    result = _cli(
        "fit", "--config", "presets/tiny", "--trainer.accelerator", "cpu", "--trainer.devices", "2",
        "--trainer.strategy", "ddp_spawn", "--trainer.max_steps", "1", "--trainer.default_root_dir", str(tmp_path / "r"),
        "--trainer.callbacks+=lightning.pytorch.callbacks.EMAWeightAveraging",
        cwd=tmp_path, ok=False,
    )  # fmt: skip
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "start method spawn" in result.stderr and "--trainer.strategy ddp" in result.stderr


def test_the_checkpoints_line_names_the_last_checkpoint_that_spawned_processes_wrote(tmp_path):
    """ddp_spawn and ddp_fork train in child processes: the parent's callbacks never see the save, and the closing
    line said "final: none written" beside the last.ckpt the run had written."""
    import types

    from lightning.pytorch.callbacks import ModelCheckpoint

    from lit_transformer.cli.lightning_cli import checkpoints_line

    callback = ModelCheckpoint(dirpath=str(tmp_path), save_last=True)
    trainer = types.SimpleNamespace(
        strategy=types.SimpleNamespace(_start_method="spawn"), checkpoint_callbacks=[callback]
    )
    (tmp_path / "last.ckpt").write_bytes(b"x")
    os.utime(tmp_path / "last.ckpt", (0, 0))  # an earlier run's, left in the folder: not this run's
    assert "none written" in checkpoints_line(trainer)
    (tmp_path / "last.ckpt").write_bytes(b"x")  # written by this run's processes
    assert checkpoints_line(trainer).startswith(f"checkpoints: final {tmp_path / 'last.ckpt'}")
