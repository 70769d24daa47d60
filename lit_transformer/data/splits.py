"""The three splits, and the held-out splits carved from train when a source lacks them.

A training record (a document, a sentence pair, a labelled text) goes to a held-out split by a hash of its text, so
its duplicates always land in the same split and its position in the source does not matter. Each missing held-out
split takes `held_out` of the hash buckets; train keeps the rest. A handful of long documents is carved by lines
instead (`line_range`): each document gives train its first lines and each held-out split a share of the rest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence

SPLITS = ("train", "validation", "test")
HELD_OUT = 0.05  # the fraction of the training source each missing held-out split takes


def missing_splits(present: Collection[str]) -> list[str]:
    """The held-out splits a source lacks, in order: they are carved from its training split."""
    return [split for split in SPLITS[1:] if split not in present]


def digest_bucket(hexdigest: str) -> int:
    """A hash bucket, 0 to 99, from a hexadecimal digest."""
    return int(hexdigest, 16) % 100


def hash_bucket(*texts: str) -> int:
    """The hash bucket of a record's texts (a pair's two sides joined by a tab)."""
    return digest_bucket(hashlib.md5("\t".join(texts).encode("utf-8", "surrogatepass")).hexdigest())


def carve(bucket: int, missing: Sequence[str], held_out: float = HELD_OUT) -> str:
    """The split of a training record in `bucket`: each missing held-out split takes `held_out` of the buckets."""
    index = int(bucket // (held_out * 100))
    return missing[index] if index < len(missing) else "train"


def held_out_split(*texts: str, missing: Sequence[str], held_out: float = HELD_OUT) -> str:
    """The one carving: the split of a training record by a hash of its content (its texts, a pair's sides joined
    by a tab; a verse's key; an image's name), when `missing` held-out splits are carved from train.

    Each embedded corpus that is split by hash goes through here too; KJV-RV1909 keeps the layout its caches were
    built with (test first, 2% each: `missing=("test", "validation"), held_out=0.02`)."""
    return carve(hash_bucket(*texts), missing, held_out)


def line_range(split: str, missing: Sequence[str], held_out: float = HELD_OUT) -> tuple[float, float]:
    """The fraction of each document `split` takes when carving by lines: train first, then the held-out splits."""
    n = len(missing)
    train_end = 1 - held_out * n
    if split == "train":
        return 0.0, train_end
    i = missing.index(split)
    return train_end + held_out * i, train_end + held_out * (i + 1) if i + 1 < n else 1.0
