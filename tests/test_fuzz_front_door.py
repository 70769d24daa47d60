"""A fuzzed front door: mistakes are generated, not listed, and every one is answered as docs/cli.md says.

Hypothesis draws configs with a field dropped, mistyped, out of range, set to a wrong choice or combined
inconsistently; data files empty, header-only, binary, truncated mid-row, with wrong columns, in mixed encodings, with
a broken JSON line among good ones; checkpoints truncated, of another task or architecture, or not checkpoints at all;
inputs longer than the context; mistyped commands, flags and choices. Each must end with the exit status of the rule
(2: the command line or a config; 1: a file), a refusal of a few lines, no traceback, and the key or file named.

The cases run in this process through the program's own entry point (`main`, output captured): a Lightning command
builds its model, data and trainer as a run would and stops where training would start (`run_subcommand` is
replaced), so a config's refusal is the one a run gives. A few cases run as processes too (forked from a warm
interpreter, tests/_forked.py). The draws are
derandomized (the same cases on every run, in CI as here) and bounded in number, so the file takes about a minute.
`pytest tests/test_fuzz_front_door.py -s` prints how many cases each class ran.
"""

from __future__ import annotations

import collections
import contextlib
import inspect
import io
import json
import os
import string
import sys
import traceback
from dataclasses import fields
from pathlib import Path
from typing import get_args, get_type_hints

import pytest
import torch
import yaml
from _forked import warm_python
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from lit_transformer.cli import lightning_cli
from lit_transformer.cli.program import COMMANDS, main
from lit_transformer.config import TransformerConfig
from lit_transformer.data.text import special_token_id, train_tokenizer
from lit_transformer.model import Transformer

ROOT = Path(__file__).resolve().parents[1]
PRESET = ROOT / "configs" / "presets" / "tiny.yaml"
OLD = ROOT / "tests" / "fixtures" / "old_checkpoints"  # one small checkpoint per task (test_old_checkpoints.py)
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
ENV.pop("LIT_TRANSFORMER_DEBUG", None)

# Derandomized and bounded: the same cases on every machine, in bounded time. No example database, no deadline
# (a case's time depends on the machine's load, not on the case).
FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=6,
    phases=(Phase.explicit, Phase.generate, Phase.shrink),
    suppress_health_check=(HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large),
)
RAN: collections.Counter[str] = collections.Counter()  # cases run per class, printed at the end (pytest -s)


@pytest.fixture(scope="module", autouse=True)
def _report_counts():
    yield
    print("\nfuzzed front door, cases per class:", dict(sorted(RAN.items())), "in all:", sum(RAN.values()))


@pytest.fixture(scope="module")
def place(tmp_path_factory) -> Path:
    """The working folder of every case: a cache of its own, so prepared data never leaks between suites."""
    folder = tmp_path_factory.mktemp("front_door")
    (folder / "cache").mkdir()
    return folder


@pytest.fixture(autouse=True)
def _stop_before_training(monkeypatch, place):
    """A Lightning command builds everything a run builds, then stops where training would start."""
    monkeypatch.setattr(lightning_cli.TransformerCLI, "run_subcommand", lambda self, subcommand: None)
    monkeypatch.setenv("LIT_TRANSFORMER_CACHE", str(place / "cache"))
    monkeypatch.delenv("LIT_TRANSFORMER_DEBUG", raising=False)
    monkeypatch.chdir(place)


# ---- the answer and what it must be ---------------------------------------------------------------------------------


def answer(*argv: str) -> tuple[int, str]:
    """(exit status, stderr) of the command line, run through the program's entry point in this process; an
    exception that escapes it is what a process would print as a traceback."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            main(list(argv))
            code: int = 0
        except SystemExit as end:
            code = end.code if isinstance(end.code, int) else (0 if end.code is None else 1)
            if isinstance(end.code, str):
                err.write(end.code + "\n")
        except BaseException:  # noqa: BLE001 - a bug: shown as the process would show it
            err.write(traceback.format_exc())
            code = 1
    return code, err.getvalue()


def refusal_of(stderr: str) -> list[str]:
    """The refusal's lines: from `error:` to the end (what Lightning printed before it is its own)."""
    lines = stderr.rstrip().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("error:")]
    return lines[starts[-1] :] if starts else lines


def check_refused(kind: str, code: int, stderr: str, status: int, *named: str) -> None:
    """The rule: `status`, no traceback, the refusal in at most 4 lines, one of `named` (the key or file) in it."""
    RAN[kind] += 1
    assert "Traceback" not in stderr, f"{kind}: a traceback\n{stderr[-3000:]}"
    refusal = refusal_of(stderr)
    assert code == status, f"{kind}: exit {code}, not {status}\n{stderr[-2000:]}"
    assert refusal and refusal[0].startswith("error:"), f"{kind}: no refusal\n{stderr[-2000:]}"
    assert len(refusal) <= 4, f"{kind}: {len(refusal)} lines\n{stderr}"
    text = "\n".join(refusal)
    assert any(name in text for name in named), f"{kind}: none of {named} named\n{text}"


# ---- configs -----------------------------------------------------------------------------------------------------

CONFIG_FIELDS = {f.name: f for f in fields(TransformerConfig)}
CHOICE_FIELDS = {name: get_args(hint) for name, hint in get_type_hints(TransformerConfig).items()
                 if get_args(hint) and all(isinstance(a, str) for a in get_args(hint))}  # fmt: skip
