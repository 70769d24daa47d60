"""The package's benchmarks: `python -m lit_transformer bench NAME [ARGS]` (`bench NAME --help` for each).

One harness under all of them: each parses its options with the strict parser of every command
(lit_transformer.cli.arguments.command_parser) before it imports torch, writes its runs through the one record writer
(lit_transformer.records.write_run: machine, command, date, a rerun appended to the same file) and runs a child
process through the one memory sampler (lit_transformer.records.run_child). This module imports nothing heavy: the
table below names each benchmark's module, imported only when that benchmark runs, so `bench --help` stays instant.
No module outside bench/ imports it (the program names it by its path, `lit_transformer.bench:main`).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

# name -> (module holding `main(argv)`, one line of what it measures)
BENCHMARKS: dict[str, tuple[str, str]] = {
    "startup": ("lit_transformer.bench.startup",
                "each command's start-up (wall time, peak RSS) beside `import torch` and `import lightning`"),
    "speed": ("lit_transformer.bench.speed",
              "training step, generation, int8/ONNX/compiled decoding and memory against peers (HF, litgpt, ...)"),
    "allocator": ("lit_transformer.bench.allocator",
                  "fit with glibc's malloc keeping freed memory (the default) against glibc's own settings"),
    "nanogpt": ("lit_transformer.bench.nanogpt",
                "the main job (configs/base.yaml) beside nanoGPT's CPU recipe in bits per character; nanoGPT's bench.py"),
    "prepare": ("lit_transformer.bench.prepare_scale",
                "data preparation at scale: `prepare` against nanoGPT's openwebtext recipe, time and peak memory"),
    "data-memory": ("lit_transformer.bench.data_memory",
                    "peak memory of `prepare` and `fit` on a user's own classification and captioning files"),
    "lora": ("lit_transformer.bench.lora_finetune", "LoRA against full fine-tuning: quality, trainable parameters, memory"),
    "serve": ("lit_transformer.bench.serve_load",
              "`serve` under load: requests/s and p50/p99 latency at 1, 8 and 32 clients, batched against unbatched"),
    "record": ("lit_transformer.bench.record_run", "run one fit/validate/test of the CLI and record its metrics as JSON"),
    "suite-time": ("lit_transformer.bench.suite_time",
                   "the test suite's wall and CPU time as CI runs it (in a source checkout: it runs its tests/)"),
    "genre-baselines": ("lit_transformer.bench.genre_baselines",
                        "majority-class and bag-of-words baselines of the embedded genre task"),
    "caption-baseline": ("lit_transformer.bench.caption_baseline",
                         "a per-slot logistic-regression baseline of the embedded captioning task"),
    "gpu-parts": ("lit_transformer.bench.gpu_parts",
                  "GPU check parts: a preset's logged rate over N steps; a strategy's save and resume"),
    "gpu-table": ("lit_transformer.bench.gpu_table", "collect the GPU check's rows into JSON and render its table"),
}  # fmt: skip


def describe() -> str:
    width = max(map(len, BENCHMARKS))
    return "benchmarks:\n" + "\n".join(f"  {name:<{width}}  {summary}" for name, (_, summary) in BENCHMARKS.items())


def main(argv: Sequence[str] | None = None) -> None:
    """`bench NAME ARGS...`: run benchmark NAME with its own arguments (its --help lists them)."""
    from lit_transformer.cli.program import program, suggest
    from lit_transformer.errors import UserError

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        from lit_transformer.cli.arguments import command_parser

        parser = command_parser(
            "bench",
            "Run one of the package's benchmarks; each appends its runs, with the machine, to JSON.",
            describe(),
        )
        parser.add_argument("name", metavar="NAME", help="the benchmark (listed below)")
        parser.usage = f"{program('bench')} NAME [ARGS]  ({program('bench')} NAME --help for its own)"
        parser.print_help(sys.stdout if argv else sys.stderr)
        raise SystemExit(0 if argv else 2)
    name = argv[0]
    if name not in BENCHMARKS:
        raise UserError(
            f"unknown benchmark {name!r}.{suggest(name, list(BENCHMARKS))}",
            hint=f"Run '{program('bench')} --help' for the benchmarks.",
        )
    importlib.import_module(BENCHMARKS[name][0]).main(argv[1:])
