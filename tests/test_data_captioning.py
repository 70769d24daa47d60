"""CaptioningDataModule: the embedded digit strips, a folder of images with a captions file, precomputed features,
several references per image, and the errors a user meets."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lit_transformer.data.captioning import CaptioningDataModule
from lit_transformer.data.corpora.digits import DIGIT_WORDS, digit_scans, digit_strips, scan_split
from lit_transformer.data.loaders import target_batch
from lit_transformer.data.sources import OfflineError
from lit_transformer.data.text import token_ids


def test_digit_strips_of_a_split_use_only_that_splits_scans():
    """Every slot of a test strip is pixel for pixel one of the held-out scans, none of the training scans; the
    caption names its digits in words."""
    scans, labels = digit_scans()
    split = scan_split(len(scans))
    assert sorted(np.concatenate(list(split.values()))) == list(range(len(scans)))
    test = digit_strips("test", 50)
    test_scans = {scans[i].tobytes(): labels[i] for i in split["test"]}
    train_scans = {scans[i].tobytes() for i in split["train"]}
    for image, digits, caption in zip(test.images, test.digits, test.captions, strict=True):
        assert 3 <= len(digits) <= 6 and caption == " ".join(DIGIT_WORDS[d] for d in digits)
        for slot, digit in enumerate(digits):
            pixels = np.ascontiguousarray(image[0, :, 8 * slot : 8 * slot + 8]).tobytes()
            assert test_scans.get(pixels) == digit and pixels not in train_scans
        assert not image[0, :, 8 * len(digits) :].any()  # blank after the last digit
    assert digit_strips("test", 50).captions == test.captions  # the same arguments, the same strips


def test_target_batch_lays_out_the_decoder_side():
    batch = target_batch([[5, 6, 7], [8]], pad_id=0, bos_id=1, eos_id=2)
    assert batch["tgt_in"].tolist() == [[1, 5, 6, 7], [1, 8, 0, 0]]
    assert batch["labels"].tolist() == [[5, 6, 7, 2], [8, 2, -100, -100]]
    assert batch["tgt_mask"].tolist() == [[True] * 4, [True, True, False, False]]


def _write_images(folder, names, size=(12, 20)):
    from PIL import Image

    rng = np.random.default_rng(0)
    for name in names:
        Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)).save(folder / name)


@pytest.fixture
def caption_folder(tmp_path):
    names = [f"img{i}.png" for i in range(9)]
    (tmp_path / "images").mkdir()
    _write_images(tmp_path / "images", names)
    rows = []
    for i, name in enumerate(names):
        split = ["train"] * 5 + ["validation"] * 2 + ["test"] * 2
        rows += [{"image": name, "caption": f"a picture number {i % 3}", "split": split[i]}]
        rows += [{"image": name, "caption": f"image {i % 3} again", "split": split[i]}]  # a second reference
    path = tmp_path / "captions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path, path


def _digits(tmp_path, **kwargs) -> CaptioningDataModule:
    args = dict(strips=(64, 8, 8), batch_size=8, vocab_size=40, cache_dir=str(tmp_path / "cache"))
    return CaptioningDataModule("digits", **{**args, **kwargs})


def test_the_digits_take_the_one_path_through_the_shards(tmp_path):
    """The embedded digit strips are prepared into shards like any captions file: each image named by its split and
    index, its pixels read from the strips when a batch is built, its caption's ids from the shards."""
    dm = _digits(tmp_path)
    root = dm.prepare()
    assert (root / "manifest.json").is_file()
    dm.setup()
    strips = digit_strips("validation", 8)
    validation = dm.splits["validation"]
    assert validation.names == [f"validation-{i}" for i in range(8)]
    assert [validation.references(i) for i in range(8)] == [[c] for c in strips.captions]
    batch = next(iter(dm.val_dataloader()))
    assert torch.equal(batch["src"], torch.from_numpy(strips.images[:8]))
    expected = [ids + [dm.eos_token_id] for ids in token_ids(dm.tokenizer, strips.captions[:8])]
    assert [row[row != -100].tolist() for row in batch["labels"]] == expected


