"""What a command prints besides the package's own lines: only what the user can act on.

Lightning and torch print a few lines that a newcomer reads as something to fix and cannot: advertisements for a
logging service, an echo of a setting the config itself gave (`limit_val_batches: 1.0`), a deprecation inside
Lightning's own code, and a model summary whose FLOPs column reads 0 (Lightning counts FLOPs only for an
`example_input_array`; our MFU has the real count). `quiet_dependencies` drops those lines; `ModelSummaryWithoutFlops`
is Lightning's summary less that column. Everything else Lightning says (devices, progress, its warnings) stays.
"""

from __future__ import annotations

import logging
import re
import warnings
from typing import Any

from lightning.pytorch.callbacks import ModelSummary

NOT_ACTIONABLE = (
    re.compile(r"^💡 Tip: "),  # litlogger / litmodels advertisements
    re.compile(r"^`Trainer\(\w+=1\.0\)` was configured so 100%"),  # the config said 1.0: the message repeats it
)


class _DropNotActionable(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(pattern.search(message) for pattern in NOT_ACTIONABLE)


def quiet_dependencies() -> None:
    """Drop the lines of NOT_ACTIONABLE from Lightning's log, and torch's LeafSpec deprecation that Lightning's
    own `utilities/_pytree.py` triggers at every batch fetch (nothing a user of Lightning can change). Idempotent."""
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")  # rank_zero_info's records
    if not any(isinstance(f, _DropNotActionable) for f in logger.filters):
        logger.addFilter(_DropNotActionable())
    # Resumed with other checkpoint settings, Lightning lists the checkpoint callbacks' records it found no callback
    # for; a RunCheckpoint takes the record of its metric whatever the interval, and another metric's is not its own.
    warnings.filterwarnings(
        "ignore",
        message=r"Be aware that when using `ckpt_path`, callbacks used to create the checkpoint need to be provided "
        r"during `Trainer` instantiation\. Please add the following callbacks: "
        r"\[(\"ModelCheckpoint\{'monitor': [^\"]*\}\"(, )?)+\]\.$",
    )
    warnings.filterwarnings(
        "ignore",
        message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        category=FutureWarning,
        module=r"lightning\.pytorch\.utilities\._pytree",
    )


class ModelSummaryWithoutFlops(ModelSummary):
    """Lightning's model summary (names, types, parameters, mode) without the FLOPs column and total, which read 0
    unless the module has an `example_input_array` (the per-token count is the model's `flops_per_token`, which the
    throughput monitor's MFU uses)."""

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        from lit_transformer.engine.lightning_compat import summary_table

        columns = [(name, values) for name, values in summary_data if name != "FLOPs"]
        table = summary_table(
            total_parameters, trainable_parameters, model_size, total_training_modes, total_flops, *columns
        )
        lines = [line for line in table.splitlines() if not line.endswith("Total Flops")]
        logging.getLogger("lightning.pytorch.callbacks.model_summary").info("\n" + "\n".join(lines))
