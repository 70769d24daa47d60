"""The one reader every DataModule reads through (data/sources.py): folders `datasets` saved, dotted columns,
the one held-out carving, and the errors that name what is wrong and the fix."""

from __future__ import annotations

import csv
import hashlib
import json
import re
from pathlib import Path

import datasets
import pytest

from lit_transformer.data import ClassificationDataModule, corpora, sources
from lit_transformer.data.cache import hash_file
from lit_transformer.data.classification import LabelledStream
from lit_transformer.data.language_modeling import CorpusStream
from lit_transformer.data.sources import RowStream, held_out_split
from lit_transformer.data.translation import PairStream


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
    from lit_transformer.cli.lightning_cli import set_once

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

    from lit_transformer.cli.lightning_cli import set_once

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
    from lit_transformer.cli.lightning_cli import set_once

    config = _config("TranslationDataModule", {"max_length": 256}, {"max_seq_len": 128, "positions": "learned"})
    with pytest.raises(ValueError, match=r"data.init_args.max_length=256 needs 256 .* model.config.max_seq_len=128"):
        set_once(config)


# ---- files as users keep them: compressed, with a byte order mark, in another encoding; and files that are not ----

COMPRESS = {".gz": "gzip", ".bz2": "bz2", ".xz": "lzma"}


def _compress(path: Path, suffix: str) -> Path:
    """`path` compressed into `path` + suffix (the plain file removed)."""
    import importlib

    packed = path.with_name(path.name + suffix)
    with importlib.import_module(COMPRESS[suffix]).open(packed, "wb") as handle:
        handle.write(path.read_bytes())
    path.unlink()
    return packed


ROWS = [{"text": f"a line, number {i} of caf\u00e9", "label": "a" if i % 3 else "b"} for i in range(40)]


