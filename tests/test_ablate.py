"""`python -m lit_transformer ablate` (lit_transformer/recipes/ablate.py): every shipped grid expands to valid commands, and a
tiny grid runs end to end, resumably, each run recording its machine."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _forked import HARNESS_ENV, warm_python

from lit_transformer.recipes import ablate

ROOT = Path(__file__).resolve().parents[1]
GRIDS = sorted((ROOT / "configs" / "ablations").glob("*.yaml"))


@pytest.fixture
def forked_runs(monkeypatch) -> None:
    """ablate's processes (each run's `python -m lit_transformer fit ...`, the timing child `python -c ...`) forked
    from a warm interpreter instead of started fresh: its subprocess.run of a Python command forks. ablate hands its
    children this process's environment with its threads a run, here HARNESS_ENV's: on 2 cores (one thread a run)
    the suite's own warm interpreter serves them."""
    for key, value in HARNESS_ENV.items():
        monkeypatch.setenv(key, value)
    plain_run = subprocess.run

    def run(args, *, stdout=None, stderr=None, capture_output=False, text=False, env=None, **rest):
        if rest or list(args[:1]) != [sys.executable]:
            return plain_run(args, stdout=stdout, stderr=stderr, capture_output=capture_output, text=text, env=env,
                             **rest)  # fmt: skip
        python = warm_python(os.environ if env is None else env)
        if capture_output:
            return python.run(args, Path.cwd(), env, text=text)
        process = python.popen(args, Path.cwd(), env, stdout=stdout, stderr=stderr)
        return subprocess.CompletedProcess(args, process.wait())

    monkeypatch.setattr(ablate.subprocess, "run", run)


@pytest.mark.parametrize("path", GRIDS, ids=lambda p: p.name)
def test_every_grid_expands_to_fit_commands_on_existing_configs(path: Path, tmp_path: Path):
    grid = ablate.Grid.load(path)
    runs = grid.runs(tmp_path, extra=[])
    assert len(runs) == len(grid.cells) * len(grid.seeds) > 0
    for run in runs:
        argv = run.command("fit")
        assert argv[1:4] == ["-m", "lit_transformer", "fit"]
        configs = [argv[i + 1] for i, token in enumerate(argv) if token == "--config"]
        assert configs and all((ROOT / c).exists() or Path(c).exists() for c in configs), configs
        assert f"--seed_everything {run.seed}" in " ".join(argv)
        assert str(run.folder / "checkpoints") in argv
    # Two cells that ran the same flags would be a wasted (or mislabelled) row.
    assert len({tuple(flags) for flags in grid.cells.values()}) == len(grid.cells)


@pytest.mark.parametrize(
    ("spec", "flags"),
    [
        ({"model.config.n_heads": 1}, ["--model.config.n_heads", "1"]),
        (
            {"model.schedule": "constant", "trainer.logger": False},
            ["--model.schedule", "constant", "--trainer.logger", "false"],
        ),
        (["--model.lr 1e-3", "--seed_everything=2"], ["--model.lr", "1e-3", "--seed_everything=2"]),
        (None, []),
    ],
)
def test_cells_accept_a_mapping_or_flag_strings(spec, flags):
    assert ablate.to_flags(spec) == flags


def test_a_file_without_cells_is_refused(tmp_path: Path):
    path = tmp_path / "fragment.yaml"
    path.write_text("model:\n  lr: 1.0\n")
    with pytest.raises(ValueError, match="cells"):
        ablate.Grid.load(path)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([1.0, 3.0], "2.00 ± 1.41"),
        ([2.0], "2.00"),
        ([None], "–"),
        ([math.nan, 4.0], "4.00 (1/2 diverged)"),
        ([math.inf], "diverged"),
    ],
)
def test_summary_is_mean_and_spread_and_counts_divergence(values, expected):
    assert ablate.summarize(values, 2) == expected


