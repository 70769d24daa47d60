"""lit_transformer/cli/fast_parsing.py: jsonargparse's action lookups answered from an index give jsonargparse's own
answers, for every lookup of real commands; a config the CLI parsed is dumped without a second validation, with the
same text; anything else is validated as before. Fails on a jsonargparse release the module was not checked against."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import sys
from pathlib import Path

import jsonargparse
import pytest
import yaml
from jsonargparse import ActionConfigFile, Namespace
from jsonargparse._actions import _ActionConfigLoad
from test_cli import _cli

from lit_transformer.cli import fast_parsing
from lit_transformer.cli.fast_parsing import (
    CHECKED_VERSIONS,
    ORIGINAL,
    PRIVATE,
    ValidatedOnceParser,
    index_action_lookups,
    split_keys_once,
    version_checked,
)
from lit_transformer.cli.lightning_cli import run_cli

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ROOT / "configs" / "presets"


def test_the_installed_jsonargparse_is_a_checked_release_and_its_private_names_are_as_read():
    assert version_checked(jsonargparse.__version__), (
        f"jsonargparse {jsonargparse.__version__} is not one lit_transformer/cli/fast_parsing.py was checked against "
        f"{CHECKED_VERSIONS}: read its private lookups again, then add the version"
    )
    for name, parameters in PRIVATE.items():
        module, _, attribute = name.partition(":")
        value = importlib.import_module(module)
        for part in attribute.split("."):  # a method: Namespace._parse_key
            value = getattr(value, part)
        if parameters:
            original = ORIGINAL.get(attribute.rpartition(".")[2]) or value
            assert tuple(inspect.signature(original).parameters) == parameters, name


def test_the_indexed_lookups_are_in_place_in_every_jsonargparse_module():
    assert index_action_lookups()
    assert split_keys_once() and Namespace._parse_key is fast_parsing.parse_key
    for module_name, module in sys.modules.items():
        if module_name.startswith("jsonargparse"):
            for attribute, value in vars(module).items():
                assert value is not ORIGINAL["find_action_and_subcommand"], f"{module_name}.{attribute}"
                assert value is not ORIGINAL["is_branch_key"], f"{module_name}.{attribute}"


def _outcome(function, *args, **kwargs):
    """What a call gives: its value, or what it raised (jsonargparse raises on some keys too)."""
    try:
        return "value", function(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - compared, then raised again
        return "raised", error


def _same(indexed, original) -> bool:
    if indexed[0] != original[0]:
        return False
    if indexed[0] == "raised":
        return type(indexed[1]) is type(original[1])
    if isinstance(indexed[1], tuple):  # (action, subcommand): the very action
        return indexed[1][0] is original[1][0] and indexed[1][1] == original[1][1]
    return indexed[1] == original[1]


@pytest.fixture
def compared(monkeypatch) -> list[int]:
    """Every indexed lookup made while the test runs is answered by jsonargparse's own function too and compared."""
    calls = [0, 0]

    def checked(name: str, position: int):
        indexed_function = getattr(fast_parsing, name)

        def lookup(*args, **kwargs):
            calls[position] += 1
            indexed = _outcome(indexed_function, *args, **kwargs)
            original = _outcome(ORIGINAL[name], *args, **kwargs)
            assert _same(indexed, original), (name, args[1:], kwargs, indexed, original)
            if indexed[0] == "raised":
                raise indexed[1]
            return indexed[1]

        return lookup

    find, branch = checked("find_action_and_subcommand", 0), checked("is_branch_key", 1)
    for module_name, module in list(sys.modules.items()):
        if module_name.startswith("jsonargparse"):
            for attribute, value in list(vars(module).items()):
                if value is fast_parsing.find_action_and_subcommand:
                    monkeypatch.setattr(module, attribute, find)
                elif value is fast_parsing.is_branch_key:
                    monkeypatch.setattr(module, attribute, branch)
    return calls


