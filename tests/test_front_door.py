"""The front door: the program lists its commands and answers --version, a command that does not train starts without
Lightning, a mistake is refused in a few lines that name the key, where it was given and the fix, Lightning's own
switches (enable_checkpointing, logger) mean what they say, and an installed wheel runs a preset by name from an
empty folder."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _forked import warm_python

from lit_transformer.cli.arguments import packaged_configs, resolve_config
from lit_transformer.cli.program import main

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
ENV.pop("LIT_TRANSFORMER_DEBUG", None)
NINE = ("fit", "validate", "test", "predict", "prepare", "generate", "translate", "export", "average")


def _process(*args: str, cwd: Path | None = None, python: str = sys.executable) -> subprocess.CompletedProcess:
    return subprocess.run(
        [python, "-m", "lit_transformer", *args], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=600
    )


def _forked(*args: str, cwd: Path, script: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m lit_transformer ARGS` (or `python SCRIPT ARGS`) as a process forked from a warm interpreter: a
    process of its own, without the seconds of importing torch and Lightning (tests/_forked.py). For what happens
    after start-up; the tests of start-up itself run `_process`."""
    head = [str(script)] if script else ["-m", "lit_transformer"]
    return warm_python(ENV).run([sys.executable, *head, *args], cwd=cwd, timeout=600, text=True)


def _refusal(*args: str, cwd: Path | None = None) -> tuple[int, str]:
    """(exit status, stderr) of the command line run in this process, as a process would end."""
    err = io.StringIO()
    with contextlib.ExitStack() as stack:
        if cwd is not None:
            stack.enter_context(contextlib.chdir(cwd))
        stack.enter_context(contextlib.redirect_stderr(err))
        stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
        with pytest.raises(SystemExit) as exit_info:
            main(list(args))
    code = exit_info.value.code
    if isinstance(code, str):  # what a process does with SystemExit("message")
        return 1, err.getvalue() + code + "\n"
    return (code if isinstance(code, int) else int(code is not None)), err.getvalue()


def _is_short(message: str) -> bool:
    """A refusal: the problem, where, the fix, in a few lines, and no traceback."""
    return "Traceback" not in message and 1 <= len(message.strip().splitlines()) <= 4


# ---- one program, nine commands ----------------------------------------------------------------------------------


def test_help_lists_every_command_with_the_typed_program_name():
    result = _process("--help")
    assert result.returncode == 0
    for name in NINE:
        assert re.search(rf"^  {name} +\S", result.stdout, re.MULTILINE), name
    assert "python -m lit_transformer COMMAND --help" in result.stdout
    assert "__main__.py" not in result.stdout


def test_version_names_the_package_torch_and_lightning():
    result = _process("--version")
    assert result.returncode == 0
    assert re.fullmatch(r"lit_transformer \S+ \(torch \S+, lightning \S+, Python \S+\)\n", result.stdout)


def test_a_mistyped_command_is_answered_in_one_line_with_the_nearest():
    code, err = _refusal("fitt", "--config", "base")
    assert code == 2 and _is_short(err)
    assert "unknown command 'fitt'. Did you mean 'fit'?" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["--version"],
        ["generate", "--help"],
        ["translate", "--help"],
        ["export", "--help"],
        ["average", "--help"],
        ["serve", "--help"],
    ],
    ids=lambda argv: " ".join(argv),
)
def test_a_command_that_does_not_train_imports_no_lightning(argv: list[str]):
    code = textwrap.dedent(
        f"""
        import sys
        from lit_transformer.cli.program import main
        try:
            main({argv!r})
        except SystemExit:
            pass
        heavy = ("lightning", "pytorch_lightning", "torchmetrics", "torch")
        print("LOADED", sorted(m for m in heavy if m in sys.modules))
        """
    )
    result = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=120)
    loaded = result.stdout.strip().splitlines()[-1]
    assert loaded == "LOADED []", loaded  # no Lightning, no torchmetrics: --help parses before torch is imported


def test_generate_from_a_checkpoint_imports_no_lightning():
    """generate builds the checkpoint's task (its tokens' rules) and decodes with torch alone: the captioning task's
    module imported Lightning for a log line and the translation task's torchmetrics for its BLEU metric, which a
    process that does not train never uses, and generate cost 7.5 s of CPU where 2.4 s suffice."""
    checkpoint = ROOT / "tests" / "fixtures" / "old_checkpoints" / "language_modeling.ckpt"
    argv = ["generate", "--checkpoint", str(checkpoint), "--prompt", "ROMEO:", "--max_new_tokens", "2", "--seed", "1"]
    code = textwrap.dedent(
        f"""
        import sys
        from lit_transformer.cli.program import main
        main({argv!r})
        heavy = ("lightning", "pytorch_lightning", "torchmetrics")
        print("LOADED", sorted(m for m in heavy if m in sys.modules))
        """
    )
    result = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.startswith("ROMEO:"), result.stderr[-2000:]
    loaded = result.stdout.strip().splitlines()[-1]
    assert loaded == "LOADED []", loaded


