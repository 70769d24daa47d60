"""Run one command of the CLI exactly as a user would, and record what it measured into a JSON file.

A figure published in README.md or docs/ must come from a committed JSON written by the command printed beside it
(tests/test_figures.py checks the prose against it). `fit` and `test` print their metrics and write them to
TensorBoard, neither of which can be committed and checked; this script runs the same command in-process and keeps
the trainer's final metrics, the wall time, the thread count and the host's load under a name in the JSON file:

    python -m lit_transformer bench record --json docs/translation_cpu.json --name fit -- \
        fit --config configs/presets/translate-en-es.yaml
    python -m lit_transformer bench record --json docs/translation_cpu.json --name test -- \
        test --config configs/presets/translate-en-es.yaml --ckpt_path runs/en-es/checkpoints/last.ckpt

Entries under other names are kept, so one file can hold a run's `fit` and each of its `test`s.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

from lit_transformer.bench import command_parser
from lit_transformer.records import command_line, machine


def _number(value: object) -> float | None:
    if hasattr(value, "numel") and value.numel() == 1:  # a one-element tensor
        return value.item()
    if isinstance(value, (int, float)):
        return float(value)
    return None


def record(json_path: Path, name: str, cli_args: list[str], command: str) -> dict:
    """Run `python -m lit_transformer CLI_ARGS` in this process; write its metrics to json_path under `name`."""
    import torch

    from lit_transformer.cli.lightning_cli import run_cli, show_package_info_logs

    show_package_info_logs()
    facts = machine(threads=torch.get_num_threads())
    start = time.perf_counter()
    sys.argv = [sys.argv[0], *cli_args]  # as `python -m lit_transformer CLI_ARGS` sees them (no `args=` warning)
    cli = run_cli()
    seconds = time.perf_counter() - start
    metrics = {key: _number(value) for key, value in cli.trainer.callback_metrics.items()}
    entry = {
        "command": command,  # this script's own command line, as the docs print it
        "cli": "python -m lit_transformer " + shlex.join(cli_args),
        "metrics": {key: value for key, value in sorted(metrics.items()) if value is not None},
        "global_step": cli.trainer.global_step,
        "wall_s": seconds,
        "threads": facts["threads"],  # also in the machine; the pages quote it from here
        "date": facts["date"],
        "load_average_end": list(os.getloadavg()),
        "machine": facts,
    }
    recorded = json.loads(json_path.read_text()) if json_path.exists() else {}
    recorded[name] = entry
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(recorded, indent=1) + "\n")
    return entry


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = command_parser("bench record", __doc__)
    parser.add_argument("--json", type=Path, required=True, help="the JSON file to write (kept entries are merged)")
    parser.add_argument("--name", required=True, help="the entry's name in that file, e.g. fit or test")
    parser.add_argument("cli_args", nargs=argparse.REMAINDER, help="after --: the CLI's arguments, fit/test/...")
    args = parser.parse_args(argv)
    cli_args = args.cli_args[1:] if args.cli_args[:1] == ["--"] else args.cli_args
    if not cli_args or cli_args[0] not in ("fit", "validate", "test"):
        parser.error("give the CLI command after --, starting with fit, validate or test")
    entry = record(args.json, args.name, cli_args, command_line("record", argv))
    print(json.dumps({args.name: entry["metrics"], "wall_s": entry["wall_s"]}, indent=1))
