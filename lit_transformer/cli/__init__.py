"""The command line: the program and its commands (program.py), one strict parser for all (arguments.py),
fit/validate/test/predict on LightningCLI (lightning_cli.py), generate/translate/export/average (model_commands.py),
prepare, and what the console shows.

Nothing is imported here: `--help` stays instant. `lit_transformer.cli.run_cli` and the other names of the former
`lit_transformer/cli.py` resolve lazily from lightning_cli.py.
"""


def __getattr__(name: str):
    if name.startswith("__") or name == "lightning_cli":
        raise AttributeError(name)
    import importlib

    try:
        return getattr(importlib.import_module("lit_transformer.cli.lightning_cli"), name)
    except AttributeError:
        raise AttributeError(f"module 'lit_transformer.cli' has no attribute {name!r}") from None
