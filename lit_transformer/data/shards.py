"""Pre-tokenized corpora on disk: a streaming `prepare` that writes token shards, and the reader training uses.

Layout of one prepared corpus (under <cache>/shards/<key>/, the key a hash of the corpus's content, the tokenizer
and the settings, so a changed input never reuses a stale entry):

    manifest.json                 written last: its presence means every split is complete
    <split>/shard-00000.bin       token ids, raw uint16 in native byte order (uint32 when the vocabulary needs it)
    <split>/shard-00000.docs.npy  where each document starts in the shard (int64 token offsets)
    <split>/progress.json         finished shards and how many source documents they cover (for resuming)
    <split>/index.json            the split's shards, token, character and document counts (written when done)

Preparation streams the source (see `streaming.py`) in one pass per source split (the training source also fills
the carved held-out splits), cuts it into chunks of a few megabytes, and tokenizes them in worker processes, one per
CPU, while the parent reads, parses and writes (a small source is tokenized in the parent, with the tokenizer's own
threads). Ids are appended to the current shard. A shard is written to a temporary file, fsynced and renamed only
when complete, and `progress.json` is updated after it: a killed run resumes after its last finished shard, and no
reader ever sees a half-written shard. Shards end at document boundaries.

Training reads blocks through short-lived memory maps: a map is opened for the rows of one batch and dropped, so the
pages it touched are not kept mapped and the resident memory stays flat however much of the corpus is read.
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
import logging
import multiprocessing
import os
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from torch.utils.data import Dataset

from . import encode_worker
from .cache import atomic_write, fingerprint, hash_file, locked
from .loaders import stack_blocks
from .streaming import SPLITS, CorpusStream, Piece

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
SHARD_TOKENS = 1 << 26  # about 64M tokens (128 MB of uint16) per shard
CHUNK_CHARS = 1 << 22  # characters tokenized per encode_batch call: bounded memory, both cores busy
POOL_MIN_BYTES = 1 << 24  # sources from 16 MB on (or of unknown size) are tokenized by worker processes
PIECE_CHARS = 1 << 14  # long texts are cut at line boundaries into pieces of about this size (parallel encoding)


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.uint32)


# ---------------------------------------------------------------------------------------------------- file hashes


class FileHashes:
    """Content hashes of files, remembered by (path, size, mtime) so a second run does not reread a big corpus."""

    def __init__(self, cache_dir: Path) -> None:
        self.path = cache_dir / "file-hashes.json"
        try:
            self.known = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.known = {}
        self.changed = False

    def __call__(self, path: str) -> str:
        stat = os.stat(path)
        key = f"{os.path.abspath(path)}|{stat.st_size}|{stat.st_mtime_ns}"
        if key not in self.known:
            self.known[key] = hash_file(path)
            self.changed = True
        return self.known[key]

    def save(self) -> None:
        if self.changed:
            with locked(self.path):
                atomic_write(self.path, lambda tmp: Path(tmp).write_text(json.dumps(self.known)))


# ---------------------------------------------------------------------------------------------------- prepare


def sample_texts(stream: CorpusStream, max_chars: int) -> list[str]:
    """The first `max_chars` characters of the training split, as documents: a bounded sample to train a tokenizer
    on (the training text itself when it is smaller)."""
    texts, parts, total = [], [], 0
    for piece in stream.pieces("train"):
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


class _Chunk:
    """Texts to encode together, with where documents end, the source documents finished and the bytes read."""

    __slots__ = ("texts", "ends", "continues", "documents", "nbytes", "characters", "at_boundary")

    def __init__(self, documents: int = 0) -> None:
        self.texts: list[str] = []
        self.ends: list[bool] = []  # EOS after this text
        self.continues = False  # the first text continues a document begun in an earlier chunk
        self.documents = documents  # source documents finished by the end of this chunk (a running count)
        self.nbytes = 0
        self.characters = 0
        self.at_boundary = True  # the chunk ends at a document boundary (where a shard may end)


def _split_long(text: str) -> list[str]:
    if len(text) <= PIECE_CHARS:
        return [text]
    pieces, start = [], 0
    while start < len(text):
        end = text.find("\n", start + PIECE_CHARS)
        end = len(text) if end < 0 else end + 1
        pieces.append(text[start:end])
        start = end
    return pieces


class _Chunker:
    """Groups one split's pieces into chunks of about CHUNK_CHARS characters (a long document spans several)."""

    def __init__(self, start_documents: int, max_chars: int | None) -> None:
        self.chunk = _Chunk(start_documents)
        self.start_documents = start_documents  # source documents a resumed run has already (skip the rest below)
        self.max_chars, self.total, self.done = max_chars, 0, False
        self.in_document = False  # the current document has text (in this chunk or an earlier one)
        self.in_chunk = False  # ... in this chunk

    def add(self, piece: Piece) -> _Chunk | None:
        """Take a piece; a full chunk when one is ready."""
        if self.done or piece.document < self.start_documents:
            return None
        chunk, text = self.chunk, piece.text
        if self.max_chars is not None:
            text = text[: max(0, self.max_chars - self.total)]
        if text:
            if not chunk.texts and self.in_document:
                chunk.continues = True
            for part in _split_long(text):
                chunk.texts.append(part)
                chunk.ends.append(False)
            chunk.characters += len(text)
            self.total += len(text)
            self.in_document = self.in_chunk = True
        chunk.nbytes += piece.nbytes
        cut = self.max_chars is not None and self.total >= self.max_chars
        if piece.last or cut:
            if self.in_document:
                if not self.in_chunk:  # the document's text was all in earlier chunks: EOS alone
                    chunk.continues = chunk.continues or not chunk.texts
                    chunk.texts.append("")
                    chunk.ends.append(False)
                chunk.ends[-1] = True
            self.in_document = self.in_chunk = False
            chunk.documents = piece.document + 1
        chunk.at_boundary = piece.last or cut
        if cut:
            self.done = True
            return self.finish()
        if chunk.characters >= CHUNK_CHARS:
            self.chunk, self.in_chunk = _Chunk(chunk.documents), False
            return chunk
        return None

    def finish(self) -> _Chunk | None:
        chunk, self.chunk = self.chunk, _Chunk(self.chunk.documents)
        return chunk if chunk.texts or chunk.nbytes else None


