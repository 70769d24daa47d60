"""Greedy agreement of an int8 model with its fp32 self on a fixed prompt set, and the max logit difference.

    .venv/bin/python scripts/int8_agreement.py runs/shakespeare/checkpoints/last.ckpt [--lm-head-fp32]

Reported, not asserted: a small model's near-tied logits make greedy paths part early even when the validation
loss barely moves (docs/performance.md, "int8 dynamic quantization").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lit_transformer.inference import load_model  # noqa: E402
from lit_transformer.quantization import quantize_int8  # noqa: E402

PROMPTS = [
    "ROMEO:",
    "JULIET:",
    "First Citizen:",
    "KING RICHARD III:",
    "To be, or not",
    "O, what a",
    "MENENIUS:",
    "The king is",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("--lm-head-fp32", action="store_true", help="keep the output layer fp32")
    parser.add_argument("--new", type=int, default=64, help="greedy tokens per prompt")
    args = parser.parse_args()
    torch.set_num_threads(1)
    loaded = load_model(args.checkpoint)
    int8 = quantize_int8(loaded.model, lm_head=not args.lm_head_fp32)
    identical, first, max_diff = 0, [], 0.0
    for prompt in PROMPTS:
        ids = torch.tensor([loaded.encode(prompt)])
        a = loaded.model.generate(ids, max_new_tokens=args.new, temperature=0.0)[0]
        b = int8.generate(ids, max_new_tokens=args.new, temperature=0.0)[0]
        n = min(len(a), len(b))
        same = a[:n] == b[:n]
        identical += bool(same.all()) and len(a) == len(b)
        first.append(int((~same).nonzero()[0]) if not same.all() else n)
        with torch.no_grad():
            x = torch.cat([ids, a[None]], 1)[:, : loaded.config.max_seq_len]
            max_diff = max(max_diff, (loaded.model(x) - int8(x)).abs().max().item())
    print(
        f"lm_head {'fp32' if args.lm_head_fp32 else 'int8'}: {len(PROMPTS)} prompts x {args.new} greedy tokens; "
        f"identical continuations {identical}/{len(PROMPTS)}; first differing token at {first}; "
        f"max |logit difference| on the fp32 continuations {max_diff:.3f}"
    )


if __name__ == "__main__":
    main()
