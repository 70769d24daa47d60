"""Side-by-side with nanoGPT's README CPU recipe, on our own Shakespeare splits, scored as bits per character.

Both models are scored the same way: the summed next-token NLL over the WHOLE validation split (non-overlapping
blocks of the model's context, the short tail included), in bits, divided by the number of characters predicted.

    # nanoGPT (a checkout outside this repo): write our splits as its char-level data, train its CPU recipe, score
    python -m lit_transformer bench nanogpt nanogpt /work/nanogpt --threads 2 --max_iters 7000
    # ours: time `fit --config configs/base.yaml` on 2 threads, then score its last checkpoint
    python -m lit_transformer bench nanogpt ours --config configs/base.yaml --threads 2
    # score an existing checkpoint of either kind
    python -m lit_transformer bench nanogpt score --checkpoint runs/shakespeare/checkpoints/last.ckpt
    python -m lit_transformer bench nanogpt score-nanogpt /work/nanogpt
    # the GPU side: nanoGPT's own bench.py (GPT-2 small, random data), one JSON row with tokens/s, MFU, peak memory
    python -m lit_transformer bench nanogpt bench /work/nanogpt --batch_size 8

The nanoGPT data is `"".join` of the package's split documents (each work's training part, then the next work's),
so both projects read exactly the same text; the vocabulary is the training split's characters (validation has none
that training lacks).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jsonargparse.typing import PositiveInt

from lit_transformer.bench.checks import runs_file
from lit_transformer.cli.arguments import chosen, command_parser, parse, split_passed_on, subcommand_parser
from lit_transformer.errors import UserError
from lit_transformer.records import child_env, command_line, machine, write_run

if TYPE_CHECKING:
    import numpy as np
    import torch

STARTED: dict = {}  # the machine as this run started (set by main)
NANOGPT_DATASET = "lit_shakespeare_char"
NANOGPT_OUT = "out-lit-shakespeare-char"
# nanoGPT README's CPU example (config/train_shakespeare_char.py plus these flags); --max_iters is added per run.
NANOGPT_CPU_RECIPE = [
    "config/train_shakespeare_char.py",
    "--device=cpu",
    "--compile=False",
    "--eval_iters=20",
    "--log_interval=100",
    "--block_size=64",
    "--batch_size=12",
    "--n_layer=4",
    "--n_head=4",
    "--n_embd=128",
    "--dropout=0.0",
]


def split_texts() -> dict[str, list[str]]:
    """The package's Shakespeare documents per split (train / validation / test)."""
    from lit_transformer.data import LanguageModelingDataModule

    return LanguageModelingDataModule(dataset="shakespeare").texts()


def thread_env(threads: int) -> dict[str, str]:
    """The environment of a child process limited to `threads` intra-op threads."""
    return child_env(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))


def timed(command: list[str], cwd: Path | None, env: dict[str, str], log: Path) -> float:
    """Run `command` with its output teed into `log`; the wall seconds, or exit on failure."""
    print("$", " ".join(command), flush=True)
    start = time.perf_counter()
    with open(log, "w") as handle:
        process = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert process.stdout is not None
        for line in process.stdout:
            handle.write(line)
            if len(line) < 300:  # not a progress bar's carriage-return stream
                sys.stdout.write(line)
        code = process.wait()
    seconds = time.perf_counter() - start
    if code != 0:
        sys.exit(f"{command[0]} exited with {code}; see {log}")
    return seconds


# ------------------------------------------------------------------ scoring


def block_nll(logits_fn: Callable[[torch.Tensor], torch.Tensor], block: torch.Tensor) -> float:
    """Summed NLL (nats) of predicting block[:, 1:] from block[:, :-1]."""
    import torch.nn.functional as F

    logits = logits_fn(block[:, :-1]).float()
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), block[:, 1:].reshape(-1), reduction="sum").item()