# Fields every model has and the tiny preset sets: a value below their range is a mistake whatever else is given.
POSITIVE = ("d_model", "n_heads", "n_layers", "d_ff")
FRACTIONS = ("dropout", "attention_dropout")
NUMERIC_KEYS = (
    "model.config.d_model",
    "model.config.n_layers",
    "model.config.dropout",
    "model.optim.lr",
    "model.optim.warmup_steps",
    "data.init_args.batch_size",
    "data.init_args.block_size",
    "trainer.max_steps",
    "checkpoint.every_n_train_steps",
)
WORDS = st.text(alphabet=string.ascii_lowercase, min_size=2, max_size=9).filter(
    lambda w: w not in ("null", "none", "true", "false", "yes", "no", "on", "off", "nan", "inf")
)


def given_as(key: str, value, yaml_file: bool, place: Path) -> list[str]:
    """A key given on the command line, or in a YAML file of its own composed after the preset."""
    if not yaml_file:
        return [f"--{key}", str(value)]
    tree: dict = {}
    node = tree
    *parents, leaf = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    path = place / f"mine-{abs(hash((key, str(value)))) % 10**8}.yaml"
    path.write_text(yaml.safe_dump(tree))
    return ["--config", path.name]


def where_named(key: str, argv: list[str]) -> tuple[str, ...]:
    """What the refusal must name: the key (as a flag or a YAML key) or the file that holds it."""
    return (key, *(a for a in argv if a.endswith(".yaml") and a.startswith("mine-")))


@FUZZ
@given(key=st.sampled_from(NUMERIC_KEYS), value=WORDS, yaml_file=st.booleans())
def test_a_value_of_the_wrong_type(place, key, value, yaml_file):
    argv = given_as(key, value, yaml_file, place)
    code, err = answer("fit", "--config", "presets/tiny", *argv)
    check_refused("config: wrong type", code, err, 2, *where_named(key, argv))
    assert "expected" in err and repr(value) in err


@FUZZ
@given(
    field=st.sampled_from(POSITIVE + FRACTIONS),
    low=st.integers(-1000, 0),
    high=st.floats(1.0, 1e6, allow_nan=False),
    yaml_file=st.booleans(),
)
def test_a_value_out_of_range(place, field, low, high, yaml_file):
    value = high if field in FRACTIONS else low
    argv = given_as(f"model.config.{field}", value, yaml_file, place)
    code, err = answer("fit", "--config", "presets/tiny", *argv)
    check_refused("config: out of range", code, err, 2, *where_named(f"model.config.{field}", argv))
    assert f"{field}=" in err  # the field and the value it was given


@FUZZ
@given(
    key=st.sampled_from(
        ["trainer.max_steps", "trainer.max_epochs", "trainer.num_nodes", "trainer.devices", "data.init_args.batch_size"]
    ),
    value=st.integers(-(10**6), -2),
)
def test_a_trainer_or_data_value_out_of_range(place, key, value):
    """Lightning's refusals (max_steps, log_every_n_steps) are user errors as the package's own are."""
    code, err = answer("fit", "--config", "presets/tiny", f"--{key}", str(value))
    check_refused("config: trainer or data out of range", code, err, 2, key.rpartition(".")[2])


@FUZZ
@given(field=st.sampled_from(sorted(CHOICE_FIELDS)), value=WORDS, yaml_file=st.booleans())
def test_a_value_outside_its_choices(place, field, value, yaml_file):
    if value in CHOICE_FIELDS[field]:
        return
    argv = given_as(f"model.config.{field}", value, yaml_file, place)
    code, err = answer("fit", "--config", "presets/tiny", *argv)
    check_refused("config: wrong choice", code, err, 2, *where_named(f"model.config.{field}", argv))
    assert "is not one of" in err and all(choice in err for choice in CHOICE_FIELDS[field])


@st.composite
def inconsistent(draw) -> tuple[dict[str, object], tuple[str, ...]]:
    """Values each valid alone that cannot go together, and the keys the refusal must name."""
    kind = draw(st.sampled_from(["heads", "kv_heads", "rope", "context", "nope"]))
    if kind == "heads":
        heads = draw(st.integers(2, 12))
        d_model = draw(st.integers(heads + 1, 200).filter(lambda d: d % heads))
        return {"model.config.d_model": d_model, "model.config.n_heads": heads}, ("d_model", "n_heads")
    if kind == "kv_heads":
        kv = draw(st.integers(3, 8))
        heads = draw(st.sampled_from([h for h in range(kv + 1, 4 * kv) if h % kv]))
        return {"model.config.d_model": 64 * heads, "model.config.n_heads": heads, "model.config.n_kv_heads": kv}, (
            "n_kv_heads",
        )
    if kind == "rope":
        heads = draw(st.integers(1, 4))
        return {"model.config.positions": "rope", "model.config.n_heads": heads, "model.config.d_model": heads * 7}, (
            "rope",
        )
    if kind == "nope":
        return {"model.config.positions": "none", "model.config.topology": "encoder_decoder"}, ("positions",)
    block = draw(st.integers(8, 64))
    context = draw(st.integers(8, 64).filter(lambda c: c != block))
    return {"data.init_args.block_size": block, "model.config.max_seq_len": context}, ("block_size", "max_seq_len")


@FUZZ
@given(case=inconsistent(), yaml_file=st.booleans())
def test_values_that_disagree(place, case, yaml_file):
    values, named = case
    argv = [item for key, value in values.items() for item in given_as(key, value, yaml_file, place)]
    code, err = answer("fit", "--config", "presets/tiny", *argv)
    check_refused("config: inconsistent", code, err, 2, *named)
    assert all(name in err for name in named), err


