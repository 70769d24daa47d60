"""Data: one reader for every file form (sources.py), token shards and loaders, tokenizers, the embedded corpora
(corpora/), and one DataModule per task (language_modeling, translation, classification, captioning).

The DataModules are imported lazily: inference (`generate`, `translate`) needs only the encoding helpers, not
Lightning or `datasets`.
"""

import importlib
from typing import TYPE_CHECKING

# Each DataModule by the module of its task.
DATA_MODULES = {
    "LanguageModelingDataModule": "language_modeling",
    "TranslationDataModule": "translation",
    "ClassificationDataModule": "classification",
    "CaptioningDataModule": "captioning",
}
__all__ = ["CaptioningDataModule", "ClassificationDataModule", "LanguageModelingDataModule", "TranslationDataModule"]

FILLER = "filler"
"""The key that marks an evaluation batch as a filler (loaders.ResumableLoader): run so that every rank runs as many
batches, counted by no metric. Here, not in loaders.py, so that the engine reads it without importing the loaders."""

if TYPE_CHECKING:
    from .captioning import CaptioningDataModule
    from .classification import ClassificationDataModule
    from .language_modeling import LanguageModelingDataModule
    from .translation import TranslationDataModule


def __getattr__(name: str):
    if name in DATA_MODULES:
        return getattr(importlib.import_module(f"{__name__}.{DATA_MODULES[name]}"), name)
    raise AttributeError(f"module 'lit_transformer.data' has no attribute {name!r}")