@pytest.mark.parametrize("num_workers", [0, 1])
def test_captioning_training_batches_resume_mid_epoch_exactly(tmp_path, num_workers):
    """The captioning loader is the resumable loader every task uses: a state saved k batches in resumes on the next
    batch, across the epoch's end too; its dataset and collate pickle (workers started by spawn get copies)."""
    import itertools
    import pickle

    def images(batches) -> list[list[str]]:
        return [b["image"] for b in batches]

    reference = _digits(tmp_path).train_dataloader()
    uninterrupted = images(itertools.chain(reference, reference))  # two epochs of 8 batches
    assert len(uninterrupted) == 16 and uninterrupted[:8] != uninterrupted[8:]
    for k in (0, 3, 8, 11):
        interrupted = _digits(tmp_path, num_workers=num_workers).train_dataloader()
        seen = images(itertools.islice(itertools.chain(interrupted, interrupted), k))
        resumed = _digits(tmp_path, num_workers=num_workers).train_dataloader()
        resumed.load_state_dict(interrupted.state_dict())
        rest = images(itertools.chain(resumed, resumed) if k < 8 else resumed)
        assert seen + rest == uninterrupted, k
    pickle.loads(pickle.dumps((reference.dataset, reference.collate_fn)))


def test_a_captions_file_gives_pairs_for_training_and_references_for_evaluation(caption_folder, tmp_path):
    root, path = caption_folder
    dm = CaptioningDataModule(
        str(path), images_dir=str(root / "images"), image_size=(8, 16), channels=3, batch_size=4,
        tokenizer="bpe", vocab_size=60, cache_dir=str(tmp_path / "cache"),
    )  # fmt: skip
    dm.setup()
    assert len(dm.train_dataloader().dataset) == 10  # 5 images x 2 captions
    batch = next(iter(dm.val_dataloader()))
    assert batch["src"].shape == (2, 3, 8, 16) and 0.0 <= batch["src"].min() and batch["src"].max() <= 1.0
    assert batch["references"] == [["a picture number 2", "image 2 again"], ["a picture number 0", "image 0 again"]]
    decoded = dm.tokenizer.decode(batch["labels"][0][batch["labels"][0] >= 0].tolist()[:-1])
    assert decoded == "a picture number 2"  # the loss reads the first reference


def test_a_captions_file_is_prepared_once_into_shards_with_the_images_beside_the_ids(caption_folder, tmp_path):
    """prepare streams the rows into token shards, each caption's image and text as a JSON line beside its ids; a
    second DataModule finds them; training batches read the ids back and keep every reference of the image."""
    root, path = caption_folder
    args = dict(images_dir=str(root / "images"), image_size=(8, 16), channels=3, batch_size=10, tokenizer="bpe",
                vocab_size=60, cache_dir=str(tmp_path / "cache"))  # fmt: skip
    dm = CaptioningDataModule(str(path), **args)
    prepared = dm.prepare()
    info = json.loads((prepared / "manifest.json").read_text())
    assert {s: info["splits"][s]["texts"] for s in info["splits"]} == {"train": 10, "validation": 4, "test": 4}
    first = (prepared / "train" / "shard-00000.extras.jsonl").read_text().splitlines()[0]
    assert json.loads(first) == ["img0.png", str(root), "a picture number 0"]
    assert CaptioningDataModule(str(path), **args).prepare() == prepared
    dm.setup()
    batch = next(iter(dm.loader("train", shuffle=False)))
    assert batch["image"][:2] == ["img0.png", "img0.png"] and batch["references"][1] == [
        "a picture number 0", "image 0 again"
    ]  # fmt: skip
    decoded = dm.tokenizer.decode(batch["labels"][1][batch["labels"][1] >= 0].tolist()[:-1])
    assert decoded == "image 0 again"


