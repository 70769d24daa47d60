"""How every command parses its arguments: exact keys only, plain help, and refusals of a few lines.

jsonargparse (under LightningCLI and the package's own commands) would expand an abbreviated key (`--model.config.n_layer`
trains with `n_layers`), answer a typo with a page of usage, and print Lightning's Sphinx markup as help. Here:
- `parser_options` makes a parser refuse abbreviations and raise instead of printing usage;
- `refusal` turns a parse error into a `UserError` that names the key, where it came from (the flag, or the YAML
  file and key path), the nearest valid keys, and the fix;
- `PlainHelpFormatter` shows docstrings as plain text (`CommandHelpFormatter`: a command's description with its
  examples kept as written);
- `resolve_config` finds a packaged config by name (`--config base`, `--config presets/tiny`).
"""

from __future__ import annotations

import difflib
import inspect
import re
import textwrap
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from jsonargparse import ArgumentParser, DefaultHelpFormatter

from lit_transformer.errors import UserError

CONFIG_FLAGS = ("--config", "-c")

# Sphinx markup in Lightning's docstrings, rewritten as plain text.
_ROLE = re.compile(r":(?:class|func|meth|attr|paramref|mod|obj|data|ref|doc):`~?([^`<]*?)(?:\s*<[^>]*>)?`")
_DIRECTIVE = re.compile(r"\.\.\s*(warning|note|seealso|deprecated|tip|important)::\s*", re.IGNORECASE)
_DEFAULT_SENTENCE = re.compile(r"\s*Default(?:s to|:)\s*``[^`]*``\.?")  # jsonargparse prints the real default
_LITERAL = re.compile(r"``([^`]*)``")
_LINK = re.compile(r"`([^`<]+?)\s*<([^>]+)>`_+")


def plain(text: str) -> str:
    """Docstring text without Sphinx markup: roles keep their last name, literals lose their backticks."""
    text = _DEFAULT_SENTENCE.sub("", text)
    text = _LINK.sub(r"\1 (\2)", text)
    text = _DIRECTIVE.sub(lambda m: m.group(1).capitalize() + ": ", text)
    text = _ROLE.sub(lambda m: m.group(1).rsplit(".", 1)[-1], text)
    return _LITERAL.sub(r"\1", text).replace("`", "")


class PlainHelpFormatter(DefaultHelpFormatter):
    """jsonargparse's help with every description as plain text."""

    def _get_help_string(self, action) -> str:
        return plain(super()._get_help_string(action) or "")

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain(text))

    def start_section(self, heading: str | None) -> None:
        super().start_section(plain(heading) if heading else heading)


