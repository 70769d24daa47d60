"""CaptioningDataModule: (image, caption) pairs for an encoder-decoder whose source is pixels or feature vectors.

Where the pairs come from (``dataset``):
- ``digits``: the embedded task (lit_transformer.data.corpora), strips of handwritten digits captioned in words;
- a captions file, ``.csv`` or ``.jsonl``, one row per caption (an image may have several, its references): an image
  column (a path under ``images_dir``, default the file's folder), a caption column, and optionally a split column
  (train/validation/test); without one, images are carved into splits by a hash of their name;
- a hub dataset with an image and a text column (a list of captions or one), loaded with `datasets`.
With ``features_dir``, each image's source is its precomputed features instead of its pixels: ``<image stem>.npy``
or ``.safetensors`` (one tensor, (regions, source_dim)), for a model with ``source: features``.

Batches: {"src": (B, C, H, W) images or (B, S, source_dim) features with "src_mask" (B, S), "tgt_in": (B, T) bos then
the caption, "labels": (B, T) the caption then eos (-100 at padding), "tgt_mask", "references": each image's captions,
"image": each image's name}. Training reads every (image, caption) pair; evaluation each image once, its loss on its
first caption and BLEU against all of them. Images are decoded and resized with Pillow; no augmentation.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from . import corpora
from .base import DataModule
from .corpora import DigitStrips
from .loaders import target_batch
from .sources import SPLIT_ALIASES, SPLITS, RowStream, ensure_online, is_local, is_saved_dataset
from .text import token_ids

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
FEATURE_SUFFIXES = (".npy", ".safetensors")
HUB_HINT = (
    "Point the DataModule at local files instead: --data.dataset captions.csv (or .jsonl) with columns image and "
    "caption, the images under --data.images_dir (or their features under --data.features_dir); or use the "
    "embedded task, --data.dataset digits."
)


@dataclass
class CaptionSplit:
    """One split: how to load each image's source, its name, and its reference captions."""

    load: Callable[[int], torch.Tensor]
    names: list[str]
    references: list[list[str]]

    def __len__(self) -> int:
        return len(self.names)


def load_image(source, size: tuple[int, int], channels: int) -> torch.Tensor:
    """(channels, height, width) pixels in [0, 1] from a path or a PIL image, resized to `size` (height, width)."""
    from PIL import Image

    image = source if isinstance(source, Image.Image) else Image.open(source)
    image = image.convert("L" if channels == 1 else "RGB")
    if image.size != (size[1], size[0]):
        image = image.resize((size[1], size[0]), Image.Resampling.BILINEAR)
    pixels = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0)
    return pixels[None] if channels == 1 else pixels.permute(2, 0, 1)


def load_features(path: Path) -> torch.Tensor:
    """(regions, source_dim) float32 features from a .npy file or a .safetensors file holding one tensor."""
    if path.suffix == ".npy":
        features = torch.from_numpy(np.load(path)).float()
    else:
        from safetensors.torch import load_file

        tensors = load_file(str(path))
        if len(tensors) != 1:
            raise ValueError(f"{path} holds {len(tensors)} tensors ({', '.join(tensors)}); save one, (regions, dim)")
        features = next(iter(tensors.values())).float()
    if features.dim() != 2:
        raise ValueError(f"{path}: features must be (regions, source_dim), got shape {tuple(features.shape)}")
    return features


class _Pairs(Dataset):
    """Training reads (image, caption) pairs; evaluation (all_pairs=False) each image once with its references."""

    def __init__(self, split: CaptionSplit, all_pairs: bool) -> None:
        self.split = split
        self.index = [
            (image, caption)
            for image, refs in enumerate(split.references)
            for caption in (range(len(refs)) if all_pairs else [0])
        ]

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> tuple[int, int, torch.Tensor]:
        image, caption = self.index[i]
        return image, caption, self.split.load(image)


