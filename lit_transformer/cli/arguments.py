"""How every command parses its arguments: exact keys only, plain help, and refusals of a few lines.

jsonargparse (under LightningCLI and the package's own commands) would expand an abbreviated key (`--model.config.n_layer`
trains with `n_layers`), answer a typo with a page of usage, and print Lightning's Sphinx markup as help. Here:
- `parser_options` makes a parser refuse abbreviations and raise instead of printing usage;
- `refusal` turns a parse error into a `ConfigError` that names the key, where it came from (the flag, or the YAML
  file and key path: the last one given, which is the one that counts), the nearest valid keys or the choices, and
  the fix;
- `resolve_configs` finds each --config (a file, or a packaged config by name) and reads it as YAML first, so a
  malformed file is named with its line;
- `PlainHelpFormatter` shows docstrings as plain text (`CommandHelpFormatter`: a command's description with its
  examples kept as written);
- `resolve_config` finds a packaged config by name (`--config base`, `--config presets/tiny`).
"""

from __future__ import annotations

import difflib
import functools
import inspect
import os
import re
import textwrap
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from jsonargparse import ArgumentParser, DefaultHelpFormatter

from lit_transformer.errors import ConfigError

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


class ProgramParser(ArgumentParser):
    """jsonargparse's parser, whose parsers built without a prog (--data.help CLASS's) name the program as typed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from lit_transformer.cli.invocation import name_the_program

        super().__init__(*args, **name_the_program(args, kwargs))


def command_parser(command: str, description: str | None, epilog: str | None = None) -> ArgumentParser:
    """The parser of one of the package's own commands (generate, translate, export, average, ablate, every
    `bench NAME`, ...): `command` as the user types it after the program, `description` (a module docstring with
    its examples, or a sentence) as the head of its --help."""
    from lit_transformer.cli.invocation import program

    parser = ProgramParser(**parser_options(program(command), description, formatter=CommandHelpFormatter))
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
    """parser.parse_args, a mistake raised as a ConfigError of a few lines."""
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
            out.append(f"{flag}={existing_config(inline)}")
        elif i > 0 and items[i - 1] in CONFIG_FLAGS:
            out.append(existing_config(item))
        else:
            out.append(item)
    return out


def packaged_names() -> list[str]:
    root = packaged_configs()
    return sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml"))


def existing_config(value: str, given_as: str = "--config") -> str:
    """A config given by path or by packaged name (resolve_config), read as YAML; one found nowhere, or that is not
    YAML, is refused naming it as it was given (`given_as`: the flag, or "grid" for ablate's positional files)."""
    resolved = resolve_config(value)
    if resolved is value and not Path(value).exists() and not _inline(value):
        names = packaged_names()
        near = difflib.get_close_matches(value.removesuffix(".yaml").removeprefix("configs/"), names, n=3, cutoff=0.5)
        hint = "did you mean " + ", ".join(near) + "? " if near else ""
        raise ConfigError(
            f"{given_as} {value}: no such file here, and no packaged config of that name",
            hint=f"{hint}Packaged configs go by name, for example --config base or --config presets/tiny "
            f"(all of them: {packaged_configs()}).",
        )
    if not _inline(resolved) and not read_config(resolved) and given_as != "grid":
        # jsonargparse answered an empty file with "Unexpected config:" and no name
        raise ConfigError(
            f"{given_as} {value} holds no keys (it is empty, or comments only): give a config with `model:`, "
            "`data:` or `trainer:` keys, or leave it out"
        )
    return resolved


def read_config(path: str) -> dict:
    """A config file's YAML as a mapping; a file that is not one is refused naming the file (and its line)."""
    import yaml

    where = Path(path)
    if where.is_dir():
        raise ConfigError(f"--config {path} is a folder: give a YAML file (e.g. {where / 'base.yaml'})")
    try:
        text = where.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"--config {path} is not UTF-8 text (byte {error.start}): give a YAML file") from None
    try:
        loader = _unique_keys_loader()(text)  # yaml.load's steps, with the file's name in the marks
        loader.name = path
        try:
            tree = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
        line = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        position = getattr(error, "position", None)  # a character YAML does not allow (a ReaderError)
        if mark is None and isinstance(position, int):
            line = f":{text.count(chr(10), 0, position) + 1}:{position - text.rfind(chr(10), 0, position)}"
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ConfigError(
            f"{path}{line} is not valid YAML: {problem}",
            hint="Fix the file there (YAML indents nested keys with spaces and writes `key: value`).",
        ) from None
    if tree is None:
        return {}
    if not isinstance(tree, dict):
        raise ConfigError(
            f"{path} holds a YAML {type(tree).__name__}, not a mapping of keys: write `model:`, `data:`, "
            "`trainer:` sections (see configs/base.yaml)"
        )
    return tree


