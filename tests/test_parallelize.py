"""Activation checkpointing and compilation applied from outside: same numbers as the plain model, names unchanged."""

from __future__ import annotations

import copy

import pytest
import torch
from model_variants import build, run, single_thread, tokens  # noqa: F401 (autouse fixture)

from lit_transformer.transforms.activation_checkpointing import apply_activation_checkpointing
from lit_transformer.transforms.base import blocks
from lit_transformer.transforms.compilation import compile_blocks

TOPOLOGIES = ["decoder_only", "encoder_decoder"]


def _gradients(model: torch.nn.Module, seed: int = 5) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
    """Loss, gradients and the number of tensors autograd saved for backward, dropout drawn from `seed`."""
    saved = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[0] += 1
        return t

    model.zero_grad()
    torch.manual_seed(seed)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = run(model, tokens(2, 12)).float().square().mean()
    loss.backward()
    grads = {n.replace("_checkpoint_wrapped_module.", ""): p.grad.clone() for n, p in model.named_parameters()}
    return loss.detach(), grads, saved[0]


@pytest.mark.parametrize("mode", ["block", "selective"])
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_activation_checkpointing_gives_the_gradients_of_the_plain_model_with_dropout_on(topology, mode):
    """The recomputation replays each block's dropout masks; the wrapped model stores fewer tensors."""
    plain = build({"topology": topology}, dropout=0.3).train()
    wrapped = copy.deepcopy(plain)
    apply_activation_checkpointing(wrapped, mode=mode)
    assert wrapped.state_dict().keys() == plain.state_dict().keys()  # checkpoints load either way
    loss, grads, saved = _gradients(plain)
    wrapped_loss, wrapped_grads, wrapped_saved = _gradients(wrapped)
    torch.testing.assert_close(wrapped_loss, loss, atol=1e-6, rtol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(wrapped_grads[name], grad, atol=1e-6, rtol=0, msg=name)
    # Only what the blocks need to restart is kept: far fewer saved tensors than the plain model's.
    assert wrapped_saved < saved / 2, (wrapped_saved, saved)
    # and a different dropout draw really changes the gradient, so the equality above is not vacuous
    _, other, _ = _gradients(plain, seed=6)
    assert max((other[n] - g).abs().max() for n, g in grads.items()) > 1e-4


def test_selective_checkpointing_keeps_the_attention_outputs_and_recomputes_the_rest():
    from torch.utils.checkpoint import CheckpointPolicy

    from lit_transformer.transforms.activation_checkpointing import _keep_attention

    attention = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    assert _keep_attention(None, attention) == CheckpointPolicy.MUST_SAVE
    for op in (torch.ops.aten.addmm.default, torch.ops.aten.mm.default, torch.ops.aten.native_layer_norm.default):
        assert _keep_attention(None, op) == CheckpointPolicy.PREFER_RECOMPUTE


@pytest.mark.slow
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_compile_blocks_compiles_every_block_and_changes_no_number(topology):
    torch._dynamo.reset()
    plain = build({"topology": topology})
    compiled = copy.deepcopy(plain)
    compile_blocks(compiled)
    assert len(blocks(compiled)) == (4 if topology == "encoder_decoder" else 2)
    assert all(b._compiled_call_impl is not None for b in blocks(compiled))  # nn.Module.compile's own switch
    assert compiled.state_dict().keys() == plain.state_dict().keys()
    x = tokens(2, 10)
    torch.testing.assert_close(run(compiled, x), run(plain, x), atol=1e-5, rtol=1e-5)
    compiled_frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert compiled_frames >= 1  # dynamo really traced the blocks


def test_attention_kernels_hold_for_the_run_and_are_restored_after(tmp_path) -> None:
    """AttentionKernels (configs/trainer/attention_cudnn.yaml): only the named kernels, in that order, from setup to
    teardown; a name that is no kernel fails when the config is read."""
    import lightning as L

    from lit_transformer.engine.attention_kernels import AttentionKernels

    before = (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled())
    seen = []

    class Look(L.Callback):
        def on_train_batch_start(self, *args) -> None:
            seen.append((torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()))

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 4)

        def training_step(self, batch, batch_idx):
            q = self.layer(batch[0]).view(1, 1, -1, 4)
            return torch.nn.functional.scaled_dot_product_attention(q, q, q).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 3, 4)), batch_size=None)
    trainer = L.Trainer(max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path,
                        callbacks=[AttentionKernels(["math"]), Look()])  # fmt: skip
    trainer.fit(Tiny(), data)
    assert seen == [(False, True), (False, True)]
    assert (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()) == before
    with pytest.raises(ValueError, match="choose one or more of"):
        AttentionKernels(["flashy"])
