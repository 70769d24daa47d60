"""ClassificationDataModule: text + label rows from the embedded genre task, local files or the hub, padded batches.

Batches: {"input_ids": (B, T), "attention_mask": (B, T), "labels": (B,)} (multi-label: (B, num_labels) 0/1 floats).
Rows are the text's tokens only (no BOS/EOS: an encoder_only model with pooling="cls" prepends its [CLS] itself),
cut to max_length and padded on the right; the mask says which tokens are real. Batches group texts of similar
length, so padding stays a few percent of the tokens.
"""

from __future__ import annotations

import itertools
import json
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info
from tokenizers import Tokenizer
from torch.utils.data import Dataset

from ..errors import ConfigError
from . import corpora
from .base import COVERAGE_CHARS, COVERAGE_TOKENS, DataModule, check_least
from .loaders import RecordShards, ResumableLoader, load_prepared, token_budget_batches
from .shards import SHARD_TOKENS, TextsKind, prepare
from .sources import (
    ENCODING,
    HELD_OUT,
    SPLITS,
    DataFileError,
    Source,
    SplitStream,
    missing_splits,
    records,
    table_rows,
)
from .text import with_mask_token


class TextClassDataset(Dataset):
    """The texts of one prepared split (read through memory maps a batch at a time) and their label ids, collating
    themselves into padded batches."""

    def __init__(self, shards: LabelledShards, labels: np.ndarray, max_length: int, pad_id: int) -> None:
        self.shards, self.labels = shards, labels
        self.max_length, self.pad_id = max_length, pad_id

    def __len__(self) -> int:
        return len(self.labels)

    def lengths(self) -> np.ndarray:
        return np.minimum(self.shards.lengths, self.max_length).clip(min=1)

    def __getitem__(self, index: int) -> dict:
        return self.__getitems__([index])

    def __getitems__(self, indices) -> dict:
        rows = [row[: self.max_length] for row in self.shards.read(indices)]
        width = max(1, max(len(r) for r in rows))
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.bool)
        for b, row in enumerate(rows):
            ids[b, : len(row)] = torch.from_numpy(row.astype(np.int64))
            mask[b, : max(1, len(row))] = True  # an empty text keeps one (pad) token: a row needs a real position
        labels = torch.from_numpy(self.labels[list(indices)])
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def check_label_spelling(names: list[str], dataset: str) -> None:
    """Refuse labels that differ only in spaces around them or in case ("pos", "pos ", "Pos"): each became a class of
    its own, without a word, and the model learned to tell a typo apart."""
    spelled: dict[str, list[str]] = {}
    for name in names:
        spelled.setdefault(name.strip().casefold(), []).append(name)
    alike = next((group for group in spelled.values() if len(group) > 1), None)
    if alike:
        raise DataFileError(
            f"The training split of {dataset!r} has labels that differ only in spaces or case, {alike!r}: each would be "
            "a class of its own. Write each class one way in the data"
        )