@functools.cache
def _unique_keys_loader() -> type:
    """yaml's SafeLoader, refusing a key given twice in one mapping (naming both lines): the plain loader keeps the
    last silently, so a second `trainer:` section dropped every key of the first. One parse, as safe_load's."""
    import yaml

    class UniqueKeysLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen: dict[str, int] = {}
            for key, _ in node.value if isinstance(node, yaml.MappingNode) else ():
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    line = key.start_mark.line + 1
                    if key.value in seen:
                        raise ConfigError(
                            f"{key.start_mark.name}:{line}: the key {key.value!r} is given twice in one mapping "
                            f"(also at line {seen[key.value]}); YAML keeps only the last, dropping the first: merge "
                            "them into one",
                        )
                    seen[key.value] = line
            return super().construct_mapping(node, deep)

    return UniqueKeysLoader


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
_SUBCOMMAND = re.compile(r"argument (\w+): invalid choice: '([^']*)' \(choose from (.*)\)")
_CLASS_PATH = re.compile(r"Problem with given class_path '([\w.]+)'")
_EXPECTED = re.compile(r"Expected an? (?:<class '([\w.]+)'>|([^\n]+?))\.\s*Got value: (.*)")
_UNION = re.compile(r"Subtypes: \[(.*)\][\s\S]*?Given value: (.*)")
_LITERAL = re.compile(r"typing\.Literal\[(.*?)\]")
_RESTRICTED = re.compile(r"Not of type (\w+): (.*?) does not conform to restriction")
# The same type given no number at all: "Not of type PositiveInt: invalid literal for int() with base 10: 'many'".
_NOT_A_NUMBER = re.compile(r"Not of type (\w+): (?:invalid literal for \w+\(\)(?: with base 10)?|could not convert "
                           r"string to float): '(.*)'")  # fmt: skip
_REQUIRED = re.compile(r"the following arguments are required: (.+)")


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


def _load_class(class_path: str) -> type | None:
    module, _, name = class_path.rpartition(".")
    try:
        import importlib

        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


def _init_names(cls: type) -> list[str]:
    """Every argument of the __init__s of a class and its bases."""
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


def class_keys(class_path: str) -> list[str]:
    """The init arguments a class takes, for a suggestion under `init_args`: those jsonargparse accepts for it (its
    own, and its bases' that reach them through **kwargs, but not a base's argument the class sets itself); else,
    for a class jsonargparse cannot read, every __init__'s of it and its bases."""
    cls = _load_class(class_path)
    if cls is None:
        return []
    try:
        parser = ArgumentParser()
        parser.add_class_arguments(cls, "init_args")
    except Exception:  # jsonargparse cannot read it: the arguments it would be given by name
        return _init_names(cls)
    return sorted(key.removeprefix("init_args.") for key in known_keys(parser) if key.startswith("init_args."))


def set_by_class(class_path: str, option: str) -> str | None:
    """The base class whose __init__ argument `option` is, where the class sets it itself and takes no such argument
    (a language-modelling DataModule packs blocks and passes max_tokens=None to DataModule); else None."""
    cls = _load_class(class_path)
    if cls is None or option in class_keys(class_path):
        return None
    for klass in inspect.getmro(cls)[1:]:
        if option in _init_names(klass):
            return klass.__name__
    return None