def stream_nll(
    logits_fn: Callable[[torch.Tensor], torch.Tensor], stream: np.ndarray, context: int, batch: int
) -> float:
    """Summed next-token NLL (nats) of `stream` in non-overlapping blocks of `context`, then the short tail."""
    import numpy as np
    import torch

    tokens = torch.from_numpy(np.asarray(stream, dtype=np.int64))
    full = (len(tokens) - 1) // context
    total = 0.0
    with torch.no_grad():
        for first in range(0, full, batch):
            starts = range(first * context, min(first + batch, full) * context, context)
            total += block_nll(logits_fn, torch.stack([tokens[s : s + context + 1] for s in starts]))
        tail = tokens[full * context :]
        if len(tail) > 1:
            total += block_nll(logits_fn, tail[None])
    return total


def bits_per_char(nll_nats: float, characters: int) -> float:
    return nll_nats / math.log(2) / characters


def encode_stream(tokenizer, texts: list[str], eos_id: int | None) -> np.ndarray:
    """All documents as one token stream (as the DataModule's shards hold them), each followed by eos (when the vocabulary has one)."""
    import numpy as np

    from lit_transformer.data.text import line_pieces, token_ids

    pieces, owner = [], []
    for doc, text in enumerate(texts):
        for piece in line_pieces(text):
            pieces.append(piece)
            owner.append(doc)
    encoded = token_ids(tokenizer, pieces)
    dtype = np.uint16 if tokenizer.get_vocab_size() <= np.iinfo(np.uint16).max else np.int32
    parts: list[np.ndarray] = []
    for i, ids in enumerate(encoded):
        parts.append(np.asarray(ids, dtype=dtype))
        last_of_doc = i + 1 == len(encoded) or owner[i + 1] != owner[i]
        if last_of_doc and eos_id is not None:
            parts.append(np.asarray([eos_id], dtype=dtype))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def score_checkpoint(path: str, batch: int = 32) -> dict[str, float]:
    """bpc of a lit_transformer checkpoint over the whole validation split, tokenized as the DataModule does."""
    from lit_transformer.inference import load_model

    loaded = load_model(path)
    texts = split_texts()["validation"]
    stream = encode_stream(loaded.tokenizer, texts, loaded.config.eos_token_id)
    characters = sum(map(len, texts))
    nll = stream_nll(loaded.model, stream, loaded.config.max_seq_len, batch)
    predicted = len(stream) - 1
    return {
        "bpc": bits_per_char(nll, characters),
        "val_nll_per_token": nll / predicted,
        "chars_per_token": characters / predicted,
        "val_characters": characters,
        "val_tokens_scored": predicted,
    }


def score_nanogpt(nanogpt: Path, batch: int = 64) -> dict[str, float]:
    """bpc of nanoGPT's checkpoint over the whole val.bin (its `model(x)` returns the last position only, so the
    full-sequence logits come from passing dummy targets)."""
    import numpy as np
    import torch

    model_py = nanogpt_model(nanogpt)
    GPT, GPTConfig = model_py.GPT, model_py.GPTConfig  # noqa: N806 (nanoGPT's names)

    checkpoint = torch.load(nanogpt / NANOGPT_OUT / "ckpt.pt", map_location="cpu", weights_only=False)
    model = GPT(GPTConfig(**checkpoint["model_args"]))
    state = {k.removeprefix("_orig_mod."): v for k, v in checkpoint["model"].items()}
    model.load_state_dict(state)
    model.eval()
    stream = np.fromfile(nanogpt / "data" / NANOGPT_DATASET / "val.bin", dtype=np.uint16)

    def logits_fn(x: torch.Tensor) -> torch.Tensor:
        return model(x, torch.zeros_like(x))[0]

    nll = stream_nll(logits_fn, stream, checkpoint["model_args"]["block_size"], batch)
    return {
        "bpc": bits_per_char(nll, len(stream) - 1),
        "iter_num": checkpoint["iter_num"],
        "val_characters": len(stream) - 1,
    }


# ------------------------------------------------------------------ nanoGPT