class ClassificationDataModule(DataModule):
    """Sequence classification data: texts with one label (or several, multi_label) each.

    The tokenizer and the label names are ready right after construction (read and trained on first access), so the
    CLI can link the vocabulary, the special ids and num_labels into the model config. The tokenizer gains a <mask>
    token, so the same data serves masked-LM pretraining (`configs/presets/mlm.yaml`) and a classifier fine-tuned
    from it shares its vocabulary.
    """

    feeds = ("classification", "masked_lm")

    max_input_length = None  # set from max_length

    def __init__(
        self,
        dataset: str = "shakespeare-genre",
        label_column: str = "label",
        label_names: list[str] | None = None,
        multi_label: bool = False,
        max_length: int = 128,
        max_examples: int | None = None,
        held_out: float = 0.1,
        lines_per_passage: int = 8,
        batch_size: int | None = None,
        **kwargs: Any,
    ) -> None:
        """
        Args:
            dataset: "shakespeare-genre" (embedded: passages of the First Folio's plays labelled comedy, history or
                tragedy, split by play), a hub name (e.g. imdb, or glue with dataset_config sst2) or local
                .csv/.tsv/.jsonl/.json/.parquet files, folder or glob (a folder's train*/valid*/test* files become
                the splits; missing validation/test splits are carved from train by a hash of the text).
            label_column: The column that holds the label: a name, an integer (a hub ClassLabel's names are used),
                or, with multi_label, a list of them.
            label_names: The classes, in id order; None takes them from the data (a ClassLabel's names, else the
                sorted distinct labels of the training split). Saved in checkpoints: predict writes these names.
            multi_label: Each text has a set of labels (batches carry (B, num_labels) 0/1 targets).
            max_length: Texts are cut to this many tokens.
            max_examples: Use only the first max_examples training texts (quick runs); None uses all.
            held_out: The fraction of the training texts each missing validation/test split takes (by a hash of
                the text).
            lines_per_passage: shakespeare-genre: non-blank lines per passage.
            batch_size: Texts of similar length a batch; with max_tokens, at most this many besides the token budget
                (None: 32 texts, or with max_tokens the budget alone).
            **kwargs: The arguments every DataModule shares (text_column, e.g. sentence for hub sst2; tokenizer, a
                .ckpt's to fine-tune a pretrained encoder; vocab_size, before the added <mask>; max_tokens; seed;
                predict_file, each input's label and probability written; ...: see DataModule).
        """
        if batch_size is None and kwargs.get("max_tokens") is None:
            batch_size = 32
        super().__init__(dataset=dataset, held_out=held_out, batch_size=batch_size, **kwargs)
        if max_length < 1 or (self.max_tokens is not None and self.max_tokens < max_length):
            raise ConfigError(
                f"Need max_length >= 1 and max_tokens >= max_length or None (got {max_length}, {self.max_tokens})",
                keys=["data.init_args.max_length", "data.init_args.max_tokens"],
            )
        check_least(max_examples=(max_examples, 1), lines_per_passage=(lines_per_passage, 1))
        self.label_column = label_column
        self.requested_label_names = label_names
        self.multi_label = multi_label
        self.max_length = self.max_input_length = max_length
        self.max_examples = max_examples
        self.lines_per_passage = lines_per_passage
        self._stream: LabelledStream | None = None
        self._label_names: list[str] | None = None
        self._first: tuple[list[str], list[Any]] | None = None
        self._datasets: dict[str, TextClassDataset] = {}
        self._root: Path | None = None
        self._splits: dict[str, LabelledShards] = {}

    @classmethod
    def longest_sequence(cls, args: dict) -> tuple[str, int]:
        return "max_length", args["max_length"]  # (+1 with pooling=cls: the model prepends its [CLS] itself)

    @classmethod
    def trained_args(cls, args: dict[str, Any], checkpoint: dict[str, Any], path: str) -> dict[str, Any]:
        """The base's, and the classifier's classes for unset label_names: derived again from the data's training
        split, they would be another number (a subset: the head fails to load) or other meanings for the same ids
        (another set of the same size). Given label_names are kept, and checked (check_trained)."""
        changed = super().trained_args(args, checkpoint, path)
        if checkpoint.get("label_names") and not args.get("label_names"):
            changed["label_names"] = [str(name) for name in checkpoint["label_names"]]
        # A multi-label classifier's outputs are a sigmoid per label, a single-label one's a softmax: its rows are read
        # as it was trained (a multi-label checkpoint read single-label data failed on its label lists).
        task = (checkpoint.get("hyper_parameters") or {}).get("task")
        multi_label = (task.get("init_args") or {}).get("multi_label") if isinstance(task, dict) else None
        if isinstance(multi_label, bool) and bool(args.get("multi_label")) != multi_label:
            changed["multi_label"] = multi_label
        return changed

    def check_trained(self, checkpoint: dict[str, Any], path: str, resuming: bool) -> None:
        """The base's, and the classes: in the classifier's order."""
        super().check_trained(checkpoint, path, resuming)
        trained = [str(name) for name in checkpoint.get("label_names") or []]
        if not trained or trained == list(self.label_names):
            return
        names, given = json.dumps(trained), json.dumps(list(self.label_names))
        if resuming:
            message = (
                f"fit --ckpt_path {path} resumes a classifier of the classes {names} (in id order), but this run's "
                f"data gives {given}: its outputs would mean other classes. Resume with the run's own data settings "
                "(its config.yaml beside the TensorBoard logs), or keep the checkpoint's classes: "
                f"--data.init_args.label_names '{names}'"
            )
        else:
            message = (
                f"{path} is a classifier of the classes {names} (in id order), but data.init_args.label_names gives "
                f"{given}: its outputs would mean other classes. Leave data.init_args.label_names unset (the "
                "checkpoint's are then used), or give them in its order"
            )
        raise ConfigError(message, keys=["data.init_args.label_names"])

    # ------------------------------------------------------------------ rows and labels

    def rows(self) -> dict[str, tuple[list[str], list[Any]]]:
        """Each split's (texts, raw labels) as prepared, read back from the shards the batches come from (texts
        decoded, labels as the source wrote them, a ClassLabel's ids as its names): for inspection."""
        class_names = self.stream.class_names()
        rows = {}
        for split, shards in self._prepared().items():
            texts = [self.tokenizer.decode(ids.tolist()) for ids in shards.read(range(len(shards)))]
            labels = shards.labels() if class_names is None else [_names(y, class_names) for y in shards.labels()]
            rows[split] = (texts, labels)
        return rows

    @property
    def stream(self) -> LabelledStream:
        """The labelled texts of each split, read through the one reader (held-out splits carved by text hash)."""
        if self._stream is None:
            embedded = corpora.embedded(self.dataset, self.cache_dir, lines_per_passage=self.lines_per_passage)
            self._stream = LabelledStream(
                self.dataset, self.dataset_config, self.text_column, self.label_column, embedded, self.held_out,
                self.encoding,
            )  # fmt: skip
        return self._stream

    def _names_from(self, labels: list[Any], class_names: list[str] | None, flat: bool = False) -> list[str]:
        if self.requested_label_names:
            return [str(n) for n in self.requested_label_names]
        if class_names is not None:
            return list(class_names)
        if flat:
            labels = [[y] for y in labels] if self.multi_label else labels
        seen = {str(y) for labels_of_row in labels for y in (labels_of_row if self.multi_label else [labels_of_row])}
        # Integer labels sort as numbers (2 before 10), names alphabetically.
        return sorted(seen, key=lambda n: (0, int(n), "") if n.lstrip("-").isdigit() else (1, 0, n))

    @property
    def label_names(self) -> list[str]:
        """The classes in id order (what the model's outputs mean); saved in checkpoints. Without label_names or a
        ClassLabel column, the distinct labels of the training split, read in one pass (its labels only)."""
        if self._label_names is None:
            # Given (or a checkpoint's, for evaluation and predict) label names need no data: predict reads none.
            class_names = None if self.requested_label_names else self.stream.class_names()
            labels = []
            if not self.requested_label_names and class_names is None:
                labels = self._first_pass()[1]
                if not labels:
                    raise DataFileError(
                        f"The training split of {self.dataset!r} has no labelled text: every row's "
                        f"{self.text_column!r} is blank or its {self.label_column!r} empty"
                    )
                listed = next((y for y in labels if isinstance(y, list)), None)
                if listed is not None and not self.multi_label:  # it became a class named "['a', 'b']"
                    raise DataFileError(
                        f"The training split of {self.dataset!r} has a row labelled with a list, {listed!r}: rows with "
                        "several labels are multi-label data: set --data.init_args.multi_label true, or give each row "
                        "one label"
                    )
            names = self._names_from(labels, class_names, flat=True)
            if not self.requested_label_names and class_names is None:
                check_label_spelling(names, self.dataset)
            if len(names) < 2 and not self.multi_label:  # torchmetrics' refusal was a traceback
                where = "data.init_args.label_names gives" if self.requested_label_names else "the training split has"
                message = (
                    f"{self.dataset!r}: {where} one class, {names}: a classifier tells two or more apart; give rows of "
                    "the other classes (or list them all in --data.init_args.label_names)"
                )
                if self.requested_label_names:
                    raise ConfigError(message, keys=["data.init_args.label_names"])
                raise DataFileError(message)
            self._label_names = names
        return self._label_names

    @property
    def num_labels(self) -> int:
        return len(self.label_names)

    def label_ids(self, split: str) -> np.ndarray:
        """(n,) class ids, or (n, num_labels) 0/1 floats with multi_label; an unknown label fails, naming it."""
        index = {name: i for i, name in enumerate(self.label_names)}

        def lookup(label: Any) -> int:
            if str(label) not in index:
                if not self.requested_label_names and split in self.stream.missing:  # carved from the training data
                    where = "the training split"
                    fix = (
                        f"the {split} split is carved from the training data by a hash of each row, and every row "
                        f"labelled {label!r} went to it: give each class several rows, split the data yourself (files "
                        "named train*/valid*/test*), or give every class in"
                    )
                elif not self.requested_label_names:
                    where, fix = "the training split", f"add training rows labelled {label!r}, or give every class in"
                else:  # given, or a checkpoint's classes, which validate, test and predict score it on
                    where = "label_names: the given ones, or an evaluated checkpoint's classes"
                    fix = "a checkpoint knows only its classes: score it on rows labelled with them; to train, give"
                    fix += " every class in"
                raise DataFileError(
                    f"{self.dataset!r} {split}: label {label!r} is not one of the label names {self.label_names} "
                    f"(taken from {where}): {fix} --data.init_args.label_names"
                )
            return index[str(label)]

        labels = self._prepared()[split].labels()
        class_names = self.stream.class_names()
        if class_names is not None:
            labels = [_names(y, class_names) for y in labels]
        if not self.multi_label:
            return np.asarray([lookup(y) for y in labels], dtype=np.int64)
        targets = np.zeros((len(labels), len(index)), dtype=np.float32)
        for row, names in enumerate(labels):
            for name in [names] if isinstance(names, (str, int)) else names:
                targets[row, lookup(name)] = 1.0
        return targets

    def label_counts(self) -> list[int]:
        """Training examples per class (per label, multi-label): what class_weights="balanced" divides by."""
        ids = self.label_ids("train")
        if self.multi_label:
            return ids.sum(axis=0).astype(int).tolist()
        counts = Counter(ids.tolist())
        return [counts.get(i, 0) for i in range(self.num_labels)]

    def majority_baseline(self, split: str = "test") -> float:
        """Accuracy on `split` of always answering the training split's most frequent class."""
        majority = int(np.argmax(self.label_counts()))
        return float(np.mean(self.label_ids(split) == majority))

    # ------------------------------------------------------------------ tokenizer

    def tokenizer_texts(self) -> list[str]:
        """The first training texts, up to tokenizer_sample_chars characters (and max_examples texts)."""
        return self._first_pass()[0]

    def _first_pass(self) -> tuple[list[str], list[Any]]:
        """One pass over the training split for both things read before the shards: the tokenizer's sample (the
        first texts, up to tokenizer_sample_chars characters) and, when they come from the data, the distinct labels
        (read to the end, or to max_examples). With the shard pass, a file is read twice per preparation at most."""
        if self._first is not None:
            return self._first
        need_labels = self._label_names is None and not self.requested_label_names
        need_labels = need_labels and self.stream.class_names() is None
        texts, total, seen = [], 0, {}
        records = self.stream.records_of("train")
        if self.max_examples is not None:
            records = itertools.islice(records, self.max_examples)
        for record in records:
            if total < self.tokenizer_sample_chars:
                texts.append(record.text)
                total += len(record.text)
            elif not need_labels:
                break
            if need_labels:
                for label in record.label if self.multi_label and isinstance(record.label, list) else [record.label]:
                    seen.setdefault(str(label), label)
        self._first = (texts, list(seen.values()))
        return self._first

    def build_tokenizers(self) -> tuple[tuple[Tokenizer, Tokenizer], tuple[str, str]]:
        """The tokenizer, with a <mask> token (added after the trained vocabulary when it has none)."""
        (tokenizer, _), keys = super().build_tokenizers()
        if self._first is not None:  # the tokenizer's sample is not kept once it is built (the labels are)
            self._first = ([], self._first[1])
        key = with_mask_token(tokenizer, keys[0])
        return (tokenizer, tokenizer), (key, key)

    # ------------------------------------------------------------------ Lightning hooks

    def _prepared(self) -> dict[str, LabelledShards]:
        """The texts' token shards and labels of every split, prepared first when the cache lacks them."""
        if not self._splits:
            info, self._splits = load_prepared(self.prepare(), LabelledShards)
            sizes = {split: len(shards) for split, shards in self._splits.items()}
            rank_zero_info(f"{self.dataset}: texts per split {sizes}; held-out: {info['held_out']}")
            train = self._splits["train"]
            rows = int(np.searchsorted(np.cumsum(train.lengths), COVERAGE_TOKENS, side="right"))
            head = train.read(range(max(1, rows))) if len(train) else []
            self.warn_unknown_tokens(
                np.concatenate(head) if head else np.zeros(0, np.int64),
                int(train.lengths.sum()),
                self._first_texts,
                self.tokenizer,
            )
        return self._splits

    def _first_texts(self) -> list[str]:
        """The training split's first texts, up to COVERAGE_CHARS characters."""
        texts, total = [], 0
        for record in self.stream.records_of("train"):
            if total >= COVERAGE_CHARS:
                break
            texts.append(record.text)
            total += len(record.text)
        return texts

    def prepare(self) -> Path:
        """Stream every split into token shards once, labels beside the ids (training the tokenizer first when
        needed); the prepared folder. Memory stays flat in corpus size."""
        if self._root is None:
            tokenizer = self.tokenizer
            self._root = prepare_labelled(self.stream, tokenizer, self._tokenizer_keys[0], self.cache_dir,
                                          self.max_examples)  # fmt: skip
        return self._root

    def setup(self, stage: str | None = None) -> None:
        if stage == "predict":  # the predict_file and the tokenizer alone: no split is read
            return
        splits = self._prepared()
        pad = self.pad_token_id if self.pad_token_id is not None else 0
        for split in SPLITS:
            if split not in self._datasets:
                self._datasets[split] = TextClassDataset(splits[split], self.label_ids(split), self.max_length, pad)

    def loader(self, split: str, shuffle: bool) -> ResumableLoader:
        if split not in self._datasets:
            self.setup()
        dataset = self._datasets[split]
        lengths = dataset.lengths()
        if self.max_tokens is not None:
            # batch_size, when given besides, caps the texts of a batch (as translation's pairs): it was ignored; the
            # default (None) leaves the budget alone
            batches = token_budget_batches(
                lengths, lengths, self.max_tokens, seed=self.seed, max_sentences=self.batch_size
            )
        else:
            batches = length_grouped_batches(lengths, self.batch_size, self.seed)
        if not batches:
            raise DataFileError(f"The {split} split of {self.dataset!r} is empty: give it rows")
        epoch = self.trainer.current_epoch if shuffle and self.trainer is not None else 0
        return ResumableLoader(
            dataset, batches, shuffle=shuffle, seed=self.seed, num_workers=self.num_workers, start_epoch=epoch
        )

    def padding_fraction(self, split: str = "train") -> float:
        """Padding tokens over all tokens of the split's batches (what length grouping keeps small)."""
        if split not in self._datasets:
            self.setup()
        lengths = self._datasets[split].lengths()
        batches = self.loader(split, shuffle=False).batches
        real = sum(int(lengths[b].sum()) for b in batches)
        total = sum(int(lengths[b].max()) * len(b) for b in batches)
        return 1.0 - real / total

    def own_state(self) -> dict:
        """Saved in every checkpoint beside the tokenizer: the label names."""
        return {"label_names": self.label_names}

    def load_own_state(self, state: dict) -> None:
        if state.get("label_names") and self._label_names is None:
            self._label_names = list(state["label_names"])