def test_precomputed_features_are_padded_with_a_mask(caption_folder, tmp_path):
    root, path = caption_folder
    features = tmp_path / "features"
    features.mkdir()
    from safetensors.numpy import save_file

    for i in range(9):
        array = np.full((2 + i % 3, 5), float(i), dtype=np.float32)
        if i % 2:  # either format, one tensor a file
            save_file({"features": array}, str(features / f"img{i}.safetensors"))
        else:
            np.save(features / f"img{i}.npy", array)
    dm = CaptioningDataModule(
        str(path), images_dir=str(root / "images"), features_dir=str(features), batch_size=3,
        tokenizer="bpe", vocab_size=60, cache_dir=str(tmp_path / "cache"),
    )  # fmt: skip
    dm.setup()
    train = dm.splits["train"]
    batch = dm._collate(train)([(0, train.first(0), train.load(0)), (1, train.first(1), train.load(1))])
    assert batch["src"].shape == (2, 3, 5)
    assert batch["src_mask"].tolist() == [[True, True, False], [True, True, True]]
    assert torch.equal(batch["src"][1], torch.ones(3, 5))


def test_without_a_split_column_images_are_carved_by_name(tmp_path):
    names = [f"photo{i}.png" for i in range(60)]
    _write_images(tmp_path, names)
    path = tmp_path / "captions.csv"
    path.write_text("image,caption\n" + "".join(f"{n},caption of {n}\n" for n in names))
    dm = CaptioningDataModule(str(path), image_size=(8, 8), channels=1, held_out=0.2, cache_dir=str(tmp_path / "c"))
    dm.setup()
    splits = {name: set(split.names) for name, split in dm.splits.items()}
    assert sum(map(len, splits.values())) == 60 and not splits["train"] & (splits["validation"] | splits["test"])
    assert dm.splits["test"].load(0).shape == (1, 8, 8)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"image": "a.png"}\n', r"captions.jsonl has no column 'caption'; its columns are \['image'\]"),
        ('{"image": "a.png", "caption": "x"}\n{"image": "b.png"}\n', r"captions.jsonl:2 has no column 'caption'"),
        ('{"image": "a.png", "caption": "x"}\nnot json\n', "captions.jsonl:2 is not valid JSON"),
    ],
)
def test_a_malformed_captions_file_names_the_line(tmp_path, content, message):
    path = tmp_path / "captions.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        CaptioningDataModule(str(path), cache_dir=str(tmp_path / "c")).setup()


def test_a_missing_feature_file_names_the_image(caption_folder, tmp_path):
    root, path = caption_folder
    (tmp_path / "empty").mkdir()
    dm = CaptioningDataModule(str(path), features_dir=str(tmp_path / "empty"), cache_dir=str(tmp_path / "c"))
    with pytest.raises(FileNotFoundError, match="no features for image 'img0'"):
        dm.setup()


def test_missing_and_unreadable_images_are_named_not_a_traceback(caption_folder, tmp_path):
    """A row naming an image that is not there ended the run with a FileNotFoundError traceback at the batch that
    first read it: every image is looked for at setup, before any batch, and the missing ones are named with the fix.
    A file that is not an image is named when a batch reads it."""
    from lit_transformer.data.sources import DataFileError
    from lit_transformer.errors import MissingFileError

    root, path = caption_folder
    args = dict(image_size=(8, 16), channels=3, batch_size=4, tokenizer="bpe", vocab_size=60)
    (root / "images" / "img4.png").unlink()  # a training image
    dm = CaptioningDataModule(str(path), images_dir=str(root / "images"), cache_dir=str(tmp_path / "c1"), **args)
    with pytest.raises(MissingFileError, match=r"names 1 of its 9 images where no file is: .*img4.png\. .*images_dir"):
        dm.setup()
    (root / "images" / "img4.png").write_text("not an image")
    dm = CaptioningDataModule(str(path), images_dir=str(root / "images"), cache_dir=str(tmp_path / "c2"), **args)
    dm.setup()
    with pytest.raises(DataFileError, match=r"image .*img4.png cannot be read \(UnidentifiedImageError"):
        for _ in dm.train_dataloader():
            pass