def nanogpt_model(nanogpt: Path):
    """nanoGPT's model.py, loaded as the module `model` (its bench.py imports it by that name)."""
    path = (nanogpt / "model.py").resolve()
    module = sys.modules.get("model")
    if module is None or Path(getattr(module, "__file__", "")).resolve() != path:
        spec = importlib.util.spec_from_file_location("model", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["model"] = module
        spec.loader.exec_module(module)
    return module


def write_nanogpt_data(nanogpt: Path) -> Path:
    """Our train/validation splits as nanoGPT char-level data: train.bin, val.bin (uint16) and meta.pkl."""
    import numpy as np

    texts = split_texts()
    train, val = "".join(texts["train"]), "".join(texts["validation"])
    chars = sorted(set(train))
    missing = set(val) - set(chars)
    if missing:
        raise ValueError(f"validation characters missing from training: {sorted(missing)}")
    stoi = {c: i for i, c in enumerate(chars)}
    itos = dict(enumerate(chars))
    folder = nanogpt / "data" / NANOGPT_DATASET
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in (("train", train), ("val", val)):
        np.array([stoi[c] for c in text], dtype=np.uint16).tofile(folder / f"{name}.bin")
    with open(folder / "meta.pkl", "wb") as handle:
        pickle.dump({"vocab_size": len(chars), "itos": itos, "stoi": stoi}, handle)
    print(f"{folder}: train {len(train):,} chars, val {len(val):,} chars, vocab {len(chars)}")
    return folder


def run_nanogpt(args: Any, log: Path, argv: list[str]) -> None:
    nanogpt = Path(args.nanogpt).resolve()
    write_nanogpt_data(nanogpt)
    command = [
        sys.executable,
        "train.py",
        *NANOGPT_CPU_RECIPE,
        f"--dataset={NANOGPT_DATASET}",
        f"--out_dir={NANOGPT_OUT}",
        f"--max_iters={args.max_iters}",
        f"--lr_decay_iters={args.max_iters}",
    ]
    seconds = timed(command, nanogpt, thread_env(args.threads), nanogpt / f"{NANOGPT_OUT}.log")
    report(
        {"run": "nanoGPT", "max_iters": args.max_iters, "threads": args.threads, "wall_s": seconds}
        | score_nanogpt(nanogpt),
        log,
        argv,
    )


# ------------------------------------------------------------------ ours


def run_ours(args: Any, overrides: list[str], log: Path, argv: list[str]) -> None:
    command = [sys.executable, "-m", "lit_transformer", "fit", "--config", args.config, *overrides]
    env = thread_env(args.threads)
    Path(args.root).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="lit-transformer-cache-") as fresh:
        if args.fresh_cache:  # tokenizer training and tokenization counted in the wall time
            env["LIT_TRANSFORMER_CACHE"] = fresh
        started = time.time()
        seconds = timed(command, None, env, Path(args.root) / "fit.log")
    checkpoint = fit_checkpoint(Path(args.root) / "fit.log", args.checkpoint, started)
    result = {"run": "ours", "config": args.config, "overrides": " ".join(overrides), "threads": args.threads}
    report(result | {"wall_s": seconds, "fresh_cache": args.fresh_cache} | score_checkpoint(checkpoint), log, argv)


FINAL_CHECKPOINT = re.compile(r"^checkpoints: final (.+?), best", re.M)


def fit_checkpoint(log: Path, asked: str | None, started: float) -> str:
    """The checkpoint to score: the final one the timed fit names in its last line. In a folder that holds an earlier
    run, a new fit writes last-v1.ckpt and last.ckpt stays the earlier run's, whose score would then be reported beside
    this fit's time. `asked` (--checkpoint), where given, must be a file this fit wrote."""
    found = FINAL_CHECKPOINT.findall(log.read_text(errors="replace"))
    final = found[-1] if found else None
    if asked is None:
        if final is None:
            raise UserError(f"the fit named no final checkpoint (see {log}): give the one to score with --checkpoint")
        return final
    if not os.path.isfile(asked) or os.path.getmtime(asked) < started:
        raise UserError(
            f"--checkpoint {asked} was not written by the fit just timed (an earlier run's, or none): the fit wrote "
            f"{final or 'no final checkpoint'}; leave --checkpoint out to score the fit's own"
        )
    return asked


