"""Which kernels scaled_dot_product_attention may use for a whole run, chosen from the trainer's callbacks so that
the model code never learns of it (configs/trainer/attention_cudnn.yaml puts cuDNN first)."""

from __future__ import annotations

import lightning as L

from lit_transformer.errors import ConfigError

# The kernels F.scaled_dot_product_attention may pick, by the names a config uses.
ATTENTION_KERNELS = ("cudnn", "flash", "efficient", "math")


def attention_kernels(names: list[str] | tuple[str, ...]):
    """A context in which scaled_dot_product_attention uses only `names`, tried in that order (cudnn, flash,
    efficient, math): torch.nn.attention.sdpa_kernel with set_priority."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    unknown = [name for name in names if name not in ATTENTION_KERNELS]
    if unknown or not names:
        raise ConfigError(f"attention kernels {list(names)}: choose one or more of {list(ATTENTION_KERNELS)}")
    backend = {
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }
    return sdpa_kernel([backend[name] for name in names], set_priority=True)


class AttentionKernels(L.Callback):
    """Pick the attention kernels for a whole run (fit, validate, test, predict), in priority order: the switch is
    the trainer's, so the model code never learns of it. configs/trainer/attention_cudnn.yaml puts cuDNN first.

    The compiled step is traced inside the choice too, so a graph keeps the kernel it was traced with."""

    def __init__(self, kernels: list[str] | None = None) -> None:
        """
        Args:
            kernels: Kernels allowed, the first preferred: cudnn, flash, efficient, math (all four by default).
        """
        self.kernels = list(kernels or ATTENTION_KERNELS)
        self._context = None
        attention_kernels(self.kernels)  # refuse a bad name when the config is read, not at the first step

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._context is None:
            self._context = attention_kernels(self.kernels)
            self._context.__enter__()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._context is not None:
            context, self._context = self._context, None
            context.__exit__(None, None, None)
