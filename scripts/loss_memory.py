"""Peak memory of a compiled step's loss: LitTransformer's smoothed_cross_entropy against F.cross_entropy.

Each variant runs in its own process (inductor, CPU, fp32): a one-layer model with a 16,000-entry vocabulary over
16 x 256 tokens, so the (tokens, vocabulary) fp32 logits are 250 MB and a loss that keeps one more buffer of that
shape for the backward pass shows as +250 MB of peak RSS. A GPU shows the same in torch.cuda.max_memory_allocated.

    .venv/bin/python scripts/loss_memory.py
"""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

VARIANTS = ("F.cross_entropy", "smoothed_cross_entropy eps=0", "smoothed_cross_entropy eps=0.1")


def child(variant: str) -> None:
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from lit_transformer.config import TransformerConfig
    from lit_transformer.model import Transformer
    from lit_transformer.tasks.losses import smoothed_cross_entropy

    torch.set_num_threads(1)
    vocab = 16000
    cfg = TransformerConfig(
        topology="decoder_only", d_model=64, n_heads=2, n_layers=1, d_ff=128, max_seq_len=256, vocab_size=vocab
    )
    model = Transformer(cfg)
    ids = torch.randint(0, vocab, (16, 257))

    def step(x, y):
        logits = model(x)
        if variant == "F.cross_entropy":
            return F.cross_entropy(logits.reshape(-1, vocab).float(), y.reshape(-1), reduction="sum")
        return smoothed_cross_entropy(logits, y, 0.1 if variant.endswith("0.1") else 0.0)[0]

    compiled = torch.compile(step)
    for _ in range(3):
        compiled(ids[:, :-1], ids[:, 1:]).backward()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def main() -> None:
    if len(sys.argv) > 1:
        return child(sys.argv[1])
    print("| loss | peak RSS (MB) |\n|---|---:|")
    for variant in VARIANTS:
        out = subprocess.run([sys.executable, __file__, variant], capture_output=True, text=True, check=True)
        print(f"| {variant} | {float(out.stdout.split()[-1]):.0f} |")


if __name__ == "__main__":
    main()
