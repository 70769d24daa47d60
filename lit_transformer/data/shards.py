"""Records -> token shards on disk, for every kind of record (each task declares its kind in its own file): a
stream of records cut into chunks, tokenized in worker processes, appended to token shards on disk, once.

A prepared dataset lives under <cache>/<kind.folder>/<key>/, the key a hash of the dataset's content, the
tokenizers and the settings, so a changed input never reuses a stale entry:

    manifest.json                   written last: its presence means every split is complete
    <split>/shard-00000.<side>.bin  each side's token ids, raw uint16 in native byte order (uint32 when a
                                    vocabulary needs it); a corpus has one side (shard-00000.bin), a pair two
    <split>/shard-00000.<starts>    where each record starts in the shard (`RecordKind.starts_array`)
    <split>/shard-00000.text.*      the records' UTF-8 text and its offsets, for the splits a kind keeps text of
    <split>/progress.json           finished shards and how many source records they cover (for resuming)
    <split>/index.json              the split's shards and counts (written when the split is done)

Preparation reads the stream in one pass per source split (the training source also fills the carved held-out
splits), groups each split's records into chunks of a few megabytes, and tokenizes them in worker processes, one per
CPU, while the parent reads, parses and writes (a small source is tokenized in the parent, with a reader thread
parsing ahead). A shard is written to temporary files, fsynced and renamed only when complete, and
`progress.json` is updated after it: a killed run resumes after its last finished shard, and no reader ever sees a
half-written shard. Shards end at record boundaries.

The kinds: a task declares its kind (a RecordKind) in its own file, e.g. a corpus's documents (one side, each
document's ids then EOS, docs.npy where documents start) or sentence pairs (two sides, held-out text kept); TextsKind,
here, is one text and a JSON value per record, which a task's kind specialises.
"""

from __future__ import annotations

import collections
import concurrent.futures
import errno
import json
import logging
import multiprocessing
import os
import queue
import shutil
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
from tokenizers import Tokenizer

from lit_transformer.errors import WriteError

from . import encode_worker
from .cache import atomic_write, fingerprint, hash_file, locked
from .sources import SPLITS, SplitStream
from .text import line_pieces

log = logging.getLogger(__name__)

# The errors of a write that the machine, not the program, refused: a full disk, a file-size limit, a quota.
WRITE_FAILURES = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
FORMAT_VERSION = 1
SHARD_TOKENS = 1 << 26  # about 64M tokens (128 MB of uint16) per shard
CHUNK_CHARS = 1 << 22  # characters tokenized per encode_batch call: bounded memory, both cores busy
POOL_MIN_BYTES = 1 << 24  # sources from 16 MB on (or of unknown size) are tokenized by worker processes


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.uint32)


class FileHashes:
    """Content hashes of files, remembered by (path, size, mtime, inode, ctime) so a second run does not reread a big
    corpus. The inode change time is in the key because the modification time alone can be set back (`touch -d`,
    `cp -p`, an editor or sync tool that keeps it): a file edited in place to the same size with its old mtime kept
    its old hash, and its stale shards were reused. Nothing sets a ctime back: any write or touch moves it."""

    def __init__(self, cache_dir: Path) -> None:
        self.path = cache_dir / "file-hashes.json"
        try:
            self.known = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.known = {}
        self.changed = False

    def __call__(self, path: str) -> str:
        stat = os.stat(path)
        key = f"{os.path.abspath(path)}|{stat.st_size}|{stat.st_mtime_ns}|{stat.st_ino}|{stat.st_ctime_ns}"
        if key not in self.known:
            self.known[key] = hash_file(path)
            self.changed = True
        return self.known[key]

    def save(self) -> None:
        """Remember the hashes for the next run: only a saving of time, so a cache this process cannot write (a
        read-only share of prepared data) is not an error; the next run hashes the files again."""
        if not self.changed:
            return
        try:
            with locked(self.path):
                atomic_write(self.path, lambda tmp: Path(tmp).write_text(json.dumps(self.known)))
        except WriteError:
            log.warning("%s is not writable: the data files' hashes are not remembered (each run hashes them again)",
                        self.path.parent)  # fmt: skip


