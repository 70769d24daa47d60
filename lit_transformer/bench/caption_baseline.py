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
import time

import numpy as np
import sacrebleu
from sklearn.linear_model import LogisticRegression

from lit_transformer.bench import command_parser
from lit_transformer.data.corpora.digits import DIGIT_WORDS, digit_strips
from lit_transformer.records import command_line, machine

BLANK = 10


def slots(images: np.ndarray, width: int = 8) -> np.ndarray:
    """(N, 1, 8, 8 * K) strips to (N, K, 64) slot pixels."""
    n, _, h, w = images.shape
    return images.reshape(n, h, w // width, width).transpose(0, 2, 1, 3).reshape(n, w // width, h * width)


def slot_labels(digits: list[list[int]], k: int) -> np.ndarray:
    return np.array([d + [BLANK] * (k - len(d)) for d in digits])


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = command_parser("bench caption-baseline", __doc__)
    parser.add_argument("--train", type=int, default=20000, help="training strips (the preset's strips[0])")
    parser.add_argument("--test", type=int, default=1000, help="test strips (the preset's strips[2])")
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    train, test = digit_strips("train", args.train), digit_strips("test", args.test)
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
    result = {
        "baseline": "per-position logistic regression (slots given)",
        "train_strips": args.train,
        "test_strips": args.test,
        "exact_match": float(np.mean([c == r for c, r in zip(captions, references, strict=True)])),
        "bleu": sacrebleu.corpus_bleu(captions, [references]).score,
        "slot_accuracy": float(np.mean(predicted == slot_labels(test.digits, k))),
        "seconds": round(time.perf_counter() - start, 1),
        "command": command_line("caption-baseline", argv),
        "machine": machine(),
    }
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=1)
            handle.write("\n")
