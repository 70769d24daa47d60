"""Bring your own data: every task through the CLI on the forms users keep on disk, and the errors they meet.

A matrix of cells, each a (form, task): the test writes a small data set in that form, runs `fit` with validation for
2 steps on a tiny model, then `predict` on a file (or, for captioning, a folder of images) from the checkpoint, and
checks the output rows. Tasks: language modelling (lm), translation, classification, masked LM (mlm) and captioning.
Forms: a folder of .txt, JSONL with extra fields, CSV with quoted commas and string labels, TSV with a header,
parquet with other column names (mapped by config), a folder `datasets` wrote (save_to_disk), nested columns named
with a dot (translation.en), and captions with several references per image; files as users keep them: compressed
(.gz, .bz2, .xz, .zst), CSV as Excel writes it (a byte order mark, CRLF, column names with spaces) and Latin-1 files
read with --data.init_args.encoding. Then the errors, each by its message: a malformed JSONL line (file and line), a
missing column (the columns there are), an empty split (its name), a label at test that training never saw (the
label), a hub name offline (says offline, and how to use local files), bytes that are not UTF-8 (file, line and the
encoding option), a binary file named .csv (file and line) and a file named .gz that is not gzip.

Every cell passes; a form or task that breaks fails its cell by name.
docs/data.md names these tests in its forms x tasks table.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import json
import lzma
import random
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from test_cli import _cli

pytestmark = pytest.mark.slow

# ---- small data sets, written by the test -----------------------------------------------------------------------

WORDS = (
    "the king queen sword ship sea night day love war crown river hill storm ghost letter garden tower bell road "
    "fire stone bread wine horse bird winter summer old young bright dark quiet loud swift slow red blue green"
).split()
SPANISH = dict(
    zip(
        WORDS,
        (
            "el rey reina espada barco mar noche dia amor guerra corona rio colina tormenta fantasma carta jardin torre "
            "campana camino fuego piedra pan vino caballo pajaro invierno verano viejo joven claro oscuro callado "
            "ruidoso veloz lento rojo azul verde"
        ).split(),
        strict=True,
    )
)
LABELS = ("glad", "sad", "so-so, mixed")  # string labels, one with a comma (CSV quotes it)
COLOURS = {"red": (220, 40, 40), "green": (40, 200, 60), "blue": (40, 60, 220), "yellow": (230, 220, 40)}


def _words(rng: random.Random, low: int = 3, high: int = 8) -> list[str]:
    return [rng.choice(WORDS) for _ in range(rng.randint(low, high))]


def _sentence(rng: random.Random) -> str:
    """A sentence with a comma inside (CSV must quote it)."""
    words = _words(rng)
    cut = max(1, len(words) // 2)
    return " ".join(words[:cut]) + ", " + " ".join(words[cut:]) + "."


def _pair(rng: random.Random) -> tuple[str, str]:
    words = _words(rng)
    return " ".join(words) + ", yes.", " ".join(SPANISH[w] for w in words) + ", si."


def _labelled(rng: random.Random) -> tuple[str, str]:
    label = rng.choice(LABELS)
    cue = {"glad": "bright summer garden", "sad": "dark winter storm", "so-so, mixed": "old quiet road"}[label]
    return f"{' '.join(_words(rng, 2, 4))}, {cue} {' '.join(_words(rng, 1, 3))}.", label


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _write_csv(path: Path, rows: list[dict], delimiter: str = ",") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]), delimiter=delimiter)
        writer.writeheader()
        writer.writerows(rows)


def _write_parquet(path: Path, rows: list[dict]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def _write_hf(folder: Path, splits: dict[str, list[dict]], features=None) -> None:
    import datasets

    datasets.DatasetDict(
        {name: datasets.Dataset.from_list(rows, features=features) for name, rows in splits.items()}
    ).save_to_disk(str(folder))


SIZES = {"train": 60, "validation": 12, "test": 12}


def _splits(make: Callable[[random.Random], dict], seed: int = 0) -> dict[str, list[dict]]:
    rng = random.Random(seed)
    return {split: [make(rng) for _ in range(n)] for split, n in SIZES.items()}


FILE_OF = {"train": "train", "validation": "valid", "test": "test"}


def _split_files(folder: Path, splits: dict[str, list[dict]], write: Callable, suffix: str) -> Path:
    for split, rows in splits.items():
        write(folder / f"{FILE_OF[split]}{suffix}", rows)
    return folder


# ---- the tasks: a tiny configuration each, and what predict must write -----------------------------------------------

TRAINER = {
    "accelerator": "cpu",
    "devices": 1,
    "precision": "32-true",
    "max_steps": 2,
    "val_check_interval": 2,
    "check_val_every_n_epoch": None,
    "limit_val_batches": 2,
    "limit_test_batches": 2,
    "num_sanity_val_steps": 0,
    "logger": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
}
TINY = {"d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 64, "dropout": 0.0}
OPTIM = {"lr": 1.0e-3, "schedule": "constant", "warmup_steps": 1}
TASKS = {
    "lm": {
        "model": {
            "config": {"topology": "decoder_only", **TINY},  # max_seq_len follows data.block_size
            "optim": OPTIM,
            "generation": {"max_new_tokens": 6},
        },
        "data": {
            "class_path": "lit_transformer.data.LanguageModelingDataModule",
            "init_args": {"tokenizer": "char", "vocab_size": 128, "block_size": 16, "batch_size": 4},
        },
        "samples": {"generation": {"max_new_tokens": 4}},
    },
    "mlm": {
        "model": {
            "config": {"topology": "encoder_only", "head": "masked_lm", **TINY},
            "optim": OPTIM,
            "task": {"class_path": "lit_transformer.tasks.MaskedLM"},
        },
        "data": {
            "class_path": "lit_transformer.data.LanguageModelingDataModule",
            "init_args": {
                "tokenizer": "char",
                "vocab_size": 128,
                "block_size": 16,
                "batch_size": 4,
                "mask_token": True,
            },
        },
    },
    "translation": {
        "model": {
            "config": {"topology": "encoder_decoder", "max_seq_len": 96, **TINY},
            "optim": OPTIM,
            "task": {"class_path": "lit_transformer.tasks.Translation"},
            "generation": {"num_beams": 1, "max_new_tokens": 6},
        },
        "data": {
            "class_path": "lit_transformer.data.TranslationDataModule",
            "init_args": {
                "tokenizer": "bpe",
                "vocab_size": 200,
                "max_tokens": 512,
                "max_length": 96,
                "bleu_samples": 2,
            },
        },
        "samples": {"num_translations": 1},
    },
    "classification": {
        "model": {
            "config": {
                "topology": "encoder_only",
                "head": "classification",
                "pooling": "mean",
                "max_seq_len": 48,
                **TINY,
            },
            "optim": OPTIM,
            "task": {"class_path": "lit_transformer.tasks.Classification"},
        },
        "data": {
            "class_path": "lit_transformer.data.ClassificationDataModule",
            "init_args": {"tokenizer": "bpe", "vocab_size": 200, "max_length": 48, "batch_size": 8},
        },
    },
    "captioning": {
        "model": {
            "task": "captioning",
            "config": {
                "topology": "encoder_decoder",
                "source": "patches",
                "image_size": [8, 8],
                "patch_size": 4,
                "image_channels": 3,
                **TINY,  # max_seq_len follows data.max_caption_tokens
            },
            "optim": OPTIM,
            "generation": {"num_beams": 1, "max_new_tokens": 6},
        },
        "data": {
            "class_path": "lit_transformer.data.CaptioningDataModule",
            "init_args": {
                "image_size": [8, 8],
                "channels": 3,
                "tokenizer": "char",
                "vocab_size": 64,
                "batch_size": 4,
                "held_out": 0.3,
                "bleu_samples": 2,
            },
        },
    },
}
PROMPTS = ["the king, the", "", "a quiet night"]  # predict's inputs: one a line, an empty line too
SOURCES = ["the king, the sea.", "old red wine."]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """One folder for the module: every task's YAML, one cache shared by every cell (keyed by content), the images."""
    root = tmp_path_factory.mktemp("own_data")
    for task, config in TASKS.items():
        full = {"seed_everything": 1, **config, "trainer": TRAINER, "checkpoint": {"every_n_train_steps": 2}}
        (root / f"{task}.yaml").write_text(yaml.safe_dump(full))
    (root / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
    (root / "sources.txt").write_text("\n".join(SOURCES) + "\n")
    _images(root / "images", 30)
    _images(root / "predict_images", 3, seed=7)
    return root


def _images(folder: Path, count: int, seed: int = 0) -> None:
    """count 8 x 8 RGB PNGs: a square of one colour on a field of another (the caption names both)."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    names = list(COLOURS)
    for i in range(count):
        square, field = rng.sample(names, 2)
        image = Image.new("RGB", (8, 8), COLOURS[field])
        image.paste(COLOURS[square], (2, 2, 6, 6))
        image.save(folder / f"img{i:02d}_{square}_{field}.png")


def _captions(images: Path, references: int = 3) -> list[dict]:
    """Several references per image: one row per caption, some with commas."""
    rows = []
    for path in sorted(images.glob("*.png")):
        _, square, field = path.stem.split("_")
        phrasings = [f"a {square} square on {field}", f"{square}, on a {field} field", f"a small {square} square"]
        rows += [{"image": path.name, "caption": c} for c in phrasings[:references]]
    return rows


def _run(task: str, work: Path, run: Path, dataset: Path | str, *extra: str, ok: bool = True):
    """`fit` TASK's tiny YAML on `dataset` for 2 steps with validation, into `run`."""
    args = ["fit", "--config", str(work / f"{task}.yaml"), "--data.init_args.dataset", str(dataset)]
    args += ["--data.init_args.cache_dir", str(work / "cache"), "--trainer.default_root_dir", str(run)]
    args += ["--checkpoint.dirpath", str(run / "checkpoints"), *extra]
    return _cli(*args, cwd=run if run.is_dir() else work, ok=ok)


def _fit_and_predict(task: str, work: Path, run: Path, dataset: Path | str, *extra: str) -> list[dict]:
    """The cell: fit for 2 steps with validation, then predict from its checkpoint; the rows predict wrote."""
    run.mkdir(parents=True, exist_ok=True)
    out = _run(task, work, run, dataset, *extra)
    ckpt = run / "checkpoints" / "last.ckpt"
    assert ckpt.is_file(), out.stderr[-2000:]
    from lit_transformer.checkpoints.files import load_checkpoint

    assert load_checkpoint(ckpt)["global_step"] == 2
    # validation ran after step 2: the best checkpoint is named by its validation NLL, a finite positive number
    (best,) = (run / "checkpoints").glob("best-step000002-val_nll*.ckpt")
    assert 0 < float(best.stem.split("val_nll")[1]) < 100, best.name
    output = run / "predictions.jsonl"
    common = ["--config", str(work / f"{task}.yaml"), "--data.init_args.dataset", str(dataset)]
    common += ["--data.init_args.cache_dir", str(work / "cache"), "--ckpt_path", str(ckpt), *extra]
    common += ["--predictions.output", str(output)]
    if task == "mlm":  # a masked LM has no predict: its test scores it
        printed = _cli("test", *common, cwd=run).stdout
        assert "test/loss" in printed and "test/accuracy" in printed, printed
        return []
    if task == "captioning":
        _cli("predict", *common, "--data.init_args.predict_file", str(work / "predict_images"), cwd=run)
    else:
        inputs = work / ("sources.txt" if task == "translation" else "prompts.txt")
        _cli("predict", *common, "--data.init_args.predict_file", str(inputs), cwd=run)
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    _check_predictions(task, work, rows)
    return rows


def _check_predictions(task: str, work: Path, rows: list[dict]) -> None:
    if task == "captioning":
        assert [r["image"] for r in rows] == sorted(p.name for p in (work / "predict_images").glob("*.png"))
        assert all(isinstance(r["caption"], str) for r in rows)
    elif task == "classification":
        assert [r["input"] for r in rows] == PROMPTS
        for row in rows:
            assert row["label"] in LABELS and set(row["probabilities"]) == set(LABELS)
            assert sum(row["probabilities"].values()) == pytest.approx(1.0, abs=1e-5)
    elif task == "translation":
        assert [r["input"] for r in rows] == SOURCES
        assert all(isinstance(r["output"], str) and len(r["tokens"]) <= 6 for r in rows)
    else:
        assert [r["input"] for r in rows] == PROMPTS
        assert all(isinstance(r["output"], str) and len(r["tokens"]) <= 6 for r in rows)


# ---- the forms: each writes its data set for a task, and says how the config maps its columns -----------------------


def _lm_record(rng: random.Random) -> dict:
    return {"text": " ".join(_sentence(rng) for _ in range(3))}


def form_txt_folder(task: str, folder: Path) -> tuple[Path, list[str]]:
    """A folder of .txt books with no split in their names: held-out splits are carved from each book's lines."""
    rng = random.Random(0)
    folder.mkdir(parents=True)
    for i in range(20):
        (folder / f"book{i:02d}.txt").write_text("\n".join(_sentence(rng) for _ in range(40)) + "\n")
    return folder, []


def _records(task: str, seed: int = 0) -> dict[str, list[dict]]:
    """Each split's records for a task, in the default column names, with extra fields a user's data would hold."""
    if task in ("lm", "mlm"):
        return _splits(lambda rng: {**_lm_record(rng), "id": rng.randrange(10**6), "origin": "made-up"}, seed)
    if task == "translation":
        return _splits(
            lambda rng: dict(zip(("en", "es"), _pair(rng), strict=True)) | {"id": rng.randrange(10**6)}, seed
        )
    if task == "classification":

        def labelled(rng):
            text, label = _labelled(rng)
            return {"text": text, "label": label, "stars": rng.randint(1, 5), "user": f"u{rng.randrange(99)}"}

        return _splits(labelled, seed)
    raise ValueError(task)


def form_jsonl(task: str, folder: Path) -> tuple[Path, list[str]]:
    """JSON lines with extra fields; text tasks: train/valid/test files in a folder; captioning: one captions file."""
    if task == "captioning":
        rows = [{**r, "photographer": "me", "width": 8} for r in _captions(folder.parent.parent / "images")]
        _write_jsonl(folder / "captions.jsonl", rows)
        return folder / "captions.jsonl", ["--data.init_args.images_dir", str(folder.parent.parent / "images")]
    return _split_files(folder, _records(task), _write_jsonl, ".jsonl"), []


def form_csv(task: str, folder: Path) -> tuple[Path, list[str]]:
    """CSV whose texts hold quoted commas and whose labels are strings (one with a comma); captioning: a split column."""
    if task == "captioning":
        images = folder.parent.parent / "images"
        rows = _captions(images)
        names = sorted({r["image"] for r in rows})
        split = {n: ("validation" if i % 5 == 1 else "test" if i % 5 == 2 else "train") for i, n in enumerate(names)}
        _write_csv(folder / "captions.csv", [{**r, "split": split[r["image"]]} for r in rows])
        return folder / "captions.csv", ["--data.init_args.images_dir", str(images)]
    return _split_files(folder, _records(task), _write_csv, ".csv"), []


def form_tsv(task: str, folder: Path) -> tuple[Path, list[str]]:
    """Tab-separated with a header row."""
    if task == "captioning":
        _write_csv(folder / "captions.tsv", _captions(folder.parent.parent / "images"), delimiter="\t")
        return folder / "captions.tsv", ["--data.init_args.images_dir", str(folder.parent.parent / "images")]
    return _split_files(folder, _records(task), lambda p, r: _write_csv(p, r, "\t"), ".tsv"), []


RENAMES = {  # parquet with other column names, mapped by config
    "lm": ({"text": "body"}, ["--data.init_args.text_column", "body"]),
    "mlm": ({"text": "body"}, ["--data.init_args.text_column", "body"]),
    "translation": (
        {"en": "english", "es": "spanish"},
        ["--data.init_args.source_column", "english", "--data.init_args.target_column", "spanish"],
    ),
    "classification": (
        {"text": "review", "label": "verdict"},
        ["--data.init_args.text_column", "review", "--data.init_args.label_column", "verdict"],
    ),
    "captioning": (
        {"image": "file", "caption": "description"},
        ["--data.init_args.image_column", "file", "--data.init_args.text_column", "description"],
    ),
}


def _renamed(rows: list[dict], renames: dict[str, str]) -> list[dict]:
    return [{renames.get(k, k): v for k, v in row.items()} for row in rows]


def form_parquet(task: str, folder: Path) -> tuple[Path, list[str]]:
    """Parquet files whose columns have other names than the defaults; the config maps them."""
    renames, args = RENAMES[task]
    if task == "captioning":
        images = folder.parent.parent / "images"
        _write_parquet(folder / "captions.parquet", _renamed(_captions(images), renames))
        return folder / "captions.parquet", [*args, "--data.init_args.images_dir", str(images)]
    splits = {split: _renamed(rows, renames) for split, rows in _records(task).items()}
    return _split_files(folder, splits, _write_parquet, ".parquet"), args


def form_hf_disk(task: str, folder: Path) -> tuple[Path, list[str]]:
    """A DatasetDict that `datasets` wrote with save_to_disk (train/validation/test); captioning: Image features."""
    if task == "captioning":
        import datasets
        from PIL import Image

        images = folder.parent.parent / "images"
        rows = _captions(images)
        by_image: dict[str, list[str]] = {}
        for row in rows:
            by_image.setdefault(row["image"], []).append(row["caption"])
        names = sorted(by_image)
        features = datasets.Features(
            {"image": datasets.Image(), "caption": datasets.Sequence(datasets.Value("string"))}
        )
        split_rows = {"train": names[:20], "validation": names[20:25], "test": names[25:]}
        _write_hf(
            folder / "data",
            {
                split: [{"image": Image.open(images / n), "caption": by_image[n]} for n in ns]
                for split, ns in split_rows.items()
            },
            features,
        )
        return folder / "data", []
    _write_hf(folder / "data", _records(task))
    return folder / "data", []


def form_dotted(task: str, folder: Path) -> tuple[Path, list[str]]:
    """JSON lines whose fields are nested; the config names them with a dot: translation.en, review.body."""
    if task == "captioning":
        images = folder.parent.parent / "images"
        rows = [{"image": r["image"], "annotation": {"caption": r["caption"], "by": "me"}} for r in _captions(images)]
        _write_jsonl(folder / "captions.jsonl", rows)
        args = ["--data.init_args.text_column", "annotation.caption", "--data.init_args.images_dir", str(images)]
        return folder / "captions.jsonl", args
    records = _records(task)
    if task == "translation":
        nested = {
            s: [{"translation": {"en": r["en"], "es": r["es"]}, "id": r["id"]} for r in rows]
            for s, rows in records.items()
        }
        args = ["--data.init_args.source_column", "translation.en", "--data.init_args.target_column", "translation.es"]
    elif task == "classification":
        nested = {
            s: [{"review": {"body": r["text"], "verdict": r["label"]}, "user": r["user"]} for r in rows]
            for s, rows in records.items()
        }
        args = ["--data.init_args.text_column", "review.body", "--data.init_args.label_column", "review.verdict"]
    else:
        nested = {s: [{"doc": {"body": r["text"]}, "id": r["id"]} for r in rows] for s, rows in records.items()}
        args = ["--data.init_args.text_column", "doc.body"]
    return _split_files(folder, nested, _write_jsonl, ".jsonl"), args


def form_translation_dict(task: str, folder: Path) -> tuple[Path, list[str]]:
    """The Hugging Face translation form: a `translation` mapping per row, read by source_lang and target_lang."""
    nested = {
        s: [{"translation": {"en": r["en"], "es": r["es"]}, "id": r["id"]} for r in rows]
        for s, rows in _records(task).items()
    }
    return _split_files(folder, nested, _write_jsonl, ".jsonl"), []


def form_references(task: str, folder: Path) -> tuple[Path, list[str]]:
    """Captions given as a list per image (several references in one JSON line) rather than one row per caption."""
    images = folder.parent.parent / "images"
    by_image: dict[str, list[str]] = {}
    for row in _captions(images):
        by_image.setdefault(row["image"], []).append(row["caption"])
    _write_jsonl(folder / "captions.jsonl", [{"image": n, "caption": c} for n, c in sorted(by_image.items())])
    return folder / "captions.jsonl", ["--data.init_args.images_dir", str(images)]


def _compressed(form: str, suffix: str) -> Callable[[str, Path], tuple[Path, list[str]]]:
    """The form `form` with each of its files compressed, as users keep corpora: train.jsonl -> train.jsonl.gz."""

    def write(task: str, folder: Path) -> tuple[Path, list[str]]:
        dataset, args = FORMS[form](task, folder)
        files = [dataset] if dataset.is_file() else sorted(p for p in dataset.rglob("*") if p.is_file())
        for path in files:
            packed = path.with_name(path.name + suffix)
            if suffix == ".zst":
                import zstandard

                packed.write_bytes(zstandard.ZstdCompressor().compress(path.read_bytes()))
            else:
                with {".gz": gzip, ".bz2": bz2, ".xz": lzma}[suffix].open(packed, "wb") as handle:
                    handle.write(path.read_bytes())
            path.unlink()
        return (dataset.with_name(dataset.name + suffix) if dataset.suffix else dataset), args

    return write


EXCEL_COLUMNS = {  # column names with spaces, as a spreadsheet has them, mapped by config
    "lm": ({"text": "Review Text"}, ["--data.init_args.text_column", "Review Text"]),
    "mlm": ({"text": "Review Text"}, ["--data.init_args.text_column", "Review Text"]),
    "translation": (
        {"en": "English Text", "es": "Spanish Text"},
        ["--data.init_args.source_column", "English Text", "--data.init_args.target_column", "Spanish Text"],
    ),
    "classification": (
        {"text": "Review Text", "label": "Rating Label"},
        ["--data.init_args.text_column", "Review Text", "--data.init_args.label_column", "Rating Label"],
    ),
    "captioning": (
        {"image": "Image File", "caption": "Caption Text"},
        ["--data.init_args.image_column", "Image File", "--data.init_args.text_column", "Caption Text"],
    ),
}


def form_excel_csv(task: str, folder: Path) -> tuple[Path, list[str]]:
    """CSV as Excel writes it: a UTF-8 byte order mark, CRLF row ends, column names with spaces."""
    renames, args = EXCEL_COLUMNS[task]

    def write(path: Path, rows: list[dict]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = _renamed(rows, renames)
        with path.open("w", encoding="utf-8-sig", newline="") as handle:  # utf-8-sig: the byte order mark
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]), lineterminator="\r\n")
            writer.writeheader()
            writer.writerows(rows)

    if task == "captioning":
        images = folder.parent.parent / "images"
        write(folder / "captions.csv", _captions(images))
        return folder / "captions.csv", [*args, "--data.init_args.images_dir", str(images)]
    return _split_files(folder, _records(task), write, ".csv"), args


