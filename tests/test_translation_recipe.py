"""translation-recipe reads the whole run: the curve of a run resumed after a stop (a TensorBoard folder per resume),
and a wrong --run refused in a line before anything is written into it."""

from __future__ import annotations

from pathlib import Path

import pytest

from lit_transformer.errors import MissingFileError
from lit_transformer.recipes.translation_recipe import main, run_curve


def _log(folder: Path, points: dict[str, list[tuple[int, float]]]) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(folder))
    for tag, values in points.items():
        for step, value in values:
            writer.add_scalar(tag, value, step)
    writer.close()


def test_a_resumed_run_s_curve_joins_its_versions(tmp_path):
    """A run stopped at step 20 and resumed logs into version_1 (its step-20 validation again, after the resume):
    the curve is both, in step order, the later value kept. It failed with "not enough values to unpack"."""
    run = tmp_path / "run"
    _log(run / "tensorboard" / "version_0", {"val/bleu": [(9, 1.0), (19, 2.0)], "val/ppl": [(9, 90.0), (19, 50.0)]})
    _log(run / "tensorboard" / "version_1", {"val/bleu": [(19, 2.5), (29, 4.0)], "val/ppl": [(19, 49.0), (29, 30.0)]})
    _log(run / "tensorboard" / "version_2", {"test/bleu": [(29, 3.9)]})  # a `test` of the run beside it
    assert run_curve(run, "val/bleu") == [(10, 1.0), (20, 2.5), (30, 4.0)]
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "last.ckpt").write_bytes(b"")
    main(["--run", str(run), "--config", "presets/tiny-translate", "--plot_only"])
    assert (run / "recipe" / "val-bleu.png").stat().st_size > 0


def test_a_folder_that_is_not_a_run_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(MissingFileError, match=r"no checkpoints in .*give the folder fit wrote"):
        main(["--run", str(tmp_path / "nothere"), "--config", "presets/tiny-translate"])
    assert not (tmp_path / "nothere").exists()
    (tmp_path / "empty" / "checkpoints").mkdir(parents=True)
    (tmp_path / "empty" / "checkpoints" / "last.ckpt").write_bytes(b"")
    with pytest.raises(MissingFileError, match="no TensorBoard events under it"):
        main(["--run", str(tmp_path / "empty"), "--config", "presets/tiny-translate", "--plot_only"])