# ---------------------------------------------------------------------------------------------------- records


class Record(Protocol):
    """What the machinery reads of a streamed record (sources.Piece, a task's own record, ...)."""

    @property
    def texts(self) -> tuple[str, ...]:
        """One text per side: a piece of a document, or a pair's source and target."""

    document: int  # the index of the source record (document or row) it belongs to: a resumed pass skips past it
    last: bool  # it ends its document (where EOS goes, and where a shard may end)
    nbytes: int  # input bytes it accounts for (progress in MB/s)


class RecordKind:
    """What sets a kind of record apart on disk: its sides, the file of record starts, its progress and index
    entries. One instance per kind, in its task's file; everything else is shared."""

    folder: str  # the prepared datasets' folder in the cache
    tag: str  # the cache key's tag
    sides: tuple[str, ...]  # a shard's token files: shard-N.bin for ("",), shard-N.src.bin and .tgt.bin for a pair's
    starts: str  # the suffix of a shard's record starts
    counter: str  # progress.json's count of the source's records covered (where a resumed pass goes on)
    noun = ""  # in the log line of a pass
    split_long = False  # long texts are encoded in line-bounded pieces (a document; never a pair's side)
    extras = False  # each record carries a JSON value beside its ids (a label), kept in shard-N.extras.jsonl

    def new_progress(self) -> dict:
        return {"shards": [], self.counter: 0, "characters": 0, "bytes": 0}

    def keeps_text(self, split: str) -> bool:
        """Whether the split's shards keep their records' text too."""
        return False

    def budget(self, progress: dict, limit: int | None) -> dict[str, int | None]:
        """The Chunker's limits for the rest of a training split cut to `limit` (characters by default)."""
        return {"max_chars": None if limit is None else max(0, limit - progress["characters"])}

    def starts_array(self, starts: list[np.ndarray], tokens: list[int]) -> np.ndarray:
        """What a shard's starts file holds, from each side's record start offsets and token count."""
        raise NotImplementedError

    def shard_entry(self, name: str, tokens: list[int], records: int) -> dict:
        raise NotImplementedError

    summed: tuple[str, ...] = ()  # the shard entries' counts a split's index sums

    def index(self, progress: dict, dtype: np.dtype, keep_text: bool) -> dict:
        """A finished split's index.json: its shards, their summed counts, the characters and bytes read."""
        shards = progress["shards"]
        counts = {key: sum(s[key] for s in shards) for key in self.summed}
        return {"dtype": dtype.name, "shards": shards, **counts, "characters": progress["characters"],
                "bytes": progress["bytes"], **self.index_extras(progress, keep_text)}  # fmt: skip

    def index_extras(self, progress: dict, keep_text: bool) -> dict:
        """What else a kind's index holds."""
        return {}

    def summary(self, indexes: dict[str, dict]) -> str:
        raise NotImplementedError

    def check(self, stream, splits: dict[str, dict]) -> None:
        """Refuse prepared splits that cannot serve (called before the manifest is written)."""

    def begin(self, root: Path) -> None:
        """Ready the prepared folder for a (resumed) preparation, under its lock: clean what a killed run left."""

    def stage(self, record, root: Path):
        """Write what a record brings besides its texts into the prepared folder; the record to chunk (itself)."""
        return record


# ---------------------------------------------------------------------------------------------------- chunks


class Chunk:
    """Texts to encode together (a list per side), where documents end, the source records finished and the bytes
    read."""

    __slots__ = ("texts", "ends", "extras", "continues", "documents", "nbytes", "characters", "at_boundary")

    def __init__(self, sides: int, documents: int = 0) -> None:
        self.texts: list[list[str]] = [[] for _ in range(sides)]
        self.ends: list[list[bool]] = [[] for _ in range(sides)]  # EOS (a record start next) after this text
        self.extras: list[str] = []  # each record's JSON value (a label), for a kind with extras
        self.continues = False  # the first text continues a document begun in an earlier chunk
        self.documents = documents  # source records finished by the end of this chunk (a running count)
        self.nbytes = 0
        self.characters = 0
        self.at_boundary = True  # the chunk ends at a document boundary (where a shard may end)


