"""The tokenizers of a Marian folder (OPUS-MT): its tokenizer.json files, or its SentencePiece models converted, and
the id its decoder starts from.

Read here, below the interop package that writes and imports Marian models, because the translation DataModule reads
them too (a Marian folder as its tokenizer: fine-tuning OPUS-MT).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from tokenizers import Tokenizer

from lit_transformer.errors import MissingFileError

from .text import read_tokenizer


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
        source = _without_post_processor(read_tokenizer(folder / "tokenizer.json"))
        target_file = folder / "target_tokenizer" / "tokenizer.json"
        return source, read_tokenizer(target_file) if target_file.is_file() else source
    if (folder / "source.spm").is_file() and (folder / "vocab.json").is_file():
        vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
        target_vocab_file = folder / "target_vocab.json"
        target_vocab = (
            json.loads(target_vocab_file.read_text(encoding="utf-8")) if target_vocab_file.is_file() else vocab
        )
        target_spm = folder / "target.spm" if (folder / "target.spm").is_file() else folder / "source.spm"
        return spm_tokenizer(folder / "source.spm", vocab), spm_tokenizer(target_spm, target_vocab)
    raise MissingFileError(
        f"{folder} holds neither tokenizer.json nor OPUS-MT's source.spm + vocab.json: no tokenizer to load"
    )


def _without_post_processor(tokenizer: Tokenizer) -> Tokenizer:
    """save_hf_marian's tokenizer appends EOS for transformers' sake; our encoding appends it itself."""
    tokenizer.post_processor = None
    return tokenizer


def spm_tokenizer(spm_file: str | os.PathLike, vocab: Mapping[str, int]) -> Tokenizer:
    """A `tokenizers` Unigram tokenizer that segments as the SentencePiece model `spm_file` does and numbers pieces
    as Marian's `vocab` (piece -> id) does. Read with the protobuf schema transformers ships, so the sentencepiece
    package is not needed. Pieces of the id table the model lacks (the other language's) get a score so far below
    every real piece that no segmentation through the model's own pieces loses to one (SentencePiece, and Hugging
    Face's MarianTokenizer, never use them); the control tokens are special (skipped when decoding)."""
    from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
    from tokenizers.models import Unigram
    from transformers.convert_slow_tokenizer import import_protobuf

    proto = import_protobuf().ModelProto()
    proto.ParseFromString(Path(spm_file).read_bytes())
    scores = {p.piece: p.score for p in proto.pieces}
    # Below any sum of real pieces a text can have: min - 10 still let one foreign piece (Spanish "▁presente") beat
    # an English word's several pieces, ids the model never saw in that language.
    floor = min(scores.values(), default=0.0) - 1e9
    ordered = sorted(vocab.items(), key=lambda item: item[1])
    if [i for _, i in ordered] != list(range(len(ordered))):
        raise ValueError(f"The id table beside {spm_file} does not number its pieces 0..{len(ordered) - 1}")
    unk = vocab.get(proto.trainer_spec.unk_piece or "<unk>", vocab.get("<unk>"))
    tokenizer = Tokenizer(Unigram([(piece, scores.get(piece, floor)) for piece, _ in ordered], unk_id=unk))
    steps = []
    if proto.normalizer_spec.precompiled_charsmap:
        steps.append(normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap))
    if proto.normalizer_spec.remove_extra_whitespaces:  # SentencePiece's default: no piece for trailing whitespace
        steps.append(normalizers.Strip(left=False, right=True))
    steps.append(normalizers.Replace(Regex(" {2,}"), " "))
    tokenizer.normalizer = normalizers.Sequence(steps)
    prepend = "always" if proto.normalizer_spec.add_dummy_prefix else "never"
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=prepend)
    tokenizer.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme=prepend)
    control = [p.piece for p in proto.pieces if p.type in (2, 3)] + ["<pad>"]  # UNKNOWN, CONTROL

    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in dict.fromkeys(control) if t in vocab])
    return tokenizer
