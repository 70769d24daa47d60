"""Paper-style ablations: run a grid of `fit` overrides over seeds, then tabulate and plot the validation curves.

Each cell x seed is an ordinary `python -m lit_transformer fit` in its own run folder (fixed checkpoint dirpath and
TensorBoard version), so a run is exactly what a user would type, a finished run is skipped (marker file) and an
interrupted one resumes from its last checkpoint. Results are read back from the TensorBoard event files.

    python -m lit_transformer ablate configs/ablations/heads.yaml --jobs 2     # run (or resume), then report
    python -m lit_transformer ablate configs/ablations/*.yaml --dry-run        # print the commands only
    python -m lit_transformer ablate configs/ablations/heads.yaml --report-only # table and plots from what has run
    python -m lit_transformer ablate configs/ablations/frontier.yaml --time-steps 200   # each cell's step time

A grid file (YAML):

    description: what the grid shows
    base: [configs/presets/translate-en-es.yaml, configs/ablations/base/en-es-cpu.yaml]   # --config, in order
    overrides: {trainer.max_steps: 600}          # flags common to every cell (mapping, or a list of "--flag value")
    seeds: [1, 2]
    seed_flags: [seed_everything, data.init_args.seed]   # flags that receive the seed
    test: true                                   # then `test` from the best checkpoint: BLEU on the test split
    evaluate: [128, 256, 512, 1024]              # then `validate` from last.ckpt at each context length (LM data)
    cells:                                       # name -> flags (mapping, or a list of "--flag value" strings)
      heads-1: {model.config.n_heads: 1}
      pre-ln: ["--config configs/variants/pre_ln.yaml"]

Outputs, in --out (default runs/ablations/<grid name>): <cell>/seed-<n>/ run folders, results.md (mean ± sample
standard deviation over seeds), results.json (every run's numbers) and one PNG per curve (mean over seeds, band
from min to max); with `evaluate`, a second table and eval_bpc.png: validation bits per character against the
context length each checkpoint was scored at. A model that refuses a length (learned positions past max_seq_len)
is reported as "cannot extrapolate".

Equal time: `--time-steps N` trains nothing to the end: it times N optimizer steps (after a few untimed ones) of the
grid's base config alone and of each cell (its first seed), one process after another with the grid's threads, and
prints each cell's seconds per step, its ratio to the base's, and the steps that fit the base's own budget (the
trainer.max_steps of the base configs, not the grid's overrides, at the base's step time; rounded down to a hundred,
under a hundred to a step) as the flags to put in the cell; step_times.json in --out records them with the machine.
With --dry-run it prints the timing commands. Time on the machine and threads that will run the grid, with nothing
else on it.

Refused before anything runs or is written: a --cells name no grid holds, cells whose names make one folder (or
none: `..`), a seed listed twice or none, two grids that would share a folder, an --out that is a file, and
--time-steps with --report-only.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from jsonargparse.typing import PositiveInt

from lit_transformer.cli.arguments import (
    command_parser,
    existing_config,
    parse,
    resolve_config,
    split_passed_on,
    without_overridden,
)
from lit_transformer.errors import ConfigError
from lit_transformer.records import machine, read_runs, write_run

LOGGER = "lightning.pytorch.loggers.TensorBoardLogger"
# What a model that cannot take a longer context says (positions.LearnedPositions): recorded as such, not a failure.
REFUSED = "cannot extrapolate"
# What fit says when a signal stopped it after saving last.ckpt (engine/preemption.py), exiting with status 0.
STOPPED = (128 + signal.SIGINT, 128 + signal.SIGTERM)
PREEMPTED = re.compile(r"Received (SIG[A-Z]+): saved .* at step \d+; exiting\.")
EVAL_FLAG = "data.init_args.block_size"
CURVES = ("val/loss", "val/ppl", "val/bleu", "train/loss")
# (column title, run folder's TensorBoard version, tag, digits)
COLUMNS = (
    ("val loss", "fit", "val/loss", 3),
    ("val ppl", "fit", "val/ppl", 2),
    ("val bpc", "fit", "val/bpc", 3),  # language modelling: bits per character, the main job's figure
    ("val BLEU", "fit", "val/bleu", 2),
    ("test ppl", "test", "test/ppl", 2),
    ("test BLEU", "test", "test/bleu", 2),
)


# ---- the grid -----------------------------------------------------------------------------------------------------


def to_flags(spec: dict[str, Any] | list[str] | None) -> list[str]:
    """A mapping {dotted.key: value} or a list of "--flag value" strings, as argv for LightningCLI."""
    if not spec:
        return []
    if isinstance(spec, dict):
        flags: list[str] = []
        for key, value in spec.items():
            for item in value if isinstance(value, list) and key == "config" else [value]:
                flags += [f"--{key.removeprefix('--')}", _cli_value(item)]
        return _resolve_configs(flags)
    return _resolve_configs([token for item in spec for token in shlex.split(str(item))])


def _resolve_configs(flags: list[str]) -> list[str]:
    return [resolve_config(t) if i and flags[i - 1] == "--config" else t for i, t in enumerate(flags)]


def _cli_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def _resolve(path: str) -> str:
    """A config as `fit` finds it: a file, else a packaged config by name (configs/ablations/base/x.yaml, or
    ablations/base/x), from any working folder."""
    from lit_transformer.cli.arguments import existing_config

    return existing_config(str(path), given_as="grid")


# What ablate itself writes in a grid's folder: a cell's run folder of that name would stand in the way.
OWN_FILES = frozenset(
    {"timing", "results.md", "results.json", "step_times.json", "eval_bpc.png"}
    | {f"{tag.replace('/', '_')}.png" for tag in CURVES}
)


def folder_name(cell: str) -> str:
    """A cell's folder under the grid's: letters, digits and . + - kept, the rest one `_` (none at either end)."""
    return re.sub(r"[^\w.+-]+", "_", cell).strip("_")


def check_cell_folders(path: Path, cells: Iterable[str]) -> None:
    """Each cell its own safe folder: two names that sanitize to one folder would share their runs (a finished one
    skipped as the other's), and `..` would put them outside the grid's folder."""
    seen: dict[str, str] = {}
    for cell in cells:
        folder = folder_name(cell)
        if set(folder) <= {"."} or folder in OWN_FILES:
            raise ConfigError(
                f"{path}: cell {cell!r} makes no folder of its own ({folder!r}"
                + (", a file ablate writes beside the cells" if folder in OWN_FILES else "")
                + "): give it a name with a letter or digit"
            )
        other = seen.setdefault(folder.casefold(), cell)
        if other != cell:
            shared = folder_name(other)
            where = (
                f"the folder {folder}/"
                if shared == folder
                else f"{shared}/ and {folder}/, one folder where file names ignore case"
            )
            raise ConfigError(
                f"{path}: cells {other!r} and {cell!r} would run in {where} (a cell's folder keeps letters, digits "
                "and . + -, the rest becomes _), so one cell's runs would stand for the other's: rename one"
            )


def check_seeds(seeds: list[int], where: str) -> None:
    """At least one seed, each once: a seed given twice would run twice in one folder."""
    if not seeds:
        raise ConfigError(f"{where} is empty: give at least one seed (seeds: [1]), or leave the key out for seed 1")
    twice = sorted({s for s in seeds if seeds.count(s) > 1})
    if twice:
        raise ConfigError(f"{where} lists seed {twice[0]} twice: its runs would share seed-{twice[0]}/; give it once")


def _seeds(path: Path, value: Any) -> list[int]:
    values = value if isinstance(value, list) else [] if value is None else [value]
    wrong = [v for v in values if not isinstance(v, int) or isinstance(v, bool)]
    if wrong:
        raise ConfigError(f"{path}: seeds: {wrong[0]!r} is not an integer: give a list of them (seeds: [1, 2])")
    check_seeds(values, f"{path}: seeds")
    return values


@dataclass
class Grid:
    """One ablation: base configs, common overrides, named cells of overrides, seeds."""

    name: str
    path: Path
    cells: dict[str, list[str]]
    base: list[str] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=lambda: [1])
    seed_flags: list[str] = field(default_factory=lambda: ["seed_everything"])
    test: bool = False
    description: str = ""
    evaluate: list[int] = field(default_factory=list)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Grid:
        path = Path(path)
        raw = yaml.safe_load(path.read_text()) or {}
        if not isinstance(raw, dict) or not raw.get("cells"):
            raise ConfigError(f"{path} is not an ablation grid: it needs a non-empty `cells:` mapping")
        unknown = set(raw) - {
            "name", "description", "base", "overrides", "cells", "seeds", "seed_flags", "test", "evaluate"
        }  # fmt: skip
        if unknown:
            raise ConfigError(f"{path}: unknown keys {sorted(unknown)}")
        base = raw.get("base") or []
        grid_name = str(raw.get("name") or path.stem)
        if set(grid_name) <= {"."} or "/" in grid_name or "\\" in grid_name:
            raise ConfigError(
                f"{path}: name {grid_name!r} is no folder name (the grid's runs go in it): name it plainly"
            )
        check_cell_folders(path, map(str, raw["cells"]))
        return cls(
            name=grid_name,
            path=path,
            cells={str(name): to_flags(spec) for name, spec in raw["cells"].items()},
            base=[
                existing_config(str(p), given_as=f"{path}: base") for p in ([base] if isinstance(base, str) else base)
            ],
            overrides=to_flags(raw.get("overrides")),
            seeds=_seeds(path, raw.get("seeds", [1])),
            seed_flags=[f.removeprefix("--") for f in raw.get("seed_flags", ["seed_everything"])],
            test=bool(raw.get("test", False)),
            description=str(raw.get("description", "")).strip(),
            evaluate=[int(n) for n in raw.get("evaluate") or []],
        )

    def runs(self, out: Path, extra: list[str]) -> list[Run]:
        return [
            Run(self, cell, seed, out / folder_name(cell) / f"seed-{seed}", extra)
            for cell in self.cells
            for seed in self.seeds
        ]


# ---- one run: a cell with a seed ------------------------------------------------------------------------------------


@dataclass
class Run:
    grid: Grid
    cell: str
    seed: int
    folder: Path
    extra: list[str]

    @property
    def label(self) -> str:
        return f"{self.grid.name}/{self.cell}/seed-{self.seed}"

    @property
    def last_checkpoint(self) -> Path:
        return self.folder / "checkpoints" / "last.ckpt"

    def done(self, stage: str) -> bool:
        return (self.folder / f"{stage}.done").exists()

    def stages(self) -> list[str]:
        wanted = ["fit", *(["test"] if self.grid.test else []), *(f"eval-{n}" for n in self.grid.evaluate)]
        return [s for s in wanted if not self.done(s)]

    def _common(self, stage: str) -> list[str]:
        configs = [token for path in self.grid.base for token in ("--config", path)]
        seed = [token for flag in self.grid.seed_flags for token in (f"--{flag}", str(self.seed))]
        logger = {"class_path": LOGGER, "init_args": {"save_dir": str(self.folder), "name": "tb", "version": stage}}
        return without_overridden(
            [
                *configs,
                *self.grid.overrides,
                *self.grid.cells[self.cell],
                *self.extra,
                *seed,
                "--trainer.default_root_dir",
                str(self.folder),
                "--trainer.logger",
                json.dumps(logger),
                "--checkpoint.dirpath",
                str(self.folder / "checkpoints"),
            ]
        )  # a cell's config that changes an override wins, as it always did: the dead flag is left out (fit refuses it)

    def command(self, stage: str) -> list[str]:
        """The `fit` (resuming from last.ckpt when there is one), `test` (from the best checkpoint) or `eval-N`
        (`validate` from last.ckpt with the data in blocks of N tokens: the trained model scored at context N)."""
        if stage.startswith("eval-"):
            return [
                *[sys.executable, "-m", "lit_transformer", "validate", *self._common(stage)],
                *["--ckpt_path", str(self.last_checkpoint), f"--{EVAL_FLAG}", stage.removeprefix("eval-")],
            ]
        argv = [sys.executable, "-m", "lit_transformer", stage, *self._common(stage)]
        if stage == "fit" and self.last_checkpoint.exists():
            argv += ["--ckpt_path", str(self.last_checkpoint)]
        if stage == "test":
            argv += ["--ckpt_path", str(self.best_checkpoint())]
        return argv

    def best_checkpoint(self) -> Path:
        """The top-1 monitored checkpoint (its name carries the validation NLL), else last.ckpt."""
        candidates = [p for p in (self.folder / "checkpoints").glob("*.ckpt") if not p.name.startswith("last")]

        def loss_in_name(path: Path) -> float:
            _, _, tail = path.stem.partition("val_nll")
            try:
                return float(tail.split("-")[0])
            except ValueError:
                return math.inf

        return (
            min(candidates, key=lambda p: (loss_in_name(p), -p.stat().st_mtime)) if candidates else self.last_checkpoint
        )

    def execute(self, stage: str, env: dict[str, str]) -> int:
        """Run one stage, appending its log and wall time; a success leaves the stage's marker file."""
        self.folder.mkdir(parents=True, exist_ok=True)
        argv = self.command(stage)
        facts = machine(threads=int(env.get("OMP_NUM_THREADS", 0)) or None)
        start = time.monotonic()
        with open(self.folder / f"{stage}.log", "a") as log:
            log.write(f"$ {shlex.join(argv)}\n")
            log.flush()
            begin = log.tell()
            code = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
        wall = time.monotonic() - start
        if code == 0:
            # fit saves last.ckpt and exits 0 on SIGINT/SIGTERM (PreemptionCheckpoint): Ctrl-C, or a preemption, is
            # not the end of training; the next invocation resumes it rather than tabulating the stopped run
            with open(self.folder / f"{stage}.log", "rb") as log:
                log.seek(begin)
                stopped = PREEMPTED.search(log.read().decode(errors="replace"))
            if stopped:
                code = 128 + getattr(signal, stopped[1], signal.SIGINT)
        write_run(self.folder / "timings.jsonl", {"stage": stage, "wall_s": round(wall, 2), "returncode": code},
                  command=shlex.join(argv), machine=facts)  # fmt: skip
        refused = code != 0 and stage.startswith("eval-") and REFUSED in (self.folder / f"{stage}.log").read_text()
        if code == 0 or refused:
            marker = {"wall_s": round(wall, 2)} | ({"refused": True} if refused else {})
            (self.folder / f"{stage}.done").write_text(json.dumps(marker) + "\n")
            if stage == "fit":  # a new fit makes earlier scores stale
                for stale in self.folder.glob("*.done"):
                    if stale.name != "fit.done":
                        stale.unlink()
        return 0 if refused else code

    def refused(self, stage: str) -> bool:
        return self.done(stage) and bool(json.loads((self.folder / f"{stage}.done").read_text()).get("refused"))

    def timings(self, stage: str = "fit") -> list[dict[str, Any]]:
        """Each attempt at a stage, oldest first, as timings.jsonl recorded it (its wall time, machine, command)."""
        return [r for r in read_runs(self.folder / "timings.jsonl") if r.get("stage") == stage]

    def machine(self, stage: str = "fit") -> dict[str, Any] | None:
        """The machine the stage last ran on, None for runs from before timings.jsonl recorded it."""
        return next((r["machine"] for r in reversed(self.timings(stage)) if "machine" in r), None)

    def command_of(self, stage: str = "fit") -> str | None:
        """The command line the stage last ran (older records kept it in the machine)."""
        last = self.timings(stage)[-1:] or [{}]
        return last[0].get("command") or (last[0].get("machine") or {}).get("command")

    def wall_seconds(self, stage: str = "fit") -> float | None:
        """Wall time of a stage, summed over attempts (an interrupted run counts what it spent)."""
        return sum(r["wall_s"] for r in self.timings(stage)) or None


# ---- running ------------------------------------------------------------------------------------------------------


def thread_env(jobs: int, threads: int | None) -> dict[str, str]:
    """Split the cores across parallel jobs: oversubscribed torch threads are far slower than fewer threads."""
    per_job = str(threads or max(1, (os.cpu_count() or 1) // jobs))
    return {**os.environ, "OMP_NUM_THREADS": per_job, "MKL_NUM_THREADS": per_job, "PYTHONUNBUFFERED": "1"}


def run_all(runs: list[Run], jobs: int, env: dict[str, str]) -> list[str]:
    """Run every unfinished stage, `jobs` runs at a time; returns the labels of the runs that failed."""
    pending = [r for r in runs if r.stages()]
    print(f"{len(runs) - len(pending)} of {len(runs)} runs already finished; running {len(pending)}", flush=True)
    failed: list[str] = []
    lock = threading.Lock()
    interrupted = threading.Event()

    def work(run: Run) -> None:
        for stage in run.stages():
            if interrupted.is_set():  # Ctrl-C: the pool's running runs end; none starts its next stage
                return
            resumed = " (resuming)" if stage == "fit" and run.last_checkpoint.exists() else ""
            with lock:
                print(f"start {run.label} {stage}{resumed}", flush=True)
            code = run.execute(stage, env)
            with lock:
                status = "ok" if code == 0 else f"FAILED (exit {code}, see {run.folder / (stage + '.log')})"
                if code in STOPPED and run.last_checkpoint.exists():
                    status = f"stopped by a signal (exit {code}; the same command again resumes it from last.ckpt)"
                print(f"{status}: {run.label} {stage}", flush=True)
            if code != 0:
                failed.append(run.label)
                return

    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        for future in as_completed([pool.submit(work, run) for run in pending]):
            future.result()
    except KeyboardInterrupt:
        interrupted.set()
        pool.shutdown(wait=False, cancel_futures=True)
        print("interrupted: run the same command again to resume", file=sys.stderr)
        raise SystemExit(130) from None
    pool.shutdown()
    return failed


# ---- reading results back -----------------------------------------------------------------------------------------


def read_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag in a TensorBoard folder as sorted (step, value); a step logged twice (resume) keeps the last."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not folder.is_dir():
        return {}
    accumulator = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    accumulator.Reload()
    curves = {}
    for tag in accumulator.Tags()["scalars"]:
        by_step = {event.step: event.value for event in accumulator.Scalars(tag)}
        curves[tag] = sorted(by_step.items())
    return curves


def run_results(run: Run) -> dict[str, Any]:
    scalars = {stage: read_scalars(run.folder / "tb" / stage) for stage in ("fit", "test")}
    row: dict[str, Any] = {
        "cell": run.cell,
        "seed": run.seed,
        "wall_s": run.wall_seconds("fit"),
        "machine": run.machine(),
        # "cli", not "command": docs/figures.yaml reads items with a command and a machine as reruns of one
        # measurement (the newest wins), and a row is one seed of a cell beside the others
        "cli": run.command_of(),
    }
    for _, stage, tag, _ in COLUMNS:
        curve = scalars[stage].get(tag)
        row[tag] = curve[-1][1] if curve else None
    row["curves"] = {tag: scalars["fit"][tag] for tag in CURVES if tag in scalars["fit"]}
    row["eval"] = {}
    for n in run.grid.evaluate:
        stage = f"eval-{n}"
        curve = read_scalars(run.folder / "tb" / stage).get("val/bpc")
        row["eval"][str(n)] = REFUSED if run.refused(stage) else (curve[-1][1] if curve else None)
    return row


def summarize(values: Iterable[float | None], digits: int) -> str:
    """mean ± sample standard deviation over the finite values; diverged (non-finite) seeds are counted."""
    present = [v for v in values if v is not None]
    finite = [v for v in present if math.isfinite(v)]
    if not present:
        return "–"
    text = "diverged" if not finite else f"{statistics.fmean(finite):.{digits}f}"
    if len(finite) > 1:
        text += f" ± {statistics.stdev(finite):.{digits}f}"
    if len(finite) < len(present):
        text += f" ({len(present) - len(finite)}/{len(present)} diverged)" if finite else ""
    return text


def machine_line(machine: dict[str, Any]) -> str:
    """A run's machine as the table names it: the CPU's model string, its logical cores, its GPUs."""
    gpus = f"{machine.get('gpu_count') or 1} x {machine['gpu']}" if machine.get("gpu") else "no GPU"
    return f"{machine.get('cpu') or 'unknown CPU'}, {machine.get('logical_cores')} logical cores, {gpus}"


def markdown_table(grid: Grid, rows: list[dict[str, Any]]) -> str:
    columns = [c for c in COLUMNS if any(r[c[2]] is not None for r in rows)]
    header = ["cell", "seeds", *(c[0] for c in columns), "fit wall (min)", "overrides"]
    lines = [f"## {grid.name}", ""]
    if grid.description:
        lines += [grid.description, ""]
    common = shlex.join([t for p in grid.base for t in ("--config", p)] + grid.overrides)
    lines += [f"Base: `{common}`", ""]
    machines = sorted({machine_line(r["machine"]) for r in rows if r.get("machine")})
    if machines:  # a page names its machine: wall times compare only on one
        lines += [f"Machine{'s' if len(machines) > 1 else ''}: {'; '.join(machines)}", ""]
    lines += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for cell, flags in grid.cells.items():
        mine = [r for r in rows if r["cell"] == cell]
        seeds = [r for r in mine if r["val/loss"] is not None]
        walls = [r["wall_s"] / 60 if r["wall_s"] else None for r in mine]
        cells = [summarize((r[tag] for r in mine), digits) for _, _, tag, digits in columns]
        lines.append(
            "| "
            + " | ".join(
                [cell, str(len(seeds)), *cells, summarize(walls, 1), f"`{shlex.join(flags)}`" if flags else ""]
            )
            + " |"
        )
    if grid.evaluate:
        lines += ["", f"Validation bits per character by evaluation context (`validate --{EVAL_FLAG} N`):", ""]
        header = ["cell", *(f"N={n}" for n in grid.evaluate)]
        lines += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        for cell in grid.cells:
            mine = [r for r in rows if r["cell"] == cell]
            cells = []
            for n in grid.evaluate:
                values = [r["eval"].get(str(n)) for r in mine]
                cells.append(REFUSED if REFUSED in values else summarize(values, 3))
            lines.append("| " + " | ".join([cell, *cells]) + " |")
    return "\n".join(lines) + "\n"


def plot_evaluation(grid: Grid, rows: list[dict[str, Any]], out: Path) -> Path | None:
    """eval_bpc.png: bits per character against evaluation context, one line per cell (mean, band min-max)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    drawn = False
    for cell in grid.cells:
        points = []
        for n in grid.evaluate:
            values = [r["eval"].get(str(n)) for r in rows if r["cell"] == cell]
            values = [v for v in values if isinstance(v, float) and math.isfinite(v)]
            if values:
                points.append((n, statistics.fmean(values), min(values), max(values)))
        if not points:
            continue
        ns, mean, low, high = zip(*points, strict=True)
        (line,) = axes.plot(ns, mean, marker="o", label=cell)
        axes.fill_between(ns, low, high, color=line.get_color(), alpha=0.2)
        drawn = True
    path = None
    if drawn:
        axes.set_xscale("log", base=2)
        axes.set_xticks(grid.evaluate, [str(n) for n in grid.evaluate])
        axes.set(xlabel="evaluation context (tokens)", ylabel="val bits per character", title=f"{grid.name}")
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small")
        path = out / "eval_bpc.png"
        figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(figure)
    return path


def mean_curve(curves: list[list[tuple[int, float]]]) -> tuple[list[int], list[float], list[float], list[float]]:
    """Mean, min and max over seeds at the steps every seed logged."""
    steps = sorted(set.intersection(*(set(s for s, _ in c) for c in curves)))
    values = [[dict(c)[s] for c in curves] for s in steps]
    return steps, [statistics.fmean(v) for v in values], [min(v) for v in values], [max(v) for v in values]


def plot_curves(grid: Grid, rows: list[dict[str, Any]], out: Path) -> list[Path]:
    """One PNG per curve: one line per cell (mean over seeds), a band from the lowest to the highest seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for tag in CURVES:
        figure, axes = plt.subplots(figsize=(7, 4.5))
        drawn = False
        for cell in grid.cells:
            curves = [r["curves"][tag] for r in rows if r["cell"] == cell and r["curves"].get(tag)]
            if not curves:
                continue
            steps, mean, low, high = mean_curve(curves)
            (line,) = axes.plot(steps, mean, marker="." if len(steps) < 30 else None, label=f"{cell} (n={len(curves)})")
            if len(curves) > 1:
                axes.fill_between(steps, low, high, color=line.get_color(), alpha=0.2)
            drawn = True
        if drawn:
            if tag.endswith("ppl"):
                axes.set_yscale("log")
            axes.set(xlabel="optimizer step", ylabel=tag, title=f"{grid.name}: {tag}")
            axes.grid(alpha=0.3)
            axes.legend(fontsize="small")
            path = out / f"{tag.replace('/', '_')}.png"
            figure.savefig(path, dpi=110, bbox_inches="tight")
            written.append(path)
        plt.close(figure)
    return written


def report(grid: Grid, runs: list[Run], out: Path) -> Path:
    rows = [run_results(r) for r in runs]
    out.mkdir(parents=True, exist_ok=True)
    table = out / "results.md"
    table.write_text(markdown_table(grid, rows))
    (out / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
    plots = plot_curves(grid, rows, out)
    if grid.evaluate and (evaluation := plot_evaluation(grid, rows, out)) is not None:
        plots.append(evaluation)
    print(table.read_text())
    print("plots: " + ", ".join(str(p) for p in plots))
    return table


# ---- equal time: each cell's step time ----------------------------------------------------------------------------

TIMING_FLAGS = [
    "--trainer.limit_val_batches", "0", "--trainer.num_sanity_val_steps", "0", "--trainer.logger", "false",
    "--checkpoint.every_n_train_steps", "0", "--checkpoint.save_last", "false", "--trainer.enable_progress_bar",
    "false", "--samples.prompts", "[]",
]  # fmt: skip
BASE_ROW = "base"


def base_max_steps(grid: Grid) -> int | None:
    """trainer.max_steps as the grid's base configs set it (the last one that does), None if none does. Not the
    grid's overrides: the base row is timed on the base configs alone, the reference every cell is set against (the
    main job, for frontier.yaml), so its budget is what those configs train at the time measured for them."""
    steps = None
    for path in grid.base:
        raw = yaml.safe_load(Path(path).read_text()) or {}
        value = (raw.get("trainer") or {}).get("max_steps")
        steps = value if isinstance(value, int) and value > 0 else steps
    return steps


def timing_command(grid: Grid, cell: str | None, out: Path, warmup: int, steps: int, extra: list[str]) -> list[str]:
    """A process that times `steps` optimizer steps after `warmup` of the cell's fit (None: the base configs alone,
    no overrides) and prints its seconds per step as the last line of JSON (see time_child)."""
    configs = [token for path in grid.base for token in ("--config", path)]
    flags = [] if cell is None else [*grid.overrides, *grid.cells[cell]]
    seed = [token for flag in grid.seed_flags for token in (f"--{flag}", str(grid.seeds[0]))]
    folder = out / "timing" / folder_name(cell or BASE_ROW)
    where = ["--trainer.default_root_dir", str(folder), "--checkpoint.dirpath", str(folder / "checkpoints")]
    fit = [*configs, *flags, *extra, *seed, *where, *TIMING_FLAGS, "--trainer.max_steps", str(warmup + steps + 1)]
    fit = without_overridden(fit)
    child = "from lit_transformer.recipes.ablate import time_child; time_child()"
    return [sys.executable, "-c", child, str(warmup), str(steps), *fit]


def time_child(argv: list[str] | None = None) -> None:
    """The timing process: `WARMUP STEPS FIT_ARGS...` -> one JSON line {"step_s", "steps"}: the wall time of optimizer
    steps WARMUP+1 .. WARMUP+STEPS of the CLI's own fit (its trainer, callbacks and data), the device synchronised at
    both ends and nowhere between."""
    import lightning as L
    import torch

    from lit_transformer.cli.lightning_cli import run_cli

    argv = list(sys.argv[1:] if argv is None else argv)
    warmup, steps, fit = int(argv[0]), int(argv[1]), argv[2:]
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    marks: dict[int, float] = {}

    class Clock(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if trainer.global_step in (warmup, warmup + steps) and trainer.global_step not in marks:
                sync()
                marks[trainer.global_step] = time.perf_counter()
            if trainer.global_step >= warmup + steps:
                trainer.should_stop = True

    cli = run_cli(fit, run=False)
    cli.trainer.callbacks.append(Clock())
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    print(json.dumps({"step_s": (marks[warmup + steps] - marks[warmup]) / steps, "steps": steps}), flush=True)


def measure_step(command: list[str], env: dict[str, str]) -> float:
    """Seconds per step of one timing process."""
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"timing failed (exit {done.returncode}): {shlex.join(command)}\n{done.stderr[-3000:]}")
    return float(json.loads(lines[-1])["step_s"])


def equal_time_steps(budget_steps: int | None, base_s: float, cell_s: float) -> int | None:
    """The steps of a cell that take the base's budget (budget_steps at base_s each), rounded down to a hundred (so
    that checkpoints every 100 steps end on the last); under a hundred, to a step, at least one. Never more than fit:
    a floor of 100 gave a 10-step budget 100 steps."""
    if not budget_steps:
        return None
    steps = int(budget_steps * base_s / cell_s)
    return steps // 100 * 100 if steps >= 100 else max(1, steps)


def warmup_steps(steps: int) -> int:
    """The untimed steps before `steps` timed ones: compilation, caches and the allocator settle."""
    return max(5, min(50, steps // 5))


def time_cells(grid: Grid, out: Path, steps: int, env: dict[str, str], extra: list[str]) -> list[dict[str, Any]]:
    """Time the base and every cell, one after another; print the table and write step_times.json."""
    warmup = warmup_steps(steps)
    budget = base_max_steps(grid)
    rows: list[dict[str, Any]] = []
    for cell in [None, *grid.cells]:
        label = cell or BASE_ROW
        print(f"timing {grid.name}/{label}: {warmup} untimed steps, then {steps}", flush=True)
        step_s = measure_step(timing_command(grid, cell, out, warmup, steps, extra), env)
        rows.append({"cell": label, "step_s": step_s})
    base_s = rows[0]["step_s"]
    for row in rows:
        row["ratio"] = row["step_s"] / base_s
        row["equal_time_steps"] = equal_time_steps(budget, base_s, row["step_s"])
    lines = [f"## {grid.name}: seconds per optimizer step", ""]
    if budget:
        lines += [
            f"The base's budget: {budget} steps (the trainer.max_steps of its configs alone, as timed, not the "
            f"grid's overrides) at {base_s * 1e3:.1f} ms = {budget * base_s:.0f} s of training; each cell's steps "
            "at equal time are rounded down to a hundred (under a hundred, to a step).",
            "",
        ]
    lines += ["| cell | ms / step | x base | steps at equal time | flags |", "|---|---|---|---|---|"]
    for row in rows:
        n = row["equal_time_steps"]
        flags = f"`--trainer.max_steps {n} --trainer.val_check_interval {n}`" if n and row["cell"] != BASE_ROW else ""
        lines.append(f"| {row['cell']} | {row['step_s'] * 1e3:.1f} | {row['ratio']:.2f} | {n or '–'} | {flags} |")
    print("\n".join(lines))
    out.mkdir(parents=True, exist_ok=True)
    threads = int(env.get("OMP_NUM_THREADS", 0)) or None
    record = {"grid": str(grid.path), "timed_steps": steps, "warmup_steps": warmup, "base_max_steps": budget}
    record |= {"machine": machine(threads=threads), "rows": rows}
    (out / "step_times.json").write_text(json.dumps(record, indent=1) + "\n")
    return rows


# ---- command line -------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> tuple[Any, list[str]]:
    """(the options, the fit flags after `--`) of `ablate GRID... [options] [-- fit flags]`."""
    own, extra = split_passed_on(sys.argv[1:] if argv is None else argv)
    epilog = "Arguments after `--` are appended to every run (e.g. -- --trainer.max_steps 50)."
    parser = command_parser("ablate", __doc__, epilog)
    parser.add_argument("grids", nargs="+", type=Path, help="grid YAML files")
    parser.add_argument(
        "--out", type=Path | None, default=None, help="output folder (one grid) or parent folder (several)"
    )
    parser.add_argument("--jobs", type=PositiveInt, default=1, help="runs at once; the cores are split between them")
    parser.add_argument(
        "--threads", type=PositiveInt | None, default=None, help="torch threads per run (default: cores // jobs)"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="replace the grids' seeds")
    parser.add_argument("--cells", type=str, nargs="+", default=None, help="only these cells")
    parser.add_argument("--dry-run", action="store_true", help="print the commands that would run, run nothing")
    parser.add_argument("--report-only", action="store_true", help="only read the logs: table and plots")
    parser.add_argument(
        "--time-steps",
        type=int | None,
        default=None,
        help="train nothing: time N steps of the base configs alone and of each cell, print the steps that fit the "
        "base's budget (its configs' trainer.max_steps); with --dry-run, print the timing commands",
    )
    return parse(parser, own), extra


def main(argv: list[str] | None = None) -> None:
    """`ablate GRID... [options] [-- fit flags]`; exits 1 when a run failed (the others still report)."""
    code = ablate(argv)
    if code:
        raise SystemExit(code)


def check_cells(wanted: list[str], grids: list[Grid]) -> list[Grid]:
    """The grids that hold a cell of --cells, each cut to those; a name no grid holds is refused before anything is
    written (the report would rewrite the tables without the finished runs)."""
    known = list(dict.fromkeys(cell for grid in grids for cell in grid.cells))
    for name in wanted:
        if name not in known:
            nearest = difflib.get_close_matches(name, known, n=len(known), cutoff=0)
            where, whose = (grids[0].path, "Its") if len(grids) == 1 else ("any of the grids", "Their")
            raise ConfigError(
                f"--cells {shlex.quote(name)}: no such cell in {where}",
                hint=f"{whose} cells, the nearest first: " + ", ".join(map(shlex.quote, nearest)),
            )
    kept = []
    for grid in grids:
        grid.cells = {name: flags for name, flags in grid.cells.items() if name in wanted}
        if grid.cells:
            kept.append(grid)
        else:
            print(f"# {grid.path}: none of --cells, left out", flush=True)
    return kept


def _settings(command: list[str]) -> list[str]:
    """A fit command's flags as they set up the run: not the interpreter, not --ckpt_path (a resume's), and each
    --config as the file it names."""
    tokens, kept = command[1:], []
    skip = False
    for i, token in enumerate(tokens):
        if skip:
            skip = False
            continue
        if token == "--ckpt_path":
            skip = True
            continue
        kept.append(os.path.realpath(token) if i and tokens[i - 1] == "--config" else token)
    return kept


def check_settings(runs: list[Run]) -> None:
    """Refuse, before anything runs, runs that began with other flags (an edited grid or cell, other flags after
    `--`): a finished one was skipped and tabulated as this command's (a 50-step run of `--cells ... -- --trainer.
    max_steps 50` in the 600-step table, its mean and spread over seeds mixing the two), an interrupted one resumed
    under the new flags."""
    changed = []
    for run in runs:
        recorded = run.command_of("fit")
        if recorded is None or not (run.done("fit") or run.last_checkpoint.exists()):
            continue
        before, now = _settings(shlex.split(recorded)), _settings(run.command("fit"))
        if before != now:
            opcodes = difflib.SequenceMatcher(a=before, b=now, autojunk=False).get_opcodes()
            gone = [shlex.join(before[i1:i2]) for op, i1, i2, _, _ in opcodes if op in ("delete", "replace")]
            new = [shlex.join(now[j1:j2]) for op, _, _, j1, j2 in opcodes if op in ("insert", "replace")]
            changed.append(
                f"{run.label} ran with `{' ... '.join(gone) or 'nothing more'}` where this command has "
                f"`{' ... '.join(new) or 'nothing'}`"
            )
    if changed:
        raise ConfigError(
            f"{len(changed)} run(s) in the output folder began with other settings than this command gives them, "
            "and would be skipped or resumed and tabulated as its own: "
            + "; ".join(changed[:4])
            + (" ..." if len(changed) > 4 else ""),
            hint="Give these settings their own --out, or delete those run folders to run them again.",
        )


def check_cell_flags(runs: list[Run]) -> None:
    """Each cell's fit flags, parsed as fit parses them (once per cell, in this process), before any run starts: a
    typo'd key or value in a grid's fifth cell failed only when that cell's turn came, hours into a `--jobs 1` grid,
    and the report left the cell out. A refusal names the grid and the cell."""
    import contextlib
    import io

    from lit_transformer.cli.lightning_cli import run_cli
    from lit_transformer.errors import UserError

    seen: set[tuple[Path, str]] = set()
    for run in runs:
        if (run.grid.path, run.cell) in seen or "fit" not in run.stages():
            continue
        seen.add((run.grid.path, run.cell))
        printed, said = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(said):
                run_cli(["fit", *run._common("fit"), "--print_config"])
        except UserError as error:
            raise ConfigError(
                f"{run.grid.path}, cell {run.cell!r}: {error}",
                hint="Fix the cell (or the grid's base and overrides); no run has started.",
            ) from None
        except SystemExit as exit:  # --print_config's end, or a refusal jsonargparse printed itself
            if exit.code not in (0, None):
                raise ConfigError(f"{run.grid.path}, cell {run.cell!r}: {said.getvalue().strip()}") from None


def check_out(out: Path, given: Path | None) -> None:
    """Refuse an output folder a file stands in the way of, before anything runs (mkdir failed after the runs)."""
    for folder in (out, *out.parents):
        if folder.exists():
            if not folder.is_dir():
                named = f"--out {given}" if given is not None else f"the output folder {out}"
                raise ConfigError(f"{named}: {folder} is a file, not a folder: give --out a folder (new or existing)")
            return


def check_options(args: Any) -> None:
    """Options that contradict each other, refused before anything runs."""
    if args.time_steps is not None and args.time_steps < 1:
        raise ConfigError(f"--time-steps {args.time_steps}: time at least one step")
    if args.time_steps is not None and args.report_only:
        raise ConfigError(
            "--time-steps with --report-only: --time-steps starts timing processes, --report-only only reads what "
            "has run: give one of them"
        )
    if args.seeds:
        check_seeds(args.seeds, "--seeds")


def ablate(argv: list[str] | None = None) -> int:
    """Run (or resume) the grids, then write their tables and plots; 0, or 1 when a run failed."""
    args, extra = parse_args(argv)
    check_options(args)
    grids = [Grid.load(_resolve(path)) for path in args.grids]
    # the report covers the whole grid: `--cells A` or `--seeds 3` rewrote its table with their runs alone
    whole = {id(grid): dataclasses.replace(grid, cells=dict(grid.cells)) for grid in grids}
    if args.cells:
        grids = check_cells(args.cells, grids)
    plan: list[tuple[Grid, Path, list[Run]]] = []
    folders: dict[Path, Grid] = {}
    for grid in grids:
        if args.seeds:
            grid.seeds = args.seeds
        if args.out is None:
            out = Path("runs/ablations") / grid.name
        else:
            out = args.out / grid.name if len(args.grids) > 1 else args.out
        out = out.resolve()
        other = folders.setdefault(out, grid)
        if other is not grid:
            raise ConfigError(
                f"grids {other.path} and {grid.path} would share the folder {out} (a grid's folder is its `name:`, "
                "else its file name) and so their runs: give one its own `name:`, or run them one at a time"
            )
        check_out(out, args.out)
        plan.append((grid, out, grid.runs(out, extra)))

    all_runs = [run for _, _, runs in plan for run in runs]
    if not args.report_only and args.time_steps is None:
        check_settings(all_runs)
    if args.time_steps is not None:
        env = thread_env(1, args.threads or (None if args.jobs == 1 else max(1, (os.cpu_count() or 1) // args.jobs)))
        if args.dry_run:
            print(f"# timing, one process at a time, OMP_NUM_THREADS={env['OMP_NUM_THREADS']}")
            for grid, out, _ in plan:
                for cell in [None, *grid.cells]:
                    command = timing_command(grid, cell, out, warmup_steps(args.time_steps), args.time_steps, extra)
                    print(f"# {grid.name}/{cell or BASE_ROW} timing\n{shlex.join(command)}")
            return 0
        for grid, out, _ in plan:
            time_cells(grid, out, args.time_steps, env, extra)
        return 0
    if args.dry_run:
        env = thread_env(args.jobs, args.threads)
        print(f"# {len(all_runs)} runs, {args.jobs} at a time, OMP_NUM_THREADS={env['OMP_NUM_THREADS']}")
        for run in all_runs:
            for stage in run.stages():
                print(f"# {run.label} {stage}\n{shlex.join(run.command(stage))}")
        return 0
    if not args.report_only:
        check_cell_flags(all_runs)
    failed = [] if args.report_only else run_all(all_runs, args.jobs, thread_env(args.jobs, args.threads))
    for grid, out, _ in plan:
        table = whole[id(grid)]
        table.seeds = sorted(set(table.seeds) | set(grid.seeds))
        report(table, table.runs(out, extra), out)
    if failed:
        print(f"{len(failed)} runs failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    from lit_transformer.cli.program import main as program

    program(["ablate", *sys.argv[1:]])
