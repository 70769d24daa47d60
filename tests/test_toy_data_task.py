"""A new data task is one file: this one. It reads rows of two numbers (a, b) from a CSV, makes each the text
"a+b=c", and serves padded next-token batches to the language-modelling task, through the shared pieces alone (the
one reader and its carving, the shard writer, the resumable loader); then it trains and predicts through the CLI.

If adding a task needed a change anywhere else in data/, this test could not be written without it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from test_cli import _cli

from lit_transformer.data.base import DataModule
from lit_transformer.data.loaders import RecordShards, ResumableLoader, fixed_size_batches, load_prepared
from lit_transformer.data.shards import RecordKind, prepare
from lit_transformer.data.sources import SplitStream, records

pytestmark = pytest.mark.slow


# ---- the task: its record, its stream (columns -> record), its shard layout, its Dataset and collate ---------------


@dataclass
class Sum:
    text: str
    document: int
    nbytes: int
    last = True

    @property
    def texts(self) -> tuple[str]:
        return (self.text,)


class SumStream(SplitStream):
    key, local_hint = "toy-sums", "(.csv files with columns a and b)"

    def _columns(self) -> list[str]:
        return ["a", "b"]

    def _settings(self) -> tuple:
        return ()

    def routed(self, source_name: str, skip: int = 0) -> Iterator[tuple[str, Sum]]:
        number = 0
        for path in self.sources[source_name].files:
            for row, nbytes, _ in records(path, ["a", "b"], self.encoding):
                if number >= skip:
                    a, b = int(row["a"]), int(row["b"])
                    text = f"{a}+{b}={a + b}"
                    yield self.owner(source_name, text), Sum(text, number, nbytes)
                number += 1


class SumKind(RecordKind):
    folder, tag, sides, starts, counter = "toy-sums", "toy-sum-shards", ("",), "texts.npy", "rows"
    summed = ("texts", "tokens")

    def starts_array(self, starts: list[np.ndarray], tokens: list[int]) -> np.ndarray:
        return np.concatenate([starts[0], np.array([tokens[0]], dtype=np.int64)])

    def shard_entry(self, name: str, tokens: list[int], records: int) -> dict:
        return {"name": name, "texts": records, "tokens": tokens[0]}

    def summary(self, indexes: dict[str, dict]) -> str:
        return f"sums { {s: i['texts'] for s, i in indexes.items()} }"


class SumRows(torch.utils.data.Dataset):
    def __init__(self, shards: RecordShards) -> None:
        self.shards = shards

    def __len__(self) -> int:
        return len(self.shards)

    def __getitem__(self, index: int) -> np.ndarray:
        return self.shards.read([index])[0]


class NextTokens:
    """Rows (each sum's ids, then EOS) padded into {"input_ids", "attention_mask", "labels"}; a plain object so that
    it pickles."""

    def __init__(self, pad: int) -> None:
        self.pad = pad

    def __call__(self, rows: list[np.ndarray]) -> dict[str, torch.Tensor]:
        longest = max(len(r) for r in rows) - 1
        ids = torch.full((len(rows), longest), self.pad, dtype=torch.long)
        labels = torch.full((len(rows), longest), -100, dtype=torch.long)
        for b, row in enumerate(rows):
            row = torch.from_numpy(row.astype(np.int64))
            ids[b, : len(row) - 1], labels[b, : len(row) - 1] = row[:-1], row[1:]
        return {"input_ids": ids, "attention_mask": labels != -100, "labels": labels}


class SumDataModule(DataModule):
    """Sums as text, for the language-modelling task: its own arguments, the base's, nothing else."""

    def __init__(
        self,
        dataset: str,
        tokenizer: str = "char",
        vocab_size: int = 32,
        batch_size: int = 8,
        seed: int = 42,
        cache_dir: str | None = None,
        predict_file: str | None = None,
    ) -> None:
        super().__init__(
            dataset, tokenizer=tokenizer, vocab_size=vocab_size, batch_size=batch_size, seed=seed,
            cache_dir=cache_dir, predict_file=predict_file,
        )  # fmt: skip
        self._stream: SumStream | None = None
        self._root: Path | None = None

    @property
    def stream(self) -> SumStream:
        if self._stream is None:
            self._stream = SumStream(self.dataset, held_out=0.1, encoding=self.encoding)
        return self._stream

    def tokenizer_texts(self) -> list[str]:
        return [record.text for record in self.stream.records_of("train")]

    def prepare(self) -> Path:
        if self._root is None:
            tokenizer = self.tokenizer
            info = {"vocab_size": tokenizer.get_vocab_size()}
            self._root = prepare(
                self.stream, SumKind(), (tokenizer,), (self._tokenizer_keys[0],), self.cache_dir, info,
                self.eos_token_id,
            )  # fmt: skip
        return self._root

    def loader(self, split: str, shuffle: bool) -> ResumableLoader:
        shards = load_prepared(self.prepare(), RecordShards)[1][split]
        batches = fixed_size_batches(len(shards), self.batch_size, self.seed, shuffle=shuffle, drop_last=False)
        return ResumableLoader(SumRows(shards), batches, NextTokens(self.pad_token_id), shuffle=shuffle, seed=self.seed)


# ---- through the CLI ------------------------------------------------------------------------------------------------


def test_a_data_task_defined_in_one_file_trains_and_predicts_through_the_cli(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    pairs = rng.integers(0, 50, size=(300, 2))
    (tmp_path / "sums.csv").write_text("a,b\n" + "".join(f"{a},{b}\n" for a, b in pairs))
    (tmp_path / "prompts.txt").write_text("12+7=\n3+3=\n")
    config = {
        "seed_everything": 1,
        "model": {
            "config": {
                "topology": "decoder_only",
                "d_model": 32,
                "n_heads": 2,
                "n_layers": 1,
                "d_ff": 64,
                "max_seq_len": 16,
                "dropout": 0.0,
            },  # fmt: skip
            "optim": {"lr": 1.0e-3, "schedule": "constant", "warmup_steps": 1},
            "generation": {"max_new_tokens": 4},
        },
        "data": {
            "class_path": f"{__name__}.SumDataModule",
            "init_args": {"dataset": str(tmp_path / "sums.csv"), "cache_dir": str(tmp_path / "cache")},
        },
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "precision": "32-true",
            "max_steps": 4,
            "val_check_interval": 2,
            "check_val_every_n_epoch": None,
            "limit_val_batches": 2,
            "num_sanity_val_steps": 0,
            "logger": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "default_root_dir": str(tmp_path / "run"),
        },  # fmt: skip
        "checkpoint": {"dirpath": str(tmp_path / "run" / "checkpoints"), "every_n_train_steps": 2},
    }
    (tmp_path / "sums.yaml").write_text(yaml.safe_dump(config))
    _cli("fit", "--config", str(tmp_path / "sums.yaml"), cwd=tmp_path)
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()
    output = tmp_path / "predictions.jsonl"
    _cli(
        "predict", "--config", str(tmp_path / "sums.yaml"), "--ckpt_path", str(ckpt),
        "--data.init_args.predict_file", str(tmp_path / "prompts.txt"), "--predictions.output", str(output),
        cwd=tmp_path,
    )  # fmt: skip
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert [r["input"] for r in rows] == ["12+7=", "3+3="]
    assert all(isinstance(r["output"], str) and len(r["tokens"]) <= 4 for r in rows)
    (prepared,) = [p for p in (tmp_path / "cache" / "toy-sums").iterdir() if p.is_dir()]  # predict reused fit's
    manifest = json.loads((prepared / "manifest.json").read_text())
    assert sum(manifest["splits"][s]["texts"] for s in ("train", "validation", "test")) == 300
