"""Every command of the README, and of the docs pages its content moved to (PAGES), runs as written, in the order a
reader meets them (the README first, then each page), on the embedded corpora. Commands are those of the bash blocks
and the `python ...` spans of table rows (the README's task table; a span followed by "(GPU)" needs a GPU); a
command printed twice runs once.

Each command gets only small-size overrides appended (fewer steps, fewer tokens); a command marked "# needs a GPU"
is checked to parse (--print_config / --help), one marked "# takes minutes" is parsed with all its flags by its own
parser, which then stops it before any work (see parse_only: `--help` would exit before an unknown flag is reported;
the parse-only commands of `python -m lit_transformer` run in this process: see parse_in_process). The commands run
in a fresh folder that holds the repository's configs and scripts, with the environment activated, as a newcomer
runs them after the set-up command; what each is said to produce is checked. Python blocks run as written too. A plain
`python -m lit_transformer ...` (and a Python block) runs as a process forked from a warm interpreter that has imported
torch and Lightning already (tests/_forked.py): a process of its own, without seconds of imports each.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import runpy
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from _forked import warm_python

from lit_transformer.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# The pages whose commands run after the README's, in this order (they use the checkpoints the README's commands write).
PAGES = [README] + [ROOT / "docs" / f"{name}.md" for name in ("results", "translation", "inference", "scaling")]
PAGES += [ROOT / "docs" / "troubleshooting.md"]
SMALL = "--trainer.max_steps 4 --trainer.val_check_interval 4 --trainer.limit_val_batches 2"
SMALL += " --trainer.num_sanity_val_steps 0 --checkpoint.every_n_train_steps 2 --trainer.log_every_n_steps 1"


def blocks(language: str, pages: list[Path] = PAGES) -> list[str]:
    return [b for page in pages for b in re.findall(rf"```{language}\n(.*?)```", page.read_text(), flags=re.S)]


TABLE_COMMAND = re.compile(r"`(python [^`]+)`( \(GPU\))?")


def page_commands(text: str) -> list[str]:
    """The shell commands of a page in reading order: its bash blocks (continuation lines joined, comment lines
    dropped) and the commands in its table rows."""
    commands = []
    for block, row in re.findall(r"```bash\n(.*?)```|^(\|[^\n]*\|)$", text, flags=re.S | re.M):
        if row:
            commands += [code + ("  # needs a GPU" if gpu else "") for code, gpu in TABLE_COMMAND.findall(row)]
            continue
        for command in re.sub(r"\\\n\s*", "", block).splitlines():
            if command.strip() and not command.lstrip().startswith("#"):
                commands.append(command.strip())
    return commands


def readme_commands() -> list[str]:
    """Every page's commands, the README's first; a command printed on two pages (or twice) runs once."""
    commands, seen = [], set()
    for page in PAGES:
        for command in page_commands(page.read_text()):
            code = command.partition("  #")[0].strip()
            if code not in seen:
                seen.add(code)
                commands.append(command)
    return commands


def adapt(command: str) -> tuple[str, str]:
    """(the command to run, what kind of command it is): the README's command plus small-size overrides."""
    code, _, note = command.partition("  #")
    code, note = code.strip(), note.strip()
    if "needs a GPU" in note:
        return code + (" --print_config" if " fit " in code else " --help"), "parses"
    if "takes minutes" in note:
        return code, "parses all flags"
    if code.endswith("-m pytest"):
        # The command as written, collecting one file in one process (-n 0): its set-up, pytest's configuration and
        # the conftest all run. Every other file is collected by the suite this test runs in (twice, one per worker);
        # collecting them all again here cost ~10 s of the suite's time and showed nothing more.
        return code + " --collect-only -q -n 0 tests/test_readme.py", "pytest"
    if "tensorboard" in code:
        return code, "tensorboard"
    if code.startswith("curl ") and SERVED in code:
        return code, "request"  # sent by the serve command's check, while its server runs
    match = re.search(r"lit_transformer ([\w-]+)", code)
    kind = match.group(1) if match else "shell"
    if "--help" in code or "--print_config" in code:
        return code, "parses"
    if kind == "serve":
        return code, "serve"
    if kind == "fit":
        small = SMALL.replace("steps 4", "steps 6") if "--ckpt_path last" in code else SMALL
        if "translate-en-es" in code:
            small += " --data.init_args.max_pairs 400 --data.init_args.bleu_samples 2"
        return f"{code} {small}", "resume" if "--ckpt_path last" in code else "fit"
    if kind == "test":
        small = " --trainer.limit_test_batches 1"
        if "translate-en-es" in code:  # BLEU's beam search: 8 tokens a sentence (the preset's 50 past the source)
            small += " --model.generation.max_new_tokens 8"
        return code + small, "test"
    if kind == "generate":
        # Past the context of 128: the window slides. A 4-step model samples EOS at random (about 1 token in 1,024, so
        # a 300-token sample ends early in a run of four); no EOS id (-1) keeps every sample going to 300 tokens.
        return code + " --max_new_tokens 300 --eos_token_id -1", "generate"
    if kind == "translate":
        # Greedy: under the paper's length penalty (GNMT, alpha 0.6) a 4-step model's beams prefer the empty
        # translation, and the check wants words.
        return code + " --max_new_tokens 8 --num_beams 1", "translate"
    if kind == "predict":
        return code + " --model.generation.max_new_tokens 8", "predict"
    return code, kind


