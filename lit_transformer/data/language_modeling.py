"""LanguageModelingDataModule: text from the hub, local files or the embedded Shakespeare, streamed into token shards
once (`python -m lit_transformer prepare`, or the first `fit`), then read as packed blocks through memory maps.

All that is the language-modelling family's own (masked LM reads the same blocks) lives here: its stream of
document pieces (CorpusStream), its shard kind (TEXT: each document's ids then EOS), its shards read as overlapping
blocks (TokenShards, ShardBlocks) and the tokenizer's training sample (sample_texts). Reading, carving, the shard
writer and the loaders are the shared modules'.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info
from tokenizers import Tokenizer
from torch.utils.data import Dataset

from ..config import TransformerConfig
from ..errors import ConfigError
from . import corpora
from .base import COVERAGE_CHARS, COVERAGE_TOKENS, DataModule
from .cache import hash_file
from .loaders import BlockStreamLoader, ResumableLoader, fixed_size_batches, load_prepared
from .shards import SHARD_TOKENS, RecordKind, prepare
from .sources import (
    BUILDERS,
    ENCODING,
    HASH_MIN_DOCUMENTS,
    HELD_OUT,
    SPLITS,
    DataFileError,
    Piece,
    Source,
    SplitStream,
    byte_line_cut,
    carve,
    column_value,
    data_size,
    digest_bucket,
    file_chunks,
    form_suffix,
    line_cut,
    line_range,
    records,
    table_rows,
)
from .text import with_mask_token


class LanguageModelingDataModule(DataModule):
    """Next-token prediction batches {"input_ids", "labels"} of shape (batch_size, block_size), packed without padding.

    The tokenizer is ready right after construction (trained and cached on first access), so the CLI can link its
    vocabulary size and special ids into the model config.
    """

    feeds = ("language_modeling", "masked_lm")

    def __init__(
        self,
        dataset: str = "shakespeare",
        block_size: int | None = None,
        max_chars: int | None = None,
        mask_token: bool = False,
        sampling: Literal["random", "sequential"] = "random",
        **kwargs: Any,
    ) -> None:
        """
        Args:
            dataset: "shakespeare" (embedded), a Hugging Face hub name, or a local .txt/.jsonl/.json/.csv/.tsv/.parquet
                file, folder or glob (a folder's train*/valid*/test* files become the splits).
            block_size: Tokens per sequence. None: the model's context (model.config.max_seq_len; 256 without a
                model). Given to `validate`/`test` of a trained model, it may exceed the model's context: that is how
                length extrapolation is measured.
            max_chars: Use only the first max_chars characters of the training split (quick CPU runs; ~1M for
                Shakespeare trains in minutes). None uses it all. Validation and test are never cut.
            mask_token: Add a <mask> token after the vocabulary, for masked-LM pretraining of an encoder_only model on
                this text (head: masked_lm; the packed blocks serve as inputs, their next-token labels are ignored).
            sampling: Training order of the blocks: random (a seeded permutation per epoch) or sequential. Either
                way the order is a function of (seed, epoch, global sample index), so a run resumes exactly on any
                number of processes.
            **kwargs: The arguments every DataModule shares (batch_size, tokenizer, vocab_size, seed, ...: see
                DataModule); blocks are packed, so there is no token budget, and the held-out fraction is fixed.
        """
        super().__init__(dataset=dataset, max_tokens=None, held_out=HELD_OUT, **kwargs)
        if block_size is None:
            block_size = TransformerConfig.max_seq_len  # the model's default context
        if block_size < 1:
            raise ConfigError(f"block_size={block_size} must be positive", keys=["data.init_args.block_size"])
        if sampling not in ("random", "sequential"):
            raise ConfigError(f"sampling={sampling!r}: choose random or sequential", keys=["data.init_args.sampling"])
        if max_chars is not None and max_chars < 1:
            raise ConfigError(f"max_chars={max_chars} must be positive or None", keys=["data.init_args.max_chars"])
        self.block_size, self.max_chars = block_size, max_chars
        self.mask_token, self.sampling = mask_token, sampling
        self._stream: CorpusStream | None = None
        self._root: Path | None = None
        self._splits: dict[str, TokenShards] = {}
        self._blocks: dict[str, ShardBlocks] = {}

    # ------------------------------------------------------------------ text

    @property
    def stream(self) -> CorpusStream:
        """The corpus as a stream of documents per split (held-out splits carved from train when missing)."""
        if self._stream is None:
            embedded = corpora.embedded(self.dataset, self.cache_dir)
            self._stream = CorpusStream(
                self.dataset, self.dataset_config, self.text_column, embedded, self.held_out, self.encoding
            )
        return self._stream

    def texts(self) -> dict[str, list[str]]:
        """Each split's documents as prepared (train cut to max_chars), read back from the shards the batches come
        from and decoded: for inspection and small corpora (a document is held whole)."""
        return {split: list(shards.texts(self.tokenizer)) for split, shards in self._prepared().items()}

    def _empty(self) -> DataFileError:
        return DataFileError(
            f"The training split of {self.dataset!r} is empty: no line of text (a row file: no non-blank "
            f"{self.text_column!r} value); give data.init_args.dataset a file with text in it"
        )

    def tokenizer_texts(self) -> list[str]:
        limit = (
            self.tokenizer_sample_chars if self.max_chars is None else min(self.max_chars, self.tokenizer_sample_chars)
        )
        sample = sample_texts(self.stream, limit)
        if not sample:
            raise self._empty()
        return sample

    # ------------------------------------------------------------------ tokenizer

    def build_tokenizers(self) -> tuple[tuple[Tokenizer, Tokenizer], tuple[str, str]]:
        (tokenizer, _), (key, _) = super().build_tokenizers()
        if self.mask_token:
            key = with_mask_token(tokenizer, key)  # a literal "<mask>" in the text now encodes otherwise
        return (tokenizer, tokenizer), (key, key)

    def characters_per_token(self, split: str = "validation") -> float:
        """Characters of the split's text per token of its stream (EOS included): converts a per-token NLL into
        bits per character, a scale that does not depend on the tokenizer."""
        shards = self._prepared()[split]
        return shards.characters / max(1, len(shards))

    # ------------------------------------------------------------------ Lightning hooks

    def _prepared(self) -> dict[str, TokenShards]:
        """The token shards of every split, prepared first when the cache lacks them."""
        if not self._splits:
            if self._root is None:
                tokenizer = self.tokenizer
                self._root = prepare_corpus(
                    self.stream, tokenizer, self._tokenizer_keys[0], self.eos_token_id, self.cache_dir, self.max_chars
                )
            info, self._splits = load_prepared(self._root, TokenShards)
            if len(self._splits["train"]) == 0:
                raise self._empty()
            sizes = {s: (shards.characters, len(shards)) for s, shards in self._splits.items()}
            rank_zero_info(f"{self.dataset}: (characters, tokens) per split {sizes}; held-out: {info['held_out']}")
            limit = COVERAGE_CHARS if self.max_chars is None else min(self.max_chars, COVERAGE_CHARS)
            train = self._splits["train"]
            self.warn_unknown_tokens(
                train.head(COVERAGE_TOKENS), len(train), lambda: sample_texts(self.stream, limit), self.tokenizer
            )
        return self._splits

    def prepare(self) -> Path:
        """Stream the corpus into token shards (train the tokenizer first when needed); the prepared folder."""
        self._prepared()
        return self._root

    def setup(self, stage: str | None = None) -> None:
        """Every rank: open the shards (memory-mapped per batch) and view them as blocks."""
        if stage == "predict":  # the predict_file and the tokenizer alone: no split is read
            return
        splits = self._prepared()
        for split in SPLITS:
            if split not in self._blocks:
                blocks = splits[split].blocks(self.block_size)
                if len(blocks) == 0:
                    raise DataFileError(self._too_small(split, len(splits[split])))
                self._blocks[split] = blocks
        rank_zero_info(
            f"{self.dataset}: blocks of {self.block_size} tokens per split { {s: len(b) for s, b in self._blocks.items()} }"
        )

    def _too_small(self, split: str, tokens: int) -> str:
        splits = self._splits
        total_tokens = sum(len(s) for s in splits.values())
        total_chars = sum(s.characters for s in splits.values())
        documents = sum(s.documents for s in splits.values())
        need = self.block_size + 1
        minimum = int(need / self.held_out) if self.stream.missing else need
        chars = int(minimum * total_chars / max(1, total_tokens))
        return (
            f"The {split} split of {self.dataset!r} has {tokens} tokens, fewer than one block of block_size + 1 = "
            f"{need}. The corpus holds {total_chars:,} characters in {documents:,} documents ({total_tokens:,} "
            f"tokens); "
            + (
                f"validation and test take {self.held_out:.0%} of it each, so it needs at least about {minimum:,} tokens "
                f"(~{chars:,} characters) for block_size={self.block_size}. "
                if self.stream.missing
                else ""
            )
            + (
                "It is long enough, but held-out text is carved by whole lines (or documents), and it has too few: "
                "break the text into lines (paragraphs), or give files named train*/valid*/test* to choose the splits "
                "yourself"
                if self.stream.missing and total_tokens >= minimum
                else "Give more text, a smaller block_size, or files named train*/valid*/test* to choose the splits "
                "yourself"
            )
            + (f" (max_chars={self.max_chars:,} keeps the training text's first characters)" if self.max_chars else "")
        )

    def loader(self, split: str, shuffle: bool) -> BlockStreamLoader | ResumableLoader:
        if split not in self._blocks:
            self.setup()
        blocks = self._blocks[split]
        if shuffle:  # training: an endless stream of blocks in a seeded order, elastic across process counts
            if len(blocks) < self.batch_size:
                raise DataFileError(
                    f"The {split} split of {self.dataset!r} has {len(blocks)} blocks, fewer than "
                    f"batch_size={self.batch_size}: give more text, or a smaller data.init_args.batch_size or block_size"
                )
            return BlockStreamLoader(
                blocks, self.batch_size, seed=self.seed, shuffle=self.sampling == "random", num_workers=self.num_workers
            )
        batches = fixed_size_batches(len(blocks), self.batch_size, self.seed, shuffle=False, drop_last=False)
        return ResumableLoader(blocks, batches, shuffle=False, seed=self.seed, num_workers=self.num_workers)


# ---------------------------------------------------------------------------------------------------- a corpus's stream


def _absent(row: dict, column: str) -> bool:
    """Whether a row lacks `column` or holds null there (not a blank text, which many corpora hold between texts)."""
    try:
        return column_value(row, column) is None
    except KeyError:
        return True


class CorpusStream(SplitStream):
    """Each split of a corpus as a stream of `Piece`s, with held-out splits carved from train when missing: by
    document hash, or by lines for a handful of long documents (see the module)."""

    key = "corpus"
    local_hint = "(.txt, .jsonl/.json, .csv/.tsv, .parquet), a hub dataset name, or an embedded corpus"
    text_files = True
    column_hint = " (choose one with --data.init_args.text_column)"

    def __init__(
        self,
        dataset: str,
        dataset_config: str | None = None,
        text_column: str = "text",
        embedded=None,
        held_out: float = HELD_OUT,
        encoding: str = ENCODING,
    ) -> None:
        self.text_column = text_column
        self._told = set()
        super().__init__(dataset, dataset_config, embedded, held_out, encoding)
        files = [f for source in self.sources.values() for f in source.files]
        tables = any(source.table is not None for source in self.sources.values())
        if text_column != "text" and files and not tables and all(form_suffix(f) not in BUILDERS for f in files):
            raise ConfigError(  # it was read past without a word: a text file has no columns
                f"--data.init_args.text_column {text_column}: {dataset!r} is plain text (each line is text), which has "
                "no columns; leave text_column out, or give a JSONL, CSV or parquet file",
                keys=["data.init_args.text_column"],
            )

    def _columns(self) -> list[str]:
        return [self.text_column]

    def _settings(self) -> tuple:
        return (self.text_column,)

    # ------------------------------------------------------------------ the stream of a split

    def routed(self, source_name: str, skip: int = 0) -> Iterator[tuple[str, Piece]]:
        """(split, piece) for every piece of one pass over a source split; the first `skip` source documents are
        read past (a resumed preparation continues where its last finished shard ended). The training source feeds
        the carved held-out splits too: whole documents by hash, or each document's lines (see the module)."""
        source = self.sources[source_name]
        carving = source_name == "train" and bool(self.missing)
        line_mode = carving and self.mode == "lines"
        document = 0
        for kind, payload, digest in self._documents(source):
            if document < skip:
                document += 1
                continue
            if kind == "file":  # a .txt file: one document, read in line-bounded chunks
                path = payload
                if line_mode:
                    for split in ("train", *self.missing):
                        for piece in self._file_lines(path, document, *line_range(split, self.missing, self.held_out)):
                            yield split, piece
                else:
                    owner = carve(digest_bucket(digest()), self.missing, self.held_out) if carving else source_name
                    for piece in file_chunks(path, document, encoding=self.encoding):
                        yield owner, piece
            else:
                text, nbytes = payload
                if line_mode:
                    for split in ("train", *self.missing):
                        start, end = line_range(split, self.missing, self.held_out)
                        a = 0 if start == 0 else line_cut(text, start)
                        b = len(text) if end >= 1 else line_cut(text, end)
                        yield split, Piece(text[a:b], document, True, nbytes if split == "train" else 0)
                else:
                    yield self.owner(source_name, text), Piece(text, document, True, nbytes)
            document += 1

    def _file_lines(self, path: str, document: int, start: float, end: float) -> Iterator[Piece]:
        """The lines of a .txt file between two fractions of its bytes, cut at line boundaries."""
        size = data_size(path)
        lo = 0 if start == 0 else byte_line_cut(path, int(size * start), size)
        hi = size if end >= 1 else byte_line_cut(path, int(size * end), size)
        yield from file_chunks(path, document, lo, hi, self.encoding)

    def _documents(self, source: Source):
        """(kind, payload, digest) per document: ("file", path, lazy hash) for .txt files, ("row", (text, bytes),
        None) for rows. Blank rows are dropped."""
        if source.table is not None:
            for row in table_rows(source.table):
                text = self._text(row, self.dataset)
                if text.strip():
                    yield "row", (text, len(text)), None
            return
        for path in source.files:
            if form_suffix(path) not in BUILDERS:
                yield "file", path, lambda path=path: self.file_hashes.get(path) or hash_file(path)
                continue
            for row, nbytes, number in records(path, [self.text_column.split(".")[0]], self.encoding):
                text = self._text(row, f"{path}:{number}")
                if text.strip():
                    yield "row", (text, nbytes), None
                elif path not in self._told and _absent(row, self.text_column):
                    self._told.add(path)  # once a file, at its first such row: they are dropped without a word
                    warnings.warn(
                        f"{path}:{number} has no {self.text_column!r} (absent or null): such rows are left out "
                        "(this file's others too); give each row its text, or choose the column with --data.init_args.text_column",
                        stacklevel=2,
                    )

    # ------------------------------------------------------------------ splits

    def _text(self, row: dict, where: str) -> str:
        """A row's text ("" when blank, null or absent in this row: such rows are dropped). A value of another kind (a
        number, a list, an object) is refused where it is, as the other tasks' readers refuse it: it was dropped
        without a word, so a file whose text column held lists trained on none of them."""
        try:
            text = column_value(row, self.text_column)
        except KeyError:
            return ""
        if text is not None and not isinstance(text, str):
            raise DataFileError(
                f"{where}: the text column {self.text_column!r} holds {type(text).__name__} {str(text)[:40]!r}, not "
                "text: give each row a string (join a list yourself), or choose another column with "
                "--data.init_args.text_column"
            )
        return text or ""

    def _carving_mode(self) -> str:
        """hash when the training source has at least HASH_MIN_DOCUMENTS documents, else lines."""
        count = 0
        for _ in self._documents(self.sources["train"]):
            count += 1
            if count >= HASH_MIN_DOCUMENTS:
                return "hash"
        return "lines"

    def documents(self, split: str) -> Iterator[str]:
        """Each document of `split` as one string (for inspection and small corpora: a document is held whole)."""
        parts: list[str] = []
        for piece in self.records_of(split):
            parts.append(piece.text)
            if piece.last:
                text = "".join(parts)
                parts = []
                if text.strip():
                    yield text


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