class Chunker:
    """Groups one split's records into chunks of about CHUNK_CHARS characters (a long document spans several).

    start: source records a resumed pass already has (those before are skipped). max_chars / max_records: the split
    is cut after this many characters (the crossing record truncated) or finished documents."""

    def __init__(
        self,
        sides: int,
        start: int,
        split_long: bool = False,
        max_chars: int | None = None,
        max_records: int | None = None,
    ) -> None:
        self.sides, self.start, self.split_long = sides, start, split_long
        self.chunk = Chunk(sides, start)
        self.max_chars, self.max_records = max_chars, max_records
        self.total = self.finished = 0
        self.done = max_records == 0
        self.in_document = False  # the current document has text (in this chunk or an earlier one)
        self.in_chunk = False  # ... in this chunk

    def add(self, record: Record) -> Chunk | None:
        """Take a record; a full chunk when one is ready."""
        if self.done or record.document < self.start:
            return None
        chunk, texts = self.chunk, record.texts
        if self.max_chars is not None:
            texts = self._truncate(texts)
        if any(texts):
            if not chunk.texts[0] and self.in_document:
                chunk.continues = True
            for side, text in enumerate(texts):
                parts = line_pieces(text) if self.split_long else [text]
                chunk.texts[side] += parts
                chunk.ends[side] += [False] * len(parts)
            if getattr(record, "extra", None) is not None:
                chunk.extras.append(record.extra)
            characters = sum(map(len, texts))
            chunk.characters += characters
            self.total += characters
            self.in_document = self.in_chunk = True
        chunk.nbytes += record.nbytes
        self.finished += record.last
        cut = (self.max_chars is not None and self.total >= self.max_chars) or (
            self.max_records is not None and self.finished >= self.max_records
        )
        if record.last or cut:
            if self.in_document:
                for side in range(self.sides):
                    if not self.in_chunk:  # the document's text was all in earlier chunks: EOS alone
                        chunk.continues = chunk.continues or not chunk.texts[side]
                        chunk.texts[side].append("")
                        chunk.ends[side].append(False)
                    chunk.ends[side][-1] = True
            self.in_document = self.in_chunk = False
            chunk.documents = record.document + 1
        chunk.at_boundary = record.last or cut
        if cut:
            self.done = True
            return self.finish()
        if chunk.characters >= CHUNK_CHARS:
            self.chunk, self.in_chunk = Chunk(self.sides, chunk.documents), False
            return chunk
        return None

    def _truncate(self, texts: tuple[str, ...]) -> tuple[str, ...]:
        left, out = max(0, self.max_chars - self.total), []
        for text in texts:
            out.append(text[:left])
            left -= len(out[-1])
        return tuple(out)

    def finish(self) -> Chunk | None:
        chunk, self.chunk = self.chunk, Chunk(self.sides, self.chunk.documents)
        return chunk if chunk.texts[0] or chunk.nbytes else None


# ---------------------------------------------------------------------------------------------------- encoding


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


Encoded = list[tuple[np.ndarray, list[int]]]  # per side: the chunk's ids (EOS after each document) and record starts