def length_grouped_batches(lengths: np.ndarray, batch_size: int, seed: int) -> list[list[int]]:
    """Batches of batch_size texts of similar length: sorted by length (ties broken by `seed`), cut in order. The
    loader shuffles the batches each epoch, so the order of lengths does not become a curriculum."""
    jitter = np.random.default_rng(seed).random(len(lengths))
    order = np.lexsort((jitter, lengths)).tolist()
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def _names(label: Any, class_names: list[str]) -> Any:
    """A ClassLabel's integer (or list of them) as its name(s)."""
    if isinstance(label, list):
        return [class_names[i] for i in label]
    return class_names[label] if isinstance(label, int) and 0 <= label < len(class_names) else label


# ---------------------------------------------------------------------------------------------------- the task's own
# Labelled texts as records (columns -> text and label), their shard layout and reader: all of classification's data
# that is not shared.


@dataclass
class LabelledText:
    """A text and its label (a name, an id, or a list of them for multi-label data): one row of a classifier's data."""

    text: str
    label: Any
    row: int  # the row's index in its source split
    nbytes: int
    last = True

    @property
    def extra(self) -> str:
        """The label as JSON: what a prepared shard keeps beside the text's ids."""
        return json.dumps(self.label, ensure_ascii=False)

    @property
    def texts(self) -> tuple[str]:
        return (self.text,)

    @property
    def document(self) -> int:
        return self.row


