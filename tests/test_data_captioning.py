"""CaptioningDataModule: the embedded digit strips, a folder of images with a captions file, precomputed features,
several references per image, and the errors a user meets."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lit_transformer.data.captioning import CaptioningDataModule
from lit_transformer.data.corpora import DIGIT_WORDS, digit_scans, digit_strips, scan_split
from lit_transformer.data.loaders import target_batch
from lit_transformer.data.sources import OfflineError


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
    batch = dm.collate([(0, 0, dm.splits["train"].load(0)), (1, 0, dm.splits["train"].load(1))], dm.splits["train"])
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
