"""Translation pairs at any scale: streamed row by row into token shards once (`preparation.py`), then read through
memory maps and batched by a token budget planned from the index alone.

A prepared pair corpus (under <cache>/pairs/<key>/) holds per shard:

    shard-00000.src.bin    the source ids of the shard's pairs, back to back (uint16 when the vocabularies fit)
    shard-00000.tgt.bin    the target ids, likewise
    shard-00000.pairs.npy  (pairs + 1, 2) int64: where each pair's source and target ids start (the index)
    shard-00000.text.bin   validation and test only: the pairs' UTF-8 text (source, target, source, ...),
    shard-00000.text.npy   and its 2 x pairs + 1 byte offsets (BLEU compares with the text, not the ids)

Rows are read one at a time (JSON lines, CSV/TSV, parquet record batches, a hub stream); each side is tokenized by
its tokenizer, shared or not. Held-out splits, for a source without them, are pairs picked by a hash of the pair (5%
each, `splits.py`), so a pair and its duplicates always land in the same split.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from torch.utils.data import Dataset

from .encoding import IGNORE_INDEX
from .preparation import SHARD_TOKENS, RecordKind, prepare
from .sources import BUILDERS
from .splits import HELD_OUT, held_out_split
from .streaming import Source, SplitStream, column_value, columns_of, records, table_rows

# ---------------------------------------------------------------------------------------------------- batches


def target_batch(rows: Sequence[Sequence[int]], pad_id: int, bos_id: int, eos_id: int) -> dict[str, torch.Tensor]:
    """The decoder's side of a batch (translation, captioning): tgt_in is bos then the tokens, labels the tokens then
    eos (IGNORE_INDEX at padding), tgt_mask True on real positions; the mask comes from the lengths, never a token id."""
    width = max(map(len, rows)) + 1
    tgt_in = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    for b, row in enumerate(rows):
        t = torch.as_tensor(np.asarray(row, dtype=np.int64))
        tgt_in[b, 0], tgt_in[b, 1 : len(t) + 1] = bos_id, t
        labels[b, : len(t)], labels[b, len(t)] = t, eos_id
    tgt_mask = torch.arange(width)[None, :] <= torch.tensor([len(r) for r in rows])[:, None]
    return {"tgt_in": tgt_in, "labels": labels, "tgt_mask": tgt_mask}


def collate_pairs(
    srcs: Sequence[np.ndarray],
    tgts: Sequence[np.ndarray],
    pad_id: int,
    bos_id: int,
    eos_id: int,
    texts: tuple[list[str], list[str]] | None = None,
) -> dict:
    """A padded batch: src is the source then eos, with its mask from the lengths; the target side is target_batch."""
    batch_size, src_len = len(srcs), max(map(len, srcs)) + 1
    src = torch.full((batch_size, src_len), pad_id, dtype=torch.long)
    for b, s in enumerate(srcs):
        src[b, : len(s)] = torch.from_numpy(s.astype(np.int64))
        src[b, len(s)] = eos_id
    src_mask = torch.arange(src_len)[None, :] <= torch.tensor([len(s) for s in srcs])[:, None]
    batch = {"src": src, "src_mask": src_mask, **target_batch(tgts, pad_id, bos_id, eos_id)}
    if texts is not None:
        batch["src_text"], batch["ref_text"] = list(texts[0]), list(texts[1])
    return batch


# ---------------------------------------------------------------------------------------------------- the stream


@dataclass
class Pair:
    source: str  # stripped; an empty side means the row is dropped
    target: str
    row: int  # the row's index in its source split (a resumed preparation reads past the rows before)
    nbytes: int  # input bytes it accounts for (progress in MB/s)
    last = True  # each pair is a record of its own

    @property
    def texts(self) -> tuple[str, str]:
        return self.source, self.target

    @property
    def document(self) -> int:
        return self.row


def _as_text(value, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"{where}: a side of a pair must be text, found {type(value).__name__} {str(value)[:40]!r}")
    return value.strip()


class PairStream(SplitStream):
    """Each split's sentence pairs as a stream, read row by row; held-out splits carved from train when missing.

    dataset: local .jsonl/.json/.csv/.tsv/.parquet files (a file, folder or glob), a hub name, or an embedded
    corpus's DatasetDict (given as `embedded`). A row's pair is its `translation` {language: text} mapping, or its
    two columns named by source_column/target_column (default: the language codes).
    """

    key = "pairs"
    local_hint = "of pairs (.jsonl/.json, .csv/.tsv, .parquet), a hub dataset name, or the embedded kjv-rv1909"

    def __init__(
        self,
        dataset: str,
        dataset_config: str | None = None,
        source_lang: str = "en",
        target_lang: str = "es",
        source_column: str | None = None,
        target_column: str | None = None,
        embedded=None,
        held_out: float = HELD_OUT,
    ) -> None:
        self.langs = (source_lang, target_lang)
        self.explicit = bool(source_column or target_column)
        self.columns = (source_column or source_lang, target_column or target_lang)
        self._read_columns: dict[str, list[str] | None] = {}
        super().__init__(dataset, dataset_config, embedded, held_out)

    def _columns(self) -> list[str]:
        return list(self.columns)

    def _settings(self) -> tuple:
        return self.langs, self.columns, self.explicit

    def _check_files(self, files: list[str]) -> None:
        other = sorted({Path(f).suffix.lower() for f in files} - set(BUILDERS))
        if other:
            raise ValueError(f"{self.dataset!r}: pairs come from .jsonl/.json/.csv/.tsv/.parquet files, not {other}")

    # ------------------------------------------------------------------ the stream of a split

    def routed(self, source_name: str, skip: int = 0) -> Iterator[tuple[str | None, Pair]]:
        """(split, pair) for every row of one pass over a source split, from row `skip` on; split is None for a
        row with an empty side (dropped). The training source also feeds carved held-out splits, by pair hash."""
        carving = source_name == "train" and bool(self.missing)
        for row, (source, target, nbytes) in enumerate(self._rows(self.sources[source_name])):
            if row < skip:
                continue
            pair = Pair(source, target, row, nbytes)
            if not source or not target:
                yield None, pair
            else:
                split = held_out_split(source, target, missing=self.missing, held_out=self.held_out)
                yield (split if carving else source_name), pair

    def pairs(self, split: str) -> Iterator[tuple[str, str]]:
        """The (source, target) pairs of `split` in order, rows with an empty side left out."""
        for pair in self.records_of(split):
            yield pair.source, pair.target

    def _rows(self, source: Source) -> Iterator[tuple[str, str, int]]:
        """(source text, target text, input bytes) per row, stripped."""
        if source.table is not None:
            for number, row in enumerate(table_rows(source.table), 1):
                source_text, target_text = self._pair(row, f"{self.dataset} ({source.origin[-1]}) row {number}")
                yield source_text, target_text, len(source_text) + len(target_text) if source.in_memory else 0
            return
        for path in source.files:
            for row, nbytes, number in records(path, self._read_columns.get(path)):
                yield *self._pair(row, f"{path}:{number}"), nbytes

    def _pair(self, row: dict, where: str) -> tuple[str, str]:
        """A row's (source, target): from its translation mapping by language, else from its two columns."""
        translation = not self.explicit and "translation" in row
        values, keys = (row["translation"], self.langs) if translation else (row, self.columns)
        if not isinstance(values, dict):
            raise ValueError(f"{where}: the translation column holds {type(values).__name__}, not a mapping")
        found = {}
        for key in keys:
            try:
                found[key] = column_value(values, key)
            except KeyError:
                pass
        missing = [key for key in keys if key not in found]
        if missing and translation:
            raise ValueError(
                f"{self.dataset!r}: the translation column has no language {missing}; it has {sorted(values)} ({where})"
            )
        if missing:
            raise ValueError(
                f"dataset {self.dataset!r}: {where} has no column {', '.join(map(repr, missing))}; its columns are "
                f"{sorted(values)} (set source_column/target_column)"
            )
        return _as_text(found[keys[0]], where), _as_text(found[keys[1]], where)

    def _check_columns(self, path: str) -> None:
        """A file without the pair's columns fails at once, naming the columns it has."""
        columns = columns_of(path)
        if columns is None:
            return
        if not self.explicit and "translation" in columns:
            self._read_columns[path] = ["translation"]
            return
        missing = [c for c in self.columns if c.split(".")[0] not in columns]
        if missing:
            raise ValueError(
                f"dataset {self.dataset!r}: {path} has no column {', '.join(map(repr, missing))}; its columns are "
                f"{columns} (set source_column/target_column, or source_lang/target_lang)"
            )
        self._read_columns[path] = list(dict.fromkeys(c.split(".")[0] for c in self.columns))