def _negative_value(message: str, argv: Sequence[str]) -> str | None:
    """argparse takes a value that starts with '-' for a flag unless it looks like a plain negative number, so
    `--model.optim.lr -1e-3` or `--temperature -1e-3` was refused as "argument --model.optim: expected one argument",
    naming neither the key nor the value: the refusal names both and the form argparse reads."""
    found = re.search(r"argument (--[\w.\-]+): expected one argument", message)
    if found is None:
        return None
    for flag, value in zip(argv, argv[1:]):
        if flag.startswith(found.group(1)) and "=" not in flag and value.startswith("-"):
            try:
                float(value)
            except ValueError:
                continue
            return (f"{flag} {value}: a value that starts with '-' reads as another flag here; write it with '=': "
                    f"{flag}={value}")  # fmt: skip
    return None


def refusal(message: str, parser: ArgumentParser, argv: Sequence[str]) -> ConfigError:
    """A parse error of jsonargparse as a ConfigError: the key, where it came from, the nearest valid keys or the
    choices, and the help that lists the keys."""
    prog = parser.prog.replace(" [options]", "")
    help_hint = f"Run '{prog} --help' for every key."
    negative = _negative_value(message, argv)
    if negative is not None:
        return ConfigError(negative, hint=help_hint)
    nested = _NESTED.search(message)
    parser_key = _PARSER_KEY.search(message)
    if nested and parser_key:
        class_path, option = nested.groups()
        group = parser_key.group(1)
        if _is_dataclass(class_path):  # its fields sit under the group's key itself, and fit --help lists them
            return _unknown_key(f"{group}.{option}", class_keys(class_path), argv, help_hint, prefix=f"{group}.")
        key = f"{group}.init_args.{option}"
        hint = f"Run '{prog} --{group}.help {class_path}' for every {group}.init_args key."
        base = set_by_class(class_path, option)
        if base is not None:
            name = class_path.rpartition(".")[2]
            return ConfigError(
                f"{key} ({_where(key, argv)}): {name} sets {base}'s {option} itself and takes no such argument",
                hint=hint,
            )
        return _unknown_key(key, class_keys(class_path), argv, hint, prefix=f"{group}.init_args.")
    group = _GROUP.search(message)
    if group:
        return _unknown_key(".".join(group.groups()), known_keys(parser), argv, help_hint)
    for pattern in _UNKNOWN:
        found = pattern.search(message)
        if found:
            key = found.group(1).lstrip("-")
            return _unknown_key(key, known_keys(parser), argv, help_hint)
    if re.search(r"arguments are required: (?:\w+\.)?data\b", message):
        return ConfigError(
            "no data to train on: the configs given have no data section",
            hint="Start from a config that has one (--config base, --config presets/tiny) or give "
            "--data.class_path and its --data.init_args.*.",
        )
    subcommand = _SUBCOMMAND.search(message)
    if subcommand:
        names = re.findall(r"'([^']*)'", subcommand.group(3))
        near = difflib.get_close_matches(subcommand.group(2), names, n=2, cutoff=0.6)
        suggestion = (" Did you mean " + " or ".join(near) + "?") if near else ""
        return ConfigError(
            f"unknown subcommand {subcommand.group(2)!r} (one of {', '.join(names)}).{suggestion}", hint=help_hint
        )
    required = _REQUIRED.search(message)
    if required:
        flags = [f.strip() for f in required.group(1).split(",")]
        return ConfigError(f"{prog} needs {' and '.join(flags)}", hint=help_hint)
    if parser_key:
        key, inner, class_path = _innermost(message)
        if class_path:  # a class's own argument: its group's --X.help lists them
            group = key.partition(".init_args.")[0]
            help_hint = f"Run '{prog} --{group}.help {class_path}' for every {group}.init_args key."
        wrong = _wrong_value(key, inner, argv, help_hint)
        if wrong is not None:
            return wrong
    if parser_key and "File does not exist" in message:
        return ConfigError(message.split(":", 1)[1].strip(), hint=help_hint)
    lines = [line.rstrip() for line in message.strip().splitlines() if line.strip()]
    short = "\n".join(lines[:3]) + ("\n  ..." if len(lines) > 3 else "")
    return ConfigError(short, hint=help_hint)


