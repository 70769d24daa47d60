"""Sequence classification: class weights, accuracy and F1 (macro and per class), the confusion figure, label names."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch

from lit_transformer.errors import ConfigError
from lit_transformer.tasks.base import STAGES, Loss, Task, log_reduced
from lit_transformer.tasks.losses import classification_loss


def confusion_figure(matrix: torch.Tensor, names: list[str]):
    """A confusion matrix (rows: true class, columns: predicted) as a figure, with counts in the cells and each row
    shaded by its share of the true class, so a small class's errors show as clearly as a large one's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = matrix.float()
    shares = counts / counts.sum(dim=1, keepdim=True).clamp(min=1)
    size = 1.0 + 0.6 * len(names)
    fig, ax = plt.subplots(figsize=(size + 1, size))
    image = ax.imshow(shares.numpy(), vmin=0.0, vmax=1.0, cmap="Blues")
    for i in range(len(names)):
        for j in range(len(names)):
            color = "white" if shares[i, j] > 0.5 else "black"
            ax.text(j, i, str(int(counts[i, j])), ha="center", va="center", color=color, fontsize=8)
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right")
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    fig.colorbar(image, ax=ax, fraction=0.046, label="share of the true class")
    fig.tight_layout()
    return fig


class Classification(Task):
    """An encoder_only model with the classification head on {"input_ids", "attention_mask", "labels"} batches:
    labels (B,) class ids, or (B, num_labels) 0/1 targets with multi_label."""

    name: ClassVar[str] = "classification"
    reads: ClassVar[tuple[str, ...]] = ("label_names", "label_counts", "multi_label")
    fullgraph: ClassVar[bool] = False
    architecture: ClassVar[dict[str, str]] = {"topology": "encoder_only", "head": "classification"}

    def __init__(
        self,
        label_smoothing: float = 0.0,
        class_weights: list[float] | Literal["balanced"] | None = None,
        multi_label: bool | None = None,
    ) -> None:
        """
        Args:
            label_smoothing: Label smoothing of the loss (multi-label: targets pulled towards 1/2).
            class_weights: A weight per class in the loss (one per label, multi-label), or "balanced":
                n / (num_labels * n_class) from the training split's label counts; None weighs all equally.
            multi_label: Each text has a set of labels (a sigmoid per label, binary cross-entropy) instead of one
                class (softmax); None follows the DataModule's multi_label.
        """
        super().__init__(label_smoothing)
        if isinstance(class_weights, list) and not all(0.0 <= float(w) < float("inf") for w in class_weights):
            # A negative weight makes training push its class's probability down (and a step's weights may sum to 0).
            raise ConfigError(
                f"model.task.init_args.class_weights={class_weights}: each weight must be a finite number >= 0 "
                '(larger for a rarer class), or "balanced"',
                keys=["model.task.init_args.class_weights"],
            )
        self.class_weights = class_weights
        self.multi_label = multi_label
        self.label_names: list[str] | None = None  # from the data; saved in checkpoints
        self._weights: torch.Tensor | None = None
        self._num_labels = 0

    def check_config(self, config) -> None:
        super().check_config(config)
        self._num_labels = config.num_labels

    def attach(self, module: Any, data: dict[str, Any]) -> None:
        if self.multi_label is None:
            self.multi_label = bool(data.get("multi_label", False))
        if data.get("label_names") is not None:
            self.label_names = list(data["label_names"])
        self._weights = self._resolve_weights(data.get("label_counts"))
        super().attach(module, data)

    def _resolve_weights(self, label_counts) -> torch.Tensor | None:
        weights = self.class_weights
        if weights is None:
            return None
        if weights == "balanced":
            if label_counts is None:
                raise ConfigError('class_weights="balanced" needs a DataModule that counts its labels (label_counts)')
            counts = torch.as_tensor(label_counts(), dtype=torch.float32).clamp(min=1)
            return counts.sum() / (len(counts) * counts)
        if len(weights) != self._num_labels:
            raise ConfigError(f"class_weights has {len(weights)} values for num_labels={self._num_labels}")
        return torch.tensor(weights, dtype=torch.float32)

    def build_metrics(self, config) -> None:
        from torchmetrics import MeanMetric
        from torchmetrics.classification import (
            MulticlassAccuracy,
            MulticlassConfusionMatrix,
            MulticlassF1Score,
            MultilabelAccuracy,
            MultilabelF1Score,
        )

        n = config.num_labels
        for stage in STAGES:
            setattr(self, f"{stage}_loss", MeanMetric())
            setattr(self, f"{stage}_nll", MeanMetric())
            if self.multi_label:
                setattr(self, f"{stage}_accuracy", MultilabelAccuracy(num_labels=n, average="micro"))
                setattr(self, f"{stage}_f1", MultilabelF1Score(num_labels=n, average="macro"))
                setattr(self, f"{stage}_class_f1", MultilabelF1Score(num_labels=n, average="none"))
            else:
                setattr(self, f"{stage}_accuracy", MulticlassAccuracy(num_classes=n, average="micro"))
                setattr(self, f"{stage}_f1", MulticlassF1Score(num_classes=n, average="macro"))
                setattr(self, f"{stage}_class_f1", MulticlassF1Score(num_classes=n, average="none"))
                setattr(self, f"{stage}_confusion", MulticlassConfusionMatrix(num_classes=n))

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.label_names is not None:
            checkpoint["label_names"] = list(self.label_names)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if "label_names" in checkpoint:
            self.label_names = list(checkpoint["label_names"])

    def loss(self, model, batch: dict[str, torch.Tensor], generator: torch.Generator | None = None) -> Loss:
        logits, labels = self.logits(model, batch), batch["labels"]
        weights = None if self._weights is None else self._weights.to(logits.device)
        return Loss(
            *classification_loss(logits, labels, self.label_smoothing, weights, bool(self.multi_label)), logits, labels
        )

    def plain_nll(self, out: Loss) -> tuple[torch.Tensor, torch.Tensor]:
        if self._weights is None:
            return out.nll_sum, out.count
        # The weighted loss stays {stage}/loss; {stage}/nll is the plain per-example NLL, comparable across weightings.
        _, nll_sum, _ = classification_loss(out.logits, out.labels, multi_label=bool(self.multi_label))
        return nll_sum, torch.tensor(float(len(out.labels)), device=out.logits.device)

    def update_metrics(self, module: Any, stage: str, out: Loss) -> None:
        """Multi-label metrics are given probabilities: torchmetrics reads preds that all lie in [0, 1] as
        probabilities already, and would threshold such a batch's logits at 0.5 (a probability of 0.62) where
        `predict` thresholds sigmoid(logit) at 0.5. Multi-class metrics take the argmax, the same of either."""
        preds = out.logits.sigmoid() if self.multi_label else out.logits
        for name in ("accuracy", "f1", "class_f1", "confusion"):
            metric = getattr(self, f"{stage}_{name}", None)
            if metric is not None:
                metric.update(preds, out.labels)
        module.log(f"{stage}/f1", getattr(self, f"{stage}_f1"), prog_bar=stage == "val")
        module.log(f"{stage}/accuracy", getattr(self, f"{stage}_accuracy"), prog_bar=stage == "val")

    def names(self) -> list[str]:
        return self.label_names or [str(i) for i in range(self._num_labels)]

    def epoch_end(self, module: Any, stage: str) -> None:
        """Per-class F1 as scalars named by label, and the confusion matrix as an image in TensorBoard."""
        class_f1 = getattr(self, f"{stage}_class_f1", None)
        if class_f1 is None or not class_f1.update_called:
            return
        names = self.names()
        for name, value in zip(names, class_f1.compute(), strict=True):
            log_reduced(module, f"{stage}/f1/{name}", value)
        class_f1.reset()
        confusion = getattr(self, f"{stage}_confusion", None)
        if confusion is None or not confusion.update_called:
            return
        matrix = confusion.compute()  # (true, predicted), synchronised over ranks
        confusion.reset()
        if module.trainer.is_global_zero and not module.trainer.sanity_checking:
            for logger in module.loggers:
                if hasattr(logger.experiment, "add_figure"):
                    figure = confusion_figure(matrix.cpu(), names)
                    logger.experiment.add_figure(f"{stage}/confusion_matrix", figure, module.global_step)

    def predict(self, module: Any, batch: dict[str, Any]) -> list[dict[str, Any]]:
        """{"input", "label", "probability", "probabilities"} per input (multi-label: "labels", the names above 0.5)."""
        logits = module.model(batch["input_ids"], attention_mask=batch["attention_mask"]).float()
        probs = logits.sigmoid() if self.multi_label else logits.softmax(dim=-1)
        names = self.names()
        rows = []
        for text, p in zip(batch["text"], probs.tolist(), strict=True):
            row: dict[str, Any] = {"input": text}
            if self.multi_label:
                row["labels"] = [name for name, q in zip(names, p, strict=True) if q > 0.5]
            else:
                best = max(range(len(p)), key=p.__getitem__)
                row["label"], row["probability"] = names[best], p[best]
            row["probabilities"] = dict(zip(names, p, strict=True))
            rows.append(row)
        return rows

    def attention_labels(self, module: Any, labels: list[str]) -> list[str]:
        return ["[CLS]", *labels] if module.config.pooling == "cls" else labels
