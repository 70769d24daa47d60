"""How the user called the program: its name as typed (`python -m lit_transformer` or `lit-transformer`), for the
usage lines and the refusals of every command. Imports nothing, so both the entry point and the parsers use it."""

from __future__ import annotations

import os
import sys

_program: str | None = None


def program(command: str | None = None) -> str:
    """The program's name as the user typed it, with the command."""
    name = _program or typed_program()
    return f"{name} {command}" if command else name


def remember_program() -> None:
    """Fix the name at the start of a command (a library may rewrite sys.argv later)."""
    global _program
    _program = _program or typed_program()


def typed_program() -> str:
    argv0 = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if argv0 in ("__main__.py", "-c", "") or argv0.startswith("pytest") or argv0.endswith(".py"):
        return "python -m lit_transformer"
    return argv0


def name_the_program(args: tuple, kwargs: dict) -> dict:
    """A parser's keyword arguments with its `prog` where none is given: jsonargparse builds the parser that
    --data.help CLASS prints as `type(parser)(description=...)`, which argparse named after sys.argv[0] ("usage:
    __main__.py"). The program as typed, with the command this process runs."""
    if args or "prog" in kwargs:
        return kwargs
    typed = sys.argv[1] if len(sys.argv) > 1 else ""
    command = typed if typed.replace("-", "").isalpha() and typed.islower() else None  # a command's name, not a flag
    return {**kwargs, "prog": program(command)}