def _fit_predict_and_refusals(tmp_path: Path) -> None:
    """A fit and a predict of the tiny preset, and three refusals: the commands whose every lookup is compared."""
    run = tmp_path / "run"
    common = ["--trainer.default_root_dir", str(run), "--data.init_args.cache_dir", str(tmp_path / "cache")]
    _cli("fit", "--config", str(PRESETS / "tiny.yaml"), *common, "--trainer.max_steps", "2", cwd=tmp_path)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("ROMEO:\n")
    predict = ["--ckpt_path", str(run / "checkpoints" / "last.ckpt"), "--data.init_args.predict_file", str(prompts)]
    _cli("predict", "--config", str(PRESETS / "tiny.yaml"), *common, *predict, cwd=tmp_path)
    rows = [json.loads(line) for line in (run / "predictions.jsonl").read_text().splitlines()]
    assert [row["input"] for row in rows] == ["ROMEO:"], rows
    for mistake in (["--model.config.n_heads", "3"], ["--model.confg.n_layers", "2"], ["--trainer.max_step", "2"]):
        refused = _cli("fit", "--config", str(PRESETS / "tiny-translate.yaml"), *mistake, cwd=tmp_path, ok=False)
        assert "Traceback" not in refused.stderr, refused.stderr[-2000:]


def test_every_lookup_of_a_fit_a_predict_and_refusals_gets_jsonargparse_s_own_answer(tmp_path: Path, compared):
    _fit_predict_and_refusals(tmp_path)
    assert compared[0] > 1000 and compared[1] > 0, compared


def test_keys_that_are_no_action_and_a_changed_action_list_are_answered_as_jsonargparse_does(compared):
    parser = ValidatedOnceParser(exit_on_error=False)
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_argument("--model.width", type=int, default=8)
    parser.add_argument("--model.depth", type=int, default=2)
    subcommands = parser.add_subcommands(required=False)
    sub = ValidatedOnceParser(exit_on_error=False)
    sub.add_argument("--steps", type=int, default=1)
    subcommands.add_subcommand("fit", sub)
    keys = ["model", "model.width", "model.wid", "mode", "config", "fit", "fit.steps", "fit.step", "", "fit.", "x.y"]
    for exclude in (None, _ActionConfigLoad):
        for key in keys:
            jsonargparse._subcommands.find_action_and_subcommand(parser, key, exclude)
    for key in keys:
        with contextlib.suppress(IndexError):  # "fit" (a subcommand, no dot): jsonargparse's own raises too, compared
            jsonargparse._subcommands.is_branch_key(parser, key)
    # an action replaced in place (as a link replaces its target): the index follows
    position = next(i for i, a in enumerate(parser._actions) if a.dest == "model.width")
    replacement = ValidatedOnceParser().add_argument("--model.height", type=int)
    parser._actions[position] = replacement
    assert jsonargparse._subcommands.find_action_and_subcommand(parser, "model.height")[0] is replacement
    assert jsonargparse._subcommands.find_action_and_subcommand(parser, "model.width")[0] is None
    assert compared[0] >= 2 * len(keys) + 2


def test_each_docstring_is_parsed_once_and_a_framework_class_from_its_docstring_alone(monkeypatch):
    """Our config's field docstrings (attribute docstrings, read from its source) reach --help, parsed once a process;
    a Lightning or torch class's source is never read (LightningModule's took 0.3 s a command), its docstring still
    documents its parameters."""
    import docstring_parser
    from lightning.pytorch import LightningModule
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lit_transformer.cli.lightning_cli import _parse_once
    from lit_transformer.config import TransformerConfig

    assert hasattr(docstring_parser.parse_from_object, "__wrapped__")  # installed where jsonargparse calls it
    read = []
    source = inspect.getsource
    monkeypatch.setattr(inspect, "getsource", lambda obj: read.append(obj) or source(obj))
    parse = _parse_once(docstring_parser.parser.parse_from_object)  # a cache of its own
    for _ in range(2):
        fields = {p.arg_name: p.description for p in parse(TransformerConfig).params}
        assert fields["n_heads"] and fields["positions"]
        assert read == [TransformerConfig]
    parse(LightningModule)
    assert read == [TransformerConfig]
    assert "monitor" in {p.arg_name for p in parse(ModelCheckpoint).params} and read == [TransformerConfig]