COMMANDS = readme_commands()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A newcomer's clone after the set-up command: the repository's files, the set-up environment."""
    work = tmp_path_factory.mktemp("newcomer")
    for name in ("configs", "scripts", "lit_transformer", "tests", "pyproject.toml", "README.md", ".venv"):
        (work / name).symlink_to(ROOT / name)
    return work


# The package's commands that are not the CLI's own (fit, test, generate, ...): their modules, each with `main(argv)`.
PACKAGE_COMMANDS = {
    "ablate": "lit_transformer.recipes.ablate",
    "digit-strips": "lit_transformer.recipes.digit_strips",
    "translation-recipe": "lit_transformer.recipes.translation_recipe",
}


def command_main(argv: list[str]):
    """(the `main` that runs `python -m lit_transformer ARGV...`, the arguments it takes): a benchmark's own main for
    `bench NAME ...` (so its own parser reads every flag), the module's for ablate, digit-strips and
    translation-recipe, else the CLI's."""
    import importlib

    if argv[:1] == ["bench"] and len(argv) > 1 and not argv[1].startswith("-"):
        from lit_transformer.bench import BENCHMARKS

        if argv[1] in BENCHMARKS:
            return importlib.import_module(BENCHMARKS[argv[1]][0]).main, argv[2:]
    if argv[:1] and argv[0] in PACKAGE_COMMANDS:
        return importlib.import_module(PACKAGE_COMMANDS[argv[0]]).main, argv[1:]
    from lit_transformer.cli.lightning_cli import main

    return main, argv


def as_module(command: str) -> str:
    """The command with a package command the program does not list yet (`python -m lit_transformer bench NAME`,
    `ablate`, ...) run as its module (`python -m lit_transformer.bench NAME`): the same code, either way."""
    try:
        from lit_transformer.cli.program import find
    except ImportError:
        find = None
    for name, module in {"bench": "lit_transformer.bench", **PACKAGE_COMMANDS}.items():
        if find is None or find(name) is None:
            command = re.sub(rf"-m lit_transformer {name}(?=\s|$)", f"-m {module}", command)
    return command


def parse_in_process(command: str, cwd: Path) -> subprocess.CompletedProcess | None:
    """A parse-only `python -m lit_transformer ...` command (--help, --print_config) run in this process, as the CLI
    would run it from `cwd`; None for any other command. A parse needs no process of its own, and a new one spends
    seconds importing torch and Lightning first (every command that trains, loads or writes runs as a process)."""
    words = shlex.split(command)
    if words[:3] != ["python", "-m", "lit_transformer"]:
        return None
    main, argv = command_main(words[3:])

    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    return subprocess.CompletedProcess(words, code, out.getvalue(), err.getvalue())


class Parsed(Exception):
    """Raised by a patched parse_args once a command's arguments parsed: the command stops before doing anything."""

    def __init__(self, namespace) -> None:
        super().__init__("parsed")
        self.namespace = namespace


@contextlib.contextmanager
def stop_after_parsing():
    """Inside the block, argparse's and jsonargparse's parse_args parse (every flag, with the parser's own types and
    checks), then raise Parsed. Abbreviated flags are refused: argparse takes a prefix of a flag for the flag, so a
    README flag cut short (`--fresh_cach`) would pass."""
    import jsonargparse

    classes = (argparse.ArgumentParser, jsonargparse.ArgumentParser)
    originals = {cls: cls.parse_args for cls in classes}
    own = {cls: "parse_args" in vars(cls) for cls in classes}

    def no_abbreviations(parser: argparse.ArgumentParser) -> None:
        parser.allow_abbrev = False
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    no_abbreviations(sub)

    def patched(cls):
        def parse_args(self, *args, **kwargs):
            no_abbreviations(self)
            raise Parsed(originals[cls](self, *args, **kwargs))

        return parse_args

    try:
        for cls in originals:
            cls.parse_args = patched(cls)
        yield
    finally:
        for cls, method in originals.items():
            if own[cls]:
                cls.parse_args = method
            else:
                del cls.parse_args


