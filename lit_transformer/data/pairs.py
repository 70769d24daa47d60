"""Translation pairs at any scale: streamed row by row into token shards once, then read through memory maps and
batched by a token budget planned from the index alone.

Layout of one prepared pair corpus (under <cache>/pairs/<key>/, the key a hash of the corpus's content, the
tokenizers and the settings, so a changed input never reuses a stale entry):

    manifest.json                  written last: its presence means every split is complete
    <split>/shard-00000.src.bin    the source ids of the shard's pairs, back to back (uint16 when the vocabularies fit)
    <split>/shard-00000.tgt.bin    the target ids, likewise
    <split>/shard-00000.pairs.npy  (pairs + 1, 2) int64: where each pair's source and target ids start (the index)
    <split>/shard-00000.text.bin   validation and test only: the pairs' UTF-8 text (source, target, source, ...),
    <split>/shard-00000.text.npy   and its 2 x pairs + 1 byte offsets (BLEU compares with the text, not the ids)
    <split>/progress.json          finished shards and how many source rows they cover (for resuming)
    <split>/index.json             the split's shards and counts (written when the split is done)

The machinery is the language model's (`shards.py`): rows are read one at a time (JSON lines, CSV/TSV, parquet
record batches, a hub stream), grouped into chunks of a few megabytes, tokenized by worker processes for a big
source (each side by its tokenizer, shared or not), and appended to shards written to temporary files, fsynced and
renamed when complete. A killed run resumes after its last finished shard. Held-out splits, for a source without
them, are pairs picked by a hash of the pair (5% each), so a pair and its duplicates always land in the same split.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from torch.utils.data import Dataset

from ..tasks.losses import IGNORE_INDEX
from .cache import atomic_write, fingerprint, locked
from .shards import (
    CHUNK_CHARS,
    POOL_MIN_BYTES,
    SHARD_TOKENS,
    FileHashes,
    _Chunk,
    _Encoder,
    _prefetch,
    _progress_bar,
    _save_npy,
    open_splits,
    token_dtype,
    write_indexes,
)
from .sources import BUILDERS, _split_of, is_local, local_files
from .streaming import HELD_OUT, SPLITS, SplitSources, _columns, _looks_like_a_path, hub_streams, records

log = logging.getLogger(__name__)

FORMAT_VERSION = 1


# ---------------------------------------------------------------------------------------------------- batches


def collate_pairs(
    srcs: Sequence[np.ndarray],
    tgts: Sequence[np.ndarray],
    pad_id: int,
    bos_id: int,
    eos_id: int,
    texts: tuple[list[str], list[str]] | None = None,
) -> dict:
    """A padded batch: src is the source then eos; tgt_in is bos then the target; labels the target then eos, -100
    at padding; the masks are built from the lengths, never inferred from a token id."""
    batch_size, src_len, tgt_len = len(srcs), max(map(len, srcs)) + 1, max(map(len, tgts)) + 1
    src = torch.full((batch_size, src_len), pad_id, dtype=torch.long)
    tgt_in = torch.full((batch_size, tgt_len), pad_id, dtype=torch.long)
    labels = torch.full((batch_size, tgt_len), IGNORE_INDEX, dtype=torch.long)
    for b, (s, t) in enumerate(zip(srcs, tgts, strict=True)):
        s, t = torch.from_numpy(s.astype(np.int64)), torch.from_numpy(t.astype(np.int64))
        src[b, : len(s)] = s
        src[b, len(s)] = eos_id
        tgt_in[b, 0] = bos_id
        tgt_in[b, 1 : len(t) + 1] = t
        labels[b, : len(t)] = t
        labels[b, len(t)] = eos_id
    src_mask = torch.arange(src_len)[None, :] <= torch.tensor([len(s) for s in srcs])[:, None]
    tgt_mask = torch.arange(tgt_len)[None, :] <= torch.tensor([len(t) for t in tgts])[:, None]
    batch = {"src": src, "tgt_in": tgt_in, "labels": labels, "src_mask": src_mask, "tgt_mask": tgt_mask}
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


@dataclass
class PairSource:
    """Where one split's pairs come from: local files, an embedded corpus's rows, or a hub split."""

    files: list[str] = field(default_factory=list)
    rows: list[tuple[str, str]] | None = None
    hub_split: str | None = None


def pair_bucket(source: str, target: str) -> int:
    return int(hashlib.md5(f"{source}\t{target}".encode("utf-8", "surrogatepass")).hexdigest(), 16) % 100


def _as_text(value, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"{where}: a side of a pair must be text, found {type(value).__name__} {str(value)[:40]!r}")
    return value.strip()


class PairStream(SplitSources):
    """Each split's sentence pairs as a stream, read row by row; held-out splits carved from train when missing.

    dataset: local .jsonl/.json/.csv/.tsv/.parquet files (a file, folder or glob), a hub name, or an embedded
    corpus's DatasetDict (given as `embedded`). A row's pair is its `translation` {language: text} mapping, or its
    two columns named by source_column/target_column (default: the language codes).
    """

    def __init__(
        self,
        dataset: str,
        dataset_config: str | None = None,
        source_lang: str = "en",
        target_lang: str = "es",
        source_column: str | None = None,
        target_column: str | None = None,
        embedded=None,
    ) -> None:
        self.dataset, self.dataset_config = dataset, dataset_config
        self.langs = (source_lang, target_lang)
        self.explicit = bool(source_column or target_column)
        self.columns = (source_column or source_lang, target_column or target_lang)
        self.sources: dict[str, PairSource] = {}
        self._hub: dict = {}
        self._read_columns: dict[str, list[str] | None] = {}
        if embedded is not None:
            for name, split in embedded.items():
                missing = [c for c in self.columns if c not in split.column_names]
                if missing:
                    raise ValueError(
                        f"dataset {dataset!r}: split {name!r} has no column {', '.join(map(repr, missing))}; its "
                        f"columns are {split.column_names}"
                    )
                self.sources[name] = PairSource(rows=list(zip(split[self.columns[0]], split[self.columns[1]])))
        elif not is_local(dataset) and _looks_like_a_path(dataset):
            raise FileNotFoundError(
                f"{dataset!r} does not exist: give an existing local file, folder or glob of pairs (.jsonl/.json, "
                ".csv/.tsv, .parquet), a hub dataset name, or the embedded kjv-rv1909"
            )
        elif is_local(dataset):
            files = local_files(dataset)
            other = sorted({Path(f).suffix.lower() for f in files} - set(BUILDERS))
            if other:
                raise ValueError(f"{dataset!r}: pairs come from .jsonl/.json/.csv/.tsv/.parquet files, not {other}")
            for f in files:
                split = _split_of(f) if len(files) > 1 else "train"
                self.sources.setdefault(split, PairSource()).files.append(f)
            if "train" not in self.sources:
                raise ValueError(
                    f"{dataset!r} has no training file (names starting with train/valid/test pick the split)"
                )
            for f in files:
                self._check_columns(f)
        else:
            for canonical, (name, split) in hub_streams(dataset, dataset_config).items():
                self._hub[name] = split
                self.sources[canonical] = PairSource(hub_split=name)
        self.missing = [s for s in ("validation", "test") if s not in self.sources]
        self.mode = "hash" if self.missing else "given"

    # ------------------------------------------------------------------ identity

    def content_key(self, file_hash) -> str:
        """A fingerprint of everything the stream yields: file contents, rows, or the hub name and config."""
        return fingerprint(
            "pairs", 1, self._source_parts(file_hash), self.langs, self.columns, self.explicit, self.mode
        )

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
                yield (self._owner(pair_bucket(source, target)) if carving else source_name), pair

    def pairs(self, split: str) -> Iterator[tuple[str, str]]:
        """The (source, target) pairs of `split` in order, rows with an empty side left out."""
        source = split if split in self.sources else "train"
        if split not in self.sources and split not in self.missing:
            raise ValueError(f"Unknown split {split!r}")
        for owner, pair in self.routed(source):
            if owner == split:
                yield pair.source, pair.target

    def _owner(self, bucket: int) -> str:
        index = int(bucket // (HELD_OUT * 100))
        return self.missing[index] if index < len(self.missing) else "train"

    def _rows(self, source: PairSource) -> Iterator[tuple[str, str, int]]:
        """(source text, target text, input bytes) per row, stripped."""
        if source.rows is not None:
            for number, (s, t) in enumerate(source.rows, 1):
                where = f"{self.dataset} row {number}"
                yield _as_text(s, where), _as_text(t, where), len(s or "") + len(t or "")
            return
        if source.hub_split is not None:
            for number, row in enumerate(self._hub[source.hub_split], 1):
                yield *self._pair(row, f"{self.dataset} ({source.hub_split}) row {number}"), 0
            return
        for path in source.files:
            for row, nbytes, number in records(path, self._read_columns.get(path)):
                yield *self._pair(row, f"{path}:{number}"), nbytes

    def _pair(self, row: dict, where: str) -> tuple[str, str]:
        if not self.explicit and "translation" in row:
            translation = row["translation"]
            if not isinstance(translation, dict):
                raise ValueError(f"{where}: the translation column holds {type(translation).__name__}, not a mapping")
            missing = [lang for lang in self.langs if lang not in translation]
            if missing:
                raise ValueError(
                    f"{self.dataset!r}: the translation column has no language {missing}; it has "
                    f"{sorted(translation)} ({where})"
                )
            values = translation[self.langs[0]], translation[self.langs[1]]
        else:
            missing = [c for c in self.columns if c not in row]
            if missing:
                raise ValueError(
                    f"dataset {self.dataset!r}: {where} has no column {', '.join(map(repr, missing))}; its columns "
                    f"are {sorted(row)} (set source_column/target_column)"
                )
            values = row[self.columns[0]], row[self.columns[1]]
        return _as_text(values[0], where), _as_text(values[1], where)

    def _check_columns(self, path: str) -> None:
        """A file without the pair's columns fails at once, naming the columns it has."""
        columns = _columns(path)
        if columns is None:
            return
        if not self.explicit and "translation" in columns:
            self._read_columns[path] = ["translation"]
            return
        missing = [c for c in self.columns if c not in columns]
        if missing:
            raise ValueError(
                f"dataset {self.dataset!r}: {path} has no column {', '.join(map(repr, missing))}; its columns are "
                f"{columns} (set source_column/target_column, or source_lang/target_lang)"
            )
        self._read_columns[path] = list(dict.fromkeys(self.columns))


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


