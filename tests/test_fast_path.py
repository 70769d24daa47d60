"""The GPU fast path, checked on a CPU: the CLI's training step never makes the host wait for the device, the step's
forward and loss compile as one graph, and translation targets need no mask.

A GPU makes the host wait wherever Python reads a tensor (`.item()`, `bool()`, `float()`, `int()`, `.tolist()`): the
CPU then stops queueing kernels until the GPU has caught up. These reads cost nothing on a CPU, but they are the same
calls, so patching them to raise during steady-state training steps finds every one of them.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import lightning as L
import pytest
import torch

from lit_transformer import parallelize
from lit_transformer.cli import TransformerCLI, run_cli

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ROOT / "configs" / "presets"
READS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__")


class HostReadError(AssertionError):
    pass


@contextlib.contextmanager
def no_host_reads():
    """Every tensor read by the host raises inside the block."""
    saved = {name: getattr(torch.Tensor, name) for name in READS}

    def refuse(name):
        def read(self, *args, **kwargs):
            raise HostReadError(f"Tensor.{name} called in a training step: a host synchronisation on a GPU")

        return read

    try:
        for name in READS:
            setattr(torch.Tensor, name, refuse(name))
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


class SyncTrap(L.Callback):
    """Refuse host reads from the start of batch `first` to the end of batch `last` (warm-up and logging outside)."""

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last = first, last
        self.trapped: list[int] = []
        self._context: contextlib.AbstractContextManager | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.first <= trainer.fit_loop.total_batch_idx <= self.last and self._context is None:
            self._context = no_host_reads()
            self._context.__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._context is not None:
            self.trapped.append(trainer.fit_loop.total_batch_idx)
            if trainer.fit_loop.total_batch_idx >= self.last:
                self._exit()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._exit()

    def _exit(self) -> None:
        if self._context is not None:
            context, self._context = self._context, None
            context.__exit__(None, None, None)


def cli(tmp_path: Path, preset: str, *args: str) -> TransformerCLI:
    """The CLI's own objects (model, data, trainer with its callbacks), built from a preset, not yet fitting."""
    return run_cli(
        [
            "--config",
            str(PRESETS / preset),
            f"--trainer.default_root_dir={tmp_path}",
            f"--trainer.logger.init_args.save_dir={tmp_path}",
            f"--checkpoint.dirpath={tmp_path / 'checkpoints'}",
            "--trainer.limit_val_batches=0",
            "--trainer.num_sanity_val_steps=0",
            *args,
        ],
        run=False,
    )


# Every per-step option that could read the device: a fused optimizer (which the guard skips through on the device),
# clipping, accumulation, per-token loss normalisation, the progress bar, throughput, samples, checkpoints.
FAST_PATH = (
    "--model.fused=true",
    "--trainer.gradient_clip_val=1.0",
    "--trainer.accumulate_grad_batches=2",
    "--trainer.log_every_n_steps=50",
    "--trainer.enable_progress_bar=true",
    "--nonfinite.check_every_n_steps=50",
    "--checkpoint.every_n_train_steps=50",
)


@pytest.mark.parametrize("preset", ["tiny.yaml", "tiny-translate.yaml"])
def test_the_cli_training_step_never_reads_the_device(tmp_path: Path, preset: str) -> None:
    run = cli(tmp_path, preset, *FAST_PATH, "--trainer.max_steps=10")
    trap = SyncTrap(first=6, last=17)  # micro-batches 6..17: optimizer steps 3..8, past warm-up, no logging step
    run.trainer.callbacks.append(trap)
    run.trainer.fit(run.model, datamodule=run.datamodule)
    assert run.trainer.global_step == 10
    assert trap.trapped == list(range(6, 18))


def test_the_trap_catches_a_read() -> None:
    """The control: the trap does raise on the reads the training step used to make."""
    mask = torch.ones(2, 3, dtype=torch.bool)
    with no_host_reads(), pytest.raises(HostReadError):
        bool(mask.all())
    with no_host_reads(), pytest.raises(HostReadError):
        float(torch.tensor(2.0))
    assert bool(mask.all())  # restored


