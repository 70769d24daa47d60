"""LoRA (configs/finetune/lora.yaml) against full fine-tuning on the embedded corpora; writes docs/lora.json.

    python -m lit_transformer bench lora --json docs/lora.json

Three measurements, each run through the package's own CLI objects (the command of each run is recorded beside it):

1. Domain adaptation: a Shakespeare model (the main job's 2017 recipe, configs/presets/shakespeare-2017.yaml, trained
   here for a short fixed budget, --pretrain_steps) fine-tuned on the English Bible (the kjv side of the embedded
   kjv-rv1909 corpus, one verse per line) for --steps steps: Bible validation bits per character with no fine-tuning,
   full fine-tuning and LoRA at ranks 4, 8 and 16 on the attention projections (and rank 8 on the feed-forward layers
   too); for each, trainable parameters, checkpoint size, peak memory (the process's peak RSS) and step time.
2. Classification: the masked-LM encoder (configs/presets/mlm.yaml, --mlm_steps) turned genre classifier
   (classify-genre.yaml, init_from), LoRA against full fine-tuning: test accuracy, macro-F1, trainable parameters.
3. An imported model: the Shakespeare model exported to a Hugging Face GPT-2 folder (`export --format hf`), fine-tuned
   with LoRA through init_from, exported back (adapters merged) and scored in transformers on the Bible validation
   split, against our own score of the same checkpoint.

Each run is a child process of its own (peak memory is per process). The machine may be shared: step times are
noisy, so LoRA and full runs are interleaved and the host's load average is recorded beside each.

The whole measurement is one run of --json (lit_transformer.records.write_run: a rerun is one more run of the same
file). --parts runs some measurements only: the run then takes the others from the file's newest run and names the
command that measured them (`kept`). While it runs, what is done so far is in WORK/progress.json.
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from jsonargparse.typing import PositiveInt

from lit_transformer.bench.checks import runs_file
from lit_transformer.cli.arguments import command_parser, packaged_configs, parse
from lit_transformer.errors import UserError
from lit_transformer.records import (
    child_env,
    command_line,
    machine,
    peak_rss_mb,
    read_runs,
    version,
    write_run,
)

CONFIGS = packaged_configs()
BASE = str(CONFIGS / "presets" / "shakespeare-2017.yaml")  # the recipe the figures were measured with
LORA = str(CONFIGS / "finetune" / "lora.yaml")
MLM = str(CONFIGS / "presets" / "mlm.yaml")
GENRE = str(CONFIGS / "presets" / "classify-genre.yaml")
PARTS = {"domain": "domain_adaptation", "classification": "classification", "imported": "imported"}


# ---- one run, in a child process ------------------------------------------------------------------------------


def _step_timer():
    import lightning as L

    class StepTimer(L.Callback):
        """Wall time of each training batch (forward, backward, optimizer step)."""

        def __init__(self) -> None:
            self.times: list[float] = []
            self._start = 0.0

        def on_train_batch_start(self, *args) -> None:
            self._start = time.perf_counter()

        def on_train_batch_end(self, *args) -> None:
            self.times.append(time.perf_counter() - self._start)

    return StepTimer()


def _number(value) -> float | None:
    import torch

    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    return float(value) if isinstance(value, (int, float)) else None


def child(spec: dict) -> dict:
    """Build the CLI's objects from spec["args"] (the flags of `fit`), fit unless spec["fit"] is false, then
    validate or test; report metrics, parameters, checkpoint size, peak RSS and step times."""
    import torch

    from lit_transformer.cli.lightning_cli import run_cli
    from lit_transformer.transforms.lora import count

    torch.set_num_threads(spec.get("threads", 1))
    cli = run_cli(spec["args"], run=False)
    timer = _step_timer()
    cli.trainer.callbacks.append(timer)
    load = os.getloadavg()
    start = time.perf_counter()
    if spec.get("fit", True):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    fit_seconds = time.perf_counter() - start
    evaluate = cli.trainer.test if spec.get("evaluate") == "test" else cli.trainer.validate
    metrics = evaluate(cli.model, datamodule=cli.datamodule, verbose=False)[0]
    trainable, total = count(cli.model.model)
    out = {
        "metrics": {k: _number(v) for k, v in metrics.items() if _number(v) is not None},
        "trainable_params": trainable,
        "total_params": total,
        "peak_rss_mb": peak_rss_mb(),
        "fit_seconds": round(fit_seconds, 1),
        "load_average_1min_at_start": load[0],
    }
    steps = timer.times[10:] or timer.times
    if steps:
        out["median_step_ms"] = round(1000 * statistics.median(steps), 2)
        out["steps"] = len(timer.times)
    last = Path(spec["checkpoint_dir"]) / "last.ckpt" if spec.get("checkpoint_dir") else None
    if last is not None and last.is_file() and spec.get("fit", True):
        out["checkpoint_bytes"] = last.stat().st_size
    if spec.get("score_hf"):
        out["transformers"] = score_in_transformers(cli, spec["score_hf"], last)
    return out


def score_in_transformers(cli, folder: str, checkpoint: Path) -> dict:
    """The exported (merged) folder loaded by transformers: its bits per character on the validation split the CLI
    scored (same blocks), and its largest logit difference from our adapted model's."""
    import math

    import torch
    import transformers

    from lit_transformer.cli.export_command import export
    from lit_transformer.inference import load_model

    export(load_model(checkpoint), "hf", folder)
    hf = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
    ours = cli.model.model.eval()  # the adapters unmerged, as trained
    nll, tokens, max_diff = 0.0, 0, 0.0
    cli.datamodule.setup("validate")
    with torch.no_grad():
        for batch in cli.datamodule.val_dataloader():
            ids, labels = batch["input_ids"], batch["labels"]
            logits = hf(ids).logits
            max_diff = max(max_diff, (logits - ours(ids)).abs().max().item())
            mask = labels != -100
            nll += torch.nn.functional.cross_entropy(logits[mask], labels[mask], reduction="sum").item()
            tokens += int(mask.sum())
    chars_per_token = cli.datamodule.characters_per_token("validation")  # what the task divides val/nll by
    return {
        "val_bpc": nll / tokens / math.log(2) / chars_per_token,
        "max_abs_logit_difference_vs_adapted": max_diff,
        "tokens": tokens,
    }


