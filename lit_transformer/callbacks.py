"""What Lightning lacks for watching a Transformer train: samples as text, attention maps as images, tokens/s and MFU."""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import BasePredictionWriter, LearningRateMonitor, TQDMProgressBar
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only, rank_zero_warn

from lit_transformer.config import GenerationConfig
from lit_transformer.lightning_compat import compute_dtype
from lit_transformer.module import trainer_logs_now
from lit_transformer.tasks.losses import IGNORE_INDEX


def _tensorboard(trainer: L.Trainer):
    """The TensorBoard SummaryWriter of the run, or None when another logger is in use."""
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            return logger.experiment
    return None


def _first_validation_batch(trainer: L.Trainer) -> dict[str, Any] | None:
    datamodule = getattr(trainer, "datamodule", None)
    if datamodule is None:
        return None
    return next(iter(datamodule.val_dataloader()), None)


class GenerateSamples(L.Callback):
    """At every validation, generate from fixed prompts (LM) or translate validation sources, and log the text."""

    def __init__(
        self,
        prompts: list[str] | None = None,
        generation: GenerationConfig | None = None,
        num_translations: int = 4,
        seed: int = 0,
    ) -> None:
        """
        Args:
            prompts: Prompts for a decoder-only model; None starts from a newline.
            generation: How a language model's samples are decoded (e.g. --samples.generation.max_new_tokens 120);
                None uses its task's defaults (GenerationConfig.for_task). Translations are decoded as the
                LightningModule's own generation config says, as BLEU is.
            num_translations: Validation sources translated for an encoder-decoder model.
            seed: Seed of the sampling generator, so successive samples differ only by what the model learned.
        """
        self.prompts = prompts or ["\n"]
        self.generation = generation
        self.num_translations = num_translations
        self.seed = seed
        self.last_samples: list[str] = []

    @rank_zero_only
    @torch.no_grad()
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or pl_module.tokenizer is None or _sharded_across_ranks(trainer, self):
            return
        with trainer.precision_plugin.forward_context():
            self.last_samples = self.samples(trainer, pl_module)
        writer = _tensorboard(trainer)
        if writer is not None:
            for i, text in enumerate(self.last_samples):
                # Two trailing spaces: TensorBoard renders text as markdown, where a newline alone is not a break.
                writer.add_text(f"samples/{i}", text.replace("\n", "  \n"), trainer.global_step)

    def samples(self, trainer: L.Trainer, pl_module: L.LightningModule) -> list[str]:
        """What the module's task shows of itself (Task.samples): a language model continues the prompts, a
        translation model translates validation sources, a classifier shows nothing (its metrics say it all)."""
        return pl_module.task.samples(pl_module, self, lambda: _first_validation_batch(trainer))


class AttentionMaps(L.Callback):
    """At every validation, log each layer's attention (heads in a grid, tokens on the axes) as an image."""

    def __init__(self, max_tokens: int = 24, max_layers: int = 6) -> None:
        """
        Args:
            max_tokens: Tokens of the first validation sample shown on each axis.
            max_layers: Layers drawn per attention kind (the first ones); 0 turns the maps off (no forward pass).
        """
        self.max_tokens = max_tokens
        self.max_layers = max_layers

    @rank_zero_only
    @torch.no_grad()
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        writer = _tensorboard(trainer)
        if trainer.sanity_checking or writer is None or pl_module.tokenizer is None or self.max_layers < 1:
            return
        batch = _first_validation_batch(trainer)
        if batch is None or _sharded_across_ranks(trainer, self):
            return
        with trainer.precision_plugin.forward_context():
            for tag, image in self.images(pl_module, batch):
                writer.add_image(tag, image, trainer.global_step, dataformats="HWC")

    def images(self, pl_module: L.LightningModule, batch: dict[str, Any]) -> Iterator[tuple[str, np.ndarray]]:
        """(tag, RGB image) per layer and attention kind: `attention/{kind}/layer_{i}`."""
        model = pl_module.model
        was_training = model.training
        model.eval()
        attentions, axes = pl_module.task.attention(pl_module, batch, self.max_tokens)
        model.train(was_training)
        for kind, layers in attentions.items():
            queries, keys = axes[kind]
            for layer, weights in enumerate(layers[: self.max_layers]):
                yield f"attention/{kind}/layer_{layer}", heads_image(weights[0].float().cpu(), queries, keys)


_CELL = 11  # pixels per token: a 6 pt label (8 px at 100 dpi) beside each row and under each column
_LABEL_CHARS = 16  # longer tokens are cut, with an ellipsis, so that one token cannot widen the margins
_HEAD_COLUMNS = 4