def parse_only(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """A long command (`python -m lit_transformer X ...` or `python scripts/X.py ...`) parsed with all its flags by
    its own parser, in this process, and stopped there; flags it passes on to the CLI (translation-recipe's --flags,
    `bench nanogpt`'s fit overrides) are parsed by the CLI too (`--print_config` validates every flag, then exits)."""
    from lit_transformer.cli.lightning_cli import main

    words = shlex.split(command)
    assert words[0] == "python", command
    out, err, code, namespace = io.StringIO(), io.StringIO(), 0, None
    argv = sys.argv
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            with stop_after_parsing():
                if words[1:3] == ["-m", "lit_transformer"]:
                    run, args = command_main(words[3:])
                    run(args)
                else:
                    sys.argv = words[1:]
                    runpy.run_path(words[1], run_name="__main__")
            print(f"{command} ran past its parse", file=sys.stderr)
            code = 1
        except Parsed as parsed:
            namespace = parsed.namespace
        except UserError as error:  # a refusal, as the program would print it (status 2)
            print(f"error: {error}", file=sys.stderr)
            code = error.status
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
        finally:
            sys.argv = argv
        passed_on = shlex.split(getattr(namespace, "flags", "") or "") + list(getattr(namespace, "overrides", []) or [])
        if code == 0 and passed_on:
            subcommand = "fit" if getattr(namespace, "overrides", None) else "test"
            try:
                main([subcommand, "--config", str(namespace.config), *passed_on, "--print_config"])
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    return subprocess.CompletedProcess(words, code, out.getvalue(), err.getvalue())


def environment() -> dict[str, str]:
    """The environment after the set-up command: the venv activated, one thread per process."""
    venv_bin = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{venv_bin}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env["VIRTUAL_ENV"] = str(Path(venv_bin).parent)
    return env


def python_module(command: str, cwd: Path) -> list[str] | None:
    """[module, *arguments] of a plain `python -m MODULE ARGS` (or `.venv/bin/python -m ...`, where that venv is this
    interpreter's) with nothing for bash to read (no redirection, pipe, `&&`, expansion or glob), else None."""
    if any(char in command for char in "$`*?~!{"):
        return None
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words = list(lexer)
    if any(word and set(word) <= set(lexer.punctuation_chars) for word in words):
        return None
    this_venv = (cwd / ".venv").resolve() == Path(sys.prefix).resolve()
    if words[:1] not in (["python"], [".venv/bin/python"] if this_venv else ["python"]):
        return None
    return words[2:] if words[1:2] == ["-m"] and len(words) > 2 else None


def shell(command: str, cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    """The command as bash runs it in `cwd`; a plain `python -m MODULE ...` (also after `SETUP &&`) as a process
    forked from a warm interpreter (tests/_forked.py), which has imported torch and Lightning already."""
    command, env = as_module(command), environment()
    setup, _, rest = command.partition(" && ")
    # bytes, decoded here: text=True would turn a generated "\r" into "\n" (universal newlines), and a sampled
    # "\n\r" would then read as the "\n\n" that --stop "\n\n" had rightly let through
    if rest and " && " not in rest and (module := python_module(rest, cwd)):  # SETUP && PYTHON: as bash runs them
        before = subprocess.run(["bash", "-c", setup], cwd=cwd, env=env, capture_output=True, timeout=timeout)
        run = before
        if before.returncode == 0:
            run = warm_python(env).run([sys.executable, "-m", *module], cwd, env, timeout)
            run.stdout, run.stderr = before.stdout + run.stdout, before.stderr + run.stderr
    elif module := python_module(command, cwd):
        run = warm_python(env).run([sys.executable, "-m", *module], cwd, env, timeout)
    else:
        run = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, timeout=timeout)
    decode = lambda data: data.decode("utf-8", errors="replace")  # noqa: E731
    return subprocess.CompletedProcess(run.args, run.returncode, decode(run.stdout), decode(run.stderr))


def test_the_readme_has_the_two_commands_first():
    assert COMMANDS[0] == "bash scripts/setup.sh && .venv/bin/python -m lit_transformer fit --config configs/base.yaml"
    assert COMMANDS[1] == "bash scripts/setup.sh && .venv/bin/python -m pytest"
    ci = (ROOT / ".ci" / "run").read_text()
    assert COMMANDS[1] in ci  # CI runs the README's test command


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(COMMANDS)), ids=[f"{i:02d}" for i in range(len(COMMANDS))])
def test_readme_command_runs_as_written(index: int, workdir: Path):
    command, kind = adapt(COMMANDS[index])
    if kind == "tensorboard":
        return check_tensorboard(command, workdir)
    if kind == "request":
        return  # check_serve sends it
    if kind == "serve":
        return check_serve(command, workdir)
    if kind == "parses all flags":
        result = parse_only(command, workdir)
    else:
        result = (kind == "parses" and parse_in_process(command, workdir)) or shell(command, workdir)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{command}\n{output[-4000:]}"
    assert "Traceback" not in output, f"{command}\n{output[-4000:]}"
    checks = {"fit": check_fit, "resume": check_resume, "generate": check_generate, "predict": check_predict}
    checks |= {"export": check_export, "translate": check_translate, "test": check_test}
    if kind in checks:
        checks[kind](command, result, workdir)