def _in_latin1(task: str, folder: Path) -> tuple[Path, list[str]]:
    """The text forms (a folder of .txt books; CSV) written in Latin-1, with accented letters in the texts."""
    dataset, args = (form_txt_folder if task in ("lm", "mlm") else form_csv)(task, folder)
    for path in [dataset] if dataset.is_file() else sorted(p for p in dataset.rglob("*") if p.is_file()):
        text = path.read_text(encoding="utf-8").replace("the", "th\u00e9").replace(" on ", " \u00f3n ")
        path.write_bytes(text.encode("latin-1"))
    return dataset, args


def form_latin1(task: str, folder: Path) -> tuple[Path, list[str]]:
    """Latin-1 files, read with the encoding they are in (--data.init_args.encoding latin-1)."""
    dataset, args = _in_latin1(task, folder)
    return dataset, [*args, "--data.init_args.encoding", "latin-1"]


FORMS = {
    "txt_folder": form_txt_folder,
    "jsonl": form_jsonl,
    "csv": form_csv,
    "tsv": form_tsv,
    "parquet": form_parquet,
    "hf_disk": form_hf_disk,
    "dotted": form_dotted,
    "translation_dict": form_translation_dict,
    "references": form_references,
    "excel_csv": form_excel_csv,
    "latin1": form_latin1,
}
FORMS |= {  # files as users keep them: compressed
    "jsonl.gz": _compressed("jsonl", ".gz"),
    "csv.bz2": _compressed("csv", ".bz2"),
    "tsv.xz": _compressed("tsv", ".xz"),
    "txt_folder.gz": _compressed("txt_folder", ".gz"),
    "jsonl.zst": _compressed("jsonl", ".zst"),
}
CELLS = [
    ("txt_folder", "lm"),
    ("txt_folder", "mlm"),
    ("jsonl", "lm"),
    ("jsonl", "translation"),
    ("jsonl", "classification"),
    ("jsonl", "mlm"),
    ("jsonl", "captioning"),
    ("csv", "lm"),
    ("csv", "translation"),
    ("csv", "classification"),
    ("csv", "mlm"),
    ("csv", "captioning"),
    ("tsv", "lm"),
    ("tsv", "translation"),
    ("tsv", "classification"),
    ("tsv", "mlm"),
    ("tsv", "captioning"),
    ("parquet", "lm"),
    ("parquet", "translation"),
    ("parquet", "classification"),
    ("parquet", "mlm"),
    ("parquet", "captioning"),
    ("hf_disk", "lm"),
    ("hf_disk", "translation"),
    ("hf_disk", "classification"),
    ("hf_disk", "mlm"),
    ("hf_disk", "captioning"),
    ("dotted", "lm"),
    ("dotted", "translation"),
    ("dotted", "classification"),
    ("dotted", "mlm"),
    ("dotted", "captioning"),
    ("translation_dict", "translation"),
    ("references", "captioning"),
    *[("jsonl.gz", t) for t in ("lm", "translation", "classification", "mlm", "captioning")],
    *[("csv.bz2", t) for t in ("translation", "classification", "captioning")],
    *[("tsv.xz", t) for t in ("lm", "captioning")],
    ("txt_folder.gz", "lm"),
    ("jsonl.zst", "classification"),
    *[("excel_csv", t) for t in ("lm", "translation", "classification", "captioning")],
    *[("latin1", t) for t in ("lm", "translation", "classification", "captioning")],
]


