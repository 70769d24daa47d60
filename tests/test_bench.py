"""The benchmarks as package commands (`python -m lit_transformer bench NAME`) on one harness: a dispatcher that lists
them all without importing Lightning, each with its own --help and the strict parser (exact keys, a mistake answered in
a few lines), the one record writer (machine, command, date; a rerun is one more run of the same file, in every form a
committed file has), the one memory sampler, a benchmark that needs a source checkout refusing elsewhere, nothing
outside bench/ importing it, and scripts/ holding set-up and developer tools only."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from lit_transformer.bench import BENCHMARKS, main
from lit_transformer.errors import UserError
from lit_transformer.records import (
    command_line,
    machine,
    process_rss_mb,
    read_runs,
    run_child,
    spread,
    tree_rss_kb,
    write_run,
)

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
        shown = summary.replace("`", "")[:30]  # help text is plain: no markup
        assert re.search(rf"^\s+{re.escape(name)}\s+{re.escape(shown)}", text, re.MULTILINE), name


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_each_benchmark_has_its_own_help(name: str, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([name, "--help"])
    assert exit_info.value.code == 0
    assert f"python -m lit_transformer bench {name}" in capsys.readouterr().out


def test_an_unknown_benchmark_is_refused_with_the_nearest_name():
    with pytest.raises(UserError, match=r"unknown benchmark 'sped'\. Did you mean 'speed'\?"):
        main(["sped"])


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
        command_line("bench speed", ["--only", "greedy beam"])
        == "python -m lit_transformer bench speed --only 'greedy beam'"
    )


def test_the_process_tree_rss_includes_children():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        for _ in range(50):
            tree = tree_rss_kb(os.getpid())
            if tree.get(child.pid):
                break
            time.sleep(0.1)
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
    stamp = {"command": full["command"], "machine": full["machine"]}
    write_run(path, {"rows": full["rows"]}, **stamp)
    write_run(path, {"rows": [r for r in full["rows"] if r["section"] == "encoder-decoder train step"]}, **stamp)
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

    from lit_transformer.bench.speed import require_peers

    installed = {"transformers", "x_transformers", "onnx", "onnxscript", "onnxruntime"}  # all but litgpt, in any venv
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name in installed else None)
    with pytest.raises(
        UserError, match=r"against litgpt, not installed here\. Install: pip install --no-deps litgpt==0\.5\.13"
    ):
        require_peers(["decoder", "seq2seq"])
    require_peers(["seq2seq", "memory", "lightning"])  # sections that do not build litgpt run
    installed.clear()
    with pytest.raises(
        UserError,
        match=r"against onnx, onnxruntime, onnxscript, transformers, not installed here\. Install: .*bench.*interop",
    ):
        require_peers(["quantized"])


# ---- the one record writer ---------------------------------------------------------------------------------------


def _stamp(cpu: str = "x") -> dict:
    return {"command": "python -m lit_transformer bench speed", "machine": {"cpu": cpu, "date": "2026-01-01T00:00:00Z"}}


def test_the_writer_appends_each_run_with_its_command_machine_and_date(tmp_path: Path):
    path = tmp_path / "out" / "bench.json"
    row = {"section": "s", "contender": "c"}
    write_run(path, {"rows": [{**row, "ratio": 1.0, "median_s": 0.5}]}, **_stamp(), summary=("ratio", "median_s"))
    write_run(path, {"rows": [{**row, "ratio": 3.0, "median_s": 0.25}]}, **_stamp(), summary=("ratio", "median_s"))
    facts = machine()
    run = write_run(path, {"rows": [{**row, "ratio": 2.0, "median_s": 1.0}]}, command="python -m x", machine=facts,
                    summary=("ratio", "median_s"))  # fmt: skip
    data = json.loads(path.read_text())
    assert len(data["runs"]) == 3 and data["runs"][-1] == run
    assert run["command"] == "python -m x" and run["machine"] == facts and run["date"] == facts["date"]
    assert all({"command", "date", "machine", "rows"} <= set(r) for r in data["runs"])
    (summary,) = data["summary"]
    assert summary["ratio"] == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert summary["median_s"]["median"] == 0.5 and spread([4, 1, 2]) == {"median": 2, "min": 1, "max": 4, "n": 3}
    assert read_runs(path) == data["runs"] and not list(path.parent.glob("*.part"))


def test_a_file_an_older_writer_left_as_one_run_becomes_the_first_of_its_runs(tmp_path: Path):
    path = tmp_path / "startup.json"
    old = {"command": "old", "machine": {"cpu": "y"}, "results": {"--help": {"wall_s": 0.1}}}
    path.write_text(json.dumps(old))
    write_run(path, {"results": {"--help": {"wall_s": 0.2}}}, **_stamp())
    first, second = json.loads(path.read_text())["runs"]
    assert first == old and second["results"]["--help"]["wall_s"] == 0.2


def test_a_list_of_runs_and_a_json_lines_file_each_take_one_more(tmp_path: Path):
    listed, lines = tmp_path / "data_memory.json", tmp_path / "main_job.jsonl"
    listed.write_text(json.dumps([{"task": "a", "command": "c", "machine": {"cpu": "x"}}]))
    write_run(listed, {"task": "b"}, **_stamp())
    assert [r["task"] for r in json.loads(listed.read_text())] == ["a", "b"]
    write_run(lines, {"run": "ours", "bpc": 2.0}, **_stamp())
    write_run(lines, {"run": "ours", "bpc": 1.9}, **_stamp())
    rows = [json.loads(line) for line in lines.read_text().splitlines()]
    assert [r["bpc"] for r in rows] == [2.0, 1.9] and rows == read_runs(lines) and rows[0]["date"]


def test_named_records_each_take_their_runs_and_keep_the_others(tmp_path: Path):
    """bench record's fit and test, and genre-baselines' baselines, in one file: each name its own record of runs."""
    path = tmp_path / "genre.json"
    path.write_text(json.dumps({"fit": {"command": "c", "machine": {"cpu": "x"}, "global_step": 5}}))
    write_run(path, {"rows": [1]}, **_stamp(), name="baselines")
    write_run(path, {"global_step": 7}, **_stamp(), name="fit")
    data = json.loads(path.read_text())
    assert [r["global_step"] for r in data["fit"]["runs"]] == [5, 7] and len(data["baselines"]["runs"]) == 1
    assert [r["global_step"] for r in read_runs(path, "fit")] == [5, 7]
    with pytest.raises(UserError, match="holds named records"):
        write_run(path, {"x": 1}, **_stamp())  # a benchmark of one record pointed at a file of named ones
    write_run(tmp_path / "bench.json", {"x": 1}, **_stamp())
    with pytest.raises(UserError, match="not named records"):  # a named record pointed at a file of one benchmark
        write_run(tmp_path / "bench.json", {"x": 2}, **_stamp(), name="fit")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(UserError, match="is not JSON"):
        write_run(tmp_path / "broken.json", {"x": 1}, **_stamp())


def test_a_benchmark_run_on_tiny_settings_appends_a_run_to_its_file(tmp_path: Path, capsys):
    """caption-baseline on 300 training and 40 test strips, twice into one file: two runs, each naming its machine."""
    path = tmp_path / "caption_baseline.json"
    for _ in range(2):
        main(["caption-baseline", "--train", "300", "--test", "40", "--json", str(path)])
    runs = json.loads(path.read_text())["runs"]
    assert len(runs) == 2 and runs[0]["test_strips"] == 40 and 0 <= runs[1]["exact_match"] <= 1
    assert runs[1]["command"] == f"python -m lit_transformer bench caption-baseline --train 300 --test 40 --json {path}"
    assert runs[1]["machine"]["cpu"] and runs[1]["date"]


# ---- the one memory sampler ----------------------------------------------------------------------------------------

HOLD = "import sys, time; block = bytearray(int(sys.argv[1]) * 1_000_000); block[::4096] = b'x' * len(block[::4096]); time.sleep(float(sys.argv[2]))"


def test_the_sampler_reports_a_childs_peak_memory_wall_and_cpu_time():
    done = run_child([sys.executable, "-c", HOLD, "120", "0.6"], interval=0.05)
    assert done.returncode == 0 and not done.exceeded and done.wall_s >= 0.6 and done.cpu_s > 0
    assert done.peak_rss_mb >= 120 and done.peak_tree_mb is not None and done.peak_tree_mb >= 120
    assert len(done.samples) >= 3 and max(mb for _, mb in done.samples) == done.peak_tree_mb


def test_the_sampler_counts_the_tree_and_kills_it_past_a_cap():
    """A child whose own child holds the memory: the tree's sum sees it; past the cap the whole tree is killed."""
    grandchild = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {HOLD!r}, '150', '30'])"
    done = run_child([sys.executable, "-c", grandchild], interval=0.05, cap_mb=100)
    assert done.exceeded and done.returncode != 0 and done.wall_s < 20
    assert done.peak_tree_mb is not None and done.peak_tree_mb > 100


