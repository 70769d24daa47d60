"""The paper's recipe, evaluated: test BLEU of one run's last checkpoint, of the average of its last N, and of its EMA,
each with greedy decoding and with the paper's rules; plus the validation BLEU curve as a PNG.

The run must have been trained with step checkpoints kept and Lightning's EMAWeightAveraging (as
configs/presets/translate-en-es-gpu.yaml does; docs/translation.md), so each checkpoint holds the EMA (state_dict)
and the optimizer's weights (current_model_state):

    python -m lit_transformer translation-recipe --run runs/en-es-long --config configs/presets/translate-en-es.yaml --last 5

Writes RUN/recipe/{single,average,ema}.ckpt, the curve to --plot, and adds one run (a row per checkpoint and
decoding, the machine, the command) to RUN/recipe/results.json. Each `test` runs in its own process (the CLI, exactly
as a user would run it, from this folder), --jobs at a time.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from jsonargparse.typing import PositiveInt

from lit_transformer.cli.arguments import command_parser, parse
from lit_transformer.errors import ConfigError, MissingFileError, UserError
from lit_transformer.records import child_env, command_line, machine, write_run

DECODINGS = {
    "beam 1 (greedy)": ["--model.generation.num_beams", "1"],
    "beam 4, GNMT alpha 0.6 (paper)": [
        "--model.generation.num_beams=4",
        "--model.generation.length_penalty=0.6",
        "--model.generation.length_penalty_form=gnmt",
        "--model.generation.early_stopping=true",
    ],
}


def _cli(*args: str) -> str:
    env = child_env(OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    done = subprocess.run([sys.executable, "-m", "lit_transformer", *args], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        lines = done.stderr.rstrip().splitlines()
        starts = [i for i, line in enumerate(lines) if line.startswith("error: ")]
        if starts and done.returncode in (1, 2):  # the command's own refusal: passed on as this command's
            refusal = UserError(f"`{' '.join(args[:3])}` refused: " + "\n".join(lines[starts[-1] :])[len("error: ") :])
            refusal.status = done.returncode
            raise refusal
        raise RuntimeError(f"{' '.join(args[:3])} failed:\n{done.stderr[-3000:]}")
    return done.stdout + done.stderr


def _metric(output: str, name: str) -> float:
    # Lightning prints str(float): 4.2e-05, 3.5e+16 (read as 4.2 and 3.5 by digits and dots alone), nan, inf
    match = re.search(rf"{re.escape(name)}\s*[│|]\s*([-+]?(?:[0-9.]+(?:[eE][-+]?[0-9]+)?|nan|inf))", output)
    if not match:
        raise RuntimeError(f"{name} not found in the test output:\n{output[-2000:]}")
    return float(match[1])


def build_checkpoints(run: Path, last: int) -> dict[str, Path]:
    """single: the optimizer's weights at the last step; average: the mean of the last N steps' optimizer weights;
    ema: the EMA the callback kept (the last checkpoint's state_dict)."""
    out = run / "recipe"
    out.mkdir(exist_ok=True)
    ckpts = run / "checkpoints"
    steps = sorted(ckpts.glob("step*.ckpt"))
    paths = {"single": out / "single.ckpt", "average": out / f"average-last{last}.ckpt", "ema": out / "ema.ckpt"}
    _cli("average", "--checkpoints", str(steps[-1]), "--weights", "trained", "--output", str(paths["single"]))
    _cli(
        "average",
        "--checkpoints",
        str(ckpts),
        "--last",
        str(last),
        "--weights",
        "trained",
        "--output",
        str(paths["average"]),
    )
    _cli("average", "--checkpoints", str(steps[-1]), "--weights", "saved", "--output", str(paths["ema"]))
    return paths


def evaluate(config: Path, checkpoint: Path, decoding: list[str], flags: list[str] = ()) -> dict:
    start = time.perf_counter()
    output = _cli(
        "test", "--config", str(config), "--ckpt_path", str(checkpoint), "--trainer.logger", "false", *flags, *decoding
    )
    return {
        "bleu": _metric(output, "test/bleu"),
        "ppl": _metric(output, "test/ppl"),
        "seconds": time.perf_counter() - start,
    }


def raw_curve(run: Path, config: Path, jobs: int, flags: list[str] = ()) -> list[tuple[int, float]]:
    """Validation BLEU of the optimizer's own weights at every step checkpoint (the logged curve is the EMA's)."""
    out = run / "recipe" / "raw"
    out.mkdir(parents=True, exist_ok=True)

    def one(step_file: Path) -> tuple[int, float]:
        raw = out / step_file.name
        _cli("average", "--checkpoints", str(step_file), "--weights", "trained", "--output", str(raw))
        output = _cli("validate", "--config", str(config), "--ckpt_path", str(raw), "--trainer.logger", "false", *flags)
        return int(re.search(r"(\d+)", step_file.stem)[1]), _metric(output, "val/bleu")

    steps = sorted((run / "checkpoints").glob("step*.ckpt"))
    with ThreadPoolExecutor(jobs) as pool:
        return sorted(pool.map(one, steps[1::2]))  # every 200 steps, where the logged validations are


def run_curve(run: Path, tag: str) -> list[tuple[int, float]]:
    """(optimizer step, value) of `tag` over the whole run: each TensorBoard folder under it in version order (a run
    resumed after a stop logs into a new version_N), a step logged again after a resume keeping its last value. It
    read the events of exactly one folder, and failed with a ValueError for a resumed run or a wrong --run."""
    from lit_transformer.recipes.ablate import read_scalars

    def version(folder: Path) -> tuple[int, str]:
        number = folder.name.removeprefix("version_")
        return (int(number), "") if number.isdigit() else (-1, str(folder))

    folders = sorted({p.parent for p in run.rglob("events.out.tfevents.*")}, key=version)
    if not folders:
        raise MissingFileError(
            f"--run {run}: no TensorBoard events under it; give the folder fit wrote (its --trainer.default_root_dir, "
            "holding checkpoints/ and tensorboard/)"
        )
    by_step: dict[int, float] = {}
    for folder in folders:
        by_step.update((step + 1, value) for step, value in read_scalars(folder).get(tag, []))
    if not by_step:
        raise UserError(f"--run {run}: its TensorBoard events hold no {tag}: the run logged no validation BLEU")
    return sorted(by_step.items())


def plot_curve(
    run: Path, plot: Path, title: str = "", raw: list[tuple[int, float]] | None = None
) -> list[tuple[int, float]]:
    """Validation BLEU (and perplexity) against steps, from the run's TensorBoard events. With an EMA callback,
    validation sees the EMA weights, which hold the initial weights until the EMA starts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bleu, ppl = run_curve(run, "val/bleu"), run_curve(run, "val/ppl")
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(
        *zip(*bleu, strict=True),
        marker="o",
        label="validation BLEU, EMA weights (as logged: the first 100 pairs, the run's decoding)",
    )
    if raw:
        ax.plot(
            *zip(*raw, strict=True), marker="s", label="validation BLEU, the optimizer's weights (paper's decoding)"
        )
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("BLEU")
    ax.grid(alpha=0.3)
    twin = ax.twinx()
    twin.plot(
        *zip(*[(s, p) for s, p in ppl if p < 1000], strict=True),
        color="gray",
        ls="--",
        label="validation ppl, EMA weights",
    )
    twin.set_ylabel("perplexity")
    twin.set_yscale("log")
    fig.legend(loc="upper left", bbox_to_anchor=(0.08, 0.9), fontsize=8)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    plot.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(plot, dpi=110)
    return bleu


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = command_parser("translation-recipe", __doc__)
    parser.add_argument("--run", type=Path, required=True, help="The run folder (checkpoints/, tensorboard/).")
    parser.add_argument("--config", type=Path, required=True, help="The config the run was trained with.")
    parser.add_argument("--last", type=PositiveInt, default=5, help="How many of the last checkpoints to average.")
    parser.add_argument("--jobs", type=PositiveInt, default=2, help="`test` processes at a time.")
    parser.add_argument(
        "--plot", type=Path | None, default=None, help="The curve's PNG (default: RUN/recipe/val-bleu.png)."
    )
    parser.add_argument("--title", type=str, default="", help="The plot's title.")
    parser.add_argument(
        "--flags",
        type=str,
        default="",
        help="More flags for every `test`/`validate`, e.g. '--trainer.accelerator gpu' (the config's device is the fit's).",
    )
    parser.add_argument("--plot_only", action="store_true", help="Draw the curve and stop.")
    parser.add_argument("--raw_curve", action="store_true", help="Also validate the optimizer's weights per step.")
    args = parse(parser, argv)
    if not sorted((args.run / "checkpoints").glob("*.ckpt")):  # before anything is written into it
        raise MissingFileError(
            f"--run {args.run}: no checkpoints in {args.run / 'checkpoints'}; give the folder fit wrote (its "
            "--trainer.default_root_dir, holding checkpoints/ and tensorboard/)"
        )
    try:
        flags = shlex.split(args.flags)
    except ValueError as error:
        raise ConfigError(f"--flags {args.flags!r} does not split as shell words ({error})", keys=["flags"]) from None
    steps = sorted((args.run / "checkpoints").glob("step*.ckpt"))
    if not args.plot_only and len(steps) < args.last:
        raise MissingFileError(
            f"--run {args.run}: the recipe averages the run's step checkpoints (checkpoints/step*.ckpt) and --last "
            f"{args.last} asks for more than the {len(steps)} there: keep them as translate-en-es-gpu.yaml does "
            "(--checkpoint.filename 'step{step:06d}' --checkpoint.monitor step --checkpoint.mode max "
            "--checkpoint.save_top_k 5: the last five), or give a smaller --last"
        )
    if not args.plot_only:
        from lit_transformer.checkpoints.files import load_checkpoint

        # without an EMA, its "ema" row would be the last step's weights, as "single"
        if "current_model_state" not in load_checkpoint(steps[-1], mmap=True):
            raise ConfigError(
                f"--run {args.run}: {steps[-1].name} holds no EMA of the weights (no current_model_state beside its "
                "state_dict): the run was trained without Lightning's EMAWeightAveraging, so the recipe's `ema` row "
                "would score the last checkpoint again under the EMA's name. Train as translate-en-es-gpu.yaml does "
                "(--trainer.callbacks+=lightning.pytorch.callbacks.EMAWeightAveraging), or average it alone: "
                f"python -m lit_transformer average --checkpoints {args.run / 'checkpoints'} --last {args.last} "
                "--output avg.ckpt"
            )
    facts = machine()
    args.plot = args.plot or args.run / "recipe" / "val-bleu.png"
    if args.plot.is_dir():  # matplotlib would write FOLDER.png beside it
        args.plot = args.plot / "val-bleu.png"
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    saved = args.run / "recipe" / "raw_validation_bleu.json"
    raw = raw_curve(args.run, args.config, args.jobs, flags) if args.raw_curve else None
    if raw:
        saved.write_text(json.dumps(raw) + "\n")
    elif saved.is_file():  # drawn again from an earlier --raw_curve
        raw = [tuple(point) for point in json.loads(saved.read_text())]
    curve = plot_curve(args.run, args.plot, args.title, raw)
    print(f"wrote {args.plot}", flush=True)
    if args.plot_only:
        return
    paths = build_checkpoints(args.run, args.last)
    jobs = [(name, path, label, flags) for name, path in paths.items() for label, flags in DECODINGS.items()]
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda job: evaluate(args.config, job[1], job[3], flags), jobs))
    rows = [
        {"weights": name, "decoding": label, **result}
        for (name, _, label, _), result in zip(jobs, results, strict=True)
    ]
    figures = {"validation_bleu": curve, "results": rows}
    write_run(args.run / "recipe" / "results.json", figures, command=command_line("translation-recipe", argv),
              machine=facts)  # fmt: skip
    for row in rows:
        print(
            f"{row['weights']:8s} {row['decoding']:32s} BLEU {row['bleu']:6.2f}  ppl {row['ppl']:7.2f}  {row['seconds']:.0f} s"
        )


if __name__ == "__main__":
    from lit_transformer.cli.program import main as program

    program(["translation-recipe", *sys.argv[1:]])