def _prefetch(iterator: Iterator, depth: int = 2) -> Iterator:
    """Run `iterator` in a thread, `depth` items ahead: reading and parsing overlap the (GIL-free) tokenizing."""
    items: queue.Queue = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in iterator:
                while not stop.is_set():
                    try:
                        items.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            items.put(done)
        except BaseException as error:  # re-raised in the consumer
            items.put(error)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        while True:
            item = items.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()


def encode_chunk(tokenizer: Tokenizer, chunk: _Chunk, eos_id: int | None, dtype: np.dtype) -> tuple[np.ndarray, list]:
    """A chunk's ids as one array (EOS after each document), and the offsets where its documents start."""
    return encode_worker.encode(chunk.texts, chunk.ends, chunk.continues, eos_id, dtype.name, tokenizer)


class _Encoder:
    """Encodes chunks in order: in `workers` spawned processes for a big source, in this process for a small one.

    `submit` returns the finished (split, chunk, ids, starts) in submission order, keeping at most 2 x workers
    chunks in flight: memory stays bounded whatever the corpus size.
    """

    def __init__(
        self, tokenizer: Tokenizer | Sequence[Tokenizer], eos_id: int | None, dtype: np.dtype, workers: int
    ) -> None:
        # Several tokenizers (a translation's source and target) are told apart by `side` in `submit`.
        self.tokenizers = [tokenizer] if isinstance(tokenizer, Tokenizer) else list(tokenizer)
        self.eos_id, self.dtype, self.workers = eos_id, dtype, workers
        self.pending: collections.deque = collections.deque()
        self.pool = None
        if workers > 1:
            context = multiprocessing.get_context("spawn")  # no fork of a process with threads and torch
            jsons = tuple(t.to_str() for t in self.tokenizers)
            self.pool = concurrent.futures.ProcessPoolExecutor(
                workers, mp_context=context, initializer=encode_worker.init, initargs=jsons
            )

    def _encode(self, chunk: _Chunk, side: int = 0):
        if not chunk.texts:
            return np.zeros(0, dtype=self.dtype), []
        return encode_chunk(self.tokenizers[side], chunk, self.eos_id, self.dtype)

    def submit(self, split, chunk: _Chunk, side: int = 0) -> Iterator[tuple[str, _Chunk, np.ndarray, list]]:
        if self.pool is None:
            yield split, chunk, *self._encode(chunk, side)
            return
        args = (chunk.texts, chunk.ends, chunk.continues, self.eos_id, self.dtype.name, None, side)
        future = self.pool.submit(encode_worker.encode, *args) if chunk.texts else None
        self.pending.append((split, chunk, future))
        while len(self.pending) > 2 * self.workers:
            yield self._pop()

    def drain(self) -> Iterator[tuple[str, _Chunk, np.ndarray, list]]:
        while self.pending:
            yield self._pop()

    def _pop(self):
        split, chunk, future = self.pending.popleft()
        ids, starts = future.result() if future is not None else (np.zeros(0, dtype=self.dtype), [])
        return split, chunk, ids, starts

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


