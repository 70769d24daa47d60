"""One decoding step of the translation preset's model (batch 1, the KV cache growing to 128), eager against
compiled (compile=True's CompiledPasses), fp32 and int8: microseconds per step, and torch.profiler's top operations.

    .venv/bin/python scripts/decode_step_profile.py            # the four step times
    .venv/bin/python scripts/decode_step_profile.py --table    # and where eager and compiled steps spend their time
    .venv/bin/python scripts/decode_step_profile.py --all-dynamic   # compiled with every dimension dynamic

The model is configs/presets/translate-en-es.yaml's size (2 + 2 layers x 256, d_ff 1024, 6000-token tied
vocabulary), random weights; the step is Transformer.decode of one token against the source's memory, as
IncrementalDecoder runs it (fp32 weights column-major, as generate lays them out for a single row), without the
generation loop around it. 1 torch thread. Not part of CI
(docs/performance.md, "Compiled decoding").
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchmark import seq2seq_config, sizes  # noqa: E402

from lit_transformer.model import Transformer  # noqa: E402
from lit_transformer.model.generation import CompiledPasses, vector_friendly_weights  # noqa: E402
from lit_transformer.quantization import quantize_int8  # noqa: E402


def step_us(model: Transformer, passes, source: torch.Tensor, steps: int = 128, reps: int = 5) -> float:
    """Median over `reps` of the mean microseconds per step across `steps` steps."""
    results = []
    for _ in range(reps):
        memory = passes.encode(source)
        cache = model.new_cache(steps + 1)
        token = torch.tensor([[1]])
        start = time.perf_counter()
        for _ in range(steps):
            passes.decode(token, memory, cache=cache, last_only=True)
        results.append((time.perf_counter() - start) / steps * 1e6)
    return statistics.median(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--table", action="store_true", help="print torch.profiler's tables of eager and compiled steps"
    )
    parser.add_argument(
        "--all-dynamic", action="store_true", help="compile with dynamic=True (every dimension symbolic from the start)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    t = sizes(False)["translation"]
    torch.manual_seed(0)
    fp32 = Transformer(seq2seq_config(t, "post", eos_token_id=None, tie_embeddings=True)).eval()
    source = torch.randint(3, t["vocab"], (1, 32))
    with torch.inference_mode():
        for name, model in (("fp32", fp32), ("int8", quantize_int8(fp32))):
            compiled = CompiledPasses(model, dynamic=True if args.all_dynamic else None)
            with vector_friendly_weights(model):  # as generate runs a single row (fp32 weights column-major)
                step_us(model, compiled, source, reps=1)  # compiles
                eager_us, compiled_us = step_us(model, model, source), step_us(model, compiled, source)
            print(f"{name}: eager {eager_us:.0f} us/step, compiled {compiled_us:.0f} us/step")
        if args.table:
            from torch.profiler import profile

            int8 = model
            for label, model, passes in (
                ("fp32 eager", fp32, fp32),
                ("int8 eager", int8, int8),
                ("int8 compiled", int8, compiled),
            ):
                memory, cache, token = passes.encode(source), model.new_cache(200), torch.tensor([[1]])
                with vector_friendly_weights(model):
                    for _ in range(10):
                        passes.decode(token, memory, cache=cache, last_only=True)
                    with profile() as prof:
                        for _ in range(100):
                            passes.decode(token, memory, cache=cache, last_only=True)
                print(f"100 steps, {label}:")
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))


if __name__ == "__main__":
    main()
