"""Which records of a fixed input land in validation and test when a source has only a training split: a literal
answer written down once, checked here in this process and in a fresh one with another hash seed. A carving that
moved (a changed hash, bucket count or order of splits) fails, and so does one keyed on Python's per-process
`hash()`, which a comparison of two DataModules in one process cannot see.

Read through the DataModules' public views of their splits: LanguageModelingDataModule.texts(),
ClassificationDataModule.rows() and TranslationDataModule.pairs().
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WORDS = ["apple", "river", "stone", "cloud", "ember", "maple", "orbit"]
RECORDS = [
    f"record {i} of the fixed input, {WORDS[i % 7]} {WORDS[(3 * i) % 7]}" for i in range(240)
]  # LM carves by hash from 200 documents on

# Record indices of each carved split, for each DataModule (train holds every other record). Written down once; a
# change here is a change of every user's held-out splits (and of their prepared caches).
EXPECTED = {
    "language_modeling": {  # 5% each
        "validation": [4, 10, 38, 52, 103, 106, 118, 121, 131, 136, 176, 181, 197, 225, 229],
        "test": [12, 27, 48, 54, 58, 68, 73, 116, 117, 155, 182, 226],
    },
    "classification": {  # held_out=0.1: validation is the two 5% shares above (the same texts, the same buckets)
        "validation": [4, 10, 12, 27, 38, 48, 52, 54, 58, 68, 73, 103, 106, 116, 117, 118, 121, 131, 136, 155, 176,
                       181, 182, 197, 225, 226, 229],
        "test": [3, 11, 21, 22, 24, 37, 69, 77, 78, 79, 90, 92, 96, 113, 123, 124, 130, 135, 171, 177, 184, 190, 191,
                 192, 214, 215],
    },
    "translation": {  # a pair hashes its two sides joined by a tab
        "validation": [65, 109, 131, 132, 137, 145, 157, 203, 215, 216],
        "test": [7, 125, 148, 227, 237],
    },
}  # fmt: skip


def _write(folder: Path) -> None:
    """One training file per DataModule, no validation or test file: both are carved from it."""
    for name in ("lm", "clf", "mt"):
        (folder / name).mkdir(parents=True, exist_ok=True)
    (folder / "lm" / "train.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in RECORDS))
    labelled = (json.dumps({"text": t, "label": "ab"[i % 2]}) + "\n" for i, t in enumerate(RECORDS))
    (folder / "clf" / "train.jsonl").write_text("".join(labelled))
    (folder / "mt" / "train.tsv").write_text("en\tfr\n" + "".join(f"{t}\t{t.upper()}\n" for t in RECORDS))


def carved(folder: Path) -> dict[str, dict[str, list[int]]]:
    """{DataModule: {split: record indices}} of the fixed input written under `folder`."""
    from lit_transformer.data import ClassificationDataModule, LanguageModelingDataModule, TranslationDataModule

    _write(folder)
    cache = {"tokenizer": "char", "cache_dir": str(folder / "cache")}
    index = {t: i for i, t in enumerate(RECORDS)}
    texts = LanguageModelingDataModule(dataset=str(folder / "lm"), **cache).texts()
    rows = ClassificationDataModule(dataset=str(folder / "clf"), held_out=0.1, **cache).rows()
    pairs = TranslationDataModule(dataset=str(folder / "mt"), source_lang="en", target_lang="fr", **cache).pairs()
    found = {
        "language_modeling": {split: texts[split] for split in ("train", "validation", "test")},
        "classification": {split: rows[split][0] for split in ("train", "validation", "test")},
        "translation": {split: pairs[split][0] for split in ("train", "validation", "test")},
    }
    for name, splits in found.items():  # each record in exactly one split
        assert sorted(index[t] for texts in splits.values() for t in texts) == list(range(len(RECORDS))), name
    return {
        name: {s: sorted(index[t] for t in splits[s]) for s in ("validation", "test")} for name, splits in found.items()
    }


def test_the_carved_splits_are_the_written_ones(tmp_path: Path) -> None:
    assert carved(tmp_path) == EXPECTED


@pytest.mark.slow
def test_a_fresh_process_with_another_hash_seed_carves_the_same(tmp_path: Path) -> None:
    seed = "7" if os.environ.get("PYTHONHASHSEED") != "7" else "8"
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
    code = (
        f"import json, pathlib, test_split_reference as t; print(json.dumps(t.carved(pathlib.Path({str(tmp_path)!r}))))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == EXPECTED
