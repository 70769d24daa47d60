"""Write strips of the embedded captioning task as PNG files, with their captions: images to `predict` on.

    python -m lit_transformer digit-strips --split test --count 8 --out strips
writes strips/strip0.png ... and strips/captions.csv (image, caption, split), a captions file the
CaptioningDataModule reads too.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import Literal

from jsonargparse.typing import PositiveInt

from lit_transformer.cli.arguments import command_parser, parse


def main(argv: list[str] | None = None) -> None:
    parser = command_parser("digit-strips", __doc__)
    parser.add_argument("--split", type=Literal["train", "validation", "test"], default="test", help="the scans drawn")
    parser.add_argument("--count", type=PositiveInt, default=8, help="how many strips")
    parser.add_argument("--out", type=str, default="strips", help="the folder they go to")
    args = parse(parser, sys.argv[1:] if argv is None else argv)

    from PIL import Image

    from lit_transformer.data.corpora.digits import digit_strips

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        from lit_transformer.errors import ConfigError

        raise ConfigError(f"--out {out} is a file: the strips go to a folder; give a new or existing one")
    from lit_transformer.errors import make_folder

    make_folder(out, "--out")
    for stale in _earlier_strips(out, args.count):  # a folder's images are all captioned by predict: none left over
        stale.unlink()
    strips = digit_strips(args.split, args.count)
    with (out / "captions.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["image", "caption", "split"])
        for i, (image, caption) in enumerate(zip(strips.images, strips.captions, strict=True)):
            Image.fromarray((image[0] * 255).round().astype("uint8")).save(out / f"strip{i}.png")
            writer.writerow([f"strip{i}.png", caption, args.split])
    print(f"wrote {args.count} strips and captions.csv to {out}/")


if __name__ == "__main__":
    from lit_transformer.cli.program import main as program

    program(["digit-strips", *sys.argv[1:]])


def _earlier_strips(out: Path, count: int) -> list[Path]:
    """The strips an earlier run wrote to `out` (as its captions.csv names them) past the `count` written now: left
    there, `predict` on the folder captioned them too, and captions.csv no longer named them."""
    import re

    listed = out / "captions.csv"
    if not listed.is_file():
        return []
    with listed.open(newline="") as handle:
        names = [row.get("image") or "" for row in csv.DictReader(handle)]
    earlier = [out / name for name in names if re.fullmatch(r"strip(\d+)\.png", name)]
    return [path for path in earlier if int(path.stem.removeprefix("strip")) >= count and path.is_file()]
