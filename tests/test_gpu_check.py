"""scripts/gpu_check.sh's plumbing on a CPU: time boxes that end in a row (even for a command that ignores SIGTERM),
a budget that skips what no longer fits, the machine recorded with the run, and the GPU table rendered from the JSON
alone (`bench gpu-table`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lit_transformer.bench import gpu_table

ROOT = Path(__file__).resolve().parents[1]

SAMPLE = {
    "runs": [
        {
            "started": "2026-11-26T20:00:00Z",
            "device": "NVIDIA H100 80GB HBM3",
            "torch": "2.11.0",
            "lightning": "2.6.6",
            "dry_run": False,
            "rows": [
                {"part": "cli8", "status": "ok", "tokens_per_s": 460000.0, "mfu_vs_spec": 0.39, "peak_memory_gb": 20.5},
                {"part": "nanogpt8", "status": "ok", "tokens_per_s": 400000.0, "mfu_vs_spec": 0.33,
                 "peak_memory_gb": 22.0},
                {"part": "cli16", "status": "timeout", "limit_s": 70, "killed": False},
                {"part": "paper-compiled", "status": "ok", "tokens_per_s": 300000.0, "first_step_s": 61.0,
                 "mfu_vs_spec": 0.2, "peak_memory_gb": 30.0},
                {"part": "paper-eager", "status": "ok", "tokens_per_s": 200000.0},
                {"part": "preset", "status": "ok", "median_tokens_per_s": 437000.0, "flatness": 0.99,
                 "optimizer_steps": 200},
                {"part": "fsdp", "status": "ok", "steps": 10, "max_abs_loss_diff": 0.0, "peak_memory_gb": 9.0},
                {"part": "deepspeed", "status": "skipped", "reason": "deepspeed cannot be imported"},
            ],
        },
        {"started": "later", "dry_run": True, "rows": []},
    ]
}  # fmt: skip


def test_the_table_is_rendered_from_the_json_alone(tmp_path: Path) -> None:
    table = gpu_table.table(gpu_table.latest(SAMPLE))  # the newest real run, not the later dry run
    assert "NVIDIA H100 80GB HBM3" in table
    lines = table.splitlines()
    (batch8,) = [line for line in lines if "batch 8:" in line]
    assert "460,000" in batch8 and "400,000" in batch8 and "1.15x" in batch8 and "39.0% / 33.0%" in batch8
    (batch16,) = [line for line in lines if "batch 16:" in line]
    assert "timed out (70 s box)" in batch16 and "not run" in batch16
    (paper,) = [line for line in lines if "paper-base" in line]
    assert "first optimizer step 61 s" in paper and "1.50x" in paper
    (preset,) = [line for line in lines if "preset" in line]
    assert "0.990" in preset and "0.95x" in preset  # 437k against the benchmark's 460k at the same micro-batch
    assert "skipped: deepspeed cannot be imported" in table
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{gpu_table.START}\nold\n{gpu_table.END}\noutro\n")
    path = tmp_path / "gpu_check.json"
    path.write_text(json.dumps(SAMPLE))
    subprocess.run([sys.executable, "-m", "lit_transformer.bench", "gpu-table", "render", str(path), "--readme",
                    str(readme)], check=True, cwd=ROOT)  # fmt: skip
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("outro\n") and "old" not in text and "1.15x" in text
    with pytest.raises(ValueError, match="gpu-check:start"):
        gpu_table.replace_between_markers("no markers", table)


def test_a_part_that_prints_no_row_gets_one_saying_why(tmp_path: Path) -> None:
    log = tmp_path / "part.log"
    log.write_text('noise\n{"part": "x", "label": "measured", "tokens_per_s": 5}\n')
    (row,) = gpu_table.tag(log, "cli8", rc=0, box=60, seconds=12)
    assert row["status"] == "ok" and row["part"] == "cli8" and row["tokens_per_s"] == 5
    log.write_text("Traceback\nRuntimeError: CUDA out of memory\n")
    (row,) = gpu_table.tag(log, "cli8", rc=1, box=60, seconds=3)
    assert row["status"] == "failed" and "out of memory" in row["error"]
    (row,) = gpu_table.tag(log, "cli8", rc=137, box=60, seconds=70)
    assert row["status"] == "timeout" and row["killed"]


def test_the_script_kills_a_part_past_its_box_and_skips_what_the_budget_cannot_fit(tmp_path: Path) -> None:
    """selftest ignores SIGTERM: timeout -k kills it after the grace; cli8 then no longer fits the budget (22 s, less
    the selftest's 2 s box, its 1 s grace and the 1 s kept back, is under cli8's 20 s minimum)."""
    nanogpt = tmp_path / "nanogpt"
    nanogpt.mkdir()
    (nanogpt / "bench.py").write_text("")
    out = tmp_path / "out"
    env = {**os.environ, "ONLY": "selftest cli8", "OUT": str(out), "BUDGET": "22", "GRACE": "1", "MIN_BOX": "20",
           "PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}  # fmt: skip
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(nanogpt), "--dry-run"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = json.loads((out / "gpu_check.json").read_text())["runs"]
    rows = {row["part"]: row for row in run["rows"]}
    assert rows["selftest"]["status"] == "timeout" and rows["selftest"]["killed"], rows
    assert rows["cli8"]["status"] == "skipped", rows
    assert run["dry_run"] and '"part": "selftest"' in done.stdout  # printed as soon as measured
    assert run["machine"]["cpu"] and run["machine"]["logical_cores"] >= 1 and run["machine"]["torch"]
    assert run["command"].startswith("bash scripts/gpu_check.sh ") and run["command"].endswith("--dry-run")
