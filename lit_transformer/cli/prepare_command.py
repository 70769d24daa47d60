"""`python -m lit_transformer prepare --config X.yaml`: prepare a run's data once, before training.

It reads only the `data` section of the configs (later files and `--data.*` flags win, as with `fit`), builds that
DataModule and runs its `prepare()` (for the language-model DataModule: stream the corpus, train the tokenizer on a
bounded sample, write the token shards; for the translation DataModule the same with sentence pairs: source and
target ids and per-pair offsets). `fit` with the same configs then finds the shards in the cache and starts at once;
every rank and node of a multi-process run reads the same shards.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence

import yaml


def _merge(base: dict, update: dict) -> dict:
    out = dict(base)
    for key, value in update.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _data_section(configs: Sequence[str]) -> dict:
    data: dict = {}
    for path in configs:
        with open(path, encoding="utf-8") as handle:
            loaded = yaml.safe_load(handle) or {}
        if not isinstance(loaded, dict):
            raise SystemExit(f"{path} is not a YAML mapping")
        section = loaded.get("data")
        if section is None:
            continue
        if (
            isinstance(section, dict)
            and "class_path" in section
            and data.get("class_path")
            not in (
                None,
                section["class_path"],
            )
        ):
            data = {}  # another DataModule: its init_args replace the former's
        data = _merge(data, section)
    if not data:
        raise SystemExit(f"No `data:` section in {', '.join(configs)}: prepare needs the DataModule to prepare")
    return data


def prepare_main(argv: Sequence[str]) -> None:
    from lit_transformer.cli.arguments import parse, parser_options, resolve_configs
    from lit_transformer.cli.program import program

    parser = argparse.ArgumentParser(
        prog=program("prepare"),
        allow_abbrev=False,
        description="Prepare a run's data once (stream, tokenize in parallel, write token shards); "
        "`fit` with the same configs then starts at once.",
        epilog="Any --data.* flag of `fit` applies too, e.g. --data.init_args.dataset 'corpus/*.jsonl' "
        "--data.init_args.cache_dir /shared/cache.",
    )
    parser.add_argument("--config", action="append", required=True, help="a run's YAML (repeatable, later wins)")
    args, overrides = parser.parse_known_args(resolve_configs(argv))
    bad = [o for o in overrides if o.startswith("--") and not o.startswith("--data.")]
    if bad:
        raise SystemExit(f"prepare takes --config and --data.* flags only, not {bad[0]}")

    import jsonargparse
    import lightning as L

    data = _data_section(args.config)
    config_parser = jsonargparse.ArgumentParser(**parser_options(program("prepare")))
    config_parser.add_subclass_arguments(L.LightningDataModule, "data", required=True)
    cfg = parse(config_parser, ["--data", yaml.safe_dump(data), *overrides])
    datamodule = config_parser.instantiate_classes(cfg).data

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("lit_transformer").setLevel(logging.INFO)
    started = time.perf_counter()
    prepare = getattr(datamodule, "prepare", None) or datamodule.prepare_data
    try:
        where = prepare()
    except (ValueError, OSError) as error:  # bad input: the message says what is wrong and what to do
        raise SystemExit(f"prepare: {error}") from None
    took = time.perf_counter() - started
    print(f"prepared {type(datamodule).__name__} in {took:.1f} s" + (f": {where}" if where else ""))
