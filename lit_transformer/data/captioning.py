"""CaptioningDataModule: (image, caption) pairs for an encoder-decoder whose source is pixels or feature vectors.

Where the pairs come from (``dataset``), each read through the one reader (CaptionStream, below):
- ``digits``: the embedded task (lit_transformer.data.corpora), strips of handwritten digits captioned in words;
- a captions file, ``.csv``/``.tsv``, ``.jsonl`` or ``.parquet``, one row per caption (an image may have several, its
  references) or a list of captions per row: an image column (a path under ``images_dir``, default the file's
  folder), a caption column, and optionally a split column (train/validation/test); without one, images are carved
  into splits by a hash of their name;
- a folder `datasets` saved (save_to_disk) or a hub dataset name (streamed), whose image column is a path or a
  `datasets` Image (the image's bytes in the row: what every hub captioning dataset holds), with a caption or a list.
With ``features_dir``, each image's source is its precomputed features instead of its pixels: ``<image stem>.npy``
or ``.safetensors`` (one tensor, (regions, source_dim)), for a model with ``source: features``.

Every source, the digits too, is prepared once into token shards on disk (`prepare`; CAPTIONS, below): each caption's
ids, and beside them its image's name, folder and the caption's text; an image a row holds is written once, undecoded,
into the prepared folder's images/ and read from there like any file (a digit strip, named by its split and index, is
read from the strips, composed again on every run). Batches read them back through memory maps and seeks, so memory
stays flat in the number of captions and images, and go through the resumable loader every task uses.

Batches: {"src": (B, C, H, W) images or (B, S, source_dim) features with "src_mask" (B, S), "tgt_in": (B, T) bos then
the caption, "labels": (B, T) the caption then eos (-100 at padding), "tgt_mask", "references": each image's captions,
"image": each image's name}. Training reads every (image, caption) pair; evaluation each image once, its loss on its
first caption and BLEU against all of them. Images are decoded and resized with Pillow; no augmentation.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info
from tokenizers import Tokenizer
from torch.utils.data import DataLoader, Dataset

from ..errors import ConfigError, MissingFileError
from . import corpora
from .base import DataModule, check_least, warn_deprecated_key
from .corpora.digits import DigitStrips
from .loaders import RecordShards, ResumableLoader, fixed_size_batches, load_prepared, target_batch
from .shards import SHARD_TOKENS, TextsKind, prepare
from .sources import ENCODING, HELD_OUT, SPLIT_ALIASES, SPLITS, DataFileError, RowStream

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
FEATURE_SUFFIXES = (".npy", ".safetensors")


class CaptionSplit:
    """One prepared split: each caption (a record) and its image, images numbered in order of first appearance;
    `order` lists the captions grouped by image (an image's are order[start[i]:start[i + 1]], its references). Caption
    ids come through per-batch memory maps, images' references are read per batch; `load` reads an image's source."""

    def __init__(self, shards: CaptionShards, load: Callable[[str, str | None], torch.Tensor]) -> None:
        self.shards, self._load = shards, load
        self.image_of, self.order, self.start = shards.image_of, shards.order, shards.start

    def __len__(self) -> int:
        return len(self.start) - 1

    @property
    def captions(self) -> int:
        return len(self.image_of)

    def load(self, image: int) -> torch.Tensor:
        """The image's source: (C, H, W) pixels or (regions, dim) features."""
        name, folder, _ = self.shards.extras([self.first(image)])[0]
        return self._load(name, folder)

    def name(self, image: int) -> str:
        return self.shards.extras([self.first(image)])[0][0]

    def texts(self, captions: Sequence[int]) -> list[str]:
        return [extra[2] for extra in self.shards.extras(captions)] if len(captions) else []

    def ids(self, captions: Sequence[int]) -> list[list[int]]:
        """The token ids of each caption (no BOS/EOS)."""
        return [row.astype(np.int64).tolist() for row in self.shards.read(captions)]

    def references(self, image: int) -> list[str]:
        return self.texts(self.order[self.start[image] : self.start[image + 1]].tolist())

    def first(self, image: int) -> int:
        return int(self.order[self.start[image]])

    @property
    def names(self) -> list[str]:
        """Every image's name (reads them all: for small splits and tests)."""
        return [self.name(i) for i in range(len(self))]


TRAINING_FIX = "replace the file, or leave its rows out of the data; the last checkpoint resumes the run"
PREDICT_FIX = "remove it from predict's folder, or replace it with a readable image, and run predict again"


class ImageSource:
    """Reads an image's source when a batch is built: its features (features_dir) or its pixels. An image the dataset
    held is read from the prepared folder's images/ (`held`: found by the prepared folder's name, a content key, so a
    cache moved or mounted elsewhere still serves), a named one from images_dir or its file's folder; a digit strip
    ("train-17") from the strips (`strips`, composed again on every run: the same arguments give the same pixels).
    A plain object, so DataLoader workers started by spawn (macOS, Windows) get a copy."""

    def __init__(
        self,
        images_dir: str | None,
        features_dir: str | None,
        image_size: tuple[int, int],
        channels: int,
        held: Path | None = None,
        strips: dict[str, DigitStrips] | None = None,
        fix: str = TRAINING_FIX,
    ) -> None:
        self.images_dir, self.features_dir, self.image_size, self.channels = (
            images_dir,
            features_dir,
            image_size,
            channels,
        )
        self.held, self.strips, self.fix = held, strips, fix

    def path(self, name: str, folder: str | None) -> Path:
        """Where a named image is read from (a dataset's own: the prepared images/; else images_dir or the folder of
        the file that named it)."""
        held = folder is not None and self.held is not None and Path(folder).parts[-2:] == self.held.parts[-2:]
        return (self.held if held else Path(self.images_dir or folder or ".")) / name

    def __call__(self, name: str, folder: str | None) -> torch.Tensor:
        if self.strips is not None:
            split, index = name.rsplit("-", 1)
            return torch.from_numpy(self.strips[split].images[int(index)])
        path = self.path(name, folder)
        if self.features_dir is None:
            from PIL import UnidentifiedImageError

            try:
                return load_image(path, self.image_size, self.channels)
            except (UnidentifiedImageError, OSError, SyntaxError) as error:  # in a batch, mid-run: name the file
                raise DataFileError(
                    f"image {path} cannot be read ({type(error).__name__}: {error}): {self.fix}"
                ) from error
        return load_features(_feature_file(Path(self.features_dir), path.stem))


def load_image(source, size: tuple[int, int], channels: int) -> torch.Tensor:
    """(channels, height, width) pixels in [0, 1] from a path or a PIL image, resized to `size` (height, width). A
    photo's EXIF orientation is applied (it is read as shown, not sideways); 16-bit pixels are scaled to 8 bits
    (Pillow's convert clips them at 255: almost solid white)."""
    from PIL import Image, ImageOps

    image = source if isinstance(source, Image.Image) else Image.open(source)
    image = ImageOps.exif_transpose(image)
    if image.mode.startswith("I") or image.mode == "F":
        image = _eight_bits(image, source)
    image = image.convert("L" if channels == 1 else "RGB")
    if image.size != (size[1], size[0]):
        image = image.resize((size[1], size[0]), Image.Resampling.BILINEAR)
    pixels = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0)
    return pixels[None] if channels == 1 else pixels.permute(2, 0, 1)