def test_dry_run_prints_commands_and_runs_nothing(tmp_path: Path, capsys):
    assert (
        ablate.ablate([str(ROOT / "configs/ablations/smoke.yaml"), "--out", str(tmp_path), "--dry-run", "--jobs", "2"])
        == 0
    )
    out = capsys.readouterr().out
    assert out.count("-m lit_transformer fit") == 2 and "OMP_NUM_THREADS=1" in out
    assert not any(tmp_path.iterdir())


def test_a_tiny_grid_runs_tabulates_plots_and_skips_finished_cells(tmp_path: Path, capsys, forked_runs):
    grid = str(ROOT / "configs/ablations/smoke.yaml")
    ablate.main([grid, "--out", str(tmp_path), "--jobs", "2"])  # returns: no run failed
    table = (tmp_path / "results.md").read_text()
    for cell in ("post-ln", "pre-ln"):
        (row,) = [line for line in table.splitlines() if line.startswith(f"| {cell} |")]
        assert row.split("|")[2].strip() == "1"  # one seed read back from the event files
        assert (tmp_path / cell / "seed-1" / "fit.done").exists()
    assert (tmp_path / "val_loss.png").read_bytes().startswith(b"\x89PNG")
    rows = json.loads((tmp_path / "results.json").read_text())
    assert {r["cell"] for r in rows} == {"post-ln", "pre-ln"}
    for row in rows:  # two validations (every 5 of 10 steps), the table's number being the last
        assert len(row["curves"]["val/loss"]) == 2 and row["val/loss"] == row["curves"]["val/loss"][-1][1]
        assert math.isfinite(row["val/loss"]) and row["wall_s"] > 0
        assert row["machine"]["cpu"] and row["machine"]["logical_cores"] >= 1 and row["machine"]["threads"] >= 1
        assert " fit " in row["cli"] and "command" not in row and row["machine"]["torch"] and row["machine"]["date"]

    capsys.readouterr()
    assert ablate.ablate([grid, "--out", str(tmp_path), "--jobs", "2"]) == 0
    assert "2 of 2 runs already finished; running 0" in capsys.readouterr().out
    for cell in ("post-ln", "pre-ln"):
        timings = (tmp_path / cell / "seed-1" / "timings.jsonl").read_text().splitlines()
        assert len(timings) == 1  # the second invocation started no process
        (timing,) = map(json.loads, timings)  # one run, as the one record writer writes it
        assert timing["stage"] == "fit" and timing["returncode"] == 0 and timing["date"] == timing["machine"]["date"]


@pytest.mark.parametrize("path", GRIDS, ids=lambda p: p.name)
def test_every_cell_parses_as_a_fit_config(path: Path, capsys):
    """Every key a grid sets exists and every value lies inside its choices: all cells' flags parsed in one go, every
    cell's configs before every cell's other flags (fit refuses a flag a later config sets again: smoke.yaml's post-ln
    flag sets the key pre-ln's config does)."""
    import yaml

    from lit_transformer.cli.arguments import without_overridden
    from lit_transformer.cli.lightning_cli import run_cli

    grid = ablate.Grid.load(path)
    args = ablate.Grid.runs(grid, Path("/tmp/ablate-parse"), extra=[])[0].command("fit")[4:]
    pairs: list[list[str]] = []  # each flag with its value: "--key value", or "--key=value" alone
    for tokens in map(list, grid.cells.values()):
        while tokens:
            flag = tokens.pop(0)
            pairs.append([flag] if "=" in flag else [flag, tokens.pop(0)])
    configs = [t for pair in pairs if pair[0] in ("--config", "-c") for t in pair]
    args = without_overridden(args + configs + [t for pair in pairs if pair[0] not in ("--config", "-c") for t in pair])
    with pytest.raises(SystemExit) as exit_info:
        run_cli(["fit", *args, "--print_config"])
    assert exit_info.value.code in (0, None), capsys.readouterr().err[-2000:]
    config = yaml.safe_load(capsys.readouterr().out)
    assert config["checkpoint"]["dirpath"].endswith("checkpoints")
    if "ablations/base/en-es-cpu.yaml" in " ".join(args):  # the CPU budget wins over the preset it follows
        assert config["data"]["init_args"]["vocab_size"] == 4000