def test_a_commands_first_import_runs_with_the_collector_paused_and_freezes_what_it_made(tmp_path, monkeypatch):
    """Importing a command's modules makes objects that live as long as the process: Python's collector is paused
    meanwhile, they are frozen after (later collections skip them), and it runs again; a module already imported is
    not imported again, nothing frozen."""
    import gc

    from lit_transformer.cli.program import Command

    (tmp_path / "slow_command.py").write_text(
        "import gc\nCOLLECTING = gc.isenabled()\nKEPT = [[i] for i in range(1000)]\ndef main(argv): return argv\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "slow_command", raising=False)
    command = Command("slow", "slow_command:main", "a command")
    freezes = []  # gc.freeze's calls: the frozen count alone also falls whenever a frozen object is freed
    monkeypatch.setattr(gc, "freeze", lambda freeze=gc.freeze: freezes.append(freeze()))
    frozen = gc.get_freeze_count()
    assert command.load()(["x"]) == ["x"] and gc.isenabled()
    assert sys.modules["slow_command"].COLLECTING is False and gc.get_freeze_count() >= frozen + 1000
    assert len(freezes) == 1
    assert command.load() is sys.modules["slow_command"].main and len(freezes) == 1


def test_ctrl_c_before_a_command_handles_signals_ends_in_one_line(tmp_path, monkeypatch, capsys):
    """Ctrl-C while a command's modules are imported (the first second of `fit`; a DDP rank starting) printed an
    80-line KeyboardInterrupt traceback from inside Lightning's imports: one line now, exit 130 (128 + SIGINT)."""
    from lit_transformer.cli.program import Command, run

    (tmp_path / "interrupted_command.py").write_text("raise KeyboardInterrupt\ndef main(argv): pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "interrupted_command", raising=False)
    with pytest.raises(SystemExit) as stopped:
        run(Command("slow", "interrupted_command:main", "a command"), [])
    assert stopped.value.code == 130
    assert capsys.readouterr().err == "interrupted (Ctrl-C)\n"


def test_help_into_a_pipe_closed_early_ends_quietly():
    """`--help | head -1`: the reader is gone before the program writes (its read end closed at once here)."""
    process = subprocess.Popen([sys.executable, "-m", "lit_transformer", "--help"], env=ENV, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)  # fmt: skip
    process.stdout.close()
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=60) == 0 and "Traceback" not in stderr, stderr


def test_fit_help_is_plain_and_describes_the_package_defaults():
    code = textwrap.dedent(
        """
        import contextlib, io, sys
        import lightning  # its own imports (torchmetrics brings transformers and matplotlib when installed) are its cost
        before = set(sys.modules)
        from lit_transformer.cli.program import main
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                main(["fit", "--help"])
            except SystemExit:
                pass
        print(out.getvalue())
        extra = ("transformers", "peft", "onnx", "matplotlib", "datasets", "onnxruntime")
        print("EXTRA", sorted(m for m in set(sys.modules) - before if m.split(".")[0] in extra))
        """
    )
    result = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=300)
    text = result.stdout
    assert text.startswith("usage: python -m lit_transformer fit [--config FILE_OR_NAME ...]")
    assert text.strip().splitlines()[-1] == "EXTRA []"
    for markup in ("``", ":class:", ".. warning::", ".. note::", ">`_"):
        assert markup not in text, markup
    assert "--model.config.n_layers" in text and "--model.optim" in text
    assert "--model.lr " not in text and "--model.warmup_steps " not in text  # deprecated: accepted, not shown
    dirpath = text[text.index("  --checkpoint.dirpath") :][:400]
    assert "<trainer.default_root_dir>/checkpoints" in " ".join(dirpath.split())
    assert "we only keep the k best checkpoints in memory" not in text
    # a refusal of a data.init_args key points here, and here is how to list them
    assert "--data.help CLASS_PATH lists one's init_args keys" in " ".join(text.split())


def test_prepare_help_says_how_to_list_a_datamodules_keys(capsys):
    with pytest.raises(SystemExit):
        main(["prepare", "--help"])
    assert "--data.help" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["prepare", "--data.help", "lit_transformer.data.LanguageModelingDataModule"])
    assert "--data.block_size" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "listed"),
    [
        (["fit", "--data.help", "LanguageModelingDataModule"], "--data.block_size"),
        (["fit", "--model.task.help=translation"], "--model.task.label_smoothing"),
        (["validate", "--model.task.help", "Classification"], "--model.task.class_weights"),
        (["prepare", "--data.help", "TranslationDataModule"], "--data.source_lang"),
    ],
)
def test_a_class_s_help_takes_the_name_the_configs_take(argv, listed, capsys):
    """`--data.help LanguageModelingDataModule` and `--model.task.help translation` were refused ("Expected a dot
    import path string") though `--data LanguageModelingDataModule` and `model.task: translation` are how a config
    names them; the keys are listed, under the program's name (the usage line said `__main__.py`)."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    out = capsys.readouterr().out
    assert exit_info.value.code in (0, None) and listed in out
    assert out.startswith("usage: python -m lit_transformer")


@pytest.mark.parametrize("command", ["fit", "validate"])
def test_ckpt_path_help_says_what_the_package_does_with_it(command, capsys):
    """--ckpt_path's help was Lightning's: validate's said that without it the current weights are scored (the
    package refuses that) and fit's offered the keywords hpc and registry, never what last and best name here."""
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    start = out.index("\n  --ckpt_path CKPT_PATH") + 1
    text = " ".join(out[start:].split("\n  --", 1)[0].split())
    assert "newest last*.ckpt" in text and "best_checkpoint.monitor" in text and "refuse" in text, text
    assert "hpc" not in text and "registry" not in text and "current weights" not in text, text


