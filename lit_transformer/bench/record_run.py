"""Run one command of the CLI exactly as a user would, and record what it measured into a JSON file.

A figure published in README.md or docs/ must come from a committed JSON written by the command printed beside it
(tests/test_figures.py checks the prose against it). `fit` and `test` print their metrics and write them to
TensorBoard, neither of which can be committed and checked; this script runs the same command in-process and keeps
the trainer's final metrics, the wall time, the thread count and the host's load under a name in the JSON file:

    python -m lit_transformer bench record --json docs/translation_cpu.json --name fit -- \
        fit --config configs/presets/translate-en-es.yaml
    python -m lit_transformer bench record --json docs/translation_cpu.json --name test -- \
        test --config configs/presets/translate-en-es.yaml --ckpt_path runs/en-es/checkpoints/last.ckpt

One file holds named records, so a run's `fit` and each of its `test`s sit side by side; a rerun under the same name
is one more run of that record (lit_transformer.records.write_run), the pages quoting its newest.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path

from lit_transformer.bench.checks import runs_file
from lit_transformer.cli.arguments import command_parser, parse, resolve_configs, split_passed_on
from lit_transformer.errors import UserError
from lit_transformer.records import command_line, machine, write_run


def _number(value: object) -> float | None:
    if hasattr(value, "numel") and value.numel() == 1:  # a one-element tensor
        return value.item()
    if isinstance(value, (int, float)):
        return float(value)
    return None


def record(json_path: Path, name: str, cli_args: list[str], command: str) -> dict:
    """Run `python -m lit_transformer CLI_ARGS` in this process; add its metrics to json_path's record `name`. Each
    --config is found as the command line finds it (a file, or a packaged config by name: `--config presets/tiny`);
    the record keeps it as typed."""
    resolved = resolve_configs(cli_args)  # a config found nowhere is refused here, before torch is imported
    import torch

    from lit_transformer.cli.lightning_cli import run_cli, show_package_info_logs
    from lit_transformer.engine.host_allocator import keep_freed_memory

    keep_freed_memory()  # as the command sets it
    show_package_info_logs()
    facts = machine(threads=torch.get_num_threads())
    start = time.perf_counter()
    sys.argv = [sys.argv[0], *resolved]  # as `python -m lit_transformer CLI_ARGS` sees them (no `args=` warning)
    cli = run_cli()
    seconds = time.perf_counter() - start
    metrics = {key: _number(value) for key, value in cli.trainer.callback_metrics.items()}
    figures = {
        "cli": "python -m lit_transformer " + shlex.join(cli_args),
        "metrics": {key: value for key, value in sorted(metrics.items()) if value is not None},
        "global_step": cli.trainer.global_step,
        "wall_s": seconds,
        "threads": facts["threads"],  # also in the machine; the pages quote it from here
        "load_average_end": list(os.getloadavg()),
    }
    return write_run(json_path, figures, command=command, machine=facts, name=name)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, cli_args = split_passed_on(argv)
    parser = command_parser("bench record", __doc__)
    parser.add_argument("--json", type=Path, required=True, help="the JSON file its record is added to")
    parser.add_argument("--name", type=str, required=True, help="the record's name in that file, e.g. fit or test")
    args = parse(parser, own)
    if not cli_args or cli_args[0] not in ("fit", "validate", "test"):
        raise UserError(
            "bench record runs a command of the CLI: give it after --, starting with fit, validate or test",
            hint="For example: bench record --json runs/x.json --name fit -- fit --config presets/tiny",
        )
    runs_file(args.json, name=args.name)
    run = record(args.json, args.name, cli_args, command_line("bench record", argv))
    print(json.dumps({args.name: run["metrics"], "wall_s": run["wall_s"]}, indent=1))
