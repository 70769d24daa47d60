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


@pytest.mark.parametrize(
    ("case", "expect"),
    [
        ("wrong type", "trainer.max_steps: expected an integer, got 'abc' (the flag --trainer.max_steps)"),
        ("missing config", "--config nope.yaml: no such file here, and no packaged config of that name"),
        ("missing dataset file", "'missing.txt' does not exist: give an existing local file"),
        ("malformed data file", "bad.csv"),
        ("not a checkpoint", "bad.ckpt (8 bytes) is truncated, corrupt or not a checkpoint"),
        ("generate from a file that is not a checkpoint", "bad.ckpt (8 bytes) is truncated, corrupt or not a"),
    ],
)
def test_each_kind_of_mistake_is_refused_in_a_few_lines(tmp_path: Path, case: str, expect: str):
    (tmp_path / "bad.ckpt").write_text("garbage\n")
    (tmp_path / "bad.csv").write_bytes(b'text,label\n\x00\xff\xfe\x01"\r\n,\n')
    argv = {
        "wrong type": ["fit", "--config", "presets/tiny", "--trainer.max_steps", "abc"],
        "missing config": ["fit", "--config", "nope.yaml"],
        "missing dataset file": _tiny("--data.init_args.dataset", "missing.txt"),
        "malformed data file": [
            "fit",
            "--config",
            "presets/classify-genre",
            "--data.init_args.dataset",
            "bad.csv",
            "--trainer.max_steps",
            "1",
        ],
        "not a checkpoint": _tiny("--ckpt_path", "bad.ckpt"),
        "generate from a file that is not a checkpoint": ["generate", "--checkpoint", "bad.ckpt"],
    }[case]
    code, err = _refusal(*argv, cwd=tmp_path)
    assert code != 0
    assert _is_short(err), err
    assert expect in err, err


def test_a_refusal_as_a_process_has_no_traceback_unless_debug_asks(tmp_path: Path):
    plain = _process("fit", "--config", "presets/tiny", "--model.config.n_layer", "6", cwd=tmp_path)
    assert plain.returncode == 2 and _is_short(plain.stderr), plain.stderr
    assert plain.stderr.startswith("error: unknown key model.config.n_layer")
    debug = _process("--debug", "fit", "--config", "presets/tiny", "--model.config.n_layer", "6", cwd=tmp_path)
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "UserError" in debug.stderr


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
    )
    (wheel,) = wheels.glob("lit_transformer-*.whl")
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    assert "lit_transformer/configs/presets/tiny.yaml" in names and "lit_transformer/configs/base.yaml" in names
    assert any(n.endswith("licenses/LICENSE") for n in names)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True, text=True, check=True
    ).stdout.strip()
    import sysconfig

    Path(site, "parent_environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # torch, Lightning, ...
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    script = venv / "bin" / "lit-transformer"
    where = subprocess.run(
        [str(python), "-c", "import lit_transformer; print(lit_transformer.__file__)"],
        cwd=empty,
        capture_output=True,
        text=True,
        env=ENV,
    ).stdout
    assert where.startswith(str(venv)), where  # the installed package, not the repository's

    version = subprocess.run([str(script), "--version"], cwd=empty, capture_output=True, text=True, env=ENV)
    assert version.returncode == 0 and version.stdout.startswith("lit_transformer ")
    # A benchmark that runs the repository's tests/ says so in one line, and writes nothing.
    suite = subprocess.run([str(script), "bench", "suite-time", "--json", "suite.json"], cwd=empty,
                           capture_output=True, text=True, env=ENV)  # fmt: skip
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
        env=ENV,
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
        env=ENV,
        timeout=300,
    )
    assert generate.returncode == 0 and generate.stdout.startswith("ROMEO:"), generate.stderr[-2000:]
