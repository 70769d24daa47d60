"""The error that rounding to an int8 grid adds to a Linear layer's output, by the rounding-noise model.

A dynamic int8 Linear rounds its input x to a per-tensor grid of step s_x (the range of x, 0 included, over the
activation levels) and each weight row W_j to a symmetric grid of step s_j = max|W_j| / weight levels. A rounding
error is spread evenly over one step, so it has variance step^2 / 12, and the output error
    y_j - ŷ_j = sum_i (dx_i W_ji + x_i dW_ji)    (second-order terms dx dW are smaller still)
has variance sigma_j^2 = s_x^2 / 12 * sum_i W_ji^2 + s_j^2 / 12 * sum_i x_i^2. Errors of independent roundings add
like a sum of many small independent terms, nearly Gaussian: 6 sigma is exceeded once in ~5e8 outputs.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch

SIGMAS = 6.0


def linear_error_sigma(x: torch.Tensor, weight: torch.Tensor, activation_levels: float, weight_levels: float):
    """sigma of each output (..., out) of x @ weight.T rounded as above; x (..., in), weight (out, in)."""
    x, weight = x.double(), weight.double()
    s_x = (x.max().clamp(min=0) - x.min().clamp(max=0)) / activation_levels
    s_w = weight.abs().amax(dim=1) / weight_levels  # (out,)
    variance = s_x**2 / 12 * (weight**2).sum(dim=1) + (x**2).sum(dim=-1, keepdim=True) * s_w**2 / 12
    return variance.sqrt()


@contextlib.contextmanager
def rounding_noise(
    model: torch.nn.Module,
    generator: torch.Generator,
    activation_levels: float,
    weight_levels: float,
    table_levels: float | None = None,
) -> Iterator[None]:
    """Inside the block the fp32 model computes as if each Linear layer rounded its input and weights to int8 grids:
    every Linear output gets Gaussian noise of its rounding sigma (linear_error_sigma), and with table_levels every
    embedding lookup the noise of its table rounded to one per-tensor grid of that many steps. Run a few times, it
    gives the spread of logits that the roundings cause (propagated through the network as the real errors are)."""

    def noisy_linear(module, args, out):
        sigma = linear_error_sigma(args[0], module.weight, activation_levels, weight_levels)
        return out + (sigma * torch.randn(out.shape, generator=generator, dtype=torch.float64)).to(out.dtype)

    def noisy_table(module, args, out):
        table = module.weight.double()
        step = (table.max().clamp(min=0) - table.min().clamp(max=0)) / table_levels
        return out + (step / math.sqrt(12) * torch.randn(out.shape, generator=generator, dtype=torch.float64)).to(
            out.dtype
        )

    hooks = []
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            hooks.append(module.register_forward_hook(noisy_linear))
        elif isinstance(module, torch.nn.Embedding) and table_levels is not None:
            hooks.append(module.register_forward_hook(noisy_table))
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()
