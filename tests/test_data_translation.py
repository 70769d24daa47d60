"""TranslationDataModule: batch layout, token budget, filtering, and the embedded KJV-RV1909 corpus."""

import json

import numpy as np
import pytest
import torch

from lit_transformer.data import TranslationDataModule, corpora

PAIRS = [
    ("the house is red", "la casa es roja"),
    ("the dog sleeps", "el perro duerme"),
    ("I see the sea", "veo el mar"),
    ("good morning my friend", "buenos días mi amigo"),
]


def write_tsv(folder, lines=60, long=0):
    folder.mkdir(exist_ok=True)
    for split, n in (("train", lines), ("valid", 8), ("test", 8)):
        rows = ["en\tes"] + [f"{PAIRS[i % 4][0]} {i}\t{PAIRS[i % 4][1]} {i}" for i in range(n)]
        rows += ["word " * 200 + "\tpalabra"] * (long if split == "train" else 0)
        (folder / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    return folder


def make(tmp_path, dataset, **kwargs):
    args = dict(tokenizer="char", vocab_size=200, max_tokens=256, max_length=64, cache_dir=str(tmp_path / "cache"))
    return TranslationDataModule(dataset=str(dataset), **{**args, **kwargs})


@pytest.mark.parametrize("vocab_size", [16, 200])
def test_pairs_the_tokenizer_has_no_token_for_are_named_per_side(tmp_path, recwarn, vocab_size):
    """As for a language model, per side: a char tokenizer smaller than the pairs' alphabet warns once for the
    source and once for the target, naming the characters each lacks; one that covers them says nothing."""
    dm = make(tmp_path, write_tsv(tmp_path / "d"), vocab_size=vocab_size)
    dm.prepare_data()
    dm.setup()
    messages = [str(w.message) for w in recwarn if "<unk>" in str(w.message)]
    if vocab_size == 200:
        assert messages == []
        return
    assert len(messages) == 2
    source, target = messages
    assert "of the training source tokens are <unk>" in source and "of the training target tokens are <unk>" in target
    assert "'y'" in source and "'y'" not in target  # each side's characters from its own text: "my" is English
    assert "'j'" in target and "'j'" not in source  # and "roja" Spanish


def test_batch_layout(tmp_path):
    dm = make(tmp_path, write_tsv(tmp_path / "d"))
    dm.prepare_data()
    dm.setup()
    pad, bos, eos = dm.pad_token_id, dm.bos_token_id, dm.eos_token_id
    for batch in dm.train_dataloader():
        src, tgt_in, labels = batch["src"], batch["tgt_in"], batch["labels"]
        assert src.dtype == tgt_in.dtype == labels.dtype == torch.long
        assert tgt_in.shape == labels.shape and (tgt_in[:, 0] == bos).all()
        real = labels != -100
        assert torch.equal(real, tgt_in != pad)  # one label per real decoder input
        assert torch.equal(labels[:, :-1][real[:, 1:]], tgt_in[:, 1:][real[:, 1:]])  # labels = inputs shifted
        assert ((labels == eos).sum(1) == 1).all() and ((src == eos).sum(1) == 1).all()
        assert src.numel() <= 256 and tgt_in.numel() <= 256
    val = next(iter(dm.val_dataloader()))
    assert len(val["src_text"]) == len(val["ref_text"]) == len(val["src"])
    row = val["labels"][0]
    assert dm.decode(row[row >= 0]) == val["ref_text"][0]
    assert dm.decode(val["src"][0], target=False) == val["src_text"][0]
    # masks say what is real: built from lengths, not from token values
    assert torch.equal(val["src_mask"], val["src"] != dm.pad_token_id)
    assert torch.equal(val["tgt_mask"], val["tgt_in"] != dm.pad_token_id)
    # predict: sources encoded as in training (tokens, then EOS)
    (tmp_path / "sources.txt").write_text("the house is red\nI see the sea\n")
    dm.predict_file = str(tmp_path / "sources.txt")
    (batch,) = list(dm.predict_dataloader())
    assert batch["text"] == ["the house is red", "I see the sea"]
    first = batch["input_ids"][0][batch["attention_mask"][0]].tolist()
    assert first == dm.tokenizer.encode("the house is red", add_special_tokens=False).ids + [dm.eos_token_id]


def test_over_long_pairs_are_filtered_and_counted(tmp_path):
    dm = make(tmp_path, write_tsv(tmp_path / "d", long=3))
    with pytest.warns(UserWarning, match="dropped 3 of 63 pairs longer than max_length=64"):
        dm.setup()
    assert sum(len(b["src"]) for b in dm.train_dataloader()) == 60


def test_separate_vocabularies(tmp_path):
    dm = make(tmp_path, write_tsv(tmp_path / "d"), shared_vocab=False)
    assert dm.target_tokenizer is not dm.tokenizer
    assert dm.target_vocab_size == dm.target_tokenizer.get_vocab_size()
    assert "ñ" not in dm.tokenizer.get_vocab() and "í" in dm.target_tokenizer.get_vocab()


def test_separate_vocabularies_of_one_size_get_separate_embeddings(tmp_path):
    """shared_vocab false with two tokenizers of one size (each char tokenizer capped at 16 symbols): id i is
    another character on each side, so the model linked from the data keeps the source and target embeddings apart
    (they were one matrix: target_vocab_size == vocab_size read as one vocabulary). One id table still shares."""
    from lit_transformer.config import TransformerConfig

    dm = make(tmp_path, write_tsv(tmp_path / "d"), shared_vocab=False, vocab_size=16)
    assert dm.tokenizer.get_vocab_size() == dm.target_tokenizer.get_vocab_size() == 16
    assert dm.tokenizer.get_vocab() != dm.target_tokenizer.get_vocab()
    linked = dict(vocab_size=dm.vocab_size, target_vocab_size=dm.target_vocab_size)
    assert not TransformerConfig.preset("tiny", topology="encoder_decoder", **linked).shares_embeddings
    shared = make(tmp_path, tmp_path / "d", vocab_size=16)
    linked = dict(vocab_size=shared.vocab_size, target_vocab_size=shared.target_vocab_size)
    assert TransformerConfig.preset("tiny", topology="encoder_decoder", **linked).shares_embeddings


def test_separate_vocabularies_from_a_checkpoint(tmp_path):
    """A .ckpt as the tokenizer (evaluating or fine-tuning its model) gives each side its own saved tokenizer, and
    the keys of the data tokenized by them: the same shards as the run that trained them."""
    trained = make(tmp_path, write_tsv(tmp_path / "d"), shared_vocab=False)
    checkpoint = tmp_path / "run.ckpt"
    saved = {"tokenizer": trained.tokenizer.to_str(), "target_tokenizer": trained.target_tokenizer.to_str()}
    torch.save(saved, checkpoint)
    dm = make(tmp_path, tmp_path / "d", shared_vocab=False, tokenizer=str(checkpoint))
    assert [t.to_str() for t in dm.tokenizers] == [saved["tokenizer"], saved["target_tokenizer"]]
    assert dm.prepare() == trained.prepare()


def test_translation_column_from_json_lines(tmp_path):
    folder = tmp_path / "j"
    folder.mkdir()
    for split in ("train", "validation", "test"):
        rows = [json.dumps({"translation": {"de": f"das Haus {i}", "en": f"the house {i}"}}) for i in range(20)]
        (folder / f"{split}.jsonl").write_text("\n".join(rows) + "\n")
    dm = make(tmp_path, folder, source_lang="de", target_lang="en")
    assert dm.pairs()["train"][0][3] == "das Haus 3"
    with pytest.raises(ValueError, match="no language"):
        make(tmp_path, folder, source_lang="fr").pairs()


def test_file_without_pairs_is_a_clear_error(tmp_path):
    folder = tmp_path / "e"
    folder.mkdir()
    for split in ("train", "valid", "test"):
        (folder / f"{split}.tsv").write_text("en\tes\n\t\n")
    with pytest.raises(ValueError, match="no sentence pairs"):
        make(tmp_path, folder).pairs()


def test_missing_column_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no column 'fr'"):
        make(tmp_path, write_tsv(tmp_path / "d"), target_lang="fr").pairs()


# ---------------------------------------------------------------- the embedded corpus (shared cache)


@pytest.fixture(scope="module")
def kjv_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("kjv-cache")


@pytest.fixture(scope="module")
def kjv(kjv_cache):
    return corpora.kjv_rv1909(kjv_cache)


def test_kjv_rv1909_sizes_and_split(kjv):
    sizes = {split: len(kjv[split]) for split in kjv}
    assert 29_000 < sizes["train"] < 30_000 and 550 < sizes["validation"] < 700 and 550 < sizes["test"] < 700
    for split in kjv:
        assert all(corpora.split_of(k) == split for k in kjv[split]["key"])
    train = set(kjv["train"]["en"]) | set(kjv["train"]["es"])
    assert not any(t in train for s in ("validation", "test") for t in list(kjv[s]["en"]) + list(kjv[s]["es"]))


def test_kjv_rv1909_is_clean_text(kjv):
    first = kjv["train"][0] if kjv["train"][0]["key"] == "Gen.1.1" else None
    assert first == {
        "key": "Gen.1.1",
        "en": "In the beginning God created the heaven and the earth.",
        "es": "En el principio crió Dios los cielos y la tierra.",
    }
    text = " ".join(list(kjv["train"]["en"])[:3000] + list(kjv["train"]["es"])[:3000])
    for junk in ("<", ">", "¶", "\\", " ,", " ."):
        assert junk not in text


def test_clean_verse_drops_notes_before_tags():
    raw = 'And <w lemma="strong:H0430">God</w>.<note placement="foot">Heb. note</note><w>created</w> ¶ it , so'
    assert corpora.clean_verse(raw) == "And God. created it, so"
    assert corpora.clean_verse("<w>EN el</w> principio", first_of_chapter=True) == "En el principio"


def test_kjv_module_pads_little_within_the_token_budget(kjv_cache):
    dm = TranslationDataModule(
        "kjv-rv1909",
        tokenizer="char",
        vocab_size=300,
        max_tokens=4096,
        max_length=256,
        max_pairs=4000,
        cache_dir=str(kjv_cache),
    )
    dm.setup()
    pad = total = 0
    for batch in dm.train_dataloader():
        for side in (batch["src"], batch["tgt_in"]):
            pad, total = pad + int((side == dm.pad_token_id).sum()), total + side.numel()
            assert side.numel() <= 4096
    assert pad / total < 0.10
    val = next(iter(dm.val_dataloader()))
    assert isinstance(val["ref_text"][0], str) and dm.bleu_samples == 200


def test_missing_sword_modules_name_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setattr(corpora.bible, "SWORD_LIBRARIES", [str(tmp_path)])
    monkeypatch.delenv("SWORD_PATH", raising=False)
    with pytest.raises(FileNotFoundError, match="apt-get install -y sword-text-kjv sword-text-sparv"):
        corpora.kjv_rv1909(tmp_path)


def test_loader_lengths_are_consistent(tmp_path):
    dm = make(tmp_path, write_tsv(tmp_path / "d"))
    dm.setup()
    loader = dm.train_dataloader()
    assert len(list(loader)) == len(loader)
    assert np.all(np.diff([len(b["src"]) for b in dm.val_dataloader()]) <= 8)
