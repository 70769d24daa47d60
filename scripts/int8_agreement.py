"""Greedy agreement of an int8 model with its fp32 self on a fixed prompt set, and the max logit difference.

    .venv/bin/python scripts/int8_agreement.py runs/shakespeare/checkpoints/last.ckpt [--lm-head-fp32]
    .venv/bin/python scripts/int8_agreement.py runs/shakespeare/checkpoints/last.ckpt --onnx   # onnxruntime fp32, int8

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
    parser.add_argument("--onnx", action="store_true", help="the exported ONNX graphs (fp32, int8) instead")
    args = parser.parse_args()
    torch.set_num_threads(1)
    loaded = load_model(args.checkpoint)
    if args.onnx:
        return onnx_agreement(loaded, args.new)
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


def onnx_agreement(loaded, new: int) -> None:
    """onnxruntime greedy decoding with the fp32 and the int8 (onnxruntime quantize_dynamic) graphs against ours:
    identical continuations, and the max logit difference of each step along our fp32 continuation."""
    import tempfile

    from lit_transformer.interop.onnx import OnnxDecoder, OnnxModel, export_onnx_folder
    from lit_transformer.model.generation import IncrementalDecoder

    model = loaded.model
    with tempfile.TemporaryDirectory() as tmp:
        graphs = {
            q: OnnxModel(export_onnx_folder(model, f"{tmp}/{q}", logits_graph=False, quantize=q), threads=1)
            for q in ("none", "int8")
        }
        for quantize, graph in graphs.items():
            identical, first, max_diff = 0, [], 0.0
            for prompt in PROMPTS:
                ids = torch.tensor([loaded.encode(prompt)])
                a = model.generate(ids, max_new_tokens=new, temperature=0.0)[0]
                b = graph.generate(ids, max_new_tokens=new, temperature=0.0)[0]
                n = min(len(a), len(b))
                same = a[:n] == b[:n]
                identical += bool(same.all()) and len(a) == len(b)
                first.append(int((~same).nonzero()[0]) if not same.all() else n)
                with torch.no_grad():
                    ours, theirs = IncrementalDecoder(model, ids, None, new), OnnxDecoder(graph, ids, None, new)
                    for token in a[:-1]:
                        max_diff = max(max_diff, (ours.logits - theirs.logits).abs().max().item())
                        ours.step(token[None]), theirs.step(token[None])
            print(
                f"onnxruntime {'fp32' if quantize == 'none' else 'int8'}: {len(PROMPTS)} prompts x {new} greedy "
                f"tokens; identical to ours (fp32) {identical}/{len(PROMPTS)}; first differing token at {first}; "
                f"max |logit difference| along our continuations {max_diff:.4f}"
            )


if __name__ == "__main__":
    main()
