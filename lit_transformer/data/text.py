"""Text to token ids, the one way in training and in inference: tokenizers, encoding, padding.

Tokenizers: byte-level BPE, BPE or character-level trained with `tokenizers` (special tokens first, so pad, bos,
eos, unk are ids 0-3 in every trained vocabulary; training is cached on disk by a hash of the text and the
settings), or a tokenizer.json, a .ckpt's saved tokenizer, a hub name, or a Marian folder's (OPUS-MT's SentencePiece
models, converted). Encoding leaves out the tokenizer's own special tokens: the DataModules place BOS/EOS themselves.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, TextIO

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from lit_transformer.errors import BadFileError, ConfigError, MissingFileError

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
        raise ConfigError(
            f"Unknown tokenizer kind {kind!r}; choose one of {KINDS}, a tokenizer.json path or a hub name",
            keys=["data.init_args.tokenizer"],
        )
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
        # The alphabet is the most frequent characters, at most what vocab_size leaves beside the special tokens (as a
        # char tokenizer's): the trainer otherwise keeps every character of the sample, and a text of more characters
        # than vocab_size gave a larger vocabulary than asked for, all characters and no merge.
        return trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=SPECIAL_TOKENS,
            limit_alphabet=vocab_size - len(SPECIAL_TOKENS),
            show_progress=False,
        )
    return trainers.WordLevelTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False)


def train_tokenizer(texts: Sequence[str], kind: str = "byte_bpe", vocab_size: int = 8192) -> Tokenizer:
    """Train a fresh tokenizer on `texts`, of at most vocab_size tokens (char: the most frequent characters; bpe: the
    most frequent characters, then merges)."""
    if vocab_size <= len(SPECIAL_TOKENS):  # bpe's alphabet limit would be negative (an OverflowError)
        raise ConfigError(
            f"vocab_size={vocab_size} leaves no token beside the {len(SPECIAL_TOKENS)} special ones: give more",
            keys=["data.init_args.vocab_size"],
        )
    if kind == "byte_bpe" and vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ConfigError(
            f"byte_bpe needs vocab_size >= {256 + len(SPECIAL_TOKENS)} (256 bytes + special tokens), not {vocab_size}",
            keys=["data.init_args.vocab_size"],
        )
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
    tokenizer to use (to fine-tune its model on other data, or to evaluate it: its target tokenizer for tag
    "target"), or a hub tokenizer name. The fingerprint is of the tokenizer itself, however it was obtained: data
    tokenized by a trained tokenizer is found again by the same tokenizer read from a checkpoint.
    """
    if spec.endswith(".ckpt"):
        from lit_transformer.checkpoints.files import CheckpointError, load_checkpoint

        checkpoint = load_checkpoint(spec, mmap=True)
        saved = (tag == "target" and checkpoint.get("target_tokenizer")) or checkpoint.get("tokenizer")
        if saved is None:
            raise CheckpointError(f"Checkpoint {spec!r} holds no tokenizer: give a checkpoint this package wrote")
        return Tokenizer.from_str(saved), fingerprint("tokenizer", saved)
    if spec in KINDS:
        texts = texts_fn()
        limits = ("alphabet within vocab_size",) if spec == "bpe" else ()  # a bpe cached before is trained again
        key = fingerprint("tokenizer", spec, vocab_size, hash_texts(texts), tag, *limits)
        path = cache_dir / "tokenizers" / f"{spec}-{vocab_size}-{key}.json"
        tokenizer = cached(
            path,
            lambda: train_tokenizer(texts, spec, vocab_size),
            lambda tok, tmp: tok.save(tmp),
            lambda p: Tokenizer.from_file(str(p)),
            "cached tokenizer",
        )
        return tokenizer, fingerprint("tokenizer", tokenizer.to_str())
    if os.path.isfile(spec) or spec.endswith(".json"):
        if not os.path.isfile(spec):
            raise MissingFileError(f"Tokenizer file {spec!r} does not exist", keys=["data.init_args.tokenizer"])
        tokenizer = _tokenizer_file(spec)
    else:
        from .sources import hub_offline, offline_and_uncached

        if hub_offline():  # as Hugging Face's own libraries do offline: a name downloaded before is read from the cache
            from huggingface_hub import try_to_load_from_cache

            local = try_to_load_from_cache(spec, "tokenizer.json")
            if not isinstance(local, str):
                raise offline_and_uncached(
                    f"tokenizer {spec!r}",
                    hint=f"Download it where there is internet (`hf download {spec} tokenizer.json`, into the cache "
                    "that HF_HOME names here), or pass a local tokenizer.json path, or a kind to train: "
                    + ", ".join(KINDS),
                )
            tokenizer = _tokenizer_file(local)
        else:
            tokenizer = Tokenizer.from_pretrained(spec)
    return tokenizer, fingerprint("tokenizer", tokenizer.to_str())


