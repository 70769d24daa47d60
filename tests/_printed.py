"""Reading back the numbers a run reported: Lightning's printed results table, and TensorBoard's scalars."""

from __future__ import annotations

import re
from pathlib import Path


def printed_metrics(stdout: str) -> dict[str, float]:
    """{name: value} of the results table `validate` and `test` print (rows like `│ test/f1 │ 0.25 │`)."""
    rows = re.findall(r"│\s+([\w/]+)\s+│\s+([-+\d.eE]+|nan|inf)\s+│", stdout)
    return {name: float(value) for name, value in rows}


def scalars(run: Path) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} of the one TensorBoard event folder under `run`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = {p.parent for p in run.rglob("events.out.tfevents.*")}
    acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}
