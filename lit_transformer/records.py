"""Measurement records: what every benchmark and recipe writes of the machine it ran on, and the clocks, memory
readings and run files they share.

A figure is only comparable with another from the same machine, so every JSON a benchmark writes carries
`machine()`: the CPU model (as lscpu names it), logical cores, GPU model and count, memory, the Python, torch and
Lightning versions, the git commit of the tree measured, the date and the load average before the run. Nothing here
imports torch or Lightning at module level (their versions come from the installed metadata), so `bench --help`
stays fast.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def cpu_model() -> str:
    """The CPU's model name as lscpu gives it (the platform's processor string where lscpu is missing)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor() or "unknown"


def memory_gb() -> float | None:
    """Physical memory in GB (sysconf; None where the platform does not say)."""
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1)
    except (ValueError, OSError, AttributeError):
        return None


def gpus() -> list[str]:
    """The model name of each CUDA GPU (nvidia-smi, so CUDA is not initialised here); [] on a machine without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, check=True, timeout=30).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def git_commit(tree: Path = PACKAGE_ROOT) -> str | None:
    """The commit of the tree measured, with "+dirty" when it has uncommitted changes (None outside a checkout)."""
    try:
        head = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def machine(**extra: object) -> dict[str, object]:
    """The machine object every benchmark JSON carries (`extra`: what a benchmark adds, e.g. its thread count)."""
    names = gpus()
    return {
        "cpu": cpu_model(),
        "logical_cores": os.cpu_count(),
        "gpu": names[0] if names else None,
        "gpu_count": len(names),
        "memory_gb": memory_gb(),
        "python": platform.python_version(),
        "torch": version("torch"),
        "lightning": version("lightning"),
        "commit": git_commit(),
        "date": now(),
        "load_average_before": list(os.getloadavg()),
        **extra,
    }


def command_line(name: str, argv: Sequence[str]) -> str:
    """How a user types the benchmark that is running: `python -m lit_transformer bench NAME ARGS`."""
    return shlex.join(["python", "-m", "lit_transformer", "bench", name, *argv])


def peak_rss_mb(who: int = resource.RUSAGE_SELF) -> float:
    """Peak resident memory of this process (or of its waited-for children) in MB; ru_maxrss is KB on Linux."""
    scale = 1 / 1024 / 1024 if sys.platform == "darwin" else 1 / 1024
    return round(resource.getrusage(who).ru_maxrss * scale, 1)


def tree_rss_kb(root: int) -> dict[int, int]:
    """{pid: VmRSS in KB} of `root` and every descendant alive now, from /proc (Linux): a command's tokenizing
    workers are children of it, so the memory benchmarks sample the whole tree."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/status") as handle:
                for line in handle:
                    if line.startswith("VmRSS:"):
                        rss[int(entry)] = int(line.split()[1])
                        break
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        out[pid] = rss.get(pid, 0)
        todo.extend(children.get(pid, []))
    return out


@contextmanager
def clock() -> Iterator[dict[str, float]]:
    """Wall and CPU seconds of the block (this process's own CPU time): `with clock() as t: ...; t["wall_s"]`."""
    timing: dict[str, float] = {}
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        yield timing
    finally:
        timing["wall_s"] = time.perf_counter() - wall
        timing["cpu_s"] = time.process_time() - cpu


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min and max of a figure over runs (what a JSON with several runs reports beside them)."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarize_runs(runs: list[dict], keys: Sequence[str] = ("ratio", "median_s")) -> list[dict]:
    """Per (section, contender) row present in the runs: the median and spread of each numeric key over them."""
    groups: dict[tuple, dict[str, list[float]]] = {}
    for run in runs:
        for row in run.get("rows", []):
            ident = (row.get("section"), row.get("contender"))
            for key in keys:
                if isinstance(row.get(key), (int, float)):
                    groups.setdefault(ident, {}).setdefault(key, []).append(row[key])
    return [{"section": s, "contender": c, **{k: spread(v) for k, v in figures.items()}}
            for (s, c), figures in groups.items()]  # fmt: skip


def add_run(path: Path, run: dict, keys: Sequence[str] = ("ratio", "median_s")) -> dict:
    """Append `run` (which carries its own "machine") to the benchmark's one JSON at `path`, as {"runs": [...],
    "summary": [...]}: a rerun is one more run in the same file, never a file of its own."""
    data = json.loads(path.read_text()) if path.exists() else {}
    if "runs" not in data:  # a file of one run as older benchmarks wrote it becomes the first run
        data = {"runs": [data] if data else []}
    data["runs"].append(run)
    data["summary"] = summarize_runs(data["runs"], keys)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return data