def _innermost(message: str) -> tuple[str, str, str | None]:
    """The full key of a nested parse error (a dataclass's field under its group, "model.optim" then "lr"; a class's
    argument under its init_args, "data" then "batch_size"), the part of the message about it, and the class whose
    argument it is (None for a field of a dataclass or a plain key)."""
    parts, depth, last, class_path = [], -1, None, None
    for found in _PARSER_KEY.finditer(message):
        indent = found.start() - (message.rfind("\n", 0, found.start()) + 1)
        if indent <= depth:
            break  # an alternative beside the one followed, not inside it
        between = _CLASS_PATH.search(message, last.end(), found.start()) if last is not None else None
        if between and not _is_dataclass(between.group(1)):  # a dataclass's fields sit under its key directly
            parts.append("init_args")
            class_path = between.group(1)
        parts.append(found.group(1))
        depth, last = indent, found
    return ".".join(parts), message[last.end() :] if last is not None else message, class_path


def _is_dataclass(class_path: str) -> bool:
    import dataclasses
    import importlib

    module, _, name = class_path.rpartition(".")
    try:
        return dataclasses.is_dataclass(getattr(importlib.import_module(module), name))
    except (ImportError, AttributeError, ValueError):
        return False


def _wrong_value(key: str, message: str, argv: Sequence[str], hint: str) -> ConfigError | None:
    """A value of the wrong type or outside its choices: the key, what was given, what it takes (the choices
    listed, the nearest first), where it was given."""
    expected = _EXPECTED.search(message)
    union = _UNION.search(message)
    restricted = _RESTRICTED.search(message) or _NOT_A_NUMBER.search(message)
    if expected:
        kinds, value = [expected.group(1) or expected.group(2)], expected.group(3).strip()
    elif union:
        kinds, value = _split_types(union.group(1)), union.group(2).strip()
    elif restricted:  # a jsonargparse.typing restriction: PositiveInt, NonNegativeInt
        kinds, value = [restricted.group(1)], restricted.group(2).strip()
    else:
        return None
    choices = [c for kind in kinds for c in _literal_choices(kind)]
    takes = [_kind(k) for k in kinds if not _LITERAL.search(k)]
    if choices:
        near = difflib.get_close_matches(value, choices, n=1, cutoff=0.5)
        listed = ", ".join(choices) + ("" if not takes else " or " + " or ".join(takes))
        nearest = f" Did you mean {near[0]}?" if near else ""
        return ConfigError(f"{key}: {value!r} is not one of {listed} ({_where(key, argv)}).{nearest}", hint=hint)
    return ConfigError(f"{key}: expected {' or '.join(takes)}, got {value!r} ({_where(key, argv)})", hint=hint)


