"""Every figure registered in docs/figures.yaml is shown on its page as its committed JSON gives it, correctly rounded.

A registry entry names its committed JSON (or JSON-lines) files (`sources`: alias -> path), the commands that wrote
them, values in them (`let`: a path that starts at a source's alias and follows keys, where a mapping selects the
list items whose fields equal it) and, per page, the words the page shows with each figure written as a format field
over those values: "ran {1 / int8:.2f}x faster". The test computes each figure,
formats it with the field's own rounding and looks for the words on the page, whitespace-insensitively (prose
wraps). So a rerun that changes a JSON, or an edit that changes a figure, fails here until page and JSON agree.

A rerun is one more run of the same file (lit_transformer.records.write_run), so a path reads runs as their newest:
a record of runs ({"runs": [...]}, as a rerun leaves a file or a named record that held one run) stands for its
newest run, unless the path names `runs` (or `summary`) itself; and a filter that matches several runs of one
measurement (items that record their command and machine) takes the newest. Items that are not runs (an ablation's
seeds) stay a list.

Each entry also states the machine its JSON records (`machine`: a CPU or GPU model, with "N cores" where the JSON
records the logical cores, or null where the JSON names none), and the words around each figure (the sentence or
table row holding it, the table's header, the section heading, the page's opening) may name only that machine: a
figure under another machine's name, or a ratio of figures from two machines, fails.
"""

from __future__ import annotations

import functools
import json
import math
import re
from pathlib import Path
from statistics import mean, median, stdev

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = ROOT / "docs" / "figures.yaml"
# A program a command runs: a file under scripts/, or a command of the package (`-m lit_transformer bench lora`,
# `-m lit_transformer.bench lora`, `-m lit_transformer fit`).
SCRIPT = re.compile(r"scripts/(\w+)\.(\w+)|-m lit_transformer(\.bench)?\s+((?:bench\s+)?[\w-]+)")
# The scripts the package's commands replaced (older JSONs recorded the script's command line).
MOVED = {
    "benchmark": "bench speed", "nanogpt_compare": "bench nanogpt", "benchmark_prepare": "bench prepare",
    "benchmark_data_memory": "bench data-memory", "benchmark_lora": "bench lora", "record_run": "bench record",
    "suite_time": "bench suite-time", "genre_baselines": "bench genre-baselines",
    "caption_baseline": "bench caption-baseline", "gpu_parts": "bench gpu-parts", "gpu_table": "bench gpu-table",
    "ablate": "ablate", "digit_strips": "digit-strips", "translation_recipe": "translation-recipe",
}  # fmt: skip
CLI_RUNS = {"fit", "validate", "test", "predict"}
FIELD = re.compile(r"\{([^{}:]+)(?::([^{}]*))?\}")
# A machine named in prose: a CPU or GPU vendor or model, or a core count.
MACHINE = re.compile(
    r"\b(?:AMD|Zen ?\d|EPYC|Ryzen|Intel|Xeon|Apple M\d|Graviton\d?|NVIDIA|[HA]100|H200|V100|A10G|L40S?|RTX ?\d{4}|MI\d{3}X?)\b"
    r"|\b(\d+)(?:-core\b| (?:CPU |logical )?cores\b)",
    re.IGNORECASE,
)
CORES = re.compile(r"(\d+) (?:logical )?(?:CPUs|cores)\b")
ARCH_ONLY = {"", "x86_64", "amd64", "aarch64", "arm64", "unknown"}


def plus_minus(values: list[float], digits: int = 3) -> str:
    """Mean ± sample standard deviation over seeds, as the ablation tables print it."""
    return f"{mean(values):.{digits}f} ± {stdev(values):.{digits}f}"


HELPERS = {
    "mean": lambda x: mean(x) if isinstance(x, list) else x,
    "median": median,
    "pm": plus_minus,
    "sd": stdev,
    "at": lambda items, key: [item[key] for item in items],
    "min": min,
    "max": max,
    "abs": abs,
    "len": len,
}