def _eight_bits(image, source):
    """A greyscale image of 16-bit (I;16*) or 32-bit integer (I) pixels as 8-bit (L): each value / 256, an I image
    whose values all fit 8 bits as they are. Float pixels (F) have no one scale: refused."""
    from PIL import Image

    where = source if not isinstance(source, Image.Image) else getattr(source, "filename", "") or "the image"
    if image.mode == "F":
        raise DataFileError(
            f"{where}: mode F (32-bit float pixels) has no one scale to 8-bit greyscale; save the image with 8 or 16 "
            "bits per channel (e.g. a PNG)"
        )
    pixels = np.asarray(image).astype(np.int64)
    low, high = (int(pixels.min()), int(pixels.max())) if pixels.size else (0, 0)
    if low < 0 or high > 65535:
        raise DataFileError(
            f"{where}: mode {image.mode} pixels range {low} to {high}, beyond 16 bits; save the image with 8 or 16 "
            "bits per channel (e.g. a PNG)"
        )
    if image.mode.startswith("I;16") or high > 255:
        pixels = pixels >> 8  # value / 256
    return Image.fromarray(pixels.astype(np.uint8), "L")


def load_features(path: Path) -> torch.Tensor:
    """(regions, source_dim) float32 features from a .npy file or a .safetensors file holding one tensor."""
    if path.suffix == ".npy":
        features = torch.from_numpy(np.load(path)).float()
    else:
        from safetensors.torch import load_file

        tensors = load_file(str(path))
        if len(tensors) != 1:
            raise DataFileError(f"{path} holds {len(tensors)} tensors ({', '.join(tensors)}); save one, (regions, dim)")
        features = next(iter(tensors.values())).float()
    if features.dim() != 2:
        raise DataFileError(f"{path}: features must be (regions, source_dim), got shape {tuple(features.shape)}")
    return features


class _Pairs(Dataset):
    """Training reads every (image, caption) pair; evaluation (all_pairs=False) each image once, with its first
    caption. Items are (image, caption, source)."""

    def __init__(self, split: CaptionSplit, all_pairs: bool) -> None:
        self.split, self.all_pairs = split, all_pairs

    def __len__(self) -> int:
        return self.split.captions if self.all_pairs else len(self.split)

    def __getitem__(self, i: int) -> tuple[int, int, torch.Tensor]:
        image, caption = (int(self.split.image_of[i]), i) if self.all_pairs else (i, self.split.first(i))
        return image, caption, self.split.load(image)