def _split_types(text: str) -> list[str]:
    """The types of a Union's subtype list, split at its top-level commas."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char in "[(" and 1 or (char in "])" and -1 or 0)
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    return [*parts, current.strip()] if current.strip() else parts


def _literal_choices(kind: str) -> list[str]:
    found = _LITERAL.search(kind)
    if not found:
        return []
    return [c.strip().strip("'\"") for c in found.group(1).split(",")]


def _kind(kind: str) -> str:
    name = re.sub(r"<class '([\w.]+)'>", r"\1", kind).rpartition(".")[2]
    return {
        "int": "an integer",
        "float": "a number",
        "bool": "true or false",
        "str": "a string",
        "NoneType": "null",
        "PositiveInt": "a positive integer",
        "NonNegativeInt": "an integer of 0 or more",
    }.get(name, name)


# What fit/validate call a checkpoint, the other commands call --checkpoint (and the reverse is a group there).
_OTHER_COMMANDS_NAME = {
    "ckpt_path": ("checkpoint",),
    "ckpt": ("ckpt_path", "checkpoint"),
    "checkpoint_path": ("ckpt_path", "checkpoint"),
}


def _unknown_key(key: str, choices: Iterable[str], argv: Sequence[str], hint: str, prefix: str = "") -> ConfigError:
    choices = list(choices)
    leaf = key[len(prefix) :] if prefix and key.startswith(prefix) else key
    near = difflib.get_close_matches(leaf, choices, n=2, cutoff=0.6)
    if not near and "." in leaf:  # a typo in the last part: compare the last parts under the same group
        group, _, last = leaf.rpartition(".")
        siblings = [c.rpartition(".")[2] for c in choices if c.rpartition(".")[0] == group]
        near = [f"{group}.{n}" for n in difflib.get_close_matches(last, siblings, n=2, cutoff=0.6)]
    meant = next((name for name in _OTHER_COMMANDS_NAME.get(leaf, ()) if name in choices), None)
    if meant and meant not in near:  # a flag of the same meaning that another command spells so
        near = [meant, *near][:2]
    suggestion = (" Did you mean " + " or ".join(prefix + n for n in near) + "?") if near else ""
    return ConfigError(f"unknown key {key} ({_where(key, argv)}).{suggestion}", hint=hint)


def given_where(keys: Sequence[str], argv: Sequence[str]) -> str | None:
    """One line saying where each key was given (the flag, or the config file that holds it), for the keys that
    were given at all (a default is given nowhere); None when none was."""
    found = []
    for key in keys:
        where = _given(key, argv)
        if where is not None:
            found.append(f"{key} by the flag" if where.startswith("--") else f"{key} in {where}")
    return "  given: " + "; ".join(found) if found else None


def given_fields(group: str, names: Iterable[str], argv: Sequence[str]) -> list[str]:
    """The fields of a dataclass group (`model.generation`) that the command line sets, by a flag or in a config file:
    jsonargparse fills the others with the dataclass's defaults, which a caller may want to tell from the given ones.
    Every name where the group is given whole by a flag (--model.generation '{...}')."""
    names = list(names)
    whole = _given(group, argv)
    if whole is not None and whole.startswith("--"):
        return names
    return [name for name in names if _given(f"{group}.{name}", argv) is not None]


def _where(key: str, argv: Sequence[str]) -> str:
    """Where a key was given: the flag on the command line, or the YAML file (and key path) that holds it."""
    where = _given(key, argv)
    if where is None or where.startswith("--"):
        return f"the flag {where}" if where else f"given as --{key}"
    return f"in {where}, key {key}"


def _given(key: str, argv: Sequence[str]) -> str | None:
    """The last place on the command line that sets `key` (the one that counts: later flags and files win): its
    flag as typed (`--key`), or the config file that holds it as a user names it (a packaged one by name); None when
    nothing does."""
    where = _last_setter(key, argv)
    return where if where is None or where.startswith("--") else _shown(where)


def _last_setter(key: str, argv: Sequence[str]) -> str | None:
    """_given's answer before it is shown: the flag as typed, or the config file's path."""
    flags = {f"--{key}", f"--{key.replace('_', '-')}"}  # a command's own flags may be spelled with dashes
    items = list(argv)
    for i in range(len(items) - 1, -1, -1):
        item = items[i]
        if item.partition("=")[0] in flags:
            return item.partition("=")[0]  # as it was typed
        name, eq, value = item.partition("=")
        path = value if eq and name in CONFIG_FLAGS else item if i > 0 and items[i - 1] in CONFIG_FLAGS else None
        path = resolve_config(path) if path else None
        if path and Path(path).is_file() and _holds(path, key):
            return path
    return None


def overridden_flags(argv: Sequence[str]) -> list[tuple[int, int, str]]:
    """(index, tokens, why) of each `--key VALUE` (or `--key=VALUE`) that a config given after it sets again: later
    arguments win (jsonargparse reads them in order), so such a flag does nothing."""
    items = list(argv)
    found = []
    for i, item in enumerate(items):
        name, eq, value = item.partition("=")
        if not name.startswith("--") or name in CONFIG_FLAGS or "." not in name:
            continue
        key = name[2:].removesuffix("+")
        setter = _last_setter(key, items[i + 1 :])
        # a value replaces the flag's; a group of keys below it may be merged with a flag's class (--data CLASS)
        if setter is not None and not setter.startswith("--") and _value_in(setter, key) is not _SUBTREE:
            shown = value if eq else (items[i + 1] if i + 1 < len(items) else "")
            found.append((i, 1 if eq else 2, f"--{key} {shown} is set again by {_shown(setter)}, given after it"))
    return found


def check_flag_order(argv: Sequence[str]) -> None:
    """Refuse a flag that a config given after it sets again: `--trainer.max_steps 3 --config presets/tiny` ran the
    preset's 20 steps without a word."""
    lost = [why for _, _, why in overridden_flags(argv)]
    if lost:
        raise ConfigError(
            "; ".join(lost)
            + f": later arguments win, so {'the flag' if len(lost) == 1 else 'these flags'} would do nothing. Put "
            "flags after the configs they change (--config FILE ... --KEY VALUE)"
        )


