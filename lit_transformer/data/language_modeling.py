"""LanguageModelingDataModule: text from the hub, local files or the embedded Shakespeare, tokenized, packed into blocks."""

from __future__ import annotations

import lightning as L
import numpy as np
from lightning.pytorch.utilities import rank_zero_info
from tokenizers import Tokenizer

from . import corpora
from .cache import resolve_cache_dir
from .common import SPLITS, SingleTokenizer, SplitLoaders, cached_stream, hash_bucket, normalise_splits, require_columns
from .encoding import token_ids
from .loaders import BlockDataset, ResumableLoader, fixed_size_batches
from .sources import load_any
from .tokenizer import MASK, load_or_train_tokenizer, special_token_id

HELD_OUT = 0.05  # validation and test fractions carved from train when the source has no such split


class LanguageModelingDataModule(SingleTokenizer, SplitLoaders, L.LightningDataModule):
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
        """
        super().__init__()
        if block_size < 1 or batch_size < 1:
            raise ValueError(f"block_size={block_size} and batch_size={batch_size} must be positive")
        if max_chars is not None and max_chars < 1:
            raise ValueError(f"max_chars={max_chars} must be positive or None")
        self.dataset = dataset
        self.dataset_config = dataset_config
        self.text_column = text_column
        self.tokenizer_spec = tokenizer
        self.requested_vocab_size = vocab_size
        self.block_size = block_size
        self.batch_size = batch_size
        self.max_chars = max_chars
        self.num_workers = num_workers
        self.seed = seed
        self.cache_dir = resolve_cache_dir(cache_dir)
        self.predict_file = predict_file
        self.predict_batch_size = predict_batch_size
        self.mask_token = mask_token
        self._texts: dict[str, list[str]] | None = None
        self._tokenizer: Tokenizer | None = None
        self._tokenizer_key = ""
        self._blocks: dict[str, BlockDataset] = {}
        self._characters_per_token: dict[str, float] = {}

    # ------------------------------------------------------------------ text

    def texts(self) -> dict[str, list[str]]:
        """Each split's documents (train cut to max_chars), with validation/test carved out when missing."""
        if self._texts is None:
            self._texts = self._load_texts()
        return self._texts

    def _load_texts(self) -> dict[str, list[str]]:
        if self.dataset in corpora.EMBEDDED_LM:
            data = corpora.shakespeare()
        else:
            data = load_any(self.dataset, self.dataset_config, self.cache_dir, self.text_column)
        data = normalise_splits(data)
        require_columns(data, [self.text_column], f"dataset {self.dataset!r}")
        texts = {name: [t for t in split[self.text_column] if t and t.strip()] for name, split in data.items()}
        if not texts["train"]:
            raise ValueError(
                f"The training split of {self.dataset!r} is empty (no non-blank {self.text_column!r} rows)"
            )
        texts = _carve_held_out(texts)
        texts["train"] = _prefix(texts["train"], self.max_chars)
        sizes = {name: sum(map(len, docs)) for name, docs in texts.items()}
        rank_zero_info(f"{self.dataset}: characters per split {sizes}")
        return texts

    # ------------------------------------------------------------------ tokenizer

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer (trained on the training split and cached on first access when tokenizer is a kind)."""
        if self._tokenizer is None:
            self._tokenizer, self._tokenizer_key = load_or_train_tokenizer(
                self.tokenizer_spec, lambda: self.texts()["train"], self.requested_vocab_size, self.cache_dir
            )
            if self.mask_token and special_token_id(self._tokenizer, "mask") is None:
                self._tokenizer.add_special_tokens([MASK])
                self._tokenizer_key += "+mask"  # a literal "<mask>" in the text now encodes otherwise
        return self._tokenizer

    def encode(self, text: str) -> list[int]:
        return token_ids(self.tokenizer, [text])[0]

    def decode(self, ids) -> str:
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def characters_per_token(self, split: str = "validation") -> float:
        """Characters of the split's text per token of its stream (EOS included): converts a per-token NLL into
        bits per character, a scale that does not depend on the tokenizer."""
        if split not in self._characters_per_token:  # asked at every validation: hashing the split each time is waste
            self._characters_per_token[split] = sum(map(len, self.texts()[split])) / len(self._stream(split))
        return self._characters_per_token[split]

    # ------------------------------------------------------------------ Lightning hooks

    def _stream(self, split: str) -> np.ndarray:
        tokenizer = self.tokenizer
        return cached_stream(self.cache_dir, tokenizer, self._tokenizer_key, self.texts()[split], self.eos_token_id)

    def prepare_data(self) -> None:
        """Once per node: train the tokenizer and tokenize every split into the cache."""
        for split in SPLITS:
            self._stream(split)

    def setup(self, stage: str | None = None) -> None:
        """Every rank: load the cached token streams (memory-mapped) and view them as blocks."""
        for split in SPLITS:
            if split not in self._blocks:
                stream = self._stream(split)
                if len(stream) < self.block_size + 1:
                    raise ValueError(
                        f"The {split} split of {self.dataset!r} has {len(stream)} tokens, fewer than one block of "
                        f"block_size + 1 = {self.block_size + 1}; use a smaller block_size or more text"
                    )
                self._blocks[split] = BlockDataset(stream, self.block_size)
        rank_zero_info(
            f"{self.dataset}: blocks of {self.block_size} tokens per split { {s: len(b) for s, b in self._blocks.items()} }"
        )

    def _loader(self, split: str, shuffle: bool) -> ResumableLoader:
        if split not in self._blocks:
            self.setup()
        blocks = self._blocks[split]
        batches = fixed_size_batches(len(blocks), self.batch_size, self.seed, shuffle=shuffle, drop_last=shuffle)
        if not batches:
            raise ValueError(f"The {split} split has {len(blocks)} blocks, fewer than batch_size={self.batch_size}")
        epoch = self.trainer.current_epoch if shuffle and self.trainer is not None else 0
        return ResumableLoader(
            blocks, batches, shuffle=shuffle, seed=self.seed, num_workers=self.num_workers, start_epoch=epoch
        )

    def state_dict(self) -> dict:
        """Saved in every checkpoint: the tokenizer, so a checkpoint can always be decoded."""
        return {"tokenizer": self.tokenizer.to_str()}

    def load_state_dict(self, state_dict: dict) -> None:
        saved = state_dict.get("tokenizer")
        if saved is not None and self._tokenizer is None:
            self._tokenizer = Tokenizer.from_str(saved)


def _prefix(docs: list[str], max_chars: int | None) -> list[str]:
    if max_chars is None:
        return docs
    kept, total = [], 0
    for doc in docs:
        if total >= max_chars:
            break
        kept.append(doc[: max_chars - total])
        total += len(kept[-1])
    return kept


def _carve_held_out(texts: dict[str, list[str]]) -> dict[str, list[str]]:
    """Deterministic validation/test splits from train when the source lacks them.

    Few long documents (files, books) are each cut at line boundaries 90/5/5; many rows go by a hash of their text,
    so duplicate rows land in the same split.
    """
    missing = [s for s in ("validation", "test") if s not in texts]
    if not missing:
        return texts
    train = texts["train"]
    out = {k: v for k, v in texts.items()}
    if len(train) < 1000:
        cut = {"train": [], "validation": [], "test": []}
        for doc in train:
            a = _line_cut(doc, 1 - HELD_OUT * len(missing))
            b = _line_cut(doc, 1 - HELD_OUT) if len(missing) == 2 else len(doc)
            cut["train"].append(doc[:a])
            cut[missing[0]].append(doc[a:b])
            if len(missing) == 2:
                cut[missing[1]].append(doc[b:])
        for name, docs in cut.items():
            if name == "train" or name in missing:
                out[name] = [d for d in docs if d.strip()]
    else:
        out["train"] = []
        out.update({name: [] for name in missing})
        for doc in train:
            bucket = hash_bucket(doc)
            index = int(bucket // (HELD_OUT * 100))
            out[missing[index] if index < len(missing) else "train"].append(doc)
    for name in missing:
        if not out[name]:
            raise ValueError(f"Could not carve a {name} split from the training data: too little text")
    return out


def _line_cut(text: str, fraction: float) -> int:
    at = text.find("\n", int(len(text) * fraction))
    return len(text) if at < 0 else at + 1
