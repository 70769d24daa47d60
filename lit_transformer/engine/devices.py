"""Devices and the peers of a distributed run.

``check_device_options`` refuses GPU-only options on a machine without a GPU, naming the option and the fix;
``lost_peer_message`` turns a collective that failed because another rank died or hung into one line (which rank, how
to resume); ``resume_after_restart`` resumes a run under torchrun --max-restarts from its last checkpoint.
"""

from __future__ import annotations

import os
import re
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info

from lit_transformer.checkpoints.run_checkpoint import last_checkpoint
from lit_transformer.engine.lightning_compat import collective_timeout
from lit_transformer.errors import ConfigError


class DeviceOptionError(ConfigError):
    """An option needs hardware this machine lacks."""


_GPU_ONLY_STRATEGIES = ("fsdp", "deepspeed")


_SLOW_ON_CPU_PRECISIONS = ("16-mixed", "bf16-mixed", "16-true", "bf16-true", "16", "bf16", 16)


def check_device_options(accelerator: Any = "auto", strategy: Any = "auto", precision: Any = None) -> None:
    """Fail fast, naming the option and the fix, when a GPU-only option meets a machine without a GPU.

    16-bit precision on CPU is allowed but warned about: it runs, far slower than fp32 (measured ~40x for bf16).
    """
    has_gpu = torch.cuda.is_available()
    accelerator_name = str(accelerator).lower()
    if accelerator_name in ("gpu", "cuda") and not has_gpu:
        raise DeviceOptionError(
            f"trainer.accelerator={accelerator!r} needs a CUDA GPU, and this machine has none "
            "(torch.cuda.is_available() is False). Use --trainer.accelerator=cpu (or auto)."
        )
    if accelerator_name == "tpu" and not _has_module("torch_xla"):
        raise DeviceOptionError(
            f"trainer.accelerator={accelerator!r} needs a TPU with torch_xla installed, and this machine has no "
            "torch_xla. Use --trainer.accelerator=cpu (or auto, or gpu on a CUDA machine)."
        )
    strategy_name = strategy if isinstance(strategy, str) else type(strategy).__name__
    lowered = str(strategy_name).lower()
    if "modelparallel" in lowered:
        raise DeviceOptionError(
            f"trainer.strategy={strategy_name!r} leaves the parallelism to the model's configure_model, and "
            "LitTransformer applies none (no fully_shard, no tensor-parallel plan): each process would train its own "
            "copy on its own batches, no gradients exchanged. Use --trainer.strategy=ddp, or fsdp on GPUs "
            "(configs/trainer/fsdp.yaml)."
        )
    if ("xla" in lowered or "tpu" in lowered) and not _has_module("torch_xla"):
        raise DeviceOptionError(
            f"trainer.strategy={strategy_name!r} needs a TPU with torch_xla installed, and this machine has no "
            "torch_xla. Use --trainer.strategy=ddp (or auto)."
        )
    if str(precision).startswith("transformer-engine") and not _has_module("transformer_engine"):
        raise DeviceOptionError(
            f"trainer.precision={precision!r} needs NVIDIA's Transformer Engine (the transformer_engine package, on "
            "a GPU that runs fp8), and this machine has no transformer_engine. Use --trainer.precision=bf16-mixed "
            "(32-true on CPU)."
        )
    on_cpu = accelerator_name == "cpu" or not has_gpu
    if not on_cpu:
        return
    if any(name in lowered for name in _GPU_ONLY_STRATEGIES):
        raise DeviceOptionError(
            f"trainer.strategy={strategy_name!r} needs a GPU accelerator, and this run is on CPU. "
            "Use --trainer.strategy=ddp (several CPU processes, gloo backend) or auto, or run on a CUDA machine."
        )
    if precision in _SLOW_ON_CPU_PRECISIONS:
        warnings.warn(
            f"trainer.precision={precision!r} on CPU runs but is far slower than fp32 (bf16 matmuls measured ~40x "
            "slower here; 16-mixed falls back to bf16). Use --trainer.precision=32-true on CPU.",
            stacklevel=2,
        )


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


# What gloo, NCCL and the c10d store say when the other end of a collective died (its sockets closed) or hung (no
# answer within the process group's timeout).
_PEER_DIED = re.compile(r"Connection (reset|closed) by peer|Broken pipe|Connection refused|remote process exited", re.I)


_PEER_HUNG = re.compile(
    r"Timed out waiting|timeout caused pair closure|collective operation timeout|Timed out initializing", re.I
)


_PROBE = "lit_transformer/alive"