class LabelledStream(SplitStream):
    """Each split's labelled texts as a stream, read row by row through the one reader; held-out splits carved from
    train by a hash of the text when missing. A split whose labels are hidden (a hub test split of -1 labels, as in
    GLUE) cannot be scored: it is left out and carved from train like a missing one."""

    key = "labelled"
    local_hint = "(.csv/.tsv, .jsonl/.json, .parquet) with a text and a label column, or a hub dataset name"
    column_hint = " (choose them with --data.init_args.text_column and label_column)"

    def __init__(
        self,
        dataset: str,
        dataset_config: str | None = None,
        text_column: str = "text",
        label_column: str = "label",
        embedded=None,
        held_out: float = HELD_OUT,
        encoding: str = ENCODING,
    ) -> None:
        self.text_column, self.label_column = text_column, label_column
        super().__init__(dataset, dataset_config, embedded, held_out, encoding)
        hidden = [name for name, source in self.sources.items() if name != "train" and self._hidden(source)]
        for name in hidden:
            del self.sources[name]
        if hidden:
            self.missing = missing_splits(self.sources)
            self.mode = "hash"

    def _columns(self) -> list[str]:
        return [self.text_column, self.label_column]

    def _settings(self) -> tuple:
        return self.text_column, self.label_column

    def _hidden(self, source: Source) -> bool:
        if source.table is None:
            return False
        first = next(iter(table_rows(source.table)), None)
        return first is not None and first.get(self.label_column) == -1

    def class_names(self) -> list[str] | None:
        """The label names a `datasets` ClassLabel column carries (hub and saved datasets), else None."""
        table = self.sources["train"].table
        feature = (getattr(table, "features", None) or {}).get(self.label_column)
        feature = getattr(feature, "feature", feature)  # a Sequence(ClassLabel) for multi-label data
        return getattr(feature, "names", None)

    def routed(self, source_name: str, skip: int = 0) -> Iterator[tuple[str | None, LabelledText]]:
        """(split, labelled text) for every row of one pass over a source split; split is None for a row with a
        blank text or no label (dropped). The training source also feeds carved held-out splits, by text hash."""
        for row, (text, label, nbytes) in enumerate(self._rows(self.sources[source_name])):
            if row < skip:
                continue
            blank = not text.strip() or label is None or label == ""
            yield (None if blank else self.owner(source_name, text)), LabelledText(text, label, row, nbytes)

    def _rows(self, source: Source) -> Iterator[tuple[str, Any, int]]:
        if source.table is not None:
            for number, row in enumerate(table_rows(source.table), 1):
                text, label = self._labelled(row, f"{self.dataset} ({source.origin[-1]}) row {number}")
                yield text, label, len(text) if source.in_memory else 0
            return
        for path in source.files:
            columns = list(dict.fromkeys(c.split(".")[0] for c in self._columns()))
            for row, nbytes, number in records(path, columns, self.encoding):
                yield *self._labelled(row, f"{path}:{number}"), nbytes

    def _labelled(self, row: dict, where: str) -> tuple[str, Any]:
        values = self.values(row, where)
        text, label = values
        if text is not None and not isinstance(text, str):
            raise DataFileError(f"{where}: the text column {self.text_column!r} holds {type(text).__name__}, not text")
        return text or "", label


