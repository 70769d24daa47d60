"""jsonargparse, made fast where LightningCLI makes it slow: indexed action lookups, and a parsed config validated once.

Measured with py-spy on tiny fits and predicts in one process (tests/test_own_data.py's cells, an AMD EPYC): training
was a fifth of a command's time, LightningCLI's parsing, building and dumping the rest; a quarter of it went to
jsonargparse finding actions, a fifth to validating the parsed config again each time it was dumped.
- jsonargparse finds the action of a key (`find_action_and_subcommand`, `is_branch_key`) by walking the parser's whole
  action list in Python, for every key of every parse, validation and dump (189 options for `fit`).
  `index_action_lookups` replaces both by lookups in an index of each parser's actions, rebuilt whenever the list
  changed (compared element by element, in C), with the same answers (tests/test_fast_parsing.py compares them for
  every lookup of real commands).
- LightningCLI dumps the parsed config twice after parsing it (the model's hyperparameters, config.yaml), and each
  dump validates the whole config again. `ValidatedOnceParser` (public API: Lightning's `parser_class`,
  jsonargparse's `skip_validation`) skips that validation for a config the CLI parsed (and so validated) and then
  adjusted itself (the run folder, the context-length link): what the user wrote is checked once, at the parse,
  where its errors are reported.

- jsonargparse's Namespace parses each key it is given (`fit.model.config.n_heads`: split at its dots, each part
  checked and marked where it clashes with a Namespace method) at every get, set and `in`, millions of times a
  command, for a few hundred distinct keys. `split_keys_once` keeps each key's parts (`_parse_key` walks the
  namespace with them as before; a key jsonargparse refuses is refused by jsonargparse's own code, each time).

The index relies on jsonargparse's private names (`PRIVATE`); on a jsonargparse release other than those in
`CHECKED_VERSIONS` the lookups are left as they are (slower, never wrong) and tests/test_fast_parsing.py fails, to be
read again and the version added.
"""

from __future__ import annotations

import sys
from typing import Any

import jsonargparse
from jsonargparse import _actions, _namespace, _subcommands
from lightning.pytorch.cli import LightningArgumentParser

CHECKED_VERSIONS = ("4.53",)
"""jsonargparse releases (major.minor) whose private lookups below were read and compared."""

PRIVATE: dict[str, tuple[str, ...]] = {
    "jsonargparse._subcommands:find_action_and_subcommand": ("parser", "dest", "exclude"),
    "jsonargparse._subcommands:is_branch_key": ("parser", "key"),
    "jsonargparse._subcommands:split_key_root": ("key",),
    "jsonargparse._subcommands:ActionSubCommands": (),
    "jsonargparse._actions:non_parsing_actions": (),
    "jsonargparse._actions:_ActionConfigLoad": (),
    "jsonargparse._actions:ActionFail": (),
    "jsonargparse._namespace:Namespace._parse_key": ("self", "key"),
    "jsonargparse._namespace:add_clash_mark": ("key",),
    "jsonargparse._namespace:split_key": ("key",),
}
"""Each private name relied on ("module:name") and, for a function, its parameters in order."""

ORIGINAL = {"find_action_and_subcommand": None, "is_branch_key": None, "_parse_key": None}
"""jsonargparse's own functions, kept (tests compare the indexed ones to them)."""


def version_checked(version: str = jsonargparse.__version__) -> bool:
    return ".".join(version.split(".")[:2]) in CHECKED_VERSIONS


class _Index:
    """One parser's parsing actions (without `exclude`'s), by the keys that find them."""

    __slots__ = ("actions", "branches", "fallback", "first", "subcommands")

    def __init__(self, actions: list, exclude: Any) -> None:
        self.actions = list(actions)  # the list indexed: compared with the parser's at each lookup
        self.first: dict[str, Any] = {}  # key -> the first action found by it that is not a fallback
        self.fallback: dict[str, Any] = {}  # key -> the last config-load or fail action found by it
        self.branches: dict[str, int] = {}  # dotted prefix of a dest -> position of the first action under it
        self.subcommands: list[tuple[int, Any]] = []  # (position, subcommands action), in order
        fallbacks = (_actions._ActionConfigLoad, _actions.ActionFail)
        parsing = [a for a in actions if not isinstance(a, _actions.non_parsing_actions)]
        if exclude is not None:
            parsing = [a for a in parsing if not isinstance(a, exclude)]
        for position, action in enumerate(parsing):
            if isinstance(action, _subcommands.ActionSubCommands):
                self.subcommands.append((position, action))
            keys = [action.dest] + [s[2:] for s in action.option_strings if s.startswith("--")]
            for key in keys:
                if isinstance(action, fallbacks):
                    self.fallback[key] = action
                else:
                    self.first.setdefault(key, action)
            dest = action.dest
            if isinstance(dest, str):
                dot = dest.find(".")
                while dot != -1:
                    self.branches.setdefault(dest[:dot], position)
                    dot = dest.find(".", dot + 1)


def _index(parser: Any, exclude: Any) -> _Index:
    actions = parser._actions
    cache = parser.__dict__.get("_lit_action_index")
    if cache is None:
        cache = parser.__dict__["_lit_action_index"] = {}
    index = cache.get(exclude)
    if index is None or index.actions != actions:  # list equality compares identities first: a C loop
        index = cache[exclude] = _Index(actions, exclude)
    return index