def test_the_sampler_times_without_sampling_when_asked():
    done = run_child([sys.executable, "-c", HOLD, "60", "0"], interval=None)
    assert done.returncode == 0 and done.samples == [] and done.peak_tree_mb is None and done.peak_rss_mb >= 60


def test_the_one_proc_reader_reads_this_process():
    """records.process_rss_mb is the one /proc reader; the engine's memory monitor reads through it."""
    from lit_transformer.engine import monitoring

    assert monitoring.process_rss_mb is process_rss_mb
    now, peak = process_rss_mb(), process_rss_mb(field="VmHWM")
    assert 10 < now <= peak and process_rss_mb(pid=2**22 + 7) is None


# ---- a benchmark that needs a source checkout ----------------------------------------------------------------------


def test_suite_time_sums_each_files_seconds_and_the_suite_hands_out_the_longest_first(tmp_path: Path):
    """`bench suite-time` reads each file's seconds from pytest's JUnit report (a class's tests count for its file);
    the conftest orders the files by them, a file not timed yet first, and keeps each file's own order."""
    import conftest

    from lit_transformer.bench.suite_time import file_seconds

    report = tmp_path / "junit.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_short" name="test_a" time="0.5"/>'
        '<testcase classname="tests.test_long.TestServer" name="test_b" time="2.25"/>'
        '<testcase classname="tests.test_long" name="test_c[x-1.5]" time="1.0"/>'
        '<testcase classname="tests.test_short" name="test_d" time="1.04"/></testsuite></testsuites>'
    )
    seconds = file_seconds(report)
    assert seconds == {"test_long.py": 3.2, "test_short.py": 1.5} and list(seconds) == ["test_long.py", "test_short.py"]

    class Item:
        def __init__(self, name: str, test: str) -> None:
            self.path, self.name = Path("tests") / name, test

    items = [
        Item("test_short.py", "a"),
        Item("test_long.py", "b"),
        Item("test_new.py", "c"),
        Item("test_short.py", "d"),
    ]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(conftest, "FILE_SECONDS", seconds)
        conftest.pytest_collection_modifyitems(items)
    assert [(i.path.name, i.name) for i in items] == [
        ("test_new.py", "c"), ("test_long.py", "b"), ("test_short.py", "a"), ("test_short.py", "d")
    ]  # fmt: skip
    timed = json.loads((ROOT / "tests" / "file_seconds.json").read_text())
    assert "test_readme.py" in timed and all(name.startswith("test_") for name in timed)


