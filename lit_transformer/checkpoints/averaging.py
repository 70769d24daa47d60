"""Checkpoint averaging: the element-wise mean of the weights of several checkpoints of one run.

The paper's base-model BLEU averages the last 5 checkpoints, written every 10 minutes (the big model's, the last 20):
the mean of points along the end of a noisy trajectory sits closer to the basin's centre than any one of them.

    python -m lit_transformer average --checkpoints runs/en-es/checkpoints --last 5 --output avg.ckpt
    python -m lit_transformer average --checkpoints a.ckpt b.ckpt --output avg.ckpt
    python -m lit_transformer average --checkpoints runs/en-es/checkpoints --steps 2000:3000 --output avg.ckpt

The result is an ordinary checkpoint (architecture, tokenizers, label names of the newest input), so `test
--ckpt_path`, `translate`, `generate`, `predict` and `export` read it. It holds weights only: no optimizer state,
so it is for evaluation, not for resuming.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from lit_transformer.checkpoints.files import CheckpointError, atomic_save, config_differences, load_checkpoint
from lit_transformer.errors import ConfigError, MissingFileError, UserError, make_folder

Weights = Literal["saved", "trained"]
"""saved: each checkpoint's state_dict (what test/translate load; with an EMA callback, the EMA weights); trained: the
optimizer's own weights, which an EMA (WeightAveraging) callback moves to current_model_state."""

# What an average does not inherit: it is a new set of weights, not a moment of training to resume.
TRAINING_STATE = ("optimizer_states", "lr_schedulers", "loops", "callbacks", "current_model_state", "averaging_state")


def checkpoint_step(checkpoint: dict[str, Any]) -> int:
    """The optimizer step a checkpoint was written at (Lightning's global_step)."""
    return int(checkpoint.get("global_step", -1))


def parse_steps(spec: str) -> tuple[int, int]:
    """'2000:3000' -> (2000, 3000), both ends included; an end may be left out ('2000:' or ':3000')."""
    match = re.fullmatch(r"\s*(\d*)\s*:\s*(\d*)\s*", spec)
    if not match or not (match[1] or match[2]):
        raise ConfigError(f"--steps {spec!r}: write FIRST:LAST (steps included), e.g. 2000:3000, 2000: or :3000")
    first, last = int(match[1] or 0), int(match[2]) if match[2] else 2**62
    if first > last:
        raise ConfigError(f"--steps {spec!r}: the first step {first} comes after the last {last}")
    return first, last


def select_checkpoints(
    sources: Sequence[str | Path], last: int | None = None, steps: tuple[int, int] | None = None
) -> list[Path]:
    """The checkpoint files to average, oldest first, one per training step.

    sources: .ckpt files and/or folders (every *.ckpt inside). A step found twice in a folder (last.ckpt beside step
    files, a best-*.ckpt: one run's weights) counts once; a file named on its own, and files of one step in other
    folders (runs of other seeds, or another model, which the averaging then refuses), are checkpoints of their own.
    last keeps the newest N steps; steps keeps those within [first, last].
    """
    files: list[tuple[Path, bool]] = []  # (file, found in a folder)
    for source in map(Path, sources):
        if source.is_dir():
            found = sorted(source.glob("*.ckpt"))
            if not found:
                raise MissingFileError(f"--checkpoints {source}: the folder holds no .ckpt files")
            files += [(path, True) for path in found]
        elif source.is_file():
            files.append((source, False))
        else:
            raise MissingFileError(f"--checkpoints {source}: no such file or folder")
    seen: dict[Path, bool] = {}  # a file named on its own inside a folder also given is that folder's file, once
    for path, in_folder in files:
        seen[path.resolve()] = seen.get(path.resolve(), False) or in_folder
    files = [(path, seen.pop(path.resolve())) for path, _ in files if path.resolve() in seen]
    by_step: dict[tuple[int, Path], Path] = {}
    for path, in_folder in files:
        checkpoint = _peek(path)
        if in_folder and "averaged_from" in checkpoint:
            continue  # an earlier average written into the folder is not a step of training
        key = (checkpoint_step(checkpoint), path.resolve().parent if in_folder else path.resolve())
        # Prefer a file named for its step over last.ckpt / best-*.ckpt: the record then says which step it was.
        if key not in by_step or by_step[key].name.startswith(("last", "best")):
            by_step[key] = path
    chosen = sorted(((step, str(folder)), path) for (step, folder), path in by_step.items())
    chosen = [(step, path) for (step, _), path in chosen]
    if steps is not None:
        chosen = [(s, p) for s, p in chosen if steps[0] <= s <= steps[1]]
        if not chosen:
            found = sorted({step for step, _ in by_step})
            raise ConfigError(f"No checkpoint lies within steps {steps[0]}..{steps[1]}; steps found: {found}")
    if last is not None:
        if last < 1:
            raise ConfigError(f"--last {last}: average at least one checkpoint")
        if last > len(chosen):
            raise ConfigError(
                f"--last {last} asks for more checkpoints than there are ({len(chosen)} distinct steps: "
                f"{[s for s, _ in chosen]}); write checkpoints more often (--checkpoint.every_n_train_steps N "
                "--checkpoint.save_top_k -1) or average fewer"
            )
        chosen = chosen[-last:]
    return [p for _, p in chosen]