# ---------------------------------------------------------------------------------------------------- a corpus's documents


class TextKind(RecordKind):
    """A corpus's documents: one side, each document's ids then EOS; `docs.npy` holds where documents start."""

    folder, tag, sides, starts, counter = "shards", "shards", ("",), "docs.npy", "documents"
    summed = ("tokens", "documents")
    split_long = True

    def starts_array(self, starts: list[np.ndarray], tokens: list[int]) -> np.ndarray:
        return starts[0]

    def shard_entry(self, name: str, tokens: list[int], records: int) -> dict:
        return {"file": f"{name}.bin", "tokens": tokens[0], "documents": records}

    def summary(self, indexes: dict[str, dict]) -> str:
        return f"shards { {s: len(i['shards']) for s, i in indexes.items()} }"


TEXT = TextKind()


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


def stack_blocks(blocks: np.ndarray) -> dict[str, torch.Tensor]:
    """(B, T+1) packed tokens to next-token inputs and labels."""
    tokens = torch.from_numpy(np.ascontiguousarray(blocks, dtype=np.int64))
    return {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:]}


# ---------------------------------------------------------------------------------------------------- a corpus's shards as blocks


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

    def texts(self, tokenizer) -> Iterator[str]:
        """Each document, its ids decoded (EOS and other special tokens left out), blank ones skipped: a split read
        back for inspection."""
        for shard in range(len(self.paths)):
            tokens = np.array(self.open(shard))
            starts = np.load(Path(self.paths[shard]).with_suffix(".docs.npy")).tolist() if len(tokens) else []
            for a, b in zip(starts, [*starts[1:], len(tokens)], strict=True):
                text = tokenizer.decode(tokens[a:b].tolist())
                if text.strip():
                    yield text

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
