"""`python -m MODULE ARGS`, `python SCRIPT ARGS` or `python -c CODE ARGS` as a process of its own, forked from an
interpreter that has already imported torch and Lightning: each command is still a new process (its own pid, exit
status, stdout and stderr, working folder, environment, session, signal handlers and atexit), without the seconds a
fresh interpreter spends importing them first (about 5 CPU-seconds a command, most of what a tiny `fit` costs; a
forked one spends about 0.3 s).

What the warm interpreter printed while importing is put before each command's own output, so a check of a command's
output sees what a fresh process prints. It imports only what the commands would import anyway (the CLI, the model
commands) and starts no thread, so forking it is safe. Environment variables read at start-up or import (PYTHON*,
OMP_*, TORCH*, ...) cannot change per command: a command keeps the interpreter's own and may change only the others.

A command that starts Python commands of its own (Lightning's DDP launcher starts each further rank as the same
command, from the first rank; torchrun starts each worker as `python -u -m MODULE`) gets them forked from the same
warm state: each command forks a twin before it starts, which forks a copy of itself for each (fork_twin in SERVER).
A copy gets Popen's ways: its pid is the command's child, its outputs, folder, environment and session are those the
Popen asks for. A command whose start-up variables differ, with another interpreter option, or any other program the
process starts is a fresh process, as Popen starts it.

`WarmPython.run` stands for `subprocess.run` and `WarmPython.popen` for `subprocess.Popen`, with the same command
(`[sys.executable, "-m", MODULE, *ARGS]`, `[sys.executable, SCRIPT, *ARGS]` or `[sys.executable, "-c", CODE, *ARGS]`),
from any thread, as subprocess's may be called. Use a fresh process where the test is about start-up itself (what a
command imports, how fast it starts, a signal during the imports).
"""

from __future__ import annotations

import atexit
import io
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from itertools import count
from pathlib import Path
from types import MappingProxyType
from typing import IO, Any

# The four commands' modules, and the DataModules a fit or an evaluation imports while parsing its config (with them
# Hugging Face's datasets and pandas: about a second of CPU a command otherwise).
PRELOAD = ("lit_transformer.cli.lightning_cli", "lit_transformer.cli.model_commands")
PRELOAD += tuple(f"lit_transformer.data.{task}" for task in ("language_modeling", "translation", "classification"))
PRELOAD += ("lit_transformer.data.captioning",)
# Variables an interpreter, torch, Hugging Face's libraries (imported with Lightning's torchmetrics) or a native
# library read once, at start or import. Not those torch reads only when it runs: the inductor cache's folder (read
# when a compile starts, and set in os.environ by torch itself the first time it is computed), torchrun's (its agent
# reads TORCH_DISABLE_SHARE_RDZV_TCP_STORE and sets TORCHELASTIC_* for its workers, which torch.distributed,
# Lightning and the CLI read in functions at run time), TORCH_NCCL_ASYNC_ERROR_HANDLING (read when an NCCL process
# group is made).
RUN_TIME = (
    r"TORCHINDUCTOR_CACHE_DIR$|TORCHELASTIC_|TORCH_DISABLE_SHARE_RDZV_TCP_STORE$|TORCH_NCCL_ASYNC_ERROR_HANDLING$"
)
READ_AT_IMPORT = re.compile(
    rf"(?!{RUN_TIME})(PYTHON|OMP_|MKL_|KMP_|GOMP_|OPENBLAS_|TORCH|CUDA|LD_|MALLOC_|HF_|TRANSFORMERS_)"
)

