"""The one reader every DataModule reads through (data/sources.py): folders `datasets` saved, dotted columns,
the one held-out carving, and the errors that name what is wrong and the fix."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import datasets
import pytest

from lit_transformer.data import ClassificationDataModule, corpora
from lit_transformer.data.sources import CorpusStream, LabelledStream, PairStream, RowStream, held_out_split


def test_a_folder_datasets_saved_is_read_with_its_splits(tmp_path):
    """It used to end in a raw DatasetGenerationError: save_to_disk's arrow files are not a builder's input."""
    train = [{"text": f"line {i}", "label": "a" if i % 2 else "b"} for i in range(40)]
    saved = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(train), "test": datasets.Dataset.from_list(train[:5])}
    )
    saved.save_to_disk(str(tmp_path / "saved"))
    stream = CorpusStream(str(tmp_path / "saved"))
    assert stream.missing == ["validation"]
    assert len(list(stream.documents("train"))) + len(list(stream.documents("validation"))) == 40
    labelled = LabelledStream(str(tmp_path / "saved"))
    assert [r.label for r in labelled.records_of("test")] == ["b", "a", "b", "a", "b"]
    datasets.Dataset.from_list(train).save_to_disk(str(tmp_path / "one"))  # a Dataset: the training split
    assert CorpusStream(str(tmp_path / "one")).sources.keys() == {"train"}


def test_a_dotted_column_reaches_into_a_nested_field(tmp_path):
    rows = [{"translation": {"en": f"house {i}", "es": f"casa {i}"}, "id": i} for i in range(30)]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    stream = PairStream(str(path), source_column="translation.en", target_column="translation.es")
    pairs = [p for split in ("train", "validation", "test") for p in stream.pairs(split)]
    assert sorted(pairs) == sorted((f"house {i}", f"casa {i}") for i in range(30))
    rows_stream = RowStream(str(path), ["translation.es"], "translation.es")
    assert {r.values["translation.es"] for _, r in rows_stream.all_rows()} == {f"casa {i}" for i in range(30)}


def test_a_missing_column_names_the_columns_there_are(tmp_path):
    path = tmp_path / "train.csv"
    path.write_text("review,stars\ngood,5\n")
    with pytest.raises(ValueError, match=r"has no column 'text', 'label'; its columns are \['review', 'stars'\]"):
        LabelledStream(str(path))
    LabelledStream(str(path), text_column="review", label_column="stars")


def test_one_carving_by_content_hash_keeps_the_kjv_layout():
    """KJV-RV1909's verse keys were split 0-1 test, 2-3 validation of 100 md5 buckets: the one carving keeps that."""
    for key in (f"Gen.{c}.{v}" for c in range(1, 30) for v in range(1, 30)):
        bucket = int(hashlib.md5(key.encode()).hexdigest(), 16) % 100
        old = "test" if bucket < 2 else "validation" if bucket < 4 else "train"
        assert corpora.split_of(key) == old == held_out_split(key, missing=("test", "validation"), held_out=0.02)


def test_the_embedded_corpora_are_one_table():
    assert set(corpora.EMBEDDED) == {"shakespeare", "shakespeare-genre", "kjv-rv1909", "digits"}
    assert corpora.embedded("not-a-corpus", cache_dir=None) is None


def test_a_label_seen_at_test_but_not_in_training_is_named_with_the_fix(tmp_path):
    (tmp_path / "train.csv").write_text("text,label\n" + "".join(f"t{i},{'ab'[i % 2]}\n" for i in range(20)))
    (tmp_path / "valid.csv").write_text("text,label\nv,a\n")
    (tmp_path / "test.csv").write_text("text,label\nx,a\ny,zebra\n")
    dm = ClassificationDataModule(str(tmp_path), tokenizer="char", vocab_size=60, cache_dir=str(tmp_path / "c"))
    with pytest.raises(ValueError, match=r"test: label 'zebra' is not one of .*add training rows labelled 'zebra'"):
        dm.label_ids("test")


def test_an_empty_split_names_the_split_and_why(tmp_path):
    (tmp_path / "data.csv").write_text("text,label\nonly one,a\n")
    dm = ClassificationDataModule(str(tmp_path / "data.csv"), tokenizer="char", cache_dir=str(tmp_path / "c"))
    with pytest.raises(ValueError, match=r"The validation split .* is empty: carved from train, 10% .* got none"):
        dm.rows()


def _config(data_class: str, data_args: dict, model_config: dict):
    from jsonargparse import Namespace

    return Namespace(
        data=Namespace(class_path=f"lit_transformer.data.{data_class}", init_args=Namespace(**data_args)),
        model=Namespace(config=Namespace(**model_config)),
    )


def test_the_data_sets_the_image_geometry_once_and_a_mismatch_names_both_keys():
    from lit_transformer.cli import set_once

    data = {"image_size": (8, 48), "channels": 1, "features_dir": None, "max_caption_tokens": 16}
    config = _config("CaptioningDataModule", data, {"source": "patches", "image_size": None, "image_channels": 3,
                                                     "max_seq_len": 32})  # fmt: skip
    set_once(config)
    assert config.model.config.image_size == [8, 48] and config.model.config.image_channels == 1
    config = _config("CaptioningDataModule", data, {"source": "patches", "image_size": [8, 40], "max_seq_len": 32})
    with pytest.raises(ValueError, match=r"data.init_args.image_size=\[8, 48\] and model.config.image_size=\[8, 40\]"):
        set_once(config)


@pytest.mark.parametrize("suffix", [".npy", ".safetensors"])
def test_the_features_width_sets_source_dim_once_and_a_mismatch_names_the_folder(tmp_path: Path, suffix: str):
    import numpy as np
    import torch
    from safetensors.torch import save_file

    from lit_transformer.cli import set_once

    features = tmp_path / "features"
    features.mkdir()
    for stem in ("a", "b"):
        if suffix == ".npy":
            np.save(features / f"{stem}.npy", np.zeros((3, 7), dtype=np.float32))
        else:
            save_file({"features": torch.zeros(3, 7)}, str(features / f"{stem}.safetensors"))
    data = {"image_size": (8, 48), "channels": 1, "features_dir": str(features), "max_caption_tokens": 16}
    config = _config("CaptioningDataModule", data, {"source": "features", "source_dim": None, "max_seq_len": 32})
    set_once(config)
    assert config.model.config.source_dim == 7
    config = _config("CaptioningDataModule", data, {"source": "features", "source_dim": 5, "max_seq_len": 32})
    with pytest.raises(ValueError, match=rf"data.init_args.features_dir={features} gives source_dim=7 and "
                                         r"model.config.source_dim=5.*leave model.config.source_dim unset"):  # fmt: skip
        set_once(config)
    empty = {**data, "features_dir": str(tmp_path / "none")}  # no files: setup names the missing image instead
    config = _config("CaptioningDataModule", empty, {"source": "features", "source_dim": 5, "max_seq_len": 32})
    set_once(config)
    assert config.model.config.source_dim == 5


def test_learned_positions_too_few_for_the_data_name_both_keys():
    from lit_transformer.cli import set_once

    config = _config("TranslationDataModule", {"max_length": 256}, {"max_seq_len": 128, "positions": "learned"})
    with pytest.raises(ValueError, match=r"data.init_args.max_length=256 needs 256 .* model.config.max_seq_len=128"):
        set_once(config)
