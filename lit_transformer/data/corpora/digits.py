"""``digits``: strips of 3-6 of scikit-learn's 1,797 scanned 8 x 8 handwritten digits (43 writers), captioned in
words ("seven two nine"). Scans are split first (70/10/20 by a fixed permutation) and every strip of a split is
composed from that split's scans only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lit_transformer.errors import ConfigError

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


SCAN_SPLITS = {"train": 0.7, "validation": 0.1, "test": 0.2}


SCAN_SEED = 20260  # the permutation of the scans: fixed, so splits never move between runs


@dataclass(frozen=True)
class DigitStrips:
    """Strips (N, 1, 8, 8 * max_digits) of pixels in [0, 1], their digit sequences and captions."""

    images: np.ndarray
    digits: list[list[int]]

    @property
    def captions(self) -> list[str]:
        return [caption(d) for d in self.digits]

    def __len__(self) -> int:
        return len(self.digits)


def caption(digits: list[int]) -> str:
    return " ".join(DIGIT_WORDS[d] for d in digits)


def digit_scans() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's scans as (1797, 8, 8) float32 in [0, 1] and their labels."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as error:  # pragma: no cover - a dependency of the package
        raise ImportError(
            "the embedded captioning task reads scikit-learn's digits: pip install scikit-learn"
        ) from error
    data = load_digits()
    return (data.images / 16.0).astype(np.float32), data.target.astype(np.int64)


def scan_split(n_scans: int) -> dict[str, np.ndarray]:
    """Indices of the scans of each split: a fixed permutation cut at SCAN_SPLITS' fractions."""
    order = np.random.default_rng(SCAN_SEED).permutation(n_scans)
    cuts = np.cumsum([int(round(f * n_scans)) for f in SCAN_SPLITS.values()])[:-1]
    return dict(zip(SCAN_SPLITS, np.split(order, cuts), strict=True))


def compose_strips(
    scans: np.ndarray,
    labels: np.ndarray,
    count: int,
    seed: int,
    min_digits: int = 3,
    max_digits: int = 6,
) -> DigitStrips:
    """`count` strips drawn from `scans`: each takes min_digits..max_digits scans at random (with replacement)."""
    if not 1 <= min_digits <= max_digits:
        raise ValueError(f"need 1 <= min_digits <= max_digits, got {min_digits} and {max_digits}")
    rng = np.random.default_rng(seed)
    side = scans.shape[-1]
    images = np.zeros((count, 1, side, side * max_digits), dtype=np.float32)
    digits = []
    for i in range(count):
        chosen = rng.integers(0, len(scans), size=int(rng.integers(min_digits, max_digits + 1)))
        for slot, scan in enumerate(chosen):
            images[i, 0, :, slot * side : (slot + 1) * side] = scans[scan]
        digits.append(labels[chosen].tolist())
    return DigitStrips(images, digits)


def digit_strips(split: str, count: int, min_digits: int = 3, max_digits: int = 6, seed: int = 0) -> DigitStrips:
    """The strips of one split, composed from that split's scans only; the same arguments give the same strips."""
    if split not in SCAN_SPLITS:
        raise ValueError(f"split={split!r} is not one of {', '.join(SCAN_SPLITS)}")
    scans, labels = digit_scans()
    rows = scan_split(len(scans))[split]
    split_seed = seed * 10 + list(SCAN_SPLITS).index(split)
    return compose_strips(scans[rows], labels[rows], count, split_seed, min_digits, max_digits)


def digit_captions(
    image_size: tuple[int, int] = (8, 48), channels: int = 1, strips: tuple[int, int, int] = (20000, 500, 1000), **_
) -> dict[str, DigitStrips]:
    """The embedded captioning task (the digit strips above): each split's strips, composed from that split's scans only; the
    strip's width says how many digits it holds at most."""
    if image_size[0] != 8 or image_size[1] % 8 or channels != 1:
        raise ConfigError(
            f"dataset='digits' strips are 8 pixels high, 8 wide a digit, greyscale: image_size=[8, 8 * max digits] "
            f"and channels=1, not image_size={list(image_size)}, channels={channels}"
        )
    splits = ("train", "validation", "test")
    return {s: digit_strips(s, n, max_digits=image_size[1] // 8) for s, n in zip(splits, strips, strict=True)}