class Encoder:
    """Encodes chunks in order, each side by its tokenizer: in `workers` spawned processes for a big source, in this
    process for a small one.

    `submit` returns the finished (split, chunk, encoded) in submission order, keeping at most 2 x workers encode
    calls in flight: memory stays bounded whatever the corpus size.
    """

    def __init__(self, tokenizers: Sequence[Tokenizer], eos_id: int | None, dtype: np.dtype, workers: int) -> None:
        # A tokenizer that serves several sides (a shared vocabulary) is loaded once per worker.
        self.tokenizers = list({id(t): t for t in tokenizers}.values())
        self.slots = [next(i for i, t in enumerate(self.tokenizers) if t is side) for side in tokenizers]
        self.eos_id, self.dtype, self.workers = eos_id, dtype, workers
        self.pending: collections.deque = collections.deque()
        self.pool = None
        if workers > 1:
            context = multiprocessing.get_context("spawn")  # no fork of a process with threads and torch
            jsons = tuple(t.to_str() for t in self.tokenizers)
            self.pool = concurrent.futures.ProcessPoolExecutor(
                workers, mp_context=context, initializer=encode_worker.init, initargs=jsons
            )

    def _args(self, chunk: Chunk, side: int) -> tuple:
        return chunk.texts[side], chunk.ends[side], chunk.continues, self.eos_id, self.dtype.name

    def _empty(self) -> tuple[np.ndarray, list[int]]:
        return np.zeros(0, dtype=self.dtype), []

    def _encode(self, chunk: Chunk, side: int) -> tuple[np.ndarray, list[int]]:
        if not chunk.texts[side]:
            return self._empty()
        return encode_worker.encode(*self._args(chunk, side), self.tokenizers[self.slots[side]])

    def _future(self, chunk: Chunk, side: int) -> concurrent.futures.Future | None:
        if not chunk.texts[side]:
            return None
        return self.pool.submit(encode_worker.encode, *self._args(chunk, side), None, self.slots[side])

    def submit(self, split: str, chunk: Chunk) -> Iterator[tuple[str, Chunk, Encoded]]:
        sides = range(len(chunk.texts))
        if self.pool is None:
            yield split, chunk, [self._encode(chunk, side) for side in sides]
            return
        self.pending.append((split, chunk, [self._future(chunk, side) for side in sides]))
        while sum(len(item[2]) for item in self.pending) > 2 * self.workers:
            yield self._pop()

    def drain(self) -> Iterator[tuple[str, Chunk, Encoded]]:
        while self.pending:
            yield self._pop()

    def _pop(self) -> tuple[str, Chunk, Encoded]:
        split, chunk, futures = self.pending.popleft()
        return split, chunk, [self._empty() if f is None else f.result() for f in futures]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


# ---------------------------------------------------------------------------------------------------- shards


def _save_npy(path: str, array: np.ndarray) -> None:
    with open(path, "wb") as handle:  # a handle: np.save would add ".npy" to a temporary file's name
        np.save(handle, array)


class ShardWriter:
    """Appends one split's encoded chunks to its shard files; a shard becomes visible (renamed) only when finished."""

    def __init__(self, kind: RecordKind, directory: Path, shard_tokens: int, progress: dict, keep_text: bool) -> None:
        self.kind, self.directory, self.shard_tokens = kind, directory, shard_tokens
        self.progress, self.keep_text = progress, keep_text
        self.files = [f"{side}.bin" if side else "bin" for side in kind.sides] + (["text.bin"] if keep_text else [])
        self.files += ["extras.jsonl"] if kind.extras else []
        self.handles: dict | None = None
        self._reset()

    def _reset(self) -> None:
        self.tokens = [0] * len(self.kind.sides)
        self.starts: list[list[np.ndarray]] = [[] for _ in self.kind.sides]
        self.text_ends: list[np.ndarray] = []
        self.text_bytes = self.characters = self.nbytes = 0

    def _name(self) -> str:
        return f"shard-{len(self.progress['shards']):05d}"

    def append(self, encoded: Encoded, chunk: Chunk) -> None:
        if self.handles is None:
            name = self._name()
            self.handles = {f: open(self.directory / f"{name}.{f}.tmp", "wb") for f in self.files}  # noqa: SIM115
        for side, (ids, starts) in enumerate(encoded):
            if starts:
                self.starts[side].append(np.asarray(starts, dtype=np.int64) + self.tokens[side])
            self.handles[self.files[side]].write(ids.tobytes())
            self.tokens[side] += len(ids)
        if self.kind.extras and chunk.extras:
            self.handles["extras.jsonl"].write("".join(e + "\n" for e in chunk.extras).encode("utf-8"))
        if self.keep_text:  # each record's texts in turn (source, target, source, ...)
            parts = [text.encode("utf-8", "surrogatepass") for record in zip(*chunk.texts) for text in record]
            self.handles["text.bin"].write(b"".join(parts))
            self.text_ends.append(self.text_bytes + np.cumsum([len(p) for p in parts], dtype=np.int64))
            self.text_bytes = int(self.text_ends[-1][-1]) if parts else self.text_bytes
        self.characters += chunk.characters
        self.nbytes += chunk.nbytes
        self.progress[self.kind.counter] = chunk.documents
        if sum(self.tokens) >= self.shard_tokens and chunk.at_boundary:
            self.close()

    def close(self) -> None:
        """Finish the current shard: fsync, rename into place, then record it in progress.json."""
        if self.handles is None:
            self.save_progress()
            return
        for handle in self.handles.values():
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
        self.handles = None
        name = self._name()
        starts = [np.concatenate(s) if s else np.zeros(0, dtype=np.int64) for s in self.starts]
        if sum(self.tokens) or len(starts[0]):
            array = self.kind.starts_array(starts, self.tokens)
            atomic_write(self.directory / f"{name}.{self.kind.starts}", lambda tmp: _save_npy(tmp, array))
            if self.keep_text:
                ends = np.concatenate([np.zeros(1, np.int64), *self.text_ends])
                atomic_write(self.directory / f"{name}.text.npy", lambda tmp: _save_npy(tmp, ends))
            for f in self.files:
                os.replace(self.directory / f"{name}.{f}.tmp", self.directory / f"{name}.{f}")
            self.progress["shards"].append(self.kind.shard_entry(name, self.tokens, len(starts[0])))
        else:
            for f in self.files:
                (self.directory / f"{name}.{f}.tmp").unlink(missing_ok=True)
        self.progress["characters"] += self.characters
        self.progress["bytes"] += self.nbytes
        self._reset()
        self.save_progress()

    def save_progress(self) -> None:
        atomic_write(self.directory / "progress.json", lambda tmp: Path(tmp).write_text(json.dumps(self.progress)))


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


