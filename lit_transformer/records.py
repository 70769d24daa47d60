"""Measurement records: what every benchmark and recipe writes of a run (the machine, the command, the date, its
figures), the one writer that appends runs to their file, the one reader of a process's memory, and the one helper
that runs a child process and samples its memory.

A figure is only comparable with another from the same machine, so every run carries `machine()`: the CPU model (as
lscpu names it), logical cores, GPU model and count, memory, the Python, torch and Lightning versions, the git commit
of the tree measured, the date and the load average before the run. A rerun is one more run in the same file
(`write_run`), never a file of its own nor an overwrite. Nothing here imports torch, Lightning or another module of
the package but the user-error type, so `bench --help` stays fast and the engine may read memory through it.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import IO, Any

from lit_transformer.errors import UserError

IMPORT_ROOT = Path(__file__).resolve().parents[1]
"""The folder the package is imported from: the repository in a source checkout, site-packages in an install. A
child process given it on PYTHONPATH (`child_env`) runs this same package, wherever it was started."""


# ---------------------------------------------------------------------------------------------------- the source


def source_checkout() -> Path | None:
    """The repository this package runs from (pyproject.toml and tests/ beside the package), None for an install."""
    root = IMPORT_ROOT
    return root if (root / "pyproject.toml").is_file() and (root / "tests").is_dir() else None


def require_source_checkout(command: str, needs: str) -> Path:
    """The repository, or a refusal in one line for a command that needs one (`needs`: what of it, e.g. its tests)."""
    root = source_checkout()
    if root is None:
        raise UserError(
            f"{command} needs a source checkout of lit_transformer ({needs}); this one is installed at "
            f"{IMPORT_ROOT / 'lit_transformer'}",
            hint="Run it in a clone of the repository (git clone, then pip install -e . there).",
        )
    return root


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child that runs the package: IMPORT_ROOT first on PYTHONPATH (so a checkout
    that is not installed runs too), plus `extra`."""
    path = os.pathsep.join(filter(None, [str(IMPORT_ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


# ---------------------------------------------------------------------------------------------------- the machine


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


def git_commit(tree: Path | None = None) -> str | None:
    """The commit of the tree measured (this package's checkout by default), with "+dirty" when it has uncommitted
    changes; None outside a checkout (an installed package has no commit of its own)."""
    tree = tree if tree is not None else source_checkout()
    if tree is None:
        return None
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
    """The machine object every run carries, taken as the run starts (`extra`: what a benchmark adds, e.g. its
    thread count)."""
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


def command_line(command: str, argv: Sequence[str]) -> str:
    """How a user types the command that is running: `command_line("bench speed", argv)` is
    `python -m lit_transformer bench speed ARGS`."""
    return shlex.join(["python", "-m", "lit_transformer", *command.split(), *argv])


# ---------------------------------------------------------------------------------------------------- runs


def write_run(
    path: str | os.PathLike,
    figures: Mapping[str, object],
    *,
    command: str,
    machine: Mapping[str, object],
    name: str | None = None,
    summary: Sequence[str] = (),
) -> dict[str, object]:
    """Append one run ({"command", "date", "machine", **figures}) to the benchmark's file at `path`; the run.

    The file's form decides how: a `.jsonl` file takes it as one more line; a `.json` file holds {"runs": [...]}
    (with `summary`: also each row's median and spread over the runs, `summarize_runs`), and a file an older writer
    left as one run becomes the first of its runs, a file that is a list of runs takes one more item. With `name`,
    the file holds several named records (a run's `fit` beside its `test`, a task's baselines) and the run is
    appended to the record under that name, by the same rules. Written whole to a temporary file and then moved
    into place, so an interrupted write leaves the previous file."""
    path = Path(path)
    run = {"command": command, "date": machine.get("date") or now(), "machine": dict(machine), **figures}
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".jsonl":
        if name is not None:
            raise UserError(f"{path}: a JSON-lines file holds one run a line, not named records", hint="Give a .json.")
        with path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(run) + "\n")
        return run
    data = _read(path)
    if name is None:
        data = _with_run(data, run, summary, path)
    else:
        if data is None:
            data = {}
        if not isinstance(data, dict) or _is_runs(data) or "machine" in data:
            raise UserError(
                f"{path} holds the runs of one benchmark, not named records: it cannot take a record named {name!r}",
                hint="Write to another file.",
            )
        data[name] = _with_run(data.get(name), run, summary, path, name)
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(part, path)
    return run


def read_runs(path: str | os.PathLike, name: str | None = None) -> list[dict[str, Any]]:
    """Every run of a benchmark's file (of its record `name`), oldest first, in whichever form `write_run` found or
    left the file: [] where there is none."""
    path = Path(path)
    if path.suffix == ".jsonl":
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    data = _read(path)
    if name is not None:
        data = data.get(name) if isinstance(data, dict) else None
    if data is None:
        return []
    if isinstance(data, list):
        return data
    return list(data["runs"]) if _is_runs(data) else [data]


def _read(path: Path) -> Any:
    if not path.exists():
        return None
    text = path.read_text(encoding="utf-8")
    try:
        return json.loads(text) if text.strip() else None
    except json.JSONDecodeError as error:
        raise UserError(f"{path} is not JSON ({error}): a benchmark appends its runs to a file it wrote") from None


def _is_runs(data: object) -> bool:
    return isinstance(data, dict) and isinstance(data.get("runs"), list)


def _with_run(
    record: Any, run: dict, summary: Sequence[str], path: Path, name: str | None = None
) -> dict[str, Any] | list:
    """`record` (None, {"runs": [...]}, one run as older writers left it, or a list of runs) with `run` appended."""
    where = f"{path}" + (f", record {name!r}," if name else "")
    if record is None:
        record = {"runs": []}
    elif isinstance(record, list):
        record.append(run)
        return record
    elif not isinstance(record, dict):
        raise UserError(f"{where} holds {type(record).__name__}, not runs", hint="Write to another file.")
    elif not _is_runs(record):
        if "machine" not in record:  # not a run: named records, or some other document
            keys = ", ".join(sorted(record)[:6])
            raise UserError(f"{where} holds named records ({keys}), not runs", hint="Write to another file.")
        record = {"runs": [record]}  # one run as an older writer left it: the first of the file's runs
    record["runs"].append(run)
    if summary:
        record["summary"] = summarize_runs(record["runs"], summary)
    return record


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min and max of a figure over runs (what a file with several runs reports beside them)."""
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


# ---------------------------------------------------------------------------------------------------- clocks


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


# ---------------------------------------------------------------------------------------------------- memory


def _status_kb(pid: int | str, field: str) -> int | None:
    """A field of /proc/PID/status in KB (VmRSS: resident now; VmHWM: the resident high-water mark); None where it
    cannot be read (no such process, no /proc)."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            return next(int(line.split()[1]) for line in handle if line.startswith(f"{field}:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def process_rss_mb(pid: int | str = "self", field: str = "VmRSS") -> float | None:
    """A process's resident memory (VmRSS; VmHWM: its peak so far) in MB, from /proc (Linux); None where it cannot be
    read."""
    kb = _status_kb(pid, field)
    return None if kb is None else kb / 1e3


def peak_rss_mb(who: int = resource.RUSAGE_SELF) -> float:
    """Peak resident memory of this process (or of its waited-for children) in MB; ru_maxrss is KB on Linux."""
    scale = 1 / 1024 / 1024 if sys.platform == "darwin" else 1 / 1024
    return round(resource.getrusage(who).ru_maxrss * scale, 1)


def tree_rss_kb(root: int) -> dict[int, int]:
    """{pid: VmRSS in KB} of `root` and every descendant alive now, from /proc (Linux; {} elsewhere): a command's
    tokenizing workers are children of it, so the memory benchmarks sample the whole tree."""
    try:
        entries = [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return {}
    children: dict[int, list[int]] = {}
    for pid in entries:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(pid)
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        out[pid] = _status_kb(pid, "VmRSS") or 0
        todo.extend(children.get(pid, []))
    return out


@dataclass
class ChildRun:
    """What `run_child` measured of one child process and the processes it started."""

    returncode: int
    wall_s: float
    cpu_s: float
    """User + system seconds of the child and of the descendants it waited for."""
    peak_rss_mb: float
    """The largest single process's peak: wait4's ru_maxrss (the child, or a descendant it waited for), or a larger
    one sampled."""
    peak_tree_mb: float | None
    """The sampled peak of the whole tree's summed resident memory (None: not sampled, or no /proc). Forked workers
    share pages, so the sum overstates."""
    exceeded: bool = False
    """Killed for passing `cap_mb`."""
    system_s: float = 0.0
    """The system (kernel) seconds of `cpu_s`."""
    minor_faults: int = 0
    """Page faults served without I/O (a fresh page zero-filled, a shared one copied): wait4's ru_minflt."""
    samples: list[tuple[float, float]] = field(default_factory=list)
    """(time.time(), the tree's summed MB) at each sample."""


def run_child(
    command: Sequence[str],
    *,
    cwd: str | os.PathLike | None = None,
    env: Mapping[str, str] | None = None,
    interval: float | None = 0.1,
    cap_mb: float | None = None,
    stdout: int | IO | None = None,
    stderr: int | IO | None = None,
) -> ChildRun:
    """Run `command` to its end, sampling the summed resident memory of its process tree on a thread every
    `interval` seconds (None: no sampling, for a timing the sampler must not disturb); past `cap_mb` the tree is
    killed and the run marked `exceeded`. The child leads a session of its own, so the whole tree ends with it
    (killed too if this process is interrupted)."""
    started = time.perf_counter()
    process = subprocess.Popen(
        list(command), cwd=cwd, env=None if env is None else dict(env), stdout=stdout, stderr=stderr,
        start_new_session=True,
    )  # fmt: skip
    samples: list[tuple[float, float]] = []
    peak_single_kb, exceeded = 0, False
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak_single_kb, exceeded
        while not stop.is_set():
            tree = tree_rss_kb(process.pid)
            total = sum(tree.values())
            samples.append((time.time(), total / 1e3))
            peak_single_kb = max([peak_single_kb, *tree.values()])
            if cap_mb is not None and total > cap_mb * 1e3 and not exceeded:
                exceeded = True
                _kill_session(process.pid)
            stop.wait(interval)

    thread = threading.Thread(target=sample, daemon=True) if interval is not None else None
    if thread is not None:
        thread.start()
    try:
        _, status, usage = os.wait4(process.pid, 0)
    except BaseException:
        _kill_session(process.pid)
        process.wait()
        raise
    finally:
        stop.set()
        if thread is not None:
            thread.join()
    process.returncode = os.waitstatus_to_exitcode(status)
    kb = 1 / 1024 if sys.platform == "darwin" else 1  # ru_maxrss: bytes on macOS, KB on Linux
    memory = [mb for _, mb in samples if mb > 0]
    return ChildRun(
        returncode=process.returncode,
        wall_s=time.perf_counter() - started,
        cpu_s=usage.ru_utime + usage.ru_stime,
        peak_rss_mb=max(usage.ru_maxrss * kb, peak_single_kb) / 1e3,
        peak_tree_mb=max(memory) if memory else None,
        exceeded=exceeded,
        samples=samples,
        system_s=usage.ru_stime,
        minor_faults=usage.ru_minflt,
    )


def _kill_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # the session run_child started for the command: the child and its tree
    except (ProcessLookupError, PermissionError):
        pass
