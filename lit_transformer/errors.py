"""What counts as a user's mistake: the errors the command line answers in a few lines, without a traceback.

A bug keeps its traceback. A mistake (a config typo, a missing file, a malformed data file, a checkpoint that is not
one) is either a `UserError` raised by the package, or one of the library's own error types that already carry a
message naming the problem and the fix (`user_error_types`). This module imports nothing heavy.
"""

from __future__ import annotations

import sys


class UserError(Exception):
    """A mistake in what the user gave: the message names the problem and where; `hint` says the fix."""

    status = 2

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class ConfigError(UserError, ValueError):
    """A config that cannot be: two keys that disagree, a value out of range, a key that does not exist."""


def user_error_types() -> tuple[type[BaseException], ...]:
    """The error types of loaded modules whose messages are written for users. Only modules already imported are
    asked: a command that never loaded the data code does not import it to learn its error type."""
    types: list[type[BaseException]] = [FileNotFoundError]
    for module, name in (
        ("lit_transformer.checkpoints.files", "CheckpointError"),
        ("lit_transformer.data.sources", "DataFileError"),
        ("lit_transformer.data.sources", "OfflineError"),
        ("lit_transformer.data.cache", "UnguardedMainError"),
        ("lit_transformer.engine.devices", "DeviceOptionError"),
        ("lit_transformer.engine.nonfinite_guard", "NonFiniteLossError"),
        ("lit_transformer.transforms.int8", "QuantizationError"),
        ("jsonargparse", "ArgumentError"),
    ):
        found = getattr(sys.modules.get(module), name, None)
        if isinstance(found, type) and issubclass(found, BaseException):
            types.append(found)
    return tuple(types)
