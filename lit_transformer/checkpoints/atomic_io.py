"""Lightning's checkpoint IO for this package: ``AtomicCheckpointIO`` writes each checkpoint with ``atomic_save`` (a
temporary file in the same folder, fsynced, renamed over the target, the folder fsynced), so a crash at any moment
leaves the previous file whole, and reads with ``load_checkpoint`` (``torch.load(weights_only=True)``: tensors and
plain data, never code). Both live in files.py, which imports no Lightning (the commands that do not train read and
write checkpoints too).
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.plugins.io import TorchCheckpointIO

from lit_transformer.checkpoints.files import CheckpointError, atomic_save, load_checkpoint, non_finite_tensors


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning checkpoint IO that never leaves a torn file and never runs code when loading.

    Use with ``ModelCheckpoint(save_last=True)`` (a full copy written atomically); ``save_last="link"`` deletes
    ``last.ckpt`` before re-creating the symlink, so a crash in between leaves no ``last`` at all.
    """

    def __init__(self, refuse_non_finite: bool = True) -> None:
        super().__init__()
        self.refuse_non_finite = refuse_non_finite
        """Refuse to write weights holding NaN/inf, so the last good checkpoint stays the newest one."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} does not take storage_options")
        if self.refuse_non_finite:
            bad = non_finite_tensors(checkpoint.get("state_dict", {}))
            if bad:
                raise CheckpointError(
                    f"Refused to save {path}: weights hold NaN or infinity ({', '.join(bad[:5])}"
                    f"{' …' if len(bad) > 5 else ''}); the previous checkpoint is kept as the last good one."
                )
        atomic_save(checkpoint, path)

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        # weights_only=False is not honoured on purpose: resuming must never execute code from a file.
        return load_checkpoint(path, map_location=map_location if map_location is not None else "cpu")