def _cell(form: str, task: str):
    """A (form or error, task) cell, its id `form-task`."""
    return pytest.param(form, task, id=f"{form}-{task}")


@pytest.mark.parametrize(("form", "task"), [_cell(f, t) for f, t in CELLS])
def test_fit_and_predict(form: str, task: str, work: Path):
    if form.endswith(".zst"):
        pytest.importorskip("zstandard")
    cell = work / f"{form}-{task}"
    dataset, args = FORMS[form](task, cell / "data")
    _fit_and_predict(task, work, cell / "run", dataset, *args)


# ---- the errors a user meets, each by its message ----------------------------------------------------------------------


def _broken_line(task: str, folder: Path) -> tuple[Path, list[str], list[str]]:
    """Line 3 of the training file is not JSON: the message names the file and the line."""
    if task == "captioning":
        dataset, args = form_jsonl(task, folder)
        lines = dataset.read_text().splitlines(keepends=True)
        dataset.write_text("".join(lines[:2]) + '{"image": "img00.png", "caption": "a red\n' + "".join(lines[2:]))
        return dataset, args, ["captions.jsonl:3"]
    dataset, args = form_jsonl(task, folder)
    lines = (dataset / "train.jsonl").read_text().splitlines(keepends=True)
    (dataset / "train.jsonl").write_text("".join(lines[:2]) + '{"text": "cut short\n' + "".join(lines[2:]))
    return dataset, args, ["train.jsonl:3"]