def _open_splits(root: Path, splits, kind: RecordKind) -> tuple[dict[str, dict], dict[str, dict]]:
    """A pass's splits: the indexes of those already finished, and the progress of the others, whose folders are
    made and cleaned of a killed run's unfinished shard (`*.tmp`) so that they resume after their last finished one."""
    indexes = {
        s: json.loads((root / s / "index.json").read_text()) for s in splits if (root / s / "index.json").exists()
    }
    progresses = {}
    for split in (s for s in splits if s not in indexes):
        directory = root / split
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.glob("*.tmp"):
            stale.unlink()
        try:
            progresses[split] = json.loads((directory / "progress.json").read_text())
        except (OSError, ValueError):
            progresses[split] = kind.new_progress()
        if progresses[split]["shards"]:
            log.info("prepare %s: resuming after shard %d", split, len(progresses[split]["shards"]) - 1)
    return indexes, progresses


def _write_indexes(root: Path, indexes: dict[str, dict]) -> dict[str, dict]:
    """Each split's index.json, written last and atomically: its presence marks the split finished."""
    for split, index in indexes.items():
        atomic_write(root / split / "index.json", lambda tmp, i=index: Path(tmp).write_text(json.dumps(i)))
    return indexes


# ---------------------------------------------------------------------------------------------------- prepare


