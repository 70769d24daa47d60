"""ClassificationDataModule: local formats, label names, batch layout and padding, and the embedded genre task."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lit_transformer.data import ClassificationDataModule, corpora
from lit_transformer.data.sources import hash_bucket

ROWS = [
    ("what a merry jest, good sir", "comedy"),
    ("the king is dead, long live the king", "history"),
    ("o woe, the poison works", "tragedy"),
    ("a wedding and a dance", "comedy"),
]


def rows(n: int) -> list[dict]:
    return [{"text": f"{ROWS[i % 4][0]} {'la ' * (i % 7)}{i}", "label": ROWS[i % 4][1]} for i in range(n)]


def write(folder, fmt: str, sizes=(("train", 80), ("valid", 12), ("test", 12))):
    folder.mkdir(exist_ok=True)
    for split, n in sizes:
        data = rows(n)
        path = folder / f"{split}.{fmt}"
        if fmt == "jsonl":
            path.write_text("".join(json.dumps(r) + "\n" for r in data))
        elif fmt in ("csv", "tsv"):
            sep = "," if fmt == "csv" else "\t"
            path.write_text("text" + sep + "label\n" + "".join(f'"{r["text"]}"{sep}{r["label"]}\n' for r in data))
        else:
            import datasets

            datasets.Dataset.from_list(data).to_parquet(str(path))
    return folder


def make(tmp_path, dataset, **kwargs) -> ClassificationDataModule:
    args = dict(tokenizer="char", vocab_size=100, batch_size=8, cache_dir=str(tmp_path / "cache"))
    return ClassificationDataModule(dataset=str(dataset), **{**args, **kwargs})


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl", "parquet"])
def test_local_files_give_padded_batches_with_masks_and_label_ids(tmp_path, fmt: str):
    dm = make(tmp_path, write(tmp_path / "d", fmt))
    assert dm.label_names == ["comedy", "history", "tragedy"]  # from the data, sorted
    assert dm.num_labels == 3
    assert dm.mask_token_id == dm.vocab_size - 1  # <mask> added after the trained vocabulary
    dm.prepare_data()
    dm.setup()
    seen = 0
    for batch in dm.train_dataloader():
        ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
        assert ids.shape == mask.shape and mask.dtype == torch.bool and labels.shape == (len(ids),)
        assert (ids[~mask] == dm.pad_token_id).all()
        assert mask[:, 0].all()
        seen += len(ids)
    assert seen == 80
    texts, names = dm.rows()["test"]
    first = next(iter(dm.test_dataloader()))
    # The first test batch holds texts of the shortest lengths; each label id names its text's label.
    for ids, mask, label in zip(first["input_ids"], first["attention_mask"], first["labels"], strict=True):
        text = dm.tokenizer.decode(ids[mask].tolist())
        assert names[texts.index(text)] == dm.label_names[label]


@pytest.mark.parametrize("batch_size", [None, 5, "not given"])
def test_a_token_budget_besides_batch_size_keeps_both(tmp_path, batch_size):
    """data.init_args.max_tokens is a token budget "instead of (or besides) batch_size": given both, a batch holds
    at most batch_size texts (batch_size was ignored: 80 short texts came in batches of up to 49); every text is
    read once an epoch either way. batch_size not given leaves the budget alone (its default of 32 texts, taken for
    a given one, capped every token-budget batch at 32)."""
    args = {} if batch_size == "not given" else {"batch_size": batch_size}
    dataset = str(write(tmp_path / "d", "jsonl"))
    dm = ClassificationDataModule(dataset=dataset, tokenizer="char", vocab_size=100, cache_dir=str(tmp_path / "cache"),
                                  max_tokens=2048, **args)  # fmt: skip
    dm.prepare_data()
    dm.setup()
    sizes = []
    for batch in dm.train_dataloader():
        sizes.append(len(batch["input_ids"]))
        assert len(batch["input_ids"]) * batch["input_ids"].shape[1] <= 2048
    assert sum(sizes) == 80
    assert max(sizes) <= 5 if batch_size == 5 else max(sizes) > 32


@pytest.mark.parametrize("vocab_size, warned", [(12, True), (100, False)])
def test_texts_the_tokenizer_has_no_token_for_are_named_in_a_warning(tmp_path, recwarn, vocab_size, warned):
    """As for a language model: a classifier's texts encoded largely as <unk> (a char tokenizer smaller than their
    alphabet) are named in a warning with the fix; a tokenizer that covers them says nothing."""
    dm = make(tmp_path, write(tmp_path / "d", "jsonl"), vocab_size=vocab_size)
    dm.prepare_data()
    dm.setup()
    messages = [str(w.message) for w in recwarn if "<unk>" in str(w.message)]
    assert len(messages) == warned
    if warned:
        assert "of the training tokens are <unk>: the tokenizer has no token for" in messages[0]
        assert "vocab_size=12 most frequent characters" in messages[0]


def test_one_class_and_a_list_label_without_multi_label_are_refused_before_training(tmp_path):
    """Training rows of one class ended in torchmetrics' traceback (num_classes must be larger than 1); a list label
    in single-label data became a class named "['comedy', 'tragedy']". Each is refused naming the fix."""
    from lit_transformer.data.sources import DataFileError
    from lit_transformer.errors import ConfigError

    one = tmp_path / "one.jsonl"
    one.write_text("".join(json.dumps({"text": f"a merry jest {i}", "label": "comedy"}) + "\n" for i in range(40)))
    with pytest.raises(DataFileError, match=r"the training split has one class, \['comedy'\]: a classifier tells two"):
        _ = make(tmp_path, one).label_names
    with pytest.raises(ConfigError, match="label_names gives one class"):
        _ = make(tmp_path, write(tmp_path / "d", "jsonl"), label_names=["comedy"]).label_names
    listed = tmp_path / "listed.jsonl"
    data = rows(40)
    data[3]["label"] = ["comedy", "tragedy"]
    listed.write_text("".join(json.dumps(r) + "\n" for r in data))
    with pytest.raises(DataFileError, match=r"labelled with a list, \['comedy', 'tragedy'\].*multi_label true"):
        _ = make(tmp_path, listed).label_names
    assert make(tmp_path, listed, multi_label=True).label_names == ["comedy", "history", "tragedy"]


def test_labels_that_differ_only_in_spaces_or_case_are_refused(tmp_path):
    """ "pos", "pos " and "Pos" were three classes, without a word (a CSV typed by hand, an export with padding)."""
    from lit_transformer.data.sources import DataFileError

    path = tmp_path / "spaced.jsonl"
    labels = ["pos", "neg", "pos ", "Neg"]
    path.write_text("".join(json.dumps({"text": f"a line {i}", "label": labels[i % 4]}) + "\n" for i in range(80)))
    with pytest.raises(DataFileError, match=r"labels that differ only in spaces or case, \['Neg', 'neg'\]"):
        _ = make(tmp_path, path).label_names
    assert make(tmp_path, path, label_names=["neg", "pos", "pos ", "Neg"]).label_names[2] == "pos "  # given: kept


@pytest.mark.parametrize("held_out", [None, 0.2])
def test_a_missing_validation_and_test_split_is_carved_by_hash(tmp_path, held_out):
    """Each missing held-out split takes its share of the hash buckets: 10% each by default (this DataModule's
    documented default, not the streams' 5%), in order validation then test; labels follow their texts."""
    kwargs = {} if held_out is None else {"held_out": held_out}
    dm = make(tmp_path, write(tmp_path / "d", "jsonl", sizes=(("train", 300),)), **kwargs)
    share = int(100 * (held_out or 0.1))
    texts = [r["text"] for r in rows(300)]
    expected = {
        "validation": [t for t in texts if hash_bucket(t) < share],
        "test": [t for t in texts if share <= hash_bucket(t) < 2 * share],
        "train": [t for t in texts if hash_bucket(t) >= 2 * share],
    }
    assert {split: carved for split, (carved, _) in dm.rows().items()} == expected
    labels = dict(zip(texts, (r["label"] for r in rows(300)), strict=True))
    assert all(labels[t] == y for split in dm.rows().values() for t, y in zip(*split, strict=True))
    with pytest.raises(ValueError, match="held_out=0.5 must be between 0 and 0.5"):
        make(tmp_path, write(tmp_path / "d", "jsonl"), held_out=0.5)


def test_given_label_names_fix_the_order_and_an_unknown_label_is_named(tmp_path):
    dm = make(tmp_path, write(tmp_path / "d", "jsonl"), label_names=["tragedy", "history", "comedy"])
    assert dm.label_ids("train")[:3].tolist() == [2, 1, 0]
    dm = make(tmp_path, write(tmp_path / "e", "jsonl"), label_names=["comedy", "history"])
    with pytest.raises(ValueError, match="'tragedy' is not one of the label names"):
        dm.label_ids("train")


def test_multi_label_rows_become_zero_one_targets(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    data = [{"text": f"text {i}", "label": ["a", "b"] if i % 3 == 0 else ["c"]} for i in range(40)]
    for split in ("train", "valid", "test"):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
    dm = make(tmp_path, folder, multi_label=True)
    assert dm.label_names == ["a", "b", "c"]
    batch = next(iter(dm.train_dataloader()))
    assert batch["labels"].shape == (len(batch["input_ids"]), 3) and batch["labels"].dtype == torch.float32
    assert dm.label_counts() == [14, 14, 26]


def test_a_hub_name_offline_fails_fast_naming_the_dataset(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(ConnectionError) as error:
        make(tmp_path, "imdb").rows()
    message = str(error.value)
    assert "'imdb'" in message and "offline" in message and "local files" in message


def test_genre_task_splits_by_play_stratified_by_genre():
    data = corpora.shakespeare_genre()
    works = {split: set(data[split]["work"]) for split in data}
    assert not works["train"] & works["validation"] and not works["train"] & works["test"]
    assert not works["validation"] & works["test"]
    assert sum(map(len, works.values())) == 36  # the Folio's plays; the poems and Pericles are left out
    for split in ("validation", "test"):
        genres = sorted(corpora.FOLIO_GENRES[w] for w in works[split])
        assert genres == ["comedy", "comedy", "history", "history", "tragedy", "tragedy"]
    passage = data["train"][0]["text"]
    assert len(passage.splitlines()) == 8
    # No passage text is shared between train and test (near-duplicates stay within a play).
    assert not set(data["train"]["text"]) & set(data["test"]["text"])


def test_genre_batches_pad_less_than_ten_percent(tmp_path):
    dm = ClassificationDataModule(tokenizer="byte_bpe", vocab_size=1024, cache_dir=str(tmp_path / "cache"))
    assert dm.label_names == ["comedy", "history", "tragedy"]
    assert dm.padding_fraction("train") < 0.10
    majority = dm.majority_baseline("test")
    counts = np.bincount(dm.label_ids("test"), minlength=3)
    assert majority == pytest.approx(counts[int(np.argmax(dm.label_counts()))] / counts.sum())


@pytest.mark.parametrize("sample_chars", [50, 10**6])
def test_a_csv_is_read_at_most_twice_per_preparation_labels_in_the_tokenizer_pass(tmp_path, monkeypatch, sample_chars):
    """A pass for the tokenizer's sample that collects the labels too, then the shard pass: never a third read
    (once the tokenizer's sample is full the first pass reads on for the labels alone)."""
    from lit_transformer.data import classification, sources

    reads: list[str] = []
    original = sources.records

    def counted(path, *args, **kwargs):
        reads.append(str(path))
        return original(path, *args, **kwargs)

    monkeypatch.setattr(classification, "records", counted)  # the labelled stream reads through it
    folder = write(tmp_path / "d", "csv", sizes=(("train", 200),))
    dm = make(tmp_path, folder, tokenizer="byte_bpe", vocab_size=300)
    dm.tokenizer_sample_chars = sample_chars
    assert dm.vocab_size > 0 and dm.num_labels == 3
    dm.prepare_data()
    dm.setup()
    assert reads.count(str(folder / "train.csv")) == 2, reads
    assert dm.label_names == ["comedy", "history", "tragedy"]


def test_a_class_whose_only_rows_were_carved_out_names_the_carving(tmp_path):
    """A class of one row that the hash split sent to validation was answered "add training rows labelled it": the
    user's file held that row."""
    from lit_transformer.data.sources import DataFileError

    path = tmp_path / "rare.jsonl"
    data = [{"text": f"a common line {i}", "label": "ab"[i % 2]} for i in range(300)]
    data += [{"text": f"a rare line {i}", "label": f"rare{i}"} for i in range(30)]
    path.write_text("".join(json.dumps(row) + "\n" for row in data))
    dm = make(tmp_path, path)
    dm.prepare_data()
    with pytest.raises(
        DataFileError, match=r"split is carved from the training data by a hash of each row, and every row"
    ):
        for split in ("validation", "test"):
            dm.label_ids(split)


def test_rows_left_out_for_a_blank_text_or_label_are_counted_in_a_warning(tmp_path):
    """A test file of 12 rows, 4 of them unlabelled, was scored on 8 without a word (translation warns of its pairs
    with an empty side)."""
    folder = write(tmp_path / "data", "jsonl")
    test = [json.loads(line) for line in (folder / "test.jsonl").read_text().splitlines()]
    for row in test[:3]:
        row["label"] = ""
    test[3]["text"] = "  "
    (folder / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in test))
    with pytest.warns(UserWarning, match=r"left out 4 rows with a blank 'text' or an empty 'label' \(test: 4\)"):
        dm = make(tmp_path, folder)
        dm.setup()
    assert len(dm._datasets["test"]) == 8
