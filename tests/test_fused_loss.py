"""The fused linear + cross-entropy lever (liger-kernel, GPU only): refused with what to do where it cannot run, and
its contract (summed loss, summed NLL, count; padded vocabulary rows never count) pinned by the plain reference."""

from __future__ import annotations

import pytest
import torch

from lit_transformer.errors import ConfigError
from lit_transformer.tasks.fused_loss import (
    fused_linear_cross_entropy,
    reference_linear_cross_entropy,
    require_fused_loss,
)
from lit_transformer.tasks.losses import smoothed_cross_entropy


def test_the_fused_loss_is_refused_on_a_cpu_with_the_fix_named() -> None:
    with pytest.raises(ValueError, match="needs a CUDA device.*drop --model.task.init_args.fused_loss"):
        require_fused_loss("cpu")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        fused_linear_cross_entropy(torch.randn(4, 8), torch.randn(10, 8), torch.tensor([1, 2, -100, 3]), 10)


def test_without_liger_kernel_the_error_names_the_extra(monkeypatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_liger(name, *args, **kwargs):
        if name.startswith("liger_kernel"):
            raise ImportError("No module named 'liger_kernel'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_liger)
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[gpu\]'"):
        require_fused_loss("cuda")  # a device description: no GPU is needed to name one


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_the_reference_is_todays_loss_on_the_real_vocabulary(smoothing: float) -> None:
    """Rows past vocab_size (a padded output layer) never enter the softmax: the same numbers as today's loss on the
    logits the model returns (already cut to the real vocabulary)."""
    torch.manual_seed(0)
    hidden, weight = torch.randn(2, 5, 8), torch.randn(16, 8)  # 13 real ids, 3 rows of padding
    labels = torch.randint(0, 13, (2, 5))
    labels[1, 3:] = -100
    got = reference_linear_cross_entropy(hidden, weight, labels, 13, smoothing)
    want = smoothed_cross_entropy((hidden @ weight.T)[..., :13], labels, smoothing)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
    assert int(got[2]) == 8


def test_fit_with_the_fused_loss_on_a_cpu_stops_before_the_first_step(tmp_path) -> None:
    """The language-modelling task's `fused_loss` is a CLI switch; on this CPU fit refuses it at setup, naming the fix."""
    from test_fast_path import cli

    run = cli(
        tmp_path,
        "tiny.yaml",
        "--model.task=lit_transformer.tasks.LanguageModeling",
        "--model.task.init_args.fused_loss=true",
        "--trainer.max_steps=1",
    )
    assert run.model.task.fused_loss
    with pytest.raises(ValueError, match="needs a CUDA device"):
        run.trainer.fit(run.model, datamodule=run.datamodule)
    assert run.trainer.global_step == 0


def test_decode_without_projection_gives_the_hidden_states_the_output_layer_reads() -> None:
    from lit_transformer.config import TransformerConfig
    from lit_transformer.model import Transformer

    torch.manual_seed(0)
    model = Transformer(TransformerConfig.preset("tiny")).eval()
    tokens = torch.randint(0, model.config.vocab_size, (2, 7))
    hidden = model.decode(tokens, project=False)
    assert hidden.shape == (2, 7, model.config.d_model)
    torch.testing.assert_close(model._logits(hidden), model(tokens))
