"""Speed and memory of lit_transformer against peers at equal dimensions, side by side in one run.

    python -m lit_transformer bench speed                       # everything, CPU, 2 threads (~15 min)
    python -m lit_transformer bench speed --quick               # smaller sizes, few repetitions (~3 min)
    python -m lit_transformer bench speed --only decoder beam   # some sections
    python -m lit_transformer bench speed --device cuda         # GPU: the CLI's step beside a hand-built one, MFU
    python -m lit_transformer bench speed --only cli --threads 1      # the same CLI-vs-hand code path on a CPU, tiny
    python -m lit_transformer bench speed --only quantized --threads 1   # int8 and ONNX greedy vs fp32 and HF (docs/performance.md)

Every contender of a section runs once per repetition, in alternating order, so drifting load on a shared machine
touches all alike. Reported: the median time of each, and the median of the paired per-repetition ratios
(peer time / our time: above 1 means ours is faster). A markdown table goes to stdout; --json FILE adds the run
(its rows and its machine) to FILE's runs, with the median and spread of each row over them. Not part of CI.
The sections themselves are in lit_transformer/bench/speed_sections.py.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import sys
from pathlib import Path
from typing import Literal

from jsonargparse.typing import PositiveInt

from lit_transformer.bench.checks import recorded_runs, runs_file
from lit_transformer.cli.arguments import command_parser, parse
from lit_transformer.errors import BadFileError, ConfigError, UserError
from lit_transformer.records import command_line, machine, write_run

Section = Literal["decoder", "seq2seq", "greedy", "sliding", "beam", "quantized", "memory", "lightning", "cli", "mfu"]

# The peers each CPU section builds, as (module, how to install it).
PEERS = {
    "transformers": 'pip install -e ".[bench]"',
    "x_transformers": 'pip install -e ".[bench]"',
    "litgpt": "pip install --no-deps litgpt==0.5.13  (litgpt's own pins would downgrade jsonargparse)",
    "onnx": 'pip install -e ".[interop]"',
    "onnxscript": 'pip install -e ".[interop]"',  # torch.onnx.export's dynamo exporter
    "onnxruntime": 'pip install -e ".[interop]"',
}
SECTION_PEERS = {
    "decoder": ["transformers", "x_transformers", "litgpt"],
    "seq2seq": ["transformers", "x_transformers"],
    "greedy": ["transformers"],
    "beam": ["transformers"],
    "quantized": ["transformers", "onnx", "onnxscript", "onnxruntime"],
}


def require_peers(sections: list[str]) -> None:
    """Refuse before minutes of timing are spent when a peer the sections build is not installed."""
    missing = sorted({m for s in sections for m in SECTION_PEERS.get(s, []) if importlib.util.find_spec(m) is None})
    if missing:
        steps = "; ".join(sorted({PEERS[m] for m in missing}))
        raise UserError(f"bench speed compares against {', '.join(missing)}, not installed here. Install: {steps}")


def cli_presets(device: str, batches: list[int], steps: int, warmup: int) -> dict[str, list[str]]:
    """fit arguments per benchmarked run: the shipped presets and trainer configs, sized for timing only."""
    common = [
        f"--trainer.max_steps={warmup + steps + 1}",
        "--trainer.limit_val_batches=0",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.accumulate_grad_batches=1",
        "--checkpoint.save_last=false",
        "--checkpoint.every_n_train_steps=0",
    ]
    if device == "cpu":  # the same code path on the tiny preset; "host-bound" shrinks the model to ~nothing, so
        # the step time is the host's own per-step work (what bounds a GPU run at small batches)
        runs = {
            f"tiny, batch {b}": ["--config=configs/presets/tiny.yaml", f"--data.init_args.batch_size={b}", *common]
            for b in batches
        }
        for mode in ("compiled", "eager"):  # the translation runs' plumbing, on the tiny encoder-decoder
            runs[f"tiny-translate, {mode}"] = [
                "--config=configs/presets/tiny-translate.yaml",
                f"--model.compile={mode == 'compiled'}",
                *common,
            ]
        # The main job's model (the modern block of configs/ablations/frontier.yaml) under AdamW and under Muon with
        # AdamW: Muon's cost per step, and how much of it a larger batch spreads over more tokens.
        modern = [
            "--config=configs/presets/shakespeare-2017.yaml",
            "--config=configs/variants/rmsnorm.yaml",
            "--config=configs/variants/swiglu.yaml",
            "--config=configs/variants/rope.yaml",
            "--model.config.d_ff=352",
        ]
        for b in (8, 16):
            for optimizer in ("adamw", "muon"):
                runs[f"main job (modern block), {optimizer}, batch {b}"] = [
                    *modern,
                    f"--model.optim.optimizer={optimizer}",
                    f"--data.init_args.batch_size={b}",
                    *common,
                ]
        runs["host-bound (d_model 8, batch 1 x 8 tokens)"] = [
            "--config=configs/presets/tiny.yaml",
            *common,
            "--model.config.d_model=8",
            "--model.config.n_heads=1",
            "--model.config.n_layers=1",
            "--model.config.d_ff=8",
            "--data.init_args.batch_size=1",
            "--data.init_args.block_size=8",
            "--trainer.gradient_clip_val=1.0",
        ]
        return runs
    gpu = ["--config=configs/trainer/bf16-mixed.yaml", "--config=configs/trainer/compile.yaml"]
    runs = {
        f"gpt2-small, ctx 1024, batch {b}": [
            "--config=configs/presets/gpt2-small.yaml",
            *gpu,
            "--data.init_args.tokenizer=byte_bpe",  # GPT-2's own tokenizer is on the hub; same vocabulary size
            "--data.init_args.vocab_size=50257",
            f"--data.init_args.batch_size={b}",
            *common,
        ]
        for b in batches
    }
    runs["paper-base (encoder-decoder), 25k-token batches"] = [
        "--config=configs/presets/paper-base.yaml",
        *gpu,
        *common,
    ]
    # configs/trainer/compile.yaml against the same preset eager: time to the first optimizer step, then tokens/s.
    for preset, extra in (
        ("paper-base", []),
        ("translate-en-es", ["--trainer.accelerator=gpu", "--trainer.devices=1"]),
    ):
        for mode in ("compiled", "eager"):
            runs[f"{preset}, bf16, {mode}"] = [
                f"--config=configs/presets/{preset}.yaml",
                "--config=configs/trainer/bf16-mixed.yaml",
                *(["--config=configs/trainer/compile.yaml"] if mode == "compiled" else []),
                *extra,
                *common,
            ]
    return runs


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_memory_child"]:  # the memory section's fresh process: MODE THREADS QUICK
        import torch

        from lit_transformer.bench.speed_sections import memory_child

        torch.set_num_threads(int(argv[2]))
        print(json.dumps(memory_child(argv[1], bool(int(argv[3])))))
        return
    parser = command_parser("bench speed", __doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer repetitions: a smoke run")
    parser.add_argument(
        "--only",
        type=Section,
        nargs="+",
        metavar="SECTION",
        default=None,
        help="sections to run (default: all but cli on a CPU; mfu and cli on cuda)",
    )
    parser.add_argument("--cli-steps", type=PositiveInt, default=20, help="cli: timed optimizer steps per contender")
    parser.add_argument("--cli-warmup", type=PositiveInt, default=10, help="cli: untimed steps first (compilation)")
    parser.add_argument("--cli-filter", type=str, default="", help="cli: only the runs whose label contains this")
    parser.add_argument(
        "--reps", type=PositiveInt | None, default=None, help="repetitions per contender (default 5, quick 3)"
    )
    parser.add_argument("--threads", type=PositiveInt, default=2, help="torch CPU threads")
    parser.add_argument("--device", type=Literal["cpu", "cuda"], default="cpu", help="cuda: the GPU MFU run only")
    parser.add_argument("--gpu-batches", type=PositiveInt, nargs="+", default=[8, 16, 32], help="cuda: batch sizes")
    parser.add_argument(
        "--cpu-batches", type=PositiveInt, nargs="+", default=[8], help="cpu: the cli section's batch sizes"
    )
    parser.add_argument("--cli-only", action="store_true", help="cli: the CLI's fit alone, no hand-built step")
    parser.add_argument("--cli-extra", type=str, default="", help="cli: fit arguments added to every run (a lever)")
    parser.add_argument(
        "--json", type=Path | None, default=None, help="add this run (rows, machine) to this file's runs"
    )
    parser.add_argument("--render", type=Path | None, default=None, help="print the table of an earlier --json file")
    parser.add_argument("--run", type=int, default=0, help="with --render: which of the file's runs (0: the first)")
    args = parse(parser, argv)
    if args.render:
        runs = recorded_runs(args.render, "--render")
        if not -len(runs) <= args.run < len(runs):
            raise ConfigError(f"--run {args.run}: {args.render} holds {len(runs)} runs (--run 0 to {len(runs) - 1})")
        if not isinstance(runs[args.run].get("rows"), list):
            raise BadFileError(f"--render {args.render}: run {args.run} has no rows (not a file bench speed wrote)")
        from lit_transformer.bench.speed_sections import render

        return render(args.render, args.run)
    runs_file(args.json)
    only = args.only or (["mfu", "cli"] if args.device == "cuda" else [])
    runs: dict[str, list[str]] = {}
    if "cli" in only:
        batches = args.gpu_batches if args.device == "cuda" else args.cpu_batches
        every = cli_presets(args.device, batches, args.cli_steps, args.cli_warmup)
        runs = {label: [*run, *shlex.split(args.cli_extra)] for label, run in every.items() if args.cli_filter in label}
        if not runs:
            raise UserError(f"--cli-filter {args.cli_filter!r} matches no run of {list(every)}")
    if args.device == "cpu":
        require_peers(args.only or ["decoder", "seq2seq", "greedy", "sliding", "beam", "quantized"])
    facts = machine(threads=args.threads)
    from lit_transformer.bench.speed_sections import markdown, measure

    rows = measure(args, runs, facts)
    print(
        f"{facts['cpu']}, torch {facts['torch']}, {args.threads} threads, load average {facts['load_average_before']}"
    )
    print(
        f"at start, {facts['load_average_end']} at end; fp32 matmul peak {facts.get('fp32_matmul_peak_gflops', 0):.0f} GFLOP/s"
    )
    print(markdown(rows))
    if args.json:
        write_run(args.json, {"rows": rows}, command=command_line("bench speed", argv), machine=facts,
                  summary=("ratio", "median_s", "tokens_per_s", "mfu_vs_spec"))  # fmt: skip