FOLDER_FIX = "A model folder's tokenizer.json: write the folder again (`export` from its checkpoint), or copy it again"
"""What to do about a damaged tokenizer.json of a model folder (an export, a Hugging Face folder)."""


def _tokenizer_file(path: str) -> Tokenizer:
    """A tokenizer.json the user named, or a refusal naming it: unlike a cached one, it is not trained again in its
    place (what the user gave is not ours to replace)."""
    fix = "Give a tokenizer.json that `tokenizers` saved (Tokenizer.save, or a Hugging Face model's), or a kind to train: "
    return read_tokenizer(path, fix + ", ".join(KINDS), keys=["data.init_args.tokenizer"])


def read_tokenizer(path: str | os.PathLike, fix: str = FOLDER_FIX, keys: list[str] | None = None) -> Tokenizer:
    """`Tokenizer.from_file`, or a BadFileError naming the file, its size, what is wrong and `fix` (tokenizers' own
    error is a bare Exception, a traceback to the user)."""
    try:
        return Tokenizer.from_file(str(path))
    except Exception as error:
        size = os.path.getsize(path)
        detail = "the file is empty" if size == 0 else (str(error).strip().splitlines() or ["(no detail)"])[0]
        raise BadFileError(
            f"Tokenizer file {path} ({size:,} bytes) cannot be read as a tokenizer: {detail}. It may have been cut "
            f"short by a crash or an incomplete copy, or not be a tokenizer.json. {fix}",
            keys=keys or (),
        ) from None


def same_segmentation(tokenizer_json: str, other_json: str) -> bool:
    """Whether two tokenizers (JSON) give the same ids: post-processors aside, which our encoding never runs (the
    DataModules place BOS/EOS themselves; save_hf_marian's tokenizer.json has one for transformers' sake)."""
    if tokenizer_json == other_json:
        return True
    a, b = json.loads(tokenizer_json), json.loads(other_json)
    a.pop("post_processor", None)
    b.pop("post_processor", None)
    return a == b


def with_mask_token(tokenizer: Tokenizer, key: str) -> str:
    """Add <mask> after the vocabulary when the tokenizer has none; the cache key of the tokenizer that then encodes.
    The key is the fingerprint of the tokenizer with its <mask>, as a run from its checkpoint keys the copy it holds
    (load_or_train_tokenizer of a .ckpt): keyed otherwise, such a run prepared the same corpus again."""
    if special_token_id(tokenizer, "mask") is not None:
        return key
    tokenizer.add_special_tokens([MASK])
    return fingerprint("tokenizer", tokenizer.to_str())


def special_token_id(tokenizer: Tokenizer, role: str) -> int | None:
    """The id of the pad/bos/eos token under its usual names, or None when the vocabulary has none."""
    for name in _ALIASES[role]:
        token_id = tokenizer.token_to_id(name)
        if token_id is not None:
            return token_id
    return None


def unknown_token_id(tokenizer: Tokenizer) -> int | None:
    """The id text without a token of its own encodes to (a char or bpe tokenizer's <unk>, a loaded tokenizer's unk
    token); None for byte-level tokenizers, which have a token for every byte."""
    model = tokenizer.model
    token = getattr(model, "unk_token", None)
    if token:
        return tokenizer.token_to_id(token)
    unk_id = getattr(model, "unk_id", None)  # a Unigram model names its unknown token by id
    return unk_id if isinstance(unk_id, int) else None


