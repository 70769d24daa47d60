"""What counts as a user's mistake: the errors the command line answers in a few lines, without a traceback.

The rule is a type, not a list: every check of a user's input (config values and their combinations, data files,
checkpoints, prompts, command options) raises a `UserError` where it finds the mistake, with a message that names
the file or key, what was found and the fix. The program (cli/program.py) prints a `UserError` in a few lines and
exits with its `status`; any other exception is a bug and keeps its traceback. Errors of other libraries about a
user's values (jsonargparse's parse errors, Lightning's MisconfigurationException about trainer options) become
UserErrors where the package calls those libraries.

Two kinds, one exit status each (docs/cli.md says the same):
- `ConfigError`, exit 2: the command line or a config is wrong (an unknown key or command, a wrong type, a value
  outside its range or choices, two keys that disagree, an option this machine cannot honour);
- `FileError`, exit 1: a file the command names cannot be used (missing, empty, malformed, binary, truncated, of
  another task or architecture) or cannot be written (a full disk).

The package's own error types subclass one of them, and also the builtin type they once were (`ValueError`,
`FileNotFoundError`), so that `except ValueError` around the Python API keeps working. This module imports nothing.
"""

from __future__ import annotations

from collections.abc import Sequence


class UserError(Exception):
    """A mistake in what the user gave: the message names the problem and where; `hint` says the fix. `keys` are the
    config keys (dotted, as a flag spells them) the mistake is about: the command line adds where each was given."""

    status = 2

    def __init__(self, message: str, hint: str | None = None, *, keys: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.hint = hint
        self.keys = tuple(keys)


class ConfigError(UserError, ValueError):
    """The command line or a config is wrong: a key that does not exist, a value of the wrong type, out of range or
    outside its choices, two keys that disagree, an option this machine cannot honour. Exit status 2."""

    status = 2


class FileError(UserError):
    """A file the command names cannot be used (missing, empty, malformed, of another kind) or written. Exit status 1."""

    status = 1


class BadFileError(FileError, ValueError):
    """A file that exists but cannot be used: empty, malformed, binary, truncated, of another kind, task or
    architecture (a ValueError too, for the Python API's callers)."""


class MissingFileError(FileError, FileNotFoundError):
    """A file or folder the user named does not exist (a FileNotFoundError too, for the Python API's callers)."""


class WriteError(FileError, OSError):
    """A file could not be written (a full disk, a file-size limit, no permission): the message names the path and
    what is still good."""


def make_folder(path, what: str, keys: Sequence[str] = (), file=None) -> None:
    """Make the folder `path` and its parents, for what the flag or key `what` names (`file`: the file the user gave,
    which goes in that folder): a folder that cannot be made (a file in the way, no permission) is the WriteError
    naming the flag, not an OSError's traceback."""
    import os

    try:
        os.makedirs(path, exist_ok=True)
    except OSError as error:
        where = f"{what} {path}: the folder" if file is None else f"{what} {file}: its folder {path}"
        raise WriteError(
            f"{where} cannot be made ({error.strerror or error}): give a path in a folder you can write", keys=keys
        ) from error


def check_folder_can_be_made(path, what: str, keys: Sequence[str] = ()) -> None:
    """Refuse, before any work and without making it, a folder that cannot be made: a file at or above `path`, or
    a nearest existing folder that is not writable (the WriteError naming the flag or key `what`)."""
    import os

    above = os.path.abspath(os.path.expanduser(path))
    while not os.path.exists(above) and os.path.dirname(above) != above:
        above = os.path.dirname(above)
    if os.path.exists(above) and not os.path.isdir(above):
        where = (
            "is a file" if above == os.path.abspath(os.path.expanduser(path)) else f"cannot be made, {above} is a file"
        )
        raise WriteError(f"{what} {path}: the folder {where}: give a folder's path (a new one is made)", keys=keys)
    if os.path.isdir(above) and not os.access(above, os.W_OK | os.X_OK):
        raise WriteError(
            f"{what} {path}: the folder cannot be made, {above} is not writable: give a folder you can write",
            keys=keys,
        )


def user_error(error: BaseException) -> UserError | None:
    """The UserError an exception is, or was raised from (a library that wraps what it called, as jsonargparse wraps
    a class's refusal of its arguments, passes the user's mistake on as the `__cause__`); None for a bug."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, UserError):
            return error
        seen.add(id(error))
        error = error.__cause__
    return None


def exit_status(error: BaseException) -> int | None:
    """The exit status of a user's mistake, or None for a bug (which keeps its traceback)."""
    found = user_error(error)
    return found.status if found is not None else None
