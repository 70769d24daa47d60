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

`--json FILE` (before the subcommand) appends each result of ours, nanogpt and pairs, with its command and machine,
as one line of FILE.

`corpus` writes JSON lines {"text": ...} of documents of a few KB (1-6 KB windows of whole lines from the 42
Shakespeare works, drawn with a fixed seed) up to the size asked. `tokenizer` trains one byte-level BPE of 8,192
tokens on the Shakespeare training split: both preparations use that same file. `ours` runs
`python -m lit_transformer prepare` on a fresh cache; `nanogpt` runs nanoGPT's data/openwebtext/prepare.py recipe
(load_dataset, train_test_split(test_size=0.0005, seed=2357), datasets.map with num_proc=2 that encodes each document
and appends the end-of-text id, then each split concatenated into a uint16 np.memmap in 1,024 batches), with the
same tokenizer in place of tiktoken. Each runs in a subprocess; wall time, CPU time (user + system, all processes), MB/s of JSONL and the
peak resident memory are reported: the largest single process (getrusage) and the sum over the process tree (sampled every 0.1 s; forked
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
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from lit_transformer.bench import command_parser
from lit_transformer.records import command_line, machine, tree_rss_kb

REPO = Path(__file__).resolve().parents[2]
COMMAND = [""]  # this run's command line, as a user types it (set by main)


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
    from lit_transformer.data.corpora import shakespeare as corpora
    from lit_transformer.data.text import train_tokenizer

    tokenizer = train_tokenizer(corpora.shakespeare()["train"]["text"], "byte_bpe", vocab_size)
    out.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out))
    print(f"{out}: byte-level BPE, {tokenizer.get_vocab_size()} tokens")


def make_pair_corpus(size_mb: float, out: Path, seed: int = 0, held_out: int = 1000) -> None:
    """A folder of JSON lines {"en", "es"}: valid.jsonl and test.jsonl of `held_out` pairs and train.jsonl of about
    `size_mb`; each pair is 1-3 consecutive verses of the embedded KJV-RV1909 training split, drawn with a fixed seed."""
    from lit_transformer.data.cache import resolve_cache_dir
    from lit_transformer.data.corpora import shakespeare as corpora

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
    from lit_transformer.data.cache import resolve_cache_dir
    from lit_transformer.data.corpora import shakespeare as corpora
    from lit_transformer.data.text import train_tokenizer

    train = corpora.kjv_rv1909(resolve_cache_dir())["train"]
    tokenizer = train_tokenizer(list(train["en"]) + list(train["es"]), "bpe", vocab_size)
    out.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out))
    print(f"{out}: BPE, {tokenizer.get_vocab_size()} tokens")


# ---------------------------------------------------------------------------------------------------- measuring


