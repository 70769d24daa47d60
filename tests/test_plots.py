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
