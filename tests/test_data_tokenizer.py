"""Tokenizers: special tokens first, lossless round trips, a cache keyed by content and settings."""

import re
import threading

import pytest
from tokenizers import Tokenizer

from lit_transformer.data.cache import fingerprint
from lit_transformer.data.text import SPECIAL_TOKENS, load_or_train_tokenizer, special_token_id, train_tokenizer
from lit_transformer.errors import BadFileError

TEXTS = ["To be, or not to be: that is the question.\n", "Whether 'tis nobler in the mind to suffer\n"] * 20
TEXT = "To be, or not to suffer: the question.\nWhether 'tis"


@pytest.mark.parametrize("kind", ["byte_bpe", "bpe", "char"])
def test_special_tokens_are_the_first_ids(kind):
    tokenizer = train_tokenizer(TEXTS, kind, vocab_size=300)
    assert [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]
    assert [special_token_id(tokenizer, r) for r in ("pad", "bos", "eos")] == [0, 1, 2]


@pytest.mark.parametrize("kind", ["byte_bpe", "bpe", "char"])
def test_round_trip(kind):
    tokenizer = train_tokenizer(TEXTS, kind, vocab_size=300)
    ids = tokenizer.encode(TEXT, add_special_tokens=False).ids
    assert tokenizer.decode(ids) == TEXT
    assert tokenizer.token_to_id("<unk>") not in ids


def test_char_vocabulary_is_the_characters():
    tokenizer = train_tokenizer(["abca\n"], "char", vocab_size=100)
    assert tokenizer.get_vocab_size() == len(SPECIAL_TOKENS) + 4  # a b c \n


def test_cache_reuses_and_invalidates(tmp_path):
    first, key = load_or_train_tokenizer("byte_bpe", lambda: TEXTS, 300, tmp_path)
    files = sorted((tmp_path / "tokenizers").glob("*.json"))
    again, same_key = load_or_train_tokenizer("byte_bpe", lambda: TEXTS, 300, tmp_path)
    assert key == same_key and again.to_str() == first.to_str()
    assert sorted((tmp_path / "tokenizers").glob("*.json")) == files
    other_text, text_key = load_or_train_tokenizer("byte_bpe", lambda: TEXTS + ["new"], 300, tmp_path)
    other_size, size_key = load_or_train_tokenizer("byte_bpe", lambda: TEXTS, 310, tmp_path)
    assert len(list((tmp_path / "tokenizers").glob("*.json"))) == 3  # each setting trained and cached its own
    # The key (of the data it tokenizes) is the tokenizer's own: equal for equal tokenizers, however obtained.
    assert key == fingerprint("tokenizer", first.to_str()) and size_key != key
    assert (text_key == key) == (other_text.to_str() == first.to_str())
    assert size_key == fingerprint("tokenizer", other_size.to_str())


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_cache_entries_take_the_mode_the_umask_gives(tmp_path, umask):
    """A shared data cache (docs/clusters.md: one folder every node, or a team, reads) holds files of the mode the
    umask gives, as the run folder's do: entries written through tempfile.mkstemp were 0600 whatever the umask."""
    import os
    from pathlib import Path

    from lit_transformer.data.cache import atomic_write

    previous = os.umask(umask)
    try:
        load_or_train_tokenizer("char", lambda: TEXTS, 300, tmp_path)
        atomic_write(tmp_path / "shards" / "index.json", lambda tmp: Path(tmp).write_text("{}"))
    finally:
        os.umask(previous)
    files = [*(tmp_path / "tokenizers").glob("*.json"), tmp_path / "shards" / "index.json"]
    assert files and {f.name: oct(f.stat().st_mode & 0o777) for f in files} == {
        f.name: oct(0o666 & ~umask) for f in files
    }