def measure(command: list[str], env: dict | None = None) -> dict:
    """Run `command`; its wall time, the largest process's peak RSS and the sampled peak of the tree's sum."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    before, cpu_before = usage.ru_maxrss, usage.ru_utime + usage.ru_stime
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=REPO, env={**os.environ, **(env or {})})
    peak_tree = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak_tree
        while not stop.is_set():
            peak_tree = max(peak_tree, sum(tree_rss_kb(process.pid).values()))
            stop.wait(0.1)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    code = process.wait()
    stop.set()
    thread.join()
    wall = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak_process = usage.ru_maxrss
    if code != 0:
        raise SystemExit(f"{command} failed with exit code {code}")
    return {
        "wall_s": round(wall, 1),
        "cpu_s": round(usage.ru_utime + usage.ru_stime - cpu_before, 1),  # all processes, user + system
        "peak_rss_process_gb": round(peak_process / 1e6, 3) if peak_process > before else None,
        "peak_rss_tree_gb": round(peak_tree / 1e6, 3),
    }


def _report(name: str, corpus: Path, result: dict, log: Path | None) -> None:
    """Print the run's result; with --json, append it (its command and machine beside it) as one JSON line."""
    size = corpus.stat().st_size / 1e6
    result = {"run": name, "corpus_mb": round(size, 1), **result, "mb_per_s": round(size / result["wall_s"], 2)}
    print(json.dumps(result), flush=True)
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as handle:
            handle.write(json.dumps({**result, "command": COMMAND[0], "machine": machine()}) + "\n")


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
    env = {"PYTHONPATH": str(REPO), "RAYON_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "true"}
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
    _report("nanogpt", corpus, measure(command, {"PYTHONPATH": str(REPO), "HF_DATASETS_OFFLINE": "1"}), log)


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
    _report("pairs", train, measure(command, {"PYTHONPATH": str(REPO), "HF_DATASETS_OFFLINE": "1"}), log)


def run_pairs_loader_rss(corpus: Path, tokenizer: Path, cache_dir: Path, batches: int) -> None:
    """Training batches read from prepared pair shards: setup time (the plan from the index) and the resident memory
    after 100 batches and after `batches` (the loader alone: no model)."""
    import torch

    from lit_transformer.data import TranslationDataModule

    torch.set_num_threads(1)

    from lit_transformer.engine.monitoring import process_rss_mb as rss_mb

    before = rss_mb()
    started = time.perf_counter()
    dm = TranslationDataModule(str(corpus), tokenizer=str(tokenizer), max_length=256, max_tokens=4096,
                               cache_dir=str(cache_dir))  # fmt: skip
    dm.setup()
    loader = dm.train_dataloader()
    setup = time.perf_counter() - started
    rss, started = {"setup": rss_mb()}, time.perf_counter()
    for step, _ in enumerate(itertools.islice(itertools.chain.from_iterable(itertools.repeat(loader)), batches), 1):
        if step in (100, 1000, batches):
            rss[str(step)] = rss_mb()
    took = time.perf_counter() - started
    print(json.dumps({"run": "pairs_loader_rss", "train_pairs": len(dm._datasets["train"]),
                      "batches_per_epoch": len(loader), "setup_s": round(setup, 2), "rss_before_mb": round(before, 1),
                      "rss_mb": {k: round(v, 1) for k, v in rss.items()}, "ms_per_batch": round(1e3 * took / batches, 2),
                      "growth_100_to_last": f"{(rss[str(batches)] - rss['100']) / rss['100']:+.2%}"}))  # fmt: skip


# ---------------------------------------------------------------------------------------------------- training memory


def run_train_rss(corpus: Path, tokenizer: Path, cache_dir: Path, steps: int) -> None:
    """A tiny model trained from the prepared shards: resident memory after 100 steps and after `steps`."""
    import lightning as L
    import torch

    from lit_transformer import TransformerConfig
    from lit_transformer.data import LanguageModelingDataModule
    from lit_transformer.engine.lightning_module import LitTransformer

    torch.set_num_threads(1)
    data = LanguageModelingDataModule(
        dataset=str(corpus), tokenizer=str(tokenizer), block_size=64, batch_size=8, cache_dir=str(cache_dir)
    )
    config = TransformerConfig.preset(
        "tiny", vocab_size=data.vocab_size, pad_token_id=data.pad_token_id, eos_token_id=data.eos_token_id
    )
    rss: dict[int, float] = {}

    class Probe(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
            step = trainer.global_step
            if step in (100, 500, steps):
                with open("/proc/self/status") as handle:
                    kb = next(int(line.split()[1]) for line in handle if line.startswith("VmRSS:"))
                rss[step] = kb / 1e3

    trainer = L.Trainer(
        max_steps=steps,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[Probe()],
    )
    started = time.perf_counter()
    trainer.fit(LitTransformer(config, warmup_steps=10), data)
    blocks = len(data._blocks["train"])
    growth = (rss[steps] - rss[100]) / rss[100]
    print(
        json.dumps(
            {
                "run": "train_rss",
                "train_blocks": blocks,
                "rss_mb": {str(k): round(v, 1) for k, v in sorted(rss.items())},
                "growth_100_to_last": f"{growth:+.2%}",
                "wall_s": round(time.perf_counter() - started, 1),
            }
        )
    )


# ---------------------------------------------------------------------------------------------------- the user's path


def run_cli_rss(size_mb: float, out: Path, steps: int, tokenizer: Path | None, interval: float, keep: bool) -> None:
    """`python -m lit_transformer fit --config configs/base.yaml` on a generated JSONL of `size_mb`, in a fresh cache:
    the command line prepares the corpus (streaming, token shards) and then trains `steps` steps from the shards.
    The resident memory of the whole process tree (the CLI and the preparation's worker processes) is sampled every
    `interval` seconds; HostMemoryMonitor writes the trainer's own RSS every 100 steps with the time, and its "setup"
    record (data prepared, model built) splits the run into preparation and training."""
    import shutil

    if steps < 100 or steps % 100:
        raise SystemExit(f"--steps must be a multiple of 100 (the monitor records every 100 steps), not {steps}")
    out.mkdir(parents=True, exist_ok=True)
    corpus = out / f"corpus-{size_mb:g}.jsonl"
    if not corpus.exists():
        make_corpus(size_mb, corpus)
    records = out / "rss.jsonl"
    records.unlink(missing_ok=True)
    monitor = {"class_path": "lit_transformer.engine.monitoring.HostMemoryMonitor",
               "init_args": {"every_n_steps": 100, "path": str(records)}}  # fmt: skip
    command = [sys.executable, "-m", "lit_transformer", "fit", "--config", "configs/base.yaml",
               "--data.init_args.dataset", str(corpus), "--data.init_args.cache_dir", str(out / "cache"),
               *(["--data.init_args.tokenizer", str(tokenizer)] if tokenizer else []),
               "--trainer.max_steps", str(steps), "--trainer.val_check_interval", str(steps),
               "--trainer.limit_val_batches", "4", "--trainer.default_root_dir", str(out / "run"),
               "--trainer.logger.init_args.save_dir", str(out / "run"), "--trainer.enable_progress_bar", "false",
               "--checkpoint.dirpath", str(out / "run" / "checkpoints"), "--checkpoint.every_n_train_steps", str(steps),
               f"--trainer.callbacks+={json.dumps(monitor)}"]  # fmt: skip
    print("$ " + " ".join(command), flush=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_DATASETS_OFFLINE": "1"}
    samples: list[tuple[float, int]] = []  # (time, KB of the tree)
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    load = [os.getloadavg()[0]]  # the machine is shared: the 1-minute load average at the start, setup and end
    started = time.time()
    process = subprocess.Popen(command, cwd=REPO, env=env)
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append((time.time(), sum(tree_rss_kb(process.pid).values())))
            stop.wait(interval)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    code = process.wait()
    stop.set()
    thread.join()
    ended = time.time()
    load.append(os.getloadavg()[0])
    largest = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KB: the largest process of the tree, whole run
    if code != 0:
        raise SystemExit(f"fit failed with exit code {code}")
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    setup = next(row for row in rows if row["stage"] == "setup")
    train = {row["step"]: row for row in rows if row["stage"] == "train"}
    prep = [kb for t, kb in samples if t <= setup["time"]]
    after = [kb for t, kb in samples if t > setup["time"]]
    rss = {str(step): row["rss_mb"] for step, row in sorted(train.items())}
    first, last = train[100]["rss_mb"], train[steps]["rss_mb"]
    shards = sum(f.stat().st_size for f in (out / "cache").rglob("*") if f.is_file())
    result = {"run": "cli_rss", "corpus_mb": round(corpus.stat().st_size / 1e6, 1), "samples": len(samples),
              "prepare_s": round(setup["time"] - started, 1), "train_s": round(ended - setup["time"], 1),
              "peak_rss_prepare_tree_gb": round(max(prep) / 1e6, 3),
              "peak_rss_prepare_main_gb": round(setup["peak_rss_mb"] / 1e3, 3),
              "peak_rss_largest_process_gb": round(largest / 1e6, 3) if largest > before else None,
              "peak_rss_train_tree_gb": round(max(after) / 1e6, 3) if after else None,
              "rss_setup_mb": setup["rss_mb"], "rss_mb_by_step": rss,
              "children_rss_mb_last": train[steps]["children_rss_mb"],
              "growth_100_to_last": f"{(last - first) / first:+.2%}", "cache_mb": round(shards / 1e6, 1),
              "load_average_start_end": [round(x, 1) for x in load]}  # fmt: skip
    print(json.dumps(result), flush=True)
    (out / "result.json").write_text(json.dumps(result) + "\n")
    if not keep:
        corpus.unlink()
        shutil.rmtree(out / "cache", ignore_errors=True)
        shutil.rmtree(out / "run", ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_nanogpt"]:
        corpus, tokenizer, out, num_proc = argv[1:5]
        nanogpt_recipe(corpus, tokenizer, out, int(num_proc))
        return
    COMMAND[0] = command_line("prepare", argv)
    parser = command_parser("bench prepare", __doc__)
    parser.add_argument("--json", type=Path, default=None, help="append each result (with its machine) to this JSONL")
    sub = parser.add_subparsers(dest="command", required=True)
    corpus = sub.add_parser("corpus", help="write a JSONL corpus of documents of a few KB")
    corpus.add_argument("--size_mb", type=float, required=True)
    corpus.add_argument("--out", type=Path, required=True)
    tok = sub.add_parser("tokenizer", help="the fixed byte-level BPE both recipes use")
    tok.add_argument("--out", type=Path, required=True)
    pairs_corpus = sub.add_parser("pairs_corpus", help="write a folder of JSON-lines pairs (train/valid/test)")
    pairs_corpus.add_argument("--size_mb", type=float, required=True)
    pairs_corpus.add_argument("--out", type=Path, required=True)
    pairs_tok = sub.add_parser("pairs_tokenizer", help="the fixed BPE both translation storages use")
    pairs_tok.add_argument("--out", type=Path, required=True)
    pairs = sub.add_parser("pairs", help="prepare a folder of pairs into token shards")
    pairs.add_argument("--corpus", type=Path, required=True)
    pairs.add_argument("--tokenizer", type=Path, required=True)
    pairs.add_argument("--out", type=Path, default=None, help="cache folder (default: a fresh temporary one)")
    loader_rss = sub.add_parser("pairs_loader_rss", help="read training batches from prepared pair shards")
    loader_rss.add_argument("--corpus", type=Path, required=True)
    loader_rss.add_argument("--tokenizer", type=Path, required=True)
    loader_rss.add_argument("--out", type=Path, required=True, help="the cache `pairs --storage shards` prepared")
    loader_rss.add_argument("--batches", type=int, default=5000)
    cli = sub.add_parser("cli_rss", help="`fit --config configs/base.yaml` on a generated JSONL: RSS of both phases")
    cli.add_argument("--size_mb", type=float, default=1000)
    cli.add_argument("--out", type=Path, required=True, help="a scratch folder: corpus, cache and run go there")
    cli.add_argument("--steps", type=int, default=1000)
    cli.add_argument("--tokenizer", type=Path, default=None, help="a tokenizer.json (default: base.yaml's byte_bpe)")
    cli.add_argument("--interval", type=float, default=0.25, help="seconds between samples of the tree's RSS")
    cli.add_argument("--keep", action="store_true", help="keep the corpus, cache and run (default: deleted)")
    for name in ("ours", "nanogpt", "train_rss"):
        run = sub.add_parser(name)
        run.add_argument("--corpus", type=Path, required=True)
        run.add_argument("--tokenizer", type=Path, required=True)
        run.add_argument("--out", type=Path, default=None, help="cache (ours, train_rss) or output folder")
        run.add_argument("--threads", type=int, default=2, help="tokenizer threads (ours) / map processes (nanogpt)")
        run.add_argument("--steps", type=int, default=1000)
    args = parser.parse_args(argv)
    if args.command == "corpus":
        make_corpus(args.size_mb, args.out)
    elif args.command == "tokenizer":
        make_tokenizer(args.out)
    elif args.command == "pairs_corpus":
        make_pair_corpus(args.size_mb, args.out)
    elif args.command == "pairs_tokenizer":
        make_pair_tokenizer(args.out)
    elif args.command == "pairs":
        run_pairs(args.corpus, args.tokenizer, args.out, args.json)
    elif args.command == "pairs_loader_rss":
        run_pairs_loader_rss(args.corpus, args.tokenizer, args.out, args.batches)
    elif args.command == "cli_rss":
        run_cli_rss(args.size_mb, args.out, args.steps, args.tokenizer, args.interval, args.keep)
    elif args.command == "ours":
        run_ours(args.corpus, args.tokenizer, args.out, args.threads, args.json)
    elif args.command == "nanogpt":
        run_nanogpt(args.corpus, args.tokenizer, args.out, args.threads, args.json)
    else:
        run_train_rss(args.corpus, args.tokenizer, args.out or Path(tempfile.mkdtemp()), args.steps)