class _PairChunker:
    """Groups one split's pairs into chunks of about CHUNK_CHARS characters: a source and a target `_Chunk`."""

    def __init__(self, start_rows: int, max_pairs: int | None) -> None:
        self.start_rows, self.left = start_rows, max_pairs
        self.source, self.target = _Chunk(start_rows), _Chunk(start_rows)

    @property
    def done(self) -> bool:
        """max_pairs reached: the rest of the source is not this split's."""
        return self.left == 0

    def add(self, pair: Pair) -> tuple[_Chunk, _Chunk] | None:
        if pair.row < self.start_rows or self.left == 0:
            return None
        for chunk, text in ((self.source, pair.source), (self.target, pair.target)):
            chunk.texts.append(text)
            chunk.ends.append(True)  # each text is a document of its own: one start offset per pair
            chunk.characters += len(text)
            chunk.documents = pair.row + 1  # source rows covered once this chunk is written
        self.source.nbytes += pair.nbytes
        if self.left is not None:
            self.left -= 1
        if self.source.characters + self.target.characters >= CHUNK_CHARS or self.left == 0:
            return self.finish()
        return None

    def finish(self) -> tuple[_Chunk, _Chunk] | None:
        if not self.source.texts:
            return None
        out = self.source, self.target
        self.source, self.target = _Chunk(out[0].documents), _Chunk(out[0].documents)
        return out