def test_suite_time_records_the_hosts_speed_before_and_after_the_suite(tmp_path: Path, monkeypatch, capsys):
    """Each run carries the CPU seconds of a fixed Python loop taken just before and just after the suite: the same
    tests took 12.45 and 8.5 minutes an hour apart on one Xeon, the host's speed having moved. (The suite itself is a
    stand-in here: the run's record is what is checked.)"""
    from lit_transformer.bench import suite_time
    from lit_transformer.records import ChildRun

    loops: list[float] = []

    def loop() -> float:
        loops.append(len(loops) + 0.5)
        return loops[-1]

    def suite(command, *, stdout, **kwargs) -> ChildRun:
        assert loops == [0.5], "the yardstick is taken before the suite"
        stdout.write("3 passed in 1.00s\n")
        return ChildRun(returncode=0, wall_s=1.0, cpu_s=1.5, peak_rss_mb=0.0, peak_tree_mb=None)

    monkeypatch.setattr(suite_time, "python_loop_seconds", loop)
    monkeypatch.setattr(suite_time, "run_child", suite)
    suite_time.main(["--json", str(tmp_path / "suite.json"), "--", "tests/test_model.py"])
    (run,) = json.loads((tmp_path / "suite.json").read_text())["runs"]
    assert run["python_loop_s"] == {"before": 0.5, "after": 1.5} and run["counts"] == {"passed": 3}
    monkeypatch.setattr(suite_time, "LOOP_ADDITIONS", 100_000)
    assert 0 < suite_time.python_loop_seconds() < 5


