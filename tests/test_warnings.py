"""A plain command prints only what a user can act on: a newcomer reads every unexplained line as an error.

The README's main command (`fit --config configs/base.yaml`, cut to 2 steps), then `validate`, `test`, `predict`,
`generate` and `export` on its checkpoint, and `translate` on a tiny translation model, run as processes, as a user
runs them. Every line they print (stdout and stderr, progress-bar redraws split apart) must match a pattern below:
the package's own lines, Lightning's device lines, progress bars, model summary and results table, and the command's
output itself. Anything else (a warning, a tip, a deprecation, a line echoing a setting) fails, naming the line.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from _forked import HARNESS_ENV, warm_python

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "configs" / "base.yaml"
ENV = {k: v for k, v in HARNESS_ENV.items() if k != "PYTHONWARNINGS"}

# Lines that are known to be good, by who prints them. A new line of the package's own goes here with its command.
KNOWN = [
    # Lightning: the seed, the devices, where a checkpoint is read from, why fit stopped
    r"Seed set to \d+",
    r"(GPU|TPU|HPU) available: .*",
    r"LOCAL_RANK: \d+ - CUDA_VISIBLE_DEVICES: .*",
    r"(Restoring states|Loaded model weights) from the checkpoint (path )?at .*",
    r"Restored all states from the checkpoint at .*",
    r"`Trainer\.fit` stopped: `max_steps=\d+` reached\.",
    # Lightning's progress bars (tqdm redraws) and the model summary (without the FLOPs column: cli/console.py)
    r"(Epoch \d+|Training|Sanity Checking|Validation|Testing|Predicting)( DataLoader \d+)?: .*",
    r"\s*\| Name\s+\| Type\s+\| Params\s+\| Mode\s*",
    r"-+",
    r"\d+ \| \w+\s+\| \w+\s+\| [\d.]+ [KMBT]?\s*\| (train|eval)\s*",
    r"[\d.]+ [KMBT]?\s+(Trainable|Non-trainable|Total) params",
    r"[\d.]+\s+Total estimated model params size \(MB\)",
    r"\d+\s+Modules in (train|eval) mode",
    # Lightning's results table of validate and test
    r"[┏┡└][━─┳╇┻┩┓┴┘]+",
    r"┃\s+(Validate|Test) metric\s+┃\s+DataLoader 0\s+┃",
    r"│\s+(val|test)/[\w/]+\s+│\s+[-\d.e+]+\s+│",
    # The package's own: data preparation and its summary, export
    r"prepare (train|validation|test): .* MB in .* s .*",
    r"[\w.\-/]+: \(characters, tokens\) per split \{.*\}; held-out: \w+",
    r"[\w.\-/]+: blocks of \d+ tokens per split \{.*\}",
    r"[\w.\-/]+: pairs per split \{.*\}.*",
    r"predict: writing .*\.jsonl",
    r"checkpoints: (final|none written) .*",
    r"note: model\.optim\.warmup_steps=\d+ is not below the \d+ optimizer steps .*",  # a short test run
    r"Wrote .*",
    r"",
]


def unknown_lines(text: str) -> list[str]:
    """The lines of `text` (split at newlines and at the carriage returns of progress bars) that match no pattern."""
    patterns = [re.compile(p) for p in KNOWN]
    lines = (line.rstrip() for line in re.split(r"[\r\n]", text))
    return [line for line in lines if not any(p.fullmatch(line) for p in patterns)]


def _command(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m lit_transformer ARGS` as a process, forked from a warm interpreter (tests/_forked.py: what it
    printed while importing torch and Lightning heads the output, as in a fresh process)."""
    result = warm_python(ENV).run([sys.executable, "-m", "lit_transformer", *args], cwd, timeout=600, text=True)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


def _overrides(run: Path) -> list[str]:
    """Where the run writes (a temporary folder), nothing else: what the config sets stays as it is."""
    return [
        "--trainer.default_root_dir", str(run),
        "--trainer.logger.init_args.save_dir", str(run),
        "--checkpoint.dirpath", str(run / "checkpoints"),
        "--data.init_args.cache_dir", str(run / "cache"),
    ]  # fmt: skip


SHORT = ["--trainer.max_steps", "2", "--checkpoint.every_n_train_steps", "2"]  # the same for every command