SERVER = r"""
import atexit, gc, importlib, inspect, json, os, re, runpy, select, signal, socket, subprocess, sys, threading

def serve(requests: int, replies: int) -> dict:
    '''Fork a child per request line, reply `started PID`, and `exited PID CODE` when it ends; the child returns.'''
    children, buffer = {}, b""
    while True:
        for fd in select.select([requests, *children], [], [])[0]:
            if fd != requests:
                pid = children.pop(fd)
                os.close(fd)
                os.write(replies, f"exited {pid} {os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])}\n".encode())
                continue
            chunk = os.read(requests, 1 << 16)
            if not chunk:
                raise SystemExit(0)
            buffer += chunk
            while b"\n" in buffer:
                line, _, buffer = buffer.partition(b"\n")
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    for fd in (requests, replies, *children):
                        os.close(fd)
                    return request
                children[os.pidfd_open(pid)] = pid
                os.write(replies, f"started {pid}\n".encode())

def start(request: dict, preloaded: dict) -> None:
    '''This process's outputs (and session) become the command's: what the interpreter printed while importing first.'''
    for fd in (1, 2):
        target = request["outputs"][str(fd)]
        if target == "stdout":
            os.dup2(1, 2)
        elif isinstance(target, str):
            os.dup2(os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT), fd)
        os.write(fd, preloaded[fd])
    if request["session"]:
        os.setsid()


def fork_twin(preloaded: dict) -> tuple | dict:
    '''A fork of this process before its command starts, which forks a copy of itself for each Python command the
    command starts (Lightning's DDP launcher starts each further rank as `python -m MODULE ARGS`, the same command;
    torchrun starts each worker as `python -u -m MODULE ARGS`). The copy then starts ready instead of importing torch
    and Lightning in a fresh interpreter. It is forked through a middle process that ends at once, so that it becomes
    the command's own child (the command is made a child subreaper first, in relaunch): the command waits for it, reads
    its exit status and signals it as a child Popen started. (A subreaper also adopts the orphans of its children:
    one that ends stays a zombie until the command ends.)
    (socket, pid) in this process; in a copy, its request.'''
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid:
        theirs.close()
        return ours, pid
    ours.close()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)  # the command's outputs stay open only as long as the command holds them
    os.close(null)
    while True:
        message, fds, _, _ = socket.recv_fds(theirs, 1 << 22, 3)
        if not message:  # the command ended
            os._exit(0)
        pid_read, pid_write = os.pipe()
        go_read, go_write = os.pipe()
        middle = os.fork()
        if middle == 0:
            if child := os.fork():
                os.write(pid_write, str(child).encode())
                os._exit(0)
            break
        os.close(pid_write)
        os.close(go_read)
        child = int(os.read(pid_read, 64))
        os.close(pid_read)
        os.waitpid(middle, 0)  # ended: its child is the command's now
        os.close(go_write)  # the copy goes on once it is
        for fd in fds:
            os.close(fd)
        theirs.send(str(child).encode())
    for fd in (pid_read, pid_write, go_write):
        os.close(fd)
    os.read(go_read, 1)  # until the middle process has ended and been reaped
    os.close(go_read)
    theirs.close()
    request = json.loads(message)
    for fd, target in zip(fds, (0, 1, 2)):
        os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    request["outputs"] = {"1": 1, "2": 2}
    start(request, preloaded)
    return request


def relaunch(command: dict, twin: list, execute_child):
    '''subprocess.Popen's _execute_child for this command: a Popen of a rank or a worker as a launcher starts it (the
    command itself, `[sys.executable, "-m", MODULE, ...]` or `[sys.executable, SCRIPT, ...]`, as Lightning's DDP
    launcher does; any `-m MODULE` where the command is torchrun; either with -u where this interpreter's output is
    unbuffered already; no other option, the interpreter's own start-up variables) is handed to the twin, which forks
    it; any other Popen starts as Popen starts it.'''
    same = {command["module"], command["module"] + ".__main__"} if command["module"] else set()
    launcher = command["module"] in TORCHRUN  # its workers: the module it is given
    own_script = command["script"] and os.path.join(command["cwd"], command["script"])
    owner = os.getpid()
    unbuffered = bool(STARTUP.get("PYTHONUNBUFFERED"))  # -u: what PYTHONUNBUFFERED set in this interpreter
    subreaper = []

    signature = inspect.signature(execute_child)  # the running Python's (3.11 added process_group)

    def _execute_child(self, *given_args, **given_kwargs):
        call = signature.bind(self, *given_args, **given_kwargs).arguments
        args, env, cwd = call["args"], call["env"], call["cwd"]
        given = [os.fsdecode(a) for a in args] if isinstance(args, (list, tuple)) else []
        variables = {os.fsdecode(k): os.fsdecode(v) for k, v in (os.environ if env is None else env).items()}
        folder = os.path.abspath(os.getcwd() if cwd is None else os.fsdecode(cwd))
        module = script = None
        if given[:1] == [sys.executable] and given[1:2] == ["-u"] and unbuffered:
            given = given[:1] + given[2:]
        if given[:1] == [sys.executable] and given[1:2] == ["-m"] and given[2:3] and (launcher or given[2] in same):
            module = given[2]
        elif given[:1] == [sys.executable] and given[1:2] and command["script"]:
            if os.path.abspath(given[1]) == own_script:
                script = own_script
        plain = not call["shell"] and call["preexec_fn"] is None and not call["pass_fds"]
        plain = plain and (call["gid"], call["gids"], call["uid"]) == (None, None, None) and call["umask"] < 0
        plain = plain and call.get("process_group", -1) == -1 and call["executable"] in (None, sys.executable)
        startup = {k: v for k, v in variables.items() if READ_AT_IMPORT.match(k)}
        ours = twin and os.getpid() == owner  # not in a process the command forked: the twin is not its child
        if not (ours and (module or script) and plain and startup == STARTUP):
            return execute_child(self, *given_args, **given_kwargs)
        if not os.path.isdir(folder):
            raise FileNotFoundError(2, os.strerror(2), folder)
        if not subreaper:  # the copy's middle process ends: the copy is then this process's child, not init's
            import ctypes

            if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
                return execute_child(self, *given_args, **given_kwargs)
            subreaper.append(True)
        channel = twin[0][0]
        request = {"module": module, "script": script, "args": given[3 if module else 2 :], "cwd": folder}
        request["env"] = variables
        request["session"] = call["start_new_session"]
        streams = [call[name] for name in ("p2cread", "c2pwrite", "errwrite")]
        streams = [fd if fd != -1 else default for fd, default in zip(streams, (0, 1, 2))]
        with LOCK:  # one request and its answer at a time (Popen may be called from several threads)
            try:
                socket.send_fds(channel, [json.dumps(request).encode()], streams)
                pid = int(channel.recv(64) or 0)
            except OSError:
                pid = 0
        if not pid:  # the twin is gone (killed with the command's session, say): as Popen starts it
            return execute_child(self, *given_args, **given_kwargs)
        self.pid, self._child_created = pid, True
        self._close_pipe_fds(*(call[name] for name in PIPE_ENDS))

    return _execute_child


TORCHRUN = ("torch.distributed.run", "torch.distributed.launch")
LOCK = threading.Lock()  # relaunch's: one request to the twin at a time
PIPE_ENDS = ("p2cread", "p2cwrite", "c2pread", "c2pwrite", "errread", "errwrite")  # Popen's names of its pipes' ends
READ_AT_IMPORT = re.compile(sys.argv[1])
STARTUP = {k: v for k, v in os.environ.items() if READ_AT_IMPORT.match(k)}
requests, replies, out, err, *preload = sys.argv[2:]
gc.disable()  # while importing, as the program does for a command's first imports (its collector_paused)
for name in preload:
    importlib.import_module(name)
sys.stdout.flush()
sys.stderr.flush()
with open(out, "rb") as out_file, open(err, "rb") as err_file:
    preloaded = {1: out_file.read(), 2: err_file.read()}
# What is loaded now lives as long as any child: its collector need not walk it, nor copy its pages (copy on write) to
# do so, at every collection and once more at exit (seconds of CPU a child, otherwise).
gc.freeze()
gc.enable()
os.write(int(replies), b"ready\n")
request = serve(int(requests), int(replies))

# The child: the command, as `python -m MODULE ARGS` or `python SCRIPT ARGS` runs it, with its outputs (first: the
# caller may be waiting to open a pipe's reading end), session, folder and environment; and its twin, in its session.
start(request, preloaded)
twin = [fork_twin(preloaded)]
if isinstance(twin[0], dict):
    request, twin = twin[0], []
subprocess.Popen._execute_child = relaunch(request, twin, subprocess.Popen._execute_child)


@atexit.register
def end_twin(twin=twin, owner=os.getpid()) -> None:
    '''The twin ends with the command (at once: a process the command forked may hold its channel open), reaped here
    rather than left to init; the copies it forked are the command's own children, and go on.'''
    if twin and os.getpid() == owner:
        channel, pid = twin.pop()
        channel.close()
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


os.chdir(request["cwd"])
os.environ.clear()
os.environ.update(request["env"])
sys.argv = [sys.argv[0], *request["args"]]
# sys.path[0]: the folder a fresh interpreter puts first (-m: the working folder; a script: the script's own; -c: '',
# the working folder at each import)
if request["script"]:
    sys.path[0] = os.path.dirname(os.path.abspath(request["script"]))
else:
    sys.path[0] = os.getcwd() if request["module"] else ""
if "numpy" in sys.modules:  # a fresh process seeds numpy from the system's entropy (random reseeds after a fork)
    sys.modules["numpy"].random.seed()
# Lightning reads the process's rank (RANK, LOCAL_RANK, SLURM_PROCID: a rank torchrun, srun or its DDP launcher
# starts) when it is imported, for what it says before a Trainer sets it: read again from this command's environment
if (rank_zero := sys.modules.get("lightning.fabric.utilities.rank_zero")) is not None:
    rank_zero.rank_zero_only.rank = rank_zero._get_rank() or 0
del atexit, gc, importlib, rank_zero, select, serve, requests, replies, out, err, out_file, err_file, preload
del preloaded, twin
if request["module"]:
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
elif request["script"]:
    runpy.run_path(request["script"], run_name="__main__")
else:  # -c: sys.argv[0] is "-c" already (this interpreter's own), the code runs as the module __main__
    main = type(sys)("__main__")
    sys.modules["__main__"] = main
    exec(compile(request["code"], "<string>", "exec"), main.__dict__)
"""