def test_the_stock_throughput_monitor_and_progress_bar_would_read_the_device(tmp_path: Path, monkeypatch) -> None:
    """The control for the CLI test: with a per-batch token count read on the host, the trap fires."""
    from lit_transformer import callbacks

    monkeypatch.setattr(callbacks, "_token_count", lambda batch: int((batch["labels"] != -100).sum()))
    run = cli(tmp_path, "tiny.yaml", *FAST_PATH, "--trainer.max_steps=6")
    run.trainer.callbacks.append(SyncTrap(first=4, last=8))
    with pytest.raises(HostReadError):
        run.trainer.fit(run.model, datamodule=run.datamodule)


@pytest.mark.parametrize("preset", ["tiny.yaml", "tiny-translate.yaml"])
def test_compile_builds_the_step_as_one_graph_and_trains(tmp_path: Path, preset: str, monkeypatch) -> None:
    """`--model.compile true`: the forward and the loss in one graph (fullgraph: a graph break fails), two steps."""
    compiled: list[bool] = []

    def fast_compile(fn, mode=None, fullgraph=False):
        compiled.append(fullgraph)
        return torch.compile(fn, mode=mode, fullgraph=fullgraph, backend="aot_eager")  # inductor's C++ is slow here

    monkeypatch.setattr(parallelize, "compile_function", fast_compile)
    torch._dynamo.reset()
    run = cli(tmp_path, preset, "--model.compile=true", "--trainer.max_steps=2", "--trainer.enable_progress_bar=false")
    run.trainer.fit(run.model, datamodule=run.datamodule)
    assert compiled == [True] and run.model._compiled_sums is not None
    assert run.trainer.global_step == 2
    assert torch.isfinite(run.trainer.callback_metrics["train/loss"])
    # The parameter names are the plain model's: the checkpoint loads without compiling.
    state = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert set(state) == {f"model.{name}" for name in run.model.model.state_dict()}


def test_compile_scope_blocks_compiles_each_block(tmp_path: Path, monkeypatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kwargs: calls.append(type(self).__name__))
    run = cli(tmp_path, "tiny.yaml", "--model.compile=true", "--model.compile_scope=blocks", "--trainer.max_steps=1")
    run.model.trainer = run.trainer  # configure_model reads the strategy
    run.trainer.strategy._lightning_module = run.model
    run.model.configure_model()
    assert calls == ["DecoderBlock", "DecoderBlock"] and run.model._compiled_sums is None


def test_right_padded_targets_need_no_mask_and_other_padding_is_refused() -> None:
    """Training attends targets with is_causal alone: for right padding, every labelled position gets the logits the
    explicit mask gives; a left-padded target mask is refused before it can be silently wrong."""
    from lit_transformer.config import TransformerConfig
    from lit_transformer.model import Transformer
    from lit_transformer.tasks.translation import check_right_padded

    torch.manual_seed(0)
    cfg = TransformerConfig.preset("tiny", topology="encoder_decoder", bos_token_id=1, eos_token_id=2)
    model = Transformer(cfg).eval()
    src, tgt = torch.randint(3, cfg.vocab_size, (3, 9)), torch.randint(3, cfg.vocab_size, (3, 7))
    src_mask = torch.arange(9) < torch.tensor([9, 5, 7])[:, None]
    tgt_mask = torch.arange(7) < torch.tensor([7, 3, 5])[:, None]  # right padding
    masked = model(src, tgt, src_mask=src_mask, tgt_mask=tgt_mask)
    causal = model(src, tgt, src_mask=src_mask)
    torch.testing.assert_close(causal[tgt_mask], masked[tgt_mask])
    check_right_padded(tgt_mask)
    with pytest.raises(ValueError, match="pads targets on the left or in the middle"):
        check_right_padded(tgt_mask.flip(1))
