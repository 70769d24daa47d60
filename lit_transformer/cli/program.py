"""The program: one entry point that lists every command, answers --version, and starts only what a command needs.

`python -m lit_transformer` and the `lit-transformer` console script both land in `main`. It imports nothing heavy
itself: `--help` and `--version` cost less than `import torch`, and a command that does not train (generate,
translate, export, average, serve) never imports Lightning. The four Lightning commands (fit, validate, test, predict) go
to LightningCLI in lightning_cli.py.

A user's mistake (an unknown key, a wrong type, a missing file, a malformed data file, a checkpoint that is not one)
is a `UserError` (errors.py): it ends in a few lines that name the problem, where it is and the fix, and exits 2 for
a wrong command line or config, 1 for a file that cannot be used. Any other exception is a bug and keeps its
traceback. `--debug` (anywhere on the line) or LIT_TRANSFORMER_DEBUG=1 shows the traceback of a refusal too.
"""

from __future__ import annotations

import difflib
import gc
import importlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from lit_transformer.cli.invocation import program, remember_program
from lit_transformer.errors import user_error

__all__ = ["COMMANDS", "Command", "main", "program", "refuse", "run"]


@dataclass(frozen=True)
class Command:
    name: str
    target: str  # "module:function", imported only when the command runs
    summary: str

    def load(self) -> Callable[[Sequence[str]], None]:
        module, _, function = self.target.partition(":")
        if module not in sys.modules:
            with collector_paused():
                importlib.import_module(module)
        return getattr(sys.modules[module], function)


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused while a command's modules are first imported, and what they made frozen
    (gc.freeze: later collections skip it). Importing torch, Lightning and datasets makes about 450k objects that live
    as long as the process; collecting every 700 allocations, Python walked them all again and again: `fit --help`
    took 4.4 s, 2.7 s paused (medians of paired runs, a 2-core AMD EPYC). What the imports left as garbage (about 7
    MB of peak memory) stays."""
    if not gc.isenabled():  # paused by the caller: theirs to resume
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


COMMANDS: tuple[Command, ...] = (
    Command("fit", "lit_transformer.cli.lightning_cli:lightning_main", "Train a model from YAML configs and flags."),
    Command(
        "validate", "lit_transformer.cli.lightning_cli:lightning_main", "Evaluate a checkpoint on the validation split."
    ),
    Command("test", "lit_transformer.cli.lightning_cli:lightning_main", "Evaluate a checkpoint on the test split."),
    Command(
        "predict", "lit_transformer.cli.lightning_cli:lightning_main", "Write a checkpoint's predictions as JSON lines."
    ),
    Command(
        "prepare",
        "lit_transformer.cli.prepare_command:prepare_main",
        "Tokenize a config's data into shards, once, before fit.",
    ),
    Command("generate", "lit_transformer.cli.model_commands:generate_main", "Continue a prompt with a language model."),
    Command(
        "translate",
        "lit_transformer.cli.model_commands:translate_main",
        "Translate text with an encoder-decoder model.",
    ),
    Command(
        "export",
        "lit_transformer.cli.model_commands:export_main",
        "Write a checkpoint as safetensors, Hugging Face or ONNX.",
    ),
    Command(
        "average", "lit_transformer.cli.model_commands:average_main", "Average the weights of a run's last checkpoints."
    ),
    Command(
        "serve",
        "lit_transformer.cli.serve_command:serve_main",
        "Serve a checkpoint over HTTP (LitServe): /predict, OpenAI's chat route.",
    ),
    Command(
        "ablate",
        "lit_transformer.recipes.ablate:main",
        "Train a grid of variants over seeds on one budget; table and plots.",
    ),
    Command(
        "bench", "lit_transformer.bench:main", "Run a benchmark (speed, startup, nanogpt, ...); JSON names the machine."
    ),
    Command(
        "digit-strips",
        "lit_transformer.recipes.digit_strips:main",
        "Write the embedded captioning task's strips as PNGs.",
    ),
    Command(
        "translation-recipe",
        "lit_transformer.recipes.translation_recipe:main",
        "Test BLEU of last, averaged and EMA weights.",
    ),
)
LIGHTNING_COMMANDS = ("fit", "validate", "test", "predict")
# Words other programs use for what a command of this one does: a mistyped command is answered with these too.
SYNONYMS = {
    "train": "fit",
    "finetune": "fit",
    "eval": "validate",
    "evaluate": "validate",
    "val": "validate",
    "infer": "predict",
    "inference": "predict",
    "sample": "generate",
    "complete": "generate",
    "convert": "export",
    "save": "export",
    "preprocess": "prepare",
    "tokenize": "prepare",
    "benchmark": "bench",
    "avg": "average",
}

DEBUG_FLAG = "--debug"
DEBUG_ENV = "LIT_TRANSFORMER_DEBUG"


def debug_requested() -> bool:
    return os.environ.get(DEBUG_ENV, "").lower() not in ("", "0", "false", "no")


def version_line() -> str:
    def version(distribution: str) -> str:
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            return "not installed"

    import lit_transformer

    python = ".".join(str(n) for n in sys.version_info[:3])
    return f"lit_transformer {lit_transformer.__version__} (torch {version('torch')}, lightning {version('lightning')}, Python {python})"


def overview() -> str:
    width = max(len(c.name) for c in COMMANDS)
    lines = [
        f"usage: {program()} COMMAND [options]",
        "",
        "Train, evaluate and run Transformers whose every architectural choice is a config switch.",
        "",
        "commands:",
        *(f"  {c.name:<{width}}  {c.summary}" for c in COMMANDS),
        "",
        "options:",
        "  -h, --help     show this list and exit",
        "  -V, --version  print the versions of lit_transformer, torch, Lightning and Python, and exit",
        f"  {DEBUG_FLAG}        show the traceback of a refusal too (or set {DEBUG_ENV}=1)",
        "",
        f"Run '{program('COMMAND')} --help' for a command's options, for example:",
        f"  {program('fit')} --config configs/base.yaml",
        f"  {program('fit')} --config presets/tiny --trainer.max_steps 10",
    ]
    return "\n".join(lines)


def find(name: str) -> Command | None:
    return next((c for c in COMMANDS if c.name == name), None)


def suggest(word: str, choices: Sequence[str], synonyms: dict[str, str] | None = None) -> str:
    """' Did you mean X?' for the nearest choices (and the choice a common synonym names), or nothing."""
    close = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.6)
    meant = (synonyms or {}).get(word.lower())
    if meant in choices and meant not in close:
        close = [meant, *close][:3]
    if not close:
        return ""
    return " Did you mean " + " or ".join(f"'{c}'" for c in close) + "?"


def refuse(message: str, *, hint: str | None = None, status: int = 2, where: str | None = None) -> None:
    """End with `error: message` (a line saying where the keys it names were given, and one hint line): the refusal
    of a user's mistake, no traceback."""
    text = message if message.startswith("error:") else f"error: {message}"
    sys.stderr.write(text.rstrip() + "\n")
    if where:
        sys.stderr.write(where.rstrip() + "\n")
    if hint:
        sys.stderr.write(hint.rstrip() + "\n")
    sys.stderr.flush()
    raise SystemExit(status)