def help_by_import_path(argv: Sequence[str]) -> list[str]:
    """`--data.help LanguageModelingDataModule` and `--model.task.help translation` with the import path jsonargparse
    needs ("Expected a dot import path string"): a DataModule goes by its class name and a task by its short name or
    class name everywhere else (`--data LanguageModelingDataModule`, `model.task: translation`)."""
    from lit_transformer import data
    from lit_transformer.tasks import TASKS

    known = {name: f"lit_transformer.data.{name}" for name in data.DATA_MODULES}
    known |= {key: f"{cls.__module__}.{cls.__name__}" for name, cls in TASKS.items() for key in (name, cls.__name__)}
    out, items = [], list(argv)
    for i, item in enumerate(items):
        flag, eq, value = item.partition("=")
        before = items[i - 1] if i else ""
        if eq and flag in ("--data.help", "--model.task.help") and value in known:
            item = f"{flag}={known[value]}"
        elif before in ("--data.help", "--model.task.help") and item in known:
            item = known[item]
        out.append(item)
    return out


def check_group_files(argv: Sequence[str], keys: Iterable[str]) -> None:
    """Refuse a binary file given to a group's flag (`--checkpoint run/last.ckpt`, `--data shards.bin`): jsonargparse
    reads a group's value as a YAML file of its settings and its UnicodeDecodeError was a traceback. `--checkpoint`
    is the checkpoint callback's settings on the Lightning commands, and the path to a .ckpt on the others, so a
    checkpoint given to it names `--ckpt_path`. `keys`: the parser's (known_keys); a group is a key with keys below."""
    groups = {key.partition(".")[0] for key in keys if "." in key}
    items = list(argv)
    for i, item in enumerate(items):
        name, eq, value = item.partition("=")
        if not eq:
            value = items[i + 1] if i + 1 < len(items) else ""
        if name[2:] not in groups or not name.startswith("--") or not value:
            continue
        path = Path(value)
        if not path.is_file():
            continue
        with path.open("rb") as handle:
            head = handle.read(1 << 16)
        try:
            head.decode("utf-8")
        except UnicodeDecodeError as error:
            if error.start >= len(head) - 4:  # a character cut at the end of the sample
                continue
            group = name[2:]
            checkpoint = path.suffix == ".ckpt" or head.startswith(b"PK")  # torch.save writes a zip
            fix = (
                f"a checkpoint to resume from or evaluate goes to --ckpt_path {value}"
                if checkpoint
                else f"give a YAML file of {group}'s settings, or its keys as --{group}.KEY flags"
            )
            raise ConfigError(
                f"{name} {value} is not UTF-8 text (byte {error.start}): {name} takes the {group} group's "
                f"settings as YAML; {fix}"
            ) from None


def check_one_data_class(argv: Sequence[str]) -> None:
    """Refuse configs that name two DataModules (`--config presets/tiny --config presets/tiny-translate`): a later
    config wins per key, and jsonargparse carries the earlier DataModule's settings that the later class also takes
    over to it (tiny's batch_size 8 became the translation run's cap on pairs a batch), so the run was neither
    preset, without a word; in the other order the refusal came from a key that happened to disagree."""
    named = []
    items = list(argv)
    for i, item in enumerate(items):
        flag, eq, value = item.partition("=")
        path = value if eq and flag in CONFIG_FLAGS else item if i and items[i - 1] in CONFIG_FLAGS else None
        if path is None or _inline(path):
            continue
        class_path = _value_in(path, "data.class_path")
        if isinstance(class_path, str) and class_path.rpartition(".")[2] not in [c for _, c in named]:
            named.append((_shown(path), class_path.rpartition(".")[2]))
    if len(named) > 1:
        (first, one), (second, other) = named[:2]
        raise ConfigError(
            f"{first} names the DataModule {one} and {second} {other}: configs of two tasks mix (the later one wins "
            "per key, and the earlier DataModule's settings the later one also takes carry over to it): give the "
            "configs of one task (a preset, then variants and trainer configs, which name no DataModule)"
        )


