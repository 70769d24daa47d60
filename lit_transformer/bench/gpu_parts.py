"""Two parts of `scripts/gpu_check.sh` that time nothing by hand: each prints one JSON row on its last line.

    # the shipped preset as a user runs it: the rate TokenThroughputMonitor logs, over N optimizer steps
    python -m lit_transformer bench gpu-parts preset-rate -- --config configs/presets/gpt2-small.yaml --trainer.max_steps 200 ...
    # a strategy: fit N steps saving at N/2, resume from there in a new process, compare the losses of the second half
    python -m lit_transformer bench gpu-parts resume --steps 10 -- --config configs/presets/gpt2-small.yaml --config configs/trainer/fsdp.yaml ...

The fit's own arguments follow `--`.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from jsonargparse.typing import PositiveInt

from lit_transformer.cli.arguments import chosen, command_parser, parse, split_passed_on, subcommand_parser
from lit_transformer.errors import ConfigError
from lit_transformer.records import child_env


def _peak_memory_gb() -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None


def preset_rate(fit_args: list[str]) -> dict:
    """Fit with the given arguments and read the throughput monitor's logged tokens/s at every logging step.

    The first logged window holds the compilation, so it is left out of the median; flatness is the mean rate of the
    last quarter of the windows over that of the first quarter (1.0: flat; below: the run slows down)."""
    import lightning as L

    from lit_transformer.cli.lightning_cli import run_cli
    from lit_transformer.engine.monitoring import TokenThroughputMonitor

    rates: list[tuple[int, float]] = []

    class Rates(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, *args) -> None:
            monitor = next(c for c in trainer.callbacks if isinstance(c, TokenThroughputMonitor))
            rate = monitor.tokens_per_sec
            if rate is not None and (not rates or rates[-1][1] != rate):
                rates.append((trainer.global_step, rate))

    cli = run_cli(fit_args, run=False)
    cli.trainer.callbacks.append(Rates())
    with GpuClocks() as clocks:
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    steady = [rate for _, rate in rates[1:]]
    if len(steady) < 4:
        raise SystemExit(f"only {len(rates)} logged rates: log more often (--trainer.log_every_n_steps) or run longer")
    quarter = max(1, len(steady) // 4)
    first, last = statistics.mean(steady[:quarter]), statistics.mean(steady[-quarter:])
    return {
        "label": "gpt2-small preset as shipped: logged train/device/items_per_sec",
        "optimizer_steps": cli.trainer.global_step,
        "accumulate_grad_batches": cli.trainer.accumulate_grad_batches,
        "logged_rates": len(rates),
        "median_tokens_per_s": statistics.median(steady),
        "first_quarter_tokens_per_s": first,
        "last_quarter_tokens_per_s": last,
        "flatness": last / first,
        "rates": [[step, round(rate)] for step, rate in rates],
        "peak_memory_gb": _peak_memory_gb(),
        # A rate that falls while the SM clock falls is the card throttling (power, heat), not the training loop.
        **clocks.summary(),
    }


class GpuClocks:
    """nvidia-smi sampling the SM clock, power and temperature once a second in the background (no work for the
    training process, which a query from inside it would be); nothing without nvidia-smi."""

    QUERY = "clocks.sm,power.draw,temperature.gpu"

    def __enter__(self) -> GpuClocks:
        import shutil

        self.process = None
        if shutil.which("nvidia-smi"):
            command = ["nvidia-smi", f"--query-gpu={self.QUERY}", "--format=csv,noheader,nounits", "-lms", "1000"]
            self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        return self

    def __exit__(self, *exc) -> None:
        self.samples: list[list[float]] = []
        if self.process is None:
            return
        self.process.terminate()
        out, _ = self.process.communicate(timeout=10)
        for line in out.splitlines():
            try:
                self.samples.append([float(v) for v in line.split(",")])
            except ValueError:
                continue

    def summary(self) -> dict:
        if not self.samples:
            return {}
        clock, power, temperature = zip(*self.samples, strict=True)
        return {
            "sm_clock_mhz_first_last": [clock[0], clock[-1]],
            "sm_clock_mhz_min_max": [min(clock), max(clock)],
            "power_w_max": max(power),
            "temperature_c_max": max(temperature),
        }


def record_losses(out: Path, fit_args: list[str], ckpt_path: str | None) -> None:
    """One fit (resumed from ckpt_path if given) writing {optimizer step: train/loss} to `out`."""
    import lightning as L

    from lit_transformer.cli.lightning_cli import run_cli

    losses: dict[int, float] = {}

    class Losses(L.Callback):
        step_before = -1

        def on_train_batch_start(self, trainer, *args) -> None:
            self.step_before = trainer.global_step

        def on_train_batch_end(self, trainer, pl_module, *args) -> None:
            if trainer.global_step != self.step_before:  # an optimizer step ended this batch
                losses[trainer.global_step] = float(trainer.callback_metrics["train/loss"])

    cli = run_cli(fit_args, run=False)
    cli.trainer.callbacks.append(Losses())
    cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=ckpt_path)
    if cli.trainer.is_global_zero:
        out.write_text(json.dumps({"strategy": type(cli.trainer.strategy).__name__, "losses": losses,
                                   "peak_memory_gb": _peak_memory_gb()}))  # fmt: skip


def resume(fit_args: list[str], steps: int, tolerance: float) -> dict:
    """Fit `steps` steps saving at steps // 2; resume from that checkpoint in a new process; compare the losses."""
    half = steps // 2
    with tempfile.TemporaryDirectory(prefix="gpu-check-resume-") as tmp:
        folder = Path(tmp)
        common = [
            *fit_args,
            f"--trainer.max_steps={steps}",
            "--trainer.log_every_n_steps=1",
            f"--checkpoint.dirpath={folder / 'checkpoints'}",
            f"--checkpoint.every_n_train_steps={half}",
            "--checkpoint.save_top_k=-1",
            "--checkpoint.monitor=step",
            "--checkpoint.mode=max",
            "--checkpoint.filename=step{step:03d}",
            "--checkpoint.auto_insert_metric_name=false",
            "--checkpoint.save_last=false",
        ]
        me = [sys.executable, "-m", "lit_transformer.bench", "gpu-parts", "record"]
        subprocess.run([*me, "--out", str(folder / "full.json"), "--", *common], check=True, env=child_env())
        saved = folder / "checkpoints" / f"step{half:03d}.ckpt"
        if not saved.exists():
            raise SystemExit(
                f"no checkpoint at step {half}: {sorted(p.name for p in (folder / 'checkpoints').iterdir())}"
            )
        subprocess.run(
            [*me, "--out", str(folder / "resumed.json"), "--ckpt_path", str(saved), "--", *common], check=True,
            env=child_env(),
        )  # fmt: skip
        full, resumed = (json.loads((folder / f"{name}.json").read_text()) for name in ("full", "resumed"))
    after = [str(step) for step in range(half + 1, steps + 1)]
    missing = [step for step in after if step not in resumed["losses"] or step not in full["losses"]]
    if missing:
        raise SystemExit(f"steps {missing} have no loss in one of the runs: {full['losses']} {resumed['losses']}")
    diff = max(abs(full["losses"][s] - resumed["losses"][s]) for s in after)
    return {
        "label": f"{full['strategy']}: {steps} steps, saved at {half}, resumed",
        "strategy": full["strategy"],
        "steps": steps,
        "losses": full["losses"],
        "resumed_losses": resumed["losses"],
        "max_abs_loss_diff": diff,
        "tolerance": tolerance,
        "match": diff <= tolerance,
        "peak_memory_gb": full["peak_memory_gb"],
    }


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, fit_args = split_passed_on(argv)
    parser = command_parser("bench gpu-parts", __doc__)
    commands = parser.add_subcommands(dest="command", required=True)
    rate = subcommand_parser("preset-rate", "The logged tokens/s of `fit -- FIT_ARGS`, over its optimizer steps.")
    commands.add_subcommand("preset-rate", rate, help="the logged tokens/s of a fit, over its optimizer steps")
    res = subcommand_parser("resume", "Fit, save half-way, resume in a new process, compare the second half's losses.")
    res.add_argument("--steps", type=PositiveInt, default=10, help="optimizer steps of the uninterrupted run")
    res.add_argument("--tolerance", type=float, default=1e-4, help="max abs loss difference that counts as a match")
    commands.add_subcommand("resume", res, help="fit, save half-way, resume, compare the second half's losses")
    rec = subcommand_parser("record", "One fit of `resume`, in its own process: its losses to --out.")
    rec.add_argument("--out", type=Path, required=True, help="where its losses go (JSON)")
    rec.add_argument("--ckpt_path", type=str | None, default=None, help="resume from this checkpoint")
    commands.add_subcommand("record", rec, help="(resume's child process) one fit's losses to a JSON file")
    args = parse(parser, own)
    name, options = chosen(args)
    if name == "resume" and options.steps < 2:
        raise ConfigError(f"--steps {options.steps}: resume saves at step steps // 2 and resumes there; give 2 or more")
    if name == "record":
        return record_losses(options.out, fit_args, options.ckpt_path)
    row = preset_rate(fit_args) if name == "preset-rate" else resume(fit_args, options.steps, options.tolerance)
    print(json.dumps(row), flush=True)
