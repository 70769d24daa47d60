"""Non-finite steps are skipped and bounded, preemption saves and exits cleanly, resume draws the same randomness."""

from __future__ import annotations

import importlib.util
import math
import signal
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from lit_transformer.checkpoints.files import load_checkpoint, non_finite_tensors
from lit_transformer.engine.devices import DeviceOptionError, check_device_options
from lit_transformer.engine.nonfinite_guard import NonFiniteLossError, NonFiniteLossGuard
from lit_transformer.engine.step_seed import StepSeed, step_seed

TESTS = Path(__file__).parent
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))
import _boring  # noqa: E402
from _forked import HARNESS_ENV, WarmProcess, warm_python  # noqa: E402

ENV = HARNESS_ENV


def _records(root: Path) -> dict[int, dict]:
    import json

    return {entry["step"]: entry for entry in map(json.loads, (root / "losses.jsonl").read_text().splitlines())}


def _fit(root: Path, max_steps: int, module: pl.LightningModule | None = None, ckpt_path=None, **kwargs) -> pl.Trainer:
    pl.seed_everything(7, verbose=False)
    trainer = _boring.make_trainer(root, max_steps, **kwargs)
    trainer.fit(module or _boring.TinyModule(), ckpt_path=ckpt_path)
    return trainer


@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
@pytest.mark.parametrize("accumulate", [1, 2])
def test_a_non_finite_step_is_skipped_counted_and_training_goes_on(tmp_path: Path, accumulate: int, fused) -> None:
    """foreach: the guard reads its flag and drops the gradients; fused: the kernel skips the step on the device."""
    module = _boring.TinyModule(nan_at=(3,), fused=fused)
    trainer = _fit(tmp_path, 6, module, accumulate_grad_batches=accumulate)
    guard = next(cb for cb in trainer.callbacks if isinstance(cb, NonFiniteLossGuard))
    records = _records(tmp_path)
    assert guard.skipped == 1 and guard.consecutive == 0
    assert records[4]["weights"] == records[3]["weights"]  # the step from 3 to 4 changed nothing
    assert records[5]["weights"] != records[4]["weights"] and math.isfinite(records[6]["weights"])
    assert trainer.global_step == 6
    # The optimizer did not count the skipped step (Adam's bias correction stays that of 5 real steps).
    optimizer = trainer.optimizers[0]
    assert all(float(optimizer.state[p]["step"]) == 5 for p in module.parameters())
    assert not hasattr(optimizer, "found_inf")


@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
def test_too_many_non_finite_steps_stop_with_a_clear_error_and_keep_good_weights(tmp_path: Path, fused) -> None:
    with pytest.raises(NonFiniteLossError, match="NaN/inf for 3 optimizer steps in a row") as error:
        _fit(tmp_path, 20, _boring.TinyModule(nan_from=4, fused=fused), max_consecutive=3)
    assert "steps 4..6" in str(error.value)
    checkpoint = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert not non_finite_tensors(checkpoint["state_dict"])
    assert _records(tmp_path)[checkpoint["global_step"]]["weights"] == _records(tmp_path)[4]["weights"]


def test_counts_read_every_n_steps_still_stop_at_the_longest_run(tmp_path: Path) -> None:
    """Read every 5 steps (as on a GPU, at the logging interval): a run of 3 bad steps that ended before the read
    still stops the run, and the message names it; the weights never took those steps."""
    module = _boring.TinyModule(nan_at=(1, 2, 3), fused=True)
    trainer = _boring.make_trainer(tmp_path, 20)
    guard = next(cb for cb in trainer.callbacks if isinstance(cb, NonFiniteLossGuard))
    guard.check_every_n_steps = 5
    with pytest.raises(NonFiniteLossError, match=r"3 optimizer steps in a row \(steps 1\.\.3; 3 skipped"):
        trainer.fit(module)
    assert trainer.global_step == 4  # stopped at the first read, before the fifth step
    records = _records(tmp_path)
    assert records[1]["weights"] == records[4]["weights"]  # steps 1, 2 and 3 changed nothing


