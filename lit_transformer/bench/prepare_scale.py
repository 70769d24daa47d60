"""Benchmark data preparation at scale: our streaming `prepare` against nanoGPT's openwebtext recipe, side by side.

    python -m lit_transformer bench prepare corpus --size_mb 200 --out /tmp/bench/corpus-200.jsonl
    python -m lit_transformer bench prepare tokenizer --out /tmp/bench/tokenizer.json
    python -m lit_transformer bench prepare ours --corpus /tmp/bench/corpus-200.jsonl --tokenizer /tmp/bench/tokenizer.json
    python -m lit_transformer bench prepare nanogpt --corpus /tmp/bench/corpus-200.jsonl --tokenizer /tmp/bench/tokenizer.json
    python -m lit_transformer bench prepare train_rss --corpus /tmp/bench/corpus-1000.jsonl --tokenizer ... --steps 1000

The user's path, end to end (`fit --config configs/base.yaml` prepares the corpus, then trains from the shards):

    python -m lit_transformer bench prepare cli_rss --size_mb 1000 --steps 1000 --out /tmp/cli13b

Translation (pairs through token shards):

    python -m lit_transformer bench prepare pairs_corpus --size_mb 200 --out /tmp/bench/pairs-200
    python -m lit_transformer bench prepare pairs_tokenizer --out /tmp/bench/pairs-tokenizer.json
    python -m lit_transformer bench prepare pairs --corpus /tmp/bench/pairs-200 --tokenizer /tmp/bench/pairs-tokenizer.json

`--json FILE` (before the subcommand) adds each measurement (ours, nanogpt, pairs, train_rss, pairs_loader_rss,
cli_rss), with its command and machine, to the runs of FILE (one line each in a .jsonl).

`corpus` writes JSON lines {"text": ...} of documents of a few KB (1-6 KB windows of whole lines from the 42
Shakespeare works, drawn with a fixed seed) up to the size asked. `tokenizer` trains one byte-level BPE of 8,192
tokens on the Shakespeare training split: both preparations use that same file. `ours` runs
`python -m lit_transformer prepare` on a fresh cache; `nanogpt` runs nanoGPT's data/openwebtext/prepare.py recipe
(load_dataset, train_test_split(test_size=0.0005, seed=2357), datasets.map with num_proc=2 that encodes each document
and appends the end-of-text id, then each split concatenated into a uint16 np.memmap in 1,024 batches), with the
same tokenizer in place of tiktoken. Each runs in a subprocess (lit_transformer.records.run_child); wall time, CPU time (user + system, all processes), MB/s of JSONL and the
peak resident memory are reported: the largest single process (wait4's ru_maxrss) and the sum over the process tree (sampled every 0.1 s; forked
workers share pages, so the sum overstates). `train_rss` trains a tiny model from the prepared shards and reports
the resident memory after 100 steps and after the last. `cli_rss` writes a corpus under --out, runs
`python -m lit_transformer fit --config configs/base.yaml` on it in a fresh cache (base.yaml's own tokenizer unless
--tokenizer is given; one 4-batch validation and one checkpoint at the end) with HostMemoryMonitor, samples the RSS of
the process tree every 0.25 s, and reports the peak RSS during preparation (until the trainer's setup), the trainer's
RSS every 100 steps, and its growth from step 100 to the last; then deletes the corpus, cache and run (not --keep).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from jsonargparse.typing import PositiveInt

from lit_transformer.bench.checks import runs_file
from lit_transformer.cli.arguments import chosen, command_parser, packaged_configs, parse, subcommand_parser
from lit_transformer.errors import ConfigError, UserError
from lit_transformer.records import child_env, command_line, machine, process_rss_mb, run_child, write_run

STAMP: dict = {}  # this run's command line, as a user types it, and its machine as it starts (set by main)


# ---------------------------------------------------------------------------------------------------- inputs


def make_corpus(size_mb: float, out: Path, seed: int = 0) -> None:
    from lit_transformer.data.corpora.shakespeare import shakespeare_files

    works = [path.read_text(encoding="utf-8").splitlines(keepends=True) for path in shakespeare_files()]
    rng = random.Random(seed)
    target = int(size_mb * 1e6)
    written = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as handle:
        while written < target:
            lines = works[rng.randrange(len(works))]
            start = rng.randrange(len(lines))
            want, size, end = rng.randint(1000, 6000), 0, start
            while end < len(lines) and size < want:
                size += len(lines[end])
                end += 1
            line = json.dumps({"text": "".join(lines[start:end])}) + "\n"
            handle.write(line)
            written += len(line.encode())
    print(f"{out}: {written / 1e6:.1f} MB")


def make_tokenizer(out: Path, vocab_size: int = 8192) -> None:
    from lit_transformer.data import corpora
    from lit_transformer.data.text import train_tokenizer

    tokenizer = train_tokenizer(corpora.shakespeare()["train"]["text"], "byte_bpe", vocab_size)
    out.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out))
    print(f"{out}: byte-level BPE, {tokenizer.get_vocab_size()} tokens")


def make_pair_corpus(size_mb: float, out: Path, seed: int = 0, held_out: int = 1000) -> None:
    """A folder of JSON lines {"en", "es"}: valid.jsonl and test.jsonl of `held_out` pairs and train.jsonl of about
    `size_mb`; each pair is 1-3 consecutive verses of the embedded KJV-RV1909 training split, drawn with a fixed seed."""
    from lit_transformer.data import corpora
    from lit_transformer.data.cache import resolve_cache_dir

    train = corpora.kjv_rv1909(resolve_cache_dir())["train"]
    en, es = list(train["en"]), list(train["es"])
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)

    def pair() -> str:
        start, count = rng.randrange(len(en) - 3), rng.randint(1, 3)
        return json.dumps({"en": " ".join(en[start : start + count]), "es": " ".join(es[start : start + count])})

    for name in ("valid", "test"):
        (out / f"{name}.jsonl").write_text("".join(pair() + "\n" for _ in range(held_out)), encoding="utf-8")
    target, written, pairs = int(size_mb * 1e6), 0, 0
    with open(out / "train.jsonl", "w", encoding="utf-8") as handle:
        while written < target:
            line = pair() + "\n"
            handle.write(line)
            written += len(line.encode())
            pairs += 1
    print(f"{out}/train.jsonl: {written / 1e6:.1f} MB, {pairs:,} pairs (+ {held_out:,} valid, {held_out:,} test)")


def make_pair_tokenizer(out: Path, vocab_size: int = 8000) -> None:
    from lit_transformer.data import corpora
    from lit_transformer.data.cache import resolve_cache_dir
    from lit_transformer.data.text import train_tokenizer

    train = corpora.kjv_rv1909(resolve_cache_dir())["train"]
    tokenizer = train_tokenizer(list(train["en"]) + list(train["es"]), "bpe", vocab_size)
    out.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out))
    print(f"{out}: BPE, {tokenizer.get_vocab_size()} tokens")


# ---------------------------------------------------------------------------------------------------- measuring


def measure(command: list[str], env: dict | None = None) -> dict:
    """Run `command`; its wall time, CPU time, the largest process's peak RSS and the sampled peak of the tree's sum."""
    done = run_child(command, env=child_env(**(env or {})), interval=0.1)
    if done.returncode != 0:
        raise SystemExit(f"{command} failed with exit code {done.returncode}")
    return {
        "wall_s": round(done.wall_s, 1),
        "cpu_s": round(done.cpu_s, 1),  # all processes, user + system
        "peak_rss_process_gb": round(done.peak_rss_mb / 1e3, 3),
        "peak_rss_tree_gb": round((done.peak_tree_mb or 0) / 1e3, 3),
    }


def _report(name: str, corpus: Path | None, result: dict, log: Path | None) -> None:
    """Print the run's result; with --json, add it (its command and machine beside it) to the runs of that file."""
    if corpus is not None:
        size = corpus.stat().st_size / 1e6
        result = {"corpus_mb": round(size, 1), **result, "mb_per_s": round(size / result["wall_s"], 2)}
    result = {"run": name, **result}
    print(json.dumps(result), flush=True)
    if log is not None:
        write_run(log, result, **STAMP)