def squash(text: str) -> str:
    return " ".join(text.split())


def load_source(path: Path) -> object:
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return json.loads(path.read_text())


def is_runs(value: object) -> bool:
    """A record of runs: {"runs": [...], maybe "summary"} (a rerun appends to its runs)."""
    return isinstance(value, dict) and isinstance(value.get("runs"), list) and set(value) <= {"runs", "summary"}


def is_run(item: object) -> bool:
    """One run of a benchmark, as a writer records it: its command and its machine beside its figures."""
    return isinstance(item, dict) and "command" in item and "machine" in item


def lookup(data: object, path: list, where: str) -> object:
    """Follow `path` through `data`: a key or index, or a mapping that filters a list by field values. A list of
    source aliases first follows the rest of the path in each source: a list, one value per source. A record of runs
    is read as its newest run (but for its own keys, `runs` and `summary`), and of several runs a filter matches the
    newest."""
    if isinstance(path[0], list):
        return [lookup(data, [alias, *path[1:]], where) for alias in path[0]]
    value = data
    for step in path:
        if isinstance(step, dict) and value and isinstance(value, list) and all(isinstance(i, list) for i in value):
            value = [lookup(item, [step], where) for item in value]  # one list per run: filter each
        elif isinstance(step, dict):
            value = value["runs"] if is_runs(value) else value  # a filter on a record of runs filters its runs
            assert isinstance(value, list), f"{where}: {step} filters a list, found {type(value).__name__}"
            value = [item for item in value if all(item.get(k) == v for k, v in step.items())]
            assert value, f"{where}: no item matches {step}"
            if len(value) > 1 and all(is_run(item) for item in value):
                value = value[-1:]  # reruns of one measurement: the newest
            if len(value) == 1:
                value = value[0]
        elif isinstance(value, list) and isinstance(step, str):  # a key of every selected item
            value = [item[step] for item in value]
        else:
            if is_runs(value) and step not in value:
                value = value["runs"][-1]  # a key of a record of runs: its newest run's
            try:
                value = value[step]
            except (KeyError, IndexError, TypeError) as error:
                raise AssertionError(f"{where}: no {step!r} in {str(value)[:200]}") from error
    return value["runs"][-1] if is_runs(value) else value


def render(text: str, names: dict[str, object], where: str) -> str:
    """The words with each {expression:format} field replaced by its value, rounded as the field says."""

    def field(match: re.Match) -> str:
        try:
            value = eval(match[1], {"__builtins__": {}, **HELPERS, **names})  # noqa: S307 (the repo's own file)
        except Exception as error:  # noqa: BLE001
            raise AssertionError(f"{where}: cannot evaluate {match[1]!r}: {error}") from error
        assert not (isinstance(value, float) and math.isnan(value)), f"{where}: {match[1]} is NaN"
        return format(value, match[2] or "")

    return FIELD.sub(field, text)


def recorded_machine(data: object) -> tuple[str, set[int]]:
    """What a JSON records of its machine: every CPU or GPU description (the `machine` object's `cpu` and `gpu`, older
    flat `cpu`/`gpu`/`machine` strings anywhere, a benchmark section that names its GPU), joined, and the logical core
    counts (`logical_cores`, older `cores`/`cpus`/`cpu_count`, or "N logical CPUs" in a description). A bare
    architecture ("x86_64") names no machine."""
    texts, cores, stack = [], set(), [data]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
            continue
        if not isinstance(item, dict):
            continue
        for key, value in item.items():
            if key in ("logical_cores", "cores", "cpus", "cpu_count") and isinstance(value, int):
                cores.add(value)
            elif key in ("cpu", "gpu", "machine") and isinstance(value, str) and value.strip() not in ARCH_ONLY:
                texts.append(value)
            elif key == "machine" and isinstance(value, list):
                texts += [v for v in value if isinstance(v, str)]
            elif key == "section" and isinstance(value, str) and MACHINE.search(value):
                texts.append(value)
            elif isinstance(value, (dict, list)):
                stack.append(value)
    cores |= {int(n) for text in texts for n in CORES.findall(text)}
    return " ".join(texts), cores