def prepare_pass(
    stream: SplitStream,
    source: str,
    root: Path,
    kind: RecordKind,
    tokenizers: Sequence[Tokenizer],
    eos_id: int | None,
    dtype: np.dtype,
    limit: int | None = None,
    shard_tokens: int = SHARD_TOKENS,
    workers: int | None = None,
) -> dict[str, dict]:
    """One pass over a source split, tokenized into the shards of every split it feeds (the training source also
    feeds carved held-out splits); each split resumes after its own last finished shard. Their indexes.

    tokenizers: one per side of a record. limit: the training split is cut to this many of `kind.budget`'s units.
    workers: tokenizing processes for a big source (default: the CPUs this process may use)."""
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    indexes, progresses = _open_splits(root, dict(stream.passes())[source], kind)
    todo = list(progresses)
    if not todo:
        return indexes
    writers, chunkers = {}, {}
    for split, progress in progresses.items():
        writers[split] = ShardWriter(kind, root / split, shard_tokens, progress, kind.keeps_text(split))
        writers[split].save_progress()
        budget = kind.budget(progress, limit if split == "train" else None)
        chunkers[split] = Chunker(len(kind.sides), progress[kind.counter], kind.split_long, **budget)
    skip = min(chunker.start for chunker in chunkers.values())
    empty = 0

    def chunks() -> Iterator[tuple[str, Chunk]]:
        nonlocal empty
        for split, record in stream.routed(source, skip):
            if split is None:  # a record the stream drops (a pair with an empty side): counted
                empty += 1
                continue
            chunker = chunkers.get(split)
            if chunker is None:  # a split an earlier run finished: its records are read past
                continue
            chunk = chunker.add(kind.stage(record, root))
            if chunk is not None:
                yield split, chunk
                if all(c.done for c in chunkers.values()):
                    break  # every split is cut: the rest of the source is not read
        for split, chunker in chunkers.items():
            chunk = chunker.finish()
            if chunk is not None:
                yield split, chunk

    names = "+".join(todo)
    started, tokens = time.perf_counter(), 0
    size = stream.input_bytes(source)
    big = size is None and not stream.sources[source].in_memory or (size or 0) >= POOL_MIN_BYTES
    encoder = Encoder(tokenizers, eos_id, dtype, workers if big else 1)
    bar = _progress_bar(names, size)
    already = sum(w.progress["bytes"] for w in writers.values())
    bar.update(already)

    def write(done) -> None:
        nonlocal tokens
        for split, chunk, encoded in done:
            writers[split].append(encoded, chunk)
            tokens += sum(len(ids) for ids, _ in encoded)
            bar.update(chunk.nbytes)
            elapsed = max(time.perf_counter() - started, 1e-9)
            bar.set_postfix_str(f"{tokens / elapsed / 1e6:.2f}M tokens/s", refresh=False)

    try:
        # In-process encoding releases the GIL: a reader thread then parses the next chunks meanwhile.
        source_chunks = chunks() if encoder.pool is not None else _prefetch(chunks())
        for split, chunk in source_chunks:
            write(encoder.submit(split, chunk))
        write(encoder.drain())
        if empty:
            progress = writers.get(source, writers[todo[0]]).progress
            progress["empty"] = progress.get("empty", 0) + empty
        for writer in writers.values():
            writer.close()
    finally:
        encoder.close()
        bar.close()
    elapsed = max(time.perf_counter() - started, 1e-9)
    read = (sum(w.progress["bytes"] for w in writers.values()) - already) / 1e6
    indexes.update(_write_indexes(root, {s: kind.index(w.progress, dtype, w.keep_text) for s, w in writers.items()}))
    log.info(
        "prepare %s%s: %.1f MB in %.1f s (%.1f MB/s), %d tokens (%.2fM tokens/s), %s",
        names, kind.noun, read, elapsed, read / elapsed, tokens, tokens / elapsed / 1e6, kind.summary(indexes),
    )  # fmt: skip
    return indexes


def prepare(
    stream: SplitStream,
    kind: RecordKind,
    tokenizers: Sequence[Tokenizer],
    settings: tuple,
    cache_dir: Path,
    info: dict,
    eos_id: int | None = None,
    limit: int | None = None,
    shard_tokens: int = SHARD_TOKENS,
    workers: int | None = None,
) -> Path:
    """Prepare every split of `stream` once (cached by content; resumable; atomic); the prepared dataset's folder.

    settings: what else the content depends on (the tokenizers' keys, ...), in the cache key; info: the manifest's
    fields of this kind."""
    hashes = FileHashes(cache_dir)
    key = fingerprint(kind.tag, FORMAT_VERSION, stream.content_key(hashes), *settings, limit, shard_tokens)
    hashes.save()
    root = cache_dir / kind.folder / key
    manifest = root / "manifest.json"
    if manifest.exists() and not damaged_splits(root, kind):
        return root
    with locked(root):
        if manifest.exists():  # finished by another process while we waited, or damaged since
            damaged = damaged_splits(root, kind)
            if not damaged:
                return root
            log.warning(
                "prepared data in %s disagrees with its index (%s): preparing %s again",
                root, "; ".join(damaged.values()), " and ".join(damaged),
            )  # fmt: skip
            manifest.unlink()
            for split in damaged:
                shutil.rmtree(root / split)
        dtype = token_dtype(max(t.get_vocab_size() for t in tokenizers))
        kind.begin(root)
        splits = {}
        try:
            for source, _ in stream.passes():
                splits |= prepare_pass(
                    stream, source, root, kind, tokenizers, eos_id, dtype, limit, shard_tokens, workers
                )
        except OSError as error:
            if error.errno not in WRITE_FAILURES:
                raise
            raise WriteError(
                f"could not write the prepared data in {root}: {error.strerror}; its finished shards are kept and "
                "the next run goes on after them. Free disk space (or raise the file-size limit, or give "
                "--data.init_args.cache_dir a larger disk) and run again"
            ) from error
        kind.check(stream, splits)
        head = {"version": FORMAT_VERSION, "dataset": stream.dataset, "held_out": stream.mode, "dtype": dtype.name}
        content = {**head, **info, "splits": {split: splits[split] for split in SPLITS}}
        atomic_write(manifest, lambda tmp: Path(tmp).write_text(json.dumps(content, indent=1)))
    return root


