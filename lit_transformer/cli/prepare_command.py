"""`python -m lit_transformer prepare --config X.yaml`: prepare a run's data once, before training.

It reads only the `data` section of the configs (later files and `--data.*` flags win, as with `fit`), builds that
DataModule and runs its `prepare()` (for the language-model DataModule: stream the corpus, train the tokenizer on a
bounded sample, write the token shards; for the translation DataModule the same with sentence pairs: source and
target ids and per-pair offsets). `fit` with the same configs then finds the shards in the cache and starts at once;
every rank and node of a multi-process run reads the same shards.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence

from lit_transformer.errors import ConfigError

EPILOG = (
    "Any --data.* key of `fit` applies too, e.g. --data.init_args.dataset 'corpus/*.jsonl' --data.init_args.cache_dir "
    "/shared/cache. A DataModule's keys: --data.help CLASS_PATH, e.g. --data.help "
    "lit_transformer.data.LanguageModelingDataModule (or TranslationDataModule, ClassificationDataModule, "
    "CaptioningDataModule)."
)


def _merge(base: dict, update: dict) -> dict:
    out = dict(base)
    for key, value in update.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _data_section(configs: Sequence[str]) -> dict:
    from lit_transformer.cli.arguments import read_config

    data: dict = {}
    for path in configs:
        section = read_config(path).get("data")
        if section is None:
            continue
        other = isinstance(section, dict) and data.get("class_path") not in (None, section.get("class_path", None))
        if other and "class_path" in section:
            data = {}  # another DataModule: its init_args replace the former's
        data = _merge(data, section)
    if not data:
        raise ConfigError(
            f"no `data:` section in {', '.join(configs)}: prepare needs the DataModule to prepare",
            hint="Give a config that has one, e.g. --config base or --config presets/tiny.",
        )
    return data


DESCRIPTION = (
    "Prepare a run's data once (stream, tokenize in parallel, write token shards); `fit` with the same configs then "
    "starts at once."
)


def _parser():
    """The strict parser of every command: --config (only its data section is read) and the DataModule's keys."""
    import lightning as L

    from lit_transformer.cli.arguments import command_parser

    parser = command_parser("prepare", DESCRIPTION, EPILOG)
    parser.add_argument(
        "--config", "-c", action="append", help="a run's YAML, or a packaged config by name (repeatable, later wins)"
    )
    parser.add_subclass_arguments(L.LightningDataModule, "data", required=False)
    return parser


def _split_configs(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the --config values, in order; the other arguments): the configs give the data section the rest overrides."""
    from lit_transformer.cli.arguments import CONFIG_FLAGS

    configs, rest, items = [], [], iter(argv)
    for item in items:
        flag, eq, inline = item.partition("=")
        if eq and flag in CONFIG_FLAGS:
            configs.append(inline)
        elif item in CONFIG_FLAGS:
            configs.extend(v for v in [next(items, None)] if v is not None)
        else:
            rest.append(item)
    return configs, rest


def prepare_main(argv: Sequence[str]) -> None:
    from lit_transformer.cli.arguments import check_flag_order, help_by_import_path, parse, resolve_configs
    from lit_transformer.cli.invocation import program

    argv = help_by_import_path(argv)
    parser = _parser()
    if any(a in ("-h", "--help") or a == "--data.help" or a.startswith("--data.help=") for a in argv):
        parser.parse_args(argv)  # prints the help (of the command, or of a DataModule's keys) and exits
        return
    check_flag_order(resolve_configs(argv))  # as fit judges it: prepare must prepare the data fit would read
    configs, overrides = _split_configs(resolve_configs(argv))
    if not configs:
        raise ConfigError(
            "prepare needs --config FILE_OR_NAME (a run's YAML)", hint=f"Run '{program('prepare')} --help'."
        )
    bad = [o for o in overrides if o.startswith("-") and not o.startswith("--data.")]
    if bad:
        raise ConfigError(
            f"prepare takes --config and --data.* keys only, not {bad[0]}",
            hint=f"Run '{program('prepare')} --help'.",
        )

    data = _data_section(configs)
    import yaml

    cfg = parse(parser, ["--data", yaml.safe_dump(data), *overrides])
    datamodule = parser.instantiate_classes(cfg).data

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("lit_transformer").setLevel(logging.INFO)
    started = time.perf_counter()
    prepare = getattr(datamodule, "prepare", None) or datamodule.prepare_data
    where = prepare()  # a mistake in the data is a UserError: the program prints it in a few lines
    took = time.perf_counter() - started
    print(f"prepared {type(datamodule).__name__} in {took:.1f} s" + (f": {where}" if where else ""))
