"""Data: tokenizers, embedded corpora and the DataModules (language modelling, translation, classification,
captioning).

The DataModules are imported lazily: inference (`generate`, `translate`) needs only the encoding helpers, not
Lightning or `datasets`.
"""

from typing import TYPE_CHECKING

__all__ = ["CaptioningDataModule", "ClassificationDataModule", "LanguageModelingDataModule", "TranslationDataModule"]

if TYPE_CHECKING:
    from .captioning import CaptioningDataModule
    from .classification import ClassificationDataModule
    from .language_modeling import LanguageModelingDataModule
    from .translation import TranslationDataModule


def __getattr__(name: str):
    if name == "LanguageModelingDataModule":
        from .language_modeling import LanguageModelingDataModule

        return LanguageModelingDataModule
    if name == "TranslationDataModule":
        from .translation import TranslationDataModule

        return TranslationDataModule
    if name == "CaptioningDataModule":
        from .captioning import CaptioningDataModule

        return CaptioningDataModule
    if name == "ClassificationDataModule":
        from .classification import ClassificationDataModule

        return ClassificationDataModule
    raise AttributeError(f"module 'lit_transformer.data' has no attribute {name!r}")
