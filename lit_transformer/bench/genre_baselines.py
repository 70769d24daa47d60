"""Baselines of the embedded genre task on the preset's split: the majority class and a bag-of-words logistic
regression (a few lines of torch), with its L2 strength chosen on the validation plays.

    python -m lit_transformer bench genre-baselines --json docs/genre.json   # prints a JSON line per baseline; keeps them in the file

With --json the rows are one more run of the file's record `baselines` (beside the classifier's `fit` and `test`
records that `bench record` adds to the same file).
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from lit_transformer.bench.checks import runs_file
from lit_transformer.cli.arguments import command_parser, parse
from lit_transformer.records import command_line, machine, write_run

if TYPE_CHECKING:
    import torch

WORD = re.compile(r"[a-z']+")


def macro_f1(predicted: torch.Tensor, truth: torch.Tensor, classes: int) -> float:
    scores = []
    for c in range(classes):
        tp = ((predicted == c) & (truth == c)).sum().item()
        fp = ((predicted == c) & (truth != c)).sum().item()
        fn = ((predicted != c) & (truth == c)).sum().item()
        scores.append(2 * tp / max(1, 2 * tp + fp + fn))
    return sum(scores) / classes


def features(texts: list[str], vocabulary: dict[str, int]) -> torch.Tensor:
    """log(1 + count) of each vocabulary word, each row scaled to unit length."""
    import torch
    import torch.nn.functional as F

    rows, cols, values = [], [], []
    for i, text in enumerate(texts):
        for word, n in Counter(WORD.findall(text.lower())).items():
            if word in vocabulary:
                rows.append(i)
                cols.append(vocabulary[word])
                values.append(float(n))
    x = torch.zeros(len(texts), len(vocabulary))
    x[rows, cols] = torch.log1p(torch.tensor(values))
    return F.normalize(x, dim=1)


def logistic_regression(x: torch.Tensor, y: torch.Tensor, classes: int, l2: float) -> torch.nn.Linear:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = torch.nn.Linear(x.size(1), classes)
    optimizer = torch.optim.LBFGS(model.parameters(), max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y) + l2 * model.weight.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return model


def baselines() -> list[dict]:
    """One row per baseline and held-out split."""
    import torch

    from lit_transformer.data import corpora

    rows = []
    torch.set_num_threads(1)
    data = corpora.shakespeare_genre()
    names = sorted(set(data["train"]["label"]))
    y = {s: torch.tensor([names.index(label) for label in data[s]["label"]]) for s in data}
    counts = Counter(w for text in data["train"]["text"] for w in WORD.findall(text.lower()))
    vocabulary = {w: i for i, w in enumerate(sorted(w for w, n in counts.items() if n >= 2))}
    x = {s: features(data[s]["text"], vocabulary) for s in data}
    majority = int(torch.bincount(y["train"]).argmax())
    for split in ("validation", "test"):
        predicted = torch.full_like(y[split], majority)
        accuracy = (predicted == y[split]).float().mean().item()
        f1 = macro_f1(predicted, y[split], len(names))
        rows.append(
            {"baseline": "majority", "class": names[majority], "split": split, "accuracy": accuracy, "macro_f1": f1}
        )
    best = None
    for l2 in (1e-5, 1e-4, 1e-3, 1e-2):
        model = logistic_regression(x["train"], y["train"], len(names), l2)
        with torch.no_grad():
            f1 = macro_f1(model(x["validation"]).argmax(-1), y["validation"], len(names))
        if best is None or f1 > best[0]:
            best = (f1, l2, model)
    _, l2, model = best
    with torch.no_grad():
        for split in ("validation", "test"):
            predicted = model(x[split]).argmax(-1)
            accuracy = (predicted == y[split]).float().mean().item()
            f1 = macro_f1(predicted, y[split], len(names))
            rows.append(
                {
                    "baseline": "bow-logreg",
                    "l2": l2,
                    "vocabulary": len(vocabulary),
                    "split": split,
                    "accuracy": accuracy,
                    "macro_f1": f1,
                }
            )
    return rows


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = command_parser("bench genre-baselines", __doc__)
    parser.add_argument("--json", type=Path | None, default=None, help="add the rows to this file's record 'baselines'")
    args = parse(parser, argv)
    runs_file(args.json, name="baselines")  # before the half-minute of work, not after it
    facts = machine()
    rows = baselines()
    for row in rows:
        print(json.dumps(row))
    if args.json:
        write_run(args.json, {"rows": rows}, command=command_line("bench genre-baselines", argv), machine=facts,
                  name="baselines")  # fmt: skip