# ---------------------------------------------------------------------------------------------------- the two recipes


def run_ours(corpus: Path, tokenizer: Path, cache_dir: Path | None, threads: int, log: Path | None) -> None:
    cache = cache_dir or Path(tempfile.mkdtemp(prefix="bench-ours-"))
    config = cache / "prepare.yaml"
    cache.mkdir(parents=True, exist_ok=True)
    config.write_text(
        json.dumps(
            {
                "data": {
                    "class_path": "lit_transformer.data.LanguageModelingDataModule",
                    "init_args": {"dataset": str(corpus), "tokenizer": str(tokenizer), "cache_dir": str(cache)},
                }
            }
        )
    )
    command = [sys.executable, "-m", "lit_transformer", "prepare", "--config", str(config)]
    env = {"RAYON_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "true"}
    _report("ours", corpus, measure(command, env), log)


def nanogpt_recipe(corpus: str, tokenizer_path: str, out: str, num_proc: int) -> None:
    """nanoGPT's data/openwebtext/prepare.py, with a local JSONL and a `tokenizers` tokenizer in place of tiktoken."""
    import numpy as np
    from datasets import load_dataset
    from tokenizers import Tokenizer
    from tqdm import tqdm

    enc = Tokenizer.from_file(tokenizer_path)
    eot = enc.token_to_id("<eos>")
    dataset = load_dataset("json", data_files={"train": corpus}, cache_dir=os.path.join(out, "hf"))
    split_dataset = dataset["train"].train_test_split(test_size=0.0005, seed=2357, shuffle=True)
    split_dataset["val"] = split_dataset.pop("test")

    def process(example):
        ids = enc.encode(example["text"], add_special_tokens=False).ids
        ids.append(eot)
        return {"ids": ids, "len": len(ids)}

    tokenized = split_dataset.map(process, remove_columns=["text"], desc="tokenizing the splits", num_proc=num_proc)
    for split, dset in tokenized.items():
        arr_len = np.sum(dset["len"], dtype=np.uint64)
        filename = os.path.join(out, f"{split}.bin")
        arr = np.memmap(filename, dtype=np.uint16, mode="w+", shape=(arr_len,))
        total_batches = min(1024, len(dset))  # nanoGPT: 1024 (its val split has 4,007 rows; ours can have fewer)
        idx = 0
        for batch_idx in tqdm(range(total_batches), desc=f"writing {filename}"):
            batch = dset.shard(num_shards=total_batches, index=batch_idx, contiguous=True).with_format("numpy")
            arr_batch = np.concatenate(batch["ids"])
            arr[idx : idx + len(arr_batch)] = arr_batch
            idx += len(arr_batch)
        arr.flush()


def run_nanogpt(corpus: Path, tokenizer: Path, out: Path | None, num_proc: int, log: Path | None) -> None:
    out = out or Path(tempfile.mkdtemp(prefix="bench-nanogpt-"))
    command = [sys.executable, "-m", "lit_transformer.bench", "prepare", "_nanogpt", str(corpus), str(tokenizer),
               str(out), str(num_proc)]  # fmt: skip
    _report("nanogpt", corpus, measure(command, {"HF_DATASETS_OFFLINE": "1"}), log)


# ---------------------------------------------------------------------------------------------------- translation


def run_pairs(corpus: Path, tokenizer: Path, cache_dir: Path | None, log: Path | None) -> None:
    """`python -m lit_transformer prepare` of a folder of pair files into token shards, on a fresh cache."""
    cache = cache_dir or Path(tempfile.mkdtemp(prefix="bench-pairs-"))
    cache.mkdir(parents=True, exist_ok=True)
    config = cache / "prepare.yaml"
    init = {"dataset": str(corpus), "tokenizer": str(tokenizer), "cache_dir": str(cache)}
    init |= {"max_length": 256, "max_tokens": 4096}
    config.write_text(
        json.dumps({"data": {"class_path": "lit_transformer.data.TranslationDataModule", "init_args": init}})
    )
    command = [sys.executable, "-m", "lit_transformer", "prepare", "--config", str(config)]
    train = corpus / "train.jsonl" if corpus.is_dir() else corpus
    _report("pairs", train, measure(command, {"HF_DATASETS_OFFLINE": "1"}), log)


def run_pairs_loader_rss(corpus: Path, tokenizer: Path, cache_dir: Path, batches: int, log: Path | None) -> None:
    """Training batches read from prepared pair shards: setup time (the plan from the index) and the resident memory
    after 100 batches and after `batches` (the loader alone: no model)."""
    import torch

    from lit_transformer.data import TranslationDataModule

    torch.set_num_threads(1)
    before = process_rss_mb()
    started = time.perf_counter()
    dm = TranslationDataModule(str(corpus), tokenizer=str(tokenizer), max_length=256, max_tokens=4096,
                               cache_dir=str(cache_dir))  # fmt: skip
    dm.setup()
    loader = dm.train_dataloader()
    setup = time.perf_counter() - started
    rss, started = {"setup": process_rss_mb()}, time.perf_counter()
    for step, _ in enumerate(itertools.islice(itertools.chain.from_iterable(itertools.repeat(loader)), batches), 1):
        if step in (100, 1000, batches):
            rss[str(step)] = process_rss_mb()
    took = time.perf_counter() - started
    _report("pairs_loader_rss", None, {"train_pairs": len(loader.dataset), "batches_per_epoch": len(loader),
                                       "setup_s": round(setup, 2), "rss_before_mb": round(before, 1),
                                       "rss_mb": {k: round(v, 1) for k, v in rss.items()},
                                       "ms_per_batch": round(1e3 * took / batches, 2),
                                       "growth_100_to_last": f"{(rss[str(batches)] - rss['100']) / rss['100']:+.2%}"},
            log)  # fmt: skip


# ---------------------------------------------------------------------------------------------------- training memory


def run_train_rss(corpus: Path, tokenizer: Path, cache_dir: Path, steps: int, log: Path | None) -> None:
    """The tiny preset trained from the prepared shards, through the CLI's own objects: resident memory after 100
    steps and after `steps`."""
    import lightning as L
    import torch

    from lit_transformer.cli.lightning_cli import run_cli

    torch.set_num_threads(1)
    rss: dict[int, float] = {}

    class Probe(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
            step = trainer.global_step
            if step in (100, 500, steps):
                rss[step] = process_rss_mb()

    data = [
        "--data.init_args.dataset",
        str(corpus),
        "--data.init_args.tokenizer",
        str(tokenizer),
        "--data.init_args.max_chars",
        "null",
        "--data.init_args.cache_dir",
        str(cache_dir),
    ]
    quiet = ["--trainer.max_steps", str(steps), "--trainer.limit_val_batches", "0", "--trainer.logger", "false",
             "--trainer.enable_progress_bar", "false", "--trainer.enable_checkpointing", "false",
             "--model.optim.warmup_steps", "10"]  # fmt: skip
    cli = run_cli(["--config", str(packaged_configs() / "presets" / "tiny.yaml"), *data, *quiet], run=False)
    cli.trainer.callbacks.append(Probe())
    started = time.perf_counter()
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    growth = (rss[steps] - rss[100]) / rss[100]
    _report("train_rss", None, {"train_blocks": len(cli.trainer.train_dataloader.dataset),
                                "rss_mb": {str(k): round(v, 1) for k, v in sorted(rss.items())},
                                "growth_100_to_last": f"{growth:+.2%}",
                                "wall_s": round(time.perf_counter() - started, 1)}, log)  # fmt: skip


# ---------------------------------------------------------------------------------------------------- the user's path


def run_cli_rss(
    size_mb: float, out: Path, steps: int, tokenizer: Path | None, interval: float, keep: bool, log: Path | None
) -> None:
    """`python -m lit_transformer fit --config configs/base.yaml` on a generated JSONL of `size_mb`, in a fresh cache:
    the command line prepares the corpus (streaming, token shards) and then trains `steps` steps from the shards.
    The resident memory of the whole process tree (the CLI and the preparation's worker processes) is sampled every
    `interval` seconds; HostMemoryMonitor writes the trainer's own RSS every 100 steps with the time, and its "setup"
    record (data prepared, model built) splits the run into preparation and training."""
    import shutil

    if steps < 100 or steps % 100:
        raise UserError(f"--steps must be a multiple of 100 (the monitor records every 100 steps), not {steps}")
    out = out.resolve()  # the child runs in it
    out.mkdir(parents=True, exist_ok=True)
    corpus = out / f"corpus-{size_mb:g}.jsonl"
    if not corpus.exists():
        make_corpus(size_mb, corpus)
    records = out / "rss.jsonl"
    records.unlink(missing_ok=True)
    monitor = {"class_path": "lit_transformer.engine.monitoring.HostMemoryMonitor",
               "init_args": {"every_n_steps": 100, "path": str(records)}}  # fmt: skip
    base = str(packaged_configs() / "base.yaml")
    command = [sys.executable, "-m", "lit_transformer", "fit", "--config", base,
               "--data.init_args.dataset", str(corpus), "--data.init_args.cache_dir", str(out / "cache"),
               *(["--data.init_args.tokenizer", str(tokenizer)] if tokenizer else []),
               "--trainer.max_steps", str(steps), "--trainer.val_check_interval", str(steps),
               "--trainer.limit_val_batches", "4", "--trainer.default_root_dir", str(out / "run"),
               "--trainer.logger.init_args.save_dir", str(out / "run"), "--trainer.enable_progress_bar", "false",
               "--checkpoint.dirpath", str(out / "run" / "checkpoints"), "--checkpoint.every_n_train_steps", str(steps),
               f"--trainer.callbacks+={json.dumps(monitor)}"]  # fmt: skip
    print("$ " + " ".join(command), flush=True)
    load = [os.getloadavg()[0]]  # the machine is shared: the 1-minute load average at the start, setup and end
    started = time.time()
    done = run_child(command, cwd=out, env=child_env(HF_DATASETS_OFFLINE="1"), interval=interval)
    ended = time.time()
    load.append(os.getloadavg()[0])
    if done.returncode != 0:
        raise SystemExit(f"fit failed with exit code {done.returncode}")
    samples = done.samples  # (time, MB of the tree)
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    setup = next(row for row in rows if row["stage"] == "setup")
    train = {row["step"]: row for row in rows if row["stage"] == "train"}
    prep = [mb for t, mb in samples if t <= setup["time"]]
    after = [mb for t, mb in samples if t > setup["time"]]
    rss = {str(step): row["rss_mb"] for step, row in sorted(train.items())}
    first, last = train[100]["rss_mb"], train[steps]["rss_mb"]
    shards = sum(f.stat().st_size for f in (out / "cache").rglob("*") if f.is_file())
    result = {"corpus_mb": round(corpus.stat().st_size / 1e6, 1), "samples": len(samples),
              "prepare_s": round(setup["time"] - started, 1), "train_s": round(ended - setup["time"], 1),
              "peak_rss_prepare_tree_gb": round(max(prep) / 1e3, 3),
              "peak_rss_prepare_main_gb": round(setup["peak_rss_mb"] / 1e3, 3),
              "peak_rss_largest_process_gb": round(done.peak_rss_mb / 1e3, 3),
              "peak_rss_train_tree_gb": round(max(after) / 1e3, 3) if after else None,
              "rss_setup_mb": setup["rss_mb"], "rss_mb_by_step": rss,
              "children_rss_mb_last": train[steps]["children_rss_mb"],
              "growth_100_to_last": f"{(last - first) / first:+.2%}", "cache_mb": round(shards / 1e6, 1),
              "load_average_start_end": [round(x, 1) for x in load]}  # fmt: skip
    _report("cli_rss", None, result, log)
    if not keep:
        corpus.unlink()
        shutil.rmtree(out / "cache", ignore_errors=True)
        shutil.rmtree(out / "run", ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_nanogpt"]:  # the child process of `nanogpt`: its recipe, timed from outside
        corpus, tokenizer, out, num_proc = argv[1:5]
        nanogpt_recipe(corpus, tokenizer, out, int(num_proc))
        return
    STAMP.update(command=command_line("bench prepare", argv))
    parser = command_parser("bench prepare", __doc__)
    parser.add_argument("--json", type=Path | None, default=None, help="add each measurement to the runs of this file")
    commands = parser.add_subcommands(dest="command", required=True)

    def add(name: str, summary: str, *options: tuple[str, object, object, str]) -> None:
        """A subcommand with its options, each (flag, type, default (... for required, False for a switch), help)."""
        command = subcommand_parser(name, summary[:1].upper() + summary[1:] + ".")
        for flag, kind, default, text in options:
            if default is False:
                command.add_argument(flag, action="store_true", help=text)
            elif default is ...:
                command.add_argument(flag, type=kind, required=True, help=text)
            else:
                command.add_argument(flag, type=kind, default=default, help=text)
        commands.add_subcommand(name, command, help=summary)

    corpus = ("--corpus", Path, ..., "the JSONL corpus (`corpus`), or the folder of pairs (`pairs_corpus`)")
    tokenizer = ("--tokenizer", Path, ..., "the tokenizer.json both recipes use (`tokenizer`, `pairs_tokenizer`)")
    add("corpus", "write a JSONL corpus of documents of a few KB",
        ("--size_mb", float, ..., "its size"), ("--out", Path, ..., "the JSONL file"))  # fmt: skip
    add("tokenizer", "the fixed byte-level BPE both recipes use", ("--out", Path, ..., "the tokenizer.json"))
    add("pairs_corpus", "write a folder of JSON-lines pairs (train/valid/test)",
        ("--size_mb", float, ..., "train.jsonl's size"), ("--out", Path, ..., "the folder"))  # fmt: skip
    add("pairs_tokenizer", "the fixed BPE both translation storages use", ("--out", Path, ..., "the tokenizer.json"))
    add("pairs", "prepare a folder of pairs into token shards", corpus, tokenizer,
        ("--out", Path | None, None, "cache folder (default: a fresh temporary one)"))  # fmt: skip
    add("pairs_loader_rss", "read training batches from prepared pair shards", corpus, tokenizer,
        ("--out", Path, ..., "the cache `pairs` prepared"), ("--batches", PositiveInt, 5000, "batches to read"))  # fmt: skip
    add("cli_rss", "`fit --config configs/base.yaml` on a generated JSONL: RSS of both phases",
        ("--size_mb", float, 1000.0, "the corpus's size"),
        ("--out", Path, ..., "a scratch folder: corpus, cache and run go there"),
        ("--steps", PositiveInt, 1000, "optimizer steps (a multiple of 100)"),
        ("--tokenizer", Path | None, None, "a tokenizer.json (default: base.yaml's byte_bpe)"),
        ("--interval", float, 0.25, "seconds between samples of the tree's RSS"),
        ("--keep", bool, False, "keep the corpus, cache and run (default: deleted)"))  # fmt: skip
    for name, summary in (("ours", "`prepare` on a fresh cache"), ("nanogpt", "nanoGPT's openwebtext recipe"),
                          ("train_rss", "the tiny preset trained from the prepared shards: RSS")):  # fmt: skip
        add(name, summary, corpus, tokenizer,
            ("--out", Path | None, None, "cache (ours, train_rss) or output folder"),
            ("--threads", PositiveInt, 2, "tokenizer threads (ours) / map processes (nanogpt)"),
            ("--steps", PositiveInt, 1000, "training steps (train_rss)"))  # fmt: skip
    args = parse(parser, argv)
    name, options = chosen(args)
    runs_file(args.json)
    # train_rss and pairs_loader_rss report the RSS at step (batch) 100 beside the last
    counted = {"train_rss": "steps", "pairs_loader_rss": "batches"}.get(name)
    if counted and getattr(options, counted) < 100:
        given = getattr(options, counted)
        raise ConfigError(f"--{counted} {given}: {name} compares the RSS at 100 with the last; give 100 or more")
    STAMP.update(machine=machine())
    if name == "corpus":
        make_corpus(options.size_mb, options.out)
    elif name == "tokenizer":
        make_tokenizer(options.out)
    elif name == "pairs_corpus":
        make_pair_corpus(options.size_mb, options.out)
    elif name == "pairs_tokenizer":
        make_pair_tokenizer(options.out)
    elif name == "pairs":
        run_pairs(options.corpus, options.tokenizer, options.out, args.json)
    elif name == "pairs_loader_rss":
        run_pairs_loader_rss(options.corpus, options.tokenizer, options.out, options.batches, args.json)
    elif name == "cli_rss":
        run_cli_rss(options.size_mb, options.out, options.steps, options.tokenizer, options.interval, options.keep,
                    args.json)  # fmt: skip
    elif name == "ours":
        run_ours(options.corpus, options.tokenizer, options.out, options.threads, args.json)
    elif name == "nanogpt":
        run_nanogpt(options.corpus, options.tokenizer, options.out, options.threads, args.json)
    else:
        run_train_rss(options.corpus, options.tokenizer, options.out or Path(tempfile.mkdtemp()), options.steps,
                      args.json)  # fmt: skip