def test_an_offline_hub_name_says_how_to_use_local_files(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(OfflineError, match="--data.dataset captions.csv"):
        CaptioningDataModule("someone/coco-captions", cache_dir=str(tmp_path)).setup()


def test_predict_reads_a_folder_of_images_in_name_order(tmp_path):
    _write_images(tmp_path, ["b.png", "a.jpg"])
    (tmp_path / "notes.txt").write_text("not an image")
    dm = CaptioningDataModule(predict_file=str(tmp_path), image_size=(8, 48), cache_dir=str(tmp_path / "c"))
    dm.setup()
    batch = next(iter(dm.predict_dataloader()))
    assert batch["image"] == ["a.jpg", "b.png"] and batch["src"].shape == (2, 1, 8, 48)


def test_the_deprecated_predict_dir_still_works_and_names_its_successor_and_the_version_that_drops_it(tmp_path):
    with pytest.warns(
        FutureWarning, match=r"data\.predict_dir is deprecated and dropped in 0\.2\.0: set data\.predict_file"
    ):
        dm = CaptioningDataModule(predict_dir=str(tmp_path), cache_dir=str(tmp_path / "c"))
    assert dm.predict_file == str(tmp_path)


# ---- images a dataset holds: `datasets` Image features (save_to_disk folders, hub streams) ------------------------

COLOURS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255), "white": (255, 255, 255)}
IMAGE_SPLITS = {"train": ["red", "green"], "validation": ["blue"], "test": ["white"]}


def _png(colour: str) -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (4, 4), COLOURS[colour]).save(buffer, format="PNG")
    return buffer.getvalue()


def _image_rows(image) -> dict[str, list[dict]]:
    """Each split's rows: an image (`image(colour)` makes the column's value) and its two captions."""
    return {
        split: [{"image": image(c), "caption": [f"a {c} square", f"all {c}"]} for c in colours]
        for split, colours in IMAGE_SPLITS.items()
    }


def _save(tmp_path, rows: dict[str, list[dict]]):
    import datasets

    features = datasets.Features({"image": datasets.Image(), "caption": datasets.List(datasets.Value("string"))})
    saved = datasets.DatasetDict({s: datasets.Dataset.from_list(r, features=features) for s, r in rows.items()})
    saved.save_to_disk(str(tmp_path / "saved"))
    return str(tmp_path / "saved")


def _held_images_module(dataset: str, tmp_path, **kwargs) -> CaptioningDataModule:
    args = dict(image_size=(2, 2), channels=3, batch_size=2, tokenizer="char", vocab_size=40)
    return CaptioningDataModule(dataset, cache_dir=str(tmp_path / "cache"), **{**args, **kwargs})


def _check_pixels(dm: CaptioningDataModule) -> None:
    """Every split's images come back with their own colour, each with its two references."""
    dm.setup()
    for name, colours in IMAGE_SPLITS.items():
        split = dm.splits[name]
        assert [split.references(i) for i in range(len(split))] == [[f"a {c} square", f"all {c}"] for c in colours]
        for i, colour in enumerate(colours):
            assert split.load(i)[:, 0, 0].tolist() == [v / 255 for v in COLOURS[colour]]
    batch = next(iter(dm.train_dataloader()))  # training: every (image, caption) pair
    assert batch["src"].shape == (2, 3, 2, 2) and len({tuple(r) for r in batch["references"]}) <= 2


def test_images_held_as_bytes_without_a_path_are_written_once_beside_the_shards(tmp_path):
    """A save_to_disk folder whose Image column holds bytes and no path: each image is named by a digest of its bytes,
    written once into the prepared folder's images/ (never decoded while preparing), and read back from there."""
    dataset = _save(tmp_path, _image_rows(lambda c: {"bytes": _png(c), "path": None}))
    dm = _held_images_module(dataset, tmp_path, images_dir=str(tmp_path / "elsewhere"))  # not where they are
    root = dm.prepare()
    names = sorted(p.name for p in (root / "images").iterdir())
    assert len(names) == 4 and all(n.endswith(".png") and len(n) == 20 for n in names)
    assert sorted((root / "images" / n).read_bytes() for n in names) == sorted(_png(c) for c in COLOURS)
    first = json.loads((root / "train" / "shard-00000.extras.jsonl").read_text().splitlines()[0])
    assert first[1:] == [str((root / "images").resolve()), "a red square"]
    _check_pixels(dm)
    assert _held_images_module(dataset, tmp_path).prepare() == root  # prepared once
    for done in ("manifest.json", "train/index.json", "train/progress.json"):  # as if killed before train was done
        (root / done).unlink()
    (root / "images.partial").mkdir(exist_ok=True)
    (root / "images.partial" / "half-written").write_bytes(b"\x89PN")
    assert _held_images_module(dataset, tmp_path).prepare() == root  # resumed: the images it wrote are kept
    assert len(list((root / "images").iterdir())) == 4 and not (root / "images.partial").exists()


