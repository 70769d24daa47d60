"""tests/_forked.py: a command forked from a warm interpreter behaves as the same command in a fresh process (exit
status, output, folder, environment, sys.argv and sys.path, atexit, signals, sessions, timeouts), shows what the
interpreter printed while importing, and refuses a start-up variable it cannot change. A warm interpreter that
preloads only tiny modules of the test's own keeps this test at a second."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _forked import WarmPython, can_fork

pytestmark = pytest.mark.skipif(not can_fork(), reason="forks only on Linux (5.3 and later); elsewhere fresh processes")

SCRIPT = """
import atexit, os, sys
import noisy  # prints at import (in the warm interpreter: while it preloads)
atexit.register(lambda: print("atexit ran", flush=True))
print("argv", sys.argv[1:], "cwd", os.getcwd(), "path0", sys.path[0], "var", os.environ.get("SOME_VAR"))
print("to stderr", file=sys.stderr)
if sys.argv[1:] == ["raise"]:
    raise ValueError("boom")
if sys.argv[1:] == ["exit"]:
    sys.exit("a message")
if sys.argv[1:] == ["wait"]:
    print("WAITING", flush=True)
    import time
    time.sleep(60)
sys.exit(3)
"""


RANKS = """
import os, subprocess, sys
import __main__
warm = "noisy" in sys.modules  # preloaded: imported before this line only in a process forked from the interpreter
import noisy
role = sys.argv[1]
print(role, "warm" if warm else "fresh", os.getpid(), os.getppid(), os.getcwd(), os.environ.get("RANK"), flush=True)
if role in ("launcher", "hashseed"):
    # the command itself, as Lightning's DDP launcher starts its further ranks
    own = ["-m", __main__.__spec__.name] if __main__.__spec__ else [os.path.abspath(sys.argv[0])]
    env = {**os.environ, "RANK": "1"}
    if role == "hashseed":  # a start-up variable changed: a fresh process; the next one is the twin
        ended = subprocess.run([sys.executable, *own, "rank"], env={**env, "PYTHONHASHSEED": "7"}).returncode
        first = subprocess.Popen([sys.executable, *own, "rank"], env=env)
        print("codes", ended, first.wait(), flush=True)
        sys.exit(0)
    first = subprocess.Popen([sys.executable, *own, "rank"], env=env, cwd=sys.argv[2], stdout=subprocess.PIPE, text=True)
    piped = first.stdout.read()
    second = subprocess.Popen([sys.executable, "-u", *own, "rank"], env=env)  # -u: as torchrun starts its workers
    second.wait()
    other = subprocess.run([sys.executable, "-m", "tool", "x"], capture_output=True, text=True).stdout
    print("piped", piped.strip(), flush=True)
    print("codes", first.wait(), second.wait(), other.strip(), flush=True)
    sys.exit(0)
