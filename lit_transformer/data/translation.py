"""TranslationDataModule: sentence pairs from the hub, local files or the embedded KJV-RV1909, batched by token budget.

The pairs (local files, a hub stream or the embedded corpus) are streamed once into token shards (`pairs.py`:
`python -m lit_transformer prepare`, or the first `fit`) and read through memory maps, so a corpus of any size trains
in flat memory. `storage="memory"` keeps the former path (every pair and its ids in memory): the same batches, bit for
bit (measured in docs/performance.md, "Data preparation at scale").

Batches: {"src": (B, S), "tgt_in": (B, T), "labels": (B, T)}. src is the source followed by eos and padded with
pad_token_id; tgt_in is bos followed by the target; labels are the target followed by eos, -100 at padding.
Validation, test and predict batches also carry "src_text" and "ref_text" (lists of strings) for BLEU.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Literal

import lightning as L
import numpy as np
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from tokenizers import Tokenizer
from torch.utils.data import Dataset

from . import corpora
from .cache import cached, fingerprint, hash_texts, resolve_cache_dir
from .common import SPLITS, SplitLoaders, encode_ragged, normalise_splits, require_columns
from .encoding import IGNORE_INDEX
from .loaders import ResumableLoader, token_budget_plan
from .pairs import (
    PairStream,
    ShardPairDataset,
    collate_pairs,
    load_prepared_pairs,
    prepare_pairs,
    sample_pairs,
)
from .sources import load_any
from .tokenizer import (
    KINDS,
    load_hf_marian_tokenizers,
    load_or_train_tokenizer,
    marian_decoder_start_token_id,
    special_token_id,
)

__all__ = ["IGNORE_INDEX", "PairDataset", "TranslationDataModule"]


class PairDataset(Dataset):
    """Tokenized pairs (flat ids + offsets per side) that collate themselves into padded batches."""

    def __init__(
        self,
        src: tuple[np.ndarray, np.ndarray],
        tgt: tuple[np.ndarray, np.ndarray],
        keep: np.ndarray,
        texts: tuple[list[str], list[str]] | None,
        pad_id: int,
        bos_id: int,
        eos_id: int,
    ) -> None:
        self.src_ids, self.src_offsets = src
        self.tgt_ids, self.tgt_offsets = tgt
        self.keep = keep  # indices into the split's pairs that passed the length filter
        self.texts = texts
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id

    def __len__(self) -> int:
        return len(self.keep)

    def source_lengths(self) -> np.ndarray:
        return np.diff(self.src_offsets)[self.keep] + 1  # + eos

    def target_lengths(self) -> np.ndarray:
        return np.diff(self.tgt_offsets)[self.keep] + 1  # + bos (inputs) or + eos (labels)

    def _side(self, ids: np.ndarray, offsets: np.ndarray, index: int) -> np.ndarray:
        return ids[offsets[index] : offsets[index + 1]]

    def __getitem__(self, index: int) -> dict:
        return self.__getitems__([index])

    def __getitems__(self, indices) -> dict:
        rows = [int(self.keep[i]) for i in indices]
        srcs = [self._side(self.src_ids, self.src_offsets, r) for r in rows]
        tgts = [self._side(self.tgt_ids, self.tgt_offsets, r) for r in rows]
        texts = None
        if self.texts is not None:
            texts = [self.texts[0][r] for r in rows], [self.texts[1][r] for r in rows]
        return collate_pairs(srcs, tgts, self.pad_id, self.bos_id, self.eos_id, texts)


def _collate(batch: dict) -> dict:
    return batch


class TranslationDataModule(SplitLoaders, L.LightningDataModule):
    """Sentence pairs for an encoder-decoder, batched by a token budget from length-sorted buckets.

    The tokenizer(s) are ready right after construction (trained and cached on first access), so the CLI can link
    vocabulary sizes and special ids into the model config.
    """

    encoder_decoder = True  # predict inputs are sources: their tokens, then EOS

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
        max_length: int = 128,
        max_pairs: int | None = None,
        bleu_samples: int = 200,
        num_workers: int = 0,
        seed: int = 42,
        cache_dir: str | None = None,
        predict_file: str | None = None,
        predict_batch_size: int = 16,
        storage: Literal["shards", "memory"] = "shards",
        tokenizer_sample_chars: int = 20_000_000,
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
            storage: How the pairs are held. shards: streamed row by row into token shards on disk once (`prepare`),
                read through memory maps, memory flat in corpus size; held-out splits carved by a hash of the pair
                when the source has none. memory: every pair and its ids in memory (a source must then have its own
                validation and test splits). Both give the same batches for the same pairs.
            tokenizer_sample_chars: With shards, a tokenizer kind is trained on at most this many characters (both
                sides) of the first training pairs (the whole split when it is smaller).
        """
        super().__init__()
        if storage not in ("shards", "memory"):
            raise ValueError(f"storage={storage!r}: choose shards or memory")
        if tokenizer_sample_chars < 1:
            raise ValueError(f"tokenizer_sample_chars={tokenizer_sample_chars} must be positive")
        if max_length < 2 or max_tokens < max_length:
            raise ValueError(f"Need max_length >= 2 and max_tokens >= max_length (got {max_length}, {max_tokens})")
        self.dataset = dataset
        self.dataset_config = dataset_config
        self.source_lang, self.target_lang = source_lang, target_lang
        self.source_column, self.target_column = source_column, target_column
        self.tokenizer_spec = tokenizer
        self.requested_vocab_size = vocab_size
        self.shared_vocab = shared_vocab
        self.max_tokens = max_tokens
        self.max_length = max_length
        self.max_pairs = max_pairs
        self.bleu_samples = bleu_samples
        self.num_workers = num_workers
        self.seed = seed
        self.cache_dir = resolve_cache_dir(cache_dir)
        self.predict_file = predict_file
        self.predict_batch_size = predict_batch_size
        self.storage = storage
        self.tokenizer_sample_chars = tokenizer_sample_chars
        self._stream: PairStream | None = None
        self._root: Path | None = None
        self._pairs: dict[str, tuple[list[str], list[str]]] | None = None
        self._tokenizers: tuple[Tokenizer, Tokenizer] | None = None
        self._tokenizer_keys = ("", "")
        self._datasets: dict[str, PairDataset] = {}

    # ------------------------------------------------------------------ pairs

    @property
    def uses_shards(self) -> bool:
        """Whether the pairs go through token shards on disk (see `storage`)."""
        return self.storage == "shards"

    @property
    def pair_stream(self) -> PairStream:
        """The pairs of each split as a stream, read row by row (held-out splits carved from train when missing)."""
        if self._stream is None:
            embedded = None
            if self.dataset in corpora.EMBEDDED_TRANSLATION:
                embedded = corpora.kjv_rv1909(self.cache_dir)
            self._stream = PairStream(
                self.dataset,
                self.dataset_config,
                self.source_lang,
                self.target_lang,
                self.source_column,
                self.target_column,
                embedded=embedded,
            )
        return self._stream

    def pairs(self) -> dict[str, tuple[list[str], list[str]]]:
        """Each split's (sources, targets), blank pairs dropped (and counted). With shards this reads every pair into
        memory: for inspection and small corpora; training never calls it then."""
        if self._pairs is None:
            self._pairs = self._streamed_pairs() if self.uses_shards else self._load_pairs()
        return self._pairs

    def _streamed_pairs(self) -> dict[str, tuple[list[str], list[str]]]:
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
        return out

    def _load_pairs(self) -> dict[str, tuple[list[str], list[str]]]:
        if self.dataset in corpora.EMBEDDED_TRANSLATION:
            data = corpora.kjv_rv1909(self.cache_dir)
        else:
            data = load_any(self.dataset, self.dataset_config, self.cache_dir)
        data = normalise_splits(data)
        pairs = {}
        for name, split in data.items():
            if "translation" in split.column_names and not (self.source_column or self.target_column):
                translations = split["translation"]
                missing = [
                    lang
                    for lang in (self.source_lang, self.target_lang)
                    if translations and lang not in translations[0]
                ]
                if missing:
                    raise ValueError(
                        f"{self.dataset!r}: the translation column has no language {missing}; it has {sorted(translations[0])}"
                    )
                sources = [t[self.source_lang] for t in translations]
                targets = [t[self.target_lang] for t in translations]
            else:
                columns = [self.source_column or self.source_lang, self.target_column or self.target_lang]
                require_columns(data, columns, f"dataset {self.dataset!r} (set source_column/target_column)")
                sources, targets = split[columns[0]], split[columns[1]]
            kept = [
                (s.strip(), t.strip())
                for s, t in zip(sources, targets, strict=True)
                if s and t and s.strip() and t.strip()
            ]
            if len(kept) < len(sources):
                rank_zero_warn(f"{self.dataset} {name}: dropped {len(sources) - len(kept)} pairs with an empty side")
            pairs[name] = ([s for s, _ in kept], [t for _, t in kept])
        if not pairs["train"][0]:
            raise ValueError(f"{self.dataset!r} has no sentence pairs in its training split")
        for name in ("validation", "test"):
            if name not in pairs or not pairs[name][0]:
                raise ValueError(
                    f"{self.dataset!r} has no {name} pairs; provide a {name} split (e.g. a {name}.tsv file)"
                )
        if self.max_pairs is not None:
            pairs["train"] = (pairs["train"][0][: self.max_pairs], pairs["train"][1][: self.max_pairs])
        rank_zero_info(f"{self.dataset}: pairs per split { {k: len(v[0]) for k, v in pairs.items()} }")
        return pairs

    # ------------------------------------------------------------------ tokenizers

    def _marian_folder(self) -> bool:
        return self.tokenizer_spec not in KINDS and os.path.isdir(self.tokenizer_spec)

    def _load_tokenizers(self) -> tuple[Tokenizer, Tokenizer]:
        if self._tokenizers is None and self._marian_folder():
            src, tgt = load_hf_marian_tokenizers(self.tokenizer_spec)
            if self.shared_vocab and src.get_vocab() != tgt.get_vocab():
                raise ValueError(f"{self.tokenizer_spec} has a vocabulary per language: set shared_vocab false")
            self._tokenizers = (src, tgt)
            self._tokenizer_keys = (fingerprint("tokenizer", src.to_str()), fingerprint("tokenizer", tgt.to_str()))
        if self._tokenizers is None:

            def train_texts(side: int | None):
                if self.uses_shards:  # a bounded sample of the first training pairs, read from the stream
                    sources, targets = sample_pairs(self.pair_stream, self.tokenizer_sample_chars, self.max_pairs)
                    if not sources:
                        raise ValueError(f"{self.dataset!r} has no sentence pairs in its training split")
                else:
                    sources, targets = self.pairs()["train"]
                return sources + targets if side is None else (sources, targets)[side]

            args = (self.requested_vocab_size, self.cache_dir)
            if self.shared_vocab:
                tok, key = load_or_train_tokenizer(self.tokenizer_spec, lambda: train_texts(None), *args, tag="shared")
                self._tokenizers, self._tokenizer_keys = (tok, tok), (key, key)
            else:
                src, src_key = load_or_train_tokenizer(self.tokenizer_spec, lambda: train_texts(0), *args, tag="source")
                tgt, tgt_key = load_or_train_tokenizer(self.tokenizer_spec, lambda: train_texts(1), *args, tag="target")
                self._tokenizers, self._tokenizer_keys = (src, tgt), (src_key, tgt_key)
        return self._tokenizers

    @property
    def tokenizer(self) -> Tokenizer:
        """The source tokenizer (also the target's when the vocabulary is shared)."""
        return self._load_tokenizers()[0]

    @property
    def target_tokenizer(self) -> Tokenizer:
        return self._load_tokenizers()[1]

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    @property
    def target_vocab_size(self) -> int | None:
        """None when the vocabulary is shared (the model config's convention)."""
        return None if self.shared_vocab else self.target_tokenizer.get_vocab_size()

    def _special(self, role: str) -> int:
        ids = {special_token_id(self.tokenizer, role), special_token_id(self.target_tokenizer, role)}
        if None in ids or len(ids) != 1:
            hint = " (a Marian folder as the tokenizer names its start token)" if role == "bos" else ""
            raise ValueError(f"The tokenizers need one common {role} token for translation (found ids {ids}){hint}")
        return ids.pop()

    @property
    def pad_token_id(self) -> int:
        return self._special("pad")

    @property
    def bos_token_id(self) -> int:
        """Where targets start (tgt_in = [bos] + target): a Marian folder says so in its config (OPUS-MT: <pad>)."""
        if self._marian_folder():
            start = marian_decoder_start_token_id(self.tokenizer_spec)
            if start is not None:
                return start
        return self._special("bos")

    @property
    def eos_token_id(self) -> int:
        return self._special("eos")

    def decode(self, ids, target: bool = True) -> str:
        """Token ids (target side by default) to text, special tokens dropped."""
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        return (self.target_tokenizer if target else self.tokenizer).decode(ids, skip_special_tokens=True)

    def save_tokenizer(self, directory: str | os.PathLike) -> Path:
        """Write tokenizer.json (and target_tokenizer.json when separate) into `directory`."""
        path = Path(directory) / "tokenizer.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save(str(path))
        if self.target_tokenizer is not self.tokenizer:
            self.target_tokenizer.save(str(path.with_name("target_tokenizer.json")))
        return path

    # ------------------------------------------------------------------ Lightning hooks

    def _encoded(self, split: str) -> dict[str, np.ndarray]:
        sources, targets = self.pairs()[split]
        src_tok, tgt_tok = self._load_tokenizers()
        key = fingerprint("pairs", 1, self._tokenizer_keys, hash_texts(sources), hash_texts(targets))

        def build() -> dict[str, np.ndarray]:
            src_ids, src_offsets = encode_ragged(src_tok, sources)
            tgt_ids, tgt_offsets = encode_ragged(tgt_tok, targets)
            return {"src_ids": src_ids, "src_offsets": src_offsets, "tgt_ids": tgt_ids, "tgt_offsets": tgt_offsets}

        def save(value: dict[str, np.ndarray], tmp: str) -> None:
            with open(tmp, "wb") as handle:
                np.savez(handle, **value)

        return cached(self.cache_dir / "tokens" / f"pairs-{key}.npz", build, save, lambda p: dict(np.load(p)))

    def prepare(self) -> Path | None:
        """Tokenize every split once (training the tokenizers first when needed): into token shards (the prepared
        folder is returned), or into the in-memory path's cache (see `storage`)."""
        if not self.uses_shards:
            for split in SPLITS:
                self._encoded(split)
            return None
        if self._root is None:
            self._root = prepare_pairs(self.pair_stream, self._load_tokenizers(), self._tokenizer_keys, self.cache_dir,
                                       self.max_pairs)  # fmt: skip
        return self._root

    def prepare_data(self) -> None:
        """Once per node: train the tokenizer(s) and tokenize every split into the cache."""
        self.prepare()

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
            raise ValueError(f"No {split} pair of {self.dataset!r} fits max_length={self.max_length}")
        return keep

    def setup(self, stage: str | None = None) -> None:
        """Every rank: open the token shards (or load the cached token arrays) and drop over-long pairs (counted in a
        warning). With shards only the index is read: 16 bytes per pair."""
        if self.uses_shards:
            splits = None
            for split in SPLITS:
                if split in self._datasets:
                    continue
                if splits is None:
                    info, splits = load_prepared_pairs(self.prepare())
                    sizes = {s: len(shards) for s, shards in splits.items()}
                    rank_zero_info(f"{self.dataset}: pairs per split {sizes}; held-out: {info['held_out']}")
                shards = splits[split]
                keep = self._keep(split, shards.source_lengths + 1, shards.target_lengths + 1)
                ids = self.pad_token_id, self.bos_token_id, self.eos_token_id
                self._datasets[split] = ShardPairDataset(shards, keep, *ids)
            return
        for split in SPLITS:
            if split in self._datasets:
                continue
            arrays = self._encoded(split)
            keep = self._keep(split, np.diff(arrays["src_offsets"]) + 1, np.diff(arrays["tgt_offsets"]) + 1)
            texts = None if split == "train" else self.pairs()[split]
            self._datasets[split] = PairDataset(
                (arrays["src_ids"], arrays["src_offsets"]),
                (arrays["tgt_ids"], arrays["tgt_offsets"]),
                keep,
                texts,
                self.pad_token_id,
                self.bos_token_id,
                self.eos_token_id,
            )

    def _loader(self, split: str, shuffle: bool) -> ResumableLoader:
        if split not in self._datasets:
            self.setup()
        data = self._datasets[split]
        # The batches depend on the lengths and the seed only; their order in each epoch on (seed, epoch).
        batches = token_budget_plan(data.source_lengths(), data.target_lengths(), self.max_tokens, seed=self.seed)
        epoch = self.trainer.current_epoch if shuffle and self.trainer is not None else 0
        return ResumableLoader(
            data, batches, _collate, shuffle=shuffle, seed=self.seed, num_workers=self.num_workers, start_epoch=epoch
        )

    def state_dict(self) -> dict:
        """Saved in every checkpoint: the tokenizer(s), so a checkpoint can always be decoded."""
        return {"tokenizer": self.tokenizer.to_str(), "target_tokenizer": self.target_tokenizer.to_str()}

    def load_state_dict(self, state_dict: dict) -> None:
        if self._tokenizers is None and "tokenizer" in state_dict:
            saved = state_dict["tokenizer"]
            target = state_dict.get("target_tokenizer", saved)
            source = Tokenizer.from_str(saved)
            # One id table may still segment each language apart (OPUS-MT's source.spm and target.spm).
            self._tokenizers = (source, source if target == saved else Tokenizer.from_str(target))
            self._tokenizer_keys = (fingerprint("tokenizer", saved), fingerprint("tokenizer", target))