def test_images_held_with_a_path_are_named_by_it(tmp_path):
    """With a path (a file `datasets` embedded), an image is named by the path's base name: its captions group
    under it, features_dir finds `<stem>.npy` by it."""
    dataset = _save(tmp_path, _image_rows(lambda c: {"bytes": _png(c), "path": f"/gone/{c}.png"}))
    dm = _held_images_module(dataset, tmp_path)
    root = dm.prepare()
    assert sorted(p.name for p in (root / "images").iterdir()) == sorted(f"{c}.png" for c in COLOURS)
    _check_pixels(dm)
    assert dm.splits["validation"].names == ["blue.png"]
    features = tmp_path / "features"
    features.mkdir()
    for i, colour in enumerate(COLOURS):
        np.save(features / f"{colour}.npy", np.full((2, 3), float(i), dtype=np.float32))
    dm = _held_images_module(dataset, tmp_path, features_dir=str(features))
    dm.setup()
    assert torch.equal(dm.splits["test"].load(0), torch.full((2, 3), 3.0))


def test_two_different_images_of_one_name_are_refused(tmp_path):
    rows = _image_rows(lambda c: {"bytes": _png(c), "path": "image.png"})  # every image named image.png
    dm = _held_images_module(_save(tmp_path, rows), tmp_path)
    with pytest.raises(ValueError, match=r"row 2: two different images are named 'image.png'"):
        dm.prepare()


def _hub(monkeypatch, splits: dict) -> list:
    """`datasets.load_dataset` answering with local streams (no hub here); the calls it got."""
    import datasets

    from lit_transformer.data import sources

    calls = []

    def load_dataset(name, config=None, **kwargs):
        calls.append((name, config, kwargs))
        return datasets.IterableDatasetDict(splits)

    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(sources, "_hub_reachable", lambda timeout=3.0: True)
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


def test_a_hub_captioning_dataset_is_streamed_into_shards(tmp_path, monkeypatch):
    """A hub name streams (streaming=True) through the reader a save_to_disk folder takes, into shards: nothing is
    held in memory but a batch of rows."""
    import datasets

    features = datasets.Features({"image": datasets.Image(), "caption": datasets.List(datasets.Value("string"))})
    rows = _image_rows(lambda c: {"bytes": _png(c), "path": None})
    splits = {s: datasets.Dataset.from_list(r, features=features).to_iterable_dataset() for s, r in rows.items()}
    calls = _hub(monkeypatch, splits)
    dm = _held_images_module("someone/colour-captions", tmp_path)
    root = dm.prepare()
    assert calls[0][:2] == ("someone/colour-captions", None) and calls[0][2]["streaming"] is True
    assert len(list((root / "images").iterdir())) == 4
    _check_pixels(dm)


def test_a_decoded_pil_image_is_encoded_back_to_bytes(tmp_path, monkeypatch):
    """A stream of unknown features yields PIL images (decoded): each is encoded losslessly and named by a digest."""
    import datasets
    from PIL import Image

    def stream(split):
        def rows():
            for colour in IMAGE_SPLITS[split]:
                image = Image.new("RGB", (4, 4), COLOURS[colour])
                yield {"image": image, "caption": [f"a {colour} square", f"all {colour}"]}

        return datasets.IterableDataset.from_generator(rows)

    _hub(monkeypatch, {split: stream(split) for split in IMAGE_SPLITS})
    dm = _held_images_module("someone/decoded", tmp_path)
    root = dm.prepare()
    names = sorted(p.name for p in (root / "images").iterdir())  # one PNG per image, named by its digest
    assert len(names) == len(COLOURS) and all(n.endswith(".png") and len(n) == 20 for n in names), names
    _check_pixels(dm)