def normal(text: str) -> str:
    return re.sub(r"\(r\)|\(tm\)|[^a-z0-9]", "", text.lower())


def label_parts(label: str | None) -> tuple[list[str], set[int]]:
    """A registry machine label ("Intel Xeon, 2 cores") as its model words and its core count."""
    if label is None:
        return [], set()
    cores = {int(n) for n in re.findall(r"(\d+) cores", label)}
    words = re.sub(r"\d+ cores", "", label).replace(",", " ").split()
    return words, cores


def machine_label(entry: dict, alias: str) -> str | None:
    machine = entry["machine"]
    return machine.get(alias) if isinstance(machine, dict) else machine


def registry() -> list[dict]:
    """docs/figures.yaml as it is now, parsed once per text (parsing it took nine tenths of this file's 30 s when
    each of its 400 tests parsed it again). Read only: tests build changed entries as new dicts."""
    return _parsed(REGISTRY.read_text())


@functools.cache
def _parsed(text: str) -> list[dict]:
    return yaml.safe_load(text)


def entry_id(entry: dict) -> str:
    return ", ".join(entry["sources"].values())


def figures() -> list:
    cases = []
    for index, entry in enumerate(registry()):
        for page, texts in entry.get("figures", {}).items():
            for text in texts:
                cases.append(pytest.param(index, page, text, id=f"{page}: {text[:60]}"))
    return cases


def values(entry: dict) -> dict[str, object]:
    """The entry's `let` names, each looked up in the source its path starts with."""
    data = {alias: load_source(ROOT / path) for alias, path in entry["sources"].items()}
    return {name: lookup(data, path, f"{entry_id(entry)}: {name}") for name, path in entry.get("let", {}).items()}


def recorded_commands(data: object) -> set[str]:
    """Every "command" string anywhere in a JSON document (the writers record their own command line)."""
    found = set()
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if isinstance(item.get("command"), str):
                found.add(item["command"])
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


@pytest.mark.parametrize(("index", "page", "text"), figures())
def test_page_shows_the_figure_its_json_gives(index: int, page: str, text: str) -> None:
    entry = registry()[index]
    shown = squash(render(text, values(entry), f"{page}: {text!r}"))
    assert shown in squash((ROOT / page).read_text()), f"{page} should show {shown!r} (from {entry_id(entry)})"


# Reports an ablation writes whole from its runs' logs (`ablate` rewrites them): not files of runs.
REPORTS = ("docs/ablations/",)


def rerun(path: Path, into: Path) -> Path:
    """`into`: the file at `path` after each measurement in it ran again and was recorded by the one writer (a copy of
    the newest run of the file, or of each named record; of every run, where the file is a list of them)."""
    from lit_transformer.records import read_runs, write_run

    into.write_bytes(path.read_bytes())
    data = load_source(path)
    named = isinstance(data, dict) and "runs" not in data and "machine" not in data
    for name in list(data) if named else [None]:
        runs = read_runs(path, name)
        for run in runs if isinstance(data, list) else runs[-1:]:
            figures = {k: v for k, v in run.items() if k not in ("command", "date", "machine")}
            write_run(into, figures, command=run.get("command", "rerun"), machine=run["machine"], name=name)
    return into


@pytest.mark.parametrize("index", range(len(registry())), ids=[entry_id(e) for e in registry()])
def test_a_rerun_into_each_source_keeps_every_figure_readable(index: int, tmp_path: Path) -> None:
    """Each benchmark reruns into its committed file as one more run (lit_transformer.records.write_run) in whatever
    form the file has (runs, one older run, named records, a list, JSON lines): the registry still reads every figure,
    now from the newest run, and a rerun that measured the same shows the same words."""
    entry = registry()[index]
    sources = {
        alias: path if path.startswith(REPORTS) else str(rerun(ROOT / path, tmp_path / f"{alias}-{Path(path).name}"))
        for alias, path in entry["sources"].items()
    }
    before, after = values(entry), values({**entry, "sources": sources})
    for page, texts in entry.get("figures", {}).items():
        for text in texts:
            assert render(text, after, page) == render(text, before, page), (page, text[:80])


