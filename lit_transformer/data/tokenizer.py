"""Tokenizers: train byte-level BPE, BPE or character-level with `tokenizers`, or load a tokenizer.json / hub name.

Trained tokenizers put the special tokens first, so pad, bos, eos, unk are ids 0, 1, 2, 3 in every vocabulary.
Training is cached on disk by a hash of the training text and the settings.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from .cache import cached, fingerprint, hash_texts

TokenizerKind = Literal["byte_bpe", "bpe", "char"]
KINDS: tuple[str, ...] = ("byte_bpe", "bpe", "char")
PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK]
MASK = "<mask>"  # added after training by the DataModules that need it (masked-LM), so other vocabularies keep ids

# Names other tokenizers use for the same roles, tried in order when a tokenizer is loaded rather than trained.
_ALIASES = {
    "pad": [PAD, "[PAD]", "<|pad|>", "<|padding|>"],
    "bos": [BOS, "<s>", "[CLS]", "<|startoftext|>", "<|endoftext|>"],
    "eos": [EOS, "</s>", "[SEP]", "<|endoftext|>"],
    "mask": [MASK, "[MASK]"],
}


def _new_tokenizer(kind: str) -> Tokenizer:
    if kind == "byte_bpe":
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
    elif kind == "bpe":
        tokenizer = Tokenizer(models.BPE(unk_token=UNK))
        tokenizer.normalizer = normalizers.NFC()
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
    elif kind == "char":
        tokenizer = Tokenizer(models.WordLevel(unk_token=UNK))
        tokenizer.normalizer = normalizers.NFC()
        tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        tokenizer.decoder = decoders.Fuse()
    else:
        raise ValueError(f"Unknown tokenizer kind {kind!r}; choose one of {KINDS}, a tokenizer.json path or a hub name")
    return tokenizer


def _trainer(kind: str, vocab_size: int):
    if kind == "byte_bpe":
        return trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=SPECIAL_TOKENS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
    if kind == "bpe":
        return trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False)
    return trainers.WordLevelTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False)


def train_tokenizer(texts: Sequence[str], kind: str = "byte_bpe", vocab_size: int = 8192) -> Tokenizer:
    """Train a fresh tokenizer on `texts` (char: the most frequent characters, at most vocab_size in all)."""
    if kind == "byte_bpe" and vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"byte_bpe needs vocab_size >= {256 + len(SPECIAL_TOKENS)} (256 bytes + special tokens)")
    tokenizer = _new_tokenizer(kind)
    tokenizer.train_from_iterator(_chunks(texts), trainer=_trainer(kind, vocab_size), length=len(texts))
    return tokenizer


def _chunks(texts: Sequence[str], size: int = 1 << 16):
    """Long documents in pieces at line boundaries, so the Rust trainer can work on them in parallel."""
    for text in texts:
        if len(text) <= size:
            yield text
            continue
        start = 0
        while start < len(text):
            end = text.find("\n", start + size)
            end = len(text) if end < 0 else end + 1
            yield text[start:end]
            start = end


def load_or_train_tokenizer(
    spec: str, texts_fn, vocab_size: int, cache_dir: Path, tag: str = ""
) -> tuple[Tokenizer, str]:
    """The tokenizer named by `spec` and a fingerprint of it (used to key the token caches).

    spec: a kind to train (byte_bpe, bpe, char) on `texts_fn()`, a path to a tokenizer.json, a .ckpt whose saved
    tokenizer to use (to fine-tune its model on other data), or a hub tokenizer name.
    """
    if spec.endswith(".ckpt"):
        from lit_transformer.checkpointing import load_checkpoint

        saved = load_checkpoint(spec).get("tokenizer")
        if saved is None:
            raise ValueError(f"Checkpoint {spec!r} holds no tokenizer")
        return Tokenizer.from_str(saved), fingerprint("tokenizer", saved)
    if spec in KINDS:
        texts = texts_fn()
        key = fingerprint("tokenizer", spec, vocab_size, hash_texts(texts), tag)
        path = cache_dir / "tokenizers" / f"{spec}-{vocab_size}-{key}.json"
        tokenizer = cached(
            path,
            lambda: train_tokenizer(texts, spec, vocab_size),
            lambda tok, tmp: tok.save(tmp),
            lambda p: Tokenizer.from_file(str(p)),
        )
        return tokenizer, key
    if os.path.isfile(spec) or spec.endswith(".json"):
        if not os.path.isfile(spec):
            raise FileNotFoundError(f"Tokenizer file {spec!r} does not exist")
        tokenizer = Tokenizer.from_file(spec)
    else:
        from .sources import ensure_online

        ensure_online(
            f"tokenizer {spec!r}", hint="pass a local tokenizer.json path or a kind to train: " + ", ".join(KINDS)
        )
        tokenizer = Tokenizer.from_pretrained(spec)
    return tokenizer, fingerprint("tokenizer", tokenizer.to_str())


def special_token_id(tokenizer: Tokenizer, role: str) -> int | None:
    """The id of the pad/bos/eos token under its usual names, or None when the vocabulary has none."""
    for name in _ALIASES[role]:
        token_id = tokenizer.token_to_id(name)
        if token_id is not None:
            return token_id
    return None