def test_evaluate_scores_the_last_checkpoint_at_each_context_and_records_a_refusal(tmp_path: Path, monkeypatch):
    """`evaluate: [N, ...]` adds one `validate` per N from last.ckpt with blocks of N tokens; a model that cannot take
    N (learned positions past max_seq_len) is recorded as "cannot extrapolate", not as a failed run."""
    path = tmp_path / "grid.yaml"
    path.write_text("base: [configs/base.yaml]\nevaluate: [128, 512]\ncells:\n  rope: {model.config.positions: rope}\n")
    grid = ablate.Grid.load(path)
    (run,) = grid.runs(tmp_path / "out", extra=[])
    assert run.stages() == ["fit", "eval-128", "eval-512"]
    argv = run.command("eval-512")
    assert argv[3] == "validate" and argv[-4:] == [
        "--ckpt_path",
        str(run.last_checkpoint),
        f"--{ablate.EVAL_FLAG}",
        "512",
    ]
    assert '"version": "eval-512"' in " ".join(argv)  # its own TensorBoard folder
    script = "import sys; print('ValueError: ... learned positions cannot extrapolate'); sys.exit(1)"
    monkeypatch.setattr(ablate.Run, "command", lambda self, stage: [sys.executable, "-c", script])
    assert run.execute("eval-512", {}) == 0 and run.refused("eval-512") and run.stages() == ["fit", "eval-128"]
    monkeypatch.setattr(ablate.Run, "command", lambda self, stage: [sys.executable, "-c", "raise SystemExit(3)"])
    assert run.execute("eval-128", {}) == 3 and not run.done("eval-128")  # any other failure stays a failure
    row = ablate.run_results(run)
    assert row["eval"] == {"128": None, "512": ablate.REFUSED}
    table = ablate.markdown_table(grid, [row])
    assert "| rope | – | cannot extrapolate |" in table


