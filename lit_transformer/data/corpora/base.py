"""What the embedded corpora share: the error of one that is not installed."""

from lit_transformer.errors import MissingFileError


class CorpusNotInstalledError(MissingFileError):
    """An embedded corpus whose package is missing; the message gives the one command that installs it."""
