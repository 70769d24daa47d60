"""The README's figure is what `python -m lit_transformer.pages.plots` draws from the committed docs/main_job.jsonl."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from lit_transformer.pages.plots import DOCS, main, main_job_figure, read_runs


def test_the_committed_figure_is_redrawn_from_its_json(tmp_path: Path) -> None:
    main(["--jsonl", str(DOCS / "main_job.jsonl"), "--out", str(tmp_path / "main_job.png")])
    assert np.array_equal(imread(tmp_path / "main_job.png"), imread(DOCS / "main_job.png")), (
        "docs/main_job.png is not what docs/main_job.jsonl draws: regenerate it with `python -m lit_transformer.pages.plots`"
    )
    assert "docs/main_job.png" in (DOCS.parent / "README.md").read_text()


def test_a_changed_run_changes_the_figure(tmp_path: Path) -> None:
    runs = read_runs(DOCS / "main_job.jsonl")
    for run in runs:
        if run["run"] == "ours":
            run["bpc"] += 0.1
    assert not np.array_equal(imread(main_job_figure(runs, tmp_path / "x.png")), imread(DOCS / "main_job.png"))
    with pytest.raises(ValueError, match="nanoGPT"):
        main_job_figure([r for r in runs if r["run"] == "ours"], tmp_path / "y.png")


def test_the_newest_run_of_each_measurement_is_drawn(tmp_path: Path) -> None:
    """Runs are appended to one file: a nanoGPT rerun at an iteration count replaces the older one in the line, and
    the 2017 recipe's run is drawn beside the main job's (changing it changes the figure)."""
    runs = read_runs(DOCS / "main_job.jsonl")
    newest = {r["max_iters"]: r for r in runs if r["run"] == "nanoGPT"}
    only_newest = [r for r in runs if r["run"] != "nanoGPT"] + list(newest.values())
    assert len(only_newest) < len(runs), "the committed file should hold a superseded nanoGPT run"
    drawn = imread(main_job_figure(runs, tmp_path / "all.png"))
    assert np.array_equal(drawn, imread(main_job_figure(only_newest, tmp_path / "newest.png")))
    moved = [
        dict(r, bpc=r["bpc"] + 0.1) if r.get("config") == "configs/presets/shakespeare-2017.yaml" else r for r in runs
    ]
    assert not np.array_equal(drawn, imread(main_job_figure(moved, tmp_path / "moved.png")))


def test_a_run_with_overrides_is_not_the_recipe_it_overrides(tmp_path: Path) -> None:
    """`ours --config configs/base.yaml -- FLAGS` (the previous main job, a setting tried at the same budget) appended
    after the main job's run is not drawn as the main job."""
    runs = read_runs(DOCS / "main_job.jsonl")
    main_job = [r for r in runs if r["run"] == "ours" and r["config"] == "configs/base.yaml" and not r.get("overrides")]
    variant = dict(main_job[-1], overrides="--trainer.max_steps 10", bpc=main_job[-1]["bpc"] + 0.3)
    drawn = imread(main_job_figure(runs, tmp_path / "all.png"))
    assert np.array_equal(drawn, imread(main_job_figure([*runs, variant], tmp_path / "variant.png")))
    shipped = dict(variant, overrides="")
    assert not np.array_equal(drawn, imread(main_job_figure([*runs, shipped], tmp_path / "shipped.png")))


def test_the_line_is_nanogpts_runs_of_the_main_jobs_race(tmp_path: Path) -> None:
    """A nanoGPT run of another day (another race, on a host of another speed) is not drawn beside the main job; one
    of its day is."""
    runs = read_runs(DOCS / "main_job.jsonl")
    main_job = [r for r in runs if r["run"] == "ours" and r["config"] == "configs/base.yaml" and not r.get("overrides")]
    nano = next(r for r in reversed(runs) if r["run"] == "nanoGPT")
    drawn = imread(main_job_figure(runs, tmp_path / "all.png"))
    other_day = dict(nano, max_iters=12345, wall_s=nano["wall_s"] * 1.5, date="1999-01-01T00:00:00Z")
    assert np.array_equal(drawn, imread(main_job_figure([*runs, other_day], tmp_path / "other.png")))
    same_day = dict(other_day, date=main_job[-1]["date"])
    assert not np.array_equal(drawn, imread(main_job_figure([*runs, same_day], tmp_path / "same.png")))