class _PairWriter:
    """Appends pairs to the shard files of one split; a shard becomes visible (renamed) only when finished."""

    def __init__(self, directory: Path, dtype: np.dtype, shard_tokens: int, progress: dict, keep_text: bool) -> None:
        self.directory, self.dtype, self.shard_tokens = directory, dtype, shard_tokens
        self.progress, self.keep_text = progress, keep_text
        self.handles: dict | None = None
        self._reset()

    def _reset(self) -> None:
        self.tokens = [0, 0]
        self.starts: list[np.ndarray] = []
        self.text_ends: list[np.ndarray] = []
        self.text_bytes = 0
        self.pairs = self.characters = self.nbytes = 0

    def _name(self) -> str:
        return f"shard-{len(self.progress['shards']):05d}"

    def _open(self) -> dict:
        name, files = self._name(), ["src.bin", "tgt.bin"] + (["text.bin"] if self.keep_text else [])
        return {f: open(self.directory / f"{name}.{f}.tmp", "wb") for f in files}  # noqa: SIM115

    def append(self, src: tuple[np.ndarray, list], tgt: tuple[np.ndarray, list], chunks: tuple[_Chunk, _Chunk]):
        if self.handles is None:
            self.handles = self._open()
        (src_ids, src_starts), (tgt_ids, tgt_starts) = src, tgt
        src_at, tgt_at = np.asarray(src_starts, np.int64), np.asarray(tgt_starts, np.int64)
        self.starts.append(np.stack([src_at + self.tokens[0], tgt_at + self.tokens[1]], axis=1))
        self.handles["src.bin"].write(src_ids.tobytes())
        self.handles["tgt.bin"].write(tgt_ids.tobytes())
        self.tokens[0] += len(src_ids)
        self.tokens[1] += len(tgt_ids)
        if self.keep_text:
            parts = [text.encode("utf-8", "surrogatepass") for pair in zip(*(c.texts for c in chunks)) for text in pair]
            self.handles["text.bin"].write(b"".join(parts))
            self.text_ends.append(self.text_bytes + np.cumsum([len(p) for p in parts], dtype=np.int64))
            self.text_bytes = int(self.text_ends[-1][-1]) if parts else self.text_bytes
        self.pairs += len(chunks[0].texts)
        self.characters += chunks[0].characters + chunks[1].characters
        self.nbytes += chunks[0].nbytes
        self.progress["rows"] = chunks[0].documents
        if sum(self.tokens) >= self.shard_tokens:
            self.close()

    def close(self) -> None:
        """Finish the current shard: fsync, rename into place, then record it in progress.json."""
        if self.handles is None:
            self._save_progress()
            return
        for handle in self.handles.values():
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
        name = self._name()
        offsets = np.concatenate([*self.starts, np.array([self.tokens], dtype=np.int64)])
        atomic_write(self.directory / f"{name}.pairs.npy", lambda tmp: _save_npy(tmp, offsets))
        if self.keep_text:
            ends = np.concatenate([np.zeros(1, np.int64), *self.text_ends])
            atomic_write(self.directory / f"{name}.text.npy", lambda tmp: _save_npy(tmp, ends))
        for f in self.handles:
            os.replace(self.directory / f"{name}.{f}.tmp", self.directory / f"{name}.{f}")
        self.handles = None
        self.progress["shards"].append(
            {"name": name, "pairs": self.pairs, "src_tokens": self.tokens[0], "tgt_tokens": self.tokens[1]}
        )
        self.progress["characters"] += self.characters
        self.progress["bytes"] += self.nbytes
        self._reset()
        self._save_progress()

    def _save_progress(self) -> None:
        atomic_write(self.directory / "progress.json", lambda tmp: Path(tmp).write_text(json.dumps(self.progress)))