def test_limit_val_batches_1_is_one_batch_as_troubleshooting_says(capsys):
    """troubleshooting.md said `--trainer.limit_val_batches 1` validates everything (1 read as 100%): the flag parses
    as the int 1, which Lightning reads as one batch; 1.0 is the whole split."""
    import yaml

    for given, expected in (("1", 1), ("1.0", 1.0)):
        with pytest.raises(SystemExit):
            main(["fit", "--config", "presets/tiny", "--trainer.limit_val_batches", given, "--print_config"])
        value = yaml.safe_load(capsys.readouterr().out)["trainer"]["limit_val_batches"]
        assert value == expected and type(value) is type(expected), (given, value)
    rows = [r for r in (ROOT / "docs" / "troubleshooting.md").read_text().splitlines() if "limit_val_batches 1`" in r]
    assert rows and all("validates everything" not in r and "one batch" in r for r in rows), rows


# ---- exact keys, short refusals ------------------------------------------------------------------------------------


def test_an_abbreviated_key_is_refused_not_expanded():
    code, err = _refusal("fit", "--config", "presets/tiny", "--model.config.n_layer", "6", "--print_config")
    assert code == 2 and _is_short(err)
    assert "unknown key model.config.n_layer (the flag --model.config.n_layer)" in err
    assert "Did you mean model.config.n_layers" in err


def test_a_typo_in_a_yaml_names_the_file_the_key_and_the_nearest(tmp_path: Path):
    typo = tmp_path / "mine.yaml"
    typo.write_text("model:\n  config:\n    n_layerz: 3\n")
    code, err = _refusal("fit", "--config", "base", "--config", str(typo), "--print_config")
    assert code == 2 and _is_short(err)
    assert f"in {typo}, key model.config.n_layerz" in err and "Did you mean model.config.n_layers" in err
    typo.write_text("data:\n  init_args:\n    block_sizee: 32\n")
    code, err = _refusal("fit", "--config", "base", "--config", str(typo), "--print_config")
    assert f"unknown key data.init_args.block_sizee (in {typo}, key data.init_args.block_sizee)" in err
    assert "Did you mean data.init_args.block_size" in err


def _tiny(*args: str) -> list[str]:
    return ["fit", "--config", "presets/tiny", "--trainer.max_steps", "1", *args]


def _files(folder: Path) -> None:
    """The mistaken files the refusals below name."""
    (folder / "prompts.txt").write_text("hello\nworld\n")
    (folder / "bad.ckpt").write_text("garbage\n")
    (folder / "wrong.csv").write_text("review,verdict\ngood,pos\nbad,neg\n")
    (folder / "empty.csv").write_text("")
    (folder / "empty.txt").write_text("")
    (folder / "binary.csv").write_bytes(bytes(range(256)) * 4)
    (folder / "d30.yaml").write_text("model:\n  config:\n    d_model: 30\n")
    (folder / "types.yaml").write_text("model:\n  config:\n    n_layers: abc\n")
    (folder / "broken.yaml").write_text("model:\n  config:\n    d_model: 32\n  - x\n")