def _peek(path: Path) -> dict[str, Any]:
    """A checkpoint memory-mapped (only its step is read); a file that will not load gets load_checkpoint's message."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:
        return load_checkpoint(path)


def _weights(checkpoint: dict[str, Any], weights: Weights, path: Path) -> dict[str, torch.Tensor]:
    if weights == "trained" and "current_model_state" in checkpoint:
        return checkpoint["current_model_state"]
    if "state_dict" not in checkpoint:
        raise CheckpointError(f"{path} holds no state_dict: it is not a Lightning checkpoint written by `fit`")
    return checkpoint["state_dict"]


def _check_same_model(reference: dict[str, Any], other: dict[str, Any], ref_path: Path, path: Path) -> None:
    """Refuse to average checkpoints of different architectures or tokenizers, naming what differs."""
    hp_ref, hp_other = reference.get("hyper_parameters") or {}, other.get("hyper_parameters") or {}
    differences = config_differences(hp_ref.get("config"), hp_other.get("config"))
    if differences:
        raise CheckpointError(
            f"{path} and {ref_path} are different architectures; only checkpoints of one model can be averaged. "
            f"Config fields that differ: {'; '.join(differences[:6])}" + (" ..." if len(differences) > 6 else "")
        )
    base, other_base = (reference.get("lora") or {}).get("fingerprint"), (other.get("lora") or {}).get("fingerprint")
    if base != other_base:  # LoRA adapters (whose factors are averaged) mean something on their own base only
        raise CheckpointError(
            f"{path} and {ref_path} are not adapters of one base (LoRA base fingerprints {other_base} and {base}): "
            "average the checkpoints of one run"
        )
    alpha, other_alpha = ((hp.get("lora") or {}).get("alpha") for hp in (hp_ref, hp_other))
    if alpha != other_alpha:  # the same factors scaled otherwise (alpha / rank): the mean would be read with one
        raise CheckpointError(
            f"{path} and {ref_path} are LoRA adapters of different lora.alpha ({other_alpha} and {alpha}): their "
            "updates are scaled differently (alpha / rank); average the checkpoints of one run"
        )
    for key in ("tokenizer", "target_tokenizer"):
        if reference.get(key) != other.get(key):
            raise CheckpointError(
                f"{path} and {ref_path} hold different {key}s: the same ids would mean different tokens. "
                "Average checkpoints of one run (or of runs that share one tokenizer)"
            )


def average_checkpoints(paths: Sequence[str | Path], weights: Weights = "saved") -> dict[str, Any]:
    """A checkpoint whose weights are the element-wise mean of those of `paths` (same architecture, same tokenizers).

    Floating-point tensors are summed in float64 and cast back; other tensors (counters) come from the newest
    checkpoint. Everything else (hyperparameters, tokenizers, label names, step) comes from the newest one, without
    the training state (optimizer, schedule, loops, callbacks).
    """
    paths = [Path(p) for p in paths]
    if not paths:
        raise ConfigError("average needs at least one checkpoint")
    sums: dict[str, torch.Tensor] = {}
    reference: dict[str, Any] | None = None
    newest: tuple[int, dict[str, Any], dict[str, torch.Tensor]] | None = None  # (step, checkpoint, weights)
    steps = []
    for path in paths:
        checkpoint = load_checkpoint(path)
        state = _weights(checkpoint, weights, path)
        step = checkpoint_step(checkpoint)
        if newest is None or step >= newest[0]:
            newest = (step, {k: v for k, v in checkpoint.items() if k not in TRAINING_STATE}, state)
        if reference is None:
            reference, ref_path, ref_state = checkpoint, path, state
            # copies: .double() of a float64 tensor is the tensor itself, and tied weights (one tensor under several
            # names) then summed into one accumulator once per name
            sums = {k: v.to(torch.float64, copy=True) if v.is_floating_point() else v for k, v in state.items()}
        else:
            _check_same_model(reference, checkpoint, ref_path, path)
            if set(state) != set(sums) or any(state[k].shape != sums[k].shape for k in sums):
                names = sorted(set(state) ^ set(sums)) or [k for k in sums if state[k].shape != sums[k].shape]
                raise CheckpointError(
                    f"{path} and {ref_path} hold different tensors ({', '.join(names[:5])}): they are not the same "
                    "architecture and cannot be averaged"
                )
            for k, v in state.items():
                if v.is_floating_point():
                    sums[k] += v.double()
        steps.append(step)
    assert newest is not None
    _, result, newest_state = newest
    # Means of the floating-point tensors; counters and other integers as the newest checkpoint holds them.
    averaged = {
        k: (v / len(paths)).to(ref_state[k].dtype) if v.is_floating_point() else newest_state[k].clone()
        for k, v in sums.items()
    }
    result["state_dict"] = averaged
    result["averaged_from"] = [{"path": str(p), "step": s} for p, s in zip(paths, steps, strict=True)]
    result["averaged_weights"] = weights
    return result


def check_output(output: Path) -> None:
    """Refuse an --output that is a folder, or a checkpoint that resumes a run: the average holds weights only, so
    written over a run's last.ckpt it left a file `fit --ckpt_path last` cannot resume from."""
    if output.is_dir():
        raise ConfigError(f"--output {output} is a folder: give the file to write, e.g. {output / 'averaged.ckpt'}")
    if output.is_file() and "optimizer_states" in _peek_or_nothing(output):
        raise ConfigError(
            f"--output {output} is a checkpoint a run resumes from (it holds the optimizer's state), which the "
            "average (weights only) would replace: write it to another file, e.g. "
            f"{output.with_name('averaged.ckpt')}"
        )


def _peek_or_nothing(path: Path) -> dict[str, Any]:
    try:
        return _peek(path)
    except UserError:  # not a checkpoint: a file of another kind, written over as before
        return {}


def run_average(args) -> None:
    """`average` with its parsed options (model_commands.average_main): write the mean of several checkpoints'
    weights as one checkpoint."""
    steps = parse_steps(args.steps) if args.steps is not None else None
    output = Path(args.output)
    check_output(output)
    make_folder(output.parent, "--output", file=output)  # before the checkpoints are read
    paths = select_checkpoints(args.checkpoints, args.last, steps)
    averaged = average_checkpoints(paths, args.weights)
    atomic_save(averaged, output)
    listed = ", ".join(f"{Path(e['path']).name} (step {e['step']})" for e in averaged["averaged_from"])
    if len(paths) == 1:  # a folder of one step (last.ckpt and its best are one step): nothing was averaged
        print(f"Wrote {output}: its weights are {listed} alone, the one step found: nothing was averaged")
        return
    print(f"Wrote {output}: the mean of {len(paths)} checkpoints: {listed}")