def _load_progress(directory: Path) -> dict:
    try:
        return json.loads((directory / "progress.json").read_text())
    except (OSError, ValueError):
        return {"shards": [], "rows": 0, "characters": 0, "bytes": 0, "empty": 0}


def _index(progress: dict, dtype: np.dtype, keep_text: bool) -> dict:
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


def prepare_pair_pass(
    stream: PairStream,
    source: str,
    root: Path,
    tokenizers: tuple[Tokenizer, Tokenizer],
    dtype: np.dtype,
    max_pairs: int | None = None,
    shard_tokens: int = SHARD_TOKENS,
    workers: int | None = None,
) -> dict[str, dict]:
    """One pass over a source split, tokenized into the shards of every split it feeds; each split resumes after its
    own last finished shard. Their indexes."""
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    indexes, progresses = open_splits(root, dict(stream.passes())[source], _load_progress)
    todo = list(progresses)
    if not todo:
        return indexes
    writers, chunkers = {}, {}
    for split, progress in progresses.items():
        writers[split] = _PairWriter(root / split, dtype, shard_tokens, progress, keep_text=split != "train")
        writers[split]._save_progress()
        done = sum(s["pairs"] for s in progress["shards"])
        cut = None if max_pairs is None or split != "train" else max(0, max_pairs - done)
        chunkers[split] = _PairChunker(progress["rows"], cut)
    skip = min(chunker.start_rows for chunker in chunkers.values())
    empty = 0

    def chunks() -> Iterator[tuple[str, tuple[_Chunk, _Chunk]]]:
        nonlocal empty
        for split, pair in stream.routed(source, skip):
            if split is None:
                empty += 1
                continue
            chunker = chunkers.get(split)
            chunk = chunker.add(pair) if chunker is not None else None
            if chunk is not None:
                yield split, chunk
            if chunk is not None and all(c.done for c in chunkers.values()):
                break  # max_pairs reached and no carved split to fill: the rest of the source is not read
        for split, chunker in chunkers.items():
            chunk = chunker.finish()
            if chunk is not None:
                yield split, chunk

    shared = tokenizers[0] is tokenizers[1]
    size = stream.input_bytes(source)
    big = size is None and stream.sources[source].rows is None or (size or 0) >= POOL_MIN_BYTES
    encoder = _Encoder(tokenizers[:1] if shared else tokenizers, None, dtype, workers if big else 1)
    names = "+".join(todo)
    bar = _progress_bar(names, size)
    already = sum(w.progress["bytes"] for w in writers.values())
    bar.update(already)
    started, tokens, held = time.perf_counter(), 0, {}

    def write(finished) -> None:
        nonlocal tokens
        for (split, side), chunk, ids, starts in finished:
            tokens += len(ids)
            if side == 0:  # the target half of the same chunk comes next, in submission order
                held[split] = (ids, starts, chunk)
                continue
            src_ids, src_starts, src_chunk = held.pop(split)
            writers[split].append((src_ids, src_starts), (ids, starts), (src_chunk, chunk))
            bar.update(src_chunk.nbytes)
            bar.set_postfix_str(f"{tokens / max(time.perf_counter() - started, 1e-9) / 1e6:.2f}M tokens/s", False)

    try:
        source_chunks = chunks() if encoder.pool is not None else _prefetch(chunks())
        for split, (src_chunk, tgt_chunk) in source_chunks:
            write(encoder.submit((split, 0), src_chunk, 0))
            write(encoder.submit((split, 1), tgt_chunk, 0 if shared else 1))
        write(encoder.drain())
        writers.get(source, writers[todo[0]]).progress["empty"] += empty
        for writer in writers.values():
            writer.close()
    finally:
        encoder.close()
        bar.close()
    elapsed = max(time.perf_counter() - started, 1e-9)
    read = (sum(w.progress["bytes"] for w in writers.values()) - already) / 1e6
    indexes.update(write_indexes(root, {s: _index(w.progress, dtype, w.keep_text) for s, w in writers.items()}))
    log.info(
        "prepare %s pairs: %.1f MB in %.1f s (%.1f MB/s), %d tokens (%.2fM tokens/s), pairs %s",
        names, read, elapsed, read / elapsed, tokens, tokens / elapsed / 1e6,
        {s: i["pairs"] for s, i in indexes.items()},
    )  # fmt: skip
    return indexes