GENRE = ["fit", "--config", "presets/classify-genre", "--trainer.max_steps", "1", "--data.init_args.dataset"]
# (argv, exit status, what the refusal must say): the mistakes of a first hour, each answered by the rule of
# docs/cli.md (2: the command line or a config; 1: a file).
MISTAKES = {
    "a trainer option Lightning refuses": (
        ["fit", "--config", "presets/tiny", "--trainer.max_steps", "-5"], 2,
        ["`max_steps` must be a non-negative integer or -1", "trainer.max_steps by the flag"],
    ),
    "a value of the wrong type": (
        ["fit", "--config", "presets/tiny", "--trainer.max_steps", "abc"], 2,
        ["trainer.max_steps: expected an integer, got 'abc' (the flag --trainer.max_steps)"],
    ),
    "a wrong type in the YAML composed last": (
        ["fit", "--config", "presets/tiny", "--config", "types.yaml"], 2,
        ["model.config.n_layers: expected an integer, got 'abc' (in types.yaml, key model.config.n_layers)"],
    ),
    "a YAML that does not parse": (["fit", "--config", "presets/tiny", "--config", "broken.yaml"], 2,
                                   ["broken.yaml:4:3 is not valid YAML"]),
    "fields that disagree": (
        ["fit", "--config", "presets/tiny", "--config", "d30.yaml"], 2,
        ["d_model=30 is not divisible by n_heads=4",
         "model.config.d_model in d30.yaml; model.config.n_heads in presets/tiny.yaml (packaged)"],
    ),
    "a value outside its choices": (
        ["fit", "--config", "presets/tiny", "--model.config.positions", "rotary"], 2,
        ["model.config.positions: 'rotary' is not one of sinusoidal, learned, rope, alibi, none (the flag"],
    ),
    "an export format outside its choices": (
        ["export", "--checkpoint", "bad.ckpt", "--format", "gguf", "--out", "x"], 2,
        ["format: 'gguf' is not one of hf, onnx, safetensors, peft (the flag --format)"],
    ),
    "a synonym of a command": (["train", "--config", "presets/tiny"], 2, ["unknown command 'train'. Did you mean 'fit'"]),
    "a missing config": (["fit", "--config", "nope.yaml"], 2, ["--config nope.yaml: no such file here"]),
    "a flag before the config that sets it": (
        ["fit", "--trainer.max_steps", "3", "--config", "presets/tiny"], 2,
        ["--trainer.max_steps 3 is set again by presets/tiny.yaml (packaged), given after it: later arguments win",
         "Put flags after the configs they change"],
    ),
    "a data flag before the config that names the DataModule": (
        ["fit", "--data.init_args.num_workers", "0", "--config", "presets/tiny"], 2,
        ["--data.init_args.num_workers comes before presets/tiny.yaml (packaged), which names the DataModule"],
    ),  # was "unknown key data.init_args.num_workers (in presets/tiny.yaml ...)": the key is the preset's own
    "test without a checkpoint": (
        ["test", "--config", "presets/tiny"], 1, ["test needs a trained model: give --ckpt_path PATH.ckpt"],
    ),  # it scored the untrained model the configs build, and predict wrote its random text
    "predict without a checkpoint": (
        ["predict", "--config", "presets/tiny", "--data.init_args.predict_file", "prompts.txt"], 1,
        ["predict needs a trained model", "or --model.init_from for pretrained weights"],
    ),
    "export into a file": (
        ["export", "--checkpoint", str(ROOT / "tests/fixtures/old_checkpoints/language_modeling.ckpt"), "--format",
         "onnx", "--out", "prompts.txt"], 2, ["--out prompts.txt is a file: export writes a folder"],
    ),  # a FileExistsError traceback
    "epochs for the main job's schedule": (
        ["fit", "--config", "base", "--trainer.max_steps", "-1", "--trainer.max_epochs", "2"], 2,
        ["model.optim.schedule wsd decays over the run's optimizer steps", "trainer.max_epochs 2 is not read",
         "--trainer.max_steps N"],
    ),
    "a DataModule key mistyped": (
        ["fit", "--config", "presets/tiny", "--data.init_args.block_sizee", "8"], 2,
        ["Did you mean data.init_args.block_size",
         "Run 'python -m lit_transformer fit --data.help lit_transformer.data.LanguageModelingDataModule'"],
    ),
    "predict with nothing to predict": (
        ["predict", "--config", "presets/tiny", "--ckpt_path", str(ROOT / "tests/fixtures/old_checkpoints/language_modeling.ckpt")],
        2, ["predict needs inputs: --data.init_args.predict_file FILE"],
    ),
    "a missing dataset file": (_tiny("--data.init_args.dataset", "missing.txt"), 1, ["'missing.txt' does not exist"]),
    "a CSV with other columns": (
        [*GENRE, "wrong.csv"], 1,
        ["wrong.csv has no column 'text', 'label'; its columns are ['review', 'verdict']", "--data.init_args.text_column"],
    ),
    "an empty CSV": ([*GENRE, "empty.csv"], 1, ["empty.csv is empty: no header, no rows"]),
    "an empty text file": (_tiny("--data.init_args.dataset", "empty.txt"), 1, ["'empty.txt' is empty: no line of text"]),
    "a binary file named .csv": ([*GENRE, "binary.csv"], 1, ["binary.csv:1 holds binary data", "not text"]),
    "a text file as generate's checkpoint": (["generate", "--checkpoint", "prompts.txt"], 1,
                                             ["prompts.txt is text (it starts 'hello'), not a checkpoint"]),
    "a text file as validate's checkpoint": (["validate", "--config", "presets/tiny", "--ckpt_path", "prompts.txt"], 1,
                                             ["prompts.txt is text (it starts 'hello'), not a checkpoint"]),
    "a checkpoint given to the checkpoint callback's group": (
        ["validate", "--config", "presets/tiny", "--checkpoint",
         str(ROOT / "tests/fixtures/old_checkpoints/language_modeling.ckpt")], 2,
        ["--checkpoint takes the checkpoint group's settings as YAML; a checkpoint to resume from or evaluate goes "
         "to --ckpt_path"],
    ),  # a UnicodeDecodeError traceback: jsonargparse read the .ckpt as the group's YAML
    "a binary file as the data group's YAML": (
        ["fit", "--config", "presets/tiny", "--data", "binary.csv"], 2,
        ["--data binary.csv is not UTF-8 text", "give a YAML file of data's settings, or its keys as --data.KEY"],
    ),
    "fit's flag for a checkpoint given to generate": (
        ["generate", "--ckpt_path", "prompts.txt"], 2, ["unknown key ckpt_path (the flag --ckpt_path). Did you mean "
                                                       "checkpoint?"],
    ),
    "fit --ckpt_path hpc with no requeue checkpoint": (
        ["fit", "--config", "presets/tiny", "--ckpt_path", "hpc", "--trainer.default_root_dir", "nowhere"], 1,
        ["--ckpt_path hpc: there is no hpc_ckpt_N.ckpt", "resume with --ckpt_path last"],
    ),  # Lightning's ValueError traceback, after the data was read
    "the presets of two tasks together": (
        ["fit", "--config", "presets/tiny", "--config", "presets/tiny-translate"], 2,
        ["presets/tiny.yaml (packaged) names the DataModule LanguageModelingDataModule and presets/tiny-translate.yaml "
         "(packaged) TranslationDataModule: configs of two tasks mix"],
    ),  # ran a translation model with tiny's batch_size 8 as its pair cap and tiny's sample settings, without a word
    "another task's checkpoint to start from": (
        ["fit", "--config", "presets/tiny", "--model.init_from",
         str(ROOT / "tests/fixtures/old_checkpoints/translation.ckpt")], 2,
        ["holds a translation model (encoder_decoder), and this run builds a decoder_only one: start this run from a "
         "checkpoint of its own kind"],
    ),  # "set it to encoder_decoder", which led to a second refusal: the data feeds no translation task
    "validate --ckpt_path last with no run": (
        ["validate", "--config", "presets/tiny", "--ckpt_path", "last", "--trainer.default_root_dir", "nowhere"], 1,
        ["--ckpt_path last: there is no last.ckpt in nowhere/checkpoints"],
    ),
    "test --ckpt_path last with no run": (
        ["test", "--config", "presets/tiny", "--ckpt_path", "last", "--trainer.default_root_dir", "nowhere"], 1,
        ["there is no last.ckpt in nowhere/checkpoints (checkpoint.dirpath) to test"],
    ),
    "predict --ckpt_path last with no run": (
        ["predict", "--config", "presets/tiny", "--ckpt_path", "last", "--trainer.default_root_dir", "nowhere",
         "--data.init_args.predict_file", "prompts.txt"], 1,
        ["there is no last.ckpt in nowhere/checkpoints (checkpoint.dirpath) to predict"],
    ),
}  # fmt: skip