@pytest.mark.parametrize(
    ("value", "held"),
    [(None, "holds nothing"), ({"bytes": None, "path": None}, "holds no bytes and no path"), (7, "holds int")],
)
def test_a_row_without_its_image_is_named_with_its_column(tmp_path, monkeypatch, value, held):
    import datasets

    rows = [{"picture": {"bytes": _png("red"), "path": None}, "caption": "red"}, {"picture": value, "caption": "x"}]
    _hub(monkeypatch, {"train": datasets.IterableDataset.from_generator(lambda: iter(rows))})
    dm = _held_images_module("someone/broken", tmp_path, image_column="picture", text_column="caption")
    with pytest.raises(ValueError, match=rf'\(train\) row 2 has no "picture" value.*{held}'):
        dm.prepare()


def test_an_image_given_by_its_path_alone_or_opened_from_a_file_is_read_from_that_file(tmp_path):
    """An undecoded image with a path and no bytes (a stream's lazy file), or a PIL image opened from a file, is that
    file's bytes under its name; a path that is not there names the row and the column."""
    from PIL import Image

    from lit_transformer.data.captioning import embedded_image

    (tmp_path / "red.png").write_bytes(_png("red"))
    assert embedded_image({"bytes": None, "path": str(tmp_path / "red.png")}, "row 1", "image") == (
        "red.png",
        _png("red"),
    )
    with Image.open(tmp_path / "red.png") as opened:
        assert embedded_image(opened, "row 1", "image") == ("red.png", _png("red"))
    with pytest.raises(ValueError, match=r'row 3: the image in "image" cannot be read from .*gone.png'):
        embedded_image({"bytes": None, "path": str(tmp_path / "gone.png")}, "row 3", "image")


# ---- images identified by their path; split columns; pixel modes -------------------------------------------------


def _captions_file(folder, rows: list[str], header: str = "image,caption") -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "captions.csv").write_text(header + "\n" + "".join(r + "\n" for r in rows))
    return str(folder / "captions.csv")


def test_same_named_images_in_different_folders_keep_their_own_pixels_and_captions(tmp_path):
    """A glob over two folders, each naming its own 000.png ...: 60 images became 30, each loading one folder's
    pixels with both folders' captions. An image is its resolved path, not its name."""
    from PIL import Image

    for folder, colour in (("reds", (255, 0, 0)), ("blues", (0, 0, 255))):
        rows = []
        for i in range(30):
            (tmp_path / "glob" / folder).mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (4, 4), colour).save(tmp_path / "glob" / folder / f"{i:03d}.png")
            rows.append(f"{i:03d}.png,a {folder[:-1]} picture")
        _captions_file(tmp_path / "glob" / folder, rows)
    dm = CaptioningDataModule(
        str(tmp_path / "glob" / "*" / "captions.csv"), image_size=(2, 2), channels=3, cache_dir=str(tmp_path / "c")
    )
    dm.setup()
    assert sum(len(s) for s in dm.splits.values()) == 60 and sum(s.captions for s in dm.splits.values()) == 60
    for split in dm.splits.values():
        for i in range(len(split)):
            (reference,) = split.references(i)
            red, _, blue = split.load(i)[:, 0, 0].tolist()
            assert (reference, red, blue) in (("a red picture", 1.0, 0.0), ("a blue picture", 0.0, 1.0))


def test_one_file_written_two_ways_is_one_image(tmp_path):
    """./img002.png and img002.png are one file: one image with both captions, in one split."""
    names = [f"img{i:03d}.png" for i in range(40)]
    _write_images(tmp_path, names)
    rows = [f"{n},first caption of {n}" for n in names] + [f"./{n},second caption of {n}" for n in names]
    dm = CaptioningDataModule(
        _captions_file(tmp_path, rows), image_size=(2, 2), held_out=0.25, cache_dir=str(tmp_path / "c")
    )
    dm.setup()
    assert sum(len(s) for s in dm.splits.values()) == 40
    for split in dm.splits.values():
        for i in range(len(split)):
            name = split.name(i)
            assert split.references(i) == [f"first caption of {name}", f"second caption of {name}"]