def check_data_flags_after_its_class(argv: Sequence[str]) -> None:
    """Refuse a --data.* flag given before the argument that names the DataModule (a config's data.class_path, or
    --data CLASS): jsonargparse judged it against LightningDataModule, which takes no such key, and the refusal
    named the config's key as unknown. For a parse that failed: said in place of that refusal."""
    items = list(argv)
    for i, item in enumerate(items):
        name, eq, value = item.partition("=")
        if name in ("--data", "--data.class_path"):
            where = name
        else:
            path = value if name in CONFIG_FLAGS else item if i and items[i - 1] in CONFIG_FLAGS else None
            if not path or _given("data.class_path", [CONFIG_FLAGS[0], path]) is None:
                continue
            where = _shown(resolve_config(path))
        early = [a.partition("=")[0] for a in items[:i] if a.startswith("--data.") and not a.startswith("--data.help")]
        if early:
            raise ConfigError(
                f"{early[0]} comes before {where}, which names the DataModule (data.class_path): its keys are known "
                "only once its class is. Put --data.* flags after the configs and --data CLASS (--config FILE ... "
                "--KEY VALUE)"
            )
        return


def without_overridden(argv: Sequence[str]) -> list[str]:
    """argv without the flags a later config sets again: the same run, for argv a program composes in layers (an
    ablation grid's overrides, then a cell's variant config that changes one of them)."""
    dropped = {i + k for i, n, _ in overridden_flags(argv) for k in range(n)}
    return [item for i, item in enumerate(argv) if i not in dropped]


_NOT_SET, _SUBTREE = object(), object()


def _value_at(tree: Any, parts: list[str]) -> Any:
    """The value a YAML tree holds at a key path (nested or dotted): _SUBTREE for a mapping, _NOT_SET for none."""
    if not isinstance(tree, dict):
        return _NOT_SET
    if not parts:
        return _SUBTREE
    for i in range(1, len(parts) + 1):
        head = ".".join(parts[:i])
        if head in tree:
            if i == len(parts):
                return _SUBTREE if isinstance(tree[head], dict) else tree[head]
            found = _value_at(tree[head], parts[i:])
            if found is not _NOT_SET:
                return found
    return _NOT_SET


def _shown(path: str) -> str:
    """A config file as a user names it: a packaged one by its name (presets/tiny.yaml), another as given."""
    try:
        return f"{Path(path).resolve().relative_to(packaged_configs().resolve())} (packaged)"
    except ValueError:
        return path


def _holds(path: str, key: str) -> bool:
    return _value_in(path, key) is not _NOT_SET


def _value_in(path: str, key: str) -> Any:
    """What the config file at `path` holds at `key` (_value_at's answer), its top level or under a subcommand's name
    (fit: {model: ...}); _NOT_SET where neither holds it."""
    for node in _config_nodes(path):
        found = _value_at(node, key.split("."))
        if found is not _NOT_SET:
            return found
    return _NOT_SET


def _config_nodes(path: str) -> tuple[Any, ...]:
    """A config file's YAML and its subcommand sections, read once while the file is unchanged (every flag asks of
    every later config); () for a file that is not YAML, which is refused where it is parsed."""
    try:
        stat = os.stat(path)
    except OSError:
        return ()
    return _read_nodes(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=64)
def _read_nodes(path: str, mtime_ns: int, size: int) -> tuple[Any, ...]:
    import yaml

    try:
        tree = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return ()
    nested = [tree.get(c) for c in ("fit", "validate", "test", "predict")] if isinstance(tree, dict) else []
    return (tree, *nested)
