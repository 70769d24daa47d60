"""The benchmarks as package commands (`python -m lit_transformer bench NAME`): a dispatcher that lists them all
without importing Lightning, each with its own --help, the one machine helper every JSON records, reruns kept as runs
of one file, and scripts/ holding set-up and developer tools only."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lit_transformer.bench import BENCHMARKS, main
from lit_transformer.records import add_run, command_line, machine, spread, tree_rss_kb

ROOT = Path(__file__).resolve().parents[1]


def test_bench_help_lists_every_benchmark_without_importing_lightning():
    code = (
        "import sys\nfrom lit_transformer.bench import main\ntry:\n    main(['--help'])\nexcept SystemExit as e:\n"
        "    assert e.code == 0, e.code\nprint(sorted(m for m in ('lightning', 'torchmetrics', 'torch') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    *help_lines, imported = done.stdout.strip().splitlines()
    assert json.loads(imported.replace("'", '"')) == []  # neither Lightning, torchmetrics nor torch
    text = "\n".join(help_lines)
    assert "python -m lit_transformer bench" in text
    for name, (_, summary) in BENCHMARKS.items():
        assert re.search(rf"^\s+{re.escape(name)}\s+{re.escape(summary[:30])}", text, re.MULTILINE), name


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_each_benchmark_has_its_own_help(name: str, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([name, "--help"])
    assert exit_info.value.code == 0
    assert f"python -m lit_transformer bench {name}" in capsys.readouterr().out


def test_an_unknown_benchmark_is_refused_with_the_names(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["sped"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'sped'" in err and "speed" in err


def test_the_module_runs_as_the_bench_command():
    done = subprocess.run([sys.executable, "-m", "lit_transformer.bench", "gpu-table", "--help"], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)  # fmt: skip
    assert done.returncode == 0 and "collect" in done.stdout and "render" in done.stdout


def test_the_machine_names_cpu_cores_gpus_memory_versions_commit_and_date():
    facts = machine(threads=3)
    assert facts["cpu"] and facts["cpu"] != "unknown"
    assert facts["logical_cores"] >= 1 and facts["gpu_count"] == len([facts["gpu"]] if facts["gpu"] else [])
    assert facts["memory_gb"] > 0 and facts["torch"] and facts["lightning"] and facts["python"]
    assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", facts["commit"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", facts["date"])
    assert len(facts["load_average_before"]) == 3 and facts["threads"] == 3
    assert (
        command_line("speed", ["--only", "greedy beam"]) == "python -m lit_transformer bench speed --only 'greedy beam'"
    )


def test_a_rerun_is_one_more_run_in_the_same_file_with_median_and_spread(tmp_path: Path):
    path = tmp_path / "bench.json"
    row = {"section": "s", "contender": "c"}
    path.write_text(json.dumps({"machine": {"cpu": "x"}, "rows": [{**row, "ratio": 1.0, "median_s": 0.5}]}))
    add_run(path, {"machine": {"cpu": "x"}, "rows": [{**row, "ratio": 3.0, "median_s": 0.25}]})
    data = add_run(path, {"machine": {"cpu": "x"}, "rows": [{**row, "ratio": 2.0, "median_s": 1.0}]})
    assert json.loads(path.read_text()) == data and len(data["runs"]) == 3  # the older one-run file became run 0
    (summary,) = data["summary"]
    assert summary["ratio"] == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert summary["median_s"]["median"] == 0.5 and spread([4, 1, 2]) == {"median": 2, "min": 1, "max": 4, "n": 3}


def test_the_process_tree_rss_includes_children():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        import os

        for _ in range(50):
            tree = tree_rss_kb(os.getpid())
            if tree.get(child.pid):
                break
            __import__("time").sleep(0.1)
        assert tree[os.getpid()] > 0 and tree[child.pid] > 0
    finally:
        child.kill()
        child.wait()


def test_scripts_holds_setup_and_developer_tools_only_and_nothing_edits_sys_path():
    assert sorted(p.name for p in (ROOT / "scripts").iterdir()) == ["gpu_check.sh", "setup.sh"]
    edit = "sys.path." + "insert"  # spelled apart so this file does not match itself
    sources = [*(ROOT / "lit_transformer").rglob("*.py"), *(ROOT / "scripts").iterdir()]
    assert [str(p.relative_to(ROOT)) for p in sources if edit in p.read_text()] == []


def test_every_benchmark_json_under_docs_names_its_machine():
    """A figure is only comparable on its own machine: every run record under docs/ carries a `machine` object (and
    where it was recovered afterwards, where from)."""
    missing = []
    for path in sorted([*(ROOT / "docs").rglob("*.json"), *(ROOT / "docs").rglob("*.jsonl")]):
        text = path.read_text()
        records = (
            [json.loads(line) for line in text.splitlines() if line.strip()]
            if path.suffix == ".jsonl"
            else [json.loads(text)]
        )
        for record in records:
            if not any(isinstance(m, dict) and "cpu" in m for m in _machines(record)):
                missing.append(str(path.relative_to(ROOT)))
    assert missing == []


def _machines(data: object) -> list[object]:
    found, stack = [], [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            found += [item["machine"]] if "machine" in item else []
            stack.extend(v for k, v in item.items() if k != "machine")
        elif isinstance(item, list):
            stack.extend(item)
    return found


def test_speed_renders_any_run_of_a_file_of_several(capsys, tmp_path: Path):
    """A file of a full run and a rerun of one section (as `--only` writes it): --render --run N prints run N."""
    full = json.loads((ROOT / "docs" / "benchmark.json").read_text())["runs"][0]
    path = tmp_path / "benchmark.json"
    add_run(path, full)
    add_run(path, {**full, "rows": [r for r in full["rows"] if r["section"] == "encoder-decoder train step"]})
    main(["speed", "--render", str(path), "--run", "1"])
    rerun = capsys.readouterr().out
    main(["speed", "--render", str(path)])
    first = capsys.readouterr().out
    assert "encoder-decoder train step" in rerun and "beam search" not in rerun  # the rerun's section only
    assert "beam search" in first and "decoder-only train step" in first


def test_speed_refuses_a_missing_peer_before_timing_anything(monkeypatch):
    """A peer that is not installed stops `bench speed` at once with the line that installs it, not after minutes of
    timing with a traceback from deep inside a section."""
    import importlib.util

    from lit_transformer.bench import peers
    from lit_transformer.errors import UserError

    installed = {"transformers", "x_transformers", "onnx", "onnxscript", "onnxruntime"}  # all but litgpt, in any venv
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name in installed else None)
    with pytest.raises(
        UserError, match=r"against litgpt, not installed here\. Install: pip install --no-deps litgpt==0\.5\.13"
    ):
        peers.require_peers(["decoder", "seq2seq"])
    peers.require_peers(["seq2seq", "memory", "lightning"])  # sections that do not build litgpt run
    installed.clear()
    with pytest.raises(
        UserError,
        match=r"against onnx, onnxruntime, onnxscript, transformers, not installed here\. Install: .*bench.*interop",
    ):
        peers.require_peers(["quantized"])
