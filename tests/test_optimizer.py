"""The optimizer that LitTransformer.configure_optimizers builds, checked end to end: every parameter in exactly one
group, the decay each group carries, and the update a step applies.

The documented rule (LitTransformer's weight_decay, decay_embeddings): AdamW decays the weight matrices of Linear
layers; biases and norm gains (LayerNorm, RMSNorm) never; token and position tables (and an output projection tied to
one) only with decay_embeddings. Adam (the paper's) decays nothing. Roles are read here from the module that owns
each parameter, not from the package's own grouping function, so a wrong group or a wrong decay value fails.
"""

from __future__ import annotations

import pytest
import torch
from model_variants import GPT2, PAPER, single_thread  # noqa: F401 (autouse fixture)

from lit_transformer.config import TransformerConfig
from lit_transformer.engine.lightning_module import LitTransformer
from lit_transformer.model.positions import LearnedPositions

WEIGHT_DECAY = 0.1
VARIANTS = {
    "gpt2": GPT2,
    "paper": PAPER,
    "untied-learned-encoder_decoder": {"topology": "encoder_decoder", "positions": "learned", "tie_embeddings": False},
    "llama": {
        "topology": "decoder_only",
        "positions": "rope",
        "norm": "rmsnorm",
        "activation": "swiglu",
        "bias": False,
    },
    "classifier": {"topology": "encoder_only", "positions": "learned", "num_labels": 3},
}


def roles(model: torch.nn.Module) -> dict[str, str]:
    """Each parameter (by its first name: a tied matrix is its table) -> matrix, table, norm or bias."""
    by_id: dict[int, str] = {}
    for _, module in model.named_modules():
        for attr, param in module.named_parameters(recurse=False):
            if isinstance(module, (torch.nn.Embedding, LearnedPositions)):
                role = "table"
            elif isinstance(module, (torch.nn.LayerNorm, torch.nn.RMSNorm)):
                role = "norm"
            elif attr == "bias":
                role = "bias"
            elif isinstance(module, torch.nn.Linear):
                role = "matrix"
            else:
                raise AssertionError(f"a parameter of {type(module).__name__} that this test does not know: {attr}")
            by_id[id(param)] = "table" if by_id.get(id(param)) == "table" else role  # tied: the table's role wins
    return {name: by_id[id(p)] for name, p in model.named_parameters()}


def optimizer_of(variant: dict, **hparams) -> tuple[LitTransformer, torch.optim.Optimizer]:
    torch.manual_seed(0)
    lit = LitTransformer(TransformerConfig.preset("tiny", **variant), schedule="constant", warmup_steps=0, **hparams)
    return lit, lit.configure_optimizers()["optimizer"]


@pytest.mark.parametrize("decay_embeddings", [False, True], ids=["tables_not_decayed", "decay_embeddings"])
@pytest.mark.parametrize("variant", VARIANTS.values(), ids=VARIANTS.keys())
def test_adamw_groups_decay_exactly_the_documented_parameters(variant: dict, decay_embeddings: bool) -> None:
    lit, optimizer = optimizer_of(variant, weight_decay=WEIGHT_DECAY, decay_embeddings=decay_embeddings)
    assert isinstance(optimizer, torch.optim.AdamW)
    names = {id(p): name for name, p in lit.model.named_parameters()}
    decay_of: dict[str, float] = {}
    for group in optimizer.param_groups:
        for param in group["params"]:
            assert names[id(param)] not in decay_of, f"{names[id(param)]} is in two groups"
            decay_of[names[id(param)]] = group["weight_decay"]
    role = roles(lit.model)
    assert set(decay_of) == set(role), "every trainable parameter, in exactly one group"
    decayed = {"matrix", "table"} if decay_embeddings else {"matrix"}
    expected = {name: WEIGHT_DECAY if r in decayed else 0.0 for name, r in role.items()}
    assert decay_of == expected
    # Each role is present, so every rule above was exercised (bias-free variants have no biases).
    assert {"matrix", "table", "norm"} <= set(role.values())
    assert ("bias" in role.values()) == (variant.get("bias") is not False)


@pytest.mark.parametrize("decay_embeddings", [False, True], ids=["tables_not_decayed", "decay_embeddings"])
def test_an_adamw_step_decays_only_the_decayed_parameters(decay_embeddings: bool) -> None:
    """With zero gradients Adam's update is zero, so a step is the decoupled decay alone: p <- p * (1 - lr * wd) on
    the decayed parameters, and nothing elsewhere."""
    lit, optimizer = optimizer_of(GPT2, lr=0.5, weight_decay=WEIGHT_DECAY, decay_embeddings=decay_embeddings)
    before = {name: p.detach().clone() for name, p in lit.model.named_parameters()}
    for p in lit.model.parameters():
        p.grad = torch.zeros_like(p)
    lr = optimizer.param_groups[0]["lr"]
    assert lr == 0.5
    optimizer.step()
    decayed = {"matrix", "table"} if decay_embeddings else {"matrix"}
    role = roles(lit.model)
    for name, p in lit.model.named_parameters():
        factor = 1 - lr * WEIGHT_DECAY if role[name] in decayed else 1.0
        torch.testing.assert_close(p.detach(), before[name] * factor, rtol=1e-6, atol=0, msg=name)


@pytest.mark.parametrize("variant", VARIANTS.values(), ids=VARIANTS.keys())
def test_adam_decays_nothing(variant: dict) -> None:
    """The paper's Adam: no decay on any parameter, whatever weight_decay says (and a weight decay given says so)."""
    with pytest.warns(UserWarning, match="has no effect with optimizer adam"):
        lit, optimizer = optimizer_of(variant, optimizer="adam", weight_decay=WEIGHT_DECAY)
    assert type(optimizer) is torch.optim.Adam
    assert all(group["weight_decay"] == 0.0 for group in optimizer.param_groups)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    assert len(params) == len({id(p) for p in params}) == len(list(lit.model.parameters()))


def test_an_eps_of_zero_is_refused_not_replaced_by_the_default() -> None:
    """model.optim.eps 0 passed the eps >= 0 check, then the optimizer silently ran with 1e-8 (`eps or default`);
    honoured, Adam's first step is NaN wherever a gradient entry is 0. Refused up front, naming the fix."""
    from lit_transformer.engine.optimizers import Optimization
    from lit_transformer.errors import ConfigError

    with pytest.raises(ConfigError, match=r"model.optim.eps=0 .* small positive eps"):
        Optimization(eps=0.0)
    assert Optimization(eps=1e-12).eps == 1e-12  # any positive value stays allowed