# ---- the parent: runs, in order ------------------------------------------------------------------------------


def run(spec: dict, log: Path) -> dict:
    """spec run in a child process (`python -m lit_transformer bench lora _child SPEC`); its JSON result."""
    env = child_env(OMP_NUM_THREADS=str(spec.get("threads", 1)))
    start = time.perf_counter()
    with open(log, "a") as out:
        out.write(f"\n==== {spec['name']}\n")
        out.flush()
        done = subprocess.run(
            [sys.executable, "-m", "lit_transformer.bench", "lora", "_child", json.dumps(spec)], env=env,
            stdout=subprocess.PIPE, stderr=out, text=True,
        )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{spec['name']} failed (exit {done.returncode}); see {log}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["wall_seconds"] = round(time.perf_counter() - start, 1)
    command = ["python", "-m", "lit_transformer", "fit" if spec.get("fit", True) else "validate", *spec["args"]]
    result["command"] = shlex.join(command)
    print(f"{spec['name']}: {json.dumps({k: v for k, v in result.items() if k != 'command'})}", flush=True)
    return result


def write_bible(folder: Path) -> None:
    """The English side of kjv-rv1909, one verse per line, in its own train/validation/test split."""
    from lit_transformer.data.cache import resolve_cache_dir
    from lit_transformer.data.corpora.bible import kjv_rv1909

    data = kjv_rv1909(resolve_cache_dir())
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "validation", "test"):
        (folder / f"{split}.txt").write_text("\n".join(data[split]["en"]) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_child"]:  # one run, in the child process `run` started
        print(json.dumps(child(json.loads(argv[1]))), flush=True)
        return
    parser = command_parser("bench lora", __doc__)
    parser.add_argument(
        "--json", type=Path | None, default=None, help="add the run to this file (default: WORK/lora.json)"
    )
    parser.add_argument("--work", type=Path, default=Path("runs/benchmark_lora"), help="runs, logs and checkpoints")
    parser.add_argument(
        "--pretrain_steps", type=PositiveInt, default=1500, help="Shakespeare pretraining (the preset: 5000)"
    )
    parser.add_argument("--steps", type=PositiveInt, default=300, help="Bible fine-tuning steps of each run")
    parser.add_argument("--mlm_steps", type=PositiveInt, default=600, help="masked-LM pretraining (mlm.yaml: 2000)")
    parser.add_argument("--classify_steps", type=PositiveInt, default=300, help="classifier fine-tuning (genre: 1500)")
    parser.add_argument("--full_lr", type=float, default=1e-3, help="full fine-tuning's peak learning rate")
    parser.add_argument("--lora_lr", type=float, default=2e-3, help="LoRA's peak learning rate (lora.yaml's)")
    parser.add_argument("--threads", type=PositiveInt, default=1, help="torch threads of each run")
    parser.add_argument(
        "--parts", type=str, nargs="+", default=list(PARTS),
        help="which measurements to run (domain, classification, imported); the others are kept from the newest run "
        "of --json (imported reuses the work folder's Shakespeare model and Bible files)",
    )  # fmt: skip
    parser.add_argument("--render", type=Path | None, default=None, help="print the tables of a file's newest run")
    args = parse(parser, argv)
    if args.render is not None:
        print(render(_newest(args.render)))
        return
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown:
        raise UserError(f"--parts {' '.join(unknown)}: the measurements are {', '.join(PARTS)}")

    work = args.work
    json_path = runs_file(args.json or work / "lora.json")
    work.mkdir(parents=True, exist_ok=True)
    log = work / "benchmark.log"
    facts = machine(threads=args.threads, peft=version("peft"))
    results: dict = {
        "note": "a shared 2-core machine: step times and loads are noisy; LoRA and full runs are interleaved",
        "budget": {k: getattr(args, k) for k in ("pretrain_steps", "steps", "mlm_steps", "classify_steps")},
    }
    kept = [part for part in PARTS if part not in args.parts]
    if kept:  # the measurements not run now come from the newest run, which says what measured them
        newest = _newest(json_path)
        missing = [part for part in kept if PARTS[part] not in newest]
        if missing:
            raise UserError(
                f"{json_path} has no {', '.join(missing)} measurement to keep: run with --parts {' '.join(PARTS)}"
            )
        measured = newest.get("kept", {})
        for part in kept:
            results[PARTS[part]] = newest[PARTS[part]]
            results.setdefault("kept", {})[PARTS[part]] = measured.get(PARTS[part]) or _measured_by(newest)
    common = ["--trainer.logger", "false", "--trainer.enable_progress_bar", "false", "--samples.prompts", "[]"]

    def flags(name: str, steps: int, *extra: str) -> tuple[list[str], str]:
        ckpt = str(work / name / "checkpoints")
        where = ["--trainer.default_root_dir", str(work / name), "--checkpoint.dirpath", ckpt]
        where += ["--checkpoint.every_n_train_steps", str(steps), "--trainer.max_steps", str(steps)]
        where += ["--trainer.val_check_interval", str(steps)]
        return [*extra, *common, *where], ckpt

    # 1. Shakespeare, then the Bible.
    fit_args, shakespeare = flags("shakespeare", args.pretrain_steps, "--config", BASE)
    base_ckpt, bible = Path(shakespeare) / "last.ckpt", work / "bible"
    if "domain" in args.parts:
        spec = {"name": "shakespeare", "args": fit_args, "checkpoint_dir": shakespeare, "threads": args.threads}
        results["domain_adaptation"] = {"pretraining": run(spec, log), "runs": {}}
        write_bible(bible)
        domain(args, results, work, base_ckpt, bible, flags, log)
    if "classification" in args.parts:
        classification(args, results, work, flags, log)
    if "imported" in args.parts:
        imported(args, results, work, base_ckpt, bible, flags, log)
    write_run(json_path, results, command=command_line("bench lora", argv), machine=facts)
    print(f"{json_path}: one more run ({', '.join(args.parts)} measured)")


def _newest(path: Path) -> dict:
    """The newest run of a lora JSON (an older file of one run is that run)."""
    runs = read_runs(path)
    if not runs:
        raise UserError(f"{path} holds no run of bench lora", hint="Run bench lora --json FILE first.")
    return runs[-1]


def _measured_by(run: dict) -> dict:
    """Which command measured a run (an older file names its scripts), and when."""
    command = run.get("command") or " && ".join(run.get("scripts", [])) or None
    return {"command": command, "date": run.get("date") or (run.get("machine") or {}).get("date")}


def domain(args, results: dict, work: Path, base_ckpt: Path, bible: Path, flags, log: Path) -> None:
    from lit_transformer.checkpoints.files import load_checkpoint

    tokenizer = work / "shakespeare_tokenizer.json"
    tokenizer.write_text(load_checkpoint(base_ckpt)["tokenizer"])
    data = ["--data.init_args.dataset", str(bible), "--data.init_args.tokenizer", str(tokenizer)]
    init = ["--model.init_from", str(base_ckpt)]
    warmup = ["--model.optim.warmup_steps", str(max(1, args.steps // 10))]
    runs = results["domain_adaptation"]["runs"]
    argv, _ = flags("bible_none", args.steps, "--config", BASE, *init, *data)
    runs["none"] = run({"name": "bible: no fine-tuning", "args": argv, "fit": False, "threads": args.threads}, log)
    # LoRA and full runs interleaved; lora_r8_ffn adapts the feed-forward layers too (every Linear of the blocks).
    order = [("lora_r4", 4), ("full", None), ("lora_r8", 8), ("lora_r16", 16), ("lora_r8_ffn", 8)]
    for name, rank in order:
        if rank is None:
            extra = ["--config", BASE, *init, *data, *warmup, "--model.optim.lr", str(args.full_lr)]
        else:
            extra = ["--config", BASE, "--config", LORA, *init, *data, *warmup, "--model.lora.rank", str(rank)]
            extra += ["--model.optim.lr", str(args.lora_lr)]
            if name.endswith("_ffn"):
                extra += ["--model.lora.target_modules", "[qkv, out, up, down]"]
        argv, ckpt = flags(f"bible_{name}", args.steps, *extra)
        runs[name] = run({"name": f"bible: {name}", "args": argv, "checkpoint_dir": ckpt, "threads": args.threads}, log)
    _progress(work, results)


def classification(args, results: dict, work: Path, flags, log: Path) -> None:
    """2. The genre classifier from the masked LM."""
    argv, mlm = flags("mlm", args.mlm_steps, "--config", MLM, "--trainer.limit_val_batches", "5")
    mlm_run = run({"name": "mlm", "args": argv, "checkpoint_dir": mlm, "threads": args.threads}, log)
    clf = {}
    init = ["--model.init_from", str(Path(mlm) / "last.ckpt")]
    for name in ("lora_r8", "full"):
        extra = ["--config", GENRE, *init, "--trainer.limit_val_batches", "5"]
        if name != "full":
            extra += ["--config", LORA, "--model.lora.rank", "8"]
        argv, ckpt = flags(f"genre_{name}", args.classify_steps, *extra)
        spec = {"name": f"genre: {name}", "args": argv, "checkpoint_dir": ckpt, "evaluate": "test"}
        clf[name] = run({**spec, "threads": args.threads}, log)
    results["classification"] = {"pretraining": mlm_run, "runs": clf}
    _progress(work, results)


def imported(args, results: dict, work: Path, base_ckpt: Path, bible: Path, flags, log: Path) -> None:
    """3. An imported model: our Shakespeare model as a Hugging Face GPT-2 folder, LoRA through init_from, and back."""
    from lit_transformer.cli.export_command import export
    from lit_transformer.inference import load_model

    folder = work / "hf_shakespeare"
    warmup = ["--model.optim.warmup_steps", str(max(1, args.steps // 10))]
    export(load_model(base_ckpt), "hf", folder)
    data = ["--data.init_args.dataset", str(bible), "--data.init_args.tokenizer", str(folder / "tokenizer.json")]
    extra = ["--config", BASE, "--config", LORA, "--model.init_from", str(folder), *data, *warmup]
    extra += ["--model.optim.lr", str(args.lora_lr)]
    argv, ckpt = flags("hf_lora_r8", args.steps, *extra)
    spec = {"name": "imported: lora_r8", "args": argv, "checkpoint_dir": ckpt, "threads": args.threads}
    result = run({**spec, "score_hf": str(work / "hf_bible")}, log)
    result["export_command"] = f"python -m lit_transformer export --checkpoint {ckpt}/last.ckpt --format hf --out DIR"
    results["imported"] = result
    _progress(work, results)


def render(results: dict) -> str:
    """The Markdown tables of docs/finetuning.md, from the JSON (`--render docs/lora.json`)."""
    lines = []
    domain = results.get("domain_adaptation")
    if domain:
        lines += [
            "| Bible run | val bpc | trainable params | checkpoint | peak RSS | median step |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for name, r in domain["runs"].items():
            size = f"{r['checkpoint_bytes'] / 1e6:.2f} MB" if "checkpoint_bytes" in r else "-"
            step = f"{r['median_step_ms']:.0f} ms" if "median_step_ms" in r else "-"
            trainable = f"{r['trainable_params']:,}" if name != "none" else "-"
            lines.append(
                f"| {name} | {r['metrics']['val/bpc']:.3f} | {trainable} | {size} | {r['peak_rss_mb']:.0f} MB | {step} |"
            )
    clf = results.get("classification")
    if clf:
        lines += ["", "| genre classifier | test accuracy | test macro-F1 | trainable params | checkpoint |"]
        lines.append("| --- | --- | --- | --- | --- |")
        for name, r in clf["runs"].items():
            m = r["metrics"]
            lines.append(
                f"| {name} | {m['test/accuracy']:.3f} | {m['test/f1']:.3f} | {r['trainable_params']:,} | "
                f"{r['checkpoint_bytes'] / 1e6:.2f} MB |"
            )
    return "\n".join(lines)


def _progress(work: Path, results: dict) -> None:
    """What is measured so far (not a run: the run is written once, whole, at the end)."""
    (work / "progress.json").write_text(json.dumps(results, indent=2) + "\n")