def _leaves(tree: dict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in tree.items():
        path = f"{prefix}{key}"
        keys.append(path)
        if isinstance(value, dict):
            keys += _leaves(value, path + ".")
    return keys


PRESET_KEYS = _leaves(yaml.safe_load(PRESET.read_text()))


def _without(tree: dict, key: str) -> dict:
    head, _, rest = key.partition(".")
    out = dict(tree)
    if rest:
        out[head] = _without(tree[head], rest)
    else:
        del out[head]
    return out


@FUZZ
@given(key=st.sampled_from(PRESET_KEYS))
def test_a_config_with_a_field_dropped_runs_or_is_refused(place, key):
    """Most fields have a default: dropping one gives a run. Where none fits (the data's class, the steps a cosine
    schedule needs) the refusal names what is missing. Never a traceback."""
    config = place / "dropped.yaml"
    config.write_text(yaml.safe_dump(_without(yaml.safe_load(PRESET.read_text()), key)))
    code, err = answer("fit", "--config", str(config), "--data.init_args.max_chars", "20000")
    RAN["config: field dropped"] += 1
    assert "Traceback" not in err, f"dropped {key}\n{err[-3000:]}"
    if code != 0:
        check_refused("config: field dropped, refused", code, err, 2, *key.split("."), "data", "max_steps")


@FUZZ
@given(key=st.sampled_from([k for k in PRESET_KEYS if k.count(".") >= 1]), typo=st.data())
def test_a_mistyped_key(place, key, typo):
    parts = key.split(".")
    leaf = parts[-1]
    at = typo.draw(st.integers(0, len(leaf) - 1))
    wrong = leaf[:at] + typo.draw(st.sampled_from("xqz_")) + leaf[at + 1 :]
    if wrong == leaf:
        return
    bad = ".".join([*parts[:-1], wrong])
    code, err = answer("fit", "--config", "presets/tiny", f"--{bad}", "1")
    check_refused("config: mistyped key", code, err, 2, bad)


@FUZZ
@given(text=st.text(min_size=1, max_size=40))
def test_a_yaml_that_does_not_parse_is_named_with_its_line(place, text):
    config = place / "broken.yaml"
    body = f"model:\n  config:\n    d_model: 32\n  - {text}\n"  # a list item where a mapping goes: never YAML
    config.write_text(body, encoding="utf-8", errors="surrogatepass")
    code, err = answer("fit", "--config", "presets/tiny", "--config", str(config))
    check_refused("config: malformed YAML", code, err, 2, f"{config}:")


# ---- the command line ------------------------------------------------------------------------------------------


@FUZZ
@given(word=WORDS)
def test_an_unknown_command(word):
    if any(word == c.name for c in COMMANDS):
        return
    code, err = answer(word, "--config", "presets/tiny")
    check_refused("command: unknown", code, err, 2, f"'{word}'")


@FUZZ
@given(command=st.sampled_from(["generate", "translate", "export", "average"]), flag=WORDS)
def test_an_unknown_flag_of_a_command(command, flag):
    code, err = answer(command, f"--{flag}x", "1")
    check_refused("command: unknown flag", code, err, 2, f"{flag}x")


@FUZZ
@given(value=WORDS)
def test_an_export_format_outside_its_choices(value):
    if value in ("hf", "onnx", "safetensors"):
        return
    code, err = answer("export", "--checkpoint", "x.ckpt", "--format", value, "--out", "out")
    check_refused("command: wrong choice", code, err, 2, "--format")
    assert "hf, onnx, safetensors" in err


# ---- data files ------------------------------------------------------------------------------------------------

GOOD_ROWS = [f"line {i} of a corpus, with words enough to read" for i in range(40)]


DATA_MISTAKES = ("empty", "header-only", "binary", "truncated", "wrong columns", "mixed encodings", "bad json")


@st.composite
def broken_data(draw, kind: str) -> tuple[str, bytes, str]:
    """(file name, bytes, `kind`) for a data file that cannot be read as its name says, in a form drawn."""
    forms = {"header-only": [".csv", ".tsv"], "wrong columns": [".csv", ".tsv", ".jsonl"], "bad json": [".jsonl"],
             "truncated": [".csv", ".tsv", ".jsonl", ".txt"]}  # fmt: skip
    form = draw(st.sampled_from(forms.get(kind, [".txt", ".csv", ".jsonl"])))
    sep = "\t" if form == ".tsv" else ","

    def lines(rows: list[dict], header: bool = True) -> list[bytes]:
        """A file's lines (no newlines) holding `rows`, in the file's form."""
        if form == ".jsonl":
            return [json.dumps(r, ensure_ascii=False).encode() for r in rows]
        if form == ".txt":
            return [r["text"].encode() for r in rows]
        names = list(rows[0])
        body = [sep.join(f'"{r[n]}"' for n in names).encode() for r in rows]
        return [sep.join(names).encode(), *body] if header else body

    rows = [{"text": t} for t in GOOD_ROWS]
    good = lines(rows)
    if kind == "empty":
        return f"empty{form}", b"", kind
    if kind == "header-only":
        return f"header{form}", b"text\n", kind
    if kind == "binary":
        noise = draw(st.binary(min_size=16, max_size=400))
        return f"binary{form}", noise[:8] + b"\x00" + noise[8:], kind
    if kind == "truncated":  # cut inside the last row: a quoted field or a JSON object left open, a character halved
        last = good[-1]
        cut = draw(st.integers(2, len(last) - 2))
        tail = last[:cut] if form != ".txt" else last[:cut] + "\u00e9".encode()[:1]
        return f"truncated{form}", b"\n".join([*good[:-1], tail]), kind
    if kind == "wrong columns":
        names = draw(st.lists(WORDS.filter(lambda w: w not in ("text", "label")), min_size=1, max_size=3, unique=True))
        return f"columns{form}", b"\n".join(lines([{n: t for n in names} for t in GOOD_ROWS])) + b"\n", kind
    at = draw(st.integers(1 if form in (".csv", ".tsv") else 0, len(good)))
    if kind == "mixed encodings":  # one row written in Latin-1 among UTF-8 rows
        odd = lines([{"text": "na\u00efve caf\u00e9"}], header=False)[0].decode().encode("latin-1")
    else:
        odd = draw(st.sampled_from([b'{"text": "an unclosed', b'{"text": }', b"text without braces", b"[1, 2"]))
    return f"{kind.replace(' ', '-')}{form}", b"\n".join([*good[:at], odd, *good[at:]]) + b"\n", kind


@pytest.mark.parametrize("kind", DATA_MISTAKES)
@settings(FUZZ, max_examples=4)
@given(data=st.data())
def test_a_data_file_that_cannot_be_read(place, kind, data):
    """Read by `prepare` (the whole preparation, as fit's first run does) with the tiny preset's text column."""
    name, content, _ = data.draw(broken_data(kind))
    (place / name).write_bytes(content)
    code, err = answer("prepare", "--config", "presets/tiny", "--data.init_args.dataset", name,
                       "--data.init_args.cache_dir", str(place / "cache"))  # fmt: skip
    check_refused(f"data: {kind}", code, err, 1, name)


@pytest.mark.parametrize("kind", ["empty", "header-only", "wrong columns"])
@settings(FUZZ, max_examples=2)
@given(data=st.data())
def test_a_labelled_data_file_without_its_rows_or_columns(place, kind, data):
    """The classifier's data (text and label columns), refused when fit builds it, before any training."""
    name, content, _ = data.draw(broken_data(kind))
    (place / name).write_bytes(content)
    code, err = answer("fit", "--config", "presets/classify-genre", "--data.init_args.dataset", name,
                       "--data.init_args.vocab_size", "300", "--data.init_args.cache_dir", str(place / "cache"))  # fmt: skip
    check_refused(f"labelled data: {kind}", code, err, 1, name)


# ---- checkpoints and inputs -------------------------------------------------------------------------------------

TASK_COMMANDS = {"language_modeling": "generate", "translation": "translate"}


@FUZZ
@given(
    name=st.sampled_from(sorted(TASK_COMMANDS) + ["classification"]),
    keep=st.floats(0.0, 0.98),
    command=st.sampled_from(["generate", "translate", "export", "validate"]),
)
def test_a_checkpoint_cut_short(place, name, keep, command):
    data = (OLD / f"{name}.ckpt").read_bytes()
    cut = place / f"cut-{name}.ckpt"
    cut.write_bytes(data[: int(len(data) * keep)])
    code, err = answer(*_load_with(command, cut.name))
    check_refused("checkpoint: truncated", code, err, 1, cut.name)


@FUZZ
@given(content=st.one_of(st.binary(max_size=300), st.text(max_size=300).map(str.encode)), command=st.sampled_from(
    ["generate", "translate", "export", "validate", "test", "predict"]))  # fmt: skip
def test_a_file_that_is_not_a_checkpoint(place, content, command):
    path = place / "not-a-checkpoint.ckpt"
    path.write_bytes(content)
    code, err = answer(*_load_with(command, path.name))
    check_refused("checkpoint: not one", code, err, 1, path.name)


@FUZZ
@given(name=st.sampled_from(["classification", "masked_lm", "translation", "language_modeling"]),
       command=st.sampled_from(["generate", "translate"]))  # fmt: skip
def test_a_checkpoint_of_another_task(place, name, command):
    if TASK_COMMANDS.get(name) == command:
        return
    code, err = answer(command, "--checkpoint", str(OLD / f"{name}.ckpt"), "--text", "a", "--max_new_tokens", "2")
    if command == "generate":
        code, err = answer(command, "--checkpoint", str(OLD / f"{name}.ckpt"), "--max_new_tokens", "2")
    check_refused("checkpoint: another task", code, err, 1, "task")


# The task each packaged preset's data feeds, and a preset per task.
PRESET_OF_TASK = {
    "language_modeling": "presets/tiny",
    "translation": "presets/tiny-translate",
    "classification": "presets/classify-genre",
}


@pytest.mark.parametrize("command", ["validate", "test", "predict", "fit"])
@pytest.mark.parametrize("name", ["classification", "masked_lm", "translation", "language_modeling"])
def test_a_checkpoint_of_another_task_given_to_a_lightning_command(place, name, command):
    """`validate --config presets/tiny --ckpt_path TRANSLATION.ckpt` ended in a KeyError from inside the task's loss,
    once the data had been prepared: each checkpoint against each preset whose data feeds another task is refused
    before any data is read (exit 1, the checkpoint named, the DataModule that feeds it said)."""
    fed = {"masked_lm": ("language_modeling", "classification")}.get(name, (name,))
    for task, preset in PRESET_OF_TASK.items():
        if task in fed:
            continue
        inputs = ["--data.init_args.predict_file", str(OLD / "make.py")] if command == "predict" else []
        code, err = answer(command, "--config", preset, "--ckpt_path", str(OLD / f"{name}.ckpt"), *inputs)
        check_refused(f"checkpoint: another task's, {command}", code, err, 1, f"{name}.ckpt")
        assert f"is a {name} model" in err


@FUZZ
@given(pair=st.sampled_from([("language_modeling", "translation"), ("classification", "masked_lm"),
                             ("language_modeling", "classification")]))  # fmt: skip
def test_checkpoints_of_other_architectures_averaged(place, pair):
    code, err = answer("average", "--checkpoints", *(str(OLD / f"{n}.ckpt") for n in pair), "--output", "avg.ckpt")
    check_refused("checkpoint: another architecture", code, err, 1, *(f"{n}.ckpt" for n in pair))


def _load_with(command: str, path: str) -> list[str]:
    if command in ("generate", "translate"):
        return [command, "--checkpoint", path, "--text" if command == "translate" else "--prompt", "a"]
    if command == "export":
        return [command, "--checkpoint", path, "--format", "safetensors", "--out", "exported"]
    return [command, "--config", "presets/tiny", "--ckpt_path", path]


@pytest.fixture(scope="module")
def learned_translator(tmp_path_factory) -> tuple[Path, int]:
    """An encoder-decoder with learned positions (it cannot read past max_seq_len) as fit would save it."""
    tokenizer = train_tokenizer([string.printable * 3], kind="char", vocab_size=128)
    ids = {role: special_token_id(tokenizer, role) for role in ("pad", "bos", "eos")}
    config = TransformerConfig(topology="encoder_decoder", positions="learned", d_model=16, n_heads=2, n_layers=1,
                               d_ff=32, max_seq_len=24, vocab_size=tokenizer.get_vocab_size(),
                               **{f"{role}_token_id": i for role, i in ids.items()})  # fmt: skip
    model = Transformer(config)
    path = tmp_path_factory.mktemp("translator") / "mt.ckpt"
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    torch.save({"state_dict": state, "hyper_parameters": {"config": config}, "tokenizer": tokenizer.to_str()}, path)
    return path, config.max_seq_len


@FUZZ
@given(extra=st.integers(1, 200), lines=st.integers(1, 5), where=st.data())
def test_a_source_longer_than_the_encoder_reads(place, learned_translator, extra, lines, where):
    """Learned positions end at max_seq_len: a longer source is refused, naming the line (a note, not a refusal, is
    generate's answer: a decoder slides over a long prompt, docs/inference.md)."""
    checkpoint, context = learned_translator
    long = "x" * (context + extra)
    inputs = ["short"] * lines
    at = where.draw(st.integers(0, lines - 1))
    inputs[at] = long
    (place / "sources.txt").write_text("\n".join(inputs) + "\n")
    code, err = answer("translate", "--checkpoint", str(checkpoint), "--input", "sources.txt")
    check_refused("input: longer than the context", code, err, 1, f"sources.txt line {at + 1}")
    code, err = answer("translate", "--checkpoint", str(checkpoint), "--text", long)
    check_refused("input: longer than the context", code, err, 1, "--text")


# ---- a few as processes -------------------------------------------------------------------------------------------


@settings(FUZZ, max_examples=1)
@given(data=st.data())
def test_as_a_process_a_mistake_is_answered_the_same(place, data):
    """What the process itself prints and returns (its streams, Lightning's lines, the interpreter's exit)."""
    kind = data.draw(st.sampled_from(["binary", "bad json", "mixed encodings"]))
    name, content, _ = data.draw(broken_data(kind))
    (place / name).write_bytes(content)
    result = warm_python(ENV).run(  # forked from a warm interpreter (tests/_forked.py): a process of its own
        [sys.executable, "-m", "lit_transformer", "prepare", "--config", "presets/tiny",
         "--data.init_args.dataset", name, "--data.init_args.cache_dir", str(place / "cache")],
        cwd=place, timeout=300, text=True,
    )  # fmt: skip
    check_refused(f"process: data {kind}", result.returncode, result.stderr, 1, name)
    assert len(result.stderr.strip().splitlines()) <= 6, result.stderr


@settings(FUZZ, max_examples=1)
@given(keep=st.floats(0.05, 0.95), name=st.sampled_from(sorted(TASK_COMMANDS)))
def test_as_a_process_a_torn_checkpoint_is_answered_the_same(place, keep, name):
    data = (OLD / f"{name}.ckpt").read_bytes()
    (place / "torn.ckpt").write_bytes(data[: int(len(data) * keep)])
    result = warm_python(ENV).run(
        [sys.executable, "-m", "lit_transformer", TASK_COMMANDS[name], "--checkpoint", "torn.ckpt"],
        cwd=place, timeout=300, text=True,
    )  # fmt: skip
    check_refused("process: torn checkpoint", result.returncode, result.stderr, 1, "torn.ckpt")
    assert len(result.stderr.strip().splitlines()) <= 4, result.stderr


# ---- every integer flag of every command -------------------------------------------------------------------------

# The other commands' required arguments, so that a flag's value is what is judged (the model commands read a
# checkpoint first: GenerationConfig's checks need its task).
COMMAND_ARGS = {
    "generate": ["--checkpoint", str(OLD / "language_modeling.ckpt"), "--max_new_tokens", "2"],
    "translate": ["--checkpoint", str(OLD / "translation.ckpt"), "--text", "a", "--max_new_tokens", "2"],
    "average": ["--checkpoints", str(OLD / "language_modeling.ckpt"), "--output", "avg.ckpt"],
    "export": ["--checkpoint", str(OLD / "language_modeling.ckpt"), "--format", "hf", "--out", "out"],
    "serve": ["--checkpoint", str(OLD / "language_modeling.ckpt")],
    "ablate": [str(ROOT / "configs" / "ablations" / "frontier.yaml"), "--dry-run"],
    "digit-strips": ["--out", "strips"],
    "translation-recipe": ["--run", "run", "--config", "presets/tiny-translate"],
}
# Integer flags for which -1 means something: a seed (torch seeds its generator with any integer), and eos_token_id
# -1, no token ends a row (below -1 it is refused).
NEGATIVE_MEANS_SOMETHING = {
    ("generate", "--seed"),
    ("translate", "--seed"),
    ("ablate", "--seeds"),
    ("generate", "--eos_token_id"),
    ("translate", "--eos_token_id"),
}


def integer_flags(command: str) -> list[str]:
    """The flags of a command's own parser whose type is an integer (int, int | None, a restricted int, a list of
    them), read from the parser the command builds: a flag added later is walked too."""
    import jsonargparse

    class Built(Exception):
        pass

    def stop(self, *args, **kwargs):
        raise Built(self)

    original = jsonargparse.ArgumentParser.parse_args
    jsonargparse.ArgumentParser.parse_args = stop
    try:
        next(c for c in COMMANDS if c.name == command).load()([])
    except Built as built:
        parser = built.args[0]
    finally:
        jsonargparse.ArgumentParser.parse_args = original
    flags = []
    for action in parser._actions:
        hint = str(getattr(action, "_typehint", None) or action.type)
        if action.option_strings and ("int" in hint.replace("Literal", "").lower()):
            flags.append(action.option_strings[0])
    return flags


def test_the_walk_sees_the_commands_and_their_integer_flags():
    assert set(COMMAND_ARGS) == {c.name for c in COMMANDS} - {"fit", "validate", "test", "predict", "prepare", "bench"}
    assert {"--num_samples", "--seed", "--top_k", "--stop_token_ids"} <= set(integer_flags("generate"))
    assert {"--batch_size", "--num_beams"} <= set(integer_flags("translate"))


@pytest.mark.parametrize("command", sorted(COMMAND_ARGS))
def test_every_integer_flag_of_every_command_refuses_a_negative_value(place, command):
    """By rule: each integer flag given -1 is refused (exit 2, the flag named, no traceback) unless a negative number
    means something there. `translate --batch_size 0` was a traceback, `generate --num_samples -1`, `--batch_size -2`
    and `--stop_token_ids -1` printed nothing and exited 0, `digit-strips --count -1` and `ablate --jobs 0` were
    tracebacks."""
    for flag in integer_flags(command):
        if (command, flag) in NEGATIVE_MEANS_SOMETHING:
            continue
        code, err = answer(command, *COMMAND_ARGS[command], flag, "-1")
        check_refused(f"command: {flag} negative", code, err, 2, flag.lstrip("-"))


@pytest.mark.parametrize("key", ["max_tokens", "held_out"])
def test_a_shared_data_key_the_task_sets_itself_is_refused_as_such(place, key):
    """`--data.init_args.max_tokens` with a language model was answered "unknown key data.init_args.max_tokens. Did
    you mean data.init_args.max_tokens?": the suggestions came from every base class's __init__, the refusal from
    what jsonargparse accepts. The suggestions now come from what it accepts, and a base's argument the class sets
    itself is named as such."""
    code, err = answer("fit", "--config", "presets/tiny", f"--data.init_args.{key}", "9")
    check_refused("config: a key the task sets", code, err, 2, f"data.init_args.{key}")
    assert f"LanguageModelingDataModule sets DataModule's {key} itself and takes no such argument" in err
    assert "Did you mean" not in err


# ---- every integer or number of every callback group ---------------------------------------------------------------

# Callback arguments for which -1 means something: a seed, Lightning's save_top_k (-1 keeps every checkpoint).
CALLBACK_NEGATIVE_MEANS_SOMETHING = {
    "step_seed.seed",
    "samples.seed",
    "checkpoint.save_top_k",
    "best_checkpoint.save_top_k",
}


def callback_numbers(monkeypatch) -> list[str]:
    """Every int or float argument of the callback groups `fit` builds (checkpoint, samples, attention, ...), read by
    recording the groups the CLI adds: a callback or argument added later is walked too."""
    import types
    import typing

    from lightning.pytorch import Callback
    from lightning.pytorch.cli import LightningArgumentParser

    groups: dict[str, type] = {}
    original = LightningArgumentParser.add_lightning_class_args

    def record(self, lightning_class, nested_key, *args, **kwargs):
        if isinstance(lightning_class, type) and issubclass(lightning_class, Callback):  # not the trainer
            groups[nested_key] = lightning_class
        return original(self, lightning_class, nested_key, *args, **kwargs)

    monkeypatch.setattr(LightningArgumentParser, "add_lightning_class_args", record)
    answer("fit", "--config", "presets/tiny")
    monkeypatch.undo()
    keys = []
    for group, cls in groups.items():
        for name, parameter in inspect.signature(cls.__init__).parameters.items():
            hint = typing.get_type_hints(cls.__init__).get(name)
            union = typing.get_origin(hint) in (typing.Union, types.UnionType)
            kinds = set(typing.get_args(hint)) - {type(None)} if union else {hint}
            if kinds & {int, float} and parameter.default is not inspect.Parameter.empty:
                keys.append(f"{group}.{name}")
    return keys


def test_every_number_of_every_callback_refuses_a_negative_value(place, monkeypatch):
    """By rule: each numeric argument of the callbacks `fit` builds, given -1, is refused before training (exit 2,
    the key named, no traceback), unless -1 means something there. `--samples.num_translations -1` translated all
    sources but one, `--attention.max_tokens -1` drew all tokens but the last, `--throughput.peak_flops -1` gave a
    negative MFU: each ran without a word."""
    keys = callback_numbers(monkeypatch)
    assert {"samples.num_translations", "attention.max_tokens", "nonfinite.max_consecutive"} <= set(keys)
    for key in keys:
        if key in CALLBACK_NEGATIVE_MEANS_SOMETHING:
            continue
        code, err = answer("fit", "--config", "presets/tiny", f"--{key}", "-1")
        check_refused(f"callback: {key} negative", code, err, 2, key)


def test_a_model_task_its_data_does_not_feed_is_refused_before_any_data_is_read(place):
    """A language-modelling task over the genre classifier's data (the architecture changed to match) trained on
    batches of whole passages and their class ids as next-token labels: refused, naming both keys."""
    code, err = answer(
        "fit", "--config", "presets/classify-genre", "--model.task", "lit_transformer.tasks.LanguageModeling",
        "--model.config.topology", "decoder_only",
    )  # fmt: skip
    check_refused("config: task and data", code, err, 2, "model.task")
    assert "is not a task ClassificationDataModule makes batches for" in err and "data.class_path" in err
    # A translation preset with a language model's DataModule: refused from the configs, before the DataModule read
    # the Bible as text ("no column 'text'", the first thing that reading met).
    code, err = answer(
        "fit", "--config", "presets/tiny-translate", "--data.class_path", "lit_transformer.data.LanguageModelingDataModule"
    )  # fmt: skip
    check_refused("config: task and data", code, err, 2, "model.task")
    assert "translation is fed by TranslationDataModule" in err and "no column" not in err


@pytest.mark.parametrize("optimizer", ["adamw", "adam", "muon"])
def test_fp16_weights_with_an_eps_fp16_rounds_to_zero_are_refused_before_training(place, optimizer):
    """`--trainer.precision 16-true` keeps Adam's state in fp16, where the default eps (1e-8; adam's 1e-9) is 0: the
    tiny preset's weights were all NaN after its first step, and the run ended at the non-finite guard's limit with
    nothing saved. Refused before training, naming both keys; an eps fp16 can hold is taken."""
    flags = ["fit", "--config", "presets/tiny", "--trainer.precision", "16-true", "--model.optim.optimizer", optimizer]
    code, err = answer(*flags)
    check_refused("config: fp16 eps", code, err, 2, "trainer.precision")
    assert "where Adam's eps=" in err and "--model.optim.eps 1e-4" in err
    code, err = answer(*flags, "--model.optim.eps", "1e-4")
    assert code == 0, err[-2000:]


def test_a_resume_with_another_block_size_is_told_that_the_context_is_the_checkpoint_s(place):
    """`fit --ckpt_path CKPT --data.init_args.block_size N` (N not the checkpoint's context) was answered "give one of
    them (the other follows)", which a resume cannot do: the checkpoint fixes the context. The refusal says so and
    names the two ways on."""
    path = str(OLD / "language_modeling.ckpt")
    context = torch.load(path, map_location="cpu", weights_only=False)["hyper_parameters"]["config"]["max_seq_len"]
    code, err = answer("fit", "--config", "presets/tiny", "--ckpt_path", path, "--data.init_args.block_size",
                       str(context // 2))  # fmt: skip
    check_refused("config: a resume's block size", code, err, 2, "data.init_args.block_size")
    assert f"resumes a model whose context is {context} tokens" in err and f"--model.init_from {path}" in err


# ---- mistakes the walks above do not draw (a newcomer's session) ----------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "key"),
    [
        (["--trainer.accumulate_grad_batches", "0"], "trainer.accumulate_grad_batches"),  # ZeroDivisionError
        (["--trainer.val_check_interval", "0"], "trainer.val_check_interval"),  # ZeroDivisionError
        (["--trainer.check_val_every_n_epoch", "0"], "trainer.check_val_every_n_epoch"),  # ZeroDivisionError
        (["--trainer.gradient_clip_val", "-1"], "trainer.gradient_clip_val"),  # accepted: gradient ascent
        (["--seed_everything=-1"], "seed_everything"),  # numpy's ValueError from Lightning's seeding
        (["--trainer.accelerator", "tpu"], "trainer.accelerator"),  # ModuleNotFoundError: torch_xla
        (["--model.compile", "true", "--model.compile_mode", "fastest"], "model.compile_mode"),  # torch's RuntimeError
        (["--model.optim.lr", "-1e-3"], "--model.optim.lr=-1e-3"),  # "argument --model.optim: expected one argument"
        (["--trainer.limit_train_batches", "0"], "trainer.limit_train_batches"),  # ended at once, nothing saved
        (["--trainer.max_steps", "0"], "trainer.max_steps=0 trains no batch"),  # "trainer.max_steps is not set"
        (["--trainer.max_epochs", "0"], "trainer.max_epochs"),  # ended at once, nothing saved
    ],
)  # fmt: skip
def test_a_trainer_or_model_value_a_run_cannot_use_is_refused_before_the_data(place, flags, key):
    """Values Lightning or torch took without a word and failed on at the first step (a traceback after the data was
    prepared), or ran wrongly (a negative clip bound multiplies every gradient by a negative factor): refused from the
    command line, naming the key, before any data is read."""
    code, err = answer("fit", "--config", "presets/tiny", *flags)
    check_refused("config: a value a run cannot use", code, err, 2, key)
    assert "shakespeare:" not in err  # no data was read


@pytest.mark.parametrize("key", ["trainer.default_root_dir", "checkpoint.dirpath", "trainer.logger.init_args.save_dir"])
@pytest.mark.parametrize("below", [False, True])
def test_a_run_folder_that_is_a_file_is_refused_before_the_data(place, key, below):
    """A file where the run's folders go (or above them) ended in NotADirectoryError / FileExistsError tracebacks
    once the data was prepared."""
    (place / "notes.txt").write_text("mine\n")
    folder = "notes.txt/run" if below else "notes.txt"
    code, err = answer("fit", "--config", "presets/tiny", f"--{key}", folder)
    check_refused("file: a run folder that is a file", code, err, 1, key)
    assert (place / "notes.txt").read_text() == "mine\n"


@pytest.mark.parametrize("text", ["", "# every line commented out\n# trainer:\n#   max_steps: 3\n"])
def test_an_empty_config_is_refused_naming_it(place, text):
    """An empty YAML (or comments only) was answered "error: Unexpected config:", naming no file."""
    (place / "empty.yaml").write_text(text)
    code, err = answer("fit", "--config", "presets/tiny", "--config", "empty.yaml")
    check_refused("config: empty", code, err, 2, "empty.yaml")


def test_a_key_given_twice_in_a_yaml_is_refused_with_both_lines(place):
    """YAML loaders keep the last of two equal keys: a second `trainer:` section silently dropped the first's keys."""
    (place / "twice.yaml").write_text("trainer:\n  max_steps: 3\nmodel:\n  config:\n    d_model: 64\ntrainer:\n"
                                      "  precision: 32-true\n")  # fmt: skip
    code, err = answer("fit", "--config", "presets/tiny", "--config", "twice.yaml")
    check_refused("config: a key twice", code, err, 2, "twice.yaml:6")
    assert "'trainer'" in err and "line 1" in err


def test_a_negative_value_in_scientific_notation_names_the_flag_and_the_form_that_reads(place):
    code, err = answer("generate", "--checkpoint", str(OLD / "language_modeling.ckpt"), "--temperature", "-1e-3")
    check_refused("config: a negative value", code, err, 2, "--temperature=-1e-3")


@pytest.mark.parametrize(
    "argv",
    [
        ["export", "--checkpoint", str(OLD / "language_modeling.ckpt"), "--format", "safetensors", "--out",
         "notes.txt/export"],
        ["average", "--checkpoints", str(OLD / "language_modeling.ckpt"), "--output", "notes.txt/avg.ckpt"],
        ["digit-strips", "--count", "1", "--out", "notes.txt/strips"],
    ],
    ids=["export", "average", "digit-strips"],
)  # fmt: skip
def test_an_output_folder_that_cannot_be_made_is_refused(place, argv):
    """An output path below a file was a NotADirectoryError / FileExistsError traceback (export's after the load)."""
    (place / "notes.txt").write_text("mine\n")
    code, err = answer(*argv)
    check_refused("file: an output folder", code, err, 1, "notes.txt")
    assert (place / "notes.txt").read_text() == "mine\n"


def test_a_checkpoint_whose_hyperparameters_hold_its_decoding_settings_loads(place):
    """fit recorded model.generation as a GenerationConfig object (tiny-translate's `generation: {num_beams: 2}`),
    which every weights_only load refused as an unsafe pickle: translate, test, export and average could not read
    the run's checkpoints. Such files load; new ones hold plain data."""
    from lit_transformer.checkpoints.files import load_checkpoint
    from lit_transformer.config import GenerationConfig

    checkpoint = torch.load(OLD / "translation.ckpt", map_location="cpu", weights_only=False)
    checkpoint["hyper_parameters"]["generation"] = GenerationConfig(num_beams=2, length_penalty=0.6)
    torch.save(checkpoint, place / "decoding.ckpt")
    assert load_checkpoint(place / "decoding.ckpt")["hyper_parameters"]["generation"].num_beams == 2
    code, err = answer("translate", "--checkpoint", "decoding.ckpt", "--text", "a", "--max_new_tokens", "2")
    assert code == 0, err[-2000:]


@pytest.mark.parametrize("content", [None, "{oops"], ids=["no config.json", "a torn config.json"])
def test_an_init_from_folder_that_is_not_a_model_is_refused(place, content):
    """`--model.init_from` an empty folder was a FileNotFoundError traceback (config.json), a torn config.json a
    JSONDecodeError: each is refused naming the file."""
    folder = place / f"not-a-model-{content is None}"
    folder.mkdir(exist_ok=True)
    if content is not None:
        (folder / "config.json").write_text(content)
    code, err = answer("fit", "--config", "presets/tiny", "--model.init_from", folder.name)
    check_refused("file: init_from folder", code, err, 1, "config.json")
