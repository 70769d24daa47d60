"""Pre-tokenized corpora on disk: a streaming `prepare` that writes token shards, and the reader training uses.

Layout of one prepared corpus (under <cache>/shards/<key>/, the key a hash of the corpus's content, the tokenizer
and the settings, so a changed input never reuses a stale entry):

    manifest.json                 written last: its presence means every split is complete
    <split>/shard-00000.bin       token ids, raw little-endian uint16 (uint32 when the vocabulary needs it)
    <split>/shard-00000.docs.npy  where each document starts in the shard (int64 token offsets)
    <split>/progress.json         finished shards and how many source documents they cover (for resuming)
    <split>/index.json            the split's shards, token, character and document counts (written when done)

Preparation streams the source (see `streaming.py`), tokenizes it in chunks of a few megabytes with the tokenizer's
own batch parallelism (`encode_batch_fast`: Rust threads on every core) while a reader thread parses the next chunk,
and appends ids to the current shard. A shard is written to a temporary file, fsynced and renamed only when complete,
and `progress.json` is updated after it: a killed run resumes after its last finished shard, and no reader ever sees
a half-written shard. Shards end at document boundaries.

Training reads blocks through short-lived memory maps: a map is opened for the rows of one batch and dropped, so the
pages it touched are not kept mapped and the resident memory stays flat however much of the corpus is read.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from torch.utils.data import Dataset

from .cache import atomic_write, fingerprint, hash_file, locked
from .loaders import stack_blocks
from .streaming import SPLITS, CorpusStream, Piece

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
SHARD_TOKENS = 1 << 26  # about 64M tokens (128 MB of uint16) per shard
CHUNK_CHARS = 1 << 22  # characters tokenized per encode_batch call: bounded memory, both cores busy
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


def _chunks(pieces: Iterator[Piece], max_chars: int | None, start_documents: int) -> Iterator[_Chunk]:
    """Pieces grouped into chunks of about CHUNK_CHARS characters (a long document spans several chunks)."""
    chunk, total = _Chunk(start_documents), 0
    in_document = False  # the current document has text (in this chunk or an earlier one)
    in_chunk = False  # ... in this chunk
    for piece in pieces:
        text = piece.text
        if max_chars is not None:
            text = text[: max(0, max_chars - total)]
        if text:
            if not chunk.texts and in_document:
                chunk.continues = True
            for part in _split_long(text):
                chunk.texts.append(part)
                chunk.ends.append(False)
            chunk.characters += len(text)
            total += len(text)
            in_document = in_chunk = True
        chunk.nbytes += piece.nbytes
        cut = max_chars is not None and total >= max_chars
        if piece.last or cut:
            if in_document:
                if not in_chunk:  # the document's text was all in earlier chunks: EOS alone
                    chunk.continues = chunk.continues or not chunk.texts
                    chunk.texts.append("")
                    chunk.ends.append(False)
                chunk.ends[-1] = True
            in_document = in_chunk = False
            chunk.documents = piece.document + 1
        chunk.at_boundary = piece.last or cut
        if cut:
            break
        if chunk.characters >= CHUNK_CHARS:
            yield chunk
            chunk, in_chunk = _Chunk(chunk.documents), False
    if chunk.texts or chunk.nbytes:
        yield chunk


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
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    encoded = encode(chunk.texts, add_special_tokens=False)
    lists, starts, at, new_document = [], [], 0, not chunk.continues
    for encoding, end in zip(encoded, chunk.ends):
        ids = encoding.ids
        if new_document and (ids or end):
            starts.append(at)
            new_document = False
        if end and eos_id is not None:
            ids.append(eos_id)
        lists.append(ids)
        at += len(ids)
        if end:
            new_document = True
    flat = np.fromiter(itertools.chain.from_iterable(lists), dtype=dtype, count=at)
    return flat, starts


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
        atomic_write(self.directory / f"{name}.docs.npy", lambda tmp: np.save(open(tmp, "wb"), starts))  # noqa: SIM115
        if self.tokens:
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


def prepare_split(
    stream: CorpusStream,
    split: str,
    directory: Path,
    tokenizer: Tokenizer,
    eos_id: int | None,
    dtype: np.dtype,
    max_chars: int | None = None,
    shard_tokens: int = SHARD_TOKENS,
    on_shard: Callable[[int], None] | None = None,
) -> dict:
    """Tokenize one split into shards under `directory` (resuming after its last finished shard); its index."""
    index_path = directory / "index.json"
    if index_path.exists():
        return json.loads(index_path.read_text())
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.tmp"):  # a killed run's unfinished shard
        stale.unlink()
    try:
        progress = json.loads((directory / "progress.json").read_text())
    except (OSError, ValueError):
        progress = {"shards": [], "documents": 0, "characters": 0, "bytes": 0}
    resumed = bool(progress["shards"])
    if resumed:
        log.info(
            "prepare %s: resuming after shard %d (%d documents)",
            split,
            len(progress["shards"]) - 1,
            progress["documents"],
        )
    if max_chars is not None:
        max_chars = max(0, max_chars - progress["characters"])
    writer = _ShardWriter(directory, dtype, shard_tokens, progress)
    if not (directory / "progress.json").exists():
        writer._save_progress()
    pieces = stream.pieces(split, skip_documents=progress["documents"])
    started, tokens = time.perf_counter(), 0
    bar = _progress_bar(split, stream.input_bytes(split))
    bar.update(progress["bytes"])
    try:
        for chunk in _prefetch(_chunks(pieces, max_chars, progress["documents"])):
            shards_before = writer.number
            if chunk.texts:
                ids, starts = encode_chunk(tokenizer, chunk, eos_id, dtype)
            else:
                ids, starts = np.zeros(0, dtype=dtype), []
            writer.append(ids, starts, chunk)
            tokens += len(ids)
            bar.update(chunk.nbytes)
            elapsed = max(time.perf_counter() - started, 1e-9)
            bar.set_postfix_str(f"{tokens / elapsed / 1e6:.2f}M tokens/s", refresh=False)
            if on_shard is not None and writer.number > shards_before:
                on_shard(writer.number)
        writer.close()
    finally:
        bar.close()
    elapsed = max(time.perf_counter() - started, 1e-9)
    read = progress["bytes"] / 1e6
    index = {
        "dtype": dtype.name,
        "shards": progress["shards"],
        "tokens": sum(s["tokens"] for s in progress["shards"]),
        "documents": sum(s["documents"] for s in progress["shards"]),
        "characters": progress["characters"],
        "bytes": progress["bytes"],
    }
    atomic_write(index_path, lambda tmp: Path(tmp).write_text(json.dumps(index)))
    log.info(
        "prepare %s: %.1f MB in %.1f s (%.1f MB/s), %d tokens (%.2fM tokens/s), %d shard(s)",
        split, read, elapsed, read / elapsed, index["tokens"], tokens / elapsed / 1e6, len(index["shards"]),
    )  # fmt: skip
    return index


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
    on_shard: Callable[[int], None] | None = None,
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
        for split in SPLITS:
            cut = max_chars if split == "train" else None
            splits[split] = prepare_split(
                stream, split, root / split, tokenizer, eos_id, dtype, cut, shard_tokens, on_shard
            )
        info = {
            "version": FORMAT_VERSION,
            "dataset": stream.dataset,
            "held_out": stream.mode,
            "dtype": dtype.name,
            "eos_id": eos_id,
            "vocab_size": tokenizer.get_vocab_size(),
            "tokenizer_key": tokenizer_key,
            "splits": splits,
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
