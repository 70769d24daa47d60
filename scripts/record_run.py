"""Run one command of the CLI exactly as a user would, and record what it measured into a JSON file.

A figure published in README.md or docs/ must come from a committed JSON written by the command printed beside it
(tests/test_figures.py checks the prose against it). `fit` and `test` print their metrics and write them to
TensorBoard, neither of which can be committed and checked; this script runs the same command in-process and keeps
the trainer's final metrics, the wall time, the thread count and the host's load under a name in the JSON file:

    python scripts/record_run.py --json docs/translation_cpu.json --name fit -- \
        fit --config configs/presets/translate-en-es.yaml
    python scripts/record_run.py --json docs/translation_cpu.json --name test -- \
        test --config configs/presets/translate-en-es.yaml --ckpt_path runs/en-es/checkpoints/last.ckpt

Entries under other names are kept, so one file can hold a run's `fit` and each of its `test`s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import torch

from lit_transformer.cli import run_cli, show_package_info_logs


def _number(value: object) -> float | None:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    if isinstance(value, (int, float)):
        return float(value)
    return None


def record(json_path: Path, name: str, cli_args: list[str]) -> dict:
    """Run `python -m lit_transformer CLI_ARGS` in this process; write its metrics to json_path under `name`."""
    show_package_info_logs()
    load_start = os.getloadavg()
    start = time.perf_counter()
    command = "python " + shlex.join(sys.argv)
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
        "threads": torch.get_num_threads(),
        "load_average_start": load_start,
        "load_average_end": os.getloadavg(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    recorded = json.loads(json_path.read_text()) if json_path.exists() else {}
    recorded[name] = entry
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(recorded, indent=1) + "\n")
    return entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, required=True, help="the JSON file to write (kept entries are merged)")
    parser.add_argument("--name", required=True, help="the entry's name in that file, e.g. fit or test")
    parser.add_argument("cli_args", nargs=argparse.REMAINDER, help="after --: the CLI's arguments, fit/test/...")
    args = parser.parse_args()
    cli_args = args.cli_args[1:] if args.cli_args[:1] == ["--"] else args.cli_args
    if not cli_args or cli_args[0] not in ("fit", "validate", "test"):
        parser.error("give the CLI command after --, starting with fit, validate or test")
    entry = record(args.json, args.name, cli_args)
    print(json.dumps({args.name: entry["metrics"], "wall_s": entry["wall_s"]}, indent=1))


if __name__ == "__main__":
    main()