def find_action_and_subcommand(parser: Any, dest: str, exclude: Any = None) -> tuple[Any, str | None]:
    """jsonargparse's `find_action_and_subcommand`, answered from the parser's index."""
    index = _index(parser, exclude)
    if index.subcommands:
        root_dest = _subcommands.split_key_root(dest)[0]
        for _, action in index.subcommands:  # subcommand names take precedence over option strings
            if dest in action._name_parser_map:
                return action, None
            if root_dest in action._name_parser_map:
                subcommand, subdest = _subcommands.split_key_root(dest)
                subparser = action._name_parser_map[subcommand]
                subaction, subsubcommand = find_action_and_subcommand(subparser, subdest, exclude=exclude)
                if subsubcommand is not None:
                    subcommand += "." + subsubcommand
                return subaction, subcommand
    action = index.first.get(dest)
    return (action if action is not None else index.fallback.get(dest)), None


def is_branch_key(parser: Any, key: str) -> bool:
    """jsonargparse's `is_branch_key`: whether `key` is a subcommand's branch or a dotted prefix of a dest, decided
    by the first action (in the parser's order) that is either, as jsonargparse walks them."""
    index = _index(parser, None)
    branch = index.branches.get(key)
    if index.subcommands:
        root_key = _subcommands.split_key_root(key)[0]
        for position, action in index.subcommands:
            if branch is not None and position > branch:
                break
            if root_key in action._name_parser_map:
                return is_branch_key(action._name_parser_map[root_key], _subcommands.split_key_root(key)[1])
    return branch is not None


def index_action_lookups() -> bool:
    """Put the indexed lookups in place of jsonargparse's, in every jsonargparse module that holds them; once.
    Returns whether they are in place (not on an unchecked jsonargparse release)."""
    if ORIGINAL["find_action_and_subcommand"] is not None:
        return True
    if not version_checked():
        return False
    replacements = []
    for name, indexed in (("find_action_and_subcommand", find_action_and_subcommand), ("is_branch_key", is_branch_key)):
        ORIGINAL[name] = getattr(_subcommands, name)
        replacements.append((ORIGINAL[name], indexed))
    for module_name, module in list(sys.modules.items()):
        if module_name == "jsonargparse" or module_name.startswith("jsonargparse."):
            for attribute, value in list(vars(module).items()):
                for original, indexed in replacements:  # by identity: a module may hold unhashable callables
                    if value is original:
                        setattr(module, attribute, indexed)
    return True


_KEY_PARTS: dict[str, tuple[tuple[str, ...], str]] = {}
"""A valid key -> (its parts, clash-marked, and the parent key they make), as Namespace._parse_key computes them."""


def parse_key(self: Any, key: str) -> tuple[str, Any, str]:
    """jsonargparse's `Namespace._parse_key`, with each key split and checked once per process (the walk through
    the namespace is its own, step for step). A key that is not a plain str, or that it refuses, goes to it."""
    found = _KEY_PARTS.get(key) if type(key) is str else None
    if found is None:
        if type(key) is not str or " " in key or "" in _namespace.split_key(key):
            return ORIGINAL["_parse_key"](self, key)  # its own refusal (or a str subclass, as it handles one)
        parts = tuple(_namespace.add_clash_mark(k) for k in _namespace.split_key(key))
        found = (parts, ".".join(parts[:-1]))
        if len(_KEY_PARTS) < 100_000:  # keys are a parser's, a few hundred; a bound all the same
            _KEY_PARTS[key] = found
    parts, parent_key = found
    leaf_key = parts[-1]
    parent_ns = self
    if len(parts) > 1:
        for subkey in parts[:-1]:
            if hasattr(parent_ns, subkey) or (isinstance(parent_ns, dict) and subkey in parent_ns):
                parent_ns = parent_ns[subkey]
                if parent_ns is not None and not isinstance(parent_ns, _namespace.Namespace | dict):
                    return leaf_key, None, parent_key
            else:
                return leaf_key, None, parent_key
        return leaf_key, parent_ns, parent_key
    return leaf_key, parent_ns, ""


def split_keys_once() -> bool:
    """Put `parse_key` in place of Namespace._parse_key; once. Whether it is in place (a checked release)."""
    if ORIGINAL["_parse_key"] is not None:
        return True
    if not version_checked():
        return False
    ORIGINAL["_parse_key"] = _namespace.Namespace._parse_key
    _namespace.Namespace._parse_key = parse_key
    return True


class ValidatedOnceParser(LightningArgumentParser):
    """LightningArgumentParser that dumps and saves a config it was told is valid (`trust`) without validating it
    again; any other config, or a call that says `skip_validation`, is handled as jsonargparse does."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from lit_transformer.cli.invocation import name_the_program

        super().__init__(*args, **name_the_program(args, kwargs))

    def trust(self, *namespaces: Any) -> None:
        """Dumps of these very objects (the CLI's parsed config and its subcommand's part) skip validation."""
        trusted = self.__dict__.setdefault("_lit_trusted", [])  # the objects, kept: their ids stay theirs
        trusted.extend(n for n in namespaces if n is not None and not any(n is t for t in trusted))

    def _trusted(self, namespace: Any, kwargs: dict) -> bool:
        given = "skip_validation" in kwargs or "skip_check" in kwargs
        return not given and any(namespace is t for t in self.__dict__.get("_lit_trusted", ()))

    def dump(self, namespace: Any, *args: Any, **kwargs: Any) -> str:
        if len(args) <= 2 and self._trusted(namespace, kwargs):  # (format, skip_unset) at most: no skip_validation
            kwargs["skip_validation"] = True
        printing = self.__dict__.pop("_lit_before_print", None)  # set by the CLI for --print_config
        if printing is not None:
            namespace = printing(namespace.clone())
        return super().dump(namespace, *args, **kwargs)

    def save(self, namespace: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) <= 3 and self._trusted(namespace, kwargs):  # (path, format, skip_unset) at most: as above
            kwargs["skip_validation"] = True
        return super().save(namespace, *args, **kwargs)