def test_a_failed_run_makes_the_command_exit_1_after_reporting(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(ablate.Run, "command", lambda self, stage: [sys.executable, "-c", "raise SystemExit(3)"])
    grid = str(ROOT / "configs/ablations/smoke.yaml")
    with pytest.raises(SystemExit) as exit_info:
        ablate.main([grid, "--out", str(tmp_path), "--jobs", "1"])
    assert exit_info.value.code == 1 and (tmp_path / "results.md").exists()


def test_a_fit_stopped_by_a_signal_is_not_finished_and_resumes(tmp_path: Path, monkeypatch):
    """Ctrl-C (or a preemption's SIGTERM) makes fit save last.ckpt and exit 0: ablate marked the stopped run done, so
    "run the same command again to resume" skipped it for good and tabulated a run of a few steps beside finished
    ones. It is a stop now: no fit.done, and the next invocation resumes it from last.ckpt."""
    grid = ablate.Grid.load(ROOT / "configs/ablations/smoke.yaml")
    run = grid.runs(tmp_path, extra=[])[0]
    saved = run.last_checkpoint
    script = (
        f"import pathlib, sys; p = pathlib.Path({str(saved)!r}); p.parent.mkdir(parents=True); p.write_bytes(b'x');"
        f"print('Received SIGINT: saved {saved} at step 23; exiting.', file=sys.stderr)"
    )
    monkeypatch.setattr(ablate.Run, "command", lambda self, stage: [sys.executable, "-c", script])
    assert run.execute("fit", {}) == 130 and not run.done("fit") and run.stages() == ["fit"]
    monkeypatch.setattr(ablate.Run, "command", lambda self, stage: [sys.executable, "-c", "print('done')"])
    assert run.execute("fit", {}) == 0 and run.done("fit")  # the resumed run that ends is finished (the log kept both)


def test_runs_that_ran_with_other_flags_are_refused_rather_than_tabulated(tmp_path: Path, monkeypatch, capsys):
    """docs/ablations.md's `--seeds 1 --cells heads-1 heads-8 -- --trainer.max_steps 50`, then the whole grid: the
    50-step runs had fit.done, were skipped, and their numbers went into the grid's table (mean and spread over seeds
    mixing 50 and 600 steps), silently. A run that began with other flags is refused, naming them."""
    grid = str(ROOT / "configs/ablations/smoke.yaml")
    plain_run = subprocess.run

    def fits(argv, **kw):  # each fit "runs" at once; the machine's facts (git) as before
        return subprocess.CompletedProcess(argv, 0) if "lit_transformer" in argv[:3] else plain_run(argv, **kw)

    monkeypatch.setattr(ablate.subprocess, "run", fits)
    monkeypatch.setattr(ablate, "report", lambda *args: None)
    assert ablate.ablate([grid, "--out", str(tmp_path), "--cells", "post-ln", "--", "--trainer.max_steps", "5"]) == 0
    assert (tmp_path / "post-ln" / "seed-1" / "fit.done").exists()
    with pytest.raises(ablate.ConfigError, match=r"smoke/post-ln/seed-1 ran with `--trainer.max_steps 5`"):
        ablate.ablate([grid, "--out", str(tmp_path)])
    with pytest.raises(ablate.ConfigError, match=r"ran with `5` where this command has `7`"):
        ablate.ablate([grid, "--out", str(tmp_path), "--", "--trainer.max_steps", "7"])
    capsys.readouterr()
    assert ablate.ablate([grid, "--out", str(tmp_path), "--", "--trainer.max_steps", "5"]) == 0  # the same: resumed
    assert "1 of 2 runs already finished; running 1" in capsys.readouterr().out


def test_a_cell_with_a_typo_is_refused_before_any_run_starts(tmp_path: Path, monkeypatch):
    """A typo'd key in a grid's second cell failed only when that cell's fit ran, after the first cell's runs (hours
    into a real grid at --jobs 1), and the report left the cell out. Every cell's flags are parsed as fit parses them
    before anything runs; the refusal names the grid and the cell."""
    path = tmp_path / "grid.yaml"
    path.write_text(
        "base: [presets/tiny]\nseeds: [1]\ncells:\n  heads-2: {model.config.n_heads: 2}\n"
        "  heads-typo: {model.config.n_headz: 2}\n"
    )
    started, plain_run = [], subprocess.run

    def fits(argv, **kw):  # a fit "runs" at once, and is counted; the machine's facts (git) as before
        if "lit_transformer" not in argv[:3]:
            return plain_run(argv, **kw)
        started.append(argv)
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(ablate.subprocess, "run", fits)
    monkeypatch.setattr(ablate, "report", lambda *args: None)
    with pytest.raises(ablate.ConfigError, match=r"cell 'heads-typo': unknown key model.config.n_headz") as refused:
        ablate.ablate([str(path), "--out", str(tmp_path / "out")])
    assert str(path) in str(refused.value) and "Did you mean model.config.n_heads" in str(refused.value)
    assert not started


def test_a_subset_of_cells_or_seeds_reports_the_whole_grid(tmp_path: Path, monkeypatch):
    """`ablate GRID --cells post-ln` (docs/ablations.md's way to rerun a few cells) rewrote results.md and results.json
    with that cell's runs alone, dropping the finished cells' rows; `--seeds 2` dropped seed 1's. The report covers
    every cell of the grid and every seed run so far."""
    grid = str(ROOT / "configs/ablations/smoke.yaml")
    plain_run = subprocess.run
    monkeypatch.setattr(ablate.subprocess, "run", lambda argv, **kw: subprocess.CompletedProcess(argv, 0)
                        if "lit_transformer" in argv[:3] else plain_run(argv, **kw))  # fmt: skip
    reported = []
    monkeypatch.setattr(ablate, "report", lambda grid, runs, out: reported.append({(r.cell, r.seed) for r in runs}))
    assert ablate.ablate([grid, "--out", str(tmp_path), "--cells", "post-ln", "--seeds", "2"]) == 0
    assert reported == [{("post-ln", 1), ("post-ln", 2), ("pre-ln", 1), ("pre-ln", 2)}]


def test_the_command_has_its_own_help():
    done = subprocess.run([sys.executable, "-m", "lit_transformer.recipes.ablate", "--help"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)  # fmt: skip
    assert done.returncode == 0 and "python -m lit_transformer ablate" in done.stdout and "--dry-run" in done.stdout


def test_time_steps_prints_each_cells_step_time_and_the_steps_that_fit_the_bases_budget(
    tmp_path: Path, capsys, monkeypatch
):
    """`--time-steps N` times the base configs alone (no overrides) and each cell (its first seed), and turns the
    ratio into each cell's steps at the base's budget, rounded down to a hundred; nothing else runs."""
    seconds = {"base": 0.060, "modern_block": 0.0666, "muon": 0.090, "all_together": 0.120}
    commands: dict[str, list[str]] = {}

    def fake(command: list[str], env: dict) -> float:
        folder = Path(command[command.index("--trainer.default_root_dir") + 1]).name
        commands[folder] = command
        return seconds.get(folder, 0.060)

    monkeypatch.setattr(ablate, "measure_step", fake)
    grid = str(ROOT / "configs/ablations/frontier.yaml")
    cells = ["--cells", "modern block", "muon", "all together"]
    assert ablate.ablate([grid, "--out", str(tmp_path), "--time-steps", "40", "--threads", "1", *cells]) == 0
    out = capsys.readouterr().out
    assert "The base's budget: 5000 steps (the trainer.max_steps of its configs alone" in out
    assert "at 60.0 ms = 300 s of training" in out
    assert "| muon | 90.0 | 1.50 | 3300 | `--trainer.max_steps 3300 --trainer.val_check_interval 3300` |" in out
    assert "| modern block | 66.6 | 1.11 | 4500 |" in out and "| all together | 120.0 | 2.00 | 2500 |" in out
    base = commands["base"]
    assert base[3:5] == ["8", "40"] and "--config" in base and not any("rmsnorm" in token for token in base)
    muon = commands["muon"]
    assert any(token.endswith("variants/muon.yaml") for token in muon) and any("rmsnorm" in t for t in muon)
    assert muon[muon.index("--trainer.max_steps", muon.index("--trainer.limit_val_batches")) + 1] == "49"
    record = json.loads((tmp_path / "step_times.json").read_text())
    assert [r["cell"] for r in record["rows"]] == ["base", "modern block", "muon", "all together"]
    assert record["base_max_steps"] == 5000 and record["machine"]["threads"] == 1
    assert not (tmp_path / "muon").exists()  # no run folder: nothing was trained


@pytest.mark.slow
def test_time_steps_runs_real_timing_processes(tmp_path: Path, capsys, forked_runs):
    ablate.main([str(ROOT / "configs/ablations/smoke.yaml"), "--out", str(tmp_path), "--time-steps", "2",
                 "--threads", "1", "--cells", "pre-ln"])  # fmt: skip
    rows = json.loads((tmp_path / "step_times.json").read_text())["rows"]
    assert [r["cell"] for r in rows] == ["base", "pre-ln"] and all(0 < r["step_s"] < 60 for r in rows)
    assert "| pre-ln |" in capsys.readouterr().out


def test_a_language_modelling_grid_tabulates_validation_bits_per_character(tmp_path: Path):
    """The main job's figure (val/bpc, which language modelling logs) gets its column, mean ± spread over seeds."""
    grid = ablate.Grid.load(ROOT / "configs/ablations/frontier.yaml")
    rows = []
    machine = {"cpu": "AMD EPYC", "logical_cores": 2, "gpu": None, "gpu_count": 0}
    for seed, bpc in ((1, 1.80), (2, 1.84)):
        row = {tag: None for _, _, tag, _ in ablate.COLUMNS} | {"cell": "muon", "seed": seed, "wall_s": 60.0}
        rows.append(row | {"val/loss": 4.0, "val/bpc": bpc, "eval": {}, "machine": machine})
    table = ablate.markdown_table(grid, rows)
    header = next(line for line in table.splitlines() if line.startswith("| cell |"))
    assert "val bpc" in header and "val BLEU" not in header
    (muon,) = [line for line in table.splitlines() if line.startswith("| muon |")]
    assert "1.820 ± 0.028" in muon
    # the page names its machine (results.json had it, results.md did not), and every machine when runs differ
    assert "Machine: AMD EPYC, 2 logical cores, no GPU" in table
    rows[1]["machine"] = machine | {"cpu": "Intel Xeon", "gpu": "NVIDIA H100", "gpu_count": 1}
    assert "Machines: AMD EPYC, 2 logical cores, no GPU; Intel Xeon, 2 logical cores, 1 x NVIDIA H100" in (
        ablate.markdown_table(grid, rows)
    )


def test_a_grid_found_nowhere_is_named_as_a_grid_with_the_nearest_packaged_one(tmp_path, monkeypatch):
    """ablate's grids are positional files: a missing one was refused as "--config NAME", a flag never given."""
    from lit_transformer.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="^grid frontir: no such file here") as refused:
        ablate.main(["frontir", "--dry-run"])
    assert "did you mean ablations/frontier?" in refused.value.hint


def test_a_cells_config_that_changes_an_override_wins_and_fit_accepts_the_command(tmp_path: Path):
    """A cell's variant config comes after the grid's overrides, so where it sets one of their keys it wins (as
    jsonargparse reads arguments in order). fit refuses a flag a later config sets again, so the composed command
    leaves the dead override out: the same run."""
    from lit_transformer.cli.arguments import check_flag_order

    (tmp_path / "longer.yaml").write_text("trainer:\n  max_steps: 4\n")
    (tmp_path / "grid.yaml").write_text(
        "base: [configs/presets/tiny.yaml]\n"
        "overrides: [--trainer.max_steps 3, --trainer.val_check_interval 3]\n"
        f"cells:\n  short: []\n  longer: [--config {tmp_path / 'longer.yaml'}]\n"
    )
    grid = ablate.Grid.load(tmp_path / "grid.yaml")
    commands = {run.cell: run.command("fit")[4:] for run in grid.runs(tmp_path / "out", extra=[])}
    assert "--trainer.max_steps" in commands["short"] and "--trainer.max_steps" not in commands["longer"]
    for argv in commands.values():
        check_flag_order(argv)
        assert "--trainer.val_check_interval" in argv


def test_an_unknown_cell_is_refused_before_the_finished_table_is_rewritten(tmp_path: Path):
    """`--cells nope` kept no cell, printed "0 of 0 runs already finished" and rewrote results.md and results.json as
    empty tables over the finished ones; now it is refused, naming the grid's cells (the nearest first)."""
    from lit_transformer.errors import ConfigError

    (tmp_path / "results.md").write_text("the finished table\n")
    grid = str(ROOT / "configs/ablations/smoke.yaml")
    with pytest.raises(ConfigError, match=r"^--cells pre_lm: no such cell in .*smoke\.yaml") as refused:
        ablate.ablate([grid, "--out", str(tmp_path), "--cells", "pre-ln", "pre_lm", "--report-only"])
    assert refused.value.hint == "Its cells, the nearest first: pre-ln, post-ln"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.md"]
    assert (tmp_path / "results.md").read_text() == "the finished table\n"


@pytest.mark.parametrize(
    ("cells", "message"),
    [
        ('"heads 2": {model.config.n_heads: 2}\n  heads/2: {model.config.n_heads: 1}', "'heads 2' and 'heads/2'"),
        ('"..": {model.config.n_heads: 1}', r"cell '\.\.' makes no folder of its own"),
        ("results.md: {}", "a file ablate writes"),
    ],
    ids=["one folder", "outside the grid", "over the table"],
)
def test_cells_without_a_folder_of_their_own_are_refused(tmp_path: Path, cells: str, message: str):
    """Cell names were made folder names without a check: `heads 2` and `heads/2` both ran in heads_2/, so one fit
    stood for both cells (the table showed its numbers twice), and `..` put its runs beside the grid's folder."""
    from lit_transformer.errors import ConfigError

    path = tmp_path / "grid.yaml"
    path.write_text(f"base: [configs/presets/tiny.yaml]\ncells:\n  {cells}\n")
    with pytest.raises(ConfigError, match=message):
        ablate.Grid.load(path)


@pytest.mark.parametrize(
    ("seeds", "message"), [("[]", "is empty"), ("", "is empty"), ("[1, 2, 1]", "lists seed 1 twice")]
)
def test_a_grid_without_seeds_or_with_one_twice_is_refused(tmp_path: Path, seeds: str, message: str):
    """`seeds: []` ran nothing and exited 0 with an empty table; a seed listed twice ran twice in one folder."""
    from lit_transformer.errors import ConfigError

    path = tmp_path / "grid.yaml"
    path.write_text(f"base: [configs/presets/tiny.yaml]\nseeds: {seeds}\ncells:\n  a: {{model.config.n_heads: 2}}\n")
    with pytest.raises(ConfigError, match=f"grid.yaml: seeds {message}"):
        ablate.Grid.load(path)


def test_two_grids_of_one_name_are_refused_rather_than_sharing_their_runs(tmp_path: Path):
    """`ablate configs/ablations/smoke.yaml ./smoke.yaml --out twice` put both in twice/smoke: the second grid's
    runs were the first's (finished, so skipped) and its table showed the first grid's numbers."""
    from lit_transformer.errors import ConfigError

    copy = tmp_path / "smoke.yaml"
    copy.write_text((ROOT / "configs/ablations/smoke.yaml").read_text().replace("max_steps: 10", "max_steps: 12"))
    grid = str(ROOT / "configs/ablations/smoke.yaml")
    with pytest.raises(ConfigError, match=f"grids {grid} and {copy} would share the folder {tmp_path / 'out'}/smoke"):
        ablate.ablate([grid, str(copy), "--out", str(tmp_path / "out"), "--dry-run"])
    assert not (tmp_path / "out").exists()


def test_time_steps_with_dry_run_prints_the_timing_commands_and_with_report_only_is_refused(
    tmp_path: Path, capsys, monkeypatch
):
    """`--dry-run --time-steps 2` and `--report-only --time-steps 2` started the timing processes (training)."""
    from lit_transformer.errors import ConfigError

    def timed(command: list[str], env: dict) -> float:
        raise AssertionError(f"a timing process started: {command}")

    monkeypatch.setattr(ablate, "measure_step", timed)
    grid = str(ROOT / "configs/ablations/smoke.yaml")
    assert ablate.ablate([grid, "--out", str(tmp_path), "--time-steps", "2", "--dry-run", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("time_child()' 5 2 ") == 3 and "# smoke/pre-ln timing" in out and "OMP_NUM_THREADS=1" in out
    with pytest.raises(ConfigError, match="--time-steps with --report-only"):
        ablate.ablate([grid, "--out", str(tmp_path), "--time-steps", "2", "--report-only"])
    assert not any(tmp_path.iterdir())


def test_an_out_that_is_a_file_is_refused_naming_out(tmp_path: Path):
    """`--out afile --report-only` on a plain file ended in a FileExistsError traceback (after the runs, without it)."""
    from lit_transformer.errors import ConfigError

    (tmp_path / "afile").write_text("x\n")
    grid = str(ROOT / "configs/ablations/smoke.yaml")
    for out in ("afile", "afile/sub"):
        with pytest.raises(ConfigError, match=f"^--out {tmp_path / out}: {tmp_path / 'afile'} is a file"):
            ablate.ablate([grid, "--out", str(tmp_path / out), "--report-only"])


@pytest.mark.parametrize(
    ("budget", "base_s", "cell_s", "steps"),
    [(5000, 0.06, 0.09, 3300), (10, 1.0, 1.0, 10), (20, 0.01, 0.02, 10), (150, 1.0, 1.2, 100), (3, 1.0, 9.0, 1)],
)
def test_equal_time_steps_round_down_and_never_exceed_the_budget(budget, base_s, cell_s, steps):
    """Rounded down to a hundred, as the help says; a floor of 100 gave a 10-step budget 100 steps (ten times it)."""
    assert ablate.equal_time_steps(budget, base_s, cell_s) == steps


def test_time_steps_names_where_the_budget_comes_from_and_keeps_a_small_one(tmp_path: Path, capsys, monkeypatch):
    """smoke.yaml's base configs train 20 steps and its overrides 10: the line said "The base's budget: 20 steps"
    without saying it is the base configs' (the timed base row's), and offered every cell 100 steps."""
    monkeypatch.setattr(ablate, "measure_step", lambda command, env: 0.05)
    grid = str(ROOT / "configs/ablations/smoke.yaml")
    assert ablate.ablate([grid, "--out", str(tmp_path), "--time-steps", "2", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "The base's budget: 20 steps (the trainer.max_steps of its configs alone, as timed, not the grid's" in out
    assert "| pre-ln | 50.0 | 1.00 | 20 | `--trainer.max_steps 20 --trainer.val_check_interval 20` |" in out


def test_a_base_config_found_nowhere_is_refused_when_the_grid_is_read(tmp_path: Path):
    """It was passed on as given: --time-steps ended in a FileNotFoundError traceback, a run failed in each fit."""
    from lit_transformer.errors import ConfigError

    (tmp_path / "grid.yaml").write_text("base: [configs/presets/nope.yaml]\ncells:\n  a: []\n")
    with pytest.raises(ConfigError, match="grid.yaml: base configs/presets/nope.yaml: no such file here"):
        ablate.Grid.load(tmp_path / "grid.yaml")


@pytest.mark.parametrize("path", GRIDS, ids=lambda p: p.name)
def test_no_shipped_grid_sets_a_deprecated_key(path: Path):
    """warmup.yaml set model.optimizer, model.lr, model.schedule and model.warmup_steps, and regularization.yaml
    model.label_smoothing: every run of theirs warned that each is deprecated (FutureWarning in its fit.log), and a
    minor version may remove them (CHANGELOG.md)."""
    from lit_transformer.engine.deprecated_options import DEPRECATED_NAMES

    grid = ablate.Grid.load(path)
    deprecated = {f"--model.{name}" for name in DEPRECATED_NAMES}
    for run in grid.runs(Path("/tmp/ablate-parse"), extra=[]):
        flags = {token.partition("=")[0] for token in run.command("fit") if token.startswith("--")}
        assert not flags & deprecated, (run.cell, sorted(flags & deprecated))


def test_the_pages_single_evaluation_command_reads_the_grids_own_configs():
    """docs/ablations.md's "one checkpoint at one context length (what each evaluation runs)" gave configs/base.yaml,
    the modern main job, for a checkpoint of the extrapolation grid, whose base is the 2017 recipe: validate ran, after a
    note that the page's d_ff, activation and norm were not used. The command must read the configs the grid's own
    evaluation reads."""
    import re
    import shlex

    page = (ROOT / "docs" / "ablations.md").read_text()
    joined = re.sub(r"\\\n\s*", " ", page)  # continuation lines joined, as the shell joins them
    (command,) = re.findall(r"^\.venv/bin/python -m lit_transformer validate .*$", joined, flags=re.M)
    words = shlex.split(command)
    configs = [words[i + 1] for i, w in enumerate(words) if w == "--config"]
    grid = ablate.Grid.load(ROOT / "configs" / "ablations" / "extrapolation.yaml")
    (run,) = [r for r in grid.runs(Path("/tmp/ablate-parse"), extra=[]) if r.cell == "alibi" and r.seed == 1]
    evaluation = run.command("fit")
    expected = [evaluation[i + 1] for i, w in enumerate(evaluation) if w == "--config"]
    assert configs == expected, (configs, expected)
