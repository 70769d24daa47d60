"""What a benchmark records of the machine it ran on (a figure is only comparable on the same CPU)."""

from __future__ import annotations

import platform
import subprocess


def cpu_model() -> str:
    """The CPU's model name as lscpu gives it (the platform's processor string without lscpu)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor() or "unknown"
