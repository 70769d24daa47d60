"""Time the test suite as CI runs it (`python -m pytest`, two xdist workers) and add what it took to a JSON file.

The README quotes the figure; a timed test would be flaky, so the suite's time is measured here, on a machine said
by name (`lscpu`), with the load average before (another job on 2 cores doubles it). It runs the tests/ of the
repository, so it needs a source checkout and refuses elsewhere.

A newcomer's first run (and CI's, on a clean machine) starts with empty caches: the prepared corpora and tokenizers
(LIT_TRANSFORMER_CACHE) and inductor's compiled kernels (TORCHINDUCTOR_CACHE_DIR) are built during the run, so they
start empty here too unless `--warm-caches` keeps this machine's. A whole-suite run that passes also rewrites
tests/file_seconds.json, each test file's seconds, from which tests/conftest.py hands out the longest files first.

A cloud machine's speed moves with its host: the same tests on one 2-core Xeon took 12.45 minutes, then 8.5 an hour
later. Each run records a yardstick beside its time, the CPU seconds of 10 million Python additions just before and
just after the suite, so that two runs are compared knowing whether the machine itself was faster.

    python -m lit_transformer bench suite-time --json docs/suite_time.json
    python -m lit_transformer bench suite-time --json /tmp/suite.json -- tests/test_model.py -n 0   # pytest's own arguments after --
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

from lit_transformer.bench.checks import runs_file
from lit_transformer.cli.arguments import command_parser, parse, split_passed_on
from lit_transformer.records import (
    child_env,
    command_line,
    machine,
    require_source_checkout,
    run_child,
    write_run,
)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, pytest_args = split_passed_on(argv)
    parser = command_parser("bench suite-time", __doc__)
    parser.add_argument("--json", type=Path, required=True, help="add this run to the runs of this file")
    parser.add_argument(
        "--warm-caches",
        action="store_true",
        help="keep this machine's data and inductor caches (a second run's time; by default both start empty)",
    )
    args = parse(parser, own)
    runs_file(args.json)  # before the suite's minutes, not after them
    root = require_source_checkout("bench suite-time", "it runs the repository's tests/")
    facts = machine()
    loop_before = python_loop_seconds()
    with tempfile.TemporaryDirectory(prefix="suite_time_") as scratch, tempfile.TemporaryFile("w+") as out:
        env = child_env()
        if not args.warm_caches:
            env |= {"LIT_TRANSFORMER_CACHE": f"{scratch}/data", "TORCHINDUCTOR_CACHE_DIR": f"{scratch}/inductor"}
        report = Path(scratch) / "junit.xml"
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml", str(report)]
        done = run_child([*command, *pytest_args], cwd=root, env=env, interval=None, stdout=out,
                         stderr=subprocess.DEVNULL)  # fmt: skip
        out.seek(0)
        lines = out.read().strip().splitlines()
        if not pytest_args and done.returncode == 0:  # the whole suite: every file's seconds
            seconds = file_seconds(report)
            (root / "tests" / "file_seconds.json").write_text(json.dumps(seconds, indent=1) + "\n")
    loop_after = python_loop_seconds()
    summary = lines[-1] if lines else ""
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|xfailed|skipped|errors?)", summary)}
    figures = {
        "pytest": "python -m pytest -q" + "".join(f" {a}" for a in pytest_args),
        "caches": "warm" if args.warm_caches else "empty",
        "cpu": facts["cpu"],
        "cores": facts["logical_cores"],
        "exit_code": done.returncode,
        "summary": summary,
        "counts": counts,
        "wall_s": round(done.wall_s, 1),
        "wall_min": round(done.wall_s / 60, 2),
        "cpu_min": round(done.cpu_s / 60, 1),  # pytest and its xdist workers, user + system
        "load_average_before": round(facts["load_average_before"][0], 2),  # the machine's other work at the start
        "python_loop_s": {"before": loop_before, "after": loop_after},  # the host's speed: python_loop_seconds
    }
    run = write_run(args.json, figures, command=command_line("bench suite-time", argv), machine=facts)
    print(json.dumps(run, indent=2))
    if done.returncode:  # the tests that failed, as pytest's short summary names them (the rest of its output is gone)
        failed = [line for line in lines if line.startswith(("FAILED ", "ERROR "))]
        print("\n".join(failed or lines[-40:]), file=sys.stderr)
        raise SystemExit(done.returncode)


LOOP_ADDITIONS = 10_000_000
"""The yardstick's size: 0.4 CPU-seconds on the 2-core Xeon in a fast hour (2026-11-30)."""


def python_loop_seconds() -> float:
    """CPU seconds of LOOP_ADDITIONS Python integer additions in this process: how fast the machine runs Python (most
    of the suite) at this moment, independent of the tests."""
    start = time.process_time()
    total = 0
    for number in range(LOOP_ADDITIONS):
        total += number
    return round(time.process_time() - start, 3)


def file_seconds(junit_xml: Path) -> dict[str, float]:
    """{test file name: its tests' seconds (set-up and tear-down included)}, longest first, from pytest's JUnit XML
    report (each test case's classname is its module's dotted path, then its class if any)."""
    totals: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        module = next((part for part in case.get("classname", "").split(".") if part.startswith("test_")), None)
        if module:
            totals[f"{module}.py"] += float(case.get("time") or 0)
    return {name: round(total, 1) for name, total in sorted(totals.items(), key=lambda item: -item[1])}
