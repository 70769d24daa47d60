"""Each DataModule declares only its own arguments: the shared ones are declared once (DataModule.__init__) and
reach it through **kwargs, which jsonargparse resolves, so `data.init_args.batch_size` and the other shared keys stay
keys of every task's DataModule, documented, and fill the DataModule they configure."""

from __future__ import annotations

import inspect

import pytest
from jsonargparse import ArgumentParser

from lit_transformer.data import (
    CaptioningDataModule,
    ClassificationDataModule,
    LanguageModelingDataModule,
    TranslationDataModule,
)
from lit_transformer.data.base import DataModule

# What each task fixes of the shared arguments (so they are not its keys), and the shared ones it redeclares because
# their default or meaning is the task's own.
FIXED = {
    LanguageModelingDataModule: {"max_tokens", "held_out"},
    TranslationDataModule: {"text_column"},
    ClassificationDataModule: set(),
    CaptioningDataModule: {"max_tokens", "predict_batch_size"},
}
REDECLARED = {
    LanguageModelingDataModule: {"dataset"},
    TranslationDataModule: {"dataset", "tokenizer", "vocab_size", "max_tokens", "batch_size"},
    ClassificationDataModule: {"dataset", "held_out", "batch_size"},  # None: 32 texts, or the token budget alone
    CaptioningDataModule: {
        "dataset",
        "text_column",
        "tokenizer",
        "vocab_size",
        "batch_size",
        "held_out",
        "predict_file",
    },
}


def parameters(init) -> set[str]:
    """The arguments a constructor names itself (not those it passes on through **kwargs)."""
    named = inspect.signature(init).parameters.values()
    return {p.name for p in named if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def keys(cls: type) -> dict[str, str]:
    """The init keys jsonargparse gives `cls` (as under data.init_args), with their help."""
    parser = ArgumentParser()
    parser.add_class_arguments(cls, "d")
    return {a.dest[2:]: a.help for a in parser._actions if a.dest.startswith("d.") and a.dest != "d.help"}


@pytest.mark.parametrize("cls", list(FIXED), ids=lambda c: c.__name__)
def test_the_shared_arguments_are_declared_once_and_stay_keys_of_every_task(cls):
    shared = parameters(DataModule.__init__)
    assert parameters(cls.__init__) & shared == REDECLARED[cls]  # the rest come through **kwargs
    found = keys(cls)
    assert shared - FIXED[cls] <= found.keys(), shared - FIXED[cls] - found.keys()
    assert not FIXED[cls] & found.keys()  # a key the task fixes is refused, never silently ignored
    assert all(found[k] for k in shared - FIXED[cls])  # each documented (DataModule's docstring, or the task's)


def test_a_shared_key_fills_the_datamodule(tmp_path):
    parser = ArgumentParser()
    parser.add_argument("--data", type=DataModule)
    config = parser.parse_args(
        ["--data", "lit_transformer.data.LanguageModelingDataModule", "--data.init_args.batch_size", "4",
         "--data.init_args.seed", "7", "--data.init_args.block_size", "16", "--data.init_args.cache_dir", str(tmp_path)]
    )  # fmt: skip
    dm = parser.instantiate(config).data
    assert (dm.batch_size, dm.seed, dm.block_size, str(dm.cache_dir)) == (4, 7, 16, str(tmp_path))
    with pytest.raises(SystemExit):  # a key the task fixes is refused
        parser.parse_args(
            ["--data", "lit_transformer.data.LanguageModelingDataModule", "--data.init_args.max_tokens", "9"]
        )


def counts(cls: type) -> dict[str, bool]:
    """Every integer argument jsonargparse gives `cls` (int, int | None, or a tuple of ints), and whether it is a
    tuple."""
    import typing

    found = {}
    parser = ArgumentParser()
    parser.add_class_arguments(cls, "d")
    for action in parser._actions:
        hint = getattr(action, "_typehint", None)
        if not action.dest.startswith("d.") or hint is None:
            continue
        args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
        if args == [int]:
            found[action.dest[2:]] = False
        elif typing.get_origin(hint) is tuple and set(args) == {int}:
            found[action.dest[2:]] = True
    return found


@pytest.mark.parametrize("cls", list(FIXED), ids=lambda c: c.__name__)
def test_every_count_of_every_datamodule_refuses_a_negative_value_when_built(cls, tmp_path):
    """By rule, not case by case: each integer argument of a DataModule given -1 is refused in one line naming its
    key, when the DataModule is built and before any data is read. A negative num_workers, seed, vocab_size,
    max_examples or lines_per_passage failed deep in the run with a traceback (torch's DataLoader, numpy, the
    tokenizer trainer, itertools.islice), a negative bleu_samples or max_pairs quietly did nothing."""
    from lit_transformer.errors import ConfigError

    found = counts(cls)
    assert {"batch_size", "num_workers", "seed", "vocab_size"} & found.keys()  # the walk sees the shared counts
    for key, is_tuple in sorted(found.items()):
        value = (-1,) * len(inspect.signature(cls.__init__).parameters[key].default) if is_tuple else -1
        with pytest.raises(ConfigError, match=rf"{key}") as refused:
            cls(dataset=str(tmp_path / "corpus.txt"), cache_dir=str(tmp_path / "cache"), **{key: value})
        assert f"data.init_args.{key}" in refused.value.keys, (key, refused.value.keys)
