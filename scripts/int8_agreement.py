"""Greedy agreement of an int8 model with its fp32 self on a fixed prompt set, and the max logit difference.

    .venv/bin/python scripts/int8_agreement.py runs/shakespeare/checkpoints/last.ckpt [--lm-head-fp32]
    .venv/bin/python scripts/int8_agreement.py runs/shakespeare/checkpoints/last.ckpt --onnx   # onnxruntime fp32, int8
    .venv/bin/python scripts/int8_agreement.py runs/en-es/checkpoints/last.ckpt   # a translation model: 8 sources

A decoder-only model continues 8 Shakespeare prompts; an encoder-decoder model translates 8 English sentences.

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
SOURCES = [  # for an encoder-decoder (the translation preset is trained on the English Bible)
    "In the beginning God created the heaven and the earth.",
    "Thou shalt not kill.",
    "And God said, Let there be light: and there was light.",
    "The Lord is my shepherd; I shall not want.",
    "Blessed are the meek: for they shall inherit the earth.",
    "Honour thy father and thy mother.",
    "And the earth was without form, and void.",
    "Love thy neighbour as thyself.",
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
    cfg = loaded.config
    texts = SOURCES if cfg.is_encoder_decoder else PROMPTS
    identical, first, max_diff = 0, [], 0.0
    for text in texts:
        ids = torch.tensor([loaded.encode(text)])
        a = loaded.model.generate(ids, max_new_tokens=args.new, temperature=0.0)[0]
        b = int8.generate(ids, max_new_tokens=args.new, temperature=0.0)[0]
        n = min(len(a), len(b))
        same = a[:n] == b[:n]
        identical += bool(same.all()) and len(a) == len(b)
        first.append("-" if same.all() and len(a) == len(b) else int((~same).nonzero()[0]) if not same.all() else n)
        with torch.no_grad():
            if cfg.is_encoder_decoder:  # the logits of every step of the fp32 translation, teacher-forced
                tgt = torch.cat([a.new_tensor([cfg.bos_token_id]), a])[None, : cfg.max_seq_len]
                diff = loaded.model(ids, tgt) - int8(ids, tgt)
            else:
                x = torch.cat([ids, a[None]], 1)[:, : cfg.max_seq_len]
                diff = loaded.model(x) - int8(x)
            max_diff = max(max_diff, diff.abs().max().item())
    what = "sources x greedy translations of up to" if cfg.is_encoder_decoder else "prompts x"
    print(
        f"lm_head {'fp32' if args.lm_head_fp32 else 'int8'}: {len(texts)} {what} {args.new} greedy tokens; "
        f"identical {'translations' if cfg.is_encoder_decoder else 'continuations'} {identical}/{len(texts)}; "
        f"first differing token at [{', '.join(map(str, first))}] (- where identical); max |logit difference| on the "
        f"fp32 outputs {max_diff:.3f}"
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