def run(command: Command, argv: Sequence[str]) -> None:
    """Run one command; a user's mistake ends in its message, other errors (bugs) keep their traceback."""
    remember_program()
    try:
        command.load()(list(argv) if command.name not in LIGHTNING_COMMANDS else [command.name, *argv])
    except KeyboardInterrupt:  # Ctrl-C where no handler of ours stood (the imports, a decoding): no traceback
        if debug_requested():
            raise
        sys.stderr.write("interrupted (Ctrl-C)\n")
        raise SystemExit(130) from None  # 128 + SIGINT, as a shell reports a process the signal ended
    except Exception as error:  # the rule is the type: a UserError is a refusal, anything else a bug
        mistake = user_error(error)
        if mistake is None or debug_requested():
            raise
        where = None
        if mistake.keys:
            from lit_transformer.cli.arguments import given_where

            where = given_where(mistake.keys, argv)
        refuse(str(mistake), hint=mistake.hint, status=mistake.status, where=where)


def _print(text: str) -> None:
    """Print to stdout; a reader that closed the pipe early (`--help | head`) ends the program quietly."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's own flush cannot fail again
        raise SystemExit(0) from None


def show_package_warnings() -> None:
    """A warning of this package's own code prints as `warning: MESSAGE`: Python's default put the package's source
    file and line before it (`/.../data/language_modeling.py:361: UserWarning: ...`), which tells a user nothing.
    Other libraries' warnings keep Python's format (their source line is how one finds them)."""
    import warnings

    default = warnings.showwarning
    if getattr(default, "package_format", False):
        return
    root = str(Path(__file__).resolve().parents[1])

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if str(filename).startswith(root) and issubclass(category, UserWarning):
            try:
                (file or sys.stderr).write(f"warning: {message}\n")
            except (OSError, ValueError):  # a closed stream: as Python's default, nothing to say it to
                pass
            return
        default(message, category, filename, lineno, file, line)

    show.package_format = True  # type: ignore[attr-defined]
    warnings.showwarning = show


def main(args: Sequence[str] | None = None) -> None:
    """The `lit-transformer` console script and `python -m lit_transformer`."""
    argv = list(sys.argv[1:] if args is None else args)
    show_package_warnings()
    if DEBUG_FLAG in argv:
        argv.remove(DEBUG_FLAG)
        os.environ[DEBUG_ENV] = "1"
    if not argv:
        sys.stderr.write(overview() + "\n")
        raise SystemExit(2)
    first, rest = argv[0], argv[1:]
    if first in ("-h", "--help", "help"):
        if first == "help" and rest and find(rest[0]):
            return run(find(rest[0]), ["--help"])
        _print(overview())
        return
    if first in ("-V", "--version", "version"):
        _print(version_line())
        return
    command = find(first)
    if command is None:
        what = "option" if first.startswith("-") else "command"
        refuse(
            f"unknown {what} '{first}'.{suggest(first, [c.name for c in COMMANDS], SYNONYMS)}",
            hint=f"Run '{program()} --help' for the commands.",
        )
    run(command, rest)
