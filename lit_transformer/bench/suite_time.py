"""Time the test suite as CI runs it (`python -m pytest`, two xdist workers) and write what it took to a JSON file.

The README quotes the figure; a timed test would be flaky, so the suite's time is measured here, on a machine said
by name (`lscpu`), with the load average before and after (another job on 2 cores doubles it).

    python -m lit_transformer bench suite-time --json docs/suite_time.json
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

from lit_transformer.bench import command_parser
from lit_transformer.records import command_line, machine

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = command_parser("bench suite-time", __doc__)
    parser.add_argument("--json", type=Path, required=True, help="Where to write the figures.")
    parser.add_argument("pytest_args", nargs="*", help="Extra pytest arguments (none: the suite as CI runs it).")
    args = parser.parse_args(argv)
    facts = machine()
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args.pytest_args]
    load_before = os.getloadavg()
    start = time.perf_counter()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|xfailed|skipped|errors?)", summary)}
    figures = {
        "command": command_line("suite-time", argv),
        "pytest": "python -m pytest -q" + "".join(f" {a}" for a in args.pytest_args),
        "cpu": facts["cpu"],
        "cores": facts["logical_cores"],
        "exit_code": result.returncode,
        "summary": summary,
        "counts": counts,
        "wall_s": round(wall, 1),
        "wall_min": round(wall / 60, 2),
        "cpu_min": round((children.ru_utime + children.ru_stime) / 60, 1),
        "load_average_before": round(load_before[0], 2),  # the machine's other work as the suite started
        "machine": facts,
    }
    args.json.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))
    if result.returncode:
        raise SystemExit(result.returncode)
