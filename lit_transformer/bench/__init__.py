"""The package's benchmarks: `python -m lit_transformer bench NAME [ARGS]` (`bench NAME --help` for each).

Each benchmark drives the package (its CLI in a child process or in this one, its model and inference objects) and
writes JSON that records the machine (lit_transformer.records). This module imports nothing heavy: the table
below names each benchmark's module, imported only when that benchmark runs, so `bench --help` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# name -> (module holding `main(argv)`, one line of what it measures)
BENCHMARKS: dict[str, tuple[str, str]] = {
    "startup": ("lit_transformer.bench.startup",
                "each command's start-up (wall time, peak RSS) beside `import torch` and `import lightning`"),
    "speed": ("lit_transformer.bench.speed",
              "training step, generation, int8/ONNX/compiled decoding and memory against peers (HF, litgpt, ...)"),
    "nanogpt": ("lit_transformer.bench.nanogpt",
                "the main job (configs/base.yaml) beside nanoGPT's CPU recipe in bits per character; nanoGPT's bench.py"),
    "prepare": ("lit_transformer.bench.prepare_scale",
                "data preparation at scale: `prepare` against nanoGPT's openwebtext recipe, time and peak memory"),
    "data-memory": ("lit_transformer.bench.data_memory",
                    "peak memory of `prepare` and `fit` on a user's own classification and captioning files"),
    "lora": ("lit_transformer.bench.lora_finetune", "LoRA against full fine-tuning: quality, trainable parameters, memory"),
    "record": ("lit_transformer.bench.record_run", "run one fit/validate/test of the CLI and record its metrics as JSON"),
    "suite-time": ("lit_transformer.bench.suite_time", "the test suite's wall and CPU time as CI runs it"),
    "genre-baselines": ("lit_transformer.bench.genre_baselines",
                        "majority-class and bag-of-words baselines of the embedded genre task"),
    "caption-baseline": ("lit_transformer.bench.caption_baseline",
                         "a per-slot logistic-regression baseline of the embedded captioning task"),
    "gpu-parts": ("lit_transformer.bench.gpu_parts",
                  "GPU check parts: a preset's logged rate over N steps; a strategy's save and resume"),
    "gpu-table": ("lit_transformer.bench.gpu_table", "collect the GPU check's rows into JSON and render its table"),
}  # fmt: skip


def command_parser(command: str, doc: str | None) -> argparse.ArgumentParser:
    """A package command's parser: its name as a user types it, its module docstring (with the examples) as --help."""
    from lit_transformer.cli.program import program

    return argparse.ArgumentParser(prog=program(command), description=doc, allow_abbrev=False,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip


def describe() -> str:
    width = max(map(len, BENCHMARKS))
    return "benchmarks:\n" + "\n".join(f"  {name:<{width}}  {summary}" for name, (_, summary) in BENCHMARKS.items())


def main(argv: Sequence[str] | None = None) -> None:
    """`bench NAME ARGS...`: run benchmark NAME with its own arguments (its --help lists them)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = command_parser("bench", "Run one of the package's benchmarks; each writes JSON that names its machine.")
    parser.epilog = describe()
    parser.add_argument("name", choices=sorted(BENCHMARKS), metavar="NAME", help="the benchmark (listed below)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its own arguments (bench NAME --help)")
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        raise SystemExit(0 if argv else 2)
    args = parser.parse_args(argv[:1])
    module = importlib.import_module(BENCHMARKS[args.name][0])
    module.main(argv[1:])