def pairs_key(stream: PairStream, hashes: FileHashes, tokenizer_keys, max_pairs, shard_tokens) -> str:
    return fingerprint("pair-shards", FORMAT_VERSION, stream.content_key(hashes), list(tokenizer_keys), max_pairs,
                       shard_tokens)  # fmt: skip


def prepare_pairs(
    stream: PairStream,
    tokenizers: tuple[Tokenizer, Tokenizer],
    tokenizer_keys: tuple[str, str],
    cache_dir: Path,
    max_pairs: int | None = None,
    shard_tokens: int = SHARD_TOKENS,
    workers: int | None = None,
) -> Path:
    """Prepare every split of `stream` once (cached by content; resumable; atomic); the prepared corpus's folder."""
    hashes = FileHashes(cache_dir)
    key = pairs_key(stream, hashes, tokenizer_keys, max_pairs, shard_tokens)
    hashes.save()
    root = cache_dir / "pairs" / key
    manifest = root / "manifest.json"
    if manifest.exists():
        return root
    with locked(root):
        if manifest.exists():  # another process finished it while we waited
            return root
        dtype = token_dtype(max(t.get_vocab_size() for t in tokenizers))
        splits = {}
        for source, _ in stream.passes():
            splits |= prepare_pair_pass(stream, source, root, tokenizers, dtype, max_pairs, shard_tokens, workers)
        _check_splits(stream, splits)
        info = {
            "version": FORMAT_VERSION,
            "dataset": stream.dataset,
            "held_out": stream.mode,
            "dtype": dtype.name,
            "vocab_sizes": [t.get_vocab_size() for t in tokenizers],
            "tokenizer_keys": list(tokenizer_keys),
            "splits": {split: splits[split] for split in SPLITS},
        }
        atomic_write(manifest, lambda tmp: Path(tmp).write_text(json.dumps(info, indent=1)))
    return root


def _check_splits(stream: PairStream, splits: dict[str, dict]) -> None:
    empty = sum(index.get("empty", 0) for index in splits.values())
    if empty:
        warnings.warn(f"{stream.dataset}: dropped {empty} pairs with an empty side", stacklevel=3)
    if not splits["train"]["pairs"]:
        raise ValueError(f"{stream.dataset!r} has no sentence pairs in its training split")
    for name in ("validation", "test"):
        if splits[name]["pairs"]:
            continue
        if name in stream.missing:
            total = sum(index["pairs"] for index in splits.values())
            raise ValueError(
                f"{stream.dataset!r} has {total} pairs and no {name} split: the held-out splits take {HELD_OUT:.0%} "
                f"each, picked by a hash of the pair, and this one got none. Give at least about "
                f"{int(20 / HELD_OUT)} pairs, or files named train*/valid*/test* to choose the splits yourself"
            )
        raise ValueError(f"{stream.dataset!r} has no {name} pairs; provide a {name} split (e.g. a {name}.tsv file)")


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