def test_suite_time_refuses_outside_a_source_checkout_in_one_line(tmp_path: Path):
    """The package alone (as a wheel installs it): `bench suite-time` says it needs a checkout, exit 2, no traceback."""
    import shutil

    shutil.copytree(
        ROOT / "lit_transformer", tmp_path / "lit_transformer", ignore=shutil.ignore_patterns("__pycache__")
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    env.pop("LIT_TRANSFORMER_DEBUG", None)
    done = subprocess.run([sys.executable, "-m", "lit_transformer", "bench", "suite-time", "--json", "x.json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "bench suite-time needs a source checkout" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) <= 2 and not (tmp_path / "x.json").exists()


# ---- one parser for every command: the strict one ------------------------------------------------------------------

MISTAKES = {  # a command and an abbreviation of one of its own flags (argparse would have taken it for the flag)
    "bench startup": ["--round", "2"],
    "bench allocator": ["--round", "2"],
    "bench speed": ["--quic"],
    "bench nanogpt": ["score", "--checkpoin", "x.ckpt"],
    "bench prepare": ["corpus", "--size", "1", "--out", "x.jsonl"],
    "bench data-memory": ["--size", "1"],
    "bench lora": ["--pretrain", "3"],
    "bench serve": ["--client", "1"],
    "bench record": ["--jso", "x.json", "--name", "fit", "--", "fit"],
    "bench suite-time": ["--jso", "x.json"],
    "bench genre-baselines": ["--jso", "x.json"],
    "bench caption-baseline": ["--tes", "5"],
    "bench gpu-parts": ["resume", "--step", "3"],
    "bench gpu-table": ["render", "x.json", "--readm", "y.md"],
    "ablate": ["configs/ablations/smoke.yaml", "--dry"],
    "digit-strips": ["--coun", "3"],
    "translation-recipe": ["--ru", "runs/x", "--config", "base"],
}


def _refusal(argv: list[str], capsys) -> tuple[int, str]:
    from lit_transformer.cli.program import main as program

    with pytest.raises(SystemExit) as exit_info:
        program(argv)
    return exit_info.value.code, capsys.readouterr().err


def test_every_benchmark_and_recipe_is_in_the_table_of_mistakes():
    from lit_transformer.cli.program import COMMANDS

    package = {c.name for c in COMMANDS if not c.target.startswith("lit_transformer.cli.")} - {"bench"}
    assert set(MISTAKES) == {f"bench {name}" for name in BENCHMARKS} | package


@pytest.mark.parametrize("kind", ["abbreviated", "unknown"])
@pytest.mark.parametrize("command", sorted(MISTAKES))
def test_a_mistyped_flag_is_refused_in_a_few_lines_with_status_2(command: str, kind: str, capsys):
    """Keys are exact: an abbreviation is not taken for the flag it starts, an unknown flag is named; either way the
    command ends with status 2 in a few lines, no traceback, and does nothing."""
    argv = [*command.split(), *MISTAKES[command]]
    if kind == "unknown":
        at = next(i for i, a in enumerate(argv) if a.startswith("--") and a != "--")
        argv[at] = "--no_such_flag"
    code, err = _refusal(argv, capsys)
    flag = next(a for a in argv if a.startswith("--") and a != "--")
    assert code == 2 and "Traceback" not in err and 1 <= len(err.strip().splitlines()) <= 4, err
    assert f"unknown key {flag[2:]}" in err, err


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["bench", "speed", "--only", "decodr"], "only: 'decodr' is not one of decoder, seq2seq"),
        (["bench", "startup", "--rounds", "many"], "rounds: expected a positive integer, got 'many' (the flag"),
        (["digit-strips", "--count", "many"], "count: expected a positive integer, got 'many' (the flag --count)"),
        (["bench", "allocator", "--only", "main"], "only: 'main' is not one of main-job, translate-en-es"),
        (["bench", "allocator", "--rounds", "0"], "rounds: expected a positive integer, got '0' (the flag --rounds)"),
        (["bench", "nanogpt", "scor"], "unknown subcommand 'scor'"),
        (["bench", "record", "--json", "x.json", "--name", "fit"], "give it after --, starting with fit"),
        (["digit-strips", "--split", "tst"], "split: 'tst' is not one of train, validation, test"),
    ],
)
def test_a_wrong_value_is_refused_in_a_few_lines(argv: list[str], expect: str, capsys):
    code, err = _refusal(argv, capsys)
    assert code == 2 and expect in err and len(err.strip().splitlines()) <= 4, err


def _no_run(monkeypatch, argv: list[str]) -> None:
    """A benchmark that gets past its checks takes its machine first: here that fails at once, so a check missing
    fails the test in a moment instead of running the benchmark (minutes) to its end."""
    import importlib

    from lit_transformer import records

    def ran(*args, **kwargs):
        raise AssertionError(f"{' '.join(argv)} started its run instead of refusing")

    monkeypatch.setattr(records, "machine", ran)
    module = importlib.import_module(BENCHMARKS[argv[1]][0])
    if hasattr(module, "machine"):
        monkeypatch.setattr(module, "machine", ran)


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["bench", "caption-baseline", "--train", "0", "--test", "0"], "train"),
        (["bench", "caption-baseline", "--train", "-5"], "train"),
        (["bench", "caption-baseline", "--test", "0"], "test"),
        (["bench", "startup", "--rounds", "0"], "rounds"),
        (["bench", "speed", "--reps", "0", "--only", "greedy"], "reps"),
        (["bench", "speed", "--threads", "0", "--only", "greedy"], "threads"),
        (["bench", "speed", "--cli-steps", "0", "--only", "cli"], "cli-steps"),
        (["bench", "speed", "--cli-warmup", "0", "--only", "cli"], "cli-warmup"),
        (["bench", "speed", "--cpu-batches", "8", "0", "--only", "cli"], "cpu-batches"),
        (["bench", "serve", "--clients", "1", "0"], "clients"),
        (["bench", "serve", "--requests_per_client", "0"], "requests_per_client"),
        (["bench", "serve", "--max_new_tokens", "-1"], "max_new_tokens"),
        (["bench", "lora", "--steps", "0"], "steps"),
        (["bench", "lora", "--threads", "0"], "threads"),
        (["bench", "nanogpt", "ours", "--threads", "0"], "threads"),
        (["bench", "prepare", "ours", "--corpus", "c.jsonl", "--tokenizer", "t.json", "--threads", "0"], "threads"),
        (["bench", "data-memory", "--steps", "0"], "steps"),
        (["bench", "gpu-parts", "resume", "--steps", "-1"], "steps"),
    ],
)
def test_a_count_that_must_be_positive_is_refused_before_the_run(argv: list[str], flag: str, monkeypatch, capsys):
    """A count of 0 or less (rounds, repetitions, strips, threads, steps, clients) is refused by the parser, naming
    the flag, instead of a traceback from statistics, sklearn or numpy after the work, or a default run in its place
    (`--reps 0` ran 5 repetitions)."""
    _no_run(monkeypatch, argv)
    code, err = _refusal(argv, capsys)
    value = argv[argv.index(f"--{flag}") + 1 :]
    given = next(v for v in value if v.lstrip("-").isdigit() and int(v) <= 0)
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) <= 4, err
    key = flag.replace("-", "_")  # the parser's key of --cli-steps is cli_steps
    assert f"{key}: expected a positive integer" in err and f"got '{given}'" in err, err
    assert f"(the flag --{flag})" in err, err  # as typed: a dashed flag was shown as --cli_steps


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["bench", "gpu-parts", "resume", "--steps", "1"], "--steps 1: resume saves at step steps // 2"),
        (["bench", "prepare", "train_rss", "--corpus", "c", "--tokenizer", "t", "--steps", "50"], "--steps 50: train_rss"),
        (["bench", "prepare", "pairs_loader_rss", "--corpus", "c", "--tokenizer", "t", "--out", "o", "--batches", "99"],
         "--batches 99: pairs_loader_rss compares the RSS at 100"),
    ],
)  # fmt: skip
def test_a_count_below_what_the_measurement_reads_is_refused(argv: list[str], expect: str, monkeypatch, capsys):
    """resume saves half-way (1 step: no checkpoint); train_rss and pairs_loader_rss report the RSS at 100 (fewer:
    a KeyError after the run)."""
    _no_run(monkeypatch, argv)
    code, err = _refusal(argv, capsys)
    assert code == 2 and expect in err and "Traceback" not in err, err