MISSING = {  # a column the config names that the data lacks; the message names the columns that are there
    "lm": (["--data.init_args.text_column", "body"], ["body", "text", "id", "origin"]),
    "translation": (["--data.init_args.source_lang", "fr"], ["fr", "en", "es", "id"]),
    "classification": (["--data.init_args.label_column", "sentiment"], ["sentiment", "text", "label", "stars", "user"]),
    "captioning": (
        ["--data.init_args.text_column", "description"],
        ["description", "image", "caption", "photographer"],
    ),
}


def _missing_column(task: str, folder: Path) -> tuple[Path, list[str], list[str]]:
    dataset, args = form_jsonl(task, folder)
    extra, expected = MISSING[task]
    return dataset, [*args, *extra], expected


def _empty_split(task: str, folder: Path) -> tuple[Path, list[str], list[str]]:
    """The validation file is there but holds nothing: the message names the split."""
    if task == "captioning":  # a split column that gives no image to validation
        dataset, args = form_csv(task, folder)
        with dataset.open(newline="") as handle:
            rows = [
                {**r, "split": "train" if r["split"] == "validation" else r["split"]} for r in csv.DictReader(handle)
            ]
        _write_csv(dataset, rows)
        return dataset, args, ["validation"]
    dataset, args = form_jsonl(task, folder)
    (dataset / "valid.jsonl").write_text("")
    return dataset, args, ["validation"]


