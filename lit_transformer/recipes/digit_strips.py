"""Write strips of the embedded captioning task as PNG files, with their captions: images to `predict` on.

    python -m lit_transformer digit-strips --split test --count 8 --out strips
writes strips/strip0.png ... and strips/captions.csv (image, caption, split), a captions file the
CaptioningDataModule reads too.
"""

from __future__ import annotations

import csv
from pathlib import Path

from PIL import Image

from lit_transformer.bench import command_parser
from lit_transformer.data.corpora.digits import SCAN_SPLITS, digit_strips


def main(argv: list[str] | None = None) -> None:
    parser = command_parser("digit-strips", __doc__)
    parser.add_argument("--split", default="test", choices=list(SCAN_SPLITS))
    parser.add_argument("--count", type=int, default=8)
    parser.add_argument("--out", default="strips")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    strips = digit_strips(args.split, args.count)
    with (out / "captions.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["image", "caption", "split"])
        for i, (image, caption) in enumerate(zip(strips.images, strips.captions, strict=True)):
            Image.fromarray((image[0] * 255).round().astype("uint8")).save(out / f"strip{i}.png")
            writer.writerow([f"strip{i}.png", caption, args.split])
    print(f"wrote {args.count} strips and captions.csv to {out}/")


if __name__ == "__main__":
    main()
