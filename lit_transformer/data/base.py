"""The base DataModule every task's DataModule extends: what all of them share, in one place.

It owns the source (`dataset`, `dataset_config`, `text_column`), the tokenizers (one, or a source and a target one,
shared or not; built on first access so the CLI can link vocabulary sizes and special ids into the model config),
the batch size or token budget, the held-out fraction carved from a source without validation/test splits, the
loader workers, the seed of the batch order, the cache folder, the predict input, `prepare()`, and the Lightning
hooks, each over the task's `loader(split, shuffle)`.

The tokenizers are saved once per checkpoint, by the LightningModule (`checkpoint["tokenizer"]`); a DataModule's own
checkpoint state holds only what is its own (a classifier's label names).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_warn
from tokenizers import Tokenizer

from lit_transformer.errors import ConfigError

from .cache import fingerprint, resolve_cache_dir
from .sources import ENCODING, HELD_OUT, check_encoding, predict_inputs
from .text import (
    KINDS,
    SPECIAL_TOKENS,
    encode_input,
    load_or_train_tokenizer,
    pad_right,
    same_segmentation,
    special_token_id,
    unknown_characters,
    unknown_token_id,
)

PREDICT_FILE_NEEDED = (
    "predict needs inputs: --data.init_args.predict_file FILE, a text file with one input (a prompt, a source "
    'sentence, a passage) per line or a JSONL file whose lines hold a "text" field'
)
DROPPED_IN = "0.2.0"  # the version that drops the deprecated data keys


# Training text whose tokens are this share <unk> or more is named in a warning (a rare emoji in web text stays
# under it); the share is read from the first COVERAGE_TOKENS training tokens, at every start (a few MB of a memory map).
UNKNOWN_SHARE = 1e-3
COVERAGE_TOKENS = 1_000_000
COVERAGE_CHARS = 1_000_000  # the text the missing characters are named from, read only when the share is reached


def check_least(**bounds: tuple[Any, int]) -> None:
    """Refuse a data.init_args count below its least, as `key=(value, least)`: None passes (unset), and each item
    of a tuple is checked. A count out of range otherwise failed deep inside the run (a DataLoader's num_workers, a
    tokenizer trainer's vocab_size, a numpy seed) or quietly did nothing."""
    for key, (value, least) in bounds.items():
        items = value if isinstance(value, tuple | list) else (value,)
        if any(item is not None and item < least for item in items):
            raise ConfigError(
                f"data.init_args.{key}={value!r}: {'each must be' if isinstance(value, tuple | list) else 'must be'} "
                f"{least} or more",
                keys=[f"data.init_args.{key}"],
            )


def warn_deprecated_key(key: str, fix: str) -> None:
    """A FutureWarning for a deprecated DataModule key, naming the version that drops it and what to do instead."""
    warnings.warn(f"data.{key} is deprecated and dropped in {DROPPED_IN}: {fix}", FutureWarning, stacklevel=3)


class DataModule(L.LightningDataModule):
    """What every task's DataModule shares (see the module). A task's DataModule says:

    - `tokenizer_texts()`: the training texts a tokenizer kind is trained on (a bounded sample);
    - `prepare()`: read and tokenize every split once into the cache;
    - `loader(split, shuffle)`: the batches of a split.
    """

    encoder_decoder: ClassVar[bool] = False  # predict inputs: a prompt's tokens, or a source's tokens then EOS
    required_special_tokens: ClassVar[tuple[str, ...]] = ()  # roles both tokenizers must share (translation's)
    tokenizer_tag: ClassVar[str] = ""  # in a trained tokenizer's cache key
    # The tasks (Task.name) whose batches this DataModule makes; None: not declared, not checked (a user's own).
    feeds: ClassVar[tuple[str, ...] | None] = None
    num_labels: int | None = None  # a classifier's classes; linked into the model config by the CLI
    max_input_length: int | None = None  # predict inputs are cut to this many tokens

    def __init__(
        self,
        dataset: str,
        dataset_config: str | None = None,
        text_column: str = "text",
        tokenizer: str = "byte_bpe",
        vocab_size: int = 8192,
        tokenizer_sample_chars: int = 20_000_000,
        batch_size: int = 32,
        max_tokens: int | None = None,
        held_out: float = HELD_OUT,
        num_workers: int = 0,
        seed: int = 42,
        cache_dir: str | None = None,
        predict_file: str | None = None,
        predict_batch_size: int = 16,
        encoding: str = ENCODING,
    ) -> None:
        """The arguments every task shares, declared once: a task's DataModule declares its own ones (and those whose
        default or meaning is the task's, such as `dataset`) and passes the rest through `**kwargs`; jsonargparse
        reads these through the `**kwargs`, so `data.init_args.batch_size` and the others stay keys of every task's
        DataModule. A task that fixes one passes it by name, which takes it off the task's keys.

        Args:
            dataset: The data: an embedded dataset's name, a Hugging Face hub name, or local files (a file, folder or
                glob; a folder's train*/valid*/test* files become the splits).
            dataset_config: The hub dataset's configuration name.
            text_column: The column that holds the text.
            tokenizer: A kind to train on the training texts (byte_bpe, bpe, char), a tokenizer.json path or a hub
                tokenizer name.
            vocab_size: Vocabulary size of a trained tokenizer.
            tokenizer_sample_chars: A tokenizer kind is trained on at most this many characters from the start of
                the training split (a bounded sample: the whole split when it is smaller).
            batch_size: Examples (sequences, texts, pairs) per batch.
            max_tokens: Instead of (or besides) batch_size, a token budget per batch: batch size times its longest
                sequence.
            held_out: The fraction of the training split each missing validation/test split takes (by a hash of the
                record).
            num_workers: DataLoader worker processes (0 loads in the main process).
            seed: Seed of the batch order (saved with checkpoints, so resumed runs see the same order).
            cache_dir: Where tokenizers and token shards are cached; default $LIT_TRANSFORMER_CACHE or
                ~/.cache/lit_transformer.
            predict_file: Inputs of `predict`: a text file with one input per line, or a JSONL file with a "text"
                field per line; the outputs go to a JSONL file (see --predictions.output).
            predict_batch_size: Inputs handled at once by `predict`.
            encoding: The text encoding of the data files (and predict_file): utf-8 (a byte order mark is dropped), or
                another that the files use, e.g. latin-1 or cp1252. Bytes that are not this encoding stop the run,
                naming the file and line; nothing is replaced.
        """
        super().__init__()
        if batch_size is None and max_tokens is None:
            raise ConfigError(
                "data.init_args.batch_size and max_tokens are both None: give batch_size (examples a batch) or "
                "max_tokens (a token budget a batch)",
                keys=["data.init_args.batch_size", "data.init_args.max_tokens"],
            )
        if (batch_size is not None and batch_size < 1) or (max_tokens is not None and max_tokens < 1):
            raise ConfigError(
                f"batch_size={batch_size} and max_tokens={max_tokens} must be positive (or None)",
                keys=["data.init_args.batch_size", "data.init_args.max_tokens"],
            )
        if tokenizer_sample_chars < 1:
            raise ConfigError(
                f"tokenizer_sample_chars={tokenizer_sample_chars} must be positive",
                keys=["data.init_args.tokenizer_sample_chars"],
            )
        # vocab_size: the special tokens and one character at least (a tokenizer file or hub name ignores it)
        check_least(
            vocab_size=(vocab_size, len(SPECIAL_TOKENS) + 1),
            num_workers=(num_workers, 0),
            seed=(seed, 0),
            predict_batch_size=(predict_batch_size, 1),
        )
        if not 0 < held_out < 0.5:
            raise ConfigError(
                f"held_out={held_out} must be between 0 and 0.5 (validation and test take it each)",
                keys=["data.init_args.held_out"],
            )
        self.dataset, self.dataset_config, self.text_column = dataset, dataset_config, text_column
        self.tokenizer_spec, self.requested_vocab_size = tokenizer, vocab_size
        self.tokenizer_sample_chars = tokenizer_sample_chars
        self.batch_size, self.max_tokens, self.held_out = batch_size, max_tokens, held_out
        self.num_workers, self.seed = num_workers, seed
        self.cache_dir = resolve_cache_dir(cache_dir)
        self.predict_file, self.predict_batch_size = predict_file, predict_batch_size
        self.encoding = check_encoding(encoding)
        self._tokenizers: tuple[Tokenizer, Tokenizer] | None = None
        self._tokenizer_keys = ("", "")

    # ------------------------------------------------------------------ what a task says

    def tokenizer_texts(self) -> list[str]:
        """The training texts a tokenizer kind is trained on (at most tokenizer_sample_chars characters)."""
        raise NotImplementedError

    def build_tokenizers(self) -> tuple[tuple[Tokenizer, Tokenizer], tuple[str, str]]:
        """(source, target) tokenizers and their cache keys; one tokenizer serves both sides by default."""
        tokenizer, key = load_or_train_tokenizer(
            self.tokenizer_spec, self.tokenizer_texts, self.requested_vocab_size, self.cache_dir, tag=self.tokenizer_tag
        )
        return (tokenizer, tokenizer), (key, key)

    def prepare(self) -> Path | None:
        """Read and tokenize every split once into the cache (training the tokenizer first when needed)."""
        raise NotImplementedError

    def loader(self, split: str, shuffle: bool) -> Any:
        """The batches of `split` (train: shuffle=True)."""
        raise NotImplementedError

    @classmethod
    def model_fields(cls, args: dict[str, Any]) -> dict[str, tuple[str, Any]]:
        """What this data decides of the architecture, from its init args (or the files they name): {model config
        field: (data argument, value)}. The CLI fills each field the model config leaves unset and refuses a different value, naming both
        keys (vocabulary sizes and num_labels, known only once the data is read, are linked instead)."""
        return {}

    @classmethod
    def check_predict_file(cls, args: dict[str, Any]) -> None:
        """Refuse `predict`'s inputs from the init args alone (missing, empty, malformed), before any data is prepared:
        the corpus a DataModule reads for its tokenizer can take minutes to prepare."""
        predict_inputs(args["predict_file"], encoding=args.get("encoding") or ENCODING)

    @classmethod
    def longest_sequence(cls, args: dict[str, Any]) -> tuple[str, int] | None:
        """(data argument, the most positions a batch's sequence takes): the model's max_seq_len must hold it."""
        return None

    @classmethod
    def trained_args(cls, args: dict[str, Any], checkpoint: dict[str, Any], path: str) -> dict[str, Any]:
        """The init args to change (from `args`) so that validate, test and predict read their data as the model in
        `checkpoint` (the file at `path`) was trained to read it: a tokenizer kind (train one) stands for the tokenizer
        saved in it. Trained again from these settings, the tokenizer would be another wherever a setting that shapes
        its sample differs from the run's (a quick run's max_pairs, another dataset to score the model on), often of
        the same size: the scores would be of ids the model never saw. A tokenizer file or hub name is kept, and
        checked (check_trained)."""
        if checkpoint.get("tokenizer") is not None and args.get("tokenizer") in KINDS:
            return {"tokenizer": path}
        return {}

    def check_trained(self, checkpoint: dict[str, Any], path: str, resuming: bool) -> None:
        """Refuse data this DataModule reads otherwise than the model in `checkpoint` (the file at `path`) was trained
        to (here: its tokenizers), before any data is prepared; `resuming`: fit --ckpt_path, else an evaluation."""
        source = checkpoint.get("tokenizer")
        saved = (source, checkpoint.get("target_tokenizer") or source)
        if source is None or all(same_segmentation(t.to_str(), s) for t, s in zip(self.tokenizers, saved)):
            return
        if resuming:
            message = (
                f"fit --ckpt_path {path} resumes a run whose tokenizer is not the one this run's data settings give "
                "(a setting that shapes it changed since: the dataset, its sample, vocab_size, tokenizer or "
                "shared_vocab): the model's embeddings would meet other ids. Resume with the run's own data settings "
                "(its config.yaml beside the TensorBoard logs), or keep the checkpoint's tokenizer: "
                f"--data.init_args.tokenizer {path}"
            )
        else:
            message = (
                f"{path} was trained with another tokenizer than data.init_args.tokenizer {self.tokenizer_spec} gives: "
                "the model's embeddings would meet other ids. Leave data.init_args.tokenizer at a kind to train (bpe, "
                "byte_bpe, char): the checkpoint's own is then used; or give the one it was trained with: "
                f"--data.init_args.tokenizer {path}"
            )
        raise ConfigError(message, keys=["data.init_args.tokenizer"])

    @classmethod
    def check_task(cls, name: str, task_class: str, path: str | None = None) -> None:
        """Refuse a model task (its Task.name and class name) this DataModule makes no batches for (`feeds`), before
        any data is read: a translation checkpoint validated on a language model's data ended in a KeyError from
        inside the task's loss, once the data had been prepared. `path`: the checkpoint the task came from
        (validate, test, predict, fit --ckpt_path): a checkpoint of another task is a file that cannot be used."""
        if cls.feeds is None or not name or name in cls.feeds:
            return
        import lit_transformer.data as data  # its DataModules, imported lazily by name

        mine, feeds = cls.__name__, " and ".join(cls.feeds)
        others = [other for other in data.DATA_MODULES if name in (getattr(data, other).feeds or ())]
        fed_by = f"{name} is fed by {' or '.join(others)}" if others else f"no packaged DataModule feeds {name}"
        if path is not None:
            from lit_transformer.checkpoints.files import CheckpointError

            raise CheckpointError(
                f"{path} is a {name} model, and {mine} makes batches for {feeds} only ({fed_by}): give the configs "
                "the run was trained with (config.yaml beside its TensorBoard logs), or a checkpoint of a model of "
                "this data's task",
                keys=["ckpt_path", "data.class_path"],
            )
        raise ConfigError(
            f"model.task {task_class} ({name}) is not a task {mine} makes batches for (it feeds {feeds}; {fed_by})",
            keys=["model.task", "data.class_path"],
        )

    def own_state(self) -> dict[str, Any]:
        """What this DataModule keeps in a checkpoint besides the tokenizers (saved by the LightningModule)."""
        return {}

    def load_own_state(self, state: dict[str, Any]) -> None:
        """Restore `own_state()`."""

    def warn_unknown_tokens(
        self, tokens: np.ndarray, total: int, texts: Callable[[], Sequence[str]], tokenizer: Tokenizer, side: str = ""
    ) -> None:
        """Warn when `tokens` (the first of the training split's `total`) are UNKNOWN_SHARE <unk> or more, naming
        the characters the tokenizer has no token for (read from `texts()`, called only then) and the fix for where
        the tokenizer came from. The model sees all of those characters as one token and cannot write them, and its
        loss and bits per character score each as an easy prediction, so a run looks better than it is. A char
        tokenizer smaller than the text's alphabet, and a checkpoint's tokenizer fine-tuned on text with other
        characters, both did this silently."""
        unk_id = unknown_token_id(tokenizer)
        if unk_id is None or not len(tokens):
            return
        unknown = int(np.count_nonzero(tokens == unk_id))
        if unknown < UNKNOWN_SHARE * len(tokens):
            return
        sample = texts()
        missing = unknown_characters(tokenizer, sample, unk_id)
        # The text's own "<unk>" markers (WikiText's non-raw sets mark rare words so): encoded as the unknown token
        # they mean, no character the tokenizer lacks. A larger vocab_size would not change them.
        # Nor do they count towards the share: a few missing characters beside them are no more than those few.
        markers, lacking = missing.pop(tokenizer.id_to_token(unk_id), 0), sum(missing.values())
        if markers:
            unknown = round(unknown * lacking / (lacking + markers))  # the sample's mix, applied to the tokens
            if unknown < UNKNOWN_SHARE * len(tokens):
                return
        shown = " ".join(repr(piece) for piece, _ in missing.most_common(12))
        more = f" and {len(missing) - 12} more" if len(missing) > 12 else ""
        if self.tokenizer_spec in ("char", "bpe"):
            alphabet = len(set().union(*map(set, sample)))
            fix = (
                f"A {self.tokenizer_spec} tokenizer keeps at most the vocab_size={self.requested_vocab_size} most "
                f"frequent characters, special tokens included, and this text has {alphabet:,} distinct ones: raise "
                "data.init_args.vocab_size (or take data.init_args.tokenizer byte_bpe, which has a token for every "
                "byte)."
            )
        elif self.tokenizer_spec in KINDS:
            fix = "Take data.init_args.tokenizer byte_bpe, which has a token for every byte."
        else:
            fix = (
                f"data.init_args.tokenizer={self.tokenizer_spec} was made for other text. A byte-level tokenizer "
                "(byte_bpe, GPT-2's) has a token for every byte; a model fine-tuned from a checkpoint keeps the "
                "checkpoint's tokenizer, so text like this one needs a model trained with such a tokenizer."
            )
        read = "" if len(tokens) >= total else f" (the first {len(tokens):,} read)"
        rank_zero_warn(
            f"{self.dataset}: {unknown / len(tokens):.1%} of the training{side} tokens{read} are <unk>: the tokenizer has no "
            f"token for {shown}{more} (most frequent first). The model sees all of them as one token and can never "
            f"write them, and its loss and bits per character score each as an easy prediction. {fix}"
        )

    # ------------------------------------------------------------------ tokenizers

    @property
    def tokenizers(self) -> tuple[Tokenizer, Tokenizer]:
        """(source, target) tokenizers, the same object when the vocabulary is shared; built on first access."""
        if self._tokenizers is None:
            self._tokenizers, self._tokenizer_keys = self.build_tokenizers()
        return self._tokenizers

    @property
    def tokenizer(self) -> Tokenizer:
        """The (source) tokenizer."""
        return self.tokenizers[0]

    @property
    def target_tokenizer(self) -> Tokenizer:
        return self.tokenizers[1]

    @property
    def shared_tokenizer(self) -> bool:
        return self.tokenizers[0] is self.tokenizers[1]

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    @property
    def target_vocab_size(self) -> int | None:
        """None when one tokenizer serves both sides (the model config's convention)."""
        return None if self.shared_tokenizer else self.target_tokenizer.get_vocab_size()

    def special_id(self, role: str) -> int | None:
        """The id of a special token (pad, bos, eos, mask); both tokenizers must agree on it when they differ."""
        source, target = self.tokenizers
        ids = {special_token_id(source, role), special_token_id(target, role)}
        if len(ids) == 1 and (None not in ids or role not in self.required_special_tokens):
            return ids.pop()
        raise ConfigError(
            f"The tokenizers need one common {role} token (found ids {ids}): give tokenizers that share it",
            keys=["data.init_args.tokenizer"],
        )

    @property
    def pad_token_id(self) -> int | None:
        return self.special_id("pad")

    @property
    def bos_token_id(self) -> int | None:
        return self.special_id("bos")

    @property
    def eos_token_id(self) -> int | None:
        return self.special_id("eos")

    @property
    def mask_token_id(self) -> int | None:
        """The [MASK] token of masked-LM pretraining, when the vocabulary has one."""
        return special_token_id(self.tokenizer, "mask")

    def encode(self, text: str) -> list[int]:
        return encode_input(self.tokenizer, text, encoder_decoder=False, eos_token_id=None)

    def decode(self, ids, target: bool = True) -> str:
        """Token ids (the target side's by default) to text, special tokens dropped."""
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        return (self.target_tokenizer if target else self.tokenizer).decode(ids, skip_special_tokens=True)

    def save_tokenizer(self, directory: str | os.PathLike) -> Path:
        """Write tokenizer.json (and target_tokenizer.json when separate) into `directory` (the run's log folder)."""
        path = Path(directory) / "tokenizer.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save(str(path))
        if not self.shared_tokenizer:
            self.target_tokenizer.save(str(path.with_name("target_tokenizer.json")))
        return path

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Only the DataModule's own state: the LightningModule saves the tokenizers, once."""
        return self.own_state()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # Checkpoints written before the tokenizers were saved once hold them here too: adopted when none is built.
        saved = state_dict.get("tokenizer")
        if saved is not None and self._tokenizers is None:
            target = state_dict.get("target_tokenizer", saved)
            source = Tokenizer.from_str(saved)
            self._tokenizers = (source, source if target == saved else Tokenizer.from_str(target))
            self._tokenizer_keys = (fingerprint("tokenizer", saved), fingerprint("tokenizer", target))
        self.load_own_state(state_dict)

    # ------------------------------------------------------------------ Lightning hooks

    def prepare_data(self) -> None:
        """Once per node: train the tokenizer(s) and tokenize every split into the cache. Not for `predict`, which
        reads the predict_file with the checkpoint's tokenizer alone: it prepared the whole training corpus first, and
        refused to run where that corpus was not (a checkpoint used on another machine)."""
        if self.predicting:
            return
        self.prepare()

    @property
    def predicting(self) -> bool:
        """The trainer runs `predict` (setup's stage says the same to `setup`)."""
        trainer = getattr(self, "trainer", None)
        return trainer is not None and trainer.state.fn == "predict"

    def train_dataloader(self):
        loader = self.loader("train", shuffle=True)
        trainer = getattr(self, "trainer", None)
        if trainer is not None and trainer.overfit_batches and hasattr(loader, "repeat"):
            # Lightning's overfit_batches promises the same batches every epoch; it makes a torch DataLoader
            # sequential, and leaves a loader without a sampler (the stream, which went on) as it is.
            loader.repeat = True
        built_for, previous = getattr(self, "_train_loader", (None, None))
        if trainer is not None and built_for == id(trainer) and trainer.current_epoch > 0 and hasattr(loader, "follow"):
            # A loader built again for a later epoch of this fit (trainer.reload_dataloaders_every_n_epochs) goes on
            # with the stream where the one it replaces stopped, as the same loader would have.
            if not loader.repeat:
                loader.follow(previous)
        self._train_loader = (id(trainer), loader)
        return loader

    def val_dataloader(self):
        return self.loader("validation", shuffle=False)

    def test_dataloader(self):
        return self.loader("test", shuffle=False)

    def predict_dataloader(self) -> torch.utils.data.DataLoader:
        """Batches {"input_ids", "attention_mask", "text", "index"} of the predict_file's inputs, in file order."""
        if not self.predict_file:
            raise ConfigError(PREDICT_FILE_NEEDED, keys=["data.init_args.predict_file"])
        texts = predict_inputs(self.predict_file, encoding=self.encoding)
        eos = self.eos_token_id
        rows = [encode_input(self.tokenizer, t, encoder_decoder=self.encoder_decoder, eos_token_id=eos) for t in texts]
        rows = [row[: self.max_input_length] for row in rows]

        def collate(indices: list[int]) -> dict:
            ids, mask = pad_right([rows[i] for i in indices], self.pad_token_id)
            return {"input_ids": ids, "attention_mask": mask, "text": [texts[i] for i in indices], "index": indices}

        return torch.utils.data.DataLoader(
            range(len(texts)), batch_size=self.predict_batch_size, shuffle=False, collate_fn=collate
        )