class _ShardWriter:
    """Appends ids to shard files of one split; a shard becomes visible (renamed) only when finished."""

    def __init__(self, directory: Path, dtype: np.dtype, shard_tokens: int, progress: dict) -> None:
        self.directory, self.dtype, self.shard_tokens = directory, dtype, shard_tokens
        self.progress = progress
        self.handle = None
        self.tokens = 0
        self.starts: list[np.ndarray] = []
        self.characters = self.nbytes = 0

    @property
    def number(self) -> int:
        return len(self.progress["shards"])

    def _name(self) -> str:
        return f"shard-{self.number:05d}"

    def append(self, ids: np.ndarray, starts: list[int], chunk: _Chunk) -> None:
        if self.handle is None:
            self.handle = open(self.directory / f"{self._name()}.bin.tmp", "wb")  # noqa: SIM115
        if starts:
            self.starts.append(np.asarray(starts, dtype=np.int64) + self.tokens)
        self.handle.write(ids.tobytes())
        self.tokens += len(ids)
        self.characters += chunk.characters
        self.nbytes += chunk.nbytes
        self.progress["documents"] = chunk.documents
        if self.tokens >= self.shard_tokens and chunk.at_boundary:
            self.close()

    def close(self) -> None:
        """Finish the current shard: fsync, rename into place, then record it in progress.json."""
        if self.handle is None:
            self._save_progress()
            return
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()
        self.handle = None
        name = self._name()
        starts = np.concatenate(self.starts) if self.starts else np.zeros(0, dtype=np.int64)
        if self.tokens:
            atomic_write(self.directory / f"{name}.docs.npy", lambda tmp: _save_npy(tmp, starts))
            os.replace(self.directory / f"{name}.bin.tmp", self.directory / f"{name}.bin")
            self.progress["shards"].append({"file": f"{name}.bin", "tokens": self.tokens, "documents": len(starts)})
        else:
            (self.directory / f"{name}.bin.tmp").unlink(missing_ok=True)
        self.progress["characters"] += self.characters
        self.progress["bytes"] += self.nbytes
        self.tokens, self.starts, self.characters, self.nbytes = 0, [], 0, 0
        self._save_progress()

    def _save_progress(self) -> None:
        atomic_write(self.directory / "progress.json", lambda tmp: Path(tmp).write_text(json.dumps(self.progress)))


def _save_npy(path: str, array: np.ndarray) -> None:
    with open(path, "wb") as handle:  # a handle: np.save would add ".npy" to a temporary file's name
        np.save(handle, array)


def _progress_bar(split: str, total: int | None):
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        unit_divisor=1 << 20,
        desc=f"prepare {split}",
        disable=None,  # off when stderr is not a terminal (logs get one summary line per split)
        mininterval=1.0,
    )


def _load_progress(directory: Path) -> dict:
    try:
        return json.loads((directory / "progress.json").read_text())
    except (OSError, ValueError):
        return {"shards": [], "documents": 0, "characters": 0, "bytes": 0}


def _index(progress: dict, dtype: np.dtype) -> dict:
    return {
        "dtype": dtype.name,
        "shards": progress["shards"],
        "tokens": sum(s["tokens"] for s in progress["shards"]),
        "documents": sum(s["documents"] for s in progress["shards"]),
        "characters": progress["characters"],
        "bytes": progress["bytes"],
    }


def open_splits(root: Path, splits, load_progress) -> tuple[dict[str, dict], dict[str, dict]]:
    """A preparation pass's splits: the indexes of those already finished, and the progress of the others, whose
    folders are made and cleaned of a killed run's unfinished shard (`*.tmp`) so that they resume after their last
    finished one."""
    indexes = {
        s: json.loads((root / s / "index.json").read_text()) for s in splits if (root / s / "index.json").exists()
    }
    progresses = {}
    for split in (s for s in splits if s not in indexes):
        directory = root / split
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.glob("*.tmp"):
            stale.unlink()
        progresses[split] = load_progress(directory)
        if progresses[split]["shards"]:
            log.info("prepare %s: resuming after shard %d", split, len(progresses[split]["shards"]) - 1)
    return indexes, progresses


def write_indexes(root: Path, indexes: dict[str, dict]) -> dict[str, dict]:
    """Each split's index.json, written last and atomically: its presence marks the split finished."""
    for split, index in indexes.items():
        atomic_write(root / split / "index.json", lambda tmp, i=index: Path(tmp).write_text(json.dumps(i)))
    return indexes