def test_racing_builders_agree(tmp_path):
    results = []

    def build():
        results.append(load_or_train_tokenizer("bpe", lambda: TEXTS, 200, tmp_path)[0].to_str())

    threads = [threading.Thread(target=build) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3 and len(set(results)) == 1
    assert not list((tmp_path / "tokenizers").glob("*.tmp"))


def test_tokenizer_file_is_loaded(tmp_path):
    path = tmp_path / "tok.json"
    train_tokenizer(TEXTS, "char", 100).save(str(path))
    tokenizer, _ = load_or_train_tokenizer(str(path), lambda: pytest.fail("must not train"), 0, tmp_path)
    assert tokenizer.get_vocab_size() == train_tokenizer(TEXTS, "char", 100).get_vocab_size()


def test_unknown_kind_offline_fails_fast(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConnectionError, match="offline"):
        load_or_train_tokenizer("gpt2", lambda: TEXTS, 0, tmp_path)


def _hub_cache(root, repo, files):
    """A Hugging Face hub cache holding `repo` at revision main, as `hf download` leaves it."""
    folder = root / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("0" * 40)
    snapshot = folder / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for name, write in files.items():
        write(snapshot / name)
    return snapshot


def test_a_hub_tokenizer_downloaded_before_loads_offline_from_the_cache(tmp_path, monkeypatch):
    """HF_HUB_OFFLINE=1 after `hf download` is Hugging Face's way to run without internet: the name must load from
    the local cache (it was refused as if never downloaded), and a name not in it fails naming the cache."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    trained = train_tokenizer(TEXTS, "char", 100)
    _hub_cache(tmp_path / "hub", "acme/tok", {"tokenizer.json": lambda path: trained.save(str(path))})
    tokenizer, _ = load_or_train_tokenizer("acme/tok", lambda: pytest.fail("must not train"), 0, tmp_path / "c")
    assert tokenizer.to_str() == trained.to_str()
    with pytest.raises(
        ConnectionError, match=r"'acme/other'.*offline.*not in the local Hugging Face cache.*hf download"
    ):
        load_or_train_tokenizer("acme/other", lambda: TEXTS, 0, tmp_path / "c")


def test_inference_encodes_as_training_does_even_with_a_post_processor():
    """A tokenizer that appends </s> itself (a Marian or BERT export) must not give a source two EOS tokens: training
    and inference both encode without the tokenizer's own special tokens, then add what the model expects."""
    from tokenizers.processors import TemplateProcessing

    from lit_transformer.data.text import encode_input, token_ids

    tokenizer = train_tokenizer(TEXTS, "bpe", vocab_size=300)
    eos = special_token_id(tokenizer, "eos")
    tokenizer.post_processor = TemplateProcessing(single="$A <eos>", special_tokens=[("<eos>", eos)])
    plain = token_ids(tokenizer, [TEXT])[0]
    assert tokenizer.encode(TEXT).ids == plain + [eos]  # what the tokenizer's default would give
    assert encode_input(tokenizer, TEXT, encoder_decoder=True, eos_token_id=eos) == plain + [eos]  # one EOS
    assert encode_input(tokenizer, TEXT, encoder_decoder=False, eos_token_id=eos) == plain  # a prompt: no EOS
    assert encode_input(tokenizer, "", encoder_decoder=False, eos_token_id=eos) == [eos]  # a document boundary


@pytest.mark.parametrize("damage", ["empty", "truncated"])
def test_a_damaged_cached_tokenizer_is_trained_again(tmp_path, damage):
    """A cache entry cut short (a crash or a full disk outside the atomic write, a user's `: > file`) is rebuilt, as
    the token shards are, with a warning naming the file; the key stays that of the same tokenizer."""
    first, key = load_or_train_tokenizer("char", lambda: TEXTS, 100, tmp_path)
    (path,) = (tmp_path / "tokenizers").glob("*.json")
    text = path.read_text()
    path.write_text("" if damage == "empty" else text[: len(text) // 2])
    with pytest.warns(
        UserWarning, match=rf"cached tokenizer {re.escape(str(path))} cannot be read .*: building it again"
    ):
        again, same_key = load_or_train_tokenizer("char", lambda: TEXTS, 100, tmp_path)
    assert same_key == key and again.to_str() == first.to_str()
    assert Tokenizer.from_file(str(path)).to_str() == first.to_str()  # the entry is whole again


@pytest.mark.parametrize("content", ["", '{"version": "1.0", "trun', "hello"])
def test_a_damaged_tokenizer_file_of_the_users_is_refused_not_trained(tmp_path, content):
    """A file the user names is no cache entry: nothing replaces it, the refusal names it and the flag."""
    path = tmp_path / "tok.json"
    path.write_text(content)
    with pytest.raises(BadFileError, match=rf"Tokenizer file {re.escape(str(path))} .*cannot be read") as refused:
        load_or_train_tokenizer(str(path), lambda: pytest.fail("must not train"), 0, tmp_path)
    assert refused.value.keys == ("data.init_args.tokenizer",)
    assert path.read_text() == content


@pytest.mark.parametrize("reader", ["model folder", "marian folder"])
def test_a_damaged_tokenizer_json_of_a_model_folder_is_refused_naming_it(tmp_path, reader):
    """`generate --checkpoint FOLDER` (and fine-tuning from a Marian folder) read the folder's tokenizer.json with
    `Tokenizer.from_file`, whose bare Exception ("EOF while parsing ...") reached the user as a traceback."""
    from lit_transformer.data.marian_tokenizers import load_hf_marian_tokenizers
    from lit_transformer.errors import BadFileError
    from lit_transformer.inference import _folder_tokenizer

    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "truncation": null, "added_tokens": [{"id": 0, "con')
    with pytest.raises(BadFileError, match=r"tokenizer.json \(70 bytes\) cannot be read as a tokenizer: EOF"):
        if reader == "model folder":
            _folder_tokenizer(tmp_path / "tokenizer.json")
        else:
            load_hf_marian_tokenizers(tmp_path)


@pytest.mark.parametrize("kind", ["byte_bpe", "bpe", "char"])
def test_a_continuation_is_the_text_its_tokens_add_after_the_prompt(kind):
    """generate, predict, serve and the training samples decode a decoder-only model's new tokens after its prompt's
    ids: decoded alone, the first "▁not" of a Metaspace tokenizer (the bpe kind's, Llama's SentencePiece one) lost
    its space, so "To be, or" continued printed "To be, ornot to be" (generate), and predict's output lacked it."""
    import io

    import torch

    from lit_transformer.data.text import TextStream, token_ids

    tokenizer = train_tokenizer(TEXTS, kind, vocab_size=300)
    prompt, whole = "To be, or", "To be, or not to be"
    head, ids = token_ids(tokenizer, [prompt, whole])
    assert ids[: len(head)] == head
    echo = io.StringIO()
    stream = TextStream(tokenizer, 1, echo=echo, prompts=[head])
    for token in ids[len(head) :]:
        stream(torch.tensor([token]))
    stream.finish()
    assert prompt + stream.texts()[0] == whole == prompt + echo.getvalue()


def test_predict_output_continues_the_prompt_with_its_space():
    """predict's and serve's rows (generation_rows): input + output is the decode of the prompt and its tokens."""
    import torch

    from lit_transformer.config import GenerationConfig, TransformerConfig
    from lit_transformer.data.text import pad_right, token_ids
    from lit_transformer.tasks.base import generation_rows

    tokenizer = train_tokenizer(TEXTS, "bpe", vocab_size=300)
    word = tokenizer.token_to_id("▁not")

    class Writes:  # a decoder-only model that writes "▁not" at every step, whose space decoding it alone dropped
        config = TransformerConfig.preset("tiny", topology="decoder_only", vocab_size=tokenizer.get_vocab_size())

        def generate(self, input_ids, generation, attention_mask=None, streamer=None):
            steps = torch.full((3, len(input_ids)), word)
            for step in steps:
                streamer(step)
            return steps.T

    prompts = ["To be, or", "Whether"]
    ids, mask = pad_right(token_ids(tokenizer, prompts), 0)
    rows = generation_rows(Writes(), tokenizer, GenerationConfig(max_new_tokens=3), ids, mask, prompts)
    for text, row in zip(prompts, rows, strict=True):
        assert row["output"] == " not not not"
        assert text + row["output"] == tokenizer.decode(token_ids(tokenizer, [text])[0] + row["tokens"])


@pytest.mark.parametrize("kind", ["bpe", "char"])
def test_a_text_of_more_characters_than_vocab_size_gets_vocab_size_tokens(kind):
    """vocab_size is the vocabulary's size: bpe's trainer kept every character of the sample (tokenizers'
    BpeTrainer without limit_alphabet), so 300 CJK characters and vocab_size 64 gave 331 tokens, no merge. Now, as
    char's, the most frequent characters (the rarest become <unk>, which the DataModules' warning names)."""
    letters = [chr(0x4E00 + i) * (1 + i % 7) for i in range(300)]
    texts = [" ".join(letters) + " the a" * 400 + "\n"] * 3
    tokenizer = train_tokenizer(texts, kind, vocab_size=64)
    assert tokenizer.get_vocab_size() == 64
    assert [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]
    ids = tokenizer.encode("the a", add_special_tokens=False).ids
    assert tokenizer.decode(ids) == "the a" and tokenizer.token_to_id("<unk>") not in ids  # frequent ones kept
    assert tokenizer.token_to_id("<unk>") in tokenizer.encode(letters[0], add_special_tokens=False).ids  # a rare one


def test_a_continuation_after_a_long_prompt_cut_inside_a_character():
    """Decoded after the prompt's last tokens only (PROMPT_CONTEXT), which may begin inside a character's bytes."""
    from lit_transformer.data.text import PROMPT_CONTEXT, decode_after, token_ids

    tokenizer = train_tokenizer(TEXTS, "byte_bpe", vocab_size=300)
    prompt, whole = "日本語" * 3, "日本語" * 3 + " to be 😀"
    head, ids = token_ids(tokenizer, [prompt, whole])
    assert ids[: len(head)] == head and len(head) % 3 == 0 and len(head) > PROMPT_CONTEXT  # the cut is mid-character
    assert prompt + decode_after(tokenizer, head, ids[len(head) :]) == whole
    for cut in range(len(head), len(ids)):  # a character still arriving decodes, as alone, to U+FFFD
        assert whole[len(prompt) :].startswith(decode_after(tokenizer, head, ids[len(head) : cut]).rstrip("\ufffd"))


@pytest.mark.parametrize("kind", ["bpe", "char", "byte_bpe"])
def test_a_vocabulary_of_no_more_than_the_special_tokens_is_refused(kind):
    """train_tokenizer(texts, "bpe", 3) from Python ended in an OverflowError (a negative alphabet limit)."""
    from lit_transformer.data.text import train_tokenizer
    from lit_transformer.errors import ConfigError

    with pytest.raises(ConfigError, match="vocab_size=3 leaves no token beside the 4 special ones"):
        train_tokenizer(["some text"], kind, 3)