@pytest.mark.parametrize("stop_at", [5, 16, 21])  # mid-epoch, on the last batch of an epoch, mid second epoch
def test_resume_reproduces_every_loss_with_step_seeding(tmp_path: Path, stop_at: int) -> None:
    _fit(tmp_path / "full", 24)
    _fit(tmp_path / "cut", stop_at)
    _fit(tmp_path / "cut", 24, ckpt_path="last")
    full, resumed = _boring.read_losses(tmp_path / "full"), _boring.read_losses(tmp_path / "cut")
    assert sorted(resumed) == sorted(full) == list(range(1, 25))
    assert max(abs(full[s] - resumed[s]) for s in full) <= 1e-6


def test_without_step_seeding_dropout_diverges_after_resume(tmp_path: Path, monkeypatch) -> None:
    # The control for the test above: Lightning checkpoints hold no RNG state, so dropout masks differ on resume.
    monkeypatch.setattr(StepSeed, "on_train_batch_start", lambda *args: None)
    _fit(tmp_path / "full", 10)
    _fit(tmp_path / "cut", 5)
    _fit(tmp_path / "cut", 10, ckpt_path="last")
    full, resumed = _boring.read_losses(tmp_path / "full"), _boring.read_losses(tmp_path / "cut")
    assert max(abs(full[s] - resumed[s]) for s in range(6, 11)) > 1e-4