class CommandHelpFormatter(PlainHelpFormatter):
    """A command's help: the description's prose paragraphs wrapped to the terminal, and its indented blocks (the
    example command lines of a module docstring) and lists kept line for line."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        blocks = []
        for block in re.split(r"\n\s*\n", textwrap.dedent(text).strip("\n")):
            lines = block.splitlines()
            if any(line[:1].isspace() or line.lstrip().startswith(("- ", "* ")) for line in lines):
                blocks.append("\n".join(indent + line.rstrip() for line in lines))
            else:
                blocks.append(textwrap.fill(" ".join(block.split()), width, initial_indent=indent,
                                            subsequent_indent=indent))  # fmt: skip
        return "\n\n".join(blocks)


def parser_options(
    prog: str, description: str | None = None, usage: str | None = None, formatter: type = PlainHelpFormatter
) -> dict[str, Any]:
    """Keyword arguments for a jsonargparse ArgumentParser of the package: no abbreviations, errors raised."""
    options: dict[str, Any] = {
        "prog": prog,
        "usage": usage,
        "exit_on_error": False,
        "allow_abbrev": False,
        "formatter_class": formatter,
    }
    if description is not None:
        options["description"] = description
    return options


def command_parser(command: str, description: str | None, epilog: str | None = None) -> ArgumentParser:
    """The parser of one of the package's own commands (generate, translate, export, average, ablate, every
    `bench NAME`, ...): `command` as the user types it after the program, `description` (a module docstring with
    its examples, or a sentence) as the head of its --help."""
    from lit_transformer.cli.program import program

    parser = ArgumentParser(**parser_options(program(command), description, formatter=CommandHelpFormatter))
    parser.epilog = epilog
    return parser


def subcommand_parser(command: str, description: str | None = None) -> ArgumentParser:
    """The parser of a subcommand (`bench nanogpt ours`), for `add_subcommands().add_subcommand(name, parser)`."""
    return ArgumentParser(**parser_options(command, description, formatter=CommandHelpFormatter))


def chosen(namespace) -> tuple[str, Any]:
    """(the subcommand given, its own options) of a namespace parsed with subcommands (dest "command")."""
    name = namespace.command
    return name, namespace[name]


def split_passed_on(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """argv before the first `--` (the command's own options) and after it (arguments it passes on, e.g. to fit)."""
    items = list(argv)
    if "--" not in items:
        return items, []
    at = items.index("--")
    return items[:at], items[at + 1 :]


def parse(parser: ArgumentParser, argv: Sequence[str]):
    """parser.parse_args, a mistake raised as a UserError of a few lines."""
    try:
        return parser.parse_args(list(argv))
    except Exception as error:  # jsonargparse's ArgumentError (its module path differs between versions)
        if type(error).__name__ != "ArgumentError":
            raise
        raise refusal(str(error), parser, argv) from None


# ---------------------------------------------------------------------------------------------------------------
# Packaged configs


def packaged_configs() -> Path:
    """The folder of the configs that ship inside the package (the repository's configs/ is the same folder)."""
    return Path(str(resources.files("lit_transformer") / "configs"))


def resolve_config(value: str) -> str:
    """A --config value as a file: the path itself when it exists; else a packaged config by name (`base`,
    `presets/tiny`, with or without `.yaml`, with or without a leading `configs/`). A value found nowhere is
    returned as given, for the parser to refuse."""
    if Path(value).exists() or _inline(value):
        return value  # a file, or an inline YAML/JSON config
    root = packaged_configs()
    name = value[len("configs/") :] if value.startswith("configs/") else value
    for candidate in (name, f"{name}.yaml"):
        path = root / candidate
        if path.is_file():
            return str(path)
    return value


def resolve_configs(argv: Sequence[str]) -> list[str]:
    """argv with each --config value resolved (resolve_config); a config found nowhere is refused here, naming the
    packaged configs it might have meant."""
    out, items = [], list(argv)
    for i, item in enumerate(items):
        flag, eq, inline = item.partition("=")
        if eq and flag in CONFIG_FLAGS:
            out.append(f"{flag}={_existing_config(inline)}")
        elif i > 0 and items[i - 1] in CONFIG_FLAGS:
            out.append(_existing_config(item))
        else:
            out.append(item)
    return out


def packaged_names() -> list[str]:
    root = packaged_configs()
    return sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml"))


def _existing_config(value: str) -> str:
    resolved = resolve_config(value)
    if resolved is value and not Path(value).exists() and not _inline(value):
        names = packaged_names()
        near = difflib.get_close_matches(value.removesuffix(".yaml").removeprefix("configs/"), names, n=3, cutoff=0.5)
        hint = "did you mean " + ", ".join(near) + "? " if near else ""
        raise UserError(
            f"--config {value}: no such file here, and no packaged config of that name",
            hint=f"{hint}Packaged configs go by name, for example --config base or --config presets/tiny "
            f"(all of them: {packaged_configs()}).",
        )
    return resolved


def _inline(value: str) -> bool:
    return value.lstrip().startswith(("{", "[")) or "\n" in value or ": " in value


# ---------------------------------------------------------------------------------------------------------------
# Refusals


_GROUP = re.compile(r"Group '([\w.\-]+)' does not accept option '([\w.\-]+)'")
_UNKNOWN = (
    re.compile(r"does not accept option '([\w.\-]+)'"),
    re.compile(r"[Uu]nrecognized arguments: (--[\w.\-]+)"),
    re.compile(r"Key '([\w.\-]+)' is not expected"),
)
_NESTED = re.compile(r"Problem with given class_path '([\w.]+)':\s*\n\s*Option '([\w.\-]+)' is not accepted")
_PARSER_KEY = re.compile(r'Parser key "([\w.\-]+)"(?: element \d+)?:')
_CHOICES = re.compile(r"Expected an? typing\.Literal\[(.*?)\]\.\s*Got value: (.*)")
_SUBCOMMAND = re.compile(r"argument (\w+): invalid choice: '([^']*)' \(choose from (.*)\)")
_EXPECTED = re.compile(r"Expected an? (?:<class '([\w.]+)'>|([^.\n]+?))\.\s*Got value: (.*)")


def known_keys(parser: ArgumentParser) -> list[str]:
    """Every dotted key a parser takes (nested groups and subcommands' options included), as a flag would spell it."""
    keys = []
    for action in parser._actions:  # the only way argparse exposes its options
        for option in action.option_strings:
            if option.startswith("--"):
                keys.append(option[2:])
        for sub in (getattr(action, "choices", None) or {}).values():  # a subcommand's parser
            if isinstance(sub, ArgumentParser):
                keys += [key for key in known_keys(sub) if key not in keys]
    return keys


def class_keys(class_path: str) -> list[str]:
    """The init arguments a class takes (its own and its bases'), for a suggestion under `init_args`."""
    module, _, name = class_path.rpartition(".")
    try:
        import importlib

        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return []
    names: list[str] = []
    for klass in inspect.getmro(cls):
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            parameters = inspect.signature(init).parameters.values()
        except (TypeError, ValueError):
            continue
        names += [p.name for p in parameters if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return sorted(set(names))


def refusal(message: str, parser: ArgumentParser, argv: Sequence[str]) -> UserError:
    """A parse error of jsonargparse as a UserError: the key, where it came from, the nearest valid keys."""
    prog = parser.prog.replace(" [options]", "")
    help_hint = f"Run '{prog} --help' for every key."
    nested = _NESTED.search(message)
    parser_key = _PARSER_KEY.search(message)
    if nested and parser_key:
        class_path, option = nested.groups()
        key = f"{parser_key.group(1)}.init_args.{option}"
        return _unknown_key(key, class_keys(class_path), argv, help_hint, prefix=f"{parser_key.group(1)}.init_args.")
    group = _GROUP.search(message)
    if group:
        return _unknown_key(".".join(group.groups()), known_keys(parser), argv, help_hint)
    for pattern in _UNKNOWN:
        found = pattern.search(message)
        if found:
            key = found.group(1).lstrip("-")
            return _unknown_key(key, known_keys(parser), argv, help_hint)
    if re.search(r"arguments are required: (?:\w+\.)?data\b", message):
        return UserError(
            "no data to train on: the configs given have no data section",
            hint="Start from a config that has one (--config base, --config presets/tiny) or give "
            "--data.class_path and its --data.init_args.*.",
        )
    choices = _CHOICES.search(message)
    if parser_key and choices:
        key, allowed = parser_key.group(1), ", ".join(re.findall(r"'([^']*)'", choices.group(1)))
        return UserError(
            f"{key}: {choices.group(2).strip()!r} is not one of {allowed} ({_where(key, argv)})", hint=help_hint
        )
    subcommand = _SUBCOMMAND.search(message)
    if subcommand:
        names = re.findall(r"'([^']*)'", subcommand.group(3))
        near = difflib.get_close_matches(subcommand.group(2), names, n=2, cutoff=0.6)
        suggestion = (" Did you mean " + " or ".join(near) + "?") if near else ""
        return UserError(
            f"unknown subcommand {subcommand.group(2)!r} (one of {', '.join(names)}).{suggestion}", hint=help_hint
        )
    expected = _EXPECTED.search(message)
    if parser_key and expected:
        key = parser_key.group(1)
        kind = expected.group(1) or expected.group(2)
        return UserError(
            f"{key}: expected {_article(kind)}, got {expected.group(3).strip()!r} ({_where(key, argv)})", hint=help_hint
        )
    if parser_key and "File does not exist" in message:
        return UserError(message.split(":", 1)[1].strip(), hint=help_hint)
    lines = [line.rstrip() for line in message.strip().splitlines() if line.strip()]
    short = "\n".join(lines[:4]) + ("\n  ..." if len(lines) > 4 else "")
    return UserError(short, hint=help_hint)


def _article(kind: str) -> str:
    kind = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}.get(kind, kind)
    return kind


def _unknown_key(key: str, choices: Iterable[str], argv: Sequence[str], hint: str, prefix: str = "") -> UserError:
    choices = list(choices)
    leaf = key[len(prefix) :] if prefix and key.startswith(prefix) else key
    near = difflib.get_close_matches(leaf, choices, n=2, cutoff=0.6)
    if not near and "." in leaf:  # a typo in the last part: compare the last parts under the same group
        group, _, last = leaf.rpartition(".")
        siblings = [c.rpartition(".")[2] for c in choices if c.rpartition(".")[0] == group]
        near = [f"{group}.{n}" for n in difflib.get_close_matches(last, siblings, n=2, cutoff=0.6)]
    suggestion = (" Did you mean " + " or ".join(prefix + n for n in near) + "?") if near else ""
    return UserError(f"unknown key {key} ({_where(key, argv)}).{suggestion}", hint=hint)


def _where(key: str, argv: Sequence[str]) -> str:
    """Where a key was given: the flag on the command line, or the YAML file (and key path) that holds it."""
    flag = f"--{key}"
    if any(item == flag or item.startswith(flag + "=") for item in argv):
        return f"the flag {flag}"
    for path in _config_files(argv):
        if _holds(path, key):
            return f"in {path}, key {key}"
    return "given as " + flag


def _config_files(argv: Sequence[str]) -> list[str]:
    files = []
    for i, item in enumerate(argv):
        flag, eq, value = item.partition("=")
        if eq and flag in CONFIG_FLAGS:
            files.append(value)
        elif i > 0 and argv[i - 1] in CONFIG_FLAGS:
            files.append(item)
    return [f for f in files if Path(f).is_file()]


def _holds(path: str, key: str) -> bool:
    import yaml

    try:
        tree = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return False
    parts = key.split(".")
    # A YAML may nest under the subcommand's name (fit: {model: ...}).
    nested = [tree.get(c) for c in ("fit", "validate", "test", "predict")] if isinstance(tree, dict) else []
    return any(_has_path(node, parts) for node in (tree, *nested))


def _has_path(tree: Any, parts: list[str]) -> bool:
    """Whether a YAML tree holds the key path, nested (model: {config: ...}) or dotted (model.config.x: 1)."""
    if not parts or not isinstance(tree, dict):
        return False
    for i in range(1, len(parts) + 1):
        head = ".".join(parts[:i])
        if head in tree and (i == len(parts) or _has_path(tree[head], parts[i:])):
            return True
    return False