class _Folder(Dataset):
    """predict's images (or feature files): items (index, -1, source)."""

    def __init__(self, paths: list[Path], source: ImageSource) -> None:
        self.paths, self.source = paths, source

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[int, int, torch.Tensor]:
        return i, -1, self.source(self.paths[i].name, str(self.paths[i].parent))


def sources_batch(sources: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Images stacked, or features (regions, dim) padded to the most regions with a mask."""
    if sources[0].dim() != 2:
        return {"src": torch.stack(sources)}
    longest = max(s.shape[0] for s in sources)
    src = torch.zeros(len(sources), longest, sources[0].shape[1])
    src_mask = torch.zeros(len(sources), longest, dtype=torch.bool)
    for b, s in enumerate(sources):
        src[b, : s.shape[0]], src_mask[b, : s.shape[0]] = s, True
    return {"src": src, "src_mask": src_mask}


class CaptionCollate:
    """Items (image, caption, source) into a batch (see the module): of a split's captions, or of predict's images
    (`names`, no caption). A plain object rather than a closure, so it pickles for workers started by spawn."""

    def __init__(
        self, split: CaptionSplit | None, pad: int, bos: int, eos: int, max_tokens: int, names: list[str] | None = None
    ) -> None:
        self.split, self.pad, self.bos, self.eos, self.max_tokens, self.names = split, pad, bos, eos, max_tokens, names

    def __call__(self, items: list[tuple[int, int, torch.Tensor]]) -> dict:
        batch = sources_batch([source for _, _, source in items])
        images = [image for image, _, _ in items]
        if self.split is None:
            ids, references, names = [[] for _ in items], [[""] for _ in items], [self.names[i] for i in images]
        else:
            ids = [row[: self.max_tokens] for row in self.split.ids([caption for _, caption, _ in items])]
            references = [self.split.references(image) for image in images]
            names = [self.split.name(image) for image in images]
        batch.update(target_batch(ids, self.pad, self.bos, self.eos))
        batch["references"], batch["image"] = references, names
        return batch


class CaptioningDataModule(DataModule):
    """Image (or image-feature) captioning data: see the module's docstring for the sources and the batches."""

    feeds = ("captioning",)

    tokenizer_tag = "captions"

    def __init__(
        self,
        dataset: str = "digits",
        images_dir: str | None = None,
        features_dir: str | None = None,
        image_column: str = "image",
        text_column: str = "caption",
        image_size: tuple[int, int] = (8, 48),
        channels: int = 1,
        tokenizer: str = "bpe",
        vocab_size: int = 64,
        max_caption_tokens: int = 32,
        batch_size: int = 64,
        held_out: float = 0.1,
        strips: tuple[int, int, int] = (20000, 500, 1000),
        bleu_samples: int | None = None,
        predict_file: str | None = None,
        predict_dir: str | None = None,
        **kwargs: Any,
    ) -> None:
        """
        Args:
            dataset: digits (the embedded task), a captions file (.csv/.tsv, .jsonl, .parquet), a folder `datasets`
                saved, or a hub dataset name.
            images_dir: The folder the captions file's image paths are relative to (default: the file's folder).
            features_dir: Precomputed features, <image stem>.npy or .safetensors each, read instead of the pixels.
            image_column: The column of the image: a path, or the image itself (a `datasets` Image).
            text_column: The column holding a caption, or a list of them (an image's references).
            image_size: (height, width) every image is resized to; the model's image_size.
            channels: 1 (greyscale) or 3 (RGB); the model's image_channels.
            tokenizer: A kind to train on the training captions (bpe, byte_bpe, char) or a tokenizer.json path.
            vocab_size: The vocabulary size of a trained tokenizer.
            max_caption_tokens: Captions are cut to this many tokens (before eos).
            batch_size: Images (training: image-caption pairs) a batch.
            held_out: A captions file without a split column: the fraction of images for validation, and again for
                test, chosen by a hash of the image name (stable as the file grows).
            strips: digits: the number of (train, validation, test) strips, each composed from its split's scans.
            bleu_samples: Validation images decoded for BLEU; None decodes all of them.
            predict_file: A folder of images (or of feature files) for `predict`: one JSONL caption per file.
            predict_dir: Deprecated (dropped in 0.2.0): predict_file.
            **kwargs: The arguments every DataModule shares (dataset_config, num_workers, seed, cache_dir, encoding,
                ...: see DataModule); batches, predict's too, are counted in images (batch_size).
        """
        if predict_dir is not None:
            warn_deprecated_key("predict_dir", "set data.predict_file")
            predict_file = predict_file or predict_dir
        super().__init__(
            dataset=dataset, text_column=text_column, tokenizer=tokenizer, vocab_size=vocab_size, batch_size=batch_size,
            max_tokens=None, held_out=held_out, predict_file=predict_file, predict_batch_size=batch_size, **kwargs,
        )  # fmt: skip
        if channels not in (1, 3):
            raise ConfigError(
                f"channels={channels}: images are read as greyscale (1) or RGB (3)", keys=["data.init_args.channels"]
            )
        check_least(
            image_size=(tuple(image_size), 1),
            max_caption_tokens=(max_caption_tokens, 1),
            strips=(tuple(strips), 1),
            bleu_samples=(bleu_samples, 0),
        )
        self.images_dir, self.features_dir, self.image_column = images_dir, features_dir, image_column
        self.image_size, self.channels = tuple(image_size), channels
        self.max_caption_tokens, self.strips, self.bleu_samples = max_caption_tokens, tuple(strips), bleu_samples
        self.splits: dict[str, CaptionSplit] = {}
        self._stream: CaptionStream | None = None
        self._root: Path | None = None
        self._digit_strips: dict[str, DigitStrips] | None = None

    @classmethod
    def model_fields(cls, args: dict) -> dict:
        if args.get("features_dir"):  # features: their width, read from the first file, is the model's source_dim
            width = feature_width(Path(args["features_dir"]))
            return {} if width is None else {"source_dim": ("features_dir", width)}
        return {
            "image_size": ("image_size", list(args["image_size"])),
            "image_channels": ("channels", args["channels"]),
        }

    @classmethod
    def trained_args(cls, args: dict[str, Any], checkpoint: dict[str, Any], path: str) -> dict[str, Any]:
        """The base's, and the image size and channels of a model that reads pixels (source: patches): its patch grid
        and first layer take no other, so a preset's or default's value (or a flag's) would only be refused."""
        changed = super().trained_args(args, checkpoint, path)
        config = (checkpoint.get("hyper_parameters") or {}).get("config") or {}
        if dataclasses.is_dataclass(config):
            config = dataclasses.asdict(config)
        if config.get("source") != "patches" or not config.get("image_size"):
            return changed
        size, channels = [int(side) for side in config["image_size"]], int(config.get("image_channels", 3))
        if list(args.get("image_size") or ()) != size:
            changed["image_size"] = size
        if args.get("channels") != channels:
            changed["channels"] = channels
        return changed

    @classmethod
    def longest_sequence(cls, args: dict) -> tuple[str, int]:
        return "max_caption_tokens", args["max_caption_tokens"] + 1  # bos then the caption; the caption then eos

    # ---- sources ---------------------------------------------------------------------------------------------
    def _strips(self) -> dict[str, DigitStrips] | None:
        """The digit strips of each split when the dataset is the embedded digits (composed once per module)."""
        if self.dataset != "digits":
            return None
        if self._digit_strips is None:
            self._digit_strips = corpora.embedded(
                self.dataset, self.cache_dir, image_size=self.image_size, channels=self.channels, strips=self.strips
            )
        return self._digit_strips

    def _embedded(self):
        """The digits as a table of rows like any dataset's, an image named by its split and index ("train-17",
        read from the strips when a batch is built) and its caption: they take the one path, through the shards."""
        strips = self._strips()
        if strips is None:
            return corpora.embedded(self.dataset, self.cache_dir)
        import datasets

        return datasets.DatasetDict(
            {
                split: datasets.Dataset.from_dict(
                    {self.image_column: [f"{split}-{i}" for i in range(len(s))], self.text_column: s.captions}
                )
                for split, s in strips.items()
            }
        )

    @property
    def stream(self) -> CaptionStream:
        """The captions of each split, read through the one reader: one row per caption (or a list of them)."""
        if self._stream is None:
            hint = " (choose them with --data.init_args.image_column and text_column)"
            self._stream = CaptionStream(
                self.dataset, self.image_column, self.text_column, self.dataset_config, self._embedded(),
                self.held_out, hint, self.encoding,
            )  # fmt: skip
        return self._stream

    def _source(self) -> ImageSource:
        held = (self._root / CAPTIONS.images).resolve() if self._root is not None else None
        return ImageSource(
            self.images_dir, self.features_dir, self.image_size, self.channels, held, self._strips()
        )  # fmt: skip

    # ---- Lightning hooks ---------------------------------------------------------------------------------------
    def tokenizer_texts(self) -> list[str]:
        """The first training captions, up to tokenizer_sample_chars characters."""
        texts, total = [], 0
        for record in self.stream.records_of("train"):
            if total >= self.tokenizer_sample_chars:
                break
            texts.append(record.caption)
            total += len(record.caption)
        return texts

    def prepare(self) -> Path:
        """Stream the captions into token shards once, each image's reference and the caption's text beside the ids
        (training the tokenizer first when needed), and the images a dataset holds into images/; the prepared
        folder. Memory stays flat in the number of captions and images; the images are read when a batch is
        built."""
        if self._root is None:
            tokenizer = self.tokenizer
            self._root = prepare_captions(self.stream, tokenizer, self._tokenizer_keys[0], self.cache_dir)
        return self._root

    def setup(self, stage: str | None = None) -> None:
        if stage == "predict":  # the predict_file and the tokenizer alone: no split is read
            return
        if self.splits:
            return
        info, shards = load_prepared(self.prepare(), CaptionShards)
        source = self._source()
        splits = {split: CaptionSplit(shards[split], source) for split in SPLITS}
        if self.features_dir is not None:  # a wrong folder fails here, naming an image, rather than in a batch
            for split in splits.values():
                name, folder, _ = split.shards.extras([split.first(0)])[0]
                _feature_file(Path(self.features_dir), (Path(self.images_dir or folder or ".") / name).stem)
        elif source.strips is None:
            self._check_images(splits, source)
        self.splits = splits
        sizes = {split: (len(s), s.captions) for split, s in splits.items()}
        rank_zero_info(f"{self.dataset}: (images, captions) per split {sizes}; held-out: {info['held_out']}")

    def _check_images(self, splits: dict[str, CaptionSplit], source: ImageSource, chunk: int = 4096) -> None:
        """Every image the splits name is a file where it resolves, before any batch: a missing one ended the run
        with a FileNotFoundError traceback at the batch that first read it. One stat per image, names read a chunk at
        a time (memory stays flat in the number of images)."""
        missing, total = [], 0
        for split in splits.values():
            for start in range(0, len(split), chunk):
                rows = [split.first(i) for i in range(start, min(len(split), start + chunk))]
                for name, folder, _ in split.shards.extras(rows):
                    total += 1
                    path = source.path(name, folder)
                    if not path.is_file():
                        missing.append(str(path))
        if missing:
            shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
            raise MissingFileError(
                f"{self.dataset!r} names {len(missing)} of its {total} images where no file is: {shown}. A row's image "
                "path is read from data.init_args.images_dir when given, else from the folder of the file that names "
                "it: give --data.init_args.images_dir the folder that holds the images, or fix those rows' paths"
            )

    def _collate(self, split: CaptionSplit | None, names: list[str] | None = None) -> CaptionCollate:
        return CaptionCollate(
            split, self.pad_token_id, self.bos_token_id, self.eos_token_id, self.max_caption_tokens, names
        )  # fmt: skip

    def loader(self, split: str, shuffle: bool) -> ResumableLoader:
        """The resumable loader every task batches through: training, every (image, caption) pair in batches regrouped
        once by the seed, their order shuffled per epoch and resumed mid-epoch exactly; evaluation, each image once,
        in order."""
        self.setup()
        data = self.splits[split]
        pairs = _Pairs(data, all_pairs=split == "train")
        batches = fixed_size_batches(len(pairs), self.batch_size, self.seed, shuffle=shuffle, drop_last=False)
        epoch = self.trainer.current_epoch if shuffle and self.trainer is not None else 0
        return ResumableLoader(
            pairs, batches, self._collate(data), shuffle=shuffle, seed=self.seed, num_workers=self.num_workers,
            start_epoch=epoch,
        )  # fmt: skip

    @classmethod
    def check_predict_file(cls, args: dict[str, Any]) -> None:
        cls._predict_paths(args.get("predict_file"), bool(args.get("features_dir")))

    @staticmethod
    def _predict_paths(folder: str | None, features: bool) -> list[Path]:
        """The images (or feature files) of predict's folder, sorted by name; refused in a line when there are none."""
        if not folder or not Path(folder).is_dir():
            raise ConfigError(
                f"predict needs a folder of images: --data.init_args.predict_file DIR (got {folder!r}); "
                "captions are written one JSON line per image",
                keys=["data.init_args.predict_file"],
            )
        suffixes = FEATURE_SUFFIXES if features else IMAGE_SUFFIXES
        paths = sorted(p for p in Path(folder).iterdir() if p.suffix.lower() in suffixes)
        if not paths:
            raise DataFileError(f"predict_file {folder!r} holds no {'/'.join(suffixes)} file")
        return paths

    def predict_dataloader(self) -> DataLoader:
        """Batches {"src" (, "src_mask"), "image"} of every image (or feature file) in predict_file, a folder,
        sorted by name."""
        paths = self._predict_paths(self.predict_file, bool(self.features_dir))
        source = ImageSource(None, None, self.image_size, self.channels, fix=PREDICT_FIX)
        if self.features_dir:  # predict's folder holds the feature files themselves
            source = _FeatureFiles()
        collate = self._collate(None, [p.name for p in paths])
        return DataLoader(_Folder(paths, source), batch_size=self.batch_size, shuffle=False, collate_fn=collate)


class _FeatureFiles:
    """predict's feature files, read as they are named."""

    def __call__(self, name: str, folder: str | None) -> torch.Tensor:
        return load_features(Path(folder or ".") / name)


def feature_width(folder: Path) -> int | None:
    """The width (source_dim) of the features in `folder`, read from its first file's header alone (None when the
    folder holds none: setup then names the image whose features are missing)."""
    files = sorted(p for p in folder.glob("*") if p.suffix in FEATURE_SUFFIXES) if folder.is_dir() else []
    if not files:
        return None
    if files[0].suffix == ".npy":
        shape = np.load(files[0], mmap_mode="r").shape
    else:
        from safetensors import safe_open

        with safe_open(str(files[0]), framework="np") as handle:
            shape = handle.get_slice(next(iter(handle.keys()))).get_shape()
    return int(shape[-1]) if len(shape) == 2 else None  # another shape: load_features names the problem


def _feature_file(folder: Path, stem: str) -> Path:
    for suffix in FEATURE_SUFFIXES:
        if (folder / f"{stem}{suffix}").is_file():
            return folder / f"{stem}{suffix}"
    raise MissingFileError(f"no features for image {stem!r} in {folder}: expected {stem}.npy or {stem}.safetensors")


# ---------------------------------------------------------------------------------------------------- the task's own
# Captions as records (columns -> image reference and caption, images a row holds), their shard layout and reader.


@dataclass
class Caption:
    """One caption of an image: a prepared shard keeps its ids and, beside them, the image's reference (its name, the
    folder it resolves against) and the caption's text (BLEU's reference).

    An image a dataset holds itself (a `datasets` Image) is `embedded`: its folder is the one the preparation writes
    it to (`CaptionKind.stage`), and the first caption of its row carries its encoded bytes (`data`)."""

    caption: str
    image: str
    folder: str | None
    row: int
    nbytes: int
    embedded: bool = False
    data: bytes | None = None
    where: str = ""  # the row, for an error about its image
    last = True

    @property
    def extra(self) -> str:
        return json.dumps([self.image, self.folder, self.caption], ensure_ascii=False)

    @property
    def texts(self) -> tuple[str]:
        return (self.caption,)

    @property
    def document(self) -> int:
        return self.row


IMAGE_MAGIC = (  # the suffix of a file of encoded image bytes without a name (Pillow reads any by content)
    (b"\x89PNG", ".png"),
    (b"\xff\xd8", ".jpg"),
    (b"GIF8", ".gif"),
    (b"BM", ".bmp"),
    (b"II*\x00", ".tif"),
    (b"MM\x00*", ".tif"),
)


def embedded_image(value: Any, where: str, column: str) -> tuple[str, bytes]:
    """The name and encoded bytes of an image a row holds: a `datasets` Image, undecoded ({"bytes", "path"}) or a
    PIL image. Its name is its path's base name when it has one (its file's name: features_dir finds it by that
    stem), else a digest of its bytes, so a dataset of one row per caption keeps an image's captions together, and
    the carving by name stays stable. A missing or empty image fails naming the row and the column."""
    from PIL import Image

    if isinstance(value, Image.Image):  # decoded: its file's bytes, else encoded again (as `datasets` encodes it)
        from datasets.features.image import image_to_bytes

        path = getattr(value, "filename", "") or None
        data = Path(path).read_bytes() if path and os.path.isfile(path) else image_to_bytes(value)
        value = {"bytes": data, "path": path}
    data, path = value.get("bytes"), value.get("path")
    if not data and path:  # a path alone: a local file, or a remote one `datasets` can open (a hub stream)
        try:
            if os.path.isfile(path):
                data = Path(path).read_bytes()
            else:
                from datasets.utils.file_utils import xopen

                with xopen(path, "rb") as handle:
                    data = handle.read()
        except (OSError, ValueError) as error:
            raise DataFileError(f'{where}: the image in "{column}" cannot be read from {path!r} ({error})') from None
    if not data:
        raise DataFileError(
            f'{where} has no "{column}" value: its image holds no bytes and no path; each row holds an image '
            "(a datasets Image) or names one (a path)"
        )
    base = Path(str(path).split("::")[0].replace("\\", "/")).name if path else ""
    if base and base not in (".", ".."):
        return base, data
    suffix = next((s for magic, s in IMAGE_MAGIC if data.startswith(magic)), "")
    if not suffix and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        suffix = ".webp"
    return hashlib.md5(data).hexdigest()[:16] + suffix, data


class CaptionStream(RowStream):
    """Each split's captions (one row per caption, or a list of them), read through the one reader. A row's image is
    a path (a captions file's, resolved against its folder or images_dir) or an image the row holds (a `datasets`
    Image of a folder `datasets` saved or a hub stream, read undecoded: see `embedded_image`). An image's split is its
    row's split column, else its file's (train*/valid*/test*), else carved by a hash of its name, so all its captions
    (its references) stay together."""

    key = "captions"
    rows_per_batch = 64  # a table's rows may hold their images' bytes
    hub_hint = (
        "Point the DataModule at local files instead: --data.dataset captions.csv (or .jsonl) with columns image and "
        "caption, the images under --data.images_dir (or their features under --data.features_dir), or a folder "
        "`datasets` saved (save_to_disk) with an Image column; or use the embedded task, --data.dataset digits."
    )

    def __init__(
        self,
        dataset: str,
        image_column: str,
        text_column: str,
        dataset_config: str | None = None,
        embedded=None,
        held_out: float = HELD_OUT,
        column_hint: str = "",
        encoding: str = ENCODING,
    ) -> None:
        self.image_column, self.text_column = image_column, text_column
        super().__init__(
            dataset, [image_column, text_column], image_column, dataset_config, embedded, held_out, column_hint,
            encoding,
        )  # fmt: skip
        for source in self.sources.values():  # Image columns are read undecoded: bytes are copied, never decoded
            source.table = _undecoded(source.table, image_column)

    def routed(self, source_name: str, skip: int = 0) -> Iterator[tuple[str, Caption]]:
        placed: dict[str, tuple[str, str]] = {}  # an image (its path) a split column placed: (split, the first row)
        for number, row in enumerate(self._rows(self.sources[source_name])):
            value, caption = row.values[self.image_column], row.values[self.text_column]
            if isinstance(value, str) and value.strip():  # rows read past too: a later row may disagree with them
                _check_placement(placed, row, os.path.normpath(value))
            if number < skip:
                continue
            data = None
            if isinstance(value, str):
                if not value.strip():
                    raise DataFileError(
                        f'{row.where} has no "{self.image_column}" value: each row names an image (a path)'
                    )
                name = os.path.normpath(value)  # ./a.png and a.png are one file: one image, one split
            elif isinstance(value, dict) or _is_pil(value):
                name, data = embedded_image(value, row.where, self.image_column)
            else:
                held = "nothing" if value is None else type(value).__name__
                raise DataFileError(
                    f'{row.where} has no "{self.image_column}" value (it holds {held}): each row names an image (a '
                    "path) or holds one (a datasets Image)"
                )
            refs = [caption] if isinstance(caption, str) else list(caption or [])
            refs = [c.strip() for c in refs if isinstance(c, str) and c.strip()]
            if not refs:
                raise DataFileError(f'{row.where} has no "{self.text_column}" value: each row needs a caption')
            given = str(row.values.get("split") or "").strip().lower()
            if given and given not in SPLIT_ALIASES:
                raise DataFileError(f"{row.where}: image {name!r} has split {given!r}; use train, validation or test")
            split = SPLIT_ALIASES[given] if given else self.owner(source_name, name)
            folder = None if data is not None else row.folder
            for k, text in enumerate(refs):
                first = k == 0
                yield split, Caption(
                    text, name, folder, number, row.nbytes if first else 0, data is not None,
                    data if first else None, row.where,
                )  # fmt: skip


def _check_placement(placed: dict[str, tuple[str, str]], row, name: str) -> None:
    """Refuse a row whose split column places its image (its path: folder and name) apart from an earlier row's:
    the image would be in two splits, trained on and scored. Memory: one entry per image a split column places."""
    given = str(row.values.get("split") or "").strip().lower()
    if given not in SPLIT_ALIASES:
        return  # no split column (or a bad value, refused with the row)
    split, image = SPLIT_ALIASES[given], os.path.join(row.folder or "", name)
    first = placed.setdefault(image, (split, row.where))
    if first[0] != split:
        raise DataFileError(
            f"{row.where}: image {name!r} has split {split!r}, but {first[1]} placed it in {first[0]!r}: the split "
            "column places each image, with all its captions; give every row of the image the same split"
        )


def _is_pil(value: Any) -> bool:
    try:
        from PIL import Image
    except ImportError:
        return False
    return isinstance(value, Image.Image)


def _undecoded(table, column: str):
    """`table` with its `datasets` Image column `column` read undecoded ({"bytes", "path"}): no Pillow decode while
    streaming rows; other tables as they are."""
    features = getattr(table, "features", None)
    if not features or column not in features:
        return table
    import datasets

    if not isinstance(features[column], datasets.Image) or not features[column].decode:
        return table
    return table.cast_column(column, datasets.Image(decode=False))


class CaptionKind(TextsKind):
    """Captions: each caption's ids (no EOS) as a labelled text's, `texts.npy` their offsets, and beside them, one
    JSON line each, [image name, the folder it resolves against, the caption's text] (an image's references).

    An image the dataset holds (a `datasets` Image: `Caption.embedded`) is written once, as its encoded
    bytes, to `images/<name>` of the prepared folder, which becomes its folder: batches read it like any file. Each
    file is renamed into place when written, so a killed run resumes past the images it wrote."""

    folder, tag = "captions", "caption-shards"
    noun = " captions"
    images = "images"  # the prepared folder's folder of embedded images
    partial = "images.partial"  # where an image is written before it is renamed into images/

    def begin(self, root: Path) -> None:
        shutil.rmtree(root / self.partial, ignore_errors=True)  # a killed run's half-written image

    def stage(self, record: Caption, root: Path) -> Caption:
        if not record.embedded:
            return record
        folder = (root / self.images).resolve()
        if record.data is not None:
            path = folder / record.image
            if not path.exists():
                (root / self.partial).mkdir(parents=True, exist_ok=True)
                folder.mkdir(exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=root / self.partial)
                from lit_transformer.checkpoints.files import follow_umask

                follow_umask(tmp)  # mkstemp's 0600: the umask's mode, as the cache's other files
                with os.fdopen(fd, "wb") as handle:
                    handle.write(record.data)
                os.replace(tmp, path)
            elif path.stat().st_size != len(record.data) or path.read_bytes() != record.data:
                raise DataFileError(
                    f"{record.where}: two different images are named {record.image!r} (the base name of their path): "
                    "an image's name identifies it (its captions, its split); give the images distinct file names"
                )
        return dataclasses.replace(record, folder=str(folder), data=None)

    def check(self, stream: CaptionStream, splits: dict[str, dict]) -> None:
        for split in SPLITS:
            if not splits[split]["texts"]:
                why = "carved by a hash of the image name" if split in stream.missing else "its source has no row"
                raise DataFileError(
                    f"{stream.dataset}: no image falls in the {split} split ({why}); add rows, a {split} file or a "
                    "split column"
                )


CAPTIONS = CaptionKind()


def prepare_captions(
    stream: CaptionStream,
    tokenizer: Tokenizer,
    tokenizer_key: str,
    cache_dir: Path,
    shard_tokens: int = SHARD_TOKENS,
    workers: int | None = None,
) -> Path:
    """Prepare every split of `stream` once (cached by content; resumable; atomic): the captions' ids in shards, each
    image's reference and the caption's text beside them; the prepared folder."""
    info = {"vocab_size": tokenizer.get_vocab_size(), "tokenizer_key": tokenizer_key}
    keys = (tokenizer_key, "normpath")  # image paths normalised (./a.png is a.png): earlier caches kept them as written
    return prepare(stream, CAPTIONS, (tokenizer,), keys, cache_dir, info, None, None, shard_tokens, workers)


class CaptionShards(RecordShards):
    """One prepared split of captions: their ids as labelled texts' (per-batch memory maps), and each caption's JSON
    line [image name, folder, caption] read by a seek to where it starts (8 bytes a caption held). Captions of one
    image are grouped by a 64-bit hash of its name and folder (its path: files of one name in two folders are two
    images): images in order of first appearance, `order` their captions."""

    def __init__(self, directory: Path, index: dict) -> None:
        super().__init__(directory, index)
        self.line_starts: list[np.ndarray] = []
        hashes = np.empty(len(self), dtype=np.uint64)
        at = 0
        for shard, name in enumerate(self.names):  # one streamed pass: where each line starts, its image's hash
            starts, position = np.empty(len(self.offsets[shard]) - 1, dtype=np.int64), 0
            with open(self.directory / f"{name}.extras.jsonl", "rb") as handle:
                for i, line in enumerate(handle):
                    starts[i], position = position, position + len(line)
                    image, folder = json.loads(line)[:2]
                    key = f"{folder or ''}\0{image}".encode("utf-8", "surrogatepass")
                    digest = hashlib.blake2b(key, digest_size=8)
                    hashes[at] = int.from_bytes(digest.digest(), "little")
                    at += 1
            self.line_starts.append(starts)
        _, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
        del hashes
        rank = np.empty(len(first), dtype=np.int64)
        rank[np.argsort(first, kind="stable")] = np.arange(len(first))
        self.image_of = rank[inverse.reshape(-1)]  # each caption's image, numbered in order of first appearance
        self.order = np.argsort(self.image_of, kind="stable")  # captions grouped by image, in file order within
        self.start = np.concatenate([[0], np.cumsum(np.bincount(self.image_of, minlength=len(first)))])

    def extras(self, rows: Sequence[int]) -> list[list]:
        """The [image name, folder, caption] of each caption at `rows`."""
        rows = np.asarray(rows, dtype=np.int64)
        shard_of = np.searchsorted(self.first, rows, side="right") - 1
        out: list = [None] * len(rows)
        for shard in np.unique(shard_of).tolist():
            with open(self.directory / f"{self.names[shard]}.extras.jsonl", "rb") as handle:
                for b in np.flatnonzero(shard_of == shard).tolist():
                    handle.seek(int(self.line_starts[shard][rows[b] - self.first[shard]]))
                    out[b] = json.loads(handle.readline())
        return out