class WarmPython:
    """One warm interpreter, started with `env`, which forks a process per command. Close it (or use it as a context
    manager) to end the interpreter; processes still running go on."""

    def __init__(self, env: Mapping[str, str] | None = None, preload: Sequence[str] = PRELOAD) -> None:
        self.env = dict(os.environ if env is None else env)
        self.folder = Path(tempfile.mkdtemp(prefix="warm_python_"))
        self._names = count()
        self._exits: dict[int, int] = {}
        self._started: list[int] = []
        self._forked: set[int] = set()
        self._lock = threading.RLock()  # one thread at a time talks to the server (requests, replies, bookkeeping)
        requests_read, self._requests = os.pipe()
        self._replies, replies_write = os.pipe()
        out, err = self.folder / "preload.out", self.folder / "preload.err"
        with open(out, "wb") as out_file, open(err, "wb") as err_file:
            self.process = subprocess.Popen(
                [sys.executable, "-c", SERVER, READ_AT_IMPORT.pattern, str(requests_read), str(replies_write)]
                + [str(out), str(err), *preload],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out_file,
                stderr=err_file,
                pass_fds=(requests_read, replies_write),
            )
        os.close(requests_read)
        os.close(replies_write)
        self._buffer = b""
        if self._reply(timeout=600) != "ready":
            raise RuntimeError(f"the warm interpreter did not start: {err.read_text()[-3000:]}")

    def _reply(self, timeout: float | None) -> str | None:
        """The server's next line, or None after `timeout` seconds."""
        while b"\n" not in self._buffer:
            if not select.select([self._replies], [], [], timeout)[0]:
                return None
            chunk = os.read(self._replies, 1 << 16)
            if not chunk:
                raise RuntimeError(f"the warm interpreter ended: {(self.folder / 'preload.err').read_text()[-3000:]}")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def _read(self, timeout: float | None) -> bool:
        """Read one reply (False after `timeout` seconds without one), noting which process started or exited."""
        line = self._reply(timeout)
        if line is None:
            return False
        kind, pid, *code = line.split()
        if kind == "started":
            self._started.append(int(pid))
        else:
            self._exits[int(pid)] = int(code[0])
        return True

    def _exit_code(self, pid: int, timeout: float | None) -> int | None:
        """The process's exit status, read within `timeout` seconds (None: waits), else None. Replies are read in
        slices of 50 ms, the lock released between them, so a thread that waits lets others start and wait too."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                if pid in self._exits:
                    return self._exits[pid]
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not self._read(0.05 if left is None else min(left, 0.05)) and left is not None and left <= 0:
                    return None

    def _target(self, given: Any, name: str) -> tuple[str, Path | None]:
        """(where the child writes, the FIFO the caller reads) for a Popen-style stdout/stderr argument."""
        if given is None:
            return "/dev/null", None  # nothing to show: a forked child has no terminal of the caller's to inherit
        if given == subprocess.DEVNULL:
            return "/dev/null", None
        if given == subprocess.STDOUT:
            return "stdout", None
        if given == subprocess.PIPE:
            fifo = self.folder / f"{name}.{next(self._names)}"
            os.mkfifo(fifo)
            return str(fifo), fifo
        if isinstance(given, (str, Path)):
            return str(given), None
        return given.name, None  # an open file (opened for writing: the child appends to it)

    def popen(
        self,
        command: Sequence[str | Path],
        cwd: str | Path,
        env: Mapping[str, str] | None = None,
        stdout: Any = None,
        stderr: Any = None,
        text: bool = False,
        start_new_session: bool = False,
    ) -> WarmProcess:
        """What `subprocess.Popen(command, ...)` starts, for `command` = [sys.executable, "-m", MODULE, *ARGS],
        [sys.executable, SCRIPT, *ARGS] or [sys.executable, "-c", CODE, *ARGS]. stdout and stderr may be PIPE, DEVNULL,
        STDOUT (stderr), a path or a file open for writing; None discards the output."""
        command = [str(word) for word in command]
        flag = command[1] if len(command) > 1 and command[1].startswith("-") else None
        if command[0] != sys.executable or len(command) < 2 + bool(flag) or flag not in (None, "-m", "-c"):
            raise ValueError(f"not [sys.executable, '-m' or '-c', NAME or CODE, ...] nor [sys.executable, SCRIPT, ...]: "
                             f"{command}")  # fmt: skip
        module = command[2] if flag == "-m" else None
        code = command[2] if flag == "-c" else None
        script = None if flag else command[1]
        args = command[3:] if flag else command[2:]
        env = dict(self.env if env is None else env)
        changed = {k for k in env.keys() | self.env.keys() if env.get(k) != self.env.get(k)}
        if fixed := sorted(k for k in changed if READ_AT_IMPORT.match(k)):
            raise ValueError(f"{fixed} are read at start-up: start a WarmPython with them instead")
        (out, out_fifo), (err, err_fifo) = self._target(stdout, "stdout"), self._target(stderr, "stderr")
        request = {"module": module, "script": script, "code": code, "args": args, "cwd": str(cwd), "env": env}
        request |= {"outputs": {"1": out, "2": err}, "session": start_new_session}
        with self._lock:
            os.write(self._requests, (json.dumps(request) + "\n").encode())
            while not self._started:
                self._read(None)
            pid = self._started.pop(0)
            self._forked.add(pid)
        streams = [open(f, "rb") if f else None for f in (out_fifo, err_fifo)]  # noqa: SIM115 (the process's pipes)
        for fifo in (out_fifo, err_fifo):
            if fifo:
                fifo.unlink()
        if text:
            streams = [io.TextIOWrapper(s) if s else None for s in streams]
        return WarmProcess(self, pid, command, *streams)

    def run(
        self,
        command: Sequence[str | Path],
        cwd: str | Path,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        text: bool = False,
    ) -> subprocess.CompletedProcess:
        """What `subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=text, timeout=timeout)` returns
        (text: decoded with universal newlines, as subprocess does)."""
        name = next(self._names)
        outputs = [self.folder / f"run.{name}.{kind}" for kind in ("out", "err")]
        for path in outputs:
            path.touch()
        process = self.popen(command, cwd, env, stdout=outputs[0], stderr=outputs[1])
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired as expired:
            process.kill()
            process.wait()
            expired.output, expired.stderr = (path.read_bytes() for path in outputs)
            raise
        finally:
            out, err = (path.read_bytes() for path in outputs)
            for path in outputs:
                path.unlink()
        if text:
            out, err = (data.decode().replace("\r\n", "\n").replace("\r", "\n") for data in (out, err))
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)

    def running(self) -> bool:
        """Whether a process it started has not been seen to end (its status not read yet)."""
        if self.process.poll() is not None:
            return False
        with self._lock:
            while self._read(timeout=0):
                pass
            return bool(self._forked - self._exits.keys())

    def close(self) -> None:
        os.close(self._requests)
        self.process.wait(timeout=60)
        os.close(self._replies)
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> WarmPython:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class WarmProcess:
    """A process forked by WarmPython, with subprocess.Popen's ways: pid, stdout/stderr (PIPE), poll, wait, signals.
    (It is the warm interpreter's child, not this process's: its exit status comes from the interpreter.)"""

    def __init__(self, python: WarmPython, pid: int, args: list[str], stdout: IO | None, stderr: IO | None) -> None:
        self.python, self.pid, self.args, self.stdout, self.stderr = python, pid, args, stdout, stderr
        self.returncode: int | None = None
        self._drains: list[threading.Thread] | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.python._exit_code(self.pid, timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.python._exit_code(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[Any, Any]:
        """The rest of stdout and stderr (PIPE), once the process ends; both are read at once, so that a process that
        fills one pipe while the other is read does not block. After a TimeoutExpired, call it again for the rest."""
        if self._drains is None:
            self._drained: dict[int, Any] = {}

            def drain(index: int, stream: IO) -> None:
                self._drained[index] = stream.read()

            streams = [(i, s) for i, s in enumerate((self.stdout, self.stderr)) if s]
            self._drains = [threading.Thread(target=drain, args=item, daemon=True) for item in streams]
            for thread in self._drains:
                thread.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._drains:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return self._drained.get(0), self._drained.get(1)

    def __enter__(self) -> WarmProcess:
        return self

    def __exit__(self, *exc) -> None:
        for stream in (self.stdout, self.stderr):
            if stream:
                stream.close()
        self.wait()


TESTS = Path(__file__).resolve().parent
HARNESS_ENV = MappingProxyType(
    {
        **os.environ,
        "PYTHONPATH": f"{TESTS}{os.pathsep}{TESTS.parent}",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
    }
)
"""The environment of the suite's own child processes (a rank, a resumed run, a test script; not a command that stands
for a user's shell, as the README's and the front door's do): the tests and the repository importable, one thread,
output unbuffered, Hugging Face offline; read-only, as files share it. The files whose child processes are forked use
it, so that they share one warm interpreter per pytest worker (warm_python keys them by start-up variables; each one
costs about 4 s of CPU). Those that must start fresh (another hash seed, the logging set-up at import) keep their own."""

_WARM: dict[tuple, WarmPython] = {}
_WARM_LOCK = threading.Lock()
KEEP = 2  # warm interpreters kept at once (about 0.5 GB each); files use one or two, and run one after the other


class FreshPython:
    """WarmPython's run and popen as plain subprocess calls: where forking an interpreter is not safe or not there
    (not Linux: macOS's system libraries are not fork-safe, Windows has no fork; no pidfd_open)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = dict(env)

    def run(self, command, cwd, env=None, timeout=None, text=False) -> subprocess.CompletedProcess:
        env = self.env if env is None else env
        return subprocess.run(command, cwd=cwd, env=env, capture_output=True, timeout=timeout, text=text)

    def popen(self, command, cwd, env=None, stdout=None, stderr=None, text=False, start_new_session=False):
        env = self.env if env is None else env
        return subprocess.Popen(command, cwd=cwd, env=env, stdout=stdout, stderr=stderr, text=text,
                                start_new_session=start_new_session)  # fmt: skip


def can_fork() -> bool:
    if not sys.platform.startswith("linux") or not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))  # Linux 5.3 and later
    except OSError:
        return False
    return True


def warm_python(env: Mapping[str, str]) -> WarmPython | FreshPython:
    """The warm interpreter for `env`'s start-up variables, shared by the tests of this process that ask for them:
    started at the first request; the least recently used one with no process running ends when a third is needed,
    the others when this process ends. Where forking cannot be used, fresh processes (FreshPython)."""
    if not can_fork():
        return FreshPython(env)
    key = tuple(sorted((k, v) for k, v in env.items() if READ_AT_IMPORT.match(k)))
    with _WARM_LOCK:  # threads that ask at once (ablate's parallel runs) share one
        if (python := _WARM.pop(key, None)) is not None:
            if python.process.poll() is None:
                _WARM[key] = python  # the most recently used last
                return python
            python.close()
        if not _WARM:
            atexit.register(lambda: [python.close() for python in _WARM.values()])
        for old in [k for k, python in _WARM.items() if not python.running()][: max(0, len(_WARM) + 1 - KEEP)]:
            _WARM.pop(old).close()
        _WARM[key] = WarmPython(env)
        return _WARM[key]