def test_startup_refuses_a_missing_checkpoint_before_timing(tmp_path: Path, monkeypatch, capsys):
    """`generate 20 tokens` of a checkpoint that is not there failed after every command's warm-up, in a traceback."""
    argv = ["bench", "startup", "--checkpoint", str(tmp_path / "nope.ckpt")]
    _no_run(monkeypatch, argv)
    code, err = _refusal(argv, capsys)
    assert code == 1 and f"--checkpoint {tmp_path / 'nope.ckpt'}: no such file" in err and "Traceback" not in err, err


JSON_OUTPUTS = {  # every benchmark that adds a run to a file: how it is given ({} is the file)
    "genre-baselines": ["--json", "{}"],
    "caption-baseline": ["--json", "{}"],
    "startup": ["--json", "{}"],
    "allocator": ["--json", "{}"],
    "speed": ["--only", "greedy", "--json", "{}"],
    "serve": ["--checkpoint", "model.ckpt", "--json", "{}"],
    "suite-time": ["--json", "{}"],
    "record": ["--json", "{}", "--name", "fit", "--", "fit"],
    "lora": ["--work", "work", "--json", "{}"],
    "nanogpt": ["--json", "{}", "score"],
    "prepare": ["--json", "{}", "ours", "--corpus", "c.jsonl", "--tokenizer", "t.json"],
    "data-memory": ["--out", "{}"],
    "gpu-table": ["collect", "rows.jsonl", "--json", "{}"],
}