def _start(args: list[str]) -> WarmProcess:
    """`python tests/_boring.py ARGS`, a process forked from a warm interpreter (tests/_forked.py)."""
    return warm_python(ENV).popen(
        [sys.executable, str(TESTS / "_boring.py"), *args],
        cwd=REPO,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(process: WarmProcess, marker: str) -> None:
    for line in process.stdout:
        if line.strip() == marker:
            return
    raise AssertionError(f"ended before {marker!r}: {process.wait()} {process.stderr.read()[-2000:]}")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_preemption_signal_saves_a_checkpoint_and_exits_cleanly(tmp_path: Path, signum: int) -> None:
    process = _start([str(tmp_path / "cut"), "--max-steps", "200", "--sleep", "0.1"])
    _wait_for(process, "STEP 3")
    process.send_signal(signum)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err[-2000:]
    assert "DONE" not in out  # fit did not run to max_steps
    checkpoint = load_checkpoint(tmp_path / "cut" / "checkpoints" / "last.ckpt")
    recorded = _boring.read_losses(tmp_path / "cut")
    assert checkpoint["global_step"] == max(recorded) >= 3  # saved after the last step it ran

    # Resuming continues with exactly the losses of an uninterrupted run.
    _fit(tmp_path / "cut", 12, ckpt_path="last")
    _fit(tmp_path / "full", 12)
    full, resumed = _boring.read_losses(tmp_path / "full"), _boring.read_losses(tmp_path / "cut")
    assert sorted(resumed) == sorted(full) and max(abs(full[s] - resumed[s]) for s in full) <= 1e-6


def test_step_seeds_differ_by_every_coordinate() -> None:
    seeds = {step_seed(s, e, b, r) for s in (0, 1) for e in (0, 1) for b in (0, 1, 2) for r in (0, 1)}
    assert len(seeds) == 24 and all(0 <= s < 2**63 for s in seeds)
    assert step_seed(3, 1, 2, 0) == step_seed(3, 1, 2, 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a GPU")
class TestDeviceOptions:
    @pytest.mark.parametrize("strategy", ["fsdp", "deepspeed_stage_2", "FSDPStrategy"])
    def test_gpu_only_strategy_on_cpu_names_the_option_and_the_fix(self, strategy: str) -> None:
        with pytest.raises(DeviceOptionError, match=rf"trainer.strategy='{strategy}'.*--trainer.strategy=ddp"):
            check_device_options(strategy=strategy)

    @pytest.mark.parametrize(
        "strategy", ["lightning.pytorch.strategies.ModelParallelStrategy", "ModelParallelStrategy"]
    )
    def test_model_parallel_is_refused_since_the_model_shards_nothing(self, strategy: str) -> None:
        # It trained on 2 CPU processes with no gradient exchange: the ranks' weights differed after the first step.
        with pytest.raises(DeviceOptionError, match=rf"trainer.strategy='{strategy}'.*no gradients exchanged.*ddp"):
            check_device_options(accelerator="cpu", strategy=strategy)

    @pytest.mark.parametrize("strategy", ["xla", "single_xla", "xla_debug", "lightning.pytorch.strategies.XLAStrategy"])
    def test_xla_strategy_without_torch_xla_is_one_line(self, strategy: str) -> None:
        if importlib.util.find_spec("torch_xla") is not None:
            pytest.skip("torch_xla is installed")
        with pytest.raises(DeviceOptionError, match=rf"trainer.strategy='{strategy}' needs a TPU with torch_xla"):
            check_device_options(accelerator="cpu", strategy=strategy)

    def test_gpu_accelerator_without_a_gpu(self) -> None:
        with pytest.raises(DeviceOptionError, match="trainer.accelerator='gpu' needs a CUDA GPU"):
            check_device_options(accelerator="gpu")

    def test_half_precision_on_cpu_warns_but_runs(self) -> None:
        with pytest.warns(UserWarning, match="far slower than fp32"):
            check_device_options(precision="bf16-mixed")

    @pytest.mark.parametrize("strategy", ["auto", "ddp", "ddp_spawn"])
    def test_cpu_options_pass(self, strategy: str, recwarn) -> None:
        check_device_options(accelerator="cpu", strategy=strategy, precision="32-true")
        assert not [w for w in recwarn if "slower" in str(w.message)]


def _stopped(process: WarmProcess) -> tuple[str, str]:
    """The process's output once it ended; a process still running after a minute is a hang: killed, and a failure.
    (A minute, not seconds: the machine may be loaded. A process that waited for a step boundary would sleep 600 s.)"""
    try:
        return process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise AssertionError(f"still running a minute after the signal: {out[-1000:]} {err[-2000:]}") from None


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_before_the_first_step_ends_the_run_now_with_a_message(tmp_path: Path, signum: int) -> None:
    """The first step takes minutes (a compiled step being built): no step boundary comes to save at, and nothing
    is there to save, so the process ends at once with exit status 128 + signum, as a shell reports a signal."""
    process = _start([str(tmp_path), "--max-steps", "5", "--block-at-step", "0"])
    _wait_for(process, "BLOCKED")
    process.send_signal(signum)
    out, err = _stopped(process)
    assert process.returncode == 128 + signum, err[-2000:]
    assert f"Received {signal.Signals(signum).name} before the first optimizer step: stopping now" in err
    assert "STEP" not in out and not (tmp_path / "checkpoints" / "last.ckpt").exists()


def test_a_second_signal_ends_the_run_at_once_even_in_a_step_that_does_not_end(tmp_path: Path) -> None:
    """After the first step a signal asks for a checkpoint at the step's end; a second one must not wait for it."""
    process = _start([str(tmp_path), "--max-steps", "50", "--block-at-step", "3"])
    _wait_for(process, "BLOCKED")
    process.send_signal(signal.SIGTERM)
    for line in process.stderr:  # the first signal is acknowledged: the checkpoint waits for the end of the step
        if line.startswith("Received SIGTERM: saving"):
            break
    process.send_signal(signal.SIGTERM)
    _stopped(process)
    assert process.returncode == -signal.SIGTERM  # ended by the signal itself, as the OS ends a process
    assert _boring.read_losses(tmp_path) and max(_boring.read_losses(tmp_path)) == 3  # it never finished step 4


BLOCKED_PREPARE = """
import sys, time
import lit_transformer.data.language_modeling as language_modeling

def blocked(*args, **kwargs):  # a corpus that takes minutes to prepare, in Python as preparation runs
    print("BLOCKED", flush=True)
    for _ in range(6000):  # not one sleep(600): a signal that the kernel hands to another of the process's threads
        time.sleep(0.1)    # would not wake it, and Python runs handlers only between bytecodes

language_modeling.prepare_corpus = blocked
from lit_transformer.cli import main
main()
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_while_fit_prepares_data_ends_the_command_with_a_message(tmp_path: Path, signum: int) -> None:
    script = tmp_path / "fit_blocked.py"
    script.write_text(BLOCKED_PREPARE)
    config = REPO / "configs" / "presets" / "tiny.yaml"
    args = ["fit", "--config", str(config), "--trainer.default_root_dir", str(tmp_path), "--trainer.logger", "false"]
    args += ["--checkpoint.dirpath", str(tmp_path / "checkpoints"), "--data.init_args.cache_dir", str(tmp_path / "c")]
    process = warm_python(ENV).popen(
        [sys.executable, str(script), *args], cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    _wait_for(process, "BLOCKED")
    process.send_signal(signum)
    _, err = _stopped(process)
    assert process.returncode == 128 + signum, err[-2000:]
    assert f"Received {signal.Signals(signum).name} before training started: stopping now" in err