class LabelledKind(TextsKind):
    """Labelled texts: each text's ids, and its label beside them as a JSON line (a name, an id, or a list of them)."""

    folder, tag = "labelled", "labelled-shards"

    def check(self, stream: LabelledStream, splits: dict[str, dict]) -> None:
        empty = {split: index.get("empty", 0) for split, index in splits.items() if index.get("empty", 0)}
        if empty:  # dropped without a word: a test file of 10 rows, 4 unlabelled, scored 6
            warnings.warn(
                f"{stream.dataset}: left out {sum(empty.values())} rows with a blank {stream.text_column!r} or an empty "
                f"{stream.label_column!r} ({', '.join(f'{split}: {n}' for split, n in empty.items())})",
                stacklevel=4,
            )
        if not splits["train"]["texts"]:
            raise DataFileError(
                f"The training split of {stream.dataset!r} has no labelled text: every row's {stream.text_column!r} "
                f"is blank or its {stream.label_column!r} empty"
            )
        for split in SPLITS[1:]:
            if splits[split]["texts"]:
                continue
            why = (
                f"carved from train, {stream.held_out:.0%} of the texts by a hash of each, it got none: give more "
                f"texts, a larger held_out, or a {split} file"
                if split in stream.missing
                else "its source has no labelled text: fill it, or leave it out to carve it from train"
            )
            raise DataFileError(f"The {split} split of {stream.dataset!r} is empty: {why}")


LABELLED = LabelledKind()


def prepare_labelled(
    stream: LabelledStream,
    tokenizer: Tokenizer,
    tokenizer_key: str,
    cache_dir: Path,
    max_examples: int | None = None,
    shard_tokens: int = SHARD_TOKENS,
    workers: int | None = None,
) -> Path:
    """Prepare every split of `stream` once (cached by content; resumable; atomic): the texts' ids in shards, their
    labels beside them; the prepared folder. max_examples: the training split is cut after this many texts."""
    info = {"vocab_size": tokenizer.get_vocab_size(), "tokenizer_key": tokenizer_key}
    keys = (tokenizer_key,)
    return prepare(stream, LABELLED, (tokenizer,), keys, cache_dir, info, None, max_examples, shard_tokens, workers)


class LabelledShards(RecordShards):
    """One prepared split of labelled texts: their ids per batch, their labels read whole."""

    def labels(self) -> list:
        """Each text's label as the source wrote it (a name, an id, or a list of them)."""
        return self.values()
