"""A text corpus in token shards: its documents streamed through `preparation.py` once, then read as blocks.

A prepared corpus (under <cache>/shards/<key>/) has one token file per shard, `shard-00000.bin`: each document's ids
then EOS, and `shard-00000.docs.npy`, where each document starts (int64 token offsets). Shards end at document
boundaries; a long document is encoded in line-bounded pieces.

Training reads blocks through short-lived memory maps: a map is opened for the rows of one batch and dropped, so the
pages it touched are not kept mapped and the resident memory stays flat however much of the corpus is read.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from torch.utils.data import Dataset

from .loaders import stack_blocks
from .preparation import SHARD_TOKENS, RecordKind, prepare
from .streaming import CorpusStream


class TextKind(RecordKind):
    """A corpus's documents: one side, each document's ids then EOS; `docs.npy` holds where documents start."""

    folder, tag, sides, starts, counter = "shards", "shards", ("",), "docs.npy", "documents"
    split_long = True

    def starts_array(self, starts: list[np.ndarray], tokens: list[int]) -> np.ndarray:
        return starts[0]

    def shard_entry(self, name: str, tokens: list[int], records: int) -> dict:
        return {"file": f"{name}.bin", "tokens": tokens[0], "documents": records}

    def index(self, progress: dict, dtype: np.dtype, keep_text: bool) -> dict:
        return {
            "dtype": dtype.name,
            "shards": progress["shards"],
            "tokens": sum(s["tokens"] for s in progress["shards"]),
            "documents": sum(s["documents"] for s in progress["shards"]),
            "characters": progress["characters"],
            "bytes": progress["bytes"],
        }

    def summary(self, indexes: dict[str, dict]) -> str:
        return f"shards { {s: len(i['shards']) for s, i in indexes.items()} }"


TEXT = TextKind()


def sample_texts(stream: CorpusStream, max_chars: int) -> list[str]:
    """The first `max_chars` characters of the training split, as documents: a bounded sample to train a tokenizer
    on (the training text itself when it is smaller)."""
    texts, parts, total = [], [], 0
    for piece in stream.records_of("train"):
        text = piece.text[: max_chars - total]
        parts.append(text)
        total += len(text)
        if piece.last or total >= max_chars:
            document = "".join(parts)
            parts = []
            if document.strip():
                texts.append(document)
            if total >= max_chars:
                break
    return texts


def prepare_corpus(
    stream: CorpusStream,
    tokenizer: Tokenizer,
    tokenizer_key: str,
    eos_id: int | None,
    cache_dir: Path,
    max_chars: int | None = None,
    shard_tokens: int = SHARD_TOKENS,
) -> Path:
    """Prepare every split of `stream` once (cached by content; resumable; atomic); the prepared corpus's folder.
    max_chars: the training split is cut after this many characters."""
    info = {"eos_id": eos_id, "vocab_size": tokenizer.get_vocab_size(), "tokenizer_key": tokenizer_key}
    return prepare(
        stream, TEXT, (tokenizer,), (tokenizer_key, eos_id), cache_dir, info, eos_id, max_chars, shard_tokens
    )


# ---------------------------------------------------------------------------------------------------- read


class TokenShards:
    """One prepared split: its shards as one sequence of tokens, read through short-lived memory maps."""

    def __init__(self, directory: Path, index: dict) -> None:
        self.directory = Path(directory)
        self.dtype = np.dtype(index["dtype"])
        self.paths = [str(self.directory / s["file"]) for s in index["shards"]]
        self.counts = np.array([s["tokens"] for s in index["shards"]], dtype=np.int64)
        self.characters = int(index["characters"])
        self.documents = int(index["documents"])

    def __len__(self) -> int:
        return int(self.counts.sum())

    def open(self, shard: int) -> np.memmap | np.ndarray:
        count = int(self.counts[shard])
        if not count:  # documents that encode to nothing (a vocabulary without EOS): no byte to map
            return np.zeros(0, dtype=self.dtype)
        return np.memmap(self.paths[shard], dtype=self.dtype, mode="r", shape=(count,))

    def head(self, n: int) -> np.ndarray:
        """The first n tokens (a copy; for inspection)."""
        parts, left = [], n
        for shard in range(len(self.paths)):
            if left <= 0:
                break
            parts.append(np.array(self.open(shard)[:left]))
            left -= len(parts[-1])
        return np.concatenate(parts) if parts else np.zeros(0, dtype=self.dtype)

    def blocks(self, block_size: int) -> ShardBlocks:
        return ShardBlocks(self, block_size)


class ShardBlocks(Dataset):
    """Blocks of block_size + 1 tokens within each shard, each overlapping the next by one token (as BlockDataset):
    inputs are a block's first T tokens, labels its last T. A shard's last partial block is left out (under one
    block per shard of 64M tokens)."""

    def __init__(self, shards: TokenShards, block_size: int) -> None:
        self.shards = shards
        self.block_size = block_size
        per_shard = np.maximum(0, (shards.counts - 1) // block_size)
        self.first = np.concatenate([[0], np.cumsum(per_shard)]).astype(np.int64)
        self._offsets = np.arange(block_size + 1)

    def __len__(self) -> int:
        return int(self.first[-1])

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {k: v[0] for k, v in self.__getitems__([index]).items()}

    def __getitems__(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        indices = np.asarray(indices, dtype=np.int64)
        if len(indices) and (indices.min() < 0 or indices.max() >= len(self)):
            raise IndexError(f"block index out of range [0, {len(self)})")
        shard_of = np.searchsorted(self.first, indices, side="right") - 1
        out = np.empty((len(indices), self.block_size + 1), dtype=self.shards.dtype)
        for shard in np.unique(shard_of):
            rows = shard_of == shard
            starts = (indices[rows] - self.first[shard]) * self.block_size
            tokens = self.shards.open(int(shard))  # mapped for this batch only: no page stays mapped
            out[rows] = tokens[starts[:, None] + self._offsets]
            del tokens
        return stack_blocks(out)


def load_prepared(root: Path) -> tuple[dict, dict[str, TokenShards]]:
    """A prepared corpus's manifest and its splits."""
    info = json.loads((Path(root) / "manifest.json").read_text())
    return info, {split: TokenShards(Path(root) / split, info["splits"][split]) for split in info["splits"]}