@pytest.mark.parametrize("name", sorted(JSON_OUTPUTS))
def test_a_json_output_that_is_a_folder_is_refused_before_the_run(name: str, tmp_path: Path, monkeypatch, capsys):
    """`--json FOLDER` ended genre-baselines' half-minute of work (any benchmark's minutes) in an IsADirectoryError
    from the writer: each refuses it first, naming its flag."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.ckpt").write_bytes(b"x")
    (tmp_path / "rows.jsonl").write_text("")
    (tmp_path / "runs").mkdir()
    argv = ["bench", name, *(a.replace("{}", "runs") for a in JSON_OUTPUTS[name])]
    _no_run(monkeypatch, argv)
    code, err = _refusal(argv, capsys)
    flag = argv[argv.index("runs") - 1]
    assert code == 2 and f"error: {flag} runs is a folder" in err and "Traceback" not in err, err
    assert not (tmp_path / "work").exists()  # lora made no work folder


def test_a_runs_file_is_checked_by_the_writer_itself_without_writing_it(tmp_path: Path):
    """runs_file answers as write_run would at the end of the run, naming the flag, and leaves the file as it was."""
    from lit_transformer.bench.checks import runs_file
    from lit_transformer.errors import BadFileError, ConfigError

    broken, runs, named = tmp_path / "broken.json", tmp_path / "runs.json", tmp_path / "named.json"
    broken.write_text("{not json")
    write_run(runs, {"rows": []}, **_stamp())
    write_run(named, {"rows": []}, name="fit", **_stamp())
    before = {p: p.read_bytes() for p in (broken, runs, named)}
    with pytest.raises(BadFileError, match=rf"^--json {re.escape(str(broken))} is not JSON"):
        runs_file(broken)
    with pytest.raises(BadFileError, match=rf"^--out {re.escape(str(runs))} holds the runs of one benchmark"):
        runs_file(runs, "--out", name="baselines")
    with pytest.raises(BadFileError, match=rf"^--json {re.escape(str(named))}.* holds named records"):
        runs_file(named)
    with pytest.raises(ConfigError, match="a JSON-lines file holds one run a line"):
        runs_file(tmp_path / "x.jsonl", name="fit")
    with pytest.raises(ConfigError, match=rf"{re.escape(str(broken))} is a file, not a folder"):
        runs_file(broken / "sub" / "x.json")
    assert runs_file(runs) == runs and runs_file(named, name="test") == named and runs_file(None) is None
    assert runs_file(tmp_path / "new" / "x.json") == tmp_path / "new" / "x.json" and not (tmp_path / "new").exists()
    assert {p: p.read_bytes() for p in before} == before and sorted(p.name for p in tmp_path.iterdir()) == [
        "broken.json",
        "named.json",
        "runs.json",
    ]


def test_gpu_table_refuses_a_missing_or_malformed_file_naming_it(tmp_path: Path, capsys):
    """render's file of runs, its --readme and collect's rows: a missing one, or JSON that is not, is refused in a
    line that names the file (was a FileNotFoundError or JSONDecodeError traceback), exit 1."""
    broken, good, page = tmp_path / "broken.json", tmp_path / "gpu.json", tmp_path / "page.md"
    broken.write_text('{"runs": [')
    write_run(good, {"rows": []}, **_stamp())
    page.write_text("no markers here\n")
    cases = [
        (["render", str(tmp_path / "nope.json")], f"{tmp_path / 'nope.json'}: no such file"),
        (["render", str(broken)], f"{broken} is not JSON (line 1, column 11"),
        (["render", str(page)], f"{page} is not JSON"),
        (["render", str(good), "--readme", str(tmp_path / "nope.md")], f"--readme {tmp_path / 'nope.md'}: no such file"),
        (["render", str(good), "--readme", str(page)], f"--readme {page} has no <!-- gpu-check:start -->"),
        (["collect", str(tmp_path / "rows.jsonl"), "--json", str(good)], f"{tmp_path / 'rows.jsonl'}: no such file"),
    ]  # fmt: skip
    for argv, expect in cases:
        code, err = _refusal(["bench", "gpu-table", *argv], capsys)
        assert code == 1 and expect in err and "Traceback" not in err and len(err.strip().splitlines()) <= 3, err
    assert page.read_text() == "no markers here\n"


def test_speed_render_refuses_a_missing_file_and_a_run_it_does_not_hold(tmp_path: Path, capsys):
    path = tmp_path / "speed.json"
    write_run(path, {"rows": []}, **_stamp())
    code, err = _refusal(["bench", "speed", "--render", str(tmp_path / "nope.json")], capsys)
    assert code == 1 and f"--render {tmp_path / 'nope.json'}: no such file" in err, err
    code, err = _refusal(["bench", "speed", "--render", str(path), "--run", "3"], capsys)
    assert code == 2 and f"--run 3: {path} holds 1 runs" in err, err


def test_record_finds_a_packaged_config_by_name_as_the_command_line_does(tmp_path: Path, monkeypatch, capsys):
    """`bench record ... -- fit --config presets/tiny` runs the packaged preset from any folder (it ran the parser on
    the bare name: "File does not exist"); the record keeps the command as typed."""
    from types import SimpleNamespace

    from lit_transformer.bench import record_run
    from lit_transformer.cli import lightning_cli
    from lit_transformer.cli.arguments import packaged_configs
    from lit_transformer.engine import host_allocator

    seen = []

    def run_cli():
        seen.append(sys.argv[1:])
        return SimpleNamespace(trainer=SimpleNamespace(callback_metrics={"train/loss": 4.5}, global_step=2))

    monkeypatch.chdir(tmp_path)  # no presets/ here
    monkeypatch.setattr(sys, "argv", ["lit_transformer"])
    monkeypatch.setattr(lightning_cli, "run_cli", run_cli)
    monkeypatch.setattr(lightning_cli, "show_package_info_logs", lambda: None)
    monkeypatch.setattr(host_allocator, "keep_freed_memory", lambda: None)
    monkeypatch.setattr(record_run, "machine", lambda **extra: {"date": "2026-01-01T00:00:00Z", **extra})
    main(
        [
            "record",
            "--json",
            "rec.json",
            "--name",
            "fit",
            "--",
            "fit",
            "--config",
            "presets/tiny",
            "--trainer.max_steps",
            "2",
        ]
    )
    assert seen == [["fit", "--config", str(packaged_configs() / "presets" / "tiny.yaml"), "--trainer.max_steps", "2"]]
    (run,) = read_runs(tmp_path / "rec.json", "fit")
    assert run["cli"] == "python -m lit_transformer fit --config presets/tiny --trainer.max_steps 2"
    assert run["metrics"] == {"train/loss": 4.5} and run["global_step"] == 2


def test_digit_strips_offers_the_corpus_splits():
    import typing

    from lit_transformer.data.corpora.digits import SCAN_SPLITS
    from lit_transformer.recipes import digit_strips

    source = Path(digit_strips.__file__).read_text()
    (choices,) = re.findall(r"type=(Literal\[[^\]]*\])", source)
    assert typing.get_args(eval(choices, {"Literal": typing.Literal})) == tuple(SCAN_SPLITS)


def test_every_command_parses_before_importing_torch():
    """--help of `bench`, of every benchmark and of every recipe answers without importing torch or Lightning."""
    names = [["bench"], *(["bench", n] for n in BENCHMARKS), ["ablate"], ["digit-strips"], ["translation-recipe"]]
    code = (
        "import contextlib, io, sys\nfrom lit_transformer.cli.program import main\n"
        f"for argv in {names!r}:\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        try:\n            main([*argv, '--help'])\n        except SystemExit as e:\n"
        "            assert e.code == 0, (argv, e.code)\n"
        "print(sorted(m for m in ('torch', 'lightning', 'numpy', 'sklearn') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


# ---- bench/ is the benchmarks' own ---------------------------------------------------------------------------------


def test_no_module_outside_bench_imports_it():
    """The user's commands (recipes, the CLI) share the records writer, never a benchmark: bench/ can be left out of
    an install without breaking them. The program names it as a string, `lit_transformer.bench:main`."""
    from test_import_graph import import_graph

    outside = {
        f"{source} -> {target}"
        for source, targets in import_graph().items()
        if not (source == "lit_transformer.bench" or source.startswith("lit_transformer.bench."))
        for target in targets
        if target == "lit_transformer.bench" or target.startswith("lit_transformer.bench.")
    }
    assert not outside, sorted(outside)


def test_the_import_check_sees_a_deferred_import_of_bench(tmp_path: Path):
    from test_import_graph import imported

    path = tmp_path / "ablate.py"
    path.write_text("def main():\n    from lit_transformer.bench import speed\n")
    modules = {"lit_transformer.bench": Path("x"), "lit_transformer.bench.speed": Path("y")}
    assert imported("lit_transformer.recipes.ablate", path, modules) == {"lit_transformer.bench.speed"}


def test_the_source_root_is_computed_once():
    """The benchmarks and recipes find the repository (or the installed package) through records.IMPORT_ROOT."""
    modules = [*(ROOT / "lit_transformer" / "bench").glob("*.py"), *(ROOT / "lit_transformer" / "recipes").glob("*.py")]
    found = [
        str(p.relative_to(ROOT)) for p in modules if re.search(r"__file__\)?\.resolve\(\)\.parents", p.read_text())
    ]
    assert found == []


def test_the_cli_sections_main_job_runs_parse_as_fit_configs_with_their_optimizer_and_batch() -> None:
    """bench speed's main-job runs (Muon's cost beside AdamW, docs/ablations.md) are valid fit command lines that set
    what their labels say."""
    import contextlib

    from lit_transformer.bench.speed import cli_presets
    from lit_transformer.cli.lightning_cli import run_cli

    runs = {k: v for k, v in cli_presets("cpu", [8], 1, 1).items() if k.startswith("main job")}
    assert sorted(runs) == sorted(
        f"main job (modern block), {o}, batch {b}" for b in (8, 16) for o in ("adamw", "muon")
    )
    root = Path(__file__).resolve().parents[1]
    for label, args in runs.items():
        out = io.StringIO()
        with contextlib.chdir(root), contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
            run_cli(["fit", *args, "--print_config"])
        assert done.value.code in (0, None), label
        printed = yaml.safe_load(out.getvalue())
        optimizer, batch = label.split(", ")[1], int(label.rsplit(" ", 1)[1])
        assert printed["model"]["optim"]["optimizer"] == optimizer
        assert printed["data"]["init_args"]["batch_size"] == batch
        assert printed["model"]["config"]["norm"] == "rmsnorm" and printed["model"]["config"]["d_ff"] == 352


def test_the_allocator_benchmarks_runs_parse_as_fit_command_lines_of_their_steps() -> None:
    """bench allocator's runs are valid fit command lines: no validation, no checkpoint, the steps of their label."""
    import contextlib

    from lit_transformer.bench.allocator import QUIET, RUNS
    from lit_transformer.cli.lightning_cli import run_cli

    for label, (config, steps) in RUNS.items():
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
            run_cli(["fit", *config, f"--trainer.max_steps={steps}", *QUIET, "--print_config"])
        assert done.value.code in (0, None), label
        printed = yaml.safe_load(out.getvalue())
        assert printed["trainer"]["max_steps"] == steps and printed["trainer"]["limit_val_batches"] == 0
        assert printed["checkpoint"]["every_n_train_steps"] == 0 and printed["checkpoint"]["save_last"] is False


