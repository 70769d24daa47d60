"""Checkpoints never tear, never run code when loaded, and every failure says what went wrong and what to do."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lit_transformer.checkpoints.atomic_io import AtomicCheckpointIO
from lit_transformer.checkpoints.files import (
    CheckpointError,
    atomic_save,
    check_architecture,
    check_tokenizer_vocabulary,
    load_checkpoint,
    load_model_state,
)
from lit_transformer.config import TransformerConfig

TESTS = Path(__file__).parent
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))
import _boring  # noqa: E402
from _forked import HARNESS_ENV, WarmProcess, warm_python  # noqa: E402


def test_atomic_save_round_trip_leaves_no_temporary_files(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "a.ckpt"
    atomic_save({"state_dict": {"w": torch.arange(3.0)}}, path)
    atomic_save({"state_dict": {"w": torch.arange(4.0)}}, path)
    assert torch.equal(load_checkpoint(path)["state_dict"]["w"], torch.arange(4.0))
    assert [p.name for p in path.parent.iterdir()] == ["a.ckpt"]


def test_our_plain_types_load_with_weights_only(tmp_path: Path) -> None:
    config = TransformerConfig(d_model=16, n_heads=2, n_layers=1, vocab_size=32)
    hparams = {"config": config, "data_dir": pathlib.Path("/data/x"), "tokenizer": '{"model": {}}'}
    atomic_save({"state_dict": {}, "hyper_parameters": hparams}, tmp_path / "a.ckpt")
    loaded = load_checkpoint(tmp_path / "a.ckpt")["hyper_parameters"]
    assert loaded == hparams and isinstance(loaded["config"], TransformerConfig)


def test_our_types_stay_allowed_after_a_load_for_lightnings_own_loads(tmp_path: Path) -> None:
    """load_checkpoint first, then Lightning's weights_only load of the same file (LightningCLI --ckpt_path does both)."""
    config = TransformerConfig(d_model=16, n_heads=2, n_layers=1, vocab_size=32)
    atomic_save({"state_dict": {}, "hyper_parameters": {"config": config}}, tmp_path / "a.ckpt")
    load_checkpoint(tmp_path / "a.ckpt")
    assert torch.load(tmp_path / "a.ckpt", weights_only=True)["hyper_parameters"]["config"] == config


class _Hostile:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
def test_hostile_pickle_is_refused_and_never_runs(tmp_path: Path, zip_format: bool) -> None:
    marker = tmp_path / "pwned"
    payload = {"state_dict": {}, "payload": _Hostile(marker)}
    torch.save(payload, tmp_path / "evil.ckpt", _use_new_zipfile_serialization=zip_format)
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(tmp_path / "evil.ckpt")
    message = str(error.value)
    assert "weights_only=True" in message and "system" in message and "never run code" in message
    assert not marker.exists()


def _write_good(path: Path) -> bytes:
    atomic_save({"state_dict": {"w": torch.randn(64, 64)}}, path)
    return path.read_bytes()


