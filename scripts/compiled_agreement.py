"""Compiled decoding (compile=True) against eager decoding on a trained translation checkpoint, as `translate`
runs it: the test split's sources in batches of 16, the checkpoint topology's decoding rules (beam 4, GNMT length
penalty 0.6, source + 50 tokens, early stopping), int8 (and with --fp32 also fp32) each eager then compiled.

    .venv/bin/python scripts/compiled_agreement.py /tmp/en-es19/checkpoints/last.ckpt [--fp32] [--limit N] [--logits]

Reported: translations identical to eager's, corpus BLEU of each (sacreBLEU, the test references), and wall time of
each pass: eager, compiled (its compilation included, with inductor's on-disk cache as this machine has it), and
compiled again (the graphs compiled). 1 torch thread. Not part of CI (docs/performance.md, "Compiled decoding").
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lit_transformer.data import TranslationDataModule  # noqa: E402
from lit_transformer.inference import load_model, translate  # noqa: E402
from lit_transformer.quantization import quantize_int8  # noqa: E402
from lit_transformer.tasks import generation_defaults  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("--fp32", action="store_true", help="also compare fp32 eager with fp32 compiled")
    parser.add_argument("--limit", type=int, default=None, help="the first N test pairs only")
    parser.add_argument("--batch", type=int, default=16, help="sentences per batch (translate's default)")
    parser.add_argument(
        "--logits", action="store_true", help="also the max differences of memory and logits on the first batch"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    import sacrebleu

    sources, references = TranslationDataModule(dataset="kjv-rv1909", vocab_size=6000).pairs()["test"]
    sources, references = sources[: args.limit], references[: args.limit]
    fp32 = load_model(args.checkpoint)
    models = {"int8": quantize_int8(fp32.model)} | ({"fp32": fp32.model} if args.fp32 else {})
    for name, model in models.items():
        loaded = type(fp32)(model, fp32.tokenizer, fp32.target_tokenizer)
        if args.logits:
            memory, logits = differences(model, *loaded.batch(sources[: args.batch]))
            print(
                f"{name}: first batch, compiled - eager: memory up to {memory:.2g}, logits (8 greedy steps) up to {logits:.2g}"
            )
        outputs, seconds = {}, {}
        for run in ("eager", "compiled", "compiled again"):  # again: the graphs are compiled by then
            gen = generation_defaults(model.config, compile=run != "eager")
            start = time.perf_counter()
            out = []
            for i in range(0, len(sources), args.batch):
                out += translate(loaded, sources[i : i + args.batch], gen)
            seconds[run], outputs[run] = time.perf_counter() - start, out
        same = sum(a == b for a, b in zip(outputs["eager"], outputs["compiled"], strict=True))
        bleu = {run: sacrebleu.corpus_bleu(outputs[run], [references]).score for run in ("eager", "compiled")}
        print(
            f"{name}: {len(sources)} test sources; compiled translations identical to eager's: {same}/{len(sources)}; "
            f"BLEU eager {bleu['eager']:.2f}, compiled {bleu['compiled']:.2f}; wall eager {seconds['eager']:.1f} s, "
            f"compiled {seconds['compiled']:.1f} s (compiling included), compiled again {seconds['compiled again']:.1f} s",
            flush=True,
        )


def differences(model, source: torch.Tensor, mask: torch.Tensor, steps: int = 8) -> tuple[float, float]:
    """Max |compiled - eager| of the encoder's memory and of the logits over `steps` greedy steps (eager's tokens fed
    to both), one padded batch."""
    from lit_transformer.model.generation import CompiledDecoder, IncrementalDecoder

    with torch.inference_mode():
        eager = IncrementalDecoder(model, source, mask, steps + 1)
        compiled = CompiledDecoder(model, source, mask, steps + 1)
        memory = (eager.memory - compiled.memory).abs().max().item()
        logits = 0.0
        for _ in range(steps):
            logits = max(logits, (eager.logits - compiled.logits).abs().max().item())
            token = eager.logits.argmax(-1)
            eager.step(token)
            compiled.step(token)
    return memory, logits


if __name__ == "__main__":
    main()