def test_the_allocator_benchmark_alternates_the_settings_and_pairs_each_round(monkeypatch, tmp_path: Path) -> None:
    """Rounds start with each setting in turn; a ratio is the median of each round's pair, not a ratio of medians."""
    from lit_transformer.bench import allocator
    from lit_transformer.records import ChildRun

    order, walls = [], {"reuse": iter([10.0, 10.0, 30.0]), "glibc": iter([11.0, 12.0, 30.0])}

    def fake_fit(config, steps, setting, folder):
        order.append((steps, setting))
        wall = 1.0 if steps == 2 else next(walls[setting])
        return ChildRun(0, wall, 2 * wall, 100.0 if setting == "glibc" else 105.0, None, system_s=0.5, minor_faults=7)

    monkeypatch.setattr(allocator, "fit", fake_fit)
    figures = allocator.run(["main-job"], rounds=3)
    assert order == [(2, "reuse"), (160, "reuse"), (160, "glibc"), (160, "glibc"), (160, "reuse"), (160, "reuse"),
                     (160, "glibc")]  # fmt: skip
    row = figures["results"]["main-job"]
    assert row["reuse"]["walls_s"] == [10.0, 10.0, 30.0] and row["glibc"]["wall_s"] == 12.0
    assert row["wall_ratio_glibc_over_reuse"] == 1.1 and row["peak_rss_ratio_reuse_over_glibc"] == 1.05
    assert row["reuse"]["minor_faults"] == 7 and row["glibc"]["system_s"] == 0.5


