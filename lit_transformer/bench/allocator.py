"""glibc's malloc as the training commands set it (freed memory kept for reuse, lit_transformer/engine/host_allocator.py)
against glibc's own settings (`LIT_TRANSFORMER_MALLOC=glibc`): the same `fit`, whole, as a child process.

    python -m lit_transformer bench allocator --json docs/allocator.json

Each run is `python -m lit_transformer fit` of a shipped config for a fixed number of steps, with no validation, no
sanity check and no checkpoint, in a folder of its own; one untimed run of each config prepares its data first. The
two settings alternate, the first of each round in turn. Reported per config and setting: the medians of wall
seconds (start-up and data loading included), user + system CPU seconds, system seconds, minor page faults and peak
RSS; and the medians of the paired per-round ratios (glibc's wall over reuse's: above 1, reuse is faster; reuse's
peak RSS over glibc's).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from jsonargparse.typing import PositiveInt

from lit_transformer.bench.checks import runs_file
from lit_transformer.cli.arguments import command_parser, parse
from lit_transformer.errors import UserError
from lit_transformer.records import ChildRun, child_env, command_line, machine, run_child, write_run

SETTINGS = ("reuse", "glibc")

QUIET = [
    "--trainer.val_check_interval=1000000",
    "--trainer.limit_val_batches=0",
    "--trainer.num_sanity_val_steps=0",
    "--checkpoint.save_last=false",
    "--checkpoint.every_n_train_steps=0",
    "--trainer.enable_progress_bar=false",
]

# label -> (fit's config arguments, timed steps)
RUNS: dict[str, tuple[list[str], int]] = {
    "main-job": (["--config=configs/base.yaml"], 160),
    "translate-en-es": (["--config=configs/presets/translate-en-es.yaml"], 40),
}


def refuse_a_users_allocator() -> None:
    """The comparison needs glibc and neither setting pinned by the user's environment."""
    from lit_transformer.engine.host_allocator import MALLOC_ENV, left_alone

    reason = left_alone({k: v for k, v in os.environ.items() if k != MALLOC_ENV})  # each run sets it itself
    if reason is not None:
        raise UserError(
            f"bench allocator compares glibc's malloc settings, but here {reason}",
            hint="Run it on Linux with glibc, without MALLOC_*_ variables, GLIBC_TUNABLES for malloc or LD_PRELOAD.",
        )


def fit(config: list[str], steps: int, setting: str, folder: Path) -> ChildRun:
    argv = [sys.executable, "-m", "lit_transformer", "fit", *config, f"--trainer.max_steps={steps}", *QUIET,
            f"--trainer.default_root_dir={folder}"]  # fmt: skip
    with open(folder / f"{setting}.log", "w") as log:
        done = run_child(argv, cwd=folder, env=child_env(LIT_TRANSFORMER_MALLOC=setting), interval=None, stdout=log,
                         stderr=subprocess.STDOUT)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed with status {done.returncode}: see {folder / setting}.log")
    return done


def run(labels: Sequence[str], rounds: int) -> dict:
    rows = {}
    with tempfile.TemporaryDirectory() as root:
        for label in labels:
            config, steps = RUNS[label]
            folder = Path(root) / label
            folder.mkdir()
            fit(config, 2, "reuse", folder)  # prepares the data and the tokenizer: no timed run pays for it
            measured: dict[str, list[ChildRun]] = {s: [] for s in SETTINGS}
            for round_ in range(rounds):
                for setting in SETTINGS if round_ % 2 == 0 else SETTINGS[::-1]:
                    measured[setting].append(fit(config, steps, setting, folder))
            row: dict[str, object] = {"fit": " ".join(["fit", *config, f"--trainer.max_steps={steps}", *QUIET])}
            for setting, runs in measured.items():
                row[setting] = {
                    "wall_s": round(statistics.median(r.wall_s for r in runs), 2),
                    "cpu_s": round(statistics.median(r.cpu_s for r in runs), 2),
                    "system_s": round(statistics.median(r.system_s for r in runs), 2),
                    "minor_faults": int(statistics.median(r.minor_faults for r in runs)),
                    "peak_rss_mb": round(statistics.median(r.peak_rss_mb for r in runs), 1),
                    "walls_s": [round(r.wall_s, 2) for r in runs],
                }
            pairs = list(zip(measured["reuse"], measured["glibc"], strict=True))
            row["wall_ratio_glibc_over_reuse"] = round(statistics.median(g.wall_s / r.wall_s for r, g in pairs), 3)
            row["peak_rss_ratio_reuse_over_glibc"] = round(
                statistics.median(r.peak_rss_mb / g.peak_rss_mb for r, g in pairs), 3
            )
            rows[label] = row
    return {"rounds": rounds, "steps": {label: RUNS[label][1] for label in labels}, "results": rows}


def main(argv: Sequence[str]) -> None:
    parser = command_parser("bench allocator", __doc__)
    parser.add_argument(
        "--only", type=Literal["main-job", "translate-en-es"], nargs="+", metavar="CONFIG", default=None,
        help="some of the configs (default: both)",
    )  # fmt: skip
    parser.add_argument("--rounds", type=PositiveInt, default=3, help="rounds of both settings per config")
    parser.add_argument("--json", type=Path | None, default=None, help="add this run to the runs of this file")
    args = parse(parser, argv)
    runs_file(args.json)
    refuse_a_users_allocator()
    facts = machine()
    figures = run(args.only or list(RUNS), args.rounds)
    command = command_line("bench allocator", argv)
    print(json.dumps({"command": command, "machine": facts, **figures}, indent=2))
    if args.json:
        write_run(args.json, figures, command=command, machine=facts)