def heads_image(weights: torch.Tensor, queries: list[str], keys: list[str]) -> np.ndarray:
    """One heatmap per head of (H, Tq, Tk) attention weights, in a grid of up to 4 columns, as an RGB uint8 image
    (height, width, 3): query tokens left of each row of heads, key tokens under each column, viridis over 0..1.

    Matplotlib draws only the text (head titles and token labels), once per set of labels: every layer of a kind, and
    every validation of a run, shares them (`_heads_frame` is cached). Each weight is then painted as a square block of
    pixels, which is what `imshow(interpolation="nearest")` would draw, without the cost of axes and ticks per head.
    """
    from matplotlib import colormaps

    frame, corners = _heads_frame(weights.size(0), tuple(queries), tuple(keys))
    colours = colormaps["viridis"].with_extremes(bad="white")(weights.numpy(), bytes=True)[..., :3]
    image = frame.copy()
    height, width = len(queries) * _CELL, len(keys) * _CELL
    for colour, (top, left) in zip(colours, corners, strict=True):
        image[top : top + height, left : left + width] = colour.repeat(_CELL, axis=0).repeat(_CELL, axis=1)
    return image


@functools.lru_cache(maxsize=8)
def _heads_frame(
    heads: int, queries: tuple[str, ...], keys: tuple[str, ...]
) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """The image of `heads_image` without its cells (read-only), and each head's top-left cell pixel (row, column).
    Drawn on a matplotlib Figure with the Agg canvas directly: no pyplot, no global figure state."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.font_manager import FontProperties

    dpi, font, pad, title, gap = 100, 6, 3, 14, 6  # sizes in pixels, font in points
    queries, keys = tuple(map(_short_label, queries)), tuple(map(_short_label, keys))
    figure = Figure(dpi=dpi)
    canvas = FigureCanvasAgg(figure)
    renderer = canvas.get_renderer()

    def widest(labels: tuple[str, ...], points: float) -> int:
        prop = FontProperties(size=points)
        return max(round(renderer.get_text_width_height_descent(s, prop, ismath=False)[0]) for s in labels)

    left, bottom = pad + widest(queries, font), pad + widest(keys, font)
    cols = min(_HEAD_COLUMNS, heads)
    rows = -(-heads // cols)
    head_w, head_h = len(keys) * _CELL, len(queries) * _CELL
    slot = max(head_w, widest((f"head {heads - 1}",), 7) + 2 * pad)  # a title wider than its head's few keys
    width = left + pad + cols * slot + (cols - 1) * gap + pad
    height = rows * (title + head_h) + (rows - 1) * gap + bottom + pad
    figure.set_size_inches(width / dpi, height / dpi)
    corners = []
    text = {"fontsize": font, "parse_math": False}  # a token such as "$x$" is text, not mathtext
    for h in range(heads):
        row, col = divmod(h, cols)
        top, x = row * (title + head_h + gap) + title, left + pad + col * (slot + gap) + (slot - head_w) // 2
        corners.append((top, x))
        y = height - top  # matplotlib counts from the bottom
        figure.text((x + head_w / 2) / width, (y + 2) / height, f"head {h}", fontsize=7, ha="center", va="bottom")
        if col == 0:
            for i, label in enumerate(queries):
                yi = (y - (i + 0.5) * _CELL) / height
                figure.text((x - pad) / width, yi, label, ha="right", va="center", **text)
        if h + cols >= heads:  # the lowest head of its column
            for j, label in enumerate(keys):
                xj = (x + (j + 0.5) * _CELL) / width
                figure.text(xj, (y - head_h - pad) / height, label, ha="center", va="top", rotation=90, **text)
    canvas.draw()
    frame = np.asarray(canvas.buffer_rgba())[..., :3].copy()
    frame.setflags(write=False)
    return frame, corners


def _short_label(label: str) -> str:
    return label if len(label) <= _LABEL_CHARS else label[: _LABEL_CHARS - 1] + "…"


class TokenThroughputMonitor(L.Callback):
    """Training throughput in tokens/s, samples/s and MFU, per logging interval, on any device.

    Lightning's ThroughputMonitor synchronises the GPU after every batch to time it, which stalls the pipeline the
    step is meant to keep full. Here the batches' token counts add up on the device, and the clock is read (after one
    synchronisation) only at the steps the trainer logs: the figures are means over the interval since the last log.
    Tags are Lightning's: train/device/items_per_sec (tokens), train/device/samples_per_sec, train/device/mfu, ...
    Lightning knows the peak FLOP/s of datacenter GPUs only; elsewhere (a CPU) the peak is given or measured here with
    a matmul, so that MFU is reported against what this machine can actually do.
    """

    def __init__(self, peak_flops: float | None = None) -> None:
        """
        Args:
            peak_flops: The device's peak FLOP/s for MFU; None uses Lightning's table, else measures a matmul.
        """
        self.peak_flops = peak_flops
        self.available_flops: float | None = None
        self.tokens_per_sec: float | None = None
        self._step_before = -1  # global_step when this batch began
        self._reset(None)

    def _reset(self, start: float | None) -> None:
        self._start = start
        self._batches = self._samples = 0
        self._flops = 0.0
        self._tokens: torch.Tensor | int = 0

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        from lightning.fabric.utilities.throughput import get_available_flops

        if stage != "fit":
            return
        device, dtype = trainer.strategy.root_device, compute_dtype(trainer.precision_plugin)
        peak = self.peak_flops or get_available_flops(device, dtype)
        if peak is None:
            from lit_transformer.parallelize import matmul_peak_flops

            peak = matmul_peak_flops(device, dtype)
        self.available_flops = peak

    def _now(self, trainer: L.Trainer) -> float:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize()  # the one synchronisation per logging interval
        return time.perf_counter()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._reset(self._now(trainer))

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self._step_before = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, *args) -> None:
        self._batches += 1
        self._samples += _batch_size(batch)
        self._tokens = self._tokens + _token_count(batch)  # a tensor on the batch's device: nothing is read
        self._flops += getattr(pl_module, "flops_per_batch", None) or 0.0
        # An optimizer step ended this batch (not one of the micro-batches it accumulates) if global_step moved.
        if trainer.global_step == self._step_before or not trainer_logs_now(trainer, step_taken=True):
            return
        now = self._now(trainer)
        elapsed = now - self._start
        tokens = int(self._tokens)
        rates = {
            "batches_per_sec": self._batches / elapsed,
            "samples_per_sec": self._samples / elapsed,
            "items_per_sec": tokens / elapsed,
        }
        if self._flops:
            rates["flops_per_sec"] = self._flops / elapsed
            if self.available_flops:
                rates["mfu"] = rates["flops_per_sec"] / self.available_flops
        metrics = {f"train/device/{name}": value for name, value in rates.items()}
        if trainer.world_size > 1:  # every rank runs the same step: the job's rate is world_size times one rank's
            metrics.update({f"train/{name}": value * trainer.world_size for name, value in rates.items()})
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)
        self.tokens_per_sec = rates["items_per_sec"]  # shown by SyncFreeProgressBar
        self._reset(now)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Validation time is not training time: the next interval starts when training resumes.
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._reset(self._now(trainer))


class SyncFreeProgressBar(TQDMProgressBar):
    """Lightning's TQDM bar, showing the training loss and tokens/s read only at the steps the trainer logs.

    Reading a logged tensor makes the host wait for the GPU. Lightning converts every `prog_bar=True` tensor to a
    number after every batch, so the training step logs nothing to the bar; this bar moves its counter every batch
    and reads train/loss (and the TokenThroughputMonitor's rate) with the logs.
    """

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        if trainer.training:
            loss = trainer.callback_metrics.get("train/loss")
            if loss is not None:
                metrics["loss"] = f"{float(loss):.4g}"
            monitor = next((c for c in trainer.callbacks if isinstance(c, TokenThroughputMonitor)), None)
            if monitor is not None and monitor.tokens_per_sec is not None:
                metrics["tok/s"] = f"{monitor.tokens_per_sec:,.0f}"
        return metrics

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        n = batch_idx + 1
        bar = self.train_progress_bar
        if bar is None or not self._should_update(n, bar.total):
            return
        if not bar.disable:
            bar.n = n
            bar.refresh()
        if trainer_logs_now(trainer, step_taken=True):
            bar.set_postfix(self.get_metrics(trainer, pl_module))


def _sharded_across_ranks(trainer: L.Trainer, callback: L.Callback) -> bool:
    """True (with a warning) where parameters are sharded over several ranks: a forward on rank 0 alone would wait
    forever for the others' shards, so rank-0 callbacks that run the model stand aside."""
    strategy = trainer.strategy
    sharded = isinstance(strategy, FSDPStrategy | ModelParallelStrategy) or getattr(strategy, "zero_stage_3", False)
    if sharded and trainer.world_size > 1:
        rank_zero_warn(
            f"{type(callback).__name__} is skipped: parameters are sharded across {trainer.world_size} ranks"
        )
        return True
    return False


def _batch_size(batch: dict[str, torch.Tensor]) -> int:
    return len(batch["labels"] if "labels" in batch else batch["input_ids"])


def _token_count(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Target tokens of a language-model or translation batch; input tokens of a batch that carries an attention_mask
    (predict inputs and classification passages, whose labels are one per example). A tensor: never read here."""
    if "labels" in batch and "attention_mask" not in batch:
        return (batch["labels"] != IGNORE_INDEX).sum()
    return batch["attention_mask"].sum()


class LearningRateLogger(LearningRateMonitor):
    """Lightning's LearningRateMonitor, per step, that stands aside when a run has no logger (`--trainer.logger false`)."""

    def __init__(self) -> None:
        super().__init__(logging_interval="step")

    def on_train_start(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        if trainer.loggers:
            super().on_train_start(trainer, *args, **kwargs)

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        if trainer.loggers:
            super().on_train_batch_start(trainer, *args, **kwargs)

    def on_train_epoch_start(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        if trainer.loggers:
            super().on_train_epoch_start(trainer, *args, **kwargs)


class PredictionWriter(BasePredictionWriter):
    """`predict` writes one JSON line per input, in input order: {"input", "output", "tokens"} (the new token ids).

    Lines are written batch by batch and flushed, so a long run shows its progress and an interrupted one keeps
    what it finished. Under several processes each rank writes its own file (output with `.rankN` before the suffix).
    """

    def __init__(self, output: str | None = None) -> None:
        """
        Args:
            output: The JSONL file to write; None writes predictions.jsonl in the trainer's default_root_dir.
        """
        super().__init__(write_interval="batch")
        self.output = output
        self._file = None
        self.path: Path | None = None

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        path = Path(self.output) if self.output else Path(trainer.default_root_dir) / "predictions.jsonl"
        if trainer.world_size > 1:
            path = path.with_name(f"{path.stem}.rank{trainer.global_rank}{path.suffix}")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("w", encoding="utf-8")
        rank_zero_info(f"predict: writing {path}")

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
        for row in prediction:
            self._file.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._file.flush()

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def process_rss_mb(pid: int | str = "self", field: str = "VmRSS") -> float | None:
    """A process's resident memory (VmRSS; VmHWM: its peak so far) in MB, from /proc (Linux); None where it cannot be
    read."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            return next(int(line.split()[1]) for line in handle if line.startswith(f"{field}:")) / 1e3
    except (OSError, StopIteration, ValueError):
        return None


class HostMemoryMonitor(L.Callback):
    """The host's resident memory of this process (and of its child processes: DataLoader workers) every N steps.

    Off by default; add it where memory growth over a long run is in question, e.g.
    `--trainer.callbacks+=lit_transformer.callbacks.HostMemoryMonitor`. It logs host/rss_mb and host/children_rss_mb
    to the trainer's loggers, and with `path` also appends one JSON line per record to that file
    ({"stage", "step", "rank", "time", "rss_mb", "peak_rss_mb", "children_rss_mb"}; peak_rss_mb is this process's
    high-water mark so far): a "setup" record once the data is prepared and
    the model built, then one "train" record every `every_n_steps` optimizer steps. Linux only (/proc); elsewhere it
    records nothing.
    """

    def __init__(self, every_n_steps: int = 100, path: str | None = None) -> None:
        """
        Args:
            every_n_steps: Record every this many optimizer steps.
            path: A file to append JSON lines to (each rank writes its own records, tagged with its rank).
        """
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be at least 1, not {every_n_steps}")
        self.every_n_steps = every_n_steps
        self.path = path
        self._last_step: int | None = None

    def _record(self, trainer: L.Trainer, stage: str) -> dict[str, Any] | None:
        rss = process_rss_mb()
        if rss is None:
            return None
        children = 0.0
        try:
            with open(f"/proc/self/task/{os.getpid()}/children") as handle:  # the main thread's children
                pids = handle.read().split()
        except OSError:
            pids = []
        for pid in pids:
            children += process_rss_mb(pid) or 0.0
        record = {"stage": stage, "step": trainer.global_step, "rank": trainer.global_rank, "time": time.time(),
                  "rss_mb": round(rss, 1), "peak_rss_mb": round(process_rss_mb(field="VmHWM") or rss, 1),
                  "children_rss_mb": round(children, 1)}  # fmt: skip
        if self.path is not None:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")
        return record

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._record(trainer, "setup")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step == 0 or step == self._last_step or step % self.every_n_steps:  # accumulation: one record a step
            return
        self._last_step = step
        record = self._record(trainer, "train")
        if record is not None and trainer.is_global_zero:
            metrics = {"host/rss_mb": record["rss_mb"], "host/children_rss_mb": record["children_rss_mb"]}
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=step)