def _refusal_lines(err: str) -> list[str]:
    lines = err.rstrip().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("error:")]
    return lines[starts[-1] :] if starts else lines


@pytest.mark.parametrize("case", MISTAKES)
def test_each_kind_of_mistake_is_refused_in_a_few_lines(tmp_path: Path, monkeypatch, case: str):
    """Its exit status, the refusal in at most 3 lines (and at most 3 more of Lightning's before it), no traceback,
    what was wrong and where; nothing prepared before the refusal of a config."""
    _files(tmp_path)
    monkeypatch.setenv("LIT_TRANSFORMER_CACHE", str(tmp_path / "cache"))
    argv, status, expected = MISTAKES[case]
    code, err = _refusal(*argv, cwd=tmp_path)
    assert code == status, err
    assert "Traceback" not in err and _refusal_lines(err)[0].startswith("error:"), err
    assert len(_refusal_lines(err)) <= 3 and len(err.strip().splitlines()) <= 6, err
    for text in expected:
        assert text in err, err
    if status == 2:  # a config refused before any data is read: nothing was prepared, no tokenizer trained
        assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.json")), err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the refusal of a GPU option needs a CPU machine")
def test_a_gpu_option_on_a_cpu_machine_is_a_config_mistake(tmp_path: Path):
    code, err = _refusal(*_tiny("--trainer.accelerator", "gpu"), cwd=tmp_path)
    assert code == 2 and "trainer.accelerator='gpu' needs a CUDA GPU" in err and len(_refusal_lines(err)) <= 3


@pytest.mark.skipif(bool(__import__("importlib.util").util.find_spec("transformer_engine")), reason="it is installed")
def test_a_precision_whose_package_is_missing_is_a_config_mistake(tmp_path: Path):
    """transformer-engine is one of the precisions --help lists; without its package it ended in a traceback."""
    code, err = _refusal(*_tiny("--trainer.precision", "transformer-engine"), cwd=tmp_path)
    assert code == 2 and "Traceback" not in err and len(_refusal_lines(err)) <= 3, err
    assert "trainer.precision='transformer-engine' needs NVIDIA's Transformer Engine" in err, err


def test_a_validation_interval_longer_than_the_epoch_is_refused_in_a_few_lines(tmp_path: Path, monkeypatch):
    """Judged by Lightning once the data is ready (5 batches an epoch, a validation every 10 of them, per epoch): its
    ValueError ended the run in a traceback."""
    monkeypatch.setenv("LIT_TRANSFORMER_CACHE", str(tmp_path / "cache"))
    argv = _tiny("--trainer.limit_train_batches", "5", "--trainer.check_val_every_n_epoch", "1")
    code, err = _refusal(*argv, "--trainer.default_root_dir", str(tmp_path / "run"), cwd=tmp_path)
    assert code == 2 and "Traceback" not in err and len(_refusal_lines(err)) <= 3, err
    assert "`val_check_interval` (10) must be less than or equal to the number of the training batches (5)" in err
    assert "trainer.check_val_every_n_epoch by the flag" in err, err


