"""The simple baseline of the embedded captioning task: a per-position classifier.

It is told what the Transformer must find out for itself: that a strip is a row of 8-pixel slots, one digit each.
One logistic regression reads any slot's 64 pixels and names its digit or "blank"; a strip's caption is the words of
its slots up to the first blank. Scored as the captioning model is: exact match and sacreBLEU on the same test strips
(composed from held-out scans).

    python -m lit_transformer bench caption-baseline --json docs/caption_baseline.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from jsonargparse.typing import PositiveInt

from lit_transformer.bench.checks import runs_file
from lit_transformer.cli.arguments import command_parser, parse
from lit_transformer.records import clock, command_line, machine, write_run

if TYPE_CHECKING:
    import numpy as np

BLANK = 10


def slots(images: np.ndarray, width: int = 8) -> np.ndarray:
    """(N, 1, 8, 8 * K) strips to (N, K, 64) slot pixels."""
    n, _, h, w = images.shape
    return images.reshape(n, h, w // width, width).transpose(0, 2, 1, 3).reshape(n, w // width, h * width)


def slot_labels(digits: list[list[int]], k: int) -> np.ndarray:
    import numpy as np

    return np.array([d + [BLANK] * (k - len(d)) for d in digits])


def baseline(train_strips: int, test_strips: int) -> dict:
    """Fit the per-slot classifier on `train_strips` strips and score its captions of `test_strips` test strips."""
    import numpy as np
    import sacrebleu
    from sklearn.linear_model import LogisticRegression

    from lit_transformer.data.corpora.digits import DIGIT_WORDS, digit_strips

    train, test = digit_strips("train", train_strips), digit_strips("test", test_strips)
    k = train.images.shape[-1] // 8
    x, y = slots(train.images).reshape(-1, 64), slot_labels(train.digits, k).reshape(-1)
    classifier = LogisticRegression(max_iter=2000).fit(x, y)
    predicted = classifier.predict(slots(test.images).reshape(-1, 64)).reshape(len(test), k)
    captions = []
    for row in predicted:
        words = []
        for label in row:
            if label == BLANK:
                break
            words.append(DIGIT_WORDS[label])
        captions.append(" ".join(words))
    references = test.captions
    return {
        "baseline": "per-position logistic regression (slots given)",
        "train_strips": train_strips,
        "test_strips": test_strips,
        "exact_match": float(np.mean([c == r for c, r in zip(captions, references, strict=True)])),
        "bleu": sacrebleu.corpus_bleu(captions, [references]).score,
        "slot_accuracy": float(np.mean(predicted == slot_labels(test.digits, k))),
    }


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = command_parser("bench caption-baseline", __doc__)
    parser.add_argument("--train", type=PositiveInt, default=20000, help="training strips (the preset's strips[0])")
    parser.add_argument("--test", type=PositiveInt, default=1000, help="test strips (the preset's strips[2])")
    parser.add_argument("--json", type=Path | None, default=None, help="add this run to the runs of this file")
    args = parse(parser, argv)
    runs_file(args.json)
    facts = machine()
    with clock() as took:
        result = baseline(args.train, args.test)
    result["seconds"] = round(took["wall_s"], 1)
    command = command_line("bench caption-baseline", argv)
    print(json.dumps({**result, "command": command}, indent=1))
    if args.json:
        write_run(args.json, result, command=command, machine=facts)
