"""Data: tokenizers, embedded corpora and the two DataModules (language modelling, translation)."""

from .language_modeling import LanguageModelingDataModule
from .translation import TranslationDataModule

__all__ = ["LanguageModelingDataModule", "TranslationDataModule"]