@pytest.mark.parametrize(
    "damage, expected",
    [
        (lambda data: data[: len(data) // 2], "truncated, corrupt or not a checkpoint"),
        (lambda data: b"", "truncated, corrupt or not a checkpoint"),
        (
            lambda data: b"not a checkpoint at all" * 10,
            "is text \\(it starts 'not a checkpoint at all.*not a checkpoint",
        ),
        (lambda data: bytes(range(7, 200)), "is other bytes .* not a checkpoint"),
        (lambda data: data[:100] + bytes(len(data) - 100), "truncated, corrupt or not a checkpoint"),
    ],
    ids=["half", "empty", "text", "binary", "zeroed"],
)
def test_torn_or_corrupt_file_gets_a_clear_error(tmp_path: Path, damage, expected: str) -> None:
    data = _write_good(tmp_path / "good.ckpt")
    (tmp_path / "bad.ckpt").write_bytes(damage(data))
    with pytest.raises(CheckpointError, match=expected) as error:
        load_checkpoint(tmp_path / "bad.ckpt")
    assert "good.ckpt" in str(error.value)  # points at the whole checkpoint next to it


def test_missing_file_names_what_was_looked_for_and_lists_neighbours(tmp_path: Path) -> None:
    _write_good(tmp_path / "epoch=1.ckpt")
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(tmp_path / "last.ckpt")
    assert "last.ckpt does not exist" in str(error.value) and "epoch=1.ckpt" in str(error.value)
    with pytest.raises(CheckpointError, match="folder does not exist"):
        load_checkpoint(tmp_path / "nowhere" / "last.ckpt")


def test_a_run_folder_given_as_a_checkpoint_names_its_checkpoints(tmp_path: Path) -> None:
    """It said "No .ckpt files in runs/tiny": they are a level down, in its checkpoints/ folder."""
    _write_good(tmp_path / "run" / "checkpoints" / "last.ckpt")
    with pytest.raises(CheckpointError, match=r"run is a run folder, not a checkpoint file: its checkpoints are in "):
        load_checkpoint(tmp_path / "run")


def test_the_neighbours_of_a_missing_checkpoint_are_listed_in_step_order(tmp_path: Path) -> None:
    """step=10 after step=9 (an alphabetical list put it after step=1), and of many, the first and the newest: the
    list was cut at the 20th name, before the latest steps of a run that keeps every checkpoint."""
    for step in range(1, 31):
        (tmp_path / f"step={step}.ckpt").touch()
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(tmp_path / "last.ckpt")
    listed = str(error.value).split("Checkpoints found in ")[1]
    first = ", ".join(f"step={s}.ckpt" for s in range(1, 11))
    last = ", ".join(f"step={s}.ckpt" for s in range(21, 31))
    assert listed == f"{tmp_path}: {first}, … 10 more …, {last}."


def test_checkpoint_io_refuses_non_finite_weights_and_keeps_the_previous_file(tmp_path: Path) -> None:
    io, path = AtomicCheckpointIO(), tmp_path / "last.ckpt"
    io.save_checkpoint({"state_dict": {"w": torch.ones(2)}}, path)
    with pytest.raises(CheckpointError, match="NaN"):
        io.save_checkpoint({"state_dict": {"w": torch.tensor([1.0, float("nan")])}}, path)
    assert torch.equal(io.load_checkpoint(path)["state_dict"]["w"], torch.ones(2))


class _TinyLM(torch.nn.Module):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Linear(config.d_model, config.d_model) for _ in range(config.n_layers)
        )


def test_architecture_mismatch_names_parameters_shapes_and_config_fields() -> None:
    saved = TransformerConfig(d_model=16, n_heads=2, n_layers=2, vocab_size=32)
    current = TransformerConfig(d_model=24, n_heads=2, n_layers=1, vocab_size=32)
    checkpoint = {"state_dict": _TinyLM(saved).state_dict(), "hyper_parameters": {"config": saved}}
    with pytest.raises(CheckpointError) as error:
        load_model_state(_TinyLM(current), checkpoint, current)
    message = str(error.value)
    assert "embed.weight: checkpoint (32, 16) vs model (32, 24)" in message
    assert "blocks.1.weight" in message  # unexpected in the model built now
    assert "d_model: checkpoint 16 vs now 24" in message and "n_layers: checkpoint 2 vs now 1" in message
    assert "vocab_size" not in message


def test_matching_architecture_loads() -> None:
    config = TransformerConfig(d_model=16, n_heads=2, n_layers=1, vocab_size=32)
    source, target = _TinyLM(config), _TinyLM(config)
    load_model_state(target, {"state_dict": source.state_dict()}, config)
    check_architecture(source.state_dict(), target)
    assert torch.equal(target.embed.weight, source.embed.weight)


def test_tokenizer_larger_than_the_vocabulary_is_refused() -> None:
    config = TransformerConfig(d_model=16, n_heads=2, n_layers=1, vocab_size=32)
    check_tokenizer_vocabulary(32, config)
    with pytest.raises(CheckpointError, match="40 tokens but the model's vocabulary holds 32"):
        check_tokenizer_vocabulary(40, config)


def _run_until(args: list[str], marker: str, timeout: float = 60) -> WarmProcess:
    """Start the tiny training script (a process forked from a warm interpreter, tests/_forked.py) and return once it
    prints ``marker`` (the process keeps running)."""
    process = warm_python(HARNESS_ENV).popen(
        [sys.executable, TESTS / "_boring.py", *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    for line in process.stdout:
        if line.strip() == marker:
            return process
    process.wait(timeout)
    raise AssertionError(f"the script ended (status {process.returncode}) before printing {marker!r}")


def test_sigkill_during_a_save_leaves_the_previous_checkpoint_loadable(tmp_path: Path) -> None:
    # Saves 1..3 are normal (steps 1..3); the 4th writes half of its bytes and hangs; then SIGKILL.
    process = _run_until([str(tmp_path), "--max-steps", "10", "--slow-save-from", "4"], "SAVING")
    process.send_signal(signal.SIGKILL)
    process.wait(30)
    last = tmp_path / "checkpoints" / "last.ckpt"
    checkpoint = load_checkpoint(last)
    assert checkpoint["global_step"] == 3
    assert not any(p.suffix == ".ckpt" for p in last.parent.iterdir() if p != last)  # the torn file is no .ckpt

    # And training resumes from it.
    trainer = _boring.make_trainer(tmp_path, max_steps=5)
    trainer.fit(_boring.TinyModule(), ckpt_path="last")
    assert load_checkpoint(last)["global_step"] == 5


def test_fit_refuses_a_hostile_checkpoint(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    (tmp_path / "checkpoints").mkdir()
    torch.save({"state_dict": {}, "payload": _Hostile(marker)}, tmp_path / "checkpoints" / "last.ckpt")
    trainer = _boring.make_trainer(tmp_path, max_steps=2)
    with pytest.raises(CheckpointError, match="Refused to load"):
        trainer.fit(_boring.TinyModule(), ckpt_path="last")
    assert not marker.exists()


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """One data cache for the module's fits (keyed by content, as a user's LIT_TRANSFORMER_CACHE is): the tiny
    preset's corpus is tokenized once, not again in each test's own folder (about 0.5 s of CPU a test). No test here
    checks the preparation itself; a run reads the same shards whether it prepared them or found them."""
    return tmp_path_factory.mktemp("cache")


def _tiny_fit(folder: Path, cache: Path, *extra: str):
    """A tiny run in-process whose checkpoints live in `folder`/checkpoints: validation every 4 steps, last.ckpt
    every 2, the best by val/nll beside it."""
    import contextlib
    import io

    from lit_transformer.cli.lightning_cli import run_cli

    args = ["fit", "--config", str(REPO / "configs" / "presets" / "tiny.yaml"), "--trainer.logger", "false"]
    args += ["--trainer.enable_progress_bar", "false", "--data.init_args.cache_dir", str(cache)]
    args += ["--trainer.default_root_dir", str(folder), "--checkpoint.dirpath", str(folder / "checkpoints")]
    args += ["--trainer.val_check_interval", "4", "--checkpoint.every_n_train_steps", "2", *extra]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return run_cli(args)


def _best(cli):
    (callback,) = [c for c in cli.trainer.checkpoint_callbacks if getattr(c, "monitor", None) == "val/nll"]
    return callback


def test_a_run_folder_moved_elsewhere_resumes_as_the_same_run(cache: Path, tmp_path: Path) -> None:
    """Moved (or copied to another machine), the run's folder still is the run's: resuming writes its last.ckpt (not
    a last-v1.ckpt beside a stale one), keeps one best checkpoint, whose score it remembers, and names files of the
    new place. Resuming from a run's checkpoint into another folder starts a new record there and leaves the first
    run's files as they were."""
    import shutil

    _tiny_fit(tmp_path / "before" / "run", cache, "--trainer.max_steps", "10")
    shutil.move(tmp_path / "before" / "run", tmp_path / "after")
    folder = tmp_path / "after" / "checkpoints"
    cli = _tiny_fit(tmp_path / "after", cache, "--trainer.max_steps", "12", "--ckpt_path", "last")
    names = sorted(p.name for p in folder.iterdir())
    assert names[-1] == "last.ckpt" and load_checkpoint(folder / "last.ckpt")["global_step"] == 12, names
    (best,) = [name for name in names if name.startswith("best-")]
    callback = _best(cli)
    assert callback.best_model_path == str(folder / best)
    assert f"val_nll{callback.best_model_score.item():.3f}" in best
    assert callback.best_k_models.keys() == {str(folder / best)}

    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    branch = tmp_path / "branch"
    cli = _tiny_fit(branch, cache, "--trainer.max_steps", "14", "--ckpt_path", str(folder / "last.ckpt"))
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert load_checkpoint(branch / "checkpoints" / "last.ckpt")["global_step"] == 14


def _recorded(root: Path) -> Path:
    """A config fragment: dropout on (resume must draw the same masks), each step's loss recorded in root, the
    learning rate schedule 12 steps long whatever max_steps says."""
    import yaml

    root.mkdir(parents=True, exist_ok=True)
    recorder = {"class_path": "_boring.LossRecorder", "init_args": {"path": str(root / "losses.jsonl")}}
    config = {
        "trainer": {"callbacks": [recorder]},
        "model": {"config": {"dropout": 0.1}, "optim": {"schedule_steps": 12}},
    }
    (root / "recorded.yaml").write_text(yaml.safe_dump(config))
    return root / "recorded.yaml"


def test_last_ckpt_of_a_validated_step_records_that_validations_best(cache: Path, tmp_path: Path) -> None:
    """Lightning writes a step's last.ckpt before the step's validation; it is written again after it, so a run
    resumed from it knows the best checkpoint that validation wrote: one best file stays, the one with the best
    score. Resumed from that second write, the run goes on with the losses of a run never stopped."""
    full = tmp_path / "full"
    _tiny_fit(full, cache, "--trainer.max_steps", "12", "--config", str(_recorded(full)))
    recorded = str(_recorded(tmp_path / "run"))
    _tiny_fit(tmp_path / "run", cache, "--trainer.max_steps", "8", "--config", recorded)
    folder = tmp_path / "run" / "checkpoints"
    (best,) = [p.name for p in folder.iterdir() if p.name.startswith("best-")]
    assert best.startswith("best-step000008")
    state = load_checkpoint(folder / "last.ckpt")["callbacks"]
    (record,) = [v for k, v in state.items() if k.startswith("ModelCheckpoint{'monitor': 'val/nll'")]
    assert record["best_model_path"] == str(folder / best) and record["best_k_models"].keys() == {str(folder / best)}
    cli = _tiny_fit(tmp_path / "run", cache, "--trainer.max_steps", "12", "--ckpt_path", "last", "--config", recorded)
    (best,) = [p.name for p in folder.iterdir() if p.name.startswith("best-")]
    assert _best(cli).best_model_path == str(folder / best)
    expected, resumed = _boring.read_losses(full), _boring.read_losses(tmp_path / "run")
    assert sorted(resumed) == sorted(expected) == list(range(1, 13)) and resumed == expected


def test_a_resume_with_another_checkpoint_interval_keeps_the_runs_record(cache: Path, tmp_path: Path) -> None:
    """Lightning keys a checkpoint callback's record by its interval too: resumed with another
    --checkpoint.every_n_train_steps, it found none, and wrote last-v1.ckpt beside a stale last.ckpt (and warned that
    the callbacks of the checkpoint should be given, which the command line now leaves out)."""
    import warnings

    from lit_transformer.cli.console import quiet_dependencies

    _tiny_fit(tmp_path / "run", cache, "--trainer.max_steps", "8")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_dependencies()  # as the command line sets it up
        cli = _tiny_fit(
            tmp_path / "run", cache, "--trainer.max_steps", "12", "--ckpt_path", "last",
            "--checkpoint.every_n_train_steps", "3",
        )  # fmt: skip
    folder = tmp_path / "run" / "checkpoints"
    names = sorted(p.name for p in folder.iterdir())
    assert len(names) == 2 and names[1] == "last.ckpt" and names[0].startswith("best-"), names
    assert load_checkpoint(folder / "last.ckpt")["global_step"] == 12
    assert _best(cli).best_model_path == str(folder / names[0])
    assert not [w for w in caught if "callbacks used to create the checkpoint" in str(w.message)]


def test_ckpt_path_last_reads_the_file_lightning_resumes(cache: Path, tmp_path: Path) -> None:
    """The newest last*.ckpt, as Lightning picks it (a last-v1.ckpt it wrote beside an older last.ckpt): the
    hyperparameters and tokenizer read before the run are that file's, not a stale last.ckpt's."""
    import os
    import shutil

    _tiny_fit(tmp_path / "run", cache, "--trainer.max_steps", "4")
    folder = tmp_path / "run" / "checkpoints"
    shutil.copy(folder / "last.ckpt", folder / "last-v1.ckpt")
    (folder / "last.ckpt").write_text("not this one")
    os.utime(folder / "last.ckpt", (1, 1))
    cli = _tiny_fit(tmp_path / "run", cache, "--trainer.max_steps", "6", "--ckpt_path", "last")
    assert cli.trainer.global_step == 6 and cli.trainer.ckpt_path == str(folder / "last-v1.ckpt")
    assert load_checkpoint(folder / "last.ckpt")["global_step"] == 6  # the record's name for the run's last file


def test_a_fit_from_an_earlier_checkpoint_of_its_own_folder_is_refused_and_goes_on_elsewhere(
    cache: Path, tmp_path: Path
) -> None:
    """Its first save would write last.ckpt over the run's later state: refused before any step, the folder as it
    was; resumed into another folder it trains on from that checkpoint's step."""
    import shutil

    from lit_transformer.errors import ConfigError

    folder = tmp_path / "run" / "checkpoints"
    _tiny_fit(tmp_path / "run", cache, "--trainer.max_steps", "4")
    shutil.copy(folder / "last.ckpt", folder / "snapshot.ckpt")
    _tiny_fit(tmp_path / "run", cache, "--trainer.max_steps", "8", "--ckpt_path", "last")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    with pytest.raises(
        ConfigError, match=r"snapshot.ckpt \(step 4\) resumes inside its run's folder, whose last.ckpt is at step 8"
    ):
        _tiny_fit(
            tmp_path / "run",
            cache,
            "--trainer.max_steps",
            "10",
            "--ckpt_path",
            str(folder / "snapshot.ckpt"),
        )
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    cli = _tiny_fit(
        tmp_path / "branch",
        cache,
        "--trainer.max_steps",
        "6",
        "--ckpt_path",
        str(folder / "snapshot.ckpt"),
    )
    assert cli.trainer.global_step == 6 and {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_a_new_fit_in_a_folder_with_a_run_says_where_its_files_go(cache: Path, tmp_path: Path, caplog) -> None:
    """Lightning starts the new run beside the earlier one and writes its last checkpoint as last-v1.ckpt, while
    last.ckpt (what the pages call the final model) stays the earlier run's: said at the start, with how to resume
    that run instead, in place of Lightning's warning that the folder is not empty."""
    import logging
    import warnings

    folder = tmp_path / "run" / "checkpoints"
    _tiny_fit(tmp_path / "run", cache, "--trainer.max_steps", "2")
    with caplog.at_level(logging.INFO), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli = _tiny_fit(tmp_path / "run", cache, "--trainer.max_steps", "2")
    note = f"note: {folder} holds an earlier run (last.ckpt); this fit starts a new one beside it, whose last "
    assert note + "checkpoint will be last-v1.ckpt. To go on with the earlier run, give --ckpt_path last" in caplog.text
    assert cli.trainer.global_step == 2 and load_checkpoint(folder / "last-v1.ckpt")["global_step"] == 2
    assert not [w for w in caught if "exists and is not empty" in str(w.message)]
    with warnings.catch_warnings(record=True) as caught:  # resuming: the run's folder holds its files, as it should
        warnings.simplefilter("always")
        _tiny_fit(tmp_path / "run", cache, "--trainer.max_steps", "4", "--ckpt_path", "last")
    assert not [w for w in caught if "exists and is not empty" in str(w.message)]


def test_ckpt_path_last_in_a_folder_without_a_run_says_a_new_run_starts(cache: Path, tmp_path: Path, caplog) -> None:
    """A job script's first start: Lightning warned 'HINT: Set ModelCheckpoint(..., save_last=True)', which it is."""
    import logging
    import warnings

    with caplog.at_level(logging.INFO), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli = _tiny_fit(tmp_path / "run", cache, "--trainer.max_steps", "2", "--ckpt_path", "last")
    assert (
        f"note: --ckpt_path last: no last.ckpt in {tmp_path / 'run' / 'checkpoints'} yet, so a new run" in caplog.text
    )
    assert not [w for w in caught if "there is no last checkpoint" in str(w.message)]
    assert cli.trainer.global_step == 2


def test_a_runs_config_yaml_given_again_with_another_run_folder_writes_there(cache: Path, tmp_path: Path) -> None:
    """A run's config.yaml, given again with `--trainer.default_root_dir` (a rerun with another seed), writes that
    run's checkpoints and TensorBoard logs into the new folder: the file keeps the run-folder placeholder where the
    configs had it (it held the first run's paths, so the rerun went on in the first run's folder as last-v1.ckpt
    and version_1). A folder given explicitly stays as given."""
    import contextlib
    import io

    from lit_transformer.cli.lightning_cli import run_cli

    def fit(*args: str) -> None:
        common = ["--trainer.enable_progress_bar", "false", "--data.init_args.cache_dir", str(cache)]
        common += ["--trainer.max_steps", "2", "--trainer.limit_val_batches", "0", "--attention.max_layers", "0"]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            run_cli(["fit", *args, *common, "--samples.prompts", "[]"])

    first = tmp_path / "first"
    fit("--config", str(REPO / "configs" / "presets" / "tiny.yaml"), "--trainer.default_root_dir", str(first))
    saved = first / "tensorboard" / "version_0" / "config.yaml"
    fit("--config", str(saved), "--trainer.default_root_dir", str(tmp_path / "again"), "--seed_everything", "7")
    assert sorted(p.name for p in (first / "checkpoints").iterdir()) == ["last.ckpt"]
    assert sorted(p.name for p in (first / "tensorboard").iterdir()) == ["version_0"]
    assert load_checkpoint(tmp_path / "again" / "checkpoints" / "last.ckpt")["global_step"] == 2
    assert (tmp_path / "again" / "tensorboard" / "version_0" / "config.yaml").is_file()

    explicit = tmp_path / "kept"
    fit(
        "--config",
        str(saved),
        "--trainer.default_root_dir",
        str(tmp_path / "third"),
        "--checkpoint.dirpath",
        str(explicit),
    )
    assert (explicit / "last.ckpt").is_file()
    text = (tmp_path / "third" / "tensorboard" / "version_0" / "config.yaml").read_text()
    assert f"dirpath: {explicit}\n" in text and "save_dir: ${trainer.default_root_dir}\n" in text


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(path)["state_dict"]


def test_a_run_killed_during_a_validation_runs_it_when_resumed(cache: Path, tmp_path: Path) -> None:
    """Lightning writes last.ckpt before the validation of its step; a run killed during that validation (here the
    final one) resumed past it as if it had run: no val numbers at that step and a best checkpoint of the earlier
    validation. Resumed, it validates first: the same best checkpoint, score and record as a run never killed."""
    from _interrupt import Crash

    args = ("--trainer.max_steps", "8")
    reference = _best(_tiny_fit(tmp_path / "reference", cache, *args))
    crash = ("--trainer.callbacks+=_interrupt.CrashDuringValidation", "--trainer.callbacks.step", "8")
    with pytest.raises(Crash):
        _tiny_fit(tmp_path / "run", cache, *args, *crash)
    cli = _tiny_fit(tmp_path / "run", cache, *args, "--ckpt_path", "last")
    best = _best(cli)
    assert (
        Path(best.best_model_path).name
        == Path(reference.best_model_path).name
        == "best-step000008-val_nll" + (f"{reference.best_model_score.item():.3f}.ckpt")
    )
    assert best.best_model_score.item() == pytest.approx(reference.best_model_score.item(), abs=1e-6)
    record = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")["callbacks"]
    assert any(state.get("best_model_path") == best.best_model_path for state in record.values())
    # Killed again after that validation, a resume does not validate the step twice.
    again = _tiny_fit(tmp_path / "run", cache, *args, "--ckpt_path", "last")
    assert "val/nll" not in again.trainer.callback_metrics


# Two batches a step, a validation every 3 batches: the validation after batch 8 falls between the two batches of
# step 5, after last.ckpt was written at step 4 (every 2 steps: at batch 7).
ACCUMULATED = ("--trainer.accumulate_grad_batches", "2", "--trainer.val_check_interval", "3")
ACCUMULATED += ("--trainer.max_steps", "8")


@pytest.fixture(scope="module")
def accumulated_reference(cache: Path, tmp_path_factory) -> Path:
    """The uninterrupted run the three interruptions below are compared with: the same run each time (only read
    there), so trained once."""
    reference = tmp_path_factory.mktemp("accumulated_reference")
    _tiny_fit(reference, cache, *ACCUMULATED)
    return reference


@pytest.mark.parametrize(
    "interrupt",
    [
        ("--trainer.callbacks+=_interrupt.CrashAtBatch", "--trainer.callbacks.batch", "9"),
        ("--trainer.callbacks+=_interrupt.SignalAtBatch", "--trainer.callbacks.batch", "8"),
        ("--trainer.callbacks+=_interrupt.SignalAtBatch", "--trainer.callbacks.batch", "9"),
    ],
    ids=["crash-after-a-validation-between-batches", "sigterm-between-batches-of-a-step", "sigterm-at-a-steps-end"],
)
def test_a_run_with_accumulated_steps_resumes_exactly(
    cache: Path, accumulated_reference: Path, tmp_path: Path, interrupt: tuple[str, ...]
) -> None:
    """With accumulate_grad_batches, a checkpoint written between the batches of one step (last.ckpt again after a
    validation there; the preemption checkpoint of a SIGTERM there) held the step's state without the gradients
    gathered so far: the resumed run lost them and went on on other weights. Checkpoints are written where a step
    ends, so the run resumed from any of these interruptions ends on the weights of a run never interrupted."""
    from _interrupt import Crash

    with pytest.raises((Crash, SystemExit)):
        _tiny_fit(tmp_path / "run", cache, *ACCUMULATED, *interrupt)
    _tiny_fit(tmp_path / "run", cache, *ACCUMULATED, "--ckpt_path", "last")
    expected = _weights(accumulated_reference / "checkpoints" / "last.ckpt")
    found = _weights(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")["global_step"] == 8
    assert all(torch.equal(found[key], value) for key, value in expected.items())


@pytest.mark.parametrize("stop", [("--trainer.max_steps", "7"), ("--trainer.max_time", "00:00:00:03")])
def test_last_ckpt_holds_the_final_step_whatever_the_interval(
    cache: Path, tmp_path: Path, stop: tuple[str, str]
) -> None:
    """last.ckpt is written every 2 steps here; a run that ends between two (max_steps 7, or a time box) kept the
    model of the last multiple under the name of the final one, and lost the steps after it."""
    timed = ("--trainer.max_steps", "-1", "--model.optim.schedule_steps", "100000") if "max_time" in stop[0] else ()
    cli = _tiny_fit(tmp_path, cache, *timed, *stop)
    steps = cli.trainer.global_step
    assert steps >= 3
    assert load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")["global_step"] == steps


LONGER = ("--model.config.dropout", "0.1", "--model.optim.schedule_steps", "12")


@pytest.fixture(scope="module")
def longer_reference(cache: Path, tmp_path_factory) -> Path:
    """The 12-step run never stopped that both finished runs below, trained on to 12 steps, must match: the same run
    for both (only read there), so trained once."""
    reference = tmp_path_factory.mktemp("longer_reference")
    _tiny_fit(reference, cache, *LONGER, "--trainer.max_steps", "12")
    return reference


@pytest.mark.parametrize(
    "stop",
    [("--trainer.max_steps", "7"), ("--trainer.max_steps", "8", "--checkpoint.every_n_train_steps", "3")],
    ids=["between-saves", "validated"],
)
def test_a_finished_run_trained_longer_goes_on_as_a_run_never_stopped(
    cache: Path, longer_reference: Path, tmp_path: Path, stop: tuple[str, ...]
) -> None:
    """The final step's last.ckpt (max_steps 7, no multiple of the interval of 2; or 8, validated, every 3) was written in
    on_train_end, after Lightning had closed the epoch the run stopped in: resumed with a larger max_steps, the run
    counted one epoch more than a run never stopped (a max_epochs ended it an epoch early) and, with dropout seeded by
    the epoch, trained on other masks. Resumed from it, the run ends on the weights of a run never stopped."""
    _tiny_fit(tmp_path / "run", cache, *LONGER, *stop)
    final = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert (final["global_step"], final["epoch"]) == (int(stop[1]), 0)
    _tiny_fit(tmp_path / "run", cache, *LONGER, "--trainer.max_steps", "12", "--ckpt_path", "last")
    expected = _weights(longer_reference / "checkpoints" / "last.ckpt")
    found = _weights(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert all(torch.equal(found[key], value) for key, value in expected.items())


def test_a_run_resumed_from_a_checkpoint_written_before_its_validation_validates_first(
    cache: Path, tmp_path: Path, caplog
) -> None:
    """SIGTERM during the batch after which step 4 is validated: the preemption checkpoint is written at that batch's
    end, before the validation. Resumed from it, the run validates step 4 first (Lightning went on past it): it keeps
    the same best checkpoints as a run never stopped."""
    import logging

    args = ("--trainer.max_steps", "8", "--best_checkpoint.save_top_k", "2")
    _tiny_fit(tmp_path / "reference", cache, *args)
    signal_at = ("--trainer.callbacks+=_interrupt.SignalAtBatch", "--trainer.callbacks.batch", "3")
    with pytest.raises(SystemExit):
        _tiny_fit(tmp_path / "run", cache, *args, *signal_at)
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")["global_step"] == 4
    with caplog.at_level(logging.INFO):
        _tiny_fit(tmp_path / "run", cache, *args, "--ckpt_path", "last")
    assert "written before the validation of step 4" in caplog.text
    names = sorted(p.name for p in (tmp_path / "reference" / "checkpoints").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert any(name.startswith("best-step000004") for name in names), names


def test_a_resume_with_another_schedule_length_says_the_learning_rate_jumps(
    cache: Path, tmp_path: Path, caplog
) -> None:
    """A finished 6-step cosine run resumed with max_steps 10 follows the 10-step schedule from step 6: its learning
    rate rises from the decayed one, which nothing said. A note names both rates and the flag that keeps the
    earlier schedule, which then goes on without a note."""
    import logging

    _tiny_fit(tmp_path / "run", cache, "--trainer.max_steps", "6")
    with caplog.at_level(logging.INFO):
        _tiny_fit(tmp_path / "run", cache, "--trainer.max_steps", "10", "--ckpt_path", "last")
    note = "note: the cosine schedule decays over 10 optimizer steps in this run, and decayed over 6 in the run resumed"
    assert note in caplog.text and "--model.optim.schedule_steps 6" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO):
        _tiny_fit(tmp_path / "run", cache, "--trainer.max_steps", "12", "--ckpt_path", "last",
                  "--model.optim.schedule_steps", "10")  # fmt: skip
    assert "schedule decays over" not in caplog.text


def test_a_cosine_schedule_longer_than_the_epochs_allow_is_said(cache: Path, tmp_path: Path, caplog) -> None:
    """max_epochs 2 of 6 batches, 4 accumulated a step (a step at batches 4 and 6: 2 a epoch), ends the run after 4
    optimizer steps; the cosine schedule, sized by max_steps 100, had then barely left its warmup, and nothing said.
    A note names both lengths and the flag that sizes the schedule to the run."""
    import logging

    epochs = ("--trainer.max_epochs", "2", "--trainer.limit_train_batches", "6")
    epochs += ("--trainer.accumulate_grad_batches", "4")
    with caplog.at_level(logging.INFO):
        cli = _tiny_fit(tmp_path / "run", cache, "--trainer.max_steps", "100", *epochs)
    assert cli.trainer.global_step == 4
    note = "note: the cosine schedule decays over 100 optimizer steps, and trainer.max_epochs=2 ends the run after 4"
    assert note in caplog.text and "--model.optim.schedule_steps 4" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO):
        _tiny_fit(tmp_path / "sized", cache, "--trainer.max_steps", "4", *epochs)
    assert "ends the run after" not in caplog.text


def test_a_run_preempted_before_its_first_save_resumes_into_last_ckpt(cache: Path, tmp_path: Path) -> None:
    """SIGTERM at step 4, before the first every_n_train_steps save: resumed, the run wrote its later checkpoints as
    last-v1.ckpt (Lightning found a last.ckpt outside its record), and last.ckpt stayed at step 4."""
    args = ("--trainer.max_steps", "8", "--checkpoint.every_n_train_steps", "100")
    signal_at = ("--trainer.callbacks+=_interrupt.SignalAtBatch", "--trainer.callbacks.batch", "3")
    with pytest.raises(SystemExit):
        _tiny_fit(tmp_path, cache, *args, *signal_at)
    _tiny_fit(tmp_path, cache, *args, "--ckpt_path", "last")
    assert not list((tmp_path / "checkpoints").glob("last-v*.ckpt"))
    assert load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")["global_step"] == 8


def _logged_steps(root: Path, tag: str) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    steps = set()
    for events in root.glob("tensorboard/version_*/events.*"):
        accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})
        accumulator.Reload()
        if tag in accumulator.Tags()["scalars"]:
            steps |= {event.step for event in accumulator.Scalars(tag)}
    return sorted(steps)


def test_a_preempted_run_logs_the_step_it_stopped_at(cache: Path, tmp_path: Path) -> None:
    """The preemption checkpoint ends the run inside on_train_batch_end, before Lightning logs that step's metrics:
    each preemption left a one-step hole in TensorBoard's train/loss. Preempted and resumed, the run logs every
    step an uninterrupted one logs."""
    import contextlib
    import io

    from lit_transformer.cli.lightning_cli import run_cli

    def fit(folder: Path, *extra: str) -> None:
        args = ["fit", "--config", str(REPO / "configs" / "presets" / "tiny.yaml"), "--trainer.max_steps", "8"]
        args += ["--trainer.default_root_dir", str(folder), "--data.init_args.cache_dir", str(cache)]
        args += [
            "--trainer.log_every_n_steps",
            "1",
            "--trainer.limit_val_batches",
            "0",
            "--trainer.enable_progress_bar",
        ]
        args += ["false", "--samples.prompts", "[]", "--attention.max_layers", "0", *extra]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            run_cli(args)

    fit(tmp_path / "reference")
    with pytest.raises(SystemExit):
        fit(tmp_path / "run", "--trainer.callbacks+=_interrupt.SignalAtBatch", "--trainer.callbacks.batch", "3")
    fit(tmp_path / "run", "--ckpt_path", "last")
    expected = _logged_steps(tmp_path / "reference", "train/loss")
    assert len(expected) == 8 and _logged_steps(tmp_path / "run", "train/loss") == expected


@pytest.fixture(scope="module")
def source_checkpoint(cache: Path, tmp_path_factory) -> str:
    """A 2-step run's last.ckpt, the weights both init_from tests below start from (only read there)."""
    source = tmp_path_factory.mktemp("source")
    _tiny_fit(source, cache, "--trainer.max_steps", "2")
    return str(source / "checkpoints" / "last.ckpt")


def test_init_from_names_the_architecture_flags_its_weights_replace(
    cache: Path, source_checkpoint: str, tmp_path: Path, caplog
) -> None:
    """`--model.init_from` of a 2-layer checkpoint with `--model.config.n_layers 4` trained 2 layers without a word
    (the weights fix the architecture): a note names the setting and the weights' value; none where they agree."""
    import logging

    source = source_checkpoint
    with caplog.at_level(logging.INFO):
        cli = _tiny_fit(tmp_path / "a", cache, "--trainer.max_steps", "2", "--model.init_from", source,
                        "--model.config.n_layers", "4")  # fmt: skip
    assert cli.model.config.n_layers == 2
    assert f"note: --model.init_from {source}: the architecture is that of the weights" in caplog.text
    assert "model.config.n_layers 4 (its: 2)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO):
        _tiny_fit(tmp_path / "b", cache, "--trainer.max_steps", "2", "--model.init_from", source)
    assert "the architecture is that of the weights" not in caplog.text


def test_init_from_with_another_tokenizer_names_the_flag_that_fixes_it(
    cache: Path, source_checkpoint: str, tmp_path: Path
) -> None:
    """Data whose tokenizer is larger than the weights' vocabulary met the vocabulary check first, whose advice
    (checkpoint['tokenizer']) names no flag; the init_from check, which names `--data.init_args.tokenizer`, now comes
    first, and no longer speaks of an encoder for a decoder-only model."""
    from lit_transformer.errors import ConfigError

    source = source_checkpoint
    other = ("--data.init_args.tokenizer", "byte_bpe", "--data.init_args.vocab_size", "512")
    with pytest.raises(
        ConfigError,
        match=f"its embeddings would meet other ids. Use its tokenizer: --data.init_args.tokenizer {source}",
    ):
        _tiny_fit(tmp_path / "a", cache, "--trainer.max_steps", "2", "--model.init_from", source, *other)


def test_a_validation_inside_an_accumulated_step_is_said_and_no_shipped_config_has_one() -> None:
    """Lightning counts val_check_interval in batches: llama-small's 50 with 8 accumulated batches validated after
    6.25 optimizer steps, so its best checkpoints were written between the micro-batches of a step (resumed from, a
    step ran on part of its batches). A config that does so gets a note; no shipped one does."""
    import yaml

    from lit_transformer.checkpoints.run_checkpoint import mid_step_validation_note

    note = mid_step_validation_note(50, 8)
    assert note and "after 6.25 steps" in note and "(48 or 56)" in note
    assert mid_step_validation_note(48, 8) is None and mid_step_validation_note(0.5, 8) is None
    assert mid_step_validation_note(3, 1) is None
    root = Path(__file__).resolve().parents[1] / "configs"
    for path in root.rglob("*.yaml"):
        trainer = (yaml.safe_load(path.read_text()) or {}).get("trainer") or {}
        interval, accumulate = trainer.get("val_check_interval"), trainer.get("accumulate_grad_batches") or 1
        if isinstance(trainer, dict) and isinstance(interval, int):
            assert mid_step_validation_note(interval, accumulate) is None, path


@pytest.mark.parametrize("layout", ["deepspeed", "fsdp"])
def test_a_sharded_checkpoint_folder_is_named_with_the_command_that_makes_one_file(tmp_path: Path, layout) -> None:
    """DeepSpeed (configs/trainer/deepspeed.yaml) and FSDP with state_dict_type sharded save last.ckpt as a folder of
    shards: generate, export and average refused it as "a folder without a config.json, not a model: give a .ckpt
    file written by fit" (it is one). Each names what the folder is and Lightning's command that makes one file."""
    from lit_transformer.cli.model_commands import generate_main
    from lit_transformer.errors import UserError

    folder = tmp_path / "checkpoints" / "last.ckpt"
    if layout == "deepspeed":
        (folder / "checkpoint").mkdir(parents=True)
        (folder / "latest").write_text("checkpoint\n")
        command = "convert_zero_checkpoint_to_fp32_state_dict"
    else:
        folder.mkdir(parents=True)
        (folder / "__0_0.distcp").write_bytes(b"\0")
        command = "python -m lightning.pytorch.utilities.consolidate_checkpoint"
    with pytest.raises(UserError, match=command):
        load_checkpoint(folder)
    with pytest.raises(UserError, match=command):
        generate_main(["--checkpoint", str(folder), "--prompt", "hi"])


def test_resuming_last_from_a_sharded_folder_is_refused_not_started_afresh(tmp_path: Path, capsys) -> None:
    """`--ckpt_path last` looked for last*.ckpt files only: a DeepSpeed run's last.ckpt folder was not found, and a
    requeued job "resumed" from scratch with a note that there was no checkpoint yet. The folder is found, and named
    as what it is."""
    from lit_transformer.checkpoints.run_checkpoint import last_checkpoint
    from lit_transformer.cli.lightning_cli import main

    folder = tmp_path / "checkpoints" / "last.ckpt"
    (folder / "checkpoint").mkdir(parents=True)
    (folder / "latest").write_text("checkpoint\n")
    assert last_checkpoint(tmp_path / "checkpoints") == str(folder)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", "presets/tiny", "--trainer.default_root_dir", str(tmp_path), "--ckpt_path", "last"])
    assert exit_info.value.code not in (0, None)
    assert "is a DeepSpeed checkpoint" in capsys.readouterr().err


def test_scoring_a_last_ckpt_beside_a_newer_run_says_which_file_is_newer(cache: Path, tmp_path: Path, caplog) -> None:
    """A second fit in a run folder ends at last-v1.ckpt; the pages' `test --ckpt_path runs/NAME/checkpoints/last.ckpt`
    run after it (docs/translation.md's and classification.md's recorded fit, then test) scored the earlier run's
    model without a word. It says so now, naming the newer file and `--ckpt_path last`, which picks it."""
    import contextlib
    import io
    import logging

    from lit_transformer.cli.lightning_cli import run_cli

    folder = tmp_path / "run" / "checkpoints"
    for _ in range(2):
        _tiny_fit(tmp_path / "run", cache, "--trainer.max_steps", "2")
    assert {p.name for p in folder.glob("last*.ckpt")} == {"last.ckpt", "last-v1.ckpt"}
    args = ["test", "--config", str(REPO / "configs" / "presets" / "tiny.yaml"), "--trainer.logger", "false"]
    args += ["--trainer.enable_progress_bar", "false", "--data.init_args.cache_dir", str(cache)]
    args += ["--trainer.default_root_dir", str(tmp_path / "run"), "--checkpoint.dirpath", str(folder)]
    with caplog.at_level(logging.INFO), contextlib.redirect_stdout(io.StringIO()):
        run_cli([*args, "--ckpt_path", str(folder / "last.ckpt")])
    note = f"note: {folder / 'last.ckpt'} is the last checkpoint of the folder's earlier run; a later fit there wrote "
    assert note + f"last-v1.ckpt, which is newer: --ckpt_path last (or --ckpt_path {folder / 'last-v1.ckpt'})" in (
        caplog.text
    )
    caplog.clear()
    with caplog.at_level(logging.INFO), contextlib.redirect_stdout(io.StringIO()):
        run_cli([*args, "--ckpt_path", "last"])  # the newer one: nothing to say
    assert "earlier run" not in caplog.text


def test_an_early_stop_deferred_by_min_steps_does_not_write_last_ckpt_every_step(
    cache: Path, tmp_path: Path, monkeypatch
) -> None:
    """EarlyStopping sets trainer.should_stop at step 4, and min_steps 16 keeps the run going (Lightning leaves the flag
    set): the final step's save took the flag for the run's end and wrote last.ckpt after every later step. It is
    written at the interval (every 2 steps) and at the run's end, as without the stop signal."""
    from lit_transformer.checkpoints.run_checkpoint import RunCheckpoint

    saved: list[int] = []
    original = RunCheckpoint._save_last_checkpoint

    def spy(self, trainer, candidates):
        if self.save_last is True:
            saved.append(trainer.global_step)
        return original(self, trainer, candidates)

    monkeypatch.setattr(RunCheckpoint, "_save_last_checkpoint", spy)
    stop = ("--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor", "val/loss")
    stop += ("--trainer.callbacks.stopping_threshold", "100")  # met at the first validation
    cli = _tiny_fit(tmp_path / "run", cache, "--trainer.max_steps", "9", "--trainer.min_steps", "9", *stop)
    assert cli.trainer.should_stop and cli.trainer.global_step == 9  # signalled, and trained on to min_steps
    assert sorted(set(saved)) == [2, 4, 6, 8, 9]  # not 5 and 7 as well
