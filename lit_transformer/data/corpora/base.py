"""What the embedded corpora share: the error of one that is not installed."""


class CorpusNotInstalledError(FileNotFoundError):
    """An embedded corpus whose package is missing; the message gives the one command that installs it."""