def test_a_refusal_as_a_process_has_no_traceback_unless_debug_asks(tmp_path: Path):
    plain = _forked("fit", "--config", "presets/tiny", "--model.config.n_layer", "6", cwd=tmp_path)
    assert plain.returncode == 2 and _is_short(plain.stderr), plain.stderr
    assert plain.stderr.startswith("error: unknown key model.config.n_layer")
    debug = _forked("--debug", "fit", "--config", "presets/tiny", "--model.config.n_layer", "6", cwd=tmp_path)
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "errors.ConfigError" in debug.stderr


def test_the_package_log_handler_writes_to_the_stderr_of_the_moment(tmp_path: Path):
    """The handler that shows the package's INFO records follows sys.stderr: a command run in-process with stderr
    redirected (as `_refusal` runs them, or a notebook cell) leaves no handler bound to a stream closed since, whose
    next record would print "--- Logging error ---" instead. In a process of its own, so that no logging is set up."""
    script = tmp_path / "logs.py"
    script.write_text(
        "import contextlib, io, logging\n"
        "from lit_transformer.cli.lightning_cli import show_package_info_logs\n"
        "redirected = io.StringIO()\n"
        "with contextlib.redirect_stderr(redirected):\n"
        "    show_package_info_logs()\n"
        "    logging.getLogger('lit_transformer.data').info('first')\n"
        "assert redirected.getvalue() == 'first\\n', redirected.getvalue()\n"
        "redirected.close()\n"
        "logging.getLogger('lit_transformer.data').info('second')\n"
    )
    result = _forked(cwd=tmp_path, script=script)
    assert result.returncode == 0 and result.stderr.endswith("second\n"), result.stderr
    assert "Logging error" not in result.stderr, result.stderr


