"""Text to token ids, the one way in training and in inference: tokenizers, encoding, padding.

Tokenizers: byte-level BPE, BPE or character-level trained with `tokenizers` (special tokens first, so pad, bos,
eos, unk are ids 0-3 in every trained vocabulary; training is cached on disk by a hash of the text and the
settings), or a tokenizer.json, a .ckpt's saved tokenizer, a hub name, or a Marian folder's (OPUS-MT's SentencePiece
models, converted). Encoding leaves out the tokenizer's own special tokens: the DataModules place BOS/EOS themselves.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from .cache import cached, fingerprint, hash_texts

IGNORE_INDEX = -100
"""The label of a position without a target (padding, a masked LM's unchosen tokens): torch's ignore_index."""
PIECE_CHARS = 1 << 14  # a long text is encoded in pieces of about this many characters, cut at line boundaries


def line_pieces(text: str, size: int = PIECE_CHARS) -> list[str]:
    """A long text in pieces of about `size` characters, each ending at a line boundary, so that the pieces of one
    document encode in parallel (tokenizers' encode_batch)."""
    if len(text) <= size:
        return [text]
    pieces, start = [], 0
    while start < len(text):
        end = text.find("\n", start + size)
        end = len(text) if end < 0 else end + 1
        pieces.append(text[start:end])
        start = end
    return pieces


def token_ids(tokenizer: Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """The ids of each text, without the tokenizer's own special tokens: the DataModules place BOS/EOS themselves,
    and a tokenizer with a post-processor (a Marian or BERT export) would otherwise add them a second time."""
    return [encoding.ids for encoding in tokenizer.encode_batch(list(texts), add_special_tokens=False)]


def encode_input(tokenizer: Tokenizer, text: str, *, encoder_decoder: bool, eos_token_id: int | None) -> list[int]:
    """One model input as training builds it. A translation source is its tokens then EOS. A language-model prompt
    is its tokens; an empty one is EOS alone, the document boundary that precedes every document in training."""
    ids = token_ids(tokenizer, [text])[0]
    eos = [] if eos_token_id is None else [eos_token_id]
    if encoder_decoder:
        return ids + eos
    return ids or eos


def pad_right(rows: Sequence[Sequence[int]], pad_token_id: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention_mask), both (len(rows), longest): rows padded on the right, the mask True on real tokens.

    The mask, not the filler, says what is padding; without a pad token the filler is id 0."""
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), 0 if pad_token_id is None else pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for b, row in enumerate(rows):
        ids[b, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[b, : len(row)] = True
    return ids, mask


# ---------------------------------------------------------------------------------------------------- tokenizers

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
        from lit_transformer.checkpoint_file import load_checkpoint

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


# ---------------------------------------------------------------- the tokenizers of a Marian folder
# Read here, below the interop package that writes and imports Marian models, because the translation DataModule reads
# them too (a Marian folder as its tokenizer: fine-tuning OPUS-MT).


def is_marian_folder(path: str | os.PathLike) -> bool:
    """Whether `path` is a local folder whose config.json describes a Marian model."""
    config = Path(path) / "config.json"
    return config.is_file() and json.loads(config.read_text()).get("model_type") == "marian"


def marian_decoder_start_token_id(path: str | os.PathLike) -> int | None:
    """The id a Marian folder's decoder starts from (config.json's decoder_start_token_id, else its pad token as in
    Marian); None when `path` is no Marian folder. OPUS-MT starts from its pad token: it has no BOS."""
    if not is_marian_folder(path):
        return None
    return decoder_start_token_id(json.loads((Path(path) / "config.json").read_text()))


def decoder_start_token_id(hf: Mapping) -> int | None:
    start = hf.get("decoder_start_token_id")
    return hf.get("pad_token_id") if start is None else start


def load_hf_marian_tokenizers(directory: str | os.PathLike) -> tuple[Tokenizer, Tokenizer]:
    """(source, target) tokenizers of a Marian folder: tokenizer.json (and target_tokenizer/tokenizer.json) as
    save_hf_marian writes them, else OPUS-MT's SentencePiece models source.spm / target.spm with the shared id table
    vocab.json (target_vocab.json when the vocabularies are separate), converted to `tokenizers` Unigram models."""
    folder = Path(directory)
    if (folder / "tokenizer.json").is_file():
        source = _without_post_processor(Tokenizer.from_file(str(folder / "tokenizer.json")))
        target_file = folder / "target_tokenizer" / "tokenizer.json"
        return source, Tokenizer.from_file(str(target_file)) if target_file.is_file() else source
    if (folder / "source.spm").is_file() and (folder / "vocab.json").is_file():
        vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
        target_vocab_file = folder / "target_vocab.json"
        target_vocab = (
            json.loads(target_vocab_file.read_text(encoding="utf-8")) if target_vocab_file.is_file() else vocab
        )
        target_spm = folder / "target.spm" if (folder / "target.spm").is_file() else folder / "source.spm"
        return spm_tokenizer(folder / "source.spm", vocab), spm_tokenizer(target_spm, target_vocab)
    raise FileNotFoundError(
        f"{folder} holds neither tokenizer.json nor OPUS-MT's source.spm + vocab.json: no tokenizer to load"
    )


def _without_post_processor(tokenizer: Tokenizer) -> Tokenizer:
    """save_hf_marian's tokenizer appends EOS for transformers' sake; our encoding appends it itself."""
    tokenizer.post_processor = None
    return tokenizer


def spm_tokenizer(spm_file: str | os.PathLike, vocab: Mapping[str, int]) -> Tokenizer:
    """A `tokenizers` Unigram tokenizer that segments as the SentencePiece model `spm_file` does and numbers pieces
    as Marian's `vocab` (piece -> id) does. Read with the protobuf schema transformers ships, so the sentencepiece
    package is not needed. Pieces of the id table the model lacks (the other language's) get a score below every
    real piece, so segmentation prefers the model's own; the control tokens are special (skipped when decoding)."""
    from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
    from tokenizers.models import Unigram
    from transformers.convert_slow_tokenizer import import_protobuf

    proto = import_protobuf().ModelProto()
    proto.ParseFromString(Path(spm_file).read_bytes())
    scores = {p.piece: p.score for p in proto.pieces}
    floor = min(scores.values(), default=0.0) - 10.0
    ordered = sorted(vocab.items(), key=lambda item: item[1])
    if [i for _, i in ordered] != list(range(len(ordered))):
        raise ValueError(f"The id table beside {spm_file} does not number its pieces 0..{len(ordered) - 1}")
    unk = vocab.get(proto.trainer_spec.unk_piece or "<unk>", vocab.get("<unk>"))
    tokenizer = Tokenizer(Unigram([(piece, scores.get(piece, floor)) for piece, _ in ordered], unk_id=unk))
    steps = []
    if proto.normalizer_spec.precompiled_charsmap:
        steps.append(normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap))
    steps.append(normalizers.Replace(Regex(" {2,}"), " "))
    tokenizer.normalizer = normalizers.Sequence(steps)
    prepend = "always" if proto.normalizer_spec.add_dummy_prefix else "never"
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=prepend)
    tokenizer.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme=prepend)
    control = [p.piece for p in proto.pieces if p.type in (2, 3)] + ["<pad>"]  # UNKNOWN, CONTROL

    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in dict.fromkeys(control) if t in vocab])
    return tokenizer