@pytest.mark.parametrize("index", range(len(registry())), ids=[entry_id(e) for e in registry()])
def test_each_source_is_published_with_the_command_that_wrote_it(index: int) -> None:
    """Each command is printed on a page, and a JSON that recorded its writer's command line names the same script
    (older JSONs were written to a temporary path and copied, so the output path is not compared)."""
    entry = registry()[index]
    pages = squash(" ".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]))
    for path in entry["sources"].values():
        assert (ROOT / path).is_file(), f"{path} is registered in docs/figures.yaml but not in the repository"
    for command in entry["commands"]:
        assert squash(command) in pages, f"the command that wrote {entry_id(entry)} is printed nowhere: {command}"
    scripts = {script for command in entry["commands"] for script in writers(command)}
    for path in entry["sources"].values():
        for recorded in recorded_commands(load_source(ROOT / path)):
            ran = writers(recorded)  # or a run of the CLI that the benchmark made and recorded (bench lora's fits)
            assert ran & scripts or ran <= CLI_RUNS, f"{path} was written by {recorded!r}, not {scripts}"


def writers(command: str) -> set[str]:
    """The programs a command runs: a script under scripts/, or a package command (`bench lora`, `ablate`, `fit`); a
    script since moved into the package counts as the command that replaced it (scripts/benchmark.py is `bench
    speed`), so a JSON recorded by the script matches the command the page now prints."""
    found = set()
    for match in SCRIPT.finditer(command):
        if match[1]:
            script = f"scripts/{match[1]}.{match[2]}"
            found.add(script if (ROOT / script).exists() else MOVED.get(match[1], script))
        else:
            found.add(("bench " if match[3] else "") + " ".join(match[4].split()))
    return found


def benchmark_markdown(rows: list[dict]) -> str:
    """`bench speed`'s own table of its --json rows (what `bench speed --render FILE` prints)."""
    from lit_transformer.bench.speed_sections import markdown

    return markdown(rows)


@pytest.mark.parametrize(
    ("index", "alias", "page"),
    [
        (i, alias, page)
        for i, e in enumerate(registry())
        for alias, pages in e.get("rendered", {}).items()
        for page in pages
    ],
)
def test_benchmark_tables_are_the_rendering_of_their_json(index: int, alias: str, page: str) -> None:
    """A table pasted from `bench speed --render` keeps every row as the JSON renders it."""
    path = registry()[index]["sources"][alias]
    text = squash((ROOT / page).read_text())
    report = load_source(ROOT / path)
    first = report["runs"][0] if "runs" in report else report  # a file of several runs renders its first
    rows = [line for line in benchmark_markdown(first["rows"]).splitlines() if line[:2] == "| "]
    missing = [row for row in rows if row.split(" | ")[0] != "| contender" and squash(row) not in text]
    assert not missing, f"{page} lacks these rows of {path} as `bench speed --render` prints them: {missing}"


def test_a_json_is_matched_to_the_command_that_wrote_it() -> None:
    """A moved script's recorded command line is its package command, and no other benchmark's."""
    assert writers("scripts/benchmark.py --only quantized --json /tmp/x.json") == {"bench speed"}
    assert writers("python -m lit_transformer bench speed --json docs/benchmark.json") == {"bench speed"}
    assert writers("python -m lit_transformer.bench lora --json x") == {"bench lora"}
    assert writers("python scripts/record_run.py --json x --name fit -- fit --config c.yaml") == {"bench record"}
    assert writers("bash scripts/gpu_check.sh (scripts/translation_recipe.py --flags x)") == {
        "scripts/gpu_check.sh", "translation-recipe"
    }  # fmt: skip
    assert not writers("python scripts/benchmark_lora.py --json x") & writers("python -m lit_transformer bench speed")


