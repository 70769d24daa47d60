"""docs/config.md is what `python -m lit_transformer.pages.docgen` writes from the code today, and it lists every field."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from lit_transformer.pages.docgen import PAGE, main, render


def test_the_reference_page_is_current() -> None:
    assert PAGE.read_text() == render(), (
        "docs/config.md is stale: regenerate it with `python -m lit_transformer.pages.docgen`"
    )


def test_every_field_of_the_config_classes_is_listed() -> None:
    """Every field of the architecture, optimizer, LoRA and decoding classes, and every task's DataModule, is a row."""
    from lit_transformer import GenerationConfig, TransformerConfig
    from lit_transformer.engine.optimizers import Optimization
    from lit_transformer.transforms.lora import LoraOptions

    page = PAGE.read_text()
    for group, cls in [("config", TransformerConfig), ("optim", Optimization), ("lora", LoraOptions),
                       ("generation", GenerationConfig)]:  # fmt: skip
        for field in dataclasses.fields(cls):
            assert f"| `model.{group}.{field.name}` |" in page, f"docs/config.md lacks model.{group}.{field.name}"
    for name in (
        "LanguageModelingDataModule",
        "TranslationDataModule",
        "ClassificationDataModule",
        "CaptioningDataModule",
    ):
        assert f".{name}`" in page
    assert "| `data.init_args.dataset` |" in page and "| `checkpoint.every_n_train_steps` |" in page


def test_every_row_has_a_meaning() -> None:
    """The page promises every field's meaning: step_seed.seed's row was empty (its class documented no argument)."""
    rows = [line for line in PAGE.read_text().splitlines() if line.startswith("| `")]
    cells = [re.split(r"(?<!\\)\|", row)[1:-1] for row in rows]  # an escaped \| is inside a cell
    assert all(len(c) == 4 for c in cells), [c for c in cells if len(c) != 4]
    empty = [c[0].strip() for c in cells if not c[3].strip()]
    assert rows and not empty, f"docs/config.md rows without a meaning: {empty}"


def test_check_fails_on_a_stale_page(tmp_path: Path, capsys) -> None:
    stale = tmp_path / "config.md"
    stale.write_text(render().replace("Width of the residual stream.", "Width."))
    try:
        main(["--check", "--out", str(stale)])
    except SystemExit as exit_:
        assert "is stale" in str(exit_.code)
    else:
        raise AssertionError("--check passed a stale page")
    main(["--out", str(stale)])
    main(["--check", "--out", str(stale)])


def test_every_old_spelling_of_a_key_is_listed_with_its_new_key() -> None:
    """The flat keys LitTransformer still accepts (each warns, naming its new key) are rows of the reference, each
    saying its new key; the CHANGELOG starts at the first release, which deprecated nothing."""
    from lit_transformer.engine.deprecated_options import DEPRECATED_NAMES

    page = PAGE.read_text()
    rows = {line.split("|")[1].strip(): line for line in page.splitlines() if line.startswith("| `model.")}
    missing = [name for name in DEPRECATED_NAMES if "Deprecated: model." not in rows.get(f"`model.{name}`", "")]
    assert not missing, f"docs/config.md lacks these old keys with their new ones: {missing}"
    changelog = (PAGE.parents[1] / "CHANGELOG.md").read_text()
    first = changelog.split("## 0.1.0")[1].split("\n## ")[0]
    assert "The first release." in first and "Deprecated" not in first