def _write(folder: Path, form: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"train.{form}"
    if form == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    elif form in ("csv", "tsv"):
        sep = "," if form == "csv" else "\t"
        lines = ["text" + sep + "label"] + [f'"{r["text"]}"{sep}{r["label"]}' for r in ROWS]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    else:
        path.write_text("".join(r["text"] + "\n" for r in ROWS), encoding="utf-8")
    return path


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz"])
@pytest.mark.parametrize("form", ["jsonl", "csv", "tsv", "txt"])
def test_a_compressed_file_reads_as_its_plain_twin_and_a_folder_lists_it(tmp_path, form, suffix):
    plain = _write(tmp_path / "plain", form)
    packed = _compress(_write(tmp_path / "packed", form), suffix)
    assert sources.form_suffix(packed) == f".{form}" and sources.split_of(str(packed)) == "train"
    assert sources.local_files(str(tmp_path / "packed")) == [str(packed)]  # a folder's listing finds it
    if form == "txt":
        read = [list(CorpusStream(str(p)).documents(s)) for p in (plain, packed) for s in ("train", "test")]
        assert read[0] == read[2] and read[1] == read[3] and "caf\u00e9" in read[0][0]
    else:
        records = [[(r.text, r.label) for r in LabelledStream(str(p)).records_of("train")] for p in (plain, packed)]
        assert records[0] == records[1] and len(records[0]) > 30


def test_zstandard_files_read_when_zstandard_is_installed(tmp_path):
    zstandard = pytest.importorskip("zstandard")
    plain = _write(tmp_path / "plain", "jsonl")
    packed = tmp_path / "packed" / "train.jsonl.zst"
    packed.parent.mkdir()
    packed.write_bytes(zstandard.ZstdCompressor().compress(plain.read_bytes()))
    assert [r.text for r in LabelledStream(str(packed)).records_of("train")] == [
        r.text for r in LabelledStream(str(plain)).records_of("train")
    ]


def test_an_excel_csv_with_a_byte_order_mark_and_crlf_has_its_own_column_names(tmp_path):
    path = tmp_path / "reviews.csv"
    rows = [f'"great, really {i}",{"pos" if i % 2 else "neg"}' for i in range(30)]
    path.write_bytes(("Review Text,Rating\r\n" + "\r\n".join(rows) + "\r\n").encode("utf-8-sig"))
    assert sources.columns_of(str(path)) == ["Review Text", "Rating"]
    stream = LabelledStream(str(path), text_column="Review Text", label_column="Rating")
    texts = [r.text for s in ("train", "validation", "test") for r in stream.records_of(s)]
    assert sorted(texts) == sorted(f"great, really {i}" for i in range(30))  # no \r, no \ufeff
    (tmp_path / "train.jsonl").write_bytes(b"\xef\xbb\xbf" + b'{"text": "x"}\r\n{"text": "y"}\r\n')
    assert [row for row, _, _ in sources.records(str(tmp_path / "train.jsonl"))] == [{"text": "x"}, {"text": "y"}]


@pytest.mark.parametrize("form", ["txt", "csv", "jsonl"])
def test_bytes_that_are_not_utf8_stop_with_the_file_and_line_and_the_encoding_option_reads_them(
    tmp_path, form, monkeypatch
):
    monkeypatch.setattr(sources, "CHUNK_BYTES", 64)  # the bad line is past the first chunks of a text file
    path = tmp_path / f"train.{form}"
    lines = [f"plain line {i}" for i in range(30)]
    lines[20] = "caf\u00e9 au lait"
    if form == "csv":
        body = "text,label\n" + "".join(f"{line},x\n" for line in lines)
        line = 22
    elif form == "jsonl":
        body = "".join(json.dumps({"text": t, "label": "x"}, ensure_ascii=False) + "\n" for t in lines)
        line = 21
    else:
        body = "".join(t + "\n" for t in lines)
        line = 21
    path.write_bytes(body.encode("latin-1"))
    read = (
        (lambda **kw: CorpusStream(str(path), **kw)) if form == "txt" else lambda **kw: LabelledStream(str(path), **kw)
    )
    with pytest.raises(sources.DataFileError, match=rf"train\.{form}:{line} is not utf-8 text .*encoding latin-1"):
        for split in ("train", "validation", "test"):
            list(read().records_of(split))
    stream = read(encoding="latin-1")
    texts = "".join(r.texts[0] for s in ("train", "validation", "test") for r in stream.records_of(s))
    assert "caf\u00e9 au lait" in texts and "\ufffd" not in texts
    assert stream.content_key(hash_file) != read(encoding="cp1252").content_key(hash_file)


def test_an_encoding_that_is_not_line_by_line_is_refused_with_the_fix(tmp_path):
    with pytest.raises(ValueError, match="not read line by line.*iconv"):
        sources.check_encoding("utf-16")
    with pytest.raises(ValueError, match="not a text encoding"):
        sources.check_encoding("klingon")


TEXT = "In the beginning God created the heaven and the earth.\nAnd the earth was without form.\n"


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("train.txt", TEXT.encode("utf-16"), r"train\.txt is UTF-16 text \(it starts with that byte order mark\)"),
        ("train.txt", TEXT.encode("utf-16-le"), r"train\.txt is UTF-16LE text \(a zero byte after each character\)"),
        ("train.txt", TEXT.encode("utf-16-be"), r"train\.txt is UTF-16BE text \(a zero byte before each character\)"),
        ("train.txt", TEXT.encode("utf-32"), r"train\.txt is UTF-32 text .*iconv -f UTF-32 -t UTF-8"),
        ("train.csv", ("text,label\n" + TEXT.replace("\n", ",x\n")).encode("utf-16"), r"iconv -f UTF-16 -t UTF-8"),
        ("train.jsonl", '{"text": "a", "label": "x"}\n'.encode("utf-16"), r"train\.utf8\.jsonl \(Windows Notepad"),
    ],
)
def test_a_utf16_or_utf32_file_is_named_with_the_conversion(tmp_path, name, data, message):
    """Windows writes UTF-16 (Notepad's 'Unicode', PowerShell 5's >): named as such, not as binary data that "another
    encoding will not help", nor as an encoding to give (the reader splits lines at the byte 0x0A)."""
    (tmp_path / name).write_bytes(data)
    with pytest.raises(sources.DataFileError, match=message):
        stream = (CorpusStream if name.endswith(".txt") else LabelledStream)(str(tmp_path / name))
        for split in ("train", "validation", "test"):
            list(stream.records_of(split))


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        (
            "train.csv",
            b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8,
            r"train\.csv is a PNG image, not the text",
        ),  # binary
        (
            "train.csv",
            bytes(range(1, 256)) * 8,
            r"train\.csv:1 holds binary data \(control bytes\), not text: a \.csv file holds CSV text",
        ),
        ("train.csv", b"\x1f\x8b\x08\x00" + bytes(range(128, 256)), r"train\.csv is gzip data.*\(\.gz\)"),
        ("train.csv", b"text,label\nab\rcd,x\n", r"train\.csv:2 is not a CSV row \(new-line character"),
        ("train.jsonl.gz", b'{"text": "not gzip at all"}\n', r"train\.jsonl\.gz is not gzip data"),
        ("train.parquet", b"PAR1 this is no parquet", r"train\.parquet is not a parquet file"),
        ("train.json", b'[{"text": "a"},\n{"text": ', r"train\.json:2 is not valid JSON"),
    ],
)
def test_a_file_that_is_not_the_form_its_name_says_stops_with_the_file_and_row(tmp_path, name, data, message):
    (tmp_path / name).write_bytes(data)
    with pytest.raises(sources.DataFileError, match=message):
        stream = LabelledStream(str(tmp_path / name))
        for split in ("train", "validation", "test"):
            list(stream.records_of(split))