def prepare_pass(
    stream: CorpusStream,
    source: str,
    root: Path,
    tokenizer: Tokenizer,
    eos_id: int | None,
    dtype: np.dtype,
    max_chars: int | None = None,
    shard_tokens: int = SHARD_TOKENS,
    workers: int | None = None,
) -> dict[str, dict]:
    """One pass over a source split, tokenized into the shards of every split it feeds (the training source also
    feeds carved held-out splits); each split resumes after its own last finished shard. Their indexes.

    workers: tokenizing processes for a big source (default: the CPUs this process may use)."""
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    indexes, progresses = open_splits(root, dict(stream.passes())[source], _load_progress)
    todo = list(progresses)
    if not todo:
        return indexes
    writers, chunkers = {}, {}
    for split, progress in progresses.items():
        writers[split] = _ShardWriter(root / split, dtype, shard_tokens, progress)
        writers[split]._save_progress()
        cut = None if max_chars is None or split != "train" else max(0, max_chars - progress["characters"])
        chunkers[split] = _Chunker(progress["documents"], cut)
    skip = min(chunker.start_documents for chunker in chunkers.values())
    already = sum(w.progress["bytes"] for w in writers.values())

    def chunks() -> Iterator[tuple[str, _Chunk]]:
        for split, piece in stream.routed(source, skip):
            chunker = chunkers.get(split)
            chunk = chunker.add(piece) if chunker is not None else None
            if chunk is not None:
                yield split, chunk
        for split, chunker in chunkers.items():
            chunk = chunker.finish()
            if chunk is not None:
                yield split, chunk

    names = "+".join(todo)
    started, tokens = time.perf_counter(), 0
    size = stream.input_bytes(source)
    big = size is None and stream.sources[source].rows is None or (size or 0) >= POOL_MIN_BYTES
    encoder = _Encoder(tokenizer, eos_id, dtype, workers if big else 1)
    bar = _progress_bar(names, size)
    bar.update(already)

    def write(done) -> None:
        nonlocal tokens
        for split, chunk, ids, starts in done:
            writers[split].append(ids, starts, chunk)
            tokens += len(ids)
            bar.update(chunk.nbytes)
            elapsed = max(time.perf_counter() - started, 1e-9)
            bar.set_postfix_str(f"{tokens / elapsed / 1e6:.2f}M tokens/s", refresh=False)

    try:
        # In-process encoding releases the GIL: a reader thread then parses the next chunks meanwhile.
        source_chunks = chunks() if encoder.pool is not None else _prefetch(chunks())
        for split, chunk in source_chunks:
            write(encoder.submit(split, chunk))
        write(encoder.drain())
        for writer in writers.values():
            writer.close()
    finally:
        encoder.close()
        bar.close()
    elapsed = max(time.perf_counter() - started, 1e-9)
    read = (sum(w.progress["bytes"] for w in writers.values()) - already) / 1e6
    indexes.update(write_indexes(root, {split: _index(w.progress, dtype) for split, w in writers.items()}))
    log.info(
        "prepare %s: %.1f MB in %.1f s (%.1f MB/s), %d tokens (%.2fM tokens/s), shards %s",
        names, read, elapsed, read / elapsed, tokens, tokens / elapsed / 1e6,
        {s: len(i["shards"]) for s, i in indexes.items()},
    )  # fmt: skip
    return indexes


def corpus_key(stream: CorpusStream, hashes: FileHashes, tokenizer_key: str, eos_id, max_chars, shard_tokens) -> str:
    return fingerprint("shards", FORMAT_VERSION, stream.content_key(hashes), tokenizer_key, eos_id, max_chars,
                       shard_tokens)  # fmt: skip


def prepare_corpus(
    stream: CorpusStream,
    tokenizer: Tokenizer,
    tokenizer_key: str,
    eos_id: int | None,
    cache_dir: Path,
    max_chars: int | None = None,
    shard_tokens: int = SHARD_TOKENS,
) -> Path:
    """Prepare every split of `stream` once (cached by content; resumable; atomic); the prepared corpus's folder."""
    hashes = FileHashes(cache_dir)
    key = corpus_key(stream, hashes, tokenizer_key, eos_id, max_chars, shard_tokens)
    hashes.save()
    root = cache_dir / "shards" / key
    manifest = root / "manifest.json"
    if manifest.exists():
        return root
    with locked(root):
        if manifest.exists():  # another process finished it while we waited
            return root
        dtype = token_dtype(tokenizer.get_vocab_size())
        splits = {}
        for source, _ in stream.passes():
            splits |= prepare_pass(stream, source, root, tokenizer, eos_id, dtype, max_chars, shard_tokens)
        info = {
            "version": FORMAT_VERSION,
            "dataset": stream.dataset,
            "held_out": stream.mode,
            "dtype": dtype.name,
            "eos_id": eos_id,
            "vocab_size": tokenizer.get_vocab_size(),
            "tokenizer_key": tokenizer_key,
            "splits": {split: splits[split] for split in SPLITS},
        }
        atomic_write(manifest, lambda tmp: Path(tmp).write_text(json.dumps(info, indent=1)))
    return root


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

    def open(self, shard: int) -> np.memmap:
        return np.memmap(self.paths[shard], dtype=self.dtype, mode="r", shape=(int(self.counts[shard]),))

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
