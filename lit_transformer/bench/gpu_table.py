"""The GPU check's results: collect the rows `scripts/gpu_check.sh` measured into docs/gpu_check.json, and render the
docs/scaling.md's GPU table from that JSON (never from hand-copied numbers).

    python -m lit_transformer bench gpu-table collect runs/gpu/rows.jsonl --meta runs/gpu/meta.json --json docs/gpu_check.json
    python -m lit_transformer bench gpu-table render docs/gpu_check.json                     # print the latest run's table
    python -m lit_transformer bench gpu-table render docs/gpu_check.json --readme docs/scaling.md  # replace the table between markers

A row is one JSON object per measured part: {"part", "label", "status": ok|timeout|failed|skipped, ...figures}.
The table (docs/scaling.md) lives between `<!-- gpu-check:start -->` and `<!-- gpu-check:end -->`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from lit_transformer.bench.checks import read_json, recorded_runs, runs_file
from lit_transformer.cli.arguments import chosen, command_parser, parse, subcommand_parser
from lit_transformer.errors import BadFileError, MissingFileError
from lit_transformer.records import command_line, machine, write_run

START, END = "<!-- gpu-check:start -->", "<!-- gpu-check:end -->"
Row = dict[str, Any]


def read_rows(path: Path) -> list[Row]:
    """The JSON lines of `path`; a line cut short by a killed part is skipped, not fatal."""
    rows = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                print(f"skipped a malformed row: {line[:120]}", file=sys.stderr)
    return rows


def meta(dry_run: bool, nanogpt: Path, command: str) -> dict[str, Any]:
    """The run's facts, written once at the start of gpu_check.sh: the machine, nanoGPT's commit, the command."""
    facts = machine()
    found = subprocess.run(["git", "-C", str(nanogpt), "rev-parse", "HEAD"], capture_output=True, text=True)
    return {
        "started": facts["date"],
        "device": "cpu" if dry_run else facts["gpu"] or "unknown GPU",
        "torch": facts["torch"],
        "lightning": facts["lightning"],
        "dry_run": dry_run,
        "nanogpt_commit": found.stdout.strip() or None,
        "command": command,
        "machine": facts,
    }


def collect(rows_path: Path, meta_path: Path | None, json_path: Path, command: str) -> dict[str, Any]:
    """Append one run (the facts `meta` wrote as the script started, and the rows) to the runs of `json_path`;
    without them (the script ended before), this command and the machine now."""
    facts = read_json(meta_path, "--meta") if meta_path and meta_path.exists() else {}
    if not isinstance(facts, dict):
        raise BadFileError(f"--meta {meta_path} holds a JSON {type(facts).__name__}, not the facts `meta` writes")
    command, found = facts.pop("command", command), facts.pop("machine", None) or machine()
    return write_run(json_path, {**facts, "rows": read_rows(rows_path)}, command=command, machine=found)


def tag(log: Path, part: str, rc: int, box: int, seconds: int) -> list[Row]:
    """The rows a part printed (JSON lines of its log), tagged with the part, its exit and wall time; a part that
    printed none gets one row saying why: its time box ran out (timeout's 124, or 137 after the kill) or it failed."""
    rows = read_rows(log) if log.exists() else []
    rows = [r for r in rows if "tokens_per_s" in r or "label" in r]
    if not rows:
        if rc in (124, 137):
            rows = [{"status": "timeout", "limit_s": box, "killed": rc == 137}]
        else:
            text = log.read_text(errors="replace").splitlines() if log.exists() else []
            errors = [line for line in text if "Error" in line or "error:" in line] or text[-1:] or ["no output"]
            rows = [{"status": "failed", "error": errors[-1].strip()[:300]}]
    for row in rows:
        row.setdefault("status", "ok")
        row.update({"part": part, "rc": rc, "seconds": seconds, "box_s": box})
    return rows


def _fmt(value: Any, spec: str, missing: str = "–") -> str:
    return missing if value is None else format(value, spec)


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "–"


def _by(rows: list[Row], part: str) -> Row | None:
    return next((r for r in rows if r.get("part") == part), None)


def _status(row: Row | None) -> str:
    if row is None:
        return "not run"
    status = row.get("status", "ok")
    if status == "timeout":
        return f"timed out ({row.get('limit_s', '?')} s box)"
    if status == "failed":
        return f"failed: {row.get('error', '')}"[:120]
    if status == "skipped":
        return f"skipped: {row.get('reason', '')}"
    return "ok"


def table(run: dict[str, Any]) -> str:
    """The markdown table of one run: GPT-2 small beside nanoGPT, compiled translation, the preset, the strategies."""
    rows = run["rows"]
    out = [
        f"Card: {run.get('device', '?')}; torch {run.get('torch', '?')}, Lightning {run.get('lightning', '?')}; "
        f"{run.get('started', '')}{' (dry run on CPU: plumbing only, no figure)' if run.get('dry_run') else ''}.",
        "",
        "| measurement | ours | reference | ratio | MFU (spec) | peak memory | status |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for batch in (8, 16, 32):
        ours, ref = _by(rows, f"cli{batch}"), _by(rows, f"nanogpt{batch}")
        if ours is None and ref is None:
            continue
        a, b = (ours or {}).get("tokens_per_s"), (ref or {}).get("tokens_per_s")
        mfu = f"{_fmt((ours or {}).get('mfu_vs_spec'), '.1%')} / {_fmt((ref or {}).get('mfu_vs_spec'), '.1%')}"
        mem = (
            f"{_fmt((ours or {}).get('peak_memory_gb'), '.1f')} / {_fmt((ref or {}).get('peak_memory_gb'), '.1f')} GiB"
        )
        out.append(
            f"| GPT-2 small, bf16, compiled, batch {batch}: CLI fit vs nanoGPT bench.py (tokens/s) | "
            f"{_fmt(a, ',.0f')} | {_fmt(b, ',.0f')} | {_ratio(a, b)} | {mfu} | {mem} | "
            f"{_status(ours)} / {_status(ref)} |"
        )
    for name, label in (("paper", "paper-base"), ("en-es", "translate-en-es")):
        compiled, eager = _by(rows, f"{name}-compiled"), _by(rows, f"{name}-eager")
        if compiled is None and eager is None:
            continue
        a, b = (compiled or {}).get("tokens_per_s"), (eager or {}).get("tokens_per_s")
        first = (compiled or {}).get("first_step_s")
        out.append(
            f"| {label}, compile.yaml vs eager (tokens/s); first optimizer step {_fmt(first, '.0f', '?')} s after "
            f"training starts | {_fmt(a, ',.0f')} | {_fmt(b, ',.0f')} | {_ratio(a, b)} | "
            f"{_fmt((compiled or {}).get('mfu_vs_spec'), '.1%')} | {_fmt((compiled or {}).get('peak_memory_gb'), '.1f')}"
            f" GiB | {_status(compiled)} / {_status(eager)} |"
        )
    preset, bench = _by(rows, "preset"), _by(rows, "cli8")
    if preset is not None:
        a, b = preset.get("median_tokens_per_s"), (bench or {}).get("tokens_per_s")
        out.append(
            f"| gpt2-small preset as shipped (micro-batch 8, accumulate 4), logged tokens/s over "
            f"{preset.get('optimizer_steps', '?')} optimizer steps; last quarter / first quarter "
            f"{_fmt(preset.get('flatness'), '.3f', '?')} | {_fmt(a, ',.0f')} | {_fmt(b, ',.0f')} (benchmark, batch 8) "
            f"| {_ratio(a, b)} | | | {_status(preset)} |"
        )
    for row in (r for r in rows if str(r.get("part", "")).startswith("lever-")):
        a, b = row.get("tokens_per_s"), (bench or {}).get("tokens_per_s")
        out.append(
            f"| lever {row['part'].removeprefix('lever-')}: GPT-2 small batch 8 with it vs without (tokens/s) | "
            f"{_fmt(a, ',.0f')} | {_fmt(b, ',.0f')} | {_ratio(a, b)} | "
            f"{_fmt(row.get('mfu_vs_spec'), '.1%')} | {_fmt(row.get('peak_memory_gb'), '.1f')} GiB | {_status(row)} |"
        )
    for name in ("fsdp", "deepspeed"):
        row = _by(rows, name)
        if row is None:
            continue
        diff = row.get("max_abs_loss_diff")
        out.append(
            f"| {name}.yaml, GPT-2 small: {row.get('steps', '?')} steps, save, resume; resumed losses vs uninterrupted "
            f"(max abs diff) | {_fmt(diff, '.2e', '?')} | | | | {_fmt(row.get('peak_memory_gb'), '.1f')} GiB | "
            f"{_status(row)} |"
        )
    return "\n".join(out)


def latest(report: dict[str, Any], real_only: bool = True) -> dict[str, Any]:
    """The newest run (a real one where there is any; dry runs only show the plumbing)."""
    runs = report["runs"]
    real = [r for r in runs if not r.get("dry_run")] if real_only else runs
    if not (real or runs):
        raise ValueError("the JSON holds no run")
    return (real or runs)[-1]


def replace_between_markers(text: str, block: str, page: str = "the page") -> str:
    """`text` (of `page`) with the block between the gpu-check markers replaced; a refusal naming the page and the
    markers if they are absent."""
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.DOTALL)
    if not pattern.search(text):
        raise BadFileError(
            f"{page} has no {START} ... {END} block to replace: add the two markers where the table belongs"
        )
    return pattern.sub(lambda _: f"{START}\n{block}\n{END}", text)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = command_parser("bench gpu-table", __doc__)
    commands = parser.add_subcommands(dest="command", required=True)
    m = subcommand_parser("meta", "(gpu_check.sh) Write the run's machine facts to a JSON file, as it starts.")
    m.add_argument("out", type=Path, help="the JSON file")
    m.add_argument("--nanogpt", type=Path, required=True, help="the nanoGPT checkout (its commit is recorded)")
    m.add_argument("--dry-run", action="store_true", help="a dry run on a CPU")
    m.add_argument("--command", dest="run_command", type=str, required=True, help="the script's command line")
    commands.add_subcommand("meta", m, help="(gpu_check.sh) write the run's machine facts to a JSON file")
    c = subcommand_parser("collect", "Append the rows of one gpu_check.sh run to the JSON, as one more run.")
    c.add_argument("rows", type=Path, help="the rows (JSON lines)")
    c.add_argument("--meta", type=Path | None, default=None, help="the facts `meta` wrote")
    c.add_argument("--json", type=Path, default=Path("docs/gpu_check.json"), help="the file of runs")
    commands.add_subcommand("collect", c, help="append the rows of one gpu_check.sh run to the JSON")
    t = subcommand_parser("tag", "(gpu_check.sh) Print a part's rows, tagged, one JSON line each.")
    t.add_argument("log", type=Path, help="the part's log")
    t.add_argument("--part", type=str, required=True, help="the part's name")
    t.add_argument("--rc", type=int, required=True, help="its exit status")
    t.add_argument("--box", type=int, required=True, help="its time box (s)")
    t.add_argument("--seconds", type=int, required=True, help="the seconds it ran")
    commands.add_subcommand("tag", t, help="(gpu_check.sh) print a part's rows, tagged, one JSON line each")
    r = subcommand_parser("render", "Print the latest run's table, or write it into a page between its markers.")
    r.add_argument("json", type=Path, help="the file of runs")
    r.add_argument("--readme", type=Path | None, default=None, help="the page whose table is replaced")
    r.add_argument("--include-dry-runs", action="store_true", help="render the newest run even if it is a dry run")
    commands.add_subcommand("render", r, help="print the latest run's table, or write it into a README")
    args = parse(parser, argv)
    name, options = chosen(args)
    if name == "meta":
        options.out.write_text(json.dumps(meta(options.dry_run, options.nanogpt, options.run_command)))
        return
    if name == "tag":
        for row in tag(options.log, options.part, options.rc, options.box, options.seconds):
            print(json.dumps(row), flush=True)
        return
    if name == "collect":
        if not options.rows.is_file():
            raise MissingFileError(f"{options.rows}: no such file (the rows gpu_check.sh's parts printed)")
        runs_file(options.json)
        run = collect(options.rows, options.meta, options.json, command_line("bench gpu-table", argv))
        print(f"{options.json}: run of {run.get('started', '?')} with {len(run['rows'])} rows appended")
        return
    runs = recorded_runs(options.json)
    if not all(isinstance(run.get("rows"), list) for run in runs):
        raise BadFileError(f"{options.json} holds runs without rows: not a file `bench gpu-table collect` wrote")
    if options.readme is not None and not options.readme.is_file():
        raise MissingFileError(f"--readme {options.readme}: no such file")
    block = table(latest({"runs": runs}, real_only=not options.include_dry_runs))
    if options.readme is None:
        print(block)
    else:
        page = f"--readme {options.readme}"
        options.readme.write_text(replace_between_markers(options.readme.read_text(), block, page))
        print(f"{options.readme}: GPU table replaced")