def _checkpoint(command: str, workdir: Path) -> Path:
    match = re.search(r"--(?:checkpoint|ckpt_path) (\S+)", command)
    return workdir / match.group(1)


def _run_dir(command: str) -> str:
    """The run folder: --trainer.default_root_dir, else the last --config that sets it."""
    match = re.search(r"--trainer.default_root_dir (\S+)", command)
    if match:
        return match.group(1)
    folder = None
    for config in re.findall(r"--config (\S+)", command):
        folder = (yaml.safe_load((ROOT / config).read_text()).get("trainer") or {}).get("default_root_dir") or folder
    return folder


def _checkpoint_dir(command: str) -> str:
    match = re.search(r"--checkpoint.dirpath (\S+)", command)
    return match.group(1) if match else f"{_run_dir(command)}/checkpoints"


def check_fit(command: str, result, workdir: Path) -> None:
    from lit_transformer.checkpoints.files import load_checkpoint

    checkpoint = load_checkpoint(workdir / _checkpoint_dir(command) / "last.ckpt")
    assert checkpoint["global_step"] == 4 and "tokenizer" in checkpoint, command


def check_resume(command: str, result, workdir: Path) -> None:
    from lit_transformer.checkpoints.files import load_checkpoint

    assert "Restored all states from the checkpoint" in result.stdout + result.stderr, command
    assert load_checkpoint(workdir / _checkpoint_dir(command) / "last.ckpt")["global_step"] == 6


def check_generate(command: str, result, workdir: Path) -> None:
    """The prompt, then 300 tokens past a context of 128; with --num_samples, a header per sample; with --stop, each
    sample ends before its first stop string."""
    from lit_transformer.inference import load_model

    words = shlex.split(command)
    prompt = words[words.index("--prompt") + 1]
    samples = int(words[words.index("--num_samples") + 1]) if "--num_samples" in words else 1
    texts = re.split(r"^--- prompt 1, sample \d+\n", result.stdout, flags=re.M)
    texts = texts[1:] if samples > 1 else texts
    assert len(texts) == samples, result.stdout
    loaded = load_model(_checkpoint(command, workdir))
    for text in texts:
        assert text.startswith(prompt), result.stdout
        generated = text[len(prompt) :].removesuffix("\n")
        if "--stop" in words:
            assert "\n\n" not in generated, result.stdout
        else:  # re-encoding the text may merge a few tokens; an early EOS would end it sooner
            assert len(loaded.encode(generated)) > 1.5 * loaded.config.max_seq_len, result.stdout


