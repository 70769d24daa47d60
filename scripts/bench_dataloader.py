"""Does the loader keep up with training? Loader batches/s against the model's training steps/s.

    .venv/bin/python scripts/bench_dataloader.py [--task lm|translation] [--steps 5]

Uses the DataModules' defaults (Shakespeare / KJV-RV1909) with a cache under $LIT_TRANSFORMER_CACHE, and
lit_transformer.model.Transformer at the default TransformerConfig sizes (a plain torch stand-in of the same size
when the model package is missing). Not part of CI.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from lit_transformer.config import TransformerConfig
from lit_transformer.data import LanguageModelingDataModule, TranslationDataModule


def loader_rate(loader, seconds: float = 5.0) -> tuple[float, int]:
    start, count = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        for _ in loader:
            count += 1
            if time.perf_counter() - start >= seconds:
                break
    return count / (time.perf_counter() - start), count


def build_model(config: TransformerConfig) -> torch.nn.Module:
    try:
        from lit_transformer.model import Transformer

        return Transformer(config)
    except ImportError:  # stand-in of the same size
        layer = torch.nn.TransformerEncoderLayer(config.d_model, config.n_heads, config.ff_dim, batch_first=True)
        body = torch.nn.TransformerEncoder(layer, config.n_layers)
        return torch.nn.Sequential(
            torch.nn.Embedding(config.vocab_size, config.d_model),
            body,
            torch.nn.Linear(config.d_model, config.vocab_size),
        )


def train_rate(model, batches, steps: int, encoder_decoder: bool) -> float:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times = []
    for batch in batches[: steps + 1]:
        start = time.perf_counter()
        logits = model(batch["src"], batch["tgt_in"]) if encoder_decoder else model(batch["input_ids"])
        loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
    return 1 / (sum(times[1:]) / len(times[1:]))  # first step excluded (warm-up)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=["lm", "translation"], default="lm")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--num-workers", type=int, default=0)
    args = parser.parse_args()

    start = time.perf_counter()
    if args.task == "lm":
        dm = LanguageModelingDataModule(num_workers=args.num_workers)
        config = TransformerConfig(vocab_size=dm.vocab_size)
    else:
        dm = TranslationDataModule(num_workers=args.num_workers)
        config = TransformerConfig(topology="encoder_decoder", vocab_size=dm.vocab_size, max_seq_len=dm.max_length)
    dm.prepare_data()
    dm.setup("fit")
    print(f"data ready in {time.perf_counter() - start:.1f}s (tokenizer + tokens, cached after the first run)")

    loader = dm.train_dataloader()
    rate, count = loader_rate(loader)
    print(f"loader: {rate:.1f} batches/s over {count} batches ({len(loader)} per epoch)")

    model = build_model(config)
    batches = [b for b, _ in zip(dm.train_dataloader(), range(args.steps + 1), strict=False)]
    steps = train_rate(model, batches, args.steps, config.is_encoder_decoder)
    print(
        f"model ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params, {type(model).__name__}): "
        f"{steps:.2f} steps/s; the loader is {rate / steps:.0f}x faster than training"
    )


if __name__ == "__main__":
    main()
