"""LanguageModelingDataModule: text from the hub, local files or the embedded Shakespeare, streamed into token shards
once (`python -m lit_transformer prepare`, or the first `fit`), then read as packed blocks through memory maps."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from lightning.pytorch.utilities import rank_zero_info
from tokenizers import Tokenizer

from . import corpora
from .base import DataModule
from .loaders import BlockStreamLoader, ResumableLoader, ShardBlocks, TokenShards, fixed_size_batches, load_prepared
from .shards import prepare_corpus
from .sources import SPLITS, CorpusStream, sample_texts
from .text import MASK, special_token_id


class LanguageModelingDataModule(DataModule):
    """Next-token prediction batches {"input_ids", "labels"} of shape (batch_size, block_size), packed without padding.

    The tokenizer is ready right after construction (trained and cached on first access), so the CLI can link its
    vocabulary size and special ids into the model config.
    """

    def __init__(
        self,
        dataset: str = "shakespeare",
        dataset_config: str | None = None,
        text_column: str = "text",
        tokenizer: str = "byte_bpe",
        vocab_size: int = 8192,
        block_size: int = 256,
        batch_size: int = 32,
        max_chars: int | None = None,
        num_workers: int = 0,
        seed: int = 42,
        cache_dir: str | None = None,
        predict_file: str | None = None,
        predict_batch_size: int = 16,
        mask_token: bool = False,
        sampling: Literal["random", "sequential"] = "random",
        tokenizer_sample_chars: int = 20_000_000,
        encoding: str = "utf-8",
    ) -> None:
        """
        Args:
            dataset: "shakespeare" (embedded), a Hugging Face hub name, or a local .txt/.jsonl/.json/.csv/.tsv/.parquet
                file, folder or glob (a folder's train*/valid*/test* files become the splits).
            dataset_config: The hub dataset's configuration name (e.g. wikitext-2-raw-v1).
            text_column: The column that holds the text.
            tokenizer: A kind to train on the training split (byte_bpe, bpe, char), a tokenizer.json path or a hub
                tokenizer name.
            vocab_size: Vocabulary size of a trained tokenizer (char: at most this many characters).
            block_size: Tokens per training sequence (the model's context length).
            batch_size: Sequences per batch.
            max_chars: Use only the first max_chars characters of the training split (quick CPU runs; ~1M for
                Shakespeare trains in minutes). None uses it all. Validation and test are never cut.
            num_workers: DataLoader worker processes (0 loads in the main process; batches are cheap slices).
            seed: Seed of the shuffle order (saved with checkpoints, so resumed runs see the same order).
            cache_dir: Where tokenizers and token arrays are cached; default $LIT_TRANSFORMER_CACHE or
                ~/.cache/lit_transformer.
            predict_file: Inputs of `predict`: a text file with one prompt per line, or a JSONL file with a
                "text" field per line; the outputs go to a JSONL file (see --predictions.output).
            predict_batch_size: Inputs generated for at once by `predict`.
            mask_token: Add a <mask> token after the vocabulary, for masked-LM pretraining of an encoder_only model on
                this text (head: masked_lm; the packed blocks serve as inputs, their next-token labels are ignored).
            sampling: Training order of the blocks: random (a seeded permutation per epoch) or sequential. Either
                way the order is a function of (seed, epoch, global sample index), so a run resumes exactly on any
                number of processes.
            tokenizer_sample_chars: A tokenizer kind is trained on at most this many characters from the start of
                the training split (a bounded sample: the whole split when it is smaller).
            encoding: The text encoding of the data files (and predict_file): utf-8 (a byte order mark is dropped), or
                another that the files use, e.g. latin-1 or cp1252. Bytes that are not this encoding stop the run,
                naming the file and line; nothing is replaced.
        """
        super().__init__(
            dataset, dataset_config, text_column, tokenizer, vocab_size, tokenizer_sample_chars, batch_size,
            num_workers=num_workers, seed=seed, cache_dir=cache_dir, predict_file=predict_file,
            predict_batch_size=predict_batch_size, encoding=encoding,
        )  # fmt: skip
        if block_size < 1:
            raise ValueError(f"block_size={block_size} must be positive")
        if sampling not in ("random", "sequential"):
            raise ValueError(f"sampling={sampling!r}: choose random or sequential")
        if max_chars is not None and max_chars < 1:
            raise ValueError(f"max_chars={max_chars} must be positive or None")
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

    def _empty(self) -> ValueError:
        return ValueError(f"The training split of {self.dataset!r} is empty (no non-blank {self.text_column!r} rows)")

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
        if self.mask_token and special_token_id(tokenizer, "mask") is None:
            tokenizer.add_special_tokens([MASK])
            key += "+mask"  # a literal "<mask>" in the text now encodes otherwise
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
            info, self._splits = load_prepared(self._root)
            if len(self._splits["train"]) == 0:
                raise self._empty()
            sizes = {s: (shards.characters, len(shards)) for s, shards in self._splits.items()}
            rank_zero_info(f"{self.dataset}: (characters, tokens) per split {sizes}; held-out: {info['held_out']}")
        return self._splits

    def prepare(self) -> Path:
        """Stream the corpus into token shards (train the tokenizer first when needed); the prepared folder."""
        self._prepared()
        return self._root

    def setup(self, stage: str | None = None) -> None:
        """Every rank: open the shards (memory-mapped per batch) and view them as blocks."""
        splits = self._prepared()
        for split in SPLITS:
            if split not in self._blocks:
                blocks = splits[split].blocks(self.block_size)
                if len(blocks) == 0:
                    raise ValueError(self._too_small(split, len(splits[split])))
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
            + "Give more text, a smaller block_size, or files named train*/valid*/test* to choose the splits yourself"
        )

    def loader(self, split: str, shuffle: bool) -> BlockStreamLoader | ResumableLoader:
        if split not in self._blocks:
            self.setup()
        blocks = self._blocks[split]
        if shuffle:  # training: an endless stream of blocks in a seeded order, elastic across process counts
            if len(blocks) < self.batch_size:
                raise ValueError(f"The {split} split has {len(blocks)} blocks, fewer than batch_size={self.batch_size}")
            return BlockStreamLoader(
                blocks, self.batch_size, seed=self.seed, shuffle=self.sampling == "random", num_workers=self.num_workers
            )
        batches = fixed_size_batches(len(blocks), self.batch_size, self.seed, shuffle=False, drop_last=False)
        return ResumableLoader(blocks, batches, shuffle=False, seed=self.seed, num_workers=self.num_workers)
