"""The gradient norm that `train/grad_norm` logs and clipping uses, under a strategy, against a plain run (a GPU check).

Each process runs `fit` of the same model on the same batches for a few optimizer steps, logging the norm every step,
and writes the norms to JSON; the plain run and the FSDP run must agree (fp32, so to about 1e-5): under FSDP each
rank holds shards, and the norm must be the whole model's (lit_transformer.reliability.gradient_norm).

    python scripts/check_grad_norm.py --out runs/gpu/norm_plain.json -- --config configs/presets/gpt2-small.yaml ...
    python scripts/check_grad_norm.py --out runs/gpu/norm_fsdp.json -- ... --config configs/trainer/fsdp.yaml
    python scripts/check_grad_norm.py --compare runs/gpu/norm_plain.json runs/gpu/norm_fsdp.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def record(out: Path, fit_args: list[str]) -> None:
    import lightning as L
    from benchmark import build_cli

    norms: list[float] = []

    class Norms(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, *args) -> None:
            norms.append(float(trainer.callback_metrics["train/grad_norm"]))

    cli = build_cli(fit_args)
    cli.trainer.callbacks.append(Norms())
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    if cli.trainer.is_global_zero:
        strategy = type(cli.trainer.strategy).__name__
        out.write_text(json.dumps({"strategy": strategy, "grad_norms": norms}))
        print(strategy, norms)


def compare(paths: list[Path], tolerance: float) -> int:
    runs = [json.loads(p.read_text()) for p in paths]
    reference = runs[0]["grad_norms"]
    worst = 0.0
    for run in runs[1:]:
        other = run["grad_norms"]
        if len(other) != len(reference):
            print(f"{run['strategy']}: {len(other)} steps against {len(reference)}")
            return 1
        worst = max(worst, *(abs(a - b) / abs(a) for a, b in zip(reference, other, strict=True)))
        print(f"{runs[0]['strategy']} {reference}\n{run['strategy']} {other}")
    print(f"largest relative difference {worst:.2e} (tolerance {tolerance:.0e})")
    return 0 if worst <= tolerance else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="where this run's norms go")
    parser.add_argument("--compare", type=Path, nargs="+", help="norm files to compare, the reference first")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("fit_args", nargs="*", help="arguments of `fit` (after --)")
    args = parser.parse_args()
    if args.compare:
        raise SystemExit(compare(args.compare, args.tolerance))
    record(args.out, args.fit_args)


if __name__ == "__main__":
    main()
