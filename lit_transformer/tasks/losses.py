"""The losses of the tasks, under one contract: (training loss, NLL, count), each summed over the batch's targets.

Sums rather than means: the engine (LitTransformer) picks the normaliser (the optimizer step's target count, or each
micro-batch's own), so a task never divides. A token task's targets are its non-ignored labels; a classifier's are
its examples. IGNORE_INDEX, the label of a position without a target, comes from the batch layout (data.text),
the layer below both the DataModules that write it and the tasks that read it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lit_transformer.data.text import IGNORE_INDEX
from lit_transformer.errors import ConfigError

__all__ = ["IGNORE_INDEX", "check_label_smoothing", "smoothed_cross_entropy"]


def check_label_smoothing(smoothing: float) -> None:
    """Refuse a smoothing outside [0, 1): the loss (1 - eps) * NLL + eps * uniform then weighs the NLL by zero or less,
    and training pushes the targets' probability down (torch's cross_entropy refuses such a value too)."""
    if not 0.0 <= smoothing < 1.0:
        raise ConfigError(
            f"model.task.init_args.label_smoothing={smoothing} must lie in [0, 1) (the paper's 0.1): at 1 or above "
            "the loss no longer rewards the target, below 0 it is no smoothing",
            keys=["model.task.init_args.label_smoothing"],
        )


def smoothed_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, smoothing: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(training loss, NLL, token count), the losses summed over the non-ignored labels.

    Per token, the smoothed loss is (1 - eps) * -log p(target) + eps * mean over the vocabulary of -log p(v): the
    target distribution gives eps / V to every id, special tokens included, as torch's
    ``cross_entropy(label_smoothing=eps)`` does (fairseq's label_smoothed_nll_loss gives the target 1 - eps and every
    other id eps / (V - 1); the Annotated Transformer zeroes the pad column). We keep the
    whole vocabulary because the loss then does not depend on which ids a tokenizer reserves, it matches torch's
    definition, and the mass a special token receives, eps / V, is negligible; padding is never a label, so it is never
    taught as an output. Perplexity comes from the NLL, so label smoothing never inflates it.

    One log-softmax, in fp32 at least (16-bit log-probabilities would round the loss), then F.nll_loss: compiled,
    that keeps one fewer (tokens, vocabulary) fp32 buffer than a gather of the target log-probabilities (measured:
    250 MB less at 4,096 tokens x 16,000 ids, the excess the CLI's step showed on a GPU).
    """
    check_label_smoothing(smoothing)
    logits = logits.reshape(-1, logits.size(-1))
    labels = labels.reshape(-1)
    keep = labels != IGNORE_INDEX
    log_probs = logits.to(torch.promote_types(logits.dtype, torch.float32)).log_softmax(dim=-1)  # (N, V)
    nll = F.nll_loss(log_probs, labels, ignore_index=IGNORE_INDEX, reduction="sum")
    count = keep.sum()
    if smoothing == 0.0:
        return nll, nll, count
    uniform = -(log_probs.mean(dim=-1) * keep).sum()
    return (1.0 - smoothing) * nll + smoothing * uniform, nll, count


def classification_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    smoothing: float = 0.0,
    class_weights: torch.Tensor | None = None,
    multi_label: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(training loss, NLL, weight), each summed over the batch's examples: the same contract as
    smoothed_cross_entropy, with an example in the place of a token, so the step normalisation is shared.

    Single-label: cross-entropy of (B, C) logits against (B,) class ids, label smoothing as smoothed_cross_entropy
    defines it; with class_weights, an example's NLL weighs class_weights[label] and the weight is the sum of those,
    so a step's loss is torch's ``cross_entropy(weight=..., label_smoothing=...)`` mean, taken over the whole
    optimizer step (all micro-batches and ranks) rather than per micro-batch.
    Multi-label: binary cross-entropy of (B, C) logits against (B, C) 0/1 targets, summed over labels per example
    (smoothing pulls targets towards 1/2; class_weights weigh each label's term); the weight is the example count.
    """
    check_label_smoothing(smoothing)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if multi_label:
        targets = labels.to(logits.dtype)
        nll = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
        smoothed = targets * (1 - smoothing) + 0.5 * smoothing
        loss = F.binary_cross_entropy_with_logits(logits, smoothed, reduction="none") if smoothing else nll
        if class_weights is not None:
            loss, nll = loss * class_weights, nll * class_weights
        count = torch.tensor(float(len(labels)), device=logits.device)
        return loss.sum(), nll.sum(), count
    log_probs = logits.log_softmax(dim=-1)  # (B, C)
    weight = torch.ones_like(log_probs[:, 0]) if class_weights is None else class_weights.to(logits.dtype)[labels]
    nll = -log_probs.gather(1, labels[:, None]).squeeze(1) * weight
    if not smoothing:
        return nll.sum(), nll.sum(), weight.sum()
    # The smoothing term weighs each class by its own weight, as torch's cross_entropy(weight=, label_smoothing=) does.
    per_class = log_probs if class_weights is None else log_probs * class_weights.to(logits.dtype)
    loss = (1.0 - smoothing) * nll - smoothing * per_class.mean(dim=-1)
    return loss.sum(), nll.sum(), weight.sum()