# ---- Lightning's switches -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("switch", ["enable_checkpointing", "logger"])
def test_lightning_switches_turn_the_package_callbacks_off(tmp_path: Path, switch: str):
    run = tmp_path / "run"
    from test_cli import _cli

    result = _cli(
        *_tiny("--trainer.max_steps", "2", f"--trainer.{switch}", "false", "--trainer.default_root_dir", str(run)),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    if switch == "enable_checkpointing":
        assert not list(tmp_path.rglob("*.ckpt"))
        assert (run / "tensorboard").is_dir()
    else:
        assert not (run / "tensorboard").exists()
        assert (run / "checkpoints" / "last.ckpt").is_file()


# ---- the run folder ------------------------------------------------------------------------------------------------


def test_two_fits_started_together_in_one_folder_log_to_two_tensorboard_versions(tmp_path: Path, monkeypatch):
    """Lightning picks the next version_N from a listing and creates the folder later: a fit that listed the folder
    before another fit, started with it, created version_0 took version_0 too (curves merged, one config.yaml).
    The listing is made stale here as it is in that race; the fit takes the next free version."""
    from lightning.pytorch.loggers import TensorBoardLogger

    monkeypatch.chdir(tmp_path)
    other = Path("run/tensorboard/version_0")
    other.mkdir(parents=True)
    (other / "events.out.tfevents.other").write_bytes(b"")
    (other / "config.yaml").write_text("seed_everything: 1\n")
    monkeypatch.setattr(TensorBoardLogger, "_get_next_version", lambda self: 0)  # listed before the other's mkdir
    main(_tiny("--trainer.default_root_dir", "run", "--trainer.limit_val_batches", "0", "--seed_everything", "2"))
    assert sorted(p.name for p in other.iterdir()) == ["config.yaml", "events.out.tfevents.other"]
    assert (other / "config.yaml").read_text() == "seed_everything: 1\n"
    assert list(Path("run/tensorboard/version_1").glob("events.out.tfevents.*"))
    assert "seed_everything: 2" in Path("run/tensorboard/version_1/config.yaml").read_text()


def test_a_run_names_its_checkpoints_keeps_the_umask_and_evaluation_logs_beside_it(tmp_path: Path, capsys, monkeypatch):
    """fit's last line names the final and the best checkpoint; checkpoints and exported safetensors take the mode
    the umask gives; validate and test log beside the training run, which keeps version_0 (and its tokenizer)."""
    monkeypatch.chdir(tmp_path)
    old = os.umask(0o022)
    try:
        main(_tiny("--trainer.max_steps", "2", "--trainer.val_check_interval", "2", "--trainer.default_root_dir", "run",
                   "--checkpoint.every_n_train_steps", "2"))  # fmt: skip
        last = capsys.readouterr().out.strip().splitlines()[-1]
        assert last.startswith("checkpoints: final run/checkpoints/last.ckpt, best run/checkpoints/best-step000002-")
        assert "(val/nll " in last
        for command in ("validate", "test"):
            main([command, "--config", "presets/tiny", "--trainer.default_root_dir", "run", "--ckpt_path", "last"])
        main(["export", "--checkpoint", "run/checkpoints/last.ckpt", "--format", "safetensors", "--out", "exported"])
    finally:
        os.umask(old)
    written = [*Path("run/checkpoints").glob("*.ckpt"), Path("exported/model.safetensors")]
    assert len(written) == 3 and {oct(p.stat().st_mode & 0o777) for p in written} == {oct(0o644)}
    assert sorted(p.name for p in Path("run/tensorboard").iterdir()) == ["test", "validate", "version_0"]
    assert (Path("run/tensorboard/version_0") / "tokenizer.json").is_file()


def test_a_full_disk_while_a_checkpoint_is_written_is_said_in_a_line(tmp_path: Path):
    """A file-size limit (what `ulimit -f` sets) below a checkpoint's size: the run ends with exit status 1 and one
    line naming the path and the checkpoint still whole, not a traceback."""
    common = _tiny("--trainer.default_root_dir", "run", "--trainer.logger", "false",
                   "--data.init_args.cache_dir", str(tmp_path / "cache"))  # fmt: skip
    first = _forked(*common, "--trainer.max_steps", "2", "--checkpoint.every_n_train_steps", "2", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    size = (tmp_path / "run" / "checkpoints" / "last.ckpt").stat().st_size
    # The limit is set in the command's own process, before the program runs (as a shell's `ulimit -f` would).
    limited = tmp_path / "limited.py"
    limited.write_text(
        "import resource, runpy\n"
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({size // 2}, {size // 2}))\n"
        "runpy.run_module('lit_transformer', run_name='__main__', alter_sys=True)\n"
    )
    resumed = _forked(*common, "--trainer.max_steps", "4", "--checkpoint.every_n_train_steps", "2", "--ckpt_path",
                      "last", cwd=tmp_path, script=limited)  # fmt: skip
    assert resumed.returncode == 1 and "Traceback" not in resumed.stderr, resumed.stderr[-3000:]
    (refusal,) = _refusal_lines(resumed.stderr)
    assert "could not write" in refusal and "run/checkpoints/last.ckpt: File too large" in refusal
    assert "last.ckpt is the previous one, still whole" in refusal
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").stat().st_size == size  # and it is


def test_a_prepared_shard_cut_short_is_found_and_prepared_again(tmp_path: Path):
    """Half of a training shard gone from the cache (a disk that filled, a copy cut short): the next run finds the
    size its index disagrees with and prepares that split again, instead of failing in the middle of training."""
    import logging

    command = ["prepare", "--config", "presets/tiny", "--data.init_args.cache_dir", str(tmp_path)]
    main(command)
    (shard,) = tmp_path.glob("shards/*/train/shard-00000.bin")
    whole = shard.read_bytes()
    shard.write_bytes(whole[: len(whole) // 2])
    said: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: said.append(record.getMessage())
    logging.getLogger("lit_transformer.data.shards").addHandler(handler)
    try:
        main(command)
    finally:
        logging.getLogger("lit_transformer.data.shards").removeHandler(handler)
    assert any("disagrees with its index (train/shard-00000.bin has" in line for line in said), said
    assert shard.read_bytes() == whole


def test_export_as_onnx_prints_no_third_party_notices(tmp_path: Path, capfd):
    pytest.importorskip("onnxscript")
    checkpoint = ROOT / "tests" / "fixtures" / "old_checkpoints" / "language_modeling.ckpt"
    main(["export", "--checkpoint", str(checkpoint), "--format", "onnx", "--out", str(tmp_path / "onnx")])
    out, err = capfd.readouterr()
    assert out.strip() == f"Wrote {tmp_path / 'onnx'}" and err == "", err


def test_ablate_finds_its_grid_in_the_package_from_any_folder(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(["ablate", "configs/ablations/smoke.yaml", "--dry-run"])
    assert "lit_transformer fit --config" in capsys.readouterr().out


# ---- configs by name, and the installed package --------------------------------------------------------------------


def test_a_packaged_config_is_found_by_name_where_no_such_file_is(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tiny = packaged_configs() / "presets" / "tiny.yaml"
    for name in ("presets/tiny", "presets/tiny.yaml", "configs/presets/tiny.yaml"):
        assert Path(resolve_config(name)) == tiny
    assert Path(resolve_config("base")) == packaged_configs() / "base.yaml"
    (tmp_path / "base").write_text("trainer:\n  max_steps: 1\n")
    assert resolve_config("base") == "base"  # a file in the working folder wins
    # The repository's configs/ is the packaged folder itself, not a copy to keep in step.
    assert (ROOT / "configs").resolve() == packaged_configs().resolve()


@pytest.mark.slow
def test_an_installed_wheel_runs_a_preset_by_name_from_an_empty_folder(tmp_path: Path):
    """Build the wheel from the committed files, install it (no network: --no-deps, over this environment's
    packages) into a fresh environment, and from an empty folder train the tiny preset by name for 2 steps,
    generate from its checkpoint and print --version."""
    # A user's shell: no PYTHONPATH (a runner such as `bench suite-time` puts the repository on it for its children;
    # pip would then find the package installed already, and Python import the repository's instead of the wheel's).
    env = {k: v for k, v in ENV.items() if k != "PYTHONPATH"}
    source = tmp_path / "source"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        path = ROOT / name
        if path.is_symlink() or not path.is_file():
            continue  # configs/ is a link to the package's folder; the wheel takes the folder
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes(path.read_bytes())
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=600,
        env=env,
    )
    (wheel,) = wheels.glob("lit_transformer-*.whl")
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    assert "lit_transformer/configs/presets/tiny.yaml" in names and "lit_transformer/configs/base.yaml" in names
    assert any(n.endswith("licenses/LICENSE") for n in names)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120, env=env)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import site; print(site.getsitepackages()[0])"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout.strip()
    import sysconfig

    Path(site, "parent_environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # torch, Lightning, ...
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
        check=True,
        capture_output=True,
        timeout=600,
        env=env,
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    script = venv / "bin" / "lit-transformer"
    where = subprocess.run(
        [str(python), "-c", "import lit_transformer; print(lit_transformer.__file__)"],
        cwd=empty,
        capture_output=True,
        text=True,
        env=env,
    ).stdout
    assert where.startswith(str(venv)), where  # the installed package, not the repository's

    version = subprocess.run([str(script), "--version"], cwd=empty, capture_output=True, text=True, env=env)
    assert version.returncode == 0 and version.stdout.startswith("lit_transformer ")
    # A benchmark that runs the repository's tests/ says so in one line, and writes nothing.
    suite = subprocess.run([str(script), "bench", "suite-time", "--json", "suite.json"], cwd=empty,
                           capture_output=True, text=True, env=env)  # fmt: skip
    assert suite.returncode == 2 and "needs a source checkout" in suite.stderr and _is_short(suite.stderr)
    assert not (empty / "suite.json").exists()
    fit = subprocess.run(
        [
            str(script),
            "fit",
            "--config",
            "presets/tiny",
            "--trainer.max_steps",
            "2",
            "--trainer.default_root_dir",
            "run",
        ],
        cwd=empty,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert fit.returncode == 0, fit.stderr[-3000:]
    last = empty / "run" / "checkpoints" / "last.ckpt"
    assert last.is_file()
    generate = subprocess.run(
        [
            str(script),
            "generate",
            "--checkpoint",
            str(last),
            "--prompt",
            "ROMEO:",
            "--max_new_tokens",
            "8",
            "--seed",
            "1",
        ],
        cwd=empty,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert generate.returncode == 0 and generate.stdout.startswith("ROMEO:"), generate.stderr[-2000:]


def test_generate_with_beams_prints_the_settled_text(capsys):
    """Beam search settles its tokens only at the end: `generate --num_beams N` prints them then, instead of refusing
    to stream (what a stream of beams cannot do)."""
    checkpoint = ROOT / "tests" / "fixtures" / "old_checkpoints" / "language_modeling.ckpt"
    main(
        ["generate", "--checkpoint", str(checkpoint), "--prompt", "ROMEO:", "--num_beams", "3", "--max_new_tokens", "5"]
    )
    out = capsys.readouterr().out
    assert out.startswith("ROMEO:") and len(out.strip()) > len("ROMEO:")


def test_a_flag_a_later_config_sets_is_found_and_a_composed_command_leaves_it_out(tmp_path: Path):
    """The preset's 20 steps ran where the flag said 3. A flag before a config that does not set its key stays (the
    order matters only where both set it); an ablation grid's overrides, which a cell's variant config may change,
    are composed without the dead flag: the same run, which fit accepts."""
    from lit_transformer.cli.arguments import check_flag_order, overridden_flags, without_overridden

    tiny = resolve_config("presets/tiny")
    (tmp_path / "steps.yaml").write_text("trainer:\n  max_steps: 7\nmodel:\n  config: {d_model: 64}\n")
    steps = str(tmp_path / "steps.yaml")
    argv = ["--trainer.max_steps", "3", "--model.config.d_model=48", "--trainer.max_epochs", "1", "--config", steps]
    assert [(i, n) for i, n, _ in overridden_flags(argv)] == [(0, 2), (2, 1)]
    assert without_overridden(argv) == ["--trainer.max_epochs", "1", "--config", steps]
    check_flag_order(["--trainer.max_epochs", "1", "--config", tiny])  # tiny sets no max_epochs
    check_flag_order(["--config", tiny, "--trainer.max_steps", "3"])
    check_flag_order(["--trainer.max_steps", "3", "--config", steps, "--trainer.max_steps", "4"])  # the last flag wins
    with pytest.raises(ValueError, match="these flags would do nothing"):
        check_flag_order(argv)
    # a group below the key is not a value: --data CLASS and a config's data.init_args are merged, not replaced
    assert overridden_flags(["--data.init_args", "{}", "--config", tiny]) == []


def test_a_warning_of_the_package_prints_as_a_line_of_its_own(capsys, monkeypatch):
    """It printed as '/.../lit_transformer/data/language_modeling.py:361: UserWarning: ...' and the source line after
    it: nothing a user can act on. Another library's warning keeps Python's format."""
    import warnings

    import lit_transformer
    from lit_transformer.cli.program import show_package_warnings

    def python_default(message, category, filename, lineno, file=None, line=None):  # pytest records, not prints
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    monkeypatch.setattr(warnings, "showwarning", python_default)  # restored after the test
    show_package_warnings()
    ours = str(Path(lit_transformer.__file__).parent / "data" / "language_modeling.py")
    warnings.showwarning(UserWarning("rows.jsonl:2 has no 'text'"), UserWarning, ours, 361)
    warnings.showwarning(UserWarning("theirs"), UserWarning, "/elsewhere/lib.py", 7)
    err = capsys.readouterr().err
    assert err.startswith("warning: rows.jsonl:2 has no 'text'\n") and "language_modeling.py" not in err
    assert "/elsewhere/lib.py:7: UserWarning: theirs" in err