def test_the_registry_checks_what_it_says() -> None:
    """A rounding the JSON does not give fails: 3.0825 shown as 3.09 is caught, as 3.08 passes."""
    run = {"rows": [{"name": "a", "ratio": 1 / 3.0825}, {"name": "b", "ratio": 0.5}], "seeds": [{"x": 1}, {"x": 2}]}
    data = {"run": run}
    int8 = lookup(data, ["run", "rows", {"name": "a"}, "ratio"], "t")
    assert render("{1 / int8:.2f}x", {"int8": int8}, "t") == "3.08x"
    assert render("{mean(x):.1f}", {"x": lookup(data, ["run", "seeds", "x"], "t")}, "t") == "1.5"
    with pytest.raises(AssertionError, match="no item matches"):
        lookup(data, ["run", "rows", {"name": "c"}], "t")


def page_units(text: str) -> list[tuple[str, str, bool]]:
    """Each paragraph and table row of a page, squashed, as (unit, the words around it that may name its machine,
    whether it is a table row). Around it: the headings it sits under, its table's header row, the page's opening."""
    units, headings, paragraph, header, opening, fenced = [], {}, [], None, [], False

    def around() -> str:
        return " ".join([*headings.values(), header or "", *opening])

    def close() -> None:
        if paragraph:
            units.append((squash(" ".join(paragraph)), around(), False))
            if not any(level > 1 for level in headings):
                opening.append(" ".join(paragraph))
            paragraph.clear()

    for line in text.splitlines():
        if line.startswith("```"):
            close()
            fenced = not fenced
        elif fenced:
            continue
        elif match := re.match(r"(#+) ", line):
            close()
            level = len(match[1])
            headings = {k: v for k, v in headings.items() if k < level} | {level: line}
            header = None
        elif line.startswith("|"):
            close()
            if header is None:
                header = line
            elif not re.fullmatch(r"[|:\- ]+", line):
                units.append((squash(line), around(), True))
        elif not line.strip():
            close()
            header = None
        else:
            paragraph.append(line)
    close()
    return units


def sentence_around(unit: str, start: int, end: int) -> str:
    """The sentences of `unit` that hold unit[start:end]."""
    bounds = [m.end() for m in re.finditer(r"[.!?]\s+(?=[A-Z*(`\[])", unit)]
    first = max([b for b in bounds if b <= start], default=0)
    last = min([b for b in bounds if b >= end], default=len(unit))
    return unit[first:last]


def expression_sources(entry: dict, expression: str) -> set[str]:
    """The source aliases a figure's field reads, through its `let` names (string literals are keys, not names)."""
    aliases = set()
    for name in re.findall(r"[A-Za-z_]\w*", re.sub(r"'[^']*'|\"[^\"]*\"", "", expression)):
        path = entry.get("let", {}).get(name)
        if path:
            aliases |= set(path[0]) if isinstance(path[0], list) else {path[0]}
    return aliases


@pytest.mark.parametrize("index", range(len(registry())), ids=[entry_id(e) for e in registry()])
def test_the_registry_names_the_machine_each_json_records(index: int) -> None:
    """`machine` is what the JSON records: a model's words appear in its CPU or GPU description, a core count equals
    its logical cores. A JSON that names no machine publishes no figure: rerun it with a command that records its
    machine (every `bench` command does), or remove the figure."""
    entry = registry()[index]
    assert "machine" in entry, f"{entry_id(entry)}: state its JSON's machine in docs/figures.yaml"
    for alias, path in entry["sources"].items():
        label = machine_label(entry, alias)
        recorded, cores = recorded_machine(load_source(ROOT / path))
        assert recorded, (
            f"{path} names no machine, so no page may publish its figures: rerun it with a command that records the "
            "machine (every `python -m lit_transformer bench` command does), or remove the figures"
        )
        assert label is not None, f"{path} records its machine ({recorded!r}): say so in docs/figures.yaml"
        words, label_cores = label_parts(label)
        missing = [word for word in words if normal(word) not in normal(recorded)]
        assert not missing, f"{path} records {recorded!r}, not {missing} (docs/figures.yaml: {label!r})"
        assert label_cores <= cores, f"{path} records {sorted(cores)} logical cores, not {label!r}"