def lost_peer_message(error: BaseException, trainer: pl.Trainer, probe_s: float = 5.0) -> str | None:
    """One line for a collective that failed because another rank died or hung: which rank, and how to resume;
    None when `error` is anything else (or there is no process group), so that it is raised as it was.

    With two ranks the lost one is the other; with more, the survivors check in through the rendezvous store for
    `probe_s` seconds and those that do not are named."""
    import torch.distributed as dist

    if not isinstance(error, RuntimeError) or not (dist.is_available() and dist.is_initialized()):
        return None
    text = str(error)
    died = bool(_PEER_DIED.search(text))
    if not died and not _PEER_HUNG.search(text):
        return None
    rank, world = dist.get_rank(), dist.get_world_size()
    if world < 2:
        return None
    lost = [1 - rank] if world == 2 else _silent_ranks(rank, world, probe_s)
    per_node = max(1, trainer.num_devices)
    if lost is None:
        who = "the rendezvous host (rank 0, node 0)"
    elif lost:
        who = ", ".join(f"rank {r} (node {r // per_node})" for r in lost)
    else:
        who = "a peer"
    timeout = collective_timeout(trainer.strategy)
    why = (
        "its connection closed (the process or its node died)"
        if died
        else "no answer within the collective timeout"
        + (f" (--collective_timeout {timeout.total_seconds():g} s)" if timeout is not None else "")
        + ": it hung, was stopped or is unreachable"
    )
    last = _last_checkpoint(trainer)
    if last is None:
        resume = "No checkpoint was saved yet: run the same command again on every node"
    elif _torchrun_restarts():
        resume = f"While --max-restarts allows, torchrun restarts the workers and they resume from {last} by themselves"
    else:
        resume = f"To resume from {last}, run the same command again on every node with --ckpt_path last"
    return f"Lost {who} of {world} at step {trainer.global_step}: {why}. {resume}."


def _silent_ranks(rank: int, world: int, probe_s: float) -> list[int] | None:
    """The ranks that do not check in through the default store within `probe_s` seconds; None when the store itself
    is gone (its host, global rank 0's process or torchrun's agent on node 0, went with it)."""
    from torch.distributed import distributed_c10d

    try:
        store = distributed_c10d._get_default_store()
        store.set_timeout(timedelta(seconds=probe_s))
        store.set(f"{_PROBE}/{rank}", "1")
        others = [r for r in range(world) if r != rank]
        deadline = time.monotonic() + probe_s
        while True:
            missing = [r for r in others if not store.check([f"{_PROBE}/{r}"])]
            if not missing or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        store.set(f"{_PROBE}/{rank}/done", "1")
        if rank == 0:  # the store may live in this process: let the others read their answer before it exits
            for r in others:
                if r not in missing:
                    while not store.check([f"{_PROBE}/{r}/done"]) and time.monotonic() < deadline + probe_s:
                        time.sleep(0.2)
        return missing
    except (RuntimeError, ValueError):  # the store does not answer: its host is gone
        return None


def _last_checkpoint(trainer: pl.Trainer) -> Path | None:
    """The last.ckpt of the run's checkpointers, if one was written."""
    for callback in trainer.checkpoint_callbacks:
        if getattr(callback, "dirpath", None) and (path := Path(callback.dirpath) / "last.ckpt").is_file():
            return path
    return None


def _torchrun_restarts() -> bool:
    """Whether torchrun started this worker with --max-restarts above 0."""
    return int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0) > 0


def resume_after_restart(ckpt_path: str | None, dirpath: str | Path | None) -> str | None:
    """The checkpoint a fit resumes from: "last" when torchrun may restart the workers (--max-restarts above 0), no
    checkpoint was asked for and the run's checkpoint folder holds a last.ckpt (or last-v1.ckpt: Lightning's "last"); else
    `ckpt_path` as given.

    Not TORCHELASTIC_RESTART_COUNT > 0: torchrun counts only the restarts of a node whose own worker failed (a node
    restarted because another left keeps its count), so the nodes would disagree on whether to resume. The run's
    own last.ckpt is what every node sees alike; a new run under --max-restarts needs a new checkpoint folder."""
    if ckpt_path is not None or not dirpath or not _torchrun_restarts():
        return ckpt_path
    last = last_checkpoint(dirpath)  # the file Lightning resumes from: the newest last*.ckpt
    if last is None:
        return ckpt_path
    count = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    rank_zero_info(f"torchrun --max-restarts (restart {count} on this node): resuming from {last} (--ckpt_path last).")
    return "last"