def test_a_parsed_config_dumps_the_same_text_without_a_second_validation(monkeypatch):
    cli = run_cli(["--config", str(PRESETS / "tiny.yaml"), "--trainer.logger", "false"], run=False)
    parser, config = cli.parser, cli.config
    assert isinstance(parser, ValidatedOnceParser)
    validating = parser.dump(config, skip_validation=False, skip_link_targets=False, skip_none=False, format="yaml")
    validations = []
    monkeypatch.setattr(parser, "validate", lambda *a, **k: validations.append(a))
    trusted = parser.dump(config, skip_link_targets=False, skip_none=False, format="yaml")
    assert trusted == validating and validations == []
    # another config (not the CLI's parse) is validated as jsonargparse does
    other = config.clone()
    parser.dump(other, format="yaml")
    assert len(validations) == 1


def test_an_untrusted_invalid_config_still_fails_its_dump_and_save(tmp_path: Path):
    parser = ValidatedOnceParser(exit_on_error=False)
    parser.add_argument("--width", type=int, default=8)
    bad = Namespace(width="wide")
    with pytest.raises(TypeError):
        parser.dump(bad)
    with pytest.raises(TypeError):
        parser.save(bad, tmp_path / "config.yaml", multifile=False)
    parser.trust(bad)
    assert yaml.safe_load(parser.dump(bad)) == {"width": "wide"}  # trusted: written as it is, not checked again
    parser.save(bad, tmp_path / "trusted.yaml", multifile=False)  # config.yaml's way (SaveConfigCallback)
    assert yaml.safe_load((tmp_path / "trusted.yaml").read_text()) == {"width": "wide"}
    with pytest.raises(TypeError):
        parser.dump(bad, skip_validation=False)  # asked for: validated


def _typed(value):
    """A value with the type of each part spelled out: 1, 1.0 and True compare equal, their YAML is not the same."""
    if isinstance(value, dict):
        return ("dict", [(_typed(k), _typed(v)) for k, v in value.items()])
    if isinstance(value, list | tuple):
        return (type(value).__name__, [_typed(v) for v in value])
    if isinstance(value, float) and value != value:  # nan: equal to itself here, as YAML's .nan is
        return ("float", "nan")
    return (type(value).__name__, value)


PLAIN = [
    {"a": 1, "b": 2.5, "c": True, "d": None, "e": "text", "f": [1, "2", [3.0]], "g": {"h": {}}, "i": []},
    {"yes": "no", "on": "off", "null": "~", "1": "1e3", "<<": "=", "x": "0o17", "y": "0x1F", "z": ".inf"},
    {"floats": [1e-05, 1e16, -0.0, float("inf"), float("-inf"), float("nan"), 3.0e-3, 0.1 + 0.2, 2**0.5]},
    {"ints": [0, -1, 2**70, True, False], "empty": "", "spaces": "  a  b  ", "quotes": 'it\'s "quoted"'},
    {"long": "word " * 40 + "end", "long2": "a  " * 50, "colon": "key: value", "hash": "a #b", "dash": "- x"},
    {"unicode": "naïve — 東京 🚀", "path": "${trainer.default_root_dir}/checkpoints", "pattern": "{step:06d}"},
]
NOT_PLAIN = [  # YAML's own way: a string it escapes, a type it reads back as another
    {"tab": "a\tb"},
    {"newline": "a\nb"},
    {"separator": "a\u2028b"},
    {"tuple": (1, 2)},
    {1: "an int key"},
    {"a\tkey": "a tab in a key"},
    {"subclass": type("Str", (str,), {})("x")},
]


@pytest.mark.parametrize("value", PLAIN + NOT_PLAIN)
def test_the_hyperparameters_data_is_what_yaml_reads_back(value):
    """lightning_compat.yaml_round_trip gives what Lightning's YAML dump of the hyperparameters loads back as (the
    same values of the same types), or refuses the data (NotPlainData), which then takes Lightning's own way."""
    from jsonargparse._loaders_dumpers import dumpers

    from lit_transformer.engine.lightning_compat import NotPlainData, yaml_round_trip

    if value in NOT_PLAIN:
        with pytest.raises(NotPlainData):
            yaml_round_trip(value)
        return
    assert _typed(yaml_round_trip(value)) == _typed(yaml.safe_load(dumpers["yaml"](value)))


