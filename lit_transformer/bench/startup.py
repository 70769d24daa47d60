"""Start-up of the command line: each command's wall time and peak RSS as a whole process, beside the yardsticks
`python -c "import torch"` and `python -c "import lightning"` measured in the same run, interleaved, medians of
several rounds, from an empty folder. A timed test would be flaky; this is the figure docs/troubleshooting.md quotes.

    python -m lit_transformer bench startup --checkpoint runs/shakespeare/checkpoints/last.ckpt --json docs/startup.json

Targets (ratios to `import torch`): top-level --help and --version under 1x; generate --help and export --help at
most 1.2x; generating 20 tokens from the main job's checkpoint at most 1.5x.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from jsonargparse.typing import PositiveInt

from lit_transformer.bench.checks import runs_file
from lit_transformer.cli.arguments import command_parser, parse
from lit_transformer.errors import MissingFileError
from lit_transformer.records import child_env, command_line, machine, run_child, write_run

YARDSTICKS = {
    "import torch": ["-c", "import torch"],
    "import lightning": ["-c", "import lightning"],
}
# Targets of the front door, as ratios to `import torch` (None: no target, measured for the record).
TARGETS = {
    "--help": 1.0,
    "--version": 1.0,
    "generate --help": 1.2,
    "export --help": 1.2,
    "generate 20 tokens": 1.5,
}


def commands(checkpoint: str | None) -> dict[str, list[str]]:
    run = ["-m", "lit_transformer"]
    out = {
        "--help": [*run, "--help"],
        "--version": [*run, "--version"],
        "generate --help": [*run, "generate", "--help"],
        "translate --help": [*run, "translate", "--help"],
        "export --help": [*run, "export", "--help"],
        "average --help": [*run, "average", "--help"],
        "fit --help": [*run, "fit", "--help"],
    }
    if checkpoint:
        out["generate 20 tokens"] = [
            *run,
            "generate",
            "--checkpoint",
            checkpoint,
            "--prompt",
            "ROMEO:",
            "--max_new_tokens",
            "20",
            "--seed",
            "1",
        ]
    return out


def measure(argv: Sequence[str], cwd: str) -> tuple[float, float]:
    """(wall seconds, peak RSS in MB) of one process, not sampled (a sampler would share the cores it is timed on)."""
    env = child_env(OMP_NUM_THREADS="1")
    done = run_child([sys.executable, *argv], cwd=cwd, env=env, interval=None, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed with status {done.returncode}")
    return done.wall_s, done.peak_rss_mb * 1e3 / 1024  # MiB, as this benchmark has always reported


def run(checkpoint: str | None, rounds: int) -> dict:
    every = {**YARDSTICKS, **commands(str(Path(checkpoint).resolve()) if checkpoint else None)}
    walls: dict[str, list[float]] = {name: [] for name in every}
    rss: dict[str, list[float]] = {name: [] for name in every}
    with tempfile.TemporaryDirectory() as empty:  # an empty folder, as a new user's
        for argv in every.values():  # one warm-up each: the page cache, as on a second run
            measure(argv, empty)
        for _ in range(rounds):
            for name, argv in every.items():  # interleaved: a change of load hits every command alike
                wall, peak = measure(argv, empty)
                walls[name].append(wall)
                rss[name].append(peak)
    torch_s = statistics.median(walls["import torch"])
    rows = {}
    for name in every:
        median = statistics.median(walls[name])
        rows[name] = {
            "wall_s": round(median, 3),
            "wall_min_s": round(min(walls[name]), 3),
            "wall_max_s": round(max(walls[name]), 3),
            "peak_rss_mb": round(statistics.median(rss[name]), 1),
            "x_import_torch": round(median / torch_s, 2),
            "target_x_import_torch": TARGETS.get(name),
            "met": None if name not in TARGETS else median / torch_s <= TARGETS[name],
        }
    return {"rounds": rounds, "commands": {name: " ".join(argv) for name, argv in every.items()}, "results": rows}


def main(argv: Sequence[str]) -> None:
    parser = command_parser("bench startup", __doc__)
    parser.add_argument(
        "--checkpoint", type=str | None, default=None, help="a checkpoint of the main job, for `generate 20 tokens`"
    )
    parser.add_argument("--rounds", type=PositiveInt, default=5, help="measured rounds (after one warm-up)")
    parser.add_argument("--json", type=Path | None, default=None, help="add this run to the runs of this file")
    args = parse(parser, argv)
    runs_file(args.json)
    if args.checkpoint and not Path(args.checkpoint).is_file():  # else `generate` fails after every warm-up
        raise MissingFileError(f"--checkpoint {args.checkpoint}: no such file (the README's first command writes one)")
    facts = machine(threads=1)
    figures = run(args.checkpoint, args.rounds)
    command = command_line("bench startup", argv)
    print(json.dumps({"command": command, "machine": facts, **figures}, indent=2))
    if args.json:
        write_run(args.json, figures, command=command, machine=facts)