def damaged_splits(root: Path, kind: RecordKind) -> dict[str, str]:
    """The prepared splits whose files disagree with their index, each with what is wrong: a token file shorter or
    longer than the tokens its index counts (a disk that filled, a copy cut short), or a shard's file missing. Only
    sizes are read (a stat per file), so every start checks."""
    try:
        info = json.loads((root / "manifest.json").read_text())
        itemsize = np.dtype(info["dtype"]).itemsize
        splits = info["splits"]
    except (OSError, ValueError, KeyError, TypeError):
        return {split: "manifest.json unreadable" for split in SPLITS}
    damaged = {}
    for split, index in splits.items():
        for entry in index.get("shards", []):
            name = entry.get("name") or str(entry.get("file", "")).removesuffix(".bin")
            expected = [(f"{name}.{side}.bin" if side else f"{name}.bin", entry.get(f"{side}_tokens" if side else "tokens"))
                        for side in kind.sides]  # fmt: skip
            problem = None
            for file, tokens in expected:
                path = root / split / file
                size = path.stat().st_size if path.is_file() else None
                if size is None:
                    problem = f"{split}/{file} is missing"
                elif tokens is not None and size != tokens * itemsize:
                    problem = f"{split}/{file} has {size:,} bytes where its index counts {tokens * itemsize:,}"
                if problem:
                    break
            if problem is None and not (root / split / f"{name}.{kind.starts}").is_file():
                problem = f"{split}/{name}.{kind.starts} is missing"
            if problem:
                damaged[split] = problem
                break
    return damaged


# ---------------------------------------------------------------------------------------------------- texts with a value


class TextsKind(RecordKind):
    """Records of one text each (its ids, no EOS) and a JSON value beside it (the record's `extra`): `texts.npy` the
    n + 1 offsets where texts start, the values one JSON line each in `extras.jsonl`. A task's kind names its folder
    and tag, and what it checks of the prepared splits."""

    sides, starts, counter = ("",), "texts.npy", "rows"
    summed = ("texts", "tokens")
    noun = " texts"
    extras = True

    def new_progress(self) -> dict:
        return {**super().new_progress(), "empty": 0}

    def index_extras(self, progress: dict, keep_text: bool) -> dict:
        return {"empty": progress.get("empty", 0)}

    def budget(self, progress: dict, limit: int | None) -> dict[str, int | None]:
        done = sum(s["texts"] for s in progress["shards"])
        return {"max_records": None if limit is None else max(0, limit - done)}

    def starts_array(self, starts: list[np.ndarray], tokens: list[int]) -> np.ndarray:
        return np.concatenate([starts[0], np.array([tokens[0]], dtype=np.int64)])

    def shard_entry(self, name: str, tokens: list[int], records: int) -> dict:
        return {"name": name, "texts": records, "tokens": tokens[0]}

    def summary(self, indexes: dict[str, dict]) -> str:
        return f"texts { {s: i['texts'] for s, i in indexes.items()} }"