def test_a_shared_container_is_refused_as_yaml_would_alias_it():
    from lit_transformer.engine.lightning_compat import NotPlainData, yaml_round_trip

    shared = [1, 2]
    with pytest.raises(NotPlainData):
        yaml_round_trip({"a": shared, "b": shared})
    assert yaml_round_trip({"a": [1, 2], "b": [1, 2]}) == {"a": [1, 2], "b": [1, 2]}


@pytest.mark.parametrize("preset", ["tiny.yaml", "tiny-translate.yaml", "classify-genre.yaml"])
def test_the_model_and_data_hyperparameters_are_lightning_s(preset, monkeypatch):
    """The CLI's config_dump (the model's and the data's hyperparameters, written into every checkpoint) is the data
    Lightning's own _dump_config gives, a YAML text loaded back, for a real command's config; and it was made
    without that text."""
    from lightning.pytorch.cli import LightningCLI

    from lit_transformer.engine import lightning_compat

    cli = run_cli(["--config", str(PRESETS / preset), "--trainer.logger", "false"], run=False)
    del cli.config_dump
    texts = []
    safe_load = yaml.safe_load
    monkeypatch.setattr(yaml, "safe_load", lambda text: texts.append(text) or safe_load(text))
    lightning_compat.LightningCLIHooks._dump_config(cli)
    ours = cli.config_dump
    assert texts == []  # no YAML text: the plain data
    del cli.config_dump
    LightningCLI._dump_config(cli)
    assert len(texts) == 1 and _typed(ours) == _typed(cli.config_dump)
    assert set(ours) >= {"model", "data", "trainer"}


@pytest.fixture
def keys_compared(monkeypatch) -> list[int]:
    """Every Namespace._parse_key made while the test runs is answered by jsonargparse's own too and compared: the
    same leaf key, the very parent namespace, the same parent key; or the same refusal."""
    calls = [0]

    def answers(namespace, key):
        calls[0] += 1
        ours, theirs = (
            _outcome(fast_parsing.parse_key, namespace, key),
            _outcome(ORIGINAL["_parse_key"], namespace, key),
        )
        assert ours[0] == theirs[0], (key, ours, theirs)
        if ours[0] == "raised":
            assert type(ours[1]) is type(theirs[1]) and str(ours[1]) == str(theirs[1]), (key, ours, theirs)
            raise ours[1]
        (leaf, parent, parent_key), (leaf_, parent_, parent_key_) = ours[1], theirs[1]
        assert leaf == leaf_ and parent is parent_ and parent_key == parent_key_, (key, ours, theirs)
        return ours[1]

    monkeypatch.setattr(Namespace, "_parse_key", answers)
    return calls


def test_every_key_of_a_fit_a_predict_and_refusals_is_split_as_jsonargparse_splits_it(tmp_path: Path, keys_compared):
    _fit_predict_and_refusals(tmp_path)
    assert keys_compared[0] > 10_000, keys_compared


def test_odd_keys_are_split_or_refused_as_jsonargparse_does(keys_compared):
    namespace = Namespace(model=Namespace(config=Namespace(width=8), items={"a": 1}), plain=3, clone=4)
    namespace["dict"] = {"inner": {"deep": 1}}
    keys = ["model.config.width", "model.config", "model", "plain", "plain.x", "clone", "clone.x", "model.items.a",
            "dict.inner.deep", "dict.inner.deep.x", "absent.x.y", "model..width", ".model", "model.", "", "a b", "items",
            "model.clone", "update"]  # fmt: skip
    for key in keys * 2:  # the second time from the cache
        for use in (
            namespace.__contains__,
            namespace.get,
            lambda k: namespace.__setitem__(k, 1) if k == "absent.x.y" else None,
        ):
            with contextlib.suppress(KeyError):
                use(key)
    for key in (1, None, type("Key", (str,), {})("model.config")):  # not a plain str: jsonargparse's own way
        with contextlib.suppress(KeyError):
            namespace.get(key)
    assert "absent.x.y" in namespace and namespace["absent.x.y"] == 1
    assert keys_compared[0] > 3 * len(keys)
