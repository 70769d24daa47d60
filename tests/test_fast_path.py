"""The GPU fast path, checked on a CPU: the CLI's training step never makes the host wait for the device, the step's
forward and loss compile as one graph, and translation targets need no mask.

A GPU makes the host wait wherever Python reads a tensor (`.item()`, `bool()`, `float()`, `int()`, `.tolist()`), copies
one to the host (`.cpu()`, `.to("cpu")`, `.numpy()`), or asks for a result whose size depends on the values (a boolean
mask index `x[mask]`, `masked_select`, `nonzero`, `argwhere`, one-argument `where`): the CPU then stops queueing
kernels until the GPU has caught up. These cost nothing on a CPU, but they are the same calls, so making them raise
during steady-state training steps finds every one of them: the reads by patching the Tensor methods, the rest with a
TorchFunctionMode that sees every torch call the step makes.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import lightning as L
import pytest
import torch
from torch.overrides import TorchFunctionMode

from lit_transformer.cli.lightning_cli import TransformerCLI, run_cli

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ROOT / "configs" / "presets"
READS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__")


class HostReadError(AssertionError):
    pass


# Calls that copy to the host or whose output size depends on the values (a GPU computes it, the host waits to size it).
SYNCING = {
    torch.Tensor.cpu: "Tensor.cpu",
    torch.Tensor.numpy: "Tensor.numpy",
    torch.Tensor.nonzero: "Tensor.nonzero",
    torch.nonzero: "torch.nonzero",
    torch.Tensor.argwhere: "Tensor.argwhere",
    torch.argwhere: "torch.argwhere",
    torch.Tensor.masked_select: "Tensor.masked_select",
    torch.masked_select: "torch.masked_select",
    torch.Tensor.masked_scatter: "Tensor.masked_scatter",
    torch.unique: "torch.unique",
    torch.Tensor.unique: "Tensor.unique",
}


def _to_host(args: tuple, kwargs: dict) -> bool:
    """Whether a Tensor.to call names the CPU ("cpu"). On this CPU every device is the CPU, so a move to a device
    object (`x.to(grads[0].device)`, Lightning's batch transfer) is a move to wherever the step runs, which on a GPU
    is the GPU: allowed; the CPU spelt out is the host."""
    targets = [*args[1:], kwargs.get("device")]
    return any(isinstance(t, str) and torch.device(t).type == "cpu" for t in targets)


def _boolean_index(index) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)


class _RefuseSyncingCalls(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = SYNCING.get(func)
        if func is torch.Tensor.to and _to_host(args, kwargs):
            name = "Tensor.to(cpu)"
        elif func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and _boolean_index(args[1]):
            name = "a boolean mask index"
        elif func is torch.where and len(args) + len(kwargs) == 1:
            name = "one-argument torch.where"
        if name is not None:
            raise HostReadError(f"{name} called in a training step: a host synchronisation on a GPU")
        return func(*args, **kwargs)


@contextlib.contextmanager
def no_host_reads(calls: bool = True):
    """Every tensor read by the host, copy to the host, or value-sized result raises inside the block. calls=False
    leaves out the torch-function mode that catches copies and value-sized results: dynamo guards on the mode stack,
    so a compiled step entered under it is traced again (the eager tests catch those calls on the same code)."""
    saved = {name: getattr(torch.Tensor, name) for name in READS}

    def refuse(name):
        def read(self, *args, **kwargs):
            raise HostReadError(f"Tensor.{name} called in a training step: a host synchronisation on a GPU")

        return read

    try:
        for name in READS:
            setattr(torch.Tensor, name, refuse(name))
        with _RefuseSyncingCalls() if calls else contextlib.nullcontext():
            yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


class SyncTrap(L.Callback):
    """Refuse host reads from the start of batch `first` to the end of batch `last` (warm-up and logging outside)."""

    def __init__(self, first: int, last: int, calls: bool = True) -> None:
        self.first, self.last, self.calls = first, last, calls
        self.trapped: list[int] = []
        self._context: contextlib.AbstractContextManager | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.first <= trainer.fit_loop.total_batch_idx <= self.last and self._context is None:
            self._context = no_host_reads(self.calls)
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


SYNCS = {
    "bool": lambda x, mask: bool(mask.all()),
    "float": lambda x, mask: float(x.sum()),
    "item": lambda x, mask: x.sum().item(),
    "cpu": lambda x, mask: x.cpu(),
    "to cpu": lambda x, mask: x.to("cpu"),
    "to cpu keyword": lambda x, mask: x.to(device="cpu", dtype=torch.float64),
    "numpy": lambda x, mask: x.numpy(),
    "mask index": lambda x, mask: x[mask],
    "mask index in a tuple": lambda x, mask: x[mask[:, 0], :],
    "mask assignment": lambda x, mask: x.__setitem__(mask, 0.0),
    "masked_select": lambda x, mask: x.masked_select(mask),
    "torch.masked_select": lambda x, mask: torch.masked_select(x, mask),
    "nonzero": lambda x, mask: mask.nonzero(),
    "torch.nonzero": lambda x, mask: torch.nonzero(mask),
    "argwhere": lambda x, mask: torch.argwhere(mask),
    "where": lambda x, mask: torch.where(mask),
    "unique": lambda x, mask: x.unique(),
}


@pytest.mark.parametrize("call", SYNCS.values(), ids=SYNCS.keys())
def test_the_trap_catches_each_kind_of_synchronisation(call) -> None:
    """The control: the trap raises on every call that makes a GPU's host wait, and lets the same work through
    written without one (masked_fill, where with three arguments, an index tensor)."""
    x, mask = torch.randn(2, 3), torch.rand(2, 3) > 0.5
    with no_host_reads(), pytest.raises(HostReadError):
        call(x, mask)
    with no_host_reads():
        x.masked_fill(mask, 0.0), torch.where(mask, x, 0.0), x[torch.tensor([1, 0])], x[:, 1:], x.to(torch.float64)
    call(x, mask)  # restored


def test_the_stock_throughput_monitor_and_progress_bar_would_read_the_device(tmp_path: Path, monkeypatch) -> None:
    """The control for the CLI test: with a per-batch token count read on the host, the trap fires."""
    from lit_transformer.engine import monitoring as callbacks

    monkeypatch.setattr(callbacks, "_token_count", lambda batch: int((batch["labels"] != -100).sum()))
    run = cli(tmp_path, "tiny.yaml", *FAST_PATH, "--trainer.max_steps=6")
    run.trainer.callbacks.append(SyncTrap(first=4, last=8))
    with pytest.raises(HostReadError):
        run.trainer.fit(run.model, datamodule=run.datamodule)


@pytest.mark.parametrize("preset", ["tiny.yaml", "tiny-translate.yaml"])
def test_compile_builds_the_step_as_one_graph_and_trains_as_eager_does(
    tmp_path: Path, preset: str, monkeypatch
) -> None:
    """`--model.compile true`: the forward and the loss in one graph (fullgraph: a graph break fails); two steps give
    the loss and the weights that two eager steps give (the package's own compile path, torch.compile's backend
    switched to aot_eager: inductor's C++ is slow here, and the graph, its autograd and the loss are the same).
    Tolerance: the same fp32 kernels summed in another order, over a few thousand tokens: 1e-5 relative."""
    compiled: list[bool] = []
    compile = torch.compile

    def fast_compile(fn, **kwargs):
        compiled.append(kwargs.get("fullgraph", False))
        assert kwargs.get("mode") is None
        return compile(fn, fullgraph=kwargs.get("fullgraph", False), backend="aot_eager")

    monkeypatch.setattr(torch, "compile", fast_compile)
    torch._dynamo.reset()
    common = ("--trainer.max_steps=2", "--trainer.enable_progress_bar=false")
    runs = {}
    for flag in ("true", "false"):
        run = runs[flag] = cli(tmp_path / flag, preset, f"--model.compile={flag}", *common)
        run.trainer.fit(run.model, datamodule=run.datamodule)
        assert run.trainer.global_step == 2
    assert compiled == [True] and runs["true"].model._compiled_sums is not None
    losses = {flag: float(run.trainer.callback_metrics["train/loss"]) for flag, run in runs.items()}
    assert math.isfinite(losses["true"]) and losses["true"] == pytest.approx(losses["false"], rel=1e-5)
    eager = dict(runs["false"].model.model.named_parameters())
    for name, param in runs["true"].model.model.named_parameters():
        torch.testing.assert_close(param, eager[name], rtol=1e-5, atol=1e-6, msg=name)
    # The parameter names are the plain model's: the checkpoint loads without compiling.
    state = torch.load(tmp_path / "true" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert set(state) == {f"model.{name}" for name in runs["true"].model.model.state_dict()}


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