def sample_pairs(stream: PairStream, max_chars: int, max_pairs: int | None = None) -> tuple[list[str], list[str]]:
    """The first training pairs, up to `max_chars` characters (both sides) and `max_pairs` pairs: a bounded sample
    to train tokenizers on (the training split itself when it is smaller)."""
    sources, targets, total = [], [], 0
    for source, target in stream.pairs("train"):
        if total >= max_chars or (max_pairs is not None and len(sources) >= max_pairs):
            break
        sources.append(source)
        targets.append(target)
        total += len(source) + len(target)
    return sources, targets


# ---------------------------------------------------------------------------------------------------- prepare


class PairKind(RecordKind):
    """Sentence pairs: a source and a target side, `pairs.npy` the starts of both; held-out splits keep their text."""

    folder, tag, sides, starts, counter = "pairs", "pair-shards", ("src", "tgt"), "pairs.npy", "rows"
    noun = " pairs"

    def new_progress(self) -> dict:
        return {**super().new_progress(), "empty": 0}

    def keeps_text(self, split: str) -> bool:
        return split != "train"

    def budget(self, progress: dict, limit: int | None) -> dict[str, int | None]:
        done = sum(s["pairs"] for s in progress["shards"])
        return {"max_records": None if limit is None else max(0, limit - done)}

    def starts_array(self, starts: list[np.ndarray], tokens: list[int]) -> np.ndarray:
        return np.concatenate([np.stack(starts, axis=1), np.array([tokens], dtype=np.int64)])

    def shard_entry(self, name: str, tokens: list[int], records: int) -> dict:
        return {"name": name, "pairs": records, "src_tokens": tokens[0], "tgt_tokens": tokens[1]}

    def index(self, progress: dict, dtype: np.dtype, keep_text: bool) -> dict:
        shards = progress["shards"]
        return {
            "dtype": dtype.name,
            "shards": shards,
            "pairs": sum(s["pairs"] for s in shards),
            "src_tokens": sum(s["src_tokens"] for s in shards),
            "tgt_tokens": sum(s["tgt_tokens"] for s in shards),
            "characters": progress["characters"],
            "bytes": progress["bytes"],
            "empty": progress.get("empty", 0),
            "text": keep_text,
        }

    def summary(self, indexes: dict[str, dict]) -> str:
        return f"pairs { {s: i['pairs'] for s, i in indexes.items()} }"

    def check(self, stream: PairStream, splits: dict[str, dict]) -> None:
        empty = sum(index.get("empty", 0) for index in splits.values())
        if empty:
            warnings.warn(f"{stream.dataset}: dropped {empty} pairs with an empty side", stacklevel=4)
        if not splits["train"]["pairs"]:
            raise ValueError(f"{stream.dataset!r} has no sentence pairs in its training split")
        for name in ("validation", "test"):
            if splits[name]["pairs"]:
                continue
            if name in stream.missing:
                total = sum(index["pairs"] for index in splits.values())
                raise ValueError(
                    f"{stream.dataset!r} has {total} pairs and no {name} split: the held-out splits take "
                    f"{stream.held_out:.0%} each, picked by a hash of the pair, and this one got none. Give at least about "
                    f"{int(20 / stream.held_out)} pairs, or files named train*/valid*/test* to choose the splits yourself"
                )
            raise ValueError(f"{stream.dataset!r} has no {name} pairs; provide a {name} split (e.g. a {name}.tsv file)")