@pytest.fixture(scope="module")
def base_fit(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """`fit --config configs/base.yaml` for 2 steps, a checkpoint at the second: start-up and training as the
    README's command runs them (tokenizer training and data preparation included)."""
    run = tmp_path_factory.mktemp("base")
    return run, _command("fit", "--config", str(BASE), *_overrides(run), *SHORT, cwd=run)


@pytest.fixture(scope="module")
def translation_checkpoint(tmp_path_factory) -> Path:
    """A 2-step tiny translation model on pairs the test writes (the embedded Bible corpus may be absent)."""
    run = tmp_path_factory.mktemp("translate")
    numbers = ["one", "two", "three", "four", "five", "six"]
    spanish = ["uno", "dos", "tres", "cuatro", "cinco", "seis"]
    rows = [
        f"{numbers[i % 6]} {numbers[j % 6]}\t{spanish[i % 6]} {spanish[j % 6]}" for i in range(6) for j in range(40)
    ]
    (run / "pairs.tsv").write_text("en\tes\n" + "\n".join(rows) + "\n")
    data = ["--data.init_args.dataset", "pairs.tsv", "--data.init_args.tokenizer", "char"]
    short = ["--trainer.max_steps", "2", "--checkpoint.every_n_train_steps", "2", "--trainer.logger", "false"]
    config = ["--config", str(ROOT / "configs" / "presets" / "tiny-translate.yaml")]
    _command("fit", *config, *data, *short, "--trainer.default_root_dir", str(run),
             "--checkpoint.dirpath", str(run / "checkpoints"), "--data.init_args.cache_dir", str(run / "cache"),
             cwd=run)  # fmt: skip
    return run / "checkpoints" / "last.ckpt"


@pytest.mark.slow
def test_fit_with_the_base_config_prints_only_known_lines(base_fit) -> None:
    run, result = base_fit
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert "Total params" in result.stderr + result.stdout and "FLOPs" not in result.stderr + result.stdout
    assert unknown_lines(result.stdout + "\n" + result.stderr) == [], result.stderr[-5000:]


@pytest.mark.slow
@pytest.mark.parametrize("command", ["validate", "test", "predict", "generate", "export"])
def test_each_command_on_its_checkpoint_prints_only_known_lines(base_fit, command: str) -> None:
    run, _ = base_fit
    checkpoint = str(run / "checkpoints" / "last.ckpt")
    common = ["--config", str(BASE), *_overrides(run), *SHORT, "--ckpt_path", checkpoint]
    (run / "prompts.txt").write_text("ROMEO:\nJULIET:\n")
    args = {
        "validate": [*common, "--trainer.limit_val_batches", "2"],
        "test": [*common, "--trainer.limit_test_batches", "2"],
        "predict": [*common, "--data.init_args.predict_file", "prompts.txt", "--predictions.output",
                    str(run / "predictions.jsonl"), "--model.generation.max_new_tokens", "4"],
        "generate": ["--checkpoint", checkpoint, "--prompt", "ROMEO:", "--max_new_tokens", "4"],
        "export": ["--checkpoint", checkpoint, "--format", "safetensors", "--out", str(run / "export")],
    }[command]  # fmt: skip
    result = _command(command, *args, cwd=run)
    printed = result.stderr if command == "generate" else result.stdout + "\n" + result.stderr  # stdout: the text
    if command == "test":
        assert "test/bpc" in result.stdout
    if command == "generate":
        assert result.stdout.startswith("ROMEO:")
    assert unknown_lines(printed) == [], result.stdout[-3000:] + result.stderr[-3000:]


@pytest.mark.slow
def test_translate_prints_only_its_translation(translation_checkpoint: Path) -> None:
    result = _command("translate", "--checkpoint", str(translation_checkpoint), "--text", "one two",
                      "--max_new_tokens", "4", cwd=translation_checkpoint.parent)  # fmt: skip
    assert len(result.stdout.splitlines()) == 1  # the translation, whatever a 2-step model says
    assert unknown_lines(result.stderr) == [], result.stderr[-3000:]


def test_an_unknown_line_is_caught() -> None:
    """The allowlist is a fence, not a sieve: Lightning's tip, the echo of limit_val_batches and torch's deprecation
    (what a plain fit printed before cli/console.py) each fail."""
    printed = [
        "💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger](...)",
        "`Trainer(limit_val_batches=1.0)` was configured so 100% of the batches will be used..",
        ".venv/lib/python3.11/site-packages/lightning/pytorch/utilities/_pytree.py:21: `isinstance(treespec, LeafSpec)` "
        "is deprecated, use `isinstance(treespec, TreeSpec) and treespec.is_leaf()` instead.",
        "0 | model | Transformer      | 940 K  | train | 0    ",
        "0         Total Flops",
    ]
    assert unknown_lines("\n".join(printed)) == [line.rstrip() for line in printed]
