"""What a run shows and writes of its task's output: generated samples as text and attention maps as images in
TensorBoard, and `predict`'s rows as JSON lines."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only, rank_zero_warn

from lit_transformer.config import GenerationConfig
from lit_transformer.errors import ConfigError, make_folder


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
            generation: How a language model's samples are decoded (e.g. --samples.generation.max_new_tokens 120):
                the command line's fields over its task's defaults (GenerationConfig.for_task); None uses those. Translations are decoded as the
                LightningModule's own generation config says, as BLEU is.
            num_translations: Validation sources translated for an encoder-decoder model.
            seed: Seed of the sampling generator, so successive samples differ only by what the model learned.
        """
        if num_translations < 0:
            raise ConfigError(
                f"samples.num_translations={num_translations} must be 0 (none) or more",
                keys=["samples.num_translations"],
            )
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
        if max_tokens < 1:
            raise ConfigError(f"attention.max_tokens={max_tokens} must be 1 or more", keys=["attention.max_tokens"])
        if max_layers < 0:
            raise ConfigError(
                f"attention.max_layers={max_layers} must be 0 (no maps) or more", keys=["attention.max_layers"]
            )
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


class PredictionWriter(BasePredictionWriter):
    """`predict` writes one JSON line per input, in input order: {"input", "output", "tokens"} (the new token ids).

    Lines are written batch by batch and flushed, so a long run shows its progress and an interrupted one keeps
    what it finished. Under several processes each rank writes its rows with their input index to a part file
    beside the output (`.NAME.rankN.part`), and at the end the first rank writes the output from them, in input
    order, each input once (the distributed sampler repeats a few to give every rank as many), and removes them.
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
        self._part: Path | None = None  # this rank's rows, with several processes

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        path = Path(self.output) if self.output else Path(trainer.default_root_dir) / "predictions.jsonl"
        if path.is_dir():
            raise ConfigError(
                f"--predictions.output {path} is a folder: give the file to write, e.g. {path / 'predictions.jsonl'}",
                keys=["predictions.output"],
            )
        inputs = getattr(trainer.datamodule, "predict_file", None)
        if inputs and path.exists() and path.resolve() == Path(inputs).resolve():
            raise ConfigError(
                f"--predictions.output {path} is the predict_file: the predictions would overwrite their inputs; "
                "give another file",
                keys=["predictions.output", "data.init_args.predict_file"],
            )
        make_folder(path.parent, "--predictions.output", keys=["predictions.output"], file=path)
        self.path = path
        self._part = _part_file(path, trainer.global_rank) if trainer.world_size > 1 else None
        rank_zero_info(f"predict: writing {path}")

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
        if self._file is None:  # opened with the first predictions: a refusal before them leaves an old file whole
            self._file = (self._part or self.path).open("w", encoding="utf-8")
        if self._part is not None:  # with its input's index, which orders the merged file
            indices = batch_indices if batch_indices is not None else batch.get("index")
            for index, row in zip(indices, prediction, strict=True):
                self._file.write(json.dumps({"index": int(index), "row": row}, ensure_ascii=False) + "\n")
        else:
            for row in prediction:
                self._file.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._file.flush()

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._file is None and self.path is not None:  # a run with no batch: its (empty) predictions all the same
            self._file = (self._part or self.path).open("w", encoding="utf-8")
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._part is not None and self.path is not None:
            trainer.strategy.barrier("predictions")  # every rank's part is whole
            if trainer.is_global_zero:
                merge_parts(self.path, [_part_file(self.path, rank) for rank in range(trainer.world_size)])
            trainer.strategy.barrier("predictions merged")


def _part_file(path: Path, rank: int) -> Path:
    return path.with_name(f".{path.name}.rank{rank}.part")


def merge_parts(path: Path, parts: list[Path]) -> None:
    """The output from the ranks' part files: each input's row once, in input order; the parts are removed."""
    rows: dict[int, Any] = {}
    for part in parts:
        with part.open(encoding="utf-8") as lines:
            for line in lines:
                entry = json.loads(line)
                rows.setdefault(entry["index"], entry["row"])
    with path.open("w", encoding="utf-8") as out:
        for index in sorted(rows):
            out.write(json.dumps(rows[index], ensure_ascii=False) + "\n")
    for part in parts:
        part.unlink()