class CaptioningDataModule(DataModule):
    """Image (or image-feature) captioning data: see the module's docstring for the sources and the batches."""

    tokenizer_tag = "captions"

    def __init__(
        self,
        dataset: str = "digits",
        dataset_config: str | None = None,
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
        num_workers: int = 0,
        seed: int = 42,
        cache_dir: str | None = None,
        predict_file: str | None = None,
        predict_dir: str | None = None,
    ) -> None:
        """
        Args:
            dataset: digits (the embedded task), a .csv/.jsonl captions file, or a hub dataset name.
            dataset_config: The hub dataset's configuration name.
            images_dir: The folder the captions file's image paths are relative to (default: the file's folder).
            features_dir: Precomputed features, <image stem>.npy or .safetensors each, read instead of the pixels.
            image_column: The column naming the image (a path; a hub dataset: the image itself).
            text_column: The column holding a caption (a hub dataset: a caption or a list of them).
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
            num_workers: DataLoader worker processes.
            seed: Seed of the training order.
            cache_dir: Where the trained tokenizer is cached (default $LIT_TRANSFORMER_CACHE or ~/.cache).
            predict_file: A folder of images (or of feature files) for `predict`: one JSONL caption per file.
            predict_dir: Deprecated: predict_file.
        """
        if predict_dir is not None:
            warnings.warn("data.predict_dir is deprecated: set data.predict_file", FutureWarning, stacklevel=2)
            predict_file = predict_file or predict_dir
        super().__init__(
            dataset, dataset_config, text_column, tokenizer, vocab_size, batch_size=batch_size, held_out=held_out,
            num_workers=num_workers, seed=seed, cache_dir=cache_dir, predict_file=predict_file,
        )  # fmt: skip
        if channels not in (1, 3):
            raise ValueError(f"channels={channels}: images are read as greyscale (1) or RGB (3)")
        self.images_dir, self.features_dir, self.image_column = images_dir, features_dir, image_column
        self.image_size, self.channels = tuple(image_size), channels
        self.max_caption_tokens, self.strips, self.bleu_samples = max_caption_tokens, tuple(strips), bleu_samples
        self.splits: dict[str, CaptionSplit] = {}

    @classmethod
    def model_fields(cls, args: dict) -> dict:
        if args.get("features_dir"):  # features: their width is read from the files (source_dim), not set here
            return {}
        return {
            "image_size": ("image_size", list(args["image_size"])),
            "image_channels": ("channels", args["channels"]),
        }

    @classmethod
    def longest_sequence(cls, args: dict) -> tuple[str, int]:
        return "max_caption_tokens", args["max_caption_tokens"] + 1  # bos then the caption; the caption then eos

    # ---- sources ---------------------------------------------------------------------------------------------
    def _read_splits(self) -> dict[str, CaptionSplit]:
        embedded = corpora.embedded(
            self.dataset, self.cache_dir, image_size=self.image_size, channels=self.channels, strips=self.strips
        )
        if embedded is not None and isinstance(next(iter(embedded.values())), DigitStrips):
            return {
                split: CaptionSplit(
                    torch.from_numpy(strips.images).__getitem__,
                    [f"{split}-{i}" for i in range(len(strips))],
                    [[c] for c in strips.captions],
                )
                for split, strips in embedded.items()
            }
        if embedded is None and not is_local(self.dataset) and not is_saved_dataset(self.dataset):
            return self._hub_splits(self.dataset)
        return self._row_splits(embedded)

    def _row_splits(self, embedded) -> dict[str, CaptionSplit]:
        """Captions read through the one reader: one row per caption (an image may have several, its references);
        an image's split is its rows' split column, else its file's (train*/valid*/test*), else carved by a hash of
        its name."""
        hint = " (choose them with --data.init_args.image_column and text_column)"
        stream = RowStream(
            self.dataset, [self.image_column, self.text_column], self.image_column, self.dataset_config, embedded,
            self.held_out, hint,
        )  # fmt: skip
        captions: dict[str, list[str]] = {}
        split_of: dict[str, str] = {}
        where: dict[str, str] = {}
        for split, row in stream.all_rows():
            name, caption = row.values[self.image_column], row.values[self.text_column]
            if not isinstance(name, str) or not name.strip():
                raise ValueError(f'{row.where} has no "{self.image_column}" value: each row names an image (a path)')
            refs = [caption] if isinstance(caption, str) else list(caption or [])
            if not any(isinstance(c, str) and c.strip() for c in refs):
                raise ValueError(f'{row.where} has no "{self.text_column}" value: each row needs a caption')
            given = str(row.values.get("split") or "").strip().lower()
            if given and given not in SPLIT_ALIASES:
                raise ValueError(f"{row.where}: image {name!r} has split {given!r}; use train, validation or test")
            captions.setdefault(name, []).extend(c.strip() for c in refs if isinstance(c, str) and c.strip())
            split_of.setdefault(name, SPLIT_ALIASES[given] if given else split)
            where.setdefault(name, self.images_dir or row.folder or ".")
        splits = {}
        for split in SPLITS:
            names = [n for n in captions if split_of[n] == split]
            if not names:
                why = "carved by a hash of the image name" if split in stream.missing else "its source has no row"
                raise ValueError(
                    f"{self.dataset}: no image falls in the {split} split ({why}); add rows, a {split} file or a "
                    "split column"
                )
            splits[split] = CaptionSplit(
                self._loader_for([Path(where[n]) / n for n in names]), names, [captions[n] for n in names]
            )
        return splits

    def _loader_for(self, paths: Sequence[Path]) -> Callable[[int], torch.Tensor]:
        """Each image's source: its features (features_dir) or its pixels, read when the batch is built."""
        features_dir = self.features_dir
        if features_dir is None:
            return lambda i: load_image(paths[i], self.image_size, self.channels)
        files = [_feature_file(Path(features_dir), Path(p).stem) for p in paths]
        return lambda i: load_features(files[i])

    def _hub_splits(self, name: str) -> dict[str, CaptionSplit]:
        import datasets

        ensure_online(f"captioning dataset {name!r}", HUB_HINT)
        loaded = datasets.load_dataset(name, cache_dir=str(self.cache_dir / "hf"))
        image_column, text_column = self.image_column, self.text_column
        splits = {}
        for given, data in loaded.items():
            split = SPLIT_ALIASES.get(given.lower())
            if split is None:
                continue
            refs = [[t] if isinstance(t, str) else list(t) for t in data[text_column]]
            splits[split] = CaptionSplit(
                lambda i, data=data: load_image(data[i][image_column], self.image_size, self.channels),
                [f"{split}-{i}" for i in range(len(data))],
                refs,
            )
        missing = {"train", "validation", "test"} - set(splits)
        if missing:
            raise ValueError(f"hub dataset {name!r} lacks the split(s) {sorted(missing)}; its splits: {list(loaded)}")
        return splits

    # ---- Lightning hooks ---------------------------------------------------------------------------------------
    def tokenizer_texts(self) -> list[str]:
        self.setup()
        return [c for refs in self.splits["train"].references for c in refs]

    def prepare(self) -> None:
        """Read the captions and train the tokenizer (the images are read when a batch is built)."""
        self.setup()
        _ = self.tokenizers  # trained (and cached) on first access

    def setup(self, stage: str | None = None) -> None:
        if not self.splits:
            self.splits = self._read_splits()

    def collate(self, items: list[tuple[int, int, torch.Tensor]], split: CaptionSplit) -> dict:
        sources = [source for _, _, source in items]
        if sources[0].dim() == 2:  # features: (regions, dim), padded to the most regions with a mask
            longest = max(s.shape[0] for s in sources)
            src = torch.zeros(len(sources), longest, sources[0].shape[1])
            src_mask = torch.zeros(len(sources), longest, dtype=torch.bool)
            for b, s in enumerate(sources):
                src[b, : s.shape[0]], src_mask[b, : s.shape[0]] = s, True
            batch = {"src": src, "src_mask": src_mask}
        else:
            batch = {"src": torch.stack(sources)}
        captions = [split.references[image][caption] for image, caption, _ in items]
        ids = [row[: self.max_caption_tokens] for row in token_ids(self.tokenizer, captions)]
        batch.update(target_batch(ids, self.pad_token_id, self.bos_token_id, self.eos_token_id))
        batch["references"] = [split.references[image] for image, _, _ in items]
        batch["image"] = [split.names[image] for image, _, _ in items]
        return batch

    def loader(self, split: str, shuffle: bool) -> DataLoader:
        self.setup()
        data = self.splits[split]
        return DataLoader(
            _Pairs(data, all_pairs=split == "train"),
            batch_size=self.batch_size,
            shuffle=shuffle,
            num_workers=self.num_workers,
            collate_fn=lambda items: self.collate(items, data),
        )

    def predict_dataloader(self) -> DataLoader:
        """Batches {"src" (, "src_mask"), "image"} of every image (or feature file) in predict_file, a folder,
        sorted by name."""
        if not self.predict_file or not Path(self.predict_file).is_dir():
            raise ValueError(
                f"predict needs a folder of images: --data.predict_file DIR (got {self.predict_file!r}); captions are "
                "written one JSON line per image"
            )
        suffixes = FEATURE_SUFFIXES if self.features_dir else IMAGE_SUFFIXES
        paths = sorted(p for p in Path(self.predict_file).iterdir() if p.suffix.lower() in suffixes)
        if not paths:
            raise ValueError(f"predict_file {self.predict_file!r} holds no {'/'.join(suffixes)} file")
        if self.features_dir:
            load = lambda i: load_features(paths[i])  # noqa: E731
        else:
            load = lambda i: load_image(paths[i], self.image_size, self.channels)  # noqa: E731
        split = CaptionSplit(load, [p.name for p in paths], [[""] for _ in paths])
        return DataLoader(
            _Pairs(split, all_pairs=False),
            batch_size=self.batch_size,
            shuffle=False,
            collate_fn=lambda items: self.collate(items, split),
        )


def _feature_file(folder: Path, stem: str) -> Path:
    for suffix in FEATURE_SUFFIXES:
        if (folder / f"{stem}{suffix}").is_file():
            return folder / f"{stem}{suffix}"
    raise FileNotFoundError(f"no features for image {stem!r} in {folder}: expected {stem}.npy or {stem}.safetensors")
