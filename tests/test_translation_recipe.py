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


def test_a_resumed_run_s_curve_joins_its_versions(tmp_path, capsys):
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
    # a folder as --plot: the plot goes in it (matplotlib wrote FOLDER.png beside it, and nothing said where)
    (tmp_path / "plots").mkdir()
    main(["--run", str(run), "--config", "presets/tiny-translate", "--plot_only", "--plot", str(tmp_path / "plots")])
    assert (tmp_path / "plots" / "val-bleu.png").is_file() and not (tmp_path / "plots.png").exists()
    assert f"wrote {tmp_path / 'plots' / 'val-bleu.png'}" in capsys.readouterr().out


def test_a_folder_that_is_not_a_run_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(MissingFileError, match=r"no checkpoints in .*give the folder fit wrote"):
        main(["--run", str(tmp_path / "nothere"), "--config", "presets/tiny-translate"])
    assert not (tmp_path / "nothere").exists()
    (tmp_path / "empty" / "checkpoints").mkdir(parents=True)
    (tmp_path / "empty" / "checkpoints" / "last.ckpt").write_bytes(b"")
    with pytest.raises(MissingFileError, match="no TensorBoard events under it"):
        main(["--run", str(tmp_path / "empty"), "--config", "presets/tiny-translate", "--plot_only"])


def test_a_run_without_step_checkpoints_and_broken_flags_are_refused_in_a_line(tmp_path):
    """A run that kept no step*.ckpt (the tiny preset's) ended in an IndexError traceback after the plot; --flags
    with an open quote in shlex's ValueError traceback."""
    from lit_transformer.errors import ConfigError

    run = tmp_path / "run"
    _log(run / "tensorboard" / "version_0", {"val/bleu": [(9, 1.0)], "val/ppl": [(9, 90.0)]})
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "last.ckpt").write_bytes(b"")
    with pytest.raises(MissingFileError, match=r"averages the run's step checkpoints .* --last 5 asks for more"):
        main(["--run", str(run), "--config", "presets/tiny-translate"])
    with pytest.raises(ConfigError, match="does not split as shell words"):
        main(["--run", str(run), "--config", "presets/tiny-translate", "--plot_only", "--flags", "--a 'b"])


def test_a_step_the_recipe_runs_passes_the_commands_refusal_on():
    """A `test` or `average` the recipe ran that refused (a config of another task, --last past the checkpoints) was
    a RuntimeError traceback wrapping the child's stderr; it is that refusal, with the child's exit status."""
    from lit_transformer.errors import UserError
    from lit_transformer.recipes.translation_recipe import _cli

    with pytest.raises(UserError, match="`average --checkpoints nothere` refused: --checkpoints nothere: no such") as e:
        _cli("average", "--checkpoints", "nothere", "--output", "x.ckpt")
    assert e.value.status == 1
