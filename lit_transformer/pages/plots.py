"""The README's figure, drawn from committed JSON: the main job against nanoGPT's CPU recipe.

    python -m lit_transformer.pages.plots                 # docs/main_job.jsonl -> docs/main_job.png
    python -m lit_transformer.pages.plots --jsonl RUNS.jsonl --out FIGURE.png

Each point is one line of the JSON-lines file that `python -m lit_transformer bench nanogpt --json FILE` appends to: validation
bits per character over the whole split against the run's wall time. matplotlib's object API draws it (no pyplot, no
global backend), and the PNG carries no date or version, so the same JSON gives the same picture.
"""

from __future__ import annotations

import sys
from pathlib import Path

from lit_transformer.records import IMPORT_ROOT, read_runs, require_source_checkout

DOCS = IMPORT_ROOT / "docs"


# Our points: the main job and, where the file has one, the 2017 recipe it replaced, each its latest fresh-cache run.
OURS = {
    "configs/base.yaml": ("tab:blue", "lit_transformer, configs/base.yaml (the main job)"),
    "configs/presets/shakespeare-2017.yaml": (
        "tab:orange",
        "lit_transformer, the 2017 recipe (presets/shakespeare-2017)",
    ),
}


def race_day(run: dict) -> str:
    """The UTC day a run was made: the runs of one race are made back to back on one machine."""
    return str(run.get("date", ""))[:10]


def main_job_figure(runs: list[dict], out: Path) -> Path:
    """Bits per character against wall time: our latest fresh-cache run of each recipe in OURS, as shipped (no
    overrides), as one point, and nanoGPT's recipe as a line through its latest run at each iteration count, in order
    of iterations, among the runs of the main job's race (its day): runs are appended to one file, so the figure is
    the newest measurement of each; and a host's speed drifts from day to day (the 2017 recipe took 283 s on one day's
    EPYC and 393 s on another's), so a line through another day's runs would set a slower host's nanoGPT beside the
    main job."""
    from matplotlib.figure import Figure

    # A run with overrides (`ours --config X -- FLAGS`) is a variant of X, not X: the point is the recipe as shipped.
    ours = {config: [r for r in runs if r["run"] == "ours" and r.get("fresh_cache") and r.get("config") == config
                     and not r.get("overrides")]
            for config in OURS}  # fmt: skip
    day = race_day(ours["configs/base.yaml"][-1]) if ours["configs/base.yaml"] else None
    # a rerun supersedes the file's older run at its iteration count
    latest = {r["max_iters"]: r for r in runs if r["run"] == "nanoGPT" and race_day(r) == day}
    nano = [latest[iters] for iters in sorted(latest)]
    if not ours["configs/base.yaml"] or not nano:
        raise ValueError(
            "The runs need one fresh-cache `ours` run of configs/base.yaml and at least one nanoGPT run of its day"
        )
    figure = Figure(figsize=(6.4, 3.6), dpi=100, layout="constrained")
    axes = figure.add_subplot()
    axes.plot([r["wall_s"] for r in nano], [r["bpc"] for r in nano], "o-", color="tab:gray",
              label="nanoGPT, README CPU recipe")  # fmt: skip
    for k, r in enumerate(nano):  # labels above and below in turn: neighbouring runs do not overlap
        axes.annotate(f"{r['max_iters']:,} iterations", (r["wall_s"], r["bpc"]), textcoords="offset points",
                      xytext=(0, 8 if k % 2 == 0 else -14), ha="center", fontsize=8, color="tab:gray")  # fmt: skip
    for config, found in ours.items():
        if not found or race_day(found[-1]) != day:
            continue
        color, label = OURS[config]
        run = found[-1]
        axes.plot([run["wall_s"]], [run["bpc"]], "o", color=color, markersize=8, label=label)
        axes.annotate(f"{run['bpc']:.3f}", (run["wall_s"], run["bpc"]), textcoords="offset points", xytext=(0, 8),
                      ha="center", fontsize=8, color=color)  # fmt: skip
    run = ours["configs/base.yaml"][-1]
    axes.margins(x=0.12, y=0.15)
    cpu = (run.get("machine") or {}).get("cpu")
    where = f" of a {run['machine']['logical_cores']}-core {cpu}" if cpu else ""
    axes.set_xlabel(f"wall time (s), tokenizer training and validation included\n{run['threads']} threads{where}")
    axes.set_ylabel("validation bits per character")
    axes.set_title("The main job against nanoGPT on the same text (lower is better)", fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc="lower right")
    figure.savefig(out, metadata={"Software": None})
    return out


def main(argv: list[str] | None = None) -> None:
    from lit_transformer.cli.arguments import command_parser, parse

    require_source_checkout("lit_transformer.pages.plots", "the docs/ it writes")
    parser = command_parser("lit_transformer.pages.plots", __doc__)
    parser.add_argument("--jsonl", type=Path, default=DOCS / "main_job.jsonl", help="the runs (one JSON per line)")
    parser.add_argument("--out", type=Path, default=DOCS / "main_job.png", help="the PNG to write")
    args = parse(parser, sys.argv[1:] if argv is None else argv)
    print(f"wrote {main_job_figure(read_runs(args.jsonl), args.out)}")


if __name__ == "__main__":
    main()