def _unseen_label(task: str, folder: Path) -> tuple[Path, list[str], list[str]]:
    """A label in the test file that no training text has: the message names it."""
    dataset, args = form_jsonl(task, folder)
    with (dataset / "test.jsonl").open("a") as handle:
        handle.write(
            json.dumps({"text": "a furious red storm, again.", "label": "furious", "stars": 1, "user": "u1"}) + "\n"
        )
    return dataset, args, ["furious"]


def _offline(task: str, folder: Path) -> tuple[str, list[str], list[str]]:
    """A hub name while offline (HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1): fails at once, saying how to use local files."""
    return "someone/made-up-reviews", [], ["offline", "local files"]


def _not_utf8(task: str, folder: Path) -> tuple[Path, list[str], list[str]]:
    """Latin-1 files read as UTF-8: the run stops naming the file and line and the option that reads them."""
    dataset, args = _in_latin1(task, folder)
    return dataset, args, ["is not utf-8 text", "--data.init_args.encoding latin-1"]


def _binary_csv(task: str, folder: Path) -> tuple[Path, list[str], list[str]]:
    """The training CSV is an image (a file that is not the form its name says): the file and what it holds."""
    dataset, args = form_csv(task, folder)
    train = dataset if dataset.is_file() else dataset / "train.csv"
    train.write_bytes(next((folder.parent.parent / "images").glob("*.png")).read_bytes())
    return dataset, args, [f"{train.name} is a PNG image, not the text its name says"]


