"""What both DataModules share: finding the source, normalising its splits, tokenizing documents with a cache."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import datasets
import numpy as np
from tokenizers import Tokenizer

from .cache import cached_array, fingerprint, hash_texts
from .sources import SPLIT_ALIASES

SPLITS = ("train", "validation", "test")


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


def hash_bucket(text: str) -> int:
    return int(hashlib.md5(text.encode("utf-8", "surrogatepass")).hexdigest(), 16) % 100


def _pieces(text: str, size: int = 1 << 14) -> list[str]:
    """A document in pieces of about `size` characters at line boundaries, to encode them in parallel."""
    if len(text) <= size:
        return [text]
    pieces, start = [], 0
    while start < len(text):
        end = text.find("\n", start + size)
        end = len(text) if end < 0 else end + 1
        pieces.append(text[start:end])
        start = end
    return pieces


def encode_stream(tokenizer: Tokenizer, texts: Sequence[str], eos_id: int | None) -> np.ndarray:
    """All documents as one token stream, each followed by eos (when the vocabulary has one)."""
    pieces, owner = [], []
    for doc, text in enumerate(texts):
        for piece in _pieces(text):
            pieces.append(piece)
            owner.append(doc)
    encoded = tokenizer.encode_batch(pieces, add_special_tokens=False)
    dtype = np.uint16 if tokenizer.get_vocab_size() <= np.iinfo(np.uint16).max else np.int32
    parts: list[np.ndarray] = []
    for i, encoding in enumerate(encoded):
        parts.append(np.asarray(encoding.ids, dtype=dtype))
        last_of_doc = i + 1 == len(encoded) or owner[i + 1] != owner[i]
        if last_of_doc and eos_id is not None:
            parts.append(np.asarray([eos_id], dtype=dtype))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def encode_ragged(tokenizer: Tokenizer, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Each text's ids, as one flat array and offsets (n + 1) into it."""
    encoded = tokenizer.encode_batch(list(texts), add_special_tokens=False)
    lengths = np.fromiter((len(e.ids) for e in encoded), dtype=np.int64, count=len(encoded))
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.fromiter((i for e in encoded for i in e.ids), dtype=np.int32, count=int(offsets[-1]))
    return flat, offsets


def cached_stream(
    cache_dir: Path, tokenizer: Tokenizer, tokenizer_key: str, texts: Sequence[str], eos_id
) -> np.ndarray:
    key = fingerprint("lm-stream", 1, tokenizer_key, hash_texts(texts), eos_id)
    return cached_array(cache_dir / "tokens" / f"stream-{key}.npy", lambda: encode_stream(tokenizer, texts, eos_id))


class SplitLoaders:
    """The four Lightning loader hooks of a DataModule, from its `_loader(split, shuffle)`; predict reads the test split."""

    def _loader(self, split: str, shuffle: bool):
        raise NotImplementedError

    def train_dataloader(self):
        return self._loader("train", shuffle=True)

    def val_dataloader(self):
        return self._loader("validation", shuffle=False)

    def test_dataloader(self):
        return self._loader("test", shuffle=False)

    def predict_dataloader(self):
        return self._loader("test", shuffle=False)
