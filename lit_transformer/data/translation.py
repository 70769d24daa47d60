"""TranslationDataModule: sentence pairs from the hub, local files or the embedded KJV-RV1909, batched by token budget.

The pairs (local files, a hub stream or the embedded corpus) are streamed once into token shards (`shards.py`:
`python -m lit_transformer prepare`, or the first `fit`) and read through memory maps, so a corpus of any size trains
in flat memory. (The former in-memory path gave the same batches bit for bit, with memory growing 20 bytes per byte of
corpus and no gain in time: docs/performance.md, "Data preparation at scale"; it is gone.)

Batches: {"src": (B, S), "tgt_in": (B, T), "labels": (B, T)}. src is the source followed by eos and padded with
pad_token_id; tgt_in is bos followed by the target; labels are the target followed by eos, -100 at padding.
Validation, test and predict batches also carry "src_text" and "ref_text" (lists of strings) for BLEU.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Literal

import numpy as np
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from tokenizers import Tokenizer

from . import corpora
from .base import DataModule, warn_deprecated_key
from .cache import fingerprint
from .loaders import PairShards, ResumableLoader, ShardPairDataset, load_prepared, token_budget_plan
from .shards import prepare_pairs
from .sources import HELD_OUT, SPLITS, PairStream, sample_pairs
from .text import KINDS, load_hf_marian_tokenizers, load_or_train_tokenizer, marian_decoder_start_token_id


def _collate(batch: dict) -> dict:
    return batch


class TranslationDataModule(DataModule):
    """Sentence pairs for an encoder-decoder, batched by a token budget from length-sorted buckets.

    The tokenizer(s) are ready right after construction (trained and cached on first access), so the CLI can link
    vocabulary sizes and special ids into the model config.
    """

    encoder_decoder = True  # predict inputs are sources: their tokens, then EOS
    required_special_tokens = ("pad", "bos", "eos")

    def __init__(
        self,
        dataset: str = "kjv-rv1909",
        dataset_config: str | None = None,
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
        held_out: float = HELD_OUT,
        num_workers: int = 0,
        seed: int = 42,
        cache_dir: str | None = None,
        predict_file: str | None = None,
        predict_batch_size: int = 16,
        tokenizer_sample_chars: int = 20_000_000,
        storage: Literal["shards", "memory"] | None = None,
        encoding: str = "utf-8",
    ) -> None:
        """
        Args:
            dataset: "kjv-rv1909" (embedded English-Spanish Bible), a hub translation dataset (e.g. wmt14, with a
                `translation` dict column), or local .tsv/.csv/.jsonl/.parquet pair files (folder, glob or file).
            dataset_config: The hub dataset's configuration name (e.g. de-en).
            source_lang: Source language code: the key in a `translation` column, or the source column's name.
            target_lang: Target language code, likewise.
            source_column: The source text column when it is not named after source_lang.
            target_column: The target text column when it is not named after target_lang.
            tokenizer: A kind to train (bpe, byte_bpe, char), a tokenizer.json path, a hub tokenizer name, or a
                Marian folder (to fine-tune it: its tokenizers, OPUS-MT's SentencePiece ones converted, and its
                decoder's start token, which for OPUS-MT is <pad>).
            vocab_size: Vocabulary size of each trained tokenizer.
            shared_vocab: One vocabulary for both languages (allows the paper's three-way embedding tying); False
                trains a separate target tokenizer.
            max_tokens: Token budget per batch: batch size times the longest sequence (source or target) in it.
            max_length: Pairs with more tokens than this on either side (with bos/eos) are dropped, and counted.
            max_pairs: Use only the first max_pairs training pairs (quick CPU runs); None uses all.
            bleu_samples: How many validation pairs the LightningModule decodes with beam search for BLEU.
            num_workers: DataLoader worker processes (0 collates in the main process).
            seed: Seed of the batch order (saved with checkpoints, so resumed runs see the same order).
            cache_dir: Where tokenizers, extracted corpora and token arrays are cached; default
                $LIT_TRANSFORMER_CACHE or ~/.cache/lit_transformer.
            predict_file: Inputs of `predict`: a text file with one source sentence per line, or a JSONL file with a
                "text" field per line; the outputs go to a JSONL file (see --predictions.output).
            predict_batch_size: Inputs generated for at once by `predict`.
            batch_size: At most this many pairs a batch besides the token budget (None: the budget alone).
            held_out: The fraction of the pairs each missing validation/test split takes (by a hash of the pair).
            tokenizer_sample_chars: A tokenizer kind is trained on at most this many characters (both sides) of the
                first training pairs (the whole split when it is smaller).
            storage: Deprecated (dropped in 0.2.0): pairs always stream into token shards (any value is accepted
                with a warning).
            encoding: The text encoding of the data files (and predict_file): utf-8 (a byte order mark is dropped), or
                another that the files use, e.g. latin-1 or cp1252. Bytes that are not this encoding stop the run,
                naming the file and line; nothing is replaced.
        """
        super().__init__(
            dataset, dataset_config, "text", tokenizer, vocab_size, tokenizer_sample_chars, batch_size, max_tokens,
            held_out, num_workers, seed, cache_dir, predict_file, predict_batch_size, encoding,
        )  # fmt: skip
        if max_length < 2 or max_tokens < max_length:
            raise ValueError(f"Need max_length >= 2 and max_tokens >= max_length (got {max_length}, {max_tokens})")
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
        self._pairs: dict[str, tuple[list[str], list[str]]] | None = None
        self._datasets: dict[str, ShardPairDataset] = {}

    @classmethod
    def longest_sequence(cls, args: dict) -> tuple[str, int]:
        return "max_length", args["max_length"]  # either side, with bos/eos

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
        """Each split's (sources, targets), blank pairs dropped (and counted), read whole into memory: for
        inspection and small corpora; training never calls it."""
        if self._pairs is None:
            out = {}
            for split in SPLITS:
                items = self.pair_stream.pairs(split)
                if split == "train" and self.max_pairs is not None:
                    items = itertools.islice(items, self.max_pairs)
                pairs = list(items)
                out[split] = ([s for s, _ in pairs], [t for _, t in pairs])
            if not out["train"][0]:
                raise ValueError(f"{self.dataset!r} has no sentence pairs in its training split")
            for name in ("validation", "test"):
                if not out[name][0]:
                    raise ValueError(f"{self.dataset!r} has no {name} pairs (held-out: {self.pair_stream.mode})")
            self._pairs = out
        return self._pairs

    # ------------------------------------------------------------------ tokenizers

    def _marian_folder(self) -> bool:
        return self.tokenizer_spec not in KINDS and os.path.isdir(self.tokenizer_spec)

    def _sample(self) -> tuple[list[str], list[str]]:
        """A bounded sample of the first training pairs, read from the stream, to train tokenizers on."""
        sources, targets = sample_pairs(self.pair_stream, self.tokenizer_sample_chars, self.max_pairs)
        if not sources:
            raise ValueError(f"{self.dataset!r} has no sentence pairs in its training split")
        return sources, targets

    def tokenizer_texts(self) -> list[str]:
        sources, targets = self._sample()
        return sources + targets

    def build_tokenizers(self) -> tuple[tuple[Tokenizer, Tokenizer], tuple[str, str]]:
        if self._marian_folder():
            src, tgt = load_hf_marian_tokenizers(self.tokenizer_spec)
            if self.shared_vocab and src.get_vocab() != tgt.get_vocab():
                raise ValueError(f"{self.tokenizer_spec} has a vocabulary per language: set shared_vocab false")
            return (src, tgt), (fingerprint("tokenizer", src.to_str()), fingerprint("tokenizer", tgt.to_str()))
        args = (self.requested_vocab_size, self.cache_dir)
        if self.shared_vocab:
            tok, key = load_or_train_tokenizer(self.tokenizer_spec, self.tokenizer_texts, *args, tag="shared")
            return (tok, tok), (key, key)
        src, src_key = load_or_train_tokenizer(self.tokenizer_spec, lambda: self._sample()[0], *args, tag="source")
        tgt, tgt_key = load_or_train_tokenizer(self.tokenizer_spec, lambda: self._sample()[1], *args, tag="target")
        return (src, tgt), (src_key, tgt_key)

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
            raise ValueError(f"{error} (a Marian folder as the tokenizer names its start token)") from None

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
            raise ValueError(f"No {split} pair of {self.dataset!r} fits max_length={self.max_length}: raise max_length")
        return keep

    def setup(self, stage: str | None = None) -> None:
        """Every rank: open the token shards and drop over-long pairs (counted in a warning); only the index is read,
        16 bytes per pair."""
        splits = None
        for split in SPLITS:
            if split in self._datasets:
                continue
            if splits is None:
                info, splits = load_prepared(self.prepare(), PairShards)
                sizes = {s: len(shards) for s, shards in splits.items()}
                rank_zero_info(f"{self.dataset}: pairs per split {sizes}; held-out: {info['held_out']}")
            shards = splits[split]
            keep = self._keep(split, shards.source_lengths + 1, shards.target_lengths + 1)
            ids = self.pad_token_id, self.bos_token_id, self.eos_token_id
            self._datasets[split] = ShardPairDataset(shards, keep, *ids)

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