def test_the_content_key_of_utf8_files_is_the_key_caches_were_built_with(tmp_path):
    """The encoding enters the key only when it is not utf-8: every earlier cache stays valid."""
    path = _write(tmp_path, "txt")
    stream = CorpusStream(str(path))
    carving = ()
    parts = stream._source_parts(hash_file)
    expected = sources.fingerprint("corpus", 1, parts, *stream._settings(), stream.mode, *carving)
    assert stream.content_key(hash_file) == expected


def test_the_shared_modules_import_no_task_and_define_no_tasks_records():
    """sources, shards and loaders hold what every task shares: a task's record, stream, shard layout and reader live
    in its own file (language_modeling, translation, classification, captioning), so adding a task changes none of them."""
    import ast

    tasks = {"translation", "classification", "captioning", "language_modeling"}
    folder = Path(sources.__file__).parent
    for name in ("sources", "shards", "loaders"):
        tree = ast.parse((folder / f"{name}.py").read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not imported & tasks, (name, imported & tasks)
        classes = [n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
        assert not [
            c
            for c in classes
            if any(
                word in c for word in ("Pair", "Label", "Caption", "Corpus", "TokenShards", "ShardBlocks", "TextKind")
            )
        ], (name, classes)


def test_predict_inputs_read_as_users_keep_them(tmp_path):
    """A predict file may be compressed, carry a byte order mark and CRLF line ends, or be in another encoding."""
    import gzip

    with gzip.open(tmp_path / "prompts.txt.gz", "wb") as handle:
        handle.write("caf\u00e9 one\r\n\r\ntwo\r\n".encode("utf-8-sig"))
    assert sources.read_inputs(tmp_path / "prompts.txt.gz") == ["caf\u00e9 one", "", "two"]
    (tmp_path / "prompts.jsonl").write_bytes('{"text": "se\u00f1or"}\n'.encode("latin-1"))
    with pytest.raises(sources.DataFileError, match=r"prompts\.jsonl:1 is not utf-8 text"):
        sources.read_inputs(tmp_path / "prompts.jsonl")
    assert sources.read_inputs(tmp_path / "prompts.jsonl", encoding="latin-1") == ["se\u00f1or"]


@pytest.mark.parametrize("name,content", [("empty.txt", ""), ("empty.jsonl", "\n\n")])
def test_a_predict_file_without_inputs_is_refused(tmp_path, name, content):
    """Not a predict run that writes nothing (an empty line of a text file is an input: an unconditioned sample).
    read_inputs itself returns none: generate and translate refuse an empty file naming their own flag."""
    (tmp_path / name).write_text(content)
    with pytest.raises(sources.DataFileError, match=rf"predict_file '.*{name}' holds no input"):
        sources.predict_inputs(tmp_path / name)
    assert sources.read_inputs(tmp_path / name) == []
    (tmp_path / "blank.txt").write_text("\n")
    assert sources.predict_inputs(tmp_path / "blank.txt") == [""]


def test_a_file_beside_split_files_that_names_no_split_is_named_as_training_text(tmp_path):
    """eval.txt or a README beside train/valid/test files was trained on without a word."""
    import warnings

    folder = tmp_path / "corpus"
    folder.mkdir()
    for name in ("train.txt", "valid.txt", "test.txt", "README.md", "eval.txt"):
        (folder / name).write_text("some text\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stream = CorpusStream(str(folder))
    assert sorted(Path(f).name for f in stream.sources["train"].files) == ["README.md", "eval.txt", "train.txt"]
    told = [str(w.message) for w in caught if "read as training text" in str(w.message)]
    assert told == [f"{folder}: README.md, eval.txt are read as training text: a file's name picks its split when it "
                    "starts with the word train, valid, validation, val, dev, test (or a folder of that name holds it); rename "
                    "or move the others"]  # fmt: skip
    shards = tmp_path / "shards"
    shards.mkdir()
    for name in ("part-1.txt", "part-2.txt"):  # no file names a split: all training text, as documented
        (shards / name).write_text("some text\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        CorpusStream(str(shards))
    assert not [w for w in caught if "read as training text" in str(w.message)]


@pytest.mark.parametrize("spec", ["reviews", "reviews/**/*.jsonl"])
def test_files_in_folders_named_after_splits_are_those_splits(tmp_path, spec):
    """reviews/train/part-0.jsonl and reviews/test/part-0.jsonl (Hugging Face's layout of a split a folder): the test
    rows were trained on without a word, and validation and test were carved from train and test together."""
    for split, n in (("train", 60), ("test", 8)):
        (tmp_path / "reviews" / split).mkdir(parents=True)
        rows = [{"text": f"{split} review {i}", "label": ["pos", "neg"][i % 2]} for i in range(n)]
        (tmp_path / "reviews" / split / "part-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    stream = LabelledStream(str(tmp_path / spec))
    assert [r.text for r in stream.records_of("test")] == [f"test review {i}" for i in range(8)]
    assert stream.missing == ["validation"]
    assert not [r for r in stream.records_of("train") if r.text.startswith("test")]


def test_a_name_picks_its_split_by_the_whole_word():
    """A folder of books: valley_of_fear.txt and devil_in_the_white_city.txt went to validation, testament_of_youth.txt
    to test (their names start with val, dev, test), silently. The word must end where a letter would go on."""
    for name, split in [("train.txt", "train"), ("train-00001-of-00002.parquet", "train"), ("valid_2.csv", "validation"),
                        ("validation.jsonl", "validation"), ("val.txt", "validation"), ("dev.tsv", "validation"),
                        ("test.txt", "test"), ("test-checkpoint.csv", "test"), ("Test1.txt", "test")]:  # fmt: skip
        assert sources.split_of(name) == split, name
    for name in ("valley_of_fear.txt", "devil_in_the_white_city.txt", "testament_of_youth.txt", "trainspotting.txt",
                 "validity.csv", "developers.jsonl", "moby_dick.txt"):  # fmt: skip
        assert sources.split_of(name) == "train", name


def test_a_split_word_run_into_set_or_data_still_picks_its_split():
    """testset.txt and devset.txt picked test and validation by the old prefix rule; the whole-word rule read them as
    training text (a warning, then the test set trained on)."""
    for name, split in [("testset.txt", "test"), ("devset.jsonl", "validation"), ("valset.csv", "validation"),
                        ("test_set.txt", "test"), ("testdata.txt", "test"), ("testing.txt", "test"),
                        ("trainset.txt", "train")]:  # fmt: skip
        assert sources.split_of(name) == split, name
    for name in ("testament_of_youth.txt", "developers.jsonl", "settlement.txt", "devsetup.txt", "validity.csv"):
        assert sources.split_of(name) == "train", name


@pytest.mark.parametrize(
    "name, body, hint",
    [
        ("semi.csv", "id;text\n0;the king\n1;the queen\n", "its header is one column holding ';'"),
        ("nohdr.tsv", "the king is here\tel rey está aquí\nthe sea\tel mar\n", "these read as text, not column names"),
    ],
)
def test_a_header_that_is_not_one_says_why(tmp_path, name, body, hint):
    """A semicolon CSV was told to choose its one column ('id;text') with text_column, which would train on "0;the
    king" rows; a TSV without a header was told to choose among two sentences."""
    (tmp_path / name).write_text(body)
    with pytest.raises(sources.DataFileError, match=re.escape(hint)):
        LabelledStream(str(tmp_path / name))


def test_a_field_that_starts_with_a_quote_of_text_is_named_with_the_fix(tmp_path):
    """'"the king" he said<TAB>...' was refused as "not a TSV row ... is the file TSV text?": it is, with a quote
    that is text, which CSV's rules read as the start of a quoted field."""
    (tmp_path / "train.tsv").write_text('text\tlabel\nplain\ta\n"the king" he said\tb\n')
    with pytest.raises(sources.DataFileError, match=r"train\.tsv:3 .*a field that starts with a double quote is read"):
        stream = LabelledStream(str(tmp_path / "train.tsv"))
        list(stream.records_of("train"))


@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
def test_a_field_longer_than_the_csv_modules_default_limit_is_read(tmp_path, suffix):
    """A legal file with one text of 200,000 characters (a long document, a book chapter) was refused as "not a CSV
    row (field larger than field limit (131072)); is the file CSV text?": Python's csv module stops there by default."""
    delimiter = "\t" if suffix == ".tsv" else ","
    long = "a long line, " * 16_000 if suffix == ".csv" else "a long line " * 16_000
    cell = f'"{long}"' if suffix == ".csv" else long
    path = tmp_path / f"data{suffix}"
    path.write_text(f"text{delimiter}label\n{cell}{delimiter}pos\nshort{delimiter}neg\n")
    rows = [row for row, _, _ in sources.records(str(path))]
    assert rows == [{"text": long, "label": "pos"}, {"text": "short", "label": "neg"}]


def test_a_quote_never_closed_past_the_field_limit_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "CSV_FIELD_CHARS", 1000)
    before = csv.field_size_limit(1000)
    try:
        path = tmp_path / "data.csv"
        path.write_text('text,label\n"an open quote,pos\n' + "more text\n" * 200)
        with pytest.raises(sources.DataFileError, match=r"data\.csv:\d+ has a field of more than 1,000 characters"):
            list(sources.records(str(path)))
    finally:
        csv.field_size_limit(before)


def test_files_in_hidden_folders_are_left_out(tmp_path):
    """Jupyter's .ipynb_checkpoints/train-checkpoint.csv (a stale copy of train.csv) was read as more training rows,
    and its test-checkpoint.csv as more test rows: hidden files were left out, files in hidden folders were not."""
    folder = tmp_path / "reviews"
    (folder / ".ipynb_checkpoints").mkdir(parents=True)
    for split in ("train", "test"):
        body = "text,label\n" + "".join(f"{split} review {i},{['pos', 'neg'][i % 2]}\n" for i in range(20))
        (folder / f"{split}.csv").write_text(body)
        (folder / ".ipynb_checkpoints" / f"{split}-checkpoint.csv").write_text(body)
    assert sources.local_files(str(folder)) == [str(folder / "test.csv"), str(folder / "train.csv")]
    stream = LabelledStream(str(folder))
    assert len(list(stream.records_of("test"))) == 20


def test_a_row_folder_with_a_readme_names_it_and_the_glob_that_leaves_it_out(tmp_path):
    """A cloned Hugging Face dataset folder holds a README.md beside its rows: the refusal said only "not ['.md']",
    naming no file and no way around it."""
    folder = tmp_path / "reviews"
    folder.mkdir()
    rows = [{"text": f"review {i}", "label": ["pos", "neg"][i % 2]} for i in range(30)]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "README.md").write_text("# reviews\n")
    with pytest.raises(
        sources.DataFileError,
        match=re.escape(
            f"(README.md): move those out of the folder; or give a glob of the row files, e.g. '{folder}/**/*.jsonl'"
        ),
    ):
        LabelledStream(str(folder))
    assert len(list(LabelledStream(f"{folder}/**/*.jsonl").records_of("train"))) > 0
