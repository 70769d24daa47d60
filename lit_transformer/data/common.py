"""What both DataModules share: finding the source, normalising its splits, tokenizing documents with a cache."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import datasets
import numpy as np
import torch
from tokenizers import Tokenizer

from .encoding import encode_input, pad_right, token_ids
from .sources import SPLIT_ALIASES
from .splits import SPLITS as SPLITS  # re-exported: the DataModules read it here
from .tokenizer import special_token_id


def normalise_splits(data: datasets.DatasetDict) -> datasets.DatasetDict:
    """Rename valid/dev/val to validation; keep train/validation/test only; insist on train."""
    renamed = {}
    for name, split in data.items():
        canonical = SPLIT_ALIASES.get(name.lower())
        if canonical and canonical not in renamed:
            renamed[canonical] = split
    if "train" not in renamed:
        raise ValueError(f"The dataset has no training split (found splits: {sorted(data)})")
    return datasets.DatasetDict(renamed)


def require_columns(data: datasets.DatasetDict, columns: Sequence[str], what: str) -> None:
    for name, split in data.items():
        missing = [c for c in columns if c not in split.column_names]
        if missing:
            raise ValueError(
                f"{what}: split {name!r} has no column {', '.join(map(repr, missing))}; "
                f"its columns are {split.column_names}"
            )


def encode_ragged(tokenizer: Tokenizer, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Each text's ids, as one flat array and offsets (n + 1) into it."""
    encoded = token_ids(tokenizer, texts)
    lengths = np.fromiter((len(ids) for ids in encoded), dtype=np.int64, count=len(encoded))
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.fromiter((i for ids in encoded for i in ids), dtype=np.int32, count=int(offsets[-1]))
    return flat, offsets


class SingleTokenizer:
    """What a DataModule with one tokenizer for inputs and targets tells the CLI (linked into the model config) and
    the LightningModule: the vocabulary size and the special token ids, read from `self.tokenizer`."""

    tokenizer: Tokenizer

    @property
    def target_tokenizer(self) -> Tokenizer:
        return self.tokenizer

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    @property
    def target_vocab_size(self) -> None:
        return None

    @property
    def pad_token_id(self) -> int | None:
        return special_token_id(self.tokenizer, "pad")

    @property
    def bos_token_id(self) -> int | None:
        return special_token_id(self.tokenizer, "bos")

    @property
    def eos_token_id(self) -> int | None:
        return special_token_id(self.tokenizer, "eos")

    def save_tokenizer(self, directory: str | os.PathLike) -> Path:
        """Write tokenizer.json into `directory` (the run's log folder), returning its path."""
        path = Path(directory) / "tokenizer.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save(str(path))
        return path


class SplitLoaders:
    """The Lightning loader hooks of a DataModule, from its `_loader(split, shuffle)`; predict reads `predict_file`."""

    predict_file: str | None = None
    predict_batch_size: int = 16
    # Predict inputs are encoded as training builds inputs: a prompt's tokens, or a translation source's then EOS.
    encoder_decoder = False
    num_labels: int | None = None  # classes of a classification DataModule; linked into the model config
    max_input_length: int | None = None  # predict inputs are cut to this many tokens (a classifier's max_length)

    @property
    def mask_token_id(self) -> int | None:
        """The [MASK] token of masked-LM pretraining, when the vocabulary has one."""
        return special_token_id(self.tokenizer, "mask")

    def _loader(self, split: str, shuffle: bool):
        raise NotImplementedError

    def train_dataloader(self):
        return self._loader("train", shuffle=True)

    def val_dataloader(self):
        return self._loader("validation", shuffle=False)

    def test_dataloader(self):
        return self._loader("test", shuffle=False)

    def predict_dataloader(self) -> torch.utils.data.DataLoader:
        """Batches {"input_ids", "attention_mask", "text", "index"} of the predict_file's inputs, in file order."""
        if not self.predict_file:
            raise ValueError(
                "predict needs inputs: --data.predict_file FILE, a text file with one input (a prompt, a source "
                'sentence, a passage) per line or a JSONL file whose lines hold a "text" field'
            )
        texts = read_inputs(self.predict_file)
        eos = self.eos_token_id
        rows = [encode_input(self.tokenizer, t, encoder_decoder=self.encoder_decoder, eos_token_id=eos) for t in texts]
        rows = [row[: self.max_input_length] for row in rows]

        def collate(indices: list[int]) -> dict:
            ids, mask = pad_right([rows[i] for i in indices], self.pad_token_id)
            return {"input_ids": ids, "attention_mask": mask, "text": [texts[i] for i in indices], "index": indices}

        return torch.utils.data.DataLoader(
            range(len(texts)), batch_size=self.predict_batch_size, shuffle=False, collate_fn=collate
        )


def read_inputs(path: str | Path, field: str = "text") -> list[str]:
    """The inputs of a predict run: a .jsonl/.json file's `field` per line, or else every line of a text file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"predict_file {str(path)!r} does not exist; give a text file with one input per line")
    lines = path.read_text(encoding="utf-8").splitlines()
    if path.suffix not in (".jsonl", ".json"):
        return lines
    texts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number} is not valid JSON ({error.msg}); write one object per line") from None
        if not isinstance(row, dict) or not isinstance(row.get(field), str):
            raise ValueError(f'{path}:{number} has no string field "{field}"; write lines like {{"{field}": "..."}}')
        texts.append(row[field])
    if not texts:
        raise ValueError(f"predict_file {str(path)!r} holds no input")
    return texts
