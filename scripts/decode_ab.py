"""Decoding speed of this tree against an older one, fp32 and int8, on the translation preset's model, in one process.

    mkdir -p /tmp/before && git archive 60d0274 lit_transformer | tar -x -C /tmp/before   # the tree to compare against
    .venv/bin/python scripts/decode_ab.py --before /tmp/before --reps 21             # greedy, batch 1
    .venv/bin/python scripts/decode_ab.py --before /tmp/before --reps 5 --beams 4 --batch 8

The older tree's package is copied under another name (lit_before), so both load side by side with the same weights
(configs/presets/translate-en-es.yaml's model, its 6000-token shared vocabulary, random weights, no EOS: every row
decodes all --new tokens). Both must give the same tokens (checked). The four contenders (before/after x fp32/int8)
run once per repetition in an order that reverses every repetition; reported: medians of wall time and of the
thread's CPU time (on a shared host the CPU time leaves out the waits for a core), and medians of paired ratios.
1 torch thread. Not part of CI.
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def load_before(tree: Path):
    """The older tree's lit_transformer, imported as lit_before (its absolute imports rewritten)."""
    folder = Path(tempfile.mkdtemp(prefix="decode_ab_"))
    shutil.copytree(tree / "lit_transformer", folder / "lit_before")
    for path in (folder / "lit_before").rglob("*.py"):
        path.write_text(re.sub(r"\blit_transformer\b", "lit_before", path.read_text()))
    sys.path.insert(0, str(folder))
    import lit_before.config
    import lit_before.model
    import lit_before.quantization

    return lit_before


def preset_fields(path: Path) -> dict:
    preset = yaml.safe_load(path.read_text())
    fields = dict(preset["model"]["config"])
    fields["vocab_size"] = preset["data"]["init_args"]["vocab_size"]
    fields["eos_token_id"] = None  # no early stop: every contender decodes the same number of tokens
    return fields


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the tree to compare against")
    parser.add_argument("--preset", type=Path, default=ROOT / "configs/presets/translate-en-es.yaml")
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--beams", type=int, default=1)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--src", type=int, default=32)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")

    from lit_transformer.config import TransformerConfig
    from lit_transformer.model import Transformer
    from lit_transformer.quantization import quantize_int8

    before = load_before(args.before)
    fields = preset_fields(args.preset)
    torch.manual_seed(0)
    after = Transformer(TransformerConfig(**fields)).eval()
    old = before.model.Transformer(before.config.TransformerConfig(**fields)).eval()
    old.load_state_dict(after.state_dict())
    models = {
        "before fp32": old,
        "before int8": before.quantization.quantize_int8(old),
        "after fp32": after,
        "after int8": quantize_int8(after),
    }
    src = torch.randint(3, fields["vocab_size"], (args.batch, args.src))
    flags = dict(max_new_tokens=args.new, num_beams=args.beams, max_source_offset=None)
    with torch.no_grad():
        out = {name: model.generate(src, **flags) for name, model in models.items()}
    for precision in ("fp32", "int8"):
        if not torch.equal(out[f"before {precision}"], out[f"after {precision}"]):
            raise SystemExit(f"{precision}: the two trees decode different tokens")
    names = list(models)
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(args.reps):
        for name in names if rep % 2 == 0 else reversed(names):
            gc.collect()
            start_wall, start_cpu = time.perf_counter(), time.thread_time()
            models[name].generate(src, **flags)  # generate runs under no_grad itself
            cpu[name].append(time.thread_time() - start_cpu)
            wall[name].append(time.perf_counter() - start_wall)
    tokens = args.new * args.batch
    print(f"{args.reps} repetitions, batch {args.batch}, beams {args.beams}, {args.new} new tokens per row, 1 thread")
    print("| contender | wall median | tokens/s (wall) | CPU median | tokens/s (CPU) |")
    print("|---|---:|---:|---:|---:|")
    for name in names:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        print(f"| {name} | {w * 1e3:.1f} ms | {tokens / w:,.0f} | {c * 1e3:.1f} ms | {tokens / c:,.0f} |")

    def paired(a: str, b: str, times: dict[str, list[float]]) -> float:
        return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))

    for label, times in (("wall", wall), ("CPU", cpu)):
        print(
            f"{label}: int8 speed-up over fp32 before {paired('before fp32', 'before int8', times):.2f}x, after "
            f"{paired('after fp32', 'after int8', times):.2f}x; time after/before fp32 "
            f"{paired('after fp32', 'before fp32', times):.3f}, int8 {paired('after int8', 'before int8', times):.3f}"
        )
    if args.json:
        args.json.write_text(json.dumps(dict(vars(args), before=str(args.before), wall=wall, cpu=cpu), default=str))


if __name__ == "__main__":
    main()
