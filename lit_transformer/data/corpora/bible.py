"""``kjv-rv1909``: the King James Bible aligned verse by verse with the Reina-Valera 1909, read from Debian's SWORD
modules with pysword, cleaned of OSIS markup, split by a hash of the verse key; validation/test pairs whose text
appears verbatim in train are dropped. Extraction is cached on disk, keyed by the module files' hashes.
"""

from __future__ import annotations

import functools
import html
import os
import re
from pathlib import Path

import datasets
from lightning.pytorch.utilities import rank_zero_info

from ..cache import cached_json, fingerprint, hash_file
from ..sources import held_out_split
from .base import CorpusNotInstalledError

KJV_MODULE, RV_MODULE = "engKJV2006eb", "spaRV1909eb"


SWORD_INSTALL = "apt-get install -y sword-text-kjv sword-text-sparv"


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
    rank_zero_info(  # once, not once per process of a multi-process run
        f"kjv-rv1909: { {s: len(r['key']) for s, r in data['rows'].items()} }; dropped {stats['unmatched']} verses "
        f"missing in Spanish, {stats['misaligned']} misaligned, {stats['leaked']} val/test pairs seen in train"
    )
    return datasets.DatasetDict({split: datasets.Dataset.from_dict(cols) for split, cols in data["rows"].items()})