def check_predict(command: str, result, workdir: Path) -> None:
    words = shlex.split(command)
    given = words[words.index("--data.init_args.predict_file") + 1] if "--data.init_args.predict_file" in words else ""
    if (workdir / given).is_dir():  # captioning: one caption per image of the folder, in name order
        folder = workdir / given
        rows = [json.loads(line) for line in (workdir / words[words.index("--predictions.output") + 1]).open()]
        assert [r["image"] for r in rows] == sorted(p.name for p in folder.glob("*.png"))
        assert all(isinstance(r["caption"], str) for r in rows)
        return
    inputs = (workdir / words[words.index("--data.init_args.predict_file") + 1]).read_text().splitlines()
    output = words[words.index("--predictions.output") + 1] if "--predictions.output" in words else None
    path = workdir / (output or f"{_run_dir(command)}/predictions.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["input"] for r in rows] == inputs
    if "classify" in command:  # a classifier: the label, its probability, and every class's
        assert all(set(r) == {"input", "label", "probability", "probabilities"} for r in rows)
        assert all(r["probability"] == r["probabilities"][r["label"]] for r in rows)
        return
    assert all(set(r) == {"input", "output", "tokens"} and len(r["tokens"]) <= 8 for r in rows)


def check_export(command: str, result, workdir: Path) -> None:
    args = shlex.split(command)
    out = workdir / args[args.index("--out") + 1]
    if args[args.index("--format") + 1] == "onnx":  # an encoder-decoder: both graphs, described, with the tokenizer
        described = json.loads((out / "onnx.json").read_text())
        assert {"encoder", "decoder"} <= set(described["graphs"]) and (out / "tokenizer.json").is_file()
        assert all((out / graph["file"]).is_file() for graph in described["graphs"].values())
        return
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()


def check_translate(command: str, result, workdir: Path) -> None:
    """A translation per input; in fp32 a 4-step model writes words. Its int8 copy may put EOS first (an empty
    line, as the fp32 model with other rounding would): int8's quality is measured in tests/test_quantization.py."""
    assert result.stdout.endswith("\n"), result.stdout
    if "--quantize int8" not in command:
        assert result.stdout.strip()


def check_test(command: str, result, workdir: Path) -> None:
    if "classify" in command:
        assert "test/f1" in result.stdout and "test/accuracy" in result.stdout
        return
    assert "test/bleu" in result.stdout and "test/ppl" in result.stdout
    if "caption" in command:
        assert "test/exact_match" in result.stdout


def check_tensorboard(command: str, workdir: Path) -> None:
    """TensorBoard serves the runs the README's commands wrote: its run list names them."""
    port = 16006 + os.getpid() % 1000
    venv_bin = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{venv_bin}:{os.environ['PATH']}"}
    server = subprocess.Popen(
        ["bash", "-c", f"{command} --port {port} --host 127.0.0.1"],
        cwd=workdir,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        runs, deadline = [], time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/runs", timeout=5) as response:
                    runs = json.loads(response.read())
                if any("shakespeare" in r for r in runs):
                    break
            except OSError:
                pass
            time.sleep(1)
        assert any("shakespeare/tensorboard" in r for r in runs), runs
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)


SERVED = "http://127.0.0.1:8000/"
"""Where the pages' requests go: the address `serve` listens on by default."""


def check_serve(command: str, workdir: Path) -> None:
    """The server starts on the README's checkpoint and answers the pages' requests (their `curl` commands, sent to
    the port it was given); SIGTERM then ends it."""
    import signal
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command, env = f"{as_module(command)} --port {port}", environment()
    log = workdir / "serve.log"
    with log.open("w") as output:
        # A plain `python -m ...` forks from the warm interpreter, as every other command of the pages does (a fresh
        # one spent about 2 s more CPU importing before the server's own start; LitServe's workers start fresh anyway).
        if module := python_module(command, workdir):
            server = warm_python(env).popen([sys.executable, "-m", *module], workdir, env, stdout=output,
                                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        else:
            server = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=workdir, env=env, stdout=output,
                                      stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            time.sleep(1)
        assert server.poll() is None, log.read_text()[-3000:]
        requests = [code for code, kind in map(adapt, COMMANDS) if kind == "request"]
        assert requests, "the serve command's page sends it no request"
        for request in requests:
            result = shell(request.replace(SERVED, f"http://127.0.0.1:{port}/"), workdir, timeout=300)
            assert result.returncode == 0, f"{request}\n{result.stderr[-2000:]}\n{log.read_text()[-3000:]}"
            answer = json.loads(result.stdout)
            assert "output" in answer or answer["choices"][0]["message"]["content"] is not None, answer
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    assert server.returncode == 0, log.read_text()[-3000:]


def test_readme_python_blocks_run_as_written(workdir: Path):
    """Each block as a script of the reader's folder (`python block.py` there: the folder first on sys.path, as for
    `python -` there), a process forked from a warm interpreter (tests/_forked.py)."""
    for block in blocks("python"):
        script = workdir / "readme_block.py"
        script.write_text(block)
        env = environment()
        result = warm_python(env).run([sys.executable, str(script)], workdir, env, timeout=600, text=True)
        assert result.returncode == 0, f"{block}\n{result.stderr[-4000:]}"