def _not_gzip(task: str, folder: Path) -> tuple[Path, list[str], list[str]]:
    """A file named .gz that is not gzip data."""
    dataset, args = form_jsonl(task, folder)
    (dataset / "train.jsonl").rename(dataset / "train.jsonl.gz")
    return dataset, args, ["train.jsonl.gz is not gzip data"]


ERRORS = {
    "malformed_jsonl": _broken_line,
    "missing_column": _missing_column,
    "empty_split": _empty_split,
    "unseen_label": _unseen_label,
    "offline_hub": _offline,
    "not_utf8": _not_utf8,
    "binary_csv": _binary_csv,
    "not_gzip": _not_gzip,
}
ERROR_CELLS = [
    *[("malformed_jsonl", t) for t in ("lm", "translation", "classification", "captioning")],
    *[("missing_column", t) for t in ("lm", "translation", "classification", "captioning")],
    *[("empty_split", t) for t in ("lm", "translation", "classification", "captioning")],
    ("unseen_label", "classification"),
    *[("offline_hub", t) for t in ("lm", "mlm", "translation", "classification", "captioning")],
    *[("not_utf8", t) for t in ("lm", "translation", "classification", "captioning")],
    *[("binary_csv", t) for t in ("lm", "classification", "captioning")],
    *[("not_gzip", t) for t in ("lm", "classification")],
]