PAIRS = PairKind()


def prepare_pairs(
    stream: PairStream,
    tokenizers: tuple[Tokenizer, Tokenizer],
    tokenizer_keys: tuple[str, str],
    cache_dir: Path,
    max_pairs: int | None = None,
    shard_tokens: int = SHARD_TOKENS,
    workers: int | None = None,
) -> Path:
    """Prepare every split of `stream` once (cached by content; resumable; atomic); the prepared corpus's folder.
    max_pairs: the training split is cut after this many pairs (the rest of a source with its own held-out splits
    is not read)."""
    info = {"vocab_sizes": [t.get_vocab_size() for t in tokenizers], "tokenizer_keys": list(tokenizer_keys)}
    keys = (list(tokenizer_keys),)
    return prepare(stream, PAIRS, tokenizers, keys, cache_dir, info, None, max_pairs, shard_tokens, workers)


# ---------------------------------------------------------------------------------------------------- read


class PairShards:
    """One prepared split: the pairs' lengths from the index (16 bytes per pair, read whole), their ids and texts
    through memory maps opened for one batch and dropped, so no page of the corpus stays mapped."""

    def __init__(self, directory: Path, index: dict) -> None:
        self.directory = Path(directory)
        self.dtype = np.dtype(index["dtype"])
        self.names = [s["name"] for s in index["shards"]]
        self.offsets = [np.load(self.directory / f"{name}.pairs.npy") for name in self.names]
        counts = [len(o) - 1 for o in self.offsets]
        self.first = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        lengths = [np.diff(o, axis=0) for o in self.offsets] or [np.zeros((0, 2), np.int64)]
        lengths = np.concatenate(lengths).astype(np.int32)
        self.source_lengths, self.target_lengths = lengths[:, 0], lengths[:, 1]
        self.has_text = bool(index.get("text"))
        self.characters = int(index.get("characters", 0))

    def __len__(self) -> int:
        return int(self.first[-1])

    def _map(self, name: str, suffix: str, dtype) -> np.memmap | np.ndarray:
        path = self.directory / f"{name}.{suffix}"
        return np.memmap(path, dtype=dtype, mode="r") if path.stat().st_size else np.zeros(0, dtype)

    def read(self, rows: Sequence[int]) -> tuple[list[np.ndarray], list[np.ndarray], tuple[list, list] | None]:
        """The source ids, target ids (copies) and, when kept, the texts of the pairs at `rows`."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) and (rows.min() < 0 or rows.max() >= len(self)):
            raise IndexError(f"pair index out of range [0, {len(self)})")
        shard_of = np.searchsorted(self.first, rows, side="right") - 1
        srcs: list = [None] * len(rows)
        tgts: list = [None] * len(rows)
        texts = ([None] * len(rows), [None] * len(rows)) if self.has_text else None
        for shard in np.unique(shard_of).tolist():
            name, offsets = self.names[shard], self.offsets[shard]
            src, tgt = self._map(name, "src.bin", self.dtype), self._map(name, "tgt.bin", self.dtype)
            text = self._map(name, "text.bin", np.uint8) if texts is not None else None
            ends = np.load(self.directory / f"{name}.text.npy", mmap_mode="r") if texts is not None else None
            for b in np.flatnonzero(shard_of == shard).tolist():
                local = int(rows[b] - self.first[shard])
                (s0, t0), (s1, t1) = offsets[local], offsets[local + 1]
                srcs[b], tgts[b] = np.array(src[s0:s1]), np.array(tgt[t0:t1])
                if texts is not None:
                    for side in (0, 1):
                        a, z = int(ends[2 * local + side]), int(ends[2 * local + side + 1])
                        texts[side][b] = bytes(text[a:z]).decode("utf-8", "surrogatepass")
            del src, tgt, text, ends  # the maps close here: nothing stays mapped between batches
        return srcs, tgts, texts


class ShardPairDataset(Dataset):
    """The pairs of one prepared split that pass the length filter (`keep`), collated into padded batches exactly as
    the in-memory PairDataset collates them."""

    def __init__(self, shards: PairShards, keep: np.ndarray, pad_id: int, bos_id: int, eos_id: int) -> None:
        self.shards, self.keep = shards, np.asarray(keep, dtype=np.int64)
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id

    def __len__(self) -> int:
        return len(self.keep)

    def source_lengths(self) -> np.ndarray:
        return self.shards.source_lengths[self.keep].astype(np.int64) + 1  # + eos

    def target_lengths(self) -> np.ndarray:
        return self.shards.target_lengths[self.keep].astype(np.int64) + 1  # + bos (inputs) or + eos (labels)

    def __getitem__(self, index: int) -> dict:
        return self.__getitems__([index])

    def __getitems__(self, indices) -> dict:
        srcs, tgts, texts = self.shards.read(self.keep[np.asarray(indices, dtype=np.int64)])
        return collate_pairs(srcs, tgts, self.pad_id, self.bos_id, self.eos_id, texts)


def load_prepared_pairs(root: Path) -> tuple[dict, dict[str, PairShards]]:
    """A prepared pair corpus's manifest and its splits."""
    info = json.loads((Path(root) / "manifest.json").read_text())
    return info, {split: PairShards(Path(root) / split, info["splits"][split]) for split in info["splits"]}