def report(result: dict, log: Path, argv: list[str]) -> None:
    """Print the result and add it (with the command, the date and the machine as the run started) to the runs of
    `log`, one JSON line each."""
    print(json.dumps(result, indent=1))
    facts = {**STARTED, "threads": result.get("threads")}
    write_run(log, result, command=command_line("bench nanogpt", argv), machine=facts)


# ------------------------------------------------------------------ nanoGPT's bench.py (GPU)

SPEC_BF16 = 989e12  # the H100/H200 dense bf16 spec FLOP/s that our MFU figures use
NANOGPT_MFU_PEAK = 312e12  # bench.py's estimate_mfu divides by the A100's bf16 peak


def run_bench(nanogpt: Path, batch_size: int, dry_run: bool = False, block_size: int = 1024) -> dict:
    """nanoGPT's bench.py in this process (`--real_data=False --bias=True --compile=True`, GPT-2 small, bf16 on a
    GPU): its printed time per iteration and MFU as a row, with our spec's MFU and the peak memory beside them.

    dry_run runs the same code on a CPU with a 1-layer model, no compile and no CUDA synchronisation: the plumbing
    only (a figure from it means nothing)."""
    import contextlib
    import io
    import re
    import runpy

    import torch

    argv = [f"--batch_size={batch_size}", "--real_data=False", "--bias=True", f"--block_size={block_size}"]
    if dry_run:
        argv += ["--device=cpu", "--compile=False", "--dtype=float32"]
        model_py = nanogpt_model(nanogpt)
        full = model_py.GPTConfig
        model_py.GPTConfig = lambda **kw: full(**{**kw, "n_layer": 1, "n_head": 2, "n_embd": 64})
        torch.cuda.synchronize = lambda *args, **kwargs: None
    else:
        argv += ["--compile=True"]
        nanogpt_model(nanogpt)
        torch.cuda.reset_peak_memory_stats()
    out = io.StringIO()
    cwd, saved_argv = os.getcwd(), sys.argv
    try:
        os.chdir(nanogpt)  # bench.py reads configurator.py from its folder
        sys.argv = ["bench.py", *argv]
        with contextlib.redirect_stdout(out):
            runpy.run_path("bench.py", run_name="__main__")
    finally:
        os.chdir(cwd)
        sys.argv = saved_argv
    found = re.search(r"time per iteration: ([0-9.]+)ms, MFU: ([0-9.]+)%", out.getvalue())
    if found is None:
        raise SystemExit(f"bench.py printed no timing line:\n{out.getvalue()[-2000:]}")
    ms, mfu_a100 = float(found.group(1)), float(found.group(2)) / 100
    return {
        "label": f"nanoGPT bench.py, GPT-2 small (bias, vocabulary 50,304), batch {batch_size}",
        "contender": "nanoGPT bench.py",
        "batch_size": batch_size,
        "bench_args": " ".join(argv),
        "ms_per_iter": ms,
        "tokens_per_s": batch_size * block_size / (ms / 1e3),
        "mfu_printed_vs_a100": mfu_a100,
        "mfu_vs_spec": mfu_a100 * NANOGPT_MFU_PEAK / SPEC_BF16,
        "peak_memory_gb": None if dry_run else torch.cuda.max_memory_allocated() / 2**30,
        "dry_run": dry_run,
    }


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, overrides = split_passed_on(argv)
    parser = command_parser("bench nanogpt", __doc__)
    parser.add_argument(
        "--json", type=Path, default=Path("runs/nanogpt_compare.jsonl"), help="the JSON-lines file runs are added to"
    )
    commands = parser.add_subcommands(dest="command", required=True)

    nano = subcommand_parser("nanogpt", "Write the data, train nanoGPT's CPU recipe, score it.")
    nano.add_argument("nanogpt", type=str, help="a nanoGPT checkout (train.py, model.py, config/)")
    nano.add_argument("--max_iters", type=PositiveInt, default=7000)
    nano.add_argument("--threads", type=PositiveInt, default=2)
    commands.add_subcommand("nanogpt", nano, help="write the data, train nanoGPT's CPU recipe, score it")

    data = subcommand_parser("nanogpt-data", "Only write train.bin, val.bin and meta.pkl into the checkout.")
    data.add_argument("nanogpt", type=str, help="a nanoGPT checkout")
    commands.add_subcommand("nanogpt-data", data, help="only write train.bin/val.bin/meta.pkl into the checkout")

    ours = subcommand_parser("ours", "Time `fit --config CONFIG [-- fit flags]`, then score its checkpoint.")
    ours.add_argument("--config", type=str, default="configs/base.yaml")
    ours.add_argument("--threads", type=PositiveInt, default=2)
    ours.add_argument(
        "--checkpoint",
        type=str | None,
        default=None,
        help="the checkpoint to score, one the fit writes (default: the final checkpoint the fit names)",
    )
    ours.add_argument("--root", type=str, default="runs/shakespeare", help="where fit.log (and a fresh cache) go")
    ours.add_argument("--fresh_cache", action="store_true", help="count tokenizer training and tokenization too")
    commands.add_subcommand("ours", ours, help="time `fit --config CONFIG [-- fit flags]`, then score its checkpoint")

    score = subcommand_parser("score", "Bits per character of a lit_transformer checkpoint on the validation split.")
    score.add_argument("--checkpoint", type=str, default="runs/shakespeare/checkpoints/last.ckpt")
    commands.add_subcommand("score", score, help="bpc of a lit_transformer checkpoint on the whole validation split")

    score_nano = subcommand_parser("score-nanogpt", "Bits per character of nanoGPT's checkpoint on its val.bin.")
    score_nano.add_argument("nanogpt", type=str, help="a nanoGPT checkout")
    commands.add_subcommand("score-nanogpt", score_nano, help="bpc of nanoGPT's checkpoint on the whole val.bin")

    bench = subcommand_parser("bench", "nanoGPT's bench.py on the GPU, one JSON row.")
    bench.add_argument("nanogpt", type=str, help="a nanoGPT checkout")
    bench.add_argument("--batch_size", type=PositiveInt, default=8)
    bench.add_argument("--block_size", type=PositiveInt, default=1024)
    bench.add_argument("--dry-run", action="store_true", help="a 1-layer model on the CPU: the plumbing only")
    commands.add_subcommand("bench", bench, help="nanoGPT's bench.py on the GPU, one JSON row")

    args = parse(parser, own)
    name, sub = chosen(args)
    if overrides and name != "ours":
        raise UserError(f"bench nanogpt {name} passes nothing on: the flags after -- are for `ours` (fit's flags)")
    if name not in ("bench", "nanogpt-data"):  # the others add their run to --json
        runs_file(args.json)
    STARTED.update(machine())
    if name == "bench":
        print(json.dumps(run_bench(Path(sub.nanogpt).resolve(), sub.batch_size, sub.dry_run, sub.block_size)))
    elif name == "nanogpt":
        run_nanogpt(sub, args.json, argv)
    elif name == "nanogpt-data":
        write_nanogpt_data(Path(sub.nanogpt))
    elif name == "ours":
        run_ours(sub, overrides, args.json, argv)
    elif name == "score":
        report({"run": "score", "checkpoint": sub.checkpoint} | score_checkpoint(sub.checkpoint), args.json, argv)
    else:
        report({"run": "score-nanogpt"} | score_nanogpt(Path(sub.nanogpt)), args.json, argv)
