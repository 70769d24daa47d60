"""docs/config.md, the reference of every field a run's YAML or flags set, generated from the command line's own parser.

    python -m lit_transformer.pages.docgen            # write docs/config.md
    python -m lit_transformer.pages.docgen --check    # exit 1 when docs/config.md differs from what the code gives

The parser is the one `python -m lit_transformer fit` builds (`run_cli`), stopped before it parses anything, so the
types, defaults and help texts are the CLI's: a field, default or docstring changed in the code changes the page, and
tests/test_config_reference.py fails until the page is regenerated. Each task's DataModule is read with jsonargparse's
own class reader, as the CLI reads `data.class_path`'s `init_args`.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import types
import typing
from argparse import SUPPRESS
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

from lit_transformer.records import IMPORT_ROOT, require_source_checkout

PAGE = IMPORT_ROOT / "docs" / "config.md"

# The package's own groups beside model, data and trainer (added in TransformerCLI.add_arguments_to_parser).
INTRO = """# Configuration reference

What this page is for: every field a run's YAML file or a flag can set, with its type, default and meaning, as
`python -m lit_transformer fit` reads them. A field `a.b.c` is the YAML key `c` under `b` under `a`, or the flag
`--a.b.c VALUE`; `python -m lit_transformer fit --config configs/base.yaml --print_config` prints a merged config.
This page is generated from the code (`python -m lit_transformer.pages.docgen`; `tests/test_config_reference.py` fails when
it is stale): edit the docstrings, not the page. Lightning's own `trainer.*` fields are in Lightning's documentation
(`python -m lit_transformer fit --help` lists them); the defaults the package sets for them are below.
"""


class _Built(Exception):
    """Raised in place of parsing: carries the CLI's parser out of LightningCLI's constructor."""

    def __init__(self, parser) -> None:
        super().__init__("built")
        self.parser = parser


def cli_parser():
    """The parser of `python -m lit_transformer fit` (run_cli's, without subcommands), before it parses anything."""
    from lit_transformer.cli.lightning_cli import TransformerCLI, run_cli

    def stop(self, parser, args):
        raise _Built(parser)

    with mock.patch.object(TransformerCLI, "parse_arguments", stop):
        try:
            run_cli(args=[], run=False)
        except _Built as built:
            return built.parser
    raise RuntimeError("run_cli parsed its arguments without calling parse_arguments")


def type_name(hint: object) -> str:
    """A type hint as the page writes it: int, float | None, "pre" | "post", list[str]."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return " | ".join(f'"{a}"' if isinstance(a, str) else repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if hint is type(None):
        return "None"
    if origin is not None:
        inner = ", ".join(type_name(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]" if inner else getattr(origin, "__name__", "")
    if isinstance(hint, type):
        return hint.__name__
    return re.sub(r"\btyping\.", "", str(hint))


def default_text(value: object) -> str:
    if hasattr(value, "as_dict"):  # a jsonargparse Namespace (a class_path/init_args default)
        value = value.as_dict()
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(default_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {default_text(v)}" for k, v in value.items()) + "}"
    if dataclasses.is_dataclass(value) or type(value).__name__ == "Namespace":
        return "(the fields below)"
    return str(value)


def cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def fields(parser, prefix: str, defaults) -> Iterator[tuple[str, str, str, str]]:
    """(name, type, default, meaning) of every argument of `parser` under `prefix`, in the parser's order."""
    from jsonargparse import Namespace

    for action in parser._actions:
        dest = getattr(action, "dest", "")
        if not dest.startswith(prefix) or dest in ("help", "config") or dest.endswith(".help"):
            continue
        if type(action).__name__ in ("_ActionConfigLoad", "_ActionHelpClassPath", "_HelpAction", "ActionConfigFile"):
            continue
        hint = getattr(action, "_typehint", None) or action.type
        try:
            default = defaults[dest]
        except (KeyError, TypeError):
            default = action.default
        if isinstance(default, Namespace):
            default = default.as_dict()
        if isinstance(default, str) and default == SUPPRESS:
            default = None
        text = action.help if isinstance(action.help, str) and action.help != SUPPRESS else ""
        yield dest, type_name(hint) if hint is not None else "", default_text(default), text


def table(rows: list[tuple[str, str, str, str]], first_sentence: bool = False) -> str:
    lines = ["| field | type | default | meaning |", "| --- | --- | --- | --- |"]
    for name, kind, default, text in rows:
        text = cell(text)
        if first_sentence:
            text = re.split(r"(?<=[.!?])\s+(?=[A-Z`])", text, maxsplit=1)[0]
        lines.append(f"| `{name}` | {cell(kind)} | `{cell(default)}` | {text} |")
    return "\n".join(lines) + "\n"


def dataclass_in(hint: object) -> type | None:
    """The dataclass a field's type names (`Optimization | None` -> Optimization), if any."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return hint
    return next((found for arg in typing.get_args(hint) if (found := dataclass_in(arg))), None)


def dataclass_fields(cls: type, prefix: str) -> list[tuple[str, str, str, str]]:
    """The rows of a dataclass's fields, read by jsonargparse as the CLI reads a value of that type."""
    from jsonargparse import ArgumentParser

    reader = ArgumentParser(exit_on_error=False)
    reader.add_class_arguments(cls, "fields")
    return [
        (prefix + n.removeprefix("fields"), k, d, t) for n, k, d, t in fields(reader, "fields.", reader.get_defaults())
    ]


def _data_modules() -> list[type]:
    import lit_transformer.data as data

    return [getattr(data, name) for name in data.__all__ if name.endswith("DataModule")]


def _first_line(obj: object) -> str:
    return cell((obj.__doc__ or "").strip().split("\n\n")[0])


def render() -> str:
    """The whole page."""
    from jsonargparse import ArgumentParser

    from lit_transformer.engine.lightning_module import LitTransformer

    parser = cli_parser()
    defaults = parser.get_defaults()
    rows = list(fields(parser, "", defaults))
    hints = {a.dest: getattr(a, "_typehint", None) for a in parser._actions if getattr(a, "dest", None)}
    for dest in ("model.optim", "model.lora", "model.generation"):  # a dataclass value: one row per field
        if not any(r[0].startswith(dest + ".") for r in rows) and dataclass_in(hints.get(dest)):
            rows += dataclass_fields(dataclass_in(hints[dest]), dest)
    out = [INTRO]

    def section(title: str, what: str, selected: list, first_sentence: bool = False) -> None:
        if selected:
            out.append("\n\n".join(part for part in (title, what, table(selected, first_sentence)) if part))

    groups = ["model.config.", "model.optim.", "model.lora.", "model.generation."]
    model = [r for r in rows if r[0].startswith("model.") and not any(r[0].startswith(g) for g in groups)]
    section("## model", f"`LitTransformer`: {_first_line(LitTransformer)}", model)
    titles = {
        "model.config.": "## model.config: the architecture (`TransformerConfig`)",
        "model.optim.": "## model.optim: optimizer and schedule",
        "model.lora.": "## model.lora: LoRA adapters (with `--config configs/finetune/lora.yaml`)",
        "model.generation.": "## model.generation: decoding in validate, test and predict (`GenerationConfig`)",
    }
    for group, title in titles.items():
        section(title, "", [r for r in rows if r[0].startswith(group)])

    out.append(
        "## data: one DataModule per task\n\n`data.class_path` names the task's DataModule (the presets set it); its "
        "fields are `data.init_args.*`.\n\n"
    )
    for module in _data_modules():
        reader = ArgumentParser(exit_on_error=False)
        reader.add_class_arguments(module, "init_args")
        own = [(f"data.{n}", k, d, t) for n, k, d, t in fields(reader, "init_args.", reader.get_defaults())]
        out.append(f"### `{module.__module__}.{module.__name__}`\n\n{_first_line(module)}\n\n{table(own)}\n")

    skip = ("model.", "data", "trainer.", "seed_everything", "ckpt_path", "print_config")
    extra = [r for r in rows if not r[0].startswith(skip)]
    lightning = {r[0].split(".")[0] for r in extra if "." in r[0]} & {"checkpoint", "best_checkpoint"}
    section(
        "## The package's run options and callbacks",
        "Groups the package adds beside `model`, `data` and `trainer`: each callback has its own group, so a YAML "
        f"or a flag tunes it. {', '.join(f'`{g}`' for g in sorted(lightning))} are Lightning's `ModelCheckpoint` "
        "(its documentation has the full meaning of each field; the first sentence is here).",
        extra,
        first_sentence=True,
    )
    top = [r for r in rows if r[0] in ("seed_everything",)]
    trainer = [r for r in rows if r[0] in ("trainer.logger", "trainer.callbacks", "trainer.plugins")]
    section("## Top level and the package's trainer defaults", "", top + trainer, first_sentence=True)
    return "\n".join(part.rstrip() + "\n" for part in out)


def main(argv: list[str] | None = None) -> None:
    from lit_transformer.cli.arguments import command_parser, parse

    require_source_checkout("lit_transformer.pages.docgen", "the docs/ it writes")
    parser = command_parser("lit_transformer.pages.docgen", __doc__)
    parser.add_argument("--out", type=Path, default=PAGE, help="where to write the page (default: docs/config.md)")
    parser.add_argument("--check", action="store_true", help="exit 1, naming the page, when it is stale")
    args = parse(parser, sys.argv[1:] if argv is None else argv)
    page = render()
    if args.check:
        if not args.out.is_file() or args.out.read_text() != page:
            sys.exit(f"{args.out} is stale: regenerate it with `python -m lit_transformer.pages.docgen`")
        return
    args.out.write_text(page)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
