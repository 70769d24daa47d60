"""TranslationDataModule: sentence pairs from the hub, local files or the embedded KJV-RV1909, batched by token budget.

The pairs (local files, a hub stream or the embedded corpus) are streamed once into token shards (`shards.py`:
`python -m lit_transformer prepare`, or the first `fit`) and read through memory maps, so a corpus of any size trains
in flat memory.

Batches: {"src": (B, S), "tgt_in": (B, T), "labels": (B, T)}. src is the source followed by eos and padded with
pad_token_id; tgt_in is bos followed by the target; labels are the target followed by eos, -100 at padding.
Validation, test and predict batches also carry "src_text" and "ref_text" (lists of strings) for BLEU.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from tokenizers import Tokenizer
from torch.utils.data import Dataset

from ..errors import ConfigError
from . import corpora
from .base import COVERAGE_CHARS, COVERAGE_TOKENS, DataModule, check_least, warn_deprecated_key
from .cache import fingerprint
from .loaders import ResumableLoader, load_prepared, map_file, target_batch, token_budget_plan
from .marian_tokenizers import load_hf_marian_tokenizers, marian_decoder_start_token_id
from .shards import SHARD_TOKENS, RecordKind, prepare
from .sources import (
    ENCODING,
    HELD_OUT,
    SPLITS,
    DataFileError,
    Source,
    SplitStream,
    column_value,
    columns_of,
    records,
    table_rows,
)
from .text import KINDS, load_or_train_tokenizer


def _collate(batch: dict) -> dict:
    return batch


class TranslationDataModule(DataModule):
    """Sentence pairs for an encoder-decoder, batched by a token budget from length-sorted buckets.

    The tokenizer(s) are ready right after construction (trained and cached on first access), so the CLI can link
    vocabulary sizes and special ids into the model config.
    """

    feeds = ("translation",)

    encoder_decoder = True  # predict inputs are sources: their tokens, then EOS
    required_special_tokens = ("pad", "bos", "eos")

    def __init__(
        self,
        dataset: str = "kjv-rv1909",
        source_lang: str = "en",
        target_lang: str = "es",
        source_column: str | None = None,
        target_column: str | None = None,
        tokenizer: str = "bpe",
        vocab_size: int = 8000,
        shared_vocab: bool = True,
        max_tokens: int = 4096,
        batch_size: int | None = None,
        max_length: int = 128,
        max_pairs: int | None = None,
        bleu_samples: int = 200,
        storage: Literal["shards", "memory"] | None = None,
        **kwargs: Any,
    ) -> None:
        """
        Args:
            dataset: "kjv-rv1909" (embedded English-Spanish Bible), a hub translation dataset (e.g. wmt14, with a
                `translation` dict column), or local .tsv/.csv/.jsonl/.parquet pair files (folder, glob or file).
            source_lang: Source language code: the key in a `translation` column, or the source column's name.
            target_lang: Target language code, likewise.
            source_column: The source text column when it is not named after source_lang.
            target_column: The target text column when it is not named after target_lang.
            tokenizer: A kind to train (bpe, byte_bpe, char), a tokenizer.json path, a hub tokenizer name, or a
                Marian folder (to fine-tune it: its tokenizers, OPUS-MT's SentencePiece ones converted, and its
                decoder's start token, which for OPUS-MT is <pad>).
            vocab_size: Vocabulary size of each trained tokenizer.
            shared_vocab: One vocabulary for both languages (allows the paper's three-way tying: one matrix for both embeddings and the output layer); False
                trains a separate target tokenizer.
            max_tokens: Token budget per batch: batch size times the longest sequence (source or target) in it.
            max_length: Pairs with more tokens than this on either side (with bos/eos) are dropped, and counted.
            max_pairs: Use only the first max_pairs training pairs (quick CPU runs); None uses all.
            bleu_samples: How many validation pairs the LightningModule decodes with beam search for BLEU.
            batch_size: At most this many pairs a batch besides the token budget (None: the budget alone).
            storage: Deprecated (dropped in 0.2.0): pairs always stream into token shards (any value is accepted
                with a warning).
            **kwargs: The arguments every DataModule shares (dataset_config, held_out, seed, predict_file, ...: see
                DataModule); a pair's texts come from source_column/target_column, not text_column.
        """
        super().__init__(
            dataset=dataset, text_column="text", tokenizer=tokenizer, vocab_size=vocab_size, batch_size=batch_size,
            max_tokens=max_tokens, **kwargs,
        )  # fmt: skip
        if max_length < 2 or max_tokens < max_length:
            raise ConfigError(
                f"Need max_length >= 2 and max_tokens >= max_length (got {max_length}, {max_tokens})",
                keys=["data.init_args.max_length", "data.init_args.max_tokens"],
            )
        check_least(max_pairs=(max_pairs, 1), bleu_samples=(bleu_samples, 0))
        if storage is not None:
            warn_deprecated_key(
                "storage", "ignored: pairs always stream into token shards (the same batches, memory flat in corpus "
                "size); drop the key",
            )  # fmt: skip
        self.source_lang, self.target_lang = source_lang, target_lang
        self.source_column, self.target_column = source_column, target_column
        self.shared_vocab = shared_vocab
        self.max_length, self.max_pairs, self.bleu_samples = max_length, max_pairs, bleu_samples
        self._stream: PairStream | None = None
        self._root: Path | None = None
        self._datasets: dict[str, ShardPairDataset] = {}

    @classmethod
    def longest_sequence(cls, args: dict) -> tuple[str, int]:
        return "max_length", args["max_length"]  # either side, with bos/eos

    @classmethod
    def trained_args(cls, args: dict[str, Any], checkpoint: dict[str, Any], path: str) -> dict[str, Any]:
        """The base's, and the checkpoint's vocabularies as they are, one for both sides or one each, whatever
        shared_vocab says."""
        changed = super().trained_args(args, checkpoint, path)
        if changed:
            target = checkpoint.get("target_tokenizer")
            changed["shared_vocab"] = target is None or target == checkpoint["tokenizer"]
        return changed

    # ------------------------------------------------------------------ pairs

    @property
    def pair_stream(self) -> PairStream:
        """The pairs of each split as a stream, read row by row (held-out splits carved from train when missing)."""
        if self._stream is None:
            self._stream = PairStream(
                self.dataset,
                self.dataset_config,
                self.source_lang,
                self.target_lang,
                self.source_column,
                self.target_column,
                embedded=corpora.embedded(self.dataset, self.cache_dir),
                held_out=self.held_out,
                encoding=self.encoding,
            )
        return self._stream

    def pairs(self) -> dict[str, tuple[list[str], list[str]]]:
        """Each split's (sources, targets) as prepared, read back from the shards the batches come from (the texts
        the held-out splits keep; the training pairs' ids decoded): for inspection and small corpora."""
        out = {}
        for split, shards in load_prepared(self.prepare(), PairShards)[1].items():
            sources, targets, texts = shards.read(range(len(shards)))
            if texts is None:
                texts = ([self.decode(s, target=False) for s in sources], [self.decode(t) for t in targets])
            out[split] = (list(texts[0]), list(texts[1]))
        return out

    # ------------------------------------------------------------------ tokenizers

    def _marian_folder(self) -> bool:
        return self.tokenizer_spec not in KINDS and os.path.isdir(self.tokenizer_spec)

    def _sample(self) -> tuple[list[str], list[str]]:
        """A bounded sample of the first training pairs, read from the stream, to train tokenizers on."""
        sources, targets = sample_pairs(self.pair_stream, self.tokenizer_sample_chars, self.max_pairs)
        if not sources:
            raise DataFileError(f"{self.dataset!r} has no sentence pairs in its training split: give it pairs")
        return sources, targets

    def tokenizer_texts(self) -> list[str]:
        sources, targets = self._sample()
        return sources + targets

    def build_tokenizers(self) -> tuple[tuple[Tokenizer, Tokenizer], tuple[str, str]]:
        if self._marian_folder():
            src, tgt = load_hf_marian_tokenizers(self.tokenizer_spec)
            if self.shared_vocab and src.get_vocab() != tgt.get_vocab():
                raise ConfigError(
                    f"{self.tokenizer_spec} has a vocabulary per language: set data.init_args.shared_vocab false",
                    keys=["data.init_args.shared_vocab"],
                )
            return (src, tgt), (fingerprint("tokenizer", src.to_str()), fingerprint("tokenizer", tgt.to_str()))
        args = (self.requested_vocab_size, self.cache_dir)
        if self.shared_vocab:
            tok, key = load_or_train_tokenizer(self.tokenizer_spec, self.tokenizer_texts, *args, tag="shared")
            return (tok, tok), (key, key)
        src, src_key = load_or_train_tokenizer(self.tokenizer_spec, lambda: self._sample()[0], *args, tag="source")
        tgt, tgt_key = load_or_train_tokenizer(self.tokenizer_spec, lambda: self._sample()[1], *args, tag="target")
        return (src, tgt), (src_key, tgt_key)

    @property
    def target_vocab_size(self) -> int | None:
        """None when both sides number their pieces by one id table (one tokenizer, or OPUS-MT's two SentencePiece
        models over one vocab.json): the model may then share one embedding matrix. Two tokenizers of one size but
        different pieces (shared_vocab false) give the target's size, which keeps the embeddings apart."""
        source, target = self.tokenizers
        if source is target or source.get_vocab() == target.get_vocab():
            return None
        return target.get_vocab_size()

    @property
    def bos_token_id(self) -> int:
        """Where targets start (tgt_in = [bos] + target): a Marian folder says so in its config (OPUS-MT: <pad>)."""
        if self._marian_folder():
            start = marian_decoder_start_token_id(self.tokenizer_spec)
            if start is not None:
                return start
        try:
            return self.special_id("bos")
        except ValueError as error:
            raise ConfigError(f"{error} (a Marian folder as the tokenizer names its start token)") from None

    # ------------------------------------------------------------------ Lightning hooks

    def prepare(self) -> Path:
        """Stream every split into token shards once (training the tokenizers first when needed); their folder."""
        if self._root is None:
            self._root = prepare_pairs(self.pair_stream, self.tokenizers, self._tokenizer_keys, self.cache_dir,
                                       self.max_pairs)  # fmt: skip
        return self._root

    def _keep(self, split: str, src_len: np.ndarray, tgt_len: np.ndarray) -> np.ndarray:
        """The pairs that fit max_length on both sides (with bos/eos); the others are counted in a warning."""
        keep = np.flatnonzero((src_len <= self.max_length) & (tgt_len <= self.max_length))
        dropped = len(src_len) - len(keep)
        if dropped:
            rank_zero_warn(
                f"{self.dataset} {split}: dropped {dropped} of {len(src_len)} pairs longer than "
                f"max_length={self.max_length} tokens on either side (with bos/eos)"
            )
        if not len(keep):
            raise DataFileError(
                f"No {split} pair of {self.dataset!r} fits max_length={self.max_length}: raise data.init_args.max_length"
            )
        return keep

    def setup(self, stage: str | None = None) -> None:
        """Every rank: open the token shards and drop over-long pairs (counted in a warning); only the index is read,
        16 bytes per pair."""
        if stage == "predict":  # the predict_file and the tokenizer alone: no split is read
            return
        splits = None
        for split in SPLITS:
            if split in self._datasets:
                continue
            if splits is None:
                info, splits = load_prepared(self.prepare(), PairShards)
                sizes = {s: len(shards) for s, shards in splits.items()}
                rank_zero_info(f"{self.dataset}: pairs per split {sizes}; held-out: {info['held_out']}")
                self._warn_unknown_tokens(splits["train"])
            shards = splits[split]
            keep = self._keep(split, shards.source_lengths + 1, shards.target_lengths + 1)
            ids = self.pad_token_id, self.bos_token_id, self.eos_token_id
            self._datasets[split] = ShardPairDataset(shards, keep, *ids)

    def _warn_unknown_tokens(self, train: PairShards) -> None:
        """Each side's first COVERAGE_TOKENS training tokens checked for <unk> (DataModule.warn_unknown_tokens): a
        Marian tokenizer, or one trained on other text, given pairs with characters it has no token for."""
        rows = int(np.searchsorted(np.cumsum(train.source_lengths), COVERAGE_TOKENS, side="right"))
        sources, targets, _ = train.read(range(min(len(train), max(1, rows)))) if len(train) else ([], [], None)
        texts = functools.cache(lambda: sample_pairs(self.pair_stream, COVERAGE_CHARS, self.max_pairs))
        for side, ids, lengths, tokenizer, index in (
            (" source", sources, train.source_lengths, self.tokenizers[0], 0),
            (" target", targets, train.target_lengths, self.tokenizers[1], 1),
        ):
            tokens = np.concatenate(ids) if ids else np.zeros(0, np.int64)
            self.warn_unknown_tokens(tokens, int(lengths.sum()), lambda i=index: texts()[i], tokenizer, side)

    def loader(self, split: str, shuffle: bool) -> ResumableLoader:
        if split not in self._datasets:
            self.setup()
        data = self._datasets[split]
        # The batches depend on the lengths and the seed only; their order in each epoch on (seed, epoch).
        batches = token_budget_plan(
            data.source_lengths(), data.target_lengths(), self.max_tokens, seed=self.seed, max_sentences=self.batch_size
        )
        epoch = self.trainer.current_epoch if shuffle and self.trainer is not None else 0
        return ResumableLoader(
            data, batches, _collate, shuffle=shuffle, seed=self.seed, num_workers=self.num_workers, start_epoch=epoch
        )


# ---------------------------------------------------------------------------------------------------- the task's own
# Sentence pairs as records (columns -> pair), their shard layout, their Dataset and collate: all of translation's
# data that is not shared.


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
        raise DataFileError(f"{where}: a side of a pair must be text, found {type(value).__name__} {str(value)[:40]!r}")
    return value.strip()


class PairStream(SplitStream):
    """Each split's sentence pairs as a stream, read row by row; held-out splits carved from train when missing.

    dataset: local .jsonl/.json/.csv/.tsv/.parquet files (a file, folder or glob), a hub name, or an embedded
    corpus's DatasetDict (given as `embedded`). A row's pair is its `translation` {language: text} mapping, or its
    two columns named by source_column/target_column (default: the language codes).
    """

    key = "pairs"
    local_hint = "of pairs (.jsonl/.json, .csv/.tsv, .parquet), a hub dataset name, or the embedded kjv-rv1909"
    column_hint = " (set source_column/target_column, or source_lang/target_lang)"

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
        encoding: str = ENCODING,
    ) -> None:
        self.langs = (source_lang, target_lang)
        self.explicit = bool(source_column or target_column)
        self.columns = (source_column or source_lang, target_column or target_lang)
        self._read_columns: dict[str, list[str] | None] = {}
        super().__init__(dataset, dataset_config, embedded, held_out, encoding)

    def _columns(self) -> list[str]:
        return list(self.columns)

    def _settings(self) -> tuple:
        return self.langs, self.columns, self.explicit

    def routed(self, source_name: str, skip: int = 0) -> Iterator[tuple[str | None, Pair]]:
        """(split, pair) for every row of one pass over a source split, from row `skip` on; split is None for a
        row with an empty side (dropped). The training source also feeds carved held-out splits, by pair hash."""
        for row, (source, target, nbytes) in enumerate(self._rows(self.sources[source_name])):
            if row >= skip:
                split = self.owner(source_name, source, target) if source and target else None
                yield split, Pair(source, target, row, nbytes)

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
            for row, nbytes, number in records(path, self._read_columns.get(path), self.encoding):
                yield *self._pair(row, f"{path}:{number}"), nbytes

    def _pair(self, row: dict, where: str) -> tuple[str, str]:
        """A row's (source, target): from its translation mapping by language, else from its two columns."""
        translation = not self.explicit and "translation" in row
        values, keys = (row["translation"], self.langs) if translation else (row, self.columns)
        if not isinstance(values, dict):
            raise DataFileError(f"{where}: the translation column holds {type(values).__name__}, not a mapping")
        found = {}
        for key in keys:
            try:
                found[key] = column_value(values, key)
            except KeyError:
                pass
        missing = [key for key in keys if key not in found]
        if missing and translation:
            raise DataFileError(
                f"{self.dataset!r}: the translation column has no language {missing}; it has {sorted(values)} ({where})"
            )
        if missing:
            raise DataFileError(
                f"dataset {self.dataset!r}: {where} has no column {', '.join(map(repr, missing))}; its columns are "
                f"{sorted(values)} (set data.init_args.source_column and target_column)"
            )
        return _as_text(found[keys[0]], where), _as_text(found[keys[1]], where)

    def _check_columns(self, path: str, split: str) -> None:
        """A file without the pair's columns fails at once, naming the columns it has."""
        columns = columns_of(path, self.encoding)
        if columns is None:
            return
        if not self.explicit and "translation" in columns:
            self._read_columns[path] = ["translation"]
            return
        super()._check_columns(path, split)
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


class PairKind(RecordKind):
    """Sentence pairs: a source and a target side, `pairs.npy` the starts of both; held-out splits keep their text."""

    folder, tag, sides, starts, counter = "pairs", "pair-shards", ("src", "tgt"), "pairs.npy", "rows"
    summed = ("pairs", "src_tokens", "tgt_tokens")
    noun = " pairs"

    def new_progress(self) -> dict:
        return {**super().new_progress(), "empty": 0}

    def index_extras(self, progress: dict, keep_text: bool) -> dict:
        return {"empty": progress.get("empty", 0), "text": keep_text}

    def keeps_text(self, split: str) -> bool:
        return split != "train"

    def budget(self, progress: dict, limit: int | None) -> dict[str, int | None]:
        done = sum(s["pairs"] for s in progress["shards"])
        return {"max_records": None if limit is None else max(0, limit - done)}

    def starts_array(self, starts: list[np.ndarray], tokens: list[int]) -> np.ndarray:
        return np.concatenate([np.stack(starts, axis=1), np.array([tokens], dtype=np.int64)])

    def shard_entry(self, name: str, tokens: list[int], records: int) -> dict:
        return {"name": name, "pairs": records, "src_tokens": tokens[0], "tgt_tokens": tokens[1]}

    def summary(self, indexes: dict[str, dict]) -> str:
        return f"pairs { {s: i['pairs'] for s, i in indexes.items()} }"

    def check(self, stream: PairStream, splits: dict[str, dict]) -> None:
        empty = sum(index.get("empty", 0) for index in splits.values())
        if empty:
            warnings.warn(f"{stream.dataset}: dropped {empty} pairs with an empty side", stacklevel=4)
        if not splits["train"]["pairs"]:
            raise DataFileError(f"{stream.dataset!r} has no sentence pairs in its training split: give it pairs")
        for name in ("validation", "test"):
            if splits[name]["pairs"]:
                continue
            if name in stream.missing:
                total = sum(index["pairs"] for index in splits.values())
                raise DataFileError(
                    f"{stream.dataset!r} has {total} pairs and no {name} split: the held-out splits take "
                    f"{stream.held_out:.0%} each, picked by a hash of the pair, and this one got none. Give at least about "
                    f"{int(20 / stream.held_out)} pairs, or files named train*/valid*/test* to choose the splits yourself"
                )
            raise DataFileError(
                f"{stream.dataset!r} has no {name} pairs; provide a {name} split (e.g. a {name}.tsv file)"
            )


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
            src = map_file(self.directory / f"{name}.src.bin", self.dtype)
            tgt = map_file(self.directory / f"{name}.tgt.bin", self.dtype)
            text = map_file(self.directory / f"{name}.text.bin", np.uint8) if texts is not None else None
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
