"""What a benchmark checks of the files it names, right after parsing and before it measures anything.

A benchmark runs for seconds to hours and writes its run at the end (lit_transformer.records.write_run): a --json
that is a folder, or a file the writer cannot add a run to, would otherwise end the work in a traceback and lose the
run. `runs_file` refuses such a file at the start, naming its flag; `recorded_runs` and `read_json` read a file a
benchmark is given (an earlier run to render, a part's facts) and refuse a missing or malformed one naming it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from lit_transformer.errors import BadFileError, ConfigError, MissingFileError, UserError, WriteError
from lit_transformer.records import read_runs, write_run


def runs_file(path: str | os.PathLike | None, flag: str = "--json", name: str | None = None) -> Path | None:
    """`path` (the file a benchmark adds its run to, as `flag` gave it) once the writer is known to take a run there
    (`name`: a record of the file); None stays None. The check is the writer itself, run on a copy, so the two cannot
    disagree about which files take a run."""
    if path is None:
        return None
    path = Path(path)
    if path.is_dir():
        raise ConfigError(
            f"{flag} {path} is a folder: give the JSON file the run is added to",
            hint=f"For example {flag} {path / 'runs.json'}.",
        )
    # the nearest folder that exists: the writer makes the ones below it
    folder = next((p for p in (path.parent, *path.parent.parents) if p.exists()), Path.cwd())
    if not folder.is_dir():
        raise ConfigError(f"{flag} {path}: {folder} is a file, not a folder the run's file could be written in")
    appended = path.suffix == ".jsonl" and path.exists()  # appended to in place; any other file is replaced whole
    if not os.access(folder, os.W_OK) or (appended and not os.access(path, os.W_OK)):
        raise WriteError(
            f"{flag} {path} cannot be written here (no permission)", hint="Give a file in a folder of yours."
        )
    if path.suffix == ".jsonl" and name is not None:
        raise ConfigError(
            f"{flag} {path}: a JSON-lines file holds one run a line, not named records", hint="Give a .json."
        )
    if path.is_file() and path.suffix != ".jsonl":  # a .jsonl file takes a line unread; any other file is read first
        with tempfile.TemporaryDirectory(prefix="bench-check-") as scratch:
            trial = Path(scratch) / path.name
            shutil.copyfile(path, trial)
            try:
                write_run(trial, {}, command="", machine={}, name=name)
            except UnicodeDecodeError:
                raise BadFileError(f"{flag} {path} is not UTF-8 text: it is not a benchmark's JSON") from None
            except UserError as error:
                raise BadFileError(f"{flag} {str(error).replace(str(trial), str(path))}", hint=error.hint) from None
    return path


def read_json(path: str | os.PathLike, what: str = "") -> Any:
    """The JSON of a file a benchmark reads (`what`: the flag that names it, e.g. --meta; "" for a positional file;
    a .jsonl file: the list of its lines' values); a missing, binary or malformed one is refused naming it and the
    line."""
    path = Path(path)
    what = f"{what} " if what else ""
    if not path.exists():
        raise MissingFileError(f"{what}{path}: no such file")
    if path.is_dir():
        raise BadFileError(f"{what}{path} is a folder, not a JSON file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise BadFileError(f"{what}{path} is not UTF-8 text: not a JSON file") from None
    lines = enumerate(text.splitlines(), 1) if path.suffix == ".jsonl" else [(0, text)]
    values = []
    for number, line in lines:
        if not line.strip() and number:
            continue
        try:
            values.append(json.loads(line))
        except json.JSONDecodeError as error:
            where = f"line {number or error.lineno}, column {error.colno}"
            raise BadFileError(f"{what}{path} is not JSON ({where}: {error.msg})") from None
    return values if path.suffix == ".jsonl" else values[0]


def recorded_runs(path: str | os.PathLike, what: str = "", name: str | None = None) -> list[dict[str, Any]]:
    """The runs a benchmark wrote to `path` (of its record `name`), oldest first; a file that holds none (missing,
    malformed, empty) is refused naming it (and `what`, as read_json)."""
    read_json(path, what)
    what = f"{what} " if what else ""
    runs = read_runs(path, name)
    if not runs or not all(isinstance(run, dict) for run in runs):
        record = f"record {name!r}" if name else "runs"
        raise BadFileError(
            f"{what}{path} holds no {record} of a benchmark", hint="Give a file a benchmark's --json wrote."
        )
    return runs