def unknown_characters(tokenizer: Tokenizer, texts: Sequence[str], unk_id: int) -> Counter[str]:
    """How often each piece of `texts` that encodes to `unk_id` occurs (a character, for char and bpe tokenizers;
    a word, for a word-level tokenizer), read back from the encoding's offsets into the text."""
    missing: Counter[str] = Counter()
    for text, encoding in zip(texts, tokenizer.encode_batch(list(texts), add_special_tokens=False), strict=True):
        for token_id, (start, end) in zip(encoding.ids, encoding.offsets, strict=True):
            if token_id == unk_id:
                missing[text[start:end]] += 1
    return missing


PROMPT_CONTEXT = 16  # the prompt's last tokens a continuation is decoded after (decode_after): a cost bounded per step


def decode_after(tokenizer: Tokenizer, prompt: Sequence[int], ids: Sequence[int], head: str | None = None) -> str:
    """The text `ids` add after `prompt` (a decoder-only model's continuation of its prompt's ids), special tokens
    dropped: decoded after the prompt's last PROMPT_CONTEXT tokens, whose own text (`head`, their decode when given)
    is then cut off. Decoded alone, a continuation lost what a tokenizer writes only between tokens: a Metaspace or
    SentencePiece decoder (the bpe kind's, Llama's) drops the space of a text's first "▁word", so "Hello" continued
    by "▁world" printed "Helloworld"."""
    prompt = list(prompt)[-PROMPT_CONTEXT:]
    if not prompt:
        return tokenizer.decode(list(ids), skip_special_tokens=True)
    head = tokenizer.decode(prompt, skip_special_tokens=True) if head is None else head
    full = tokenizer.decode([*prompt, *ids], skip_special_tokens=True)
    return full[len(head) :] if full.startswith(head) else tokenizer.decode(list(ids), skip_special_tokens=True)


class TextStream:
    """Follows each row's new tokens as text while they are generated (a `streamer` for Transformer.generate).

    A row ends at a stop id or when its text contains a stop string (cut from `texts()`); `echo` receives row 0's
    text as it grows, holding back an incomplete UTF-8 character. `prompts`: each row's prompt ids, for a
    decoder-only model (its text continues them: see decode_after); none for an encoder-decoder's target.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        rows: int,
        stop: Sequence[str] = (),
        stop_ids: Sequence[int | None] = (),
        echo: TextIO | None = None,
        prompts: Sequence[Sequence[int]] = (),
    ) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.stop_ids = {i for i in stop_ids if i is not None}
        self.echo = echo
        self.ids: list[list[int]] = [[] for _ in range(rows)]
        self.done = [False] * rows
        self.echoed = 0
        self.prompts = [list(p)[-PROMPT_CONTEXT:] for p in prompts] or [[] for _ in range(rows)]
        self.heads = [tokenizer.decode(p, skip_special_tokens=True) for p in self.prompts]

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        for row, token in enumerate(tokens.tolist()):
            if self.done[row]:
                continue
            if token in self.stop_ids:
                self.done[row] = True
                continue
            self.ids[row].append(token)
            if self.stop and self._cut(self._text(row)) is not None:
                self.done[row] = True
        if self.echo is not None:
            self._echo(final=False)
        return torch.tensor(self.done, device=tokens.device)

    def _text(self, row: int) -> str:
        return decode_after(self.tokenizer, self.prompts[row], self.ids[row], self.heads[row])

    def _cut(self, text: str) -> int | None:
        hits = [text.find(s) for s in self.stop if s in text]
        return min(hits) if hits else None

    def texts(self) -> list[str]:
        """Each row's text, cut before its first stop string."""
        out = []
        for row in range(len(self.ids)):
            text = self._text(row)
            cut = self._cut(text)
            out.append(text if cut is None else text[:cut])
        return out

    def _echo(self, final: bool) -> None:
        text = self.texts()[0] if final or self.done[0] else self._text(0)
        if not final:
            text = text.rstrip("\ufffd")  # a multi-byte character still arriving
            if self.stop:  # hold back what could be the start of a stop string
                longest = max(map(len, self.stop)) - 1
                text = text[: max(self.echoed, len(text) - longest)]
        if len(text) > self.echoed:
            self.echo.write(text[self.echoed :])
            self.echo.flush()
            self.echoed = len(text)

    def finish(self) -> None:
        """Echo whatever was held back."""
        if self.echo is not None:
            self._echo(final=True)