def test_a_split_column_that_disagrees_for_one_image_is_refused_naming_its_rows(tmp_path):
    names = [f"img{i}.png" for i in range(3)]
    _write_images(tmp_path, names)
    rows = ["img0.png,a,train", "img0.png,b,train", "img1.png,c,validation", "img2.png,d,test"]
    rows += ["img0.png,e,validation", "img0.png,f,train"]
    path = _captions_file(tmp_path, rows, header="image,caption,split")
    dm = CaptioningDataModule(path, image_size=(2, 2), cache_dir=str(tmp_path / "c"))
    with pytest.raises(
        ValueError, match=r"captions.csv:6: image 'img0.png' has split 'validation'.*captions.csv:2 .*'train'"
    ):
        dm.setup()


def test_sixteen_bit_greyscale_is_scaled_to_eight_bits_and_float_pixels_are_refused(tmp_path):
    """Pillow's convert clips a 16-bit image's values at 255 (almost solid white): they are scaled instead."""
    from PIL import Image

    from lit_transformer.data.captioning import load_image
    from lit_transformer.errors import UserError

    Image.fromarray(np.full((4, 4), 32768, dtype=np.uint16)).save(tmp_path / "grey16.png")
    for channels in (1, 3):
        assert torch.equal(
            load_image(tmp_path / "grey16.png", (4, 4), channels), torch.full((channels, 4, 4), 128 / 255)
        )
    opened = Image.open(tmp_path / "grey16.png")
    assert load_image(opened.convert("I"), (4, 4), 1).mean().item() == pytest.approx(128 / 255)
    Image.fromarray(np.full((4, 4), 0.5, dtype=np.float32)).save(tmp_path / "float.tif")
    with pytest.raises(UserError, match=r"float.tif.*mode F.*8 or 16 bits"):
        load_image(tmp_path / "float.tif", (4, 4), 1)


def test_a_photos_exif_orientation_is_applied(tmp_path):
    """A phone photo stored sideways with an orientation tag is read as it is shown."""
    from PIL import Image

    from lit_transformer.data.captioning import load_image

    stored = Image.new("RGB", (16, 8))  # 16 wide, 8 high; white on the left: shown 8 wide, 16 high, white on top
    stored.paste((255, 255, 255), (0, 0, 8, 8))
    exif = Image.Exif()
    exif[0x0112] = 6
    stored.save(tmp_path / "rotated.jpg", exif=exif, quality=100)
    read = load_image(tmp_path / "rotated.jpg", (16, 8), 1)[0]
    assert read[:8].mean() > 0.9 and read[8:].mean() < 0.1


def test_predict_names_a_corrupt_image_with_predicts_fix(tmp_path):
    _write_images(tmp_path, ["a.png"])
    (tmp_path / "b.png").write_bytes((tmp_path / "a.png").read_bytes()[:40])  # cut short
    dm = CaptioningDataModule(predict_file=str(tmp_path), image_size=(8, 48), cache_dir=str(tmp_path / "c"))
    with pytest.raises(ValueError, match=r"image .*b.png cannot be read .*remove it from .* or replace it") as error:
        next(iter(dm.predict_dataloader()))
    assert "checkpoint" not in str(error.value)


def test_validate_test_and_predict_read_images_at_the_checkpoints_size_and_channels():
    """predict --config presets/caption-digits --ckpt_path A_32x32_MODEL was refused for the preset's image_size (and
    the message blamed the preset): the model's image_size and image_channels are the only ones it reads."""
    config = {"source": "patches", "image_size": [32, 32], "image_channels": 3}
    checkpoint = {"hyper_parameters": {"config": config}, "tokenizer": "{}"}
    args = {"image_size": (8, 48), "channels": 1, "tokenizer": "bpe"}
    changed = CaptioningDataModule.trained_args(args, checkpoint, "model.ckpt")
    assert changed == {"tokenizer": "model.ckpt", "image_size": [32, 32], "channels": 3}
    same = {"image_size": (32, 32), "channels": 3, "tokenizer": "tok.json"}
    assert CaptioningDataModule.trained_args(same, checkpoint, "model.ckpt") == {}
    features = {"hyper_parameters": {"config": {"source": "features", "source_dim": 5}}}
    assert CaptioningDataModule.trained_args(args, features, "model.ckpt") == {}
