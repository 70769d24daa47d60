"""What both DataModules share: finding the source, normalising its splits, tokenizing documents with a cache."""

from __future__ import annotations

from collections.abc import Sequence

import datasets
import numpy as np
from tokenizers import Tokenizer

from .encoding import token_ids
from .sources import SPLIT_ALIASES
from .splits import SPLITS as SPLITS  # re-exported: the DataModules read it here


def normalise_splits(data: datasets.DatasetDict) -> datasets.DatasetDict:
    """Rename valid/dev/val to validation; keep train/validation/test only; insist on train."""
    renamed = {}
    for name, split in data.items():
        canonical = SPLIT_ALIASES.get(name.lower())
        if canonical and canonical not in renamed:
            renamed[canonical] = split
    if "train" not in renamed:
        raise ValueError(f"The dataset has no training split (found splits: {sorted(data)})")
    return datasets.DatasetDict(renamed)


def require_columns(data: datasets.DatasetDict, columns: Sequence[str], what: str) -> None:
    for name, split in data.items():
        missing = [c for c in columns if c not in split.column_names]
        if missing:
            raise ValueError(
                f"{what}: split {name!r} has no column {', '.join(map(repr, missing))}; "
                f"its columns are {split.column_names}"
            )


def encode_ragged(tokenizer: Tokenizer, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Each text's ids, as one flat array and offsets (n + 1) into it."""
    encoded = token_ids(tokenizer, texts)
    lengths = np.fromiter((len(ids) for ids in encoded), dtype=np.int64, count=len(encoded))
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.fromiter((i for ids in encoded for i in ids), dtype=np.int32, count=int(offsets[-1]))
    return flat, offsets