def test_the_allocator_benchmark_refuses_an_allocator_the_users_environment_pins(monkeypatch, capsys) -> None:
    """A MALLOC_*_ variable would leave both settings the same: refused in a few lines before any run starts;
    LIT_TRANSFORMER_MALLOC does not count (each run sets it itself)."""
    from lit_transformer.bench import allocator

    monkeypatch.setattr(allocator, "run", lambda *args: pytest.fail("a run started"))
    monkeypatch.setenv("LIT_TRANSFORMER_MALLOC", "glibc")
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    code, err = _refusal(["bench", "allocator", "--rounds", "1"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 2, err
    assert "bench allocator compares glibc's malloc settings, but here MALLOC_MMAP_THRESHOLD_ is set" in err
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    if os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc"):
        allocator.refuse_a_users_allocator()  # LIT_TRANSFORMER_MALLOC=glibc alone: no refusal


def _fake_fit(folder: Path, log_line: str):
    """A stand-in for nanogpt's timed fit: a fit in a folder that holds an earlier run writes last-v1.ckpt (Lightning's
    next free name), leaving last.ckpt the earlier run's, and names its own final checkpoint in its last line."""

    def timed(command, cwd, env, log):
        (folder / "last-v1.ckpt").write_text("this fit's")
        log.write_text(f"Epoch 0: 100%\n{log_line}\n")
        return 1.5

    return timed


def test_nanogpt_ours_scores_the_checkpoint_its_fit_wrote_not_an_earlier_runs(tmp_path: Path, monkeypatch, capsys):
    """docs/main_job.md: `bench nanogpt ours [-- fit flags]` times a fit, then scored runs/shakespeare/.../last.ckpt
    whatever the fit wrote: after an earlier run in that folder (the README's first command, or the previous setting
    tried with `-- --model.optim.lr ...`), the fit wrote last-v1.ckpt and the JSON line paired its time with the
    earlier run's bits per character."""
    from lit_transformer.bench import nanogpt

    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "runs" / "shakespeare" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "last.ckpt").write_text("an earlier run's")
    old = time.time() - 3600
    os.utime(folder / "last.ckpt", (old, old))
    line = "checkpoints: final runs/shakespeare/checkpoints/last-v1.ckpt, best: none yet (no validation ran)"
    scored = []
    monkeypatch.setattr(nanogpt, "timed", _fake_fit(folder, line))
    monkeypatch.setattr(nanogpt, "score_checkpoint", lambda path: scored.append(path) or {"bpc": 2.0})
    monkeypatch.setattr(nanogpt, "machine", lambda: {})
    nanogpt.main(["--json", str(tmp_path / "runs.jsonl"), "ours", "--threads", "1", "--", "--model.optim.lr", "5e-3"])
    assert scored == ["runs/shakespeare/checkpoints/last-v1.ckpt"]
    # a --checkpoint the fit did not write (the earlier run's last.ckpt) is refused, naming the one it wrote
    argv = ["--json", str(tmp_path / "runs.jsonl"), "ours", "--checkpoint", str(folder / "last.ckpt")]
    with pytest.raises(
        UserError, match="was not written by the fit just timed .* wrote runs/shakespeare/checkpoints/last-v1.ckpt"
    ):
        nanogpt.main(argv)
    assert scored == ["runs/shakespeare/checkpoints/last-v1.ckpt"]
