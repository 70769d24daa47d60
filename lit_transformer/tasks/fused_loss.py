"""The output layer and the cross-entropy as one kernel on a GPU (liger-kernel's fused linear cross-entropy), so the
(tokens, vocabulary) logits are never materialised, in fp32 or at all: on GPT-2 small at 8 x 1024 tokens they are
1.6 GB in fp32, written and read several times per step.

The contract is `smoothed_cross_entropy`'s: (summed training loss, summed NLL, target count) over the labels that are
not IGNORE_INDEX; label smoothing as torch defines it (eps / V to every id). liger-kernel is an optional GPU extra
(`pip install -e '.[gpu]'`), imported only when this path is asked for; a CPU keeps the plain loss.
"""

from __future__ import annotations

import torch

from lit_transformer.errors import ConfigError

IGNORE_INDEX = -100


def require_fused_loss(device: torch.device | str) -> None:
    """Fail with what to do where the fused loss cannot run: no CUDA device, or no liger-kernel."""
    if torch.device(device).type != "cuda":
        raise ConfigError(
            f"fused_loss=true needs a CUDA device (liger-kernel's Triton kernels), not {device}: "
            "drop --model.task.init_args.fused_loss on this machine (the plain loss is the same number)"
        )
    try:
        import liger_kernel  # noqa: F401
    except ImportError as error:
        raise ConfigError(
            "fused_loss=true needs liger-kernel: pip install -e '.[gpu]' (or pip install liger-kernel)"
        ) from error


def fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    vocab_size: int,
    smoothing: float = 0.0,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(training loss, NLL, token count), summed, of `hidden @ weight[:vocab_size].T` against `labels`, computed in
    chunks by liger-kernel without the logits; rows of `weight` past vocab_size (a padded vocabulary) never count.
    softcap: the model's logit_softcap, which liger's kernel applies to each chunk of logits (cap * tanh(z / cap)).

    With label smoothing the NLL takes a second fused pass without gradient (perplexity must stay unsmoothed)."""
    require_fused_loss(hidden.device)
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    hidden = hidden.reshape(-1, hidden.size(-1))
    labels = labels.reshape(-1)
    weight = weight[:vocab_size]

    def loss(eps: float) -> torch.Tensor:
        return liger_fused_linear_cross_entropy(
            hidden, weight, labels, ignore_index=IGNORE_INDEX, label_smoothing=eps, reduction="sum", softcap=softcap
        )

    count = (labels != IGNORE_INDEX).sum()
    total = loss(smoothing)
    if smoothing == 0.0:
        return total, total, count
    with torch.no_grad():
        nll = loss(0.0)
    return total, nll, count


def reference_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    vocab_size: int,
    smoothing: float = 0.0,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the fused path computes, the plain way (logits, fp32 log-softmax): its definition, and the CPU's loss."""
    from lit_transformer.tasks.losses import smoothed_cross_entropy

    logits = hidden @ weight[:vocab_size].T
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    return smoothed_cross_entropy(logits, labels, smoothing)