def figure_context(page: str, shown: str) -> tuple[str, str]:
    """(the sentence or table row that holds the figure, the headings, table header and page opening around it)."""
    for unit, around, row in page_units((ROOT / page).read_text()):
        at = unit.find(shown)
        if at >= 0:
            return (unit if row else sentence_around(unit, at, at + len(shown))), around
    raise AssertionError(f"{page} should show {shown!r} within one paragraph or table row")


def mismatches(context: str, labels: list[tuple[str | None, str]]) -> list[str]:
    """The machines named in `context` that are not the machine of every (label, recorded description) given."""
    wrong = []
    for match in MACHINE.finditer(context):
        if match[1]:
            ok = all(int(match[1]) in label_parts(label)[1] for label, _ in labels)
        else:
            ok = all(
                label is not None and normal(match[0]) in normal(f"{label} {recorded}") for label, recorded in labels
            )
        if not ok:
            wrong.append(match[0])
    return wrong


@pytest.mark.parametrize(("index", "page", "text"), figures())
def test_the_figure_sits_under_its_jsons_machine(index: int, page: str, text: str) -> None:
    """The sentence (or table row) of a figure, its headings, its table's header and the page's opening name no
    machine but the one its JSON records; and no field puts figures of two machines into one ratio."""
    entry = registry()[index]
    aliases: set[str] = set()
    for match in FIELD.finditer(text):
        used = expression_sources(entry, match[1])
        machines = {machine_label(entry, alias) for alias in used}
        assert len(machines) <= 1, f"{page}: {match[0]} puts figures of {sorted(map(str, machines))} into one ratio"
        aliases |= used
    shown = squash(render(text, values(entry), f"{page}: {text!r}"))
    sentence, around = figure_context(page, shown)
    labels = [
        (machine_label(entry, alias), recorded_machine(load_source(ROOT / entry["sources"][alias]))[0])
        for alias in sorted(aliases or entry["sources"])
    ]
    wrong = mismatches(f"{sentence} {around}", labels)
    assert not wrong, (
        f"{page}: {shown[:80]!r} sits under {wrong}, but its JSON records {[label for label, _ in labels]}"
    )


def test_the_machine_check_catches_a_slip() -> None:
    """A Xeon's figure under "Zen 3", a core count the record lacks, and an unnamed machine's figure under a name fail;
    the recorded machine passes."""
    xeon = [("Intel Xeon, 2 cores", "Intel(R) Xeon(R) Processor")]
    assert mismatches("319 s on 2 cores of an Intel Xeon", xeon) == []
    assert mismatches("319 s on 2 cores of an AMD Zen 3 CPU", xeon) == ["AMD", "Zen 3"]
    assert mismatches("on a 16-core Intel Xeon", xeon) == ["16-core"]
    assert mismatches("on one H100", [(None, "")]) == ["H100"]
    assert recorded_machine({"machine": {"cpu": "x86_64", "logical_cores": 2}}) == ("", {2})
    assert recorded_machine({"rows": [{"section": "MFU (NVIDIA H200, bf16)"}]})[0] == "MFU (NVIDIA H200, bf16)"
    units = page_units(
        "# T\n\nOpening.\n\n## On one H100\n\n| a | b |\n| --- | --- |\n| 1 | 2 |\n\nIt ran. Then 3 s.\n"
    )
    assert units[1] == ("| 1 | 2 |", "# T ## On one H100 | a | b | Opening.", True)
    assert sentence_around(units[2][0], units[2][0].index("3 s"), units[2][0].index("3 s") + 3) == "Then 3 s."