sys.exit(5)
"""


@pytest.fixture(scope="module")
def python(tmp_path_factory) -> WarmPython:
    folder = tmp_path_factory.mktemp("warm")
    (folder / "noisy.py").write_text("import sys\nprint('printed at import', file=sys.stderr)\n")
    (folder / "script.py").write_text(SCRIPT)
    (folder / "tool.py").write_text("import sys\nprint('tool', sys.argv[1:])\n")
    (folder / "ranks.py").write_text(RANKS)
    env = {**os.environ, "PYTHONPATH": str(folder), "PYTHONUNBUFFERED": "1"}  # unbuffered, as the suite's (-u)
    with WarmPython(env, preload=("noisy",)) as warm:
        warm.test_folder = folder
        yield warm


def test_a_script_gets_its_arguments_folder_environment_and_exit_status(python: WarmPython, tmp_path: Path) -> None:
    script = python.test_folder / "script.py"
    env = {**python.env, "SOME_VAR": "set"}
    result = python.run([sys.executable, str(script), "a", "b"], tmp_path, env, timeout=60, text=True)
    assert result.returncode == 3
    assert result.stdout.splitlines() == [
        f"argv ['a', 'b'] cwd {tmp_path} path0 {python.test_folder} var set",
        "atexit ran",
    ]
    assert result.stderr == "printed at import\nto stderr\n"  # the preload's output first, as in a fresh process
    fresh = subprocess.run(
        [sys.executable, str(script), "a", "b"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert (fresh.returncode, fresh.stdout, fresh.stderr) == (result.returncode, result.stdout, result.stderr)


def test_a_module_runs_as_with_dash_m(python: WarmPython) -> None:
    result = python.run([sys.executable, "-m", "tool", "x"], python.test_folder, timeout=60, text=True)
    assert (result.returncode, result.stdout) == (0, "tool ['x']\n")


CODE = """
import os, sys
import here  # from the working folder: sys.path[0] is '' under -c
print(__name__, sys.argv, repr(sys.path[0]), os.getcwd(), here.WHERE)
sys.exit(4)
"""


def test_code_runs_as_with_dash_c(python: WarmPython, tmp_path: Path) -> None:
    (tmp_path / "here.py").write_text("WHERE = 'the working folder'\n")
    command = [sys.executable, "-c", CODE, "a", "b"]
    result = python.run(command, tmp_path, timeout=60, text=True)
    assert result.returncode == 4
    assert result.stdout == f"__main__ ['-c', 'a', 'b'] '' {tmp_path} the working folder\n"
    fresh = subprocess.run(command, cwd=tmp_path, env=python.env, capture_output=True, text=True)
    assert (fresh.returncode, fresh.stdout) == (result.returncode, result.stdout)
    assert result.stderr == "printed at import\n" and fresh.stderr == ""  # the preload's output, as for a script


def test_threads_start_and_wait_for_their_own_processes(python: WarmPython, tmp_path: Path) -> None:
    """subprocess may be called from several threads at once (ablate runs its jobs so): each gets its own process and
    exit status."""
    from concurrent.futures import ThreadPoolExecutor

    def run(code: int) -> tuple[int, str]:
        done = python.run([sys.executable, "-c", f"import time; time.sleep(0.2); print({code}); raise SystemExit({code})"],
                          tmp_path, timeout=60, text=True)  # fmt: skip
        return done.returncode, done.stdout

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(run, range(8))) == [(code, f"{code}\n") for code in range(8)]
    assert not python.running()


def test_an_exception_or_a_message_exits_with_status_1(python: WarmPython, tmp_path: Path) -> None:
    script = str(python.test_folder / "script.py")
    raised = python.run([sys.executable, script, "raise"], tmp_path, timeout=60, text=True)
    assert raised.returncode == 1 and "Traceback" in raised.stderr and "ValueError: boom" in raised.stderr
    exited = python.run([sys.executable, script, "exit"], tmp_path, timeout=60, text=True)
    assert exited.returncode == 1 and exited.stderr.endswith("a message\n")


def test_a_process_in_its_own_session_streams_and_ends_by_a_signal(python: WarmPython, tmp_path: Path) -> None:
    script = str(python.test_folder / "script.py")
    process = python.popen([sys.executable, script, "wait"], tmp_path, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    assert process.stdout.readline().startswith("argv ['wait']")
    assert process.stdout.readline() == "WAITING\n"
    assert os.getpgid(process.pid) == process.pid and process.poll() is None
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == -signal.SIGTERM and "atexit ran" not in out


def test_a_timeout_kills_the_process(python: WarmPython, tmp_path: Path) -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        python.run([sys.executable, str(python.test_folder / "script.py"), "wait"], tmp_path, timeout=1)
    assert not python.running()


def test_a_start_up_variable_cannot_change(python: WarmPython, tmp_path: Path) -> None:
    for name in ("PYTHONHASHSEED", "OMP_NUM_THREADS", "HF_HUB_OFFLINE"):
        with pytest.raises(ValueError, match=f"{name}.*read at start-up"):
            python.run([sys.executable, "-m", "tool"], tmp_path, {**python.env, name: "7"})
    with pytest.raises(ValueError, match="not \\[sys.executable"):
        python.run([sys.executable, "-X", "importtime", "-m", "tool"], tmp_path)  # an interpreter option


@pytest.mark.parametrize("how", ["module", "script"])
def test_a_command_that_starts_itself_again_forks_its_copies_ready(
    python: WarmPython, tmp_path: Path, how: str
) -> None:
    """A DDP launcher's further ranks (the same command, started by the first with another RANK, folder and pipe;
    with -u, as torchrun starts its workers) are forked from the interpreter ready, with Popen's ways (pid, parent,
    pipe, exit status); a copy with a start-up variable changed and another command start fresh."""
    own = ["-m", "ranks"] if how == "module" else [str(python.test_folder / "ranks.py")]
    folder = python.test_folder if how == "module" else tmp_path / "launcher"
    folder.mkdir(exist_ok=True)
    result = python.run([sys.executable, *own, "launcher", str(tmp_path)], folder, timeout=120, text=True)
    assert result.returncode == 0, result.stderr
    (role, kind, pid, *_), *ranks = (line.split() for line in result.stdout.splitlines())
    assert (role, kind) == ("launcher", "warm")
    # the second copy writes to the launcher's stdout; the first to its pipe, which the launcher reads. Both are the
    # launcher's own children (their parent's pid is the launcher's), whose exit status it reads.
    second, (piped, *first), codes = ranks
    assert second[:2] + second[3:] == ["rank", "warm", pid, str(folder), "1"]
    assert [piped, *first[:2], *first[3:]] == ["piped", "rank", "warm", pid, str(tmp_path), "1"]
    assert codes == ["codes", "5", "5", "tool", "['x']"]
    assert result.stderr == "printed at import\n" * 3  # each copy prints what a fresh interpreter prints at import

    seeded = python.run([sys.executable, *own, "hashseed"], folder, timeout=120, text=True)
    assert seeded.returncode == 0, seeded.stderr
    assert [line.split()[:2] for line in seeded.stdout.splitlines()] == [
        ["hashseed", "warm"], ["rank", "fresh"], ["rank", "warm"], ["codes", "5"]
    ]  # fmt: skip


def test_a_command_that_does_not_start_itself_again_leaves_no_process_behind(python: WarmPython) -> None:
    """Its twin, never used, ends with it: nothing is left in the command's session once the command has ended."""
    process = python.popen([sys.executable, "-m", "tool", "x"], python.test_folder, start_new_session=True)
    assert process.wait(timeout=60) == 0
    with pytest.raises(ProcessLookupError):
        os.killpg(process.pid, 0)


def test_the_suite_collects_garbage_again_once_its_tests_are_collected() -> None:
    """tests/conftest.py pauses Python's cyclic collector while the tests are imported and collected, then freezes
    what that made and resumes it: a worker left without it would keep every test's garbage cycles until the end."""
    import gc

    assert gc.isenabled() and gc.get_freeze_count() > 0
