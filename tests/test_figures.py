"""Every figure registered in docs/figures.yaml is shown on its page as its committed JSON gives it, correctly rounded.

A registry entry names its committed JSON (or JSON-lines) files (`sources`: alias -> path), the commands that wrote
them, values in them (`let`: a path that starts at a source's alias and follows keys, where a mapping selects the
list items whose fields equal it) and, per page, the words the page shows with each figure written as a format field
over those values: "ran {1 / int8:.2f}x faster". The test computes each figure,
formats it with the field's own rounding and looks for the words on the page, whitespace-insensitively (prose
wraps). So a rerun that changes a JSON, or an edit that changes a figure, fails here until page and JSON agree.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from statistics import mean, median, stdev

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = ROOT / "docs" / "figures.yaml"
SCRIPT = re.compile(r"scripts/\w+\.\w+|-m lit_transformer")
FIELD = re.compile(r"\{([^{}:]+)(?::([^{}]*))?\}")


def plus_minus(values: list[float], digits: int = 3) -> str:
    """Mean ± sample standard deviation over seeds, as the ablation tables print it."""
    return f"{mean(values):.{digits}f} ± {stdev(values):.{digits}f}"


HELPERS = {
    "mean": lambda x: mean(x) if isinstance(x, list) else x,
    "median": median,
    "pm": plus_minus,
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


def lookup(data: object, path: list, where: str) -> object:
    """Follow `path` through `data`: a key or index, or a mapping that filters a list by field values. A list of
    source aliases first follows the rest of the path in each source: a list, one value per source."""
    if isinstance(path[0], list):
        return [lookup(data, [alias, *path[1:]], where) for alias in path[0]]
    value = data
    for step in path:
        if isinstance(step, dict) and value and all(isinstance(item, list) for item in value):
            value = [lookup(item, [step], where) for item in value]  # one list per run: filter each
        elif isinstance(step, dict):
            assert isinstance(value, list), f"{where}: {step} filters a list, found {type(value).__name__}"
            value = [item for item in value if all(item.get(k) == v for k, v in step.items())]
            assert value, f"{where}: no item matches {step}"
            if len(value) == 1:
                value = value[0]
        elif isinstance(value, list) and isinstance(step, str):  # a key of every selected item
            value = [item[step] for item in value]
        else:
            try:
                value = value[step]
            except (KeyError, IndexError, TypeError) as error:
                raise AssertionError(f"{where}: no {step!r} in {str(value)[:200]}") from error
    return value


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


def registry() -> list[dict]:
    return yaml.safe_load(REGISTRY.read_text())


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
            assert writers(recorded) & scripts, f"{path} was written by {recorded!r}, not {scripts}"


def writers(command: str) -> set[str]:
    """The scripts a command names; one since moved into the package (scripts/benchmark.py is `bench speed`) counts
    as `-m lit_transformer`, so a JSON recorded by the script matches the package command that replaced it."""
    return {s if s.startswith("-m") or (ROOT / s).exists() else "-m lit_transformer" for s in SCRIPT.findall(command)}


def benchmark_markdown(rows: list[dict]) -> str:
    """`bench speed`'s own table of its --json rows (what `bench speed --render FILE` prints)."""
    from lit_transformer.bench.speed import markdown

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
    """A table pasted from `benchmark.py --render` keeps every row as the JSON renders it."""
    path = registry()[index]["sources"][alias]
    text = squash((ROOT / page).read_text())
    report = load_source(ROOT / path)
    first = report["runs"][0] if "runs" in report else report  # a file of several runs renders its first
    rows = [line for line in benchmark_markdown(first["rows"]).splitlines() if line[:2] == "| "]
    missing = [row for row in rows if row.split(" | ")[0] != "| contender" and squash(row) not in text]
    assert not missing, f"{page} lacks these rows of {path} as benchmark.py renders them: {missing}"


def test_the_registry_checks_what_it_says() -> None:
    """A rounding the JSON does not give fails: 3.0825 shown as 3.09 is caught, as 3.08 passes."""
    run = {"rows": [{"name": "a", "ratio": 1 / 3.0825}, {"name": "b", "ratio": 0.5}], "seeds": [{"x": 1}, {"x": 2}]}
    data = {"run": run}
    int8 = lookup(data, ["run", "rows", {"name": "a"}, "ratio"], "t")
    assert render("{1 / int8:.2f}x", {"int8": int8}, "t") == "3.08x"
    assert render("{mean(x):.1f}", {"x": lookup(data, ["run", "seeds", "x"], "t")}, "t") == "1.5"
    with pytest.raises(AssertionError, match="no item matches"):
        lookup(data, ["run", "rows", {"name": "c"}], "t")
