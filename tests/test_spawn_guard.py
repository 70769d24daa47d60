"""A script without an `if __name__ == "__main__":` guard that prepares data in worker processes fails with the fix,
instead of hanging (each spawned worker imports the script again and would wait on the cache lock its parent holds).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _forked import HARNESS_ENV, warm_python

REPO = Path(__file__).resolve().parents[1]
FIX = "wrap your script's entry point in `if __name__ == '__main__':`"

PREPARE = """
import lit_transformer.data.shards as shards
from lit_transformer.data import LanguageModelingDataModule

shards.POOL_MIN_BYTES = 0  # tokenize this small corpus in worker processes, as a corpus from 16 MB on is
data = LanguageModelingDataModule(dataset={corpus!r}, tokenizer="char", vocab_size=64, block_size=16, cache_dir={cache!r})
data.prepare_data()
print("PREPARED", len(data._prepared()["train"]), flush=True)
"""


def _run(script: Path) -> subprocess.CompletedProcess:
    """Run `script` as `python script.py` does; a run still going after two minutes is the hang: killed, a failure.
    (Minutes, not seconds: each worker imports torch on a possibly loaded machine; the hang never ends.)"""
    # Forked from a warm interpreter (tests/_forked.py); the workers it spawns are fresh interpreters, as always.
    process = warm_python(HARNESS_ENV).popen(
        [sys.executable, str(script)], cwd=script.parent, text=True, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the script and the workers it spawned
        out, err = process.communicate()
        raise AssertionError(f"{script.name} hung (killed after 120 s): {out[-1000:]} {err[-3000:]}") from None
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="worker processes start only with 2 CPUs or more")
def test_an_unguarded_script_fails_naming_the_fix_and_a_guarded_one_prepares(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"line {i}: now is the winter of our discontent\n" for i in range(300)))
    body = PREPARE.format(corpus=str(corpus), cache=str(tmp_path / "cache"))

    unguarded = tmp_path / "unguarded.py"
    unguarded.write_text(body)
    result = _run(unguarded)
    assert result.returncode != 0 and "PREPARED" not in result.stdout
    # The parent says it too (not only the workers' tracebacks): its last line is the error that names the fix.
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("lit_transformer.data.cache.UnguardedMainError: A tokenizing worker stopped:"), last
    assert str(unguarded) in last and FIX in last

    guarded = tmp_path / "guarded.py"
    guarded.write_text("def main():\n" + textwrap.indent(body, "    ") + "\n\nif __name__ == '__main__':\n    main()\n")
    result = _run(guarded)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("PREPARED") and int(result.stdout.split()[1]) > 0