@pytest.mark.parametrize(("error", "task"), [_cell(e, t) for e, t in ERROR_CELLS])
def test_an_error_says_what_is_wrong(error: str, task: str, work: Path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cell = work / f"{error}-{task}"
    dataset, args, expected = ERRORS[error](task, cell / "data")
    (cell / "run").mkdir(parents=True)
    failed = _run(task, work, cell / "run", dataset, *args, ok=False)
    message = failed.stderr.strip().splitlines()[-1] if failed.stderr.strip() else ""
    for part in expected:  # a name as a whole word, however the message quotes it; a phrase as it is
        pattern = rf"\b{re.escape(part)}\b" if part.isidentifier() else re.escape(part)
        assert re.search(pattern, message), f"{message!r} lacks {part!r}"


def test_every_command_of_the_data_page_parses_and_sets_what_it_says() -> None:
    """docs/data.md's commands parse with the CLI's own parsers, and each flag's value is in the resolved config (a
    flag the parser took but a renamed field dropped would fail here)."""
    from test_multinode import lit_transformer_words, parse

    text = (Path(__file__).resolve().parents[1] / "docs" / "data.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    # the CLI's commands (`bench data-memory`, the benchmark's, is parsed by tests/test_doc_commands.py)
    commands = [
        line.strip() for b in blocks for line in b.splitlines() if "lit_transformer" in line and " bench " not in line
    ]
    assert len(commands) == 11, commands
    for command in commands:
        words = lit_transformer_words(command)[2]
        resolved = yaml.safe_load(parse(words) or "{}")
        flags = [(words[i][2:], words[i + 1]) for i in range(1, len(words) - 1) if words[i].startswith("--")]
        assert flags, command
        for flag, value in flags:
            if flag == "config" or words[0] == "prepare":  # prepare stops before printing a config
                continue
            found = resolved
            for key in flag.split("."):
                found = found[key]
            if flag == "data":
                found = found["class_path"]
            assert found == yaml.safe_load(value), f"{command}: --{flag} {value} resolved to {found!r}"
