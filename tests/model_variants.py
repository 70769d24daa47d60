"""The variant matrix the model tests run over: every architectural switch, on the 'tiny' preset."""

from __future__ import annotations

import itertools

import pytest
import torch

from lit_transformer.config import TransformerConfig
from lit_transformer.model import Transformer

SWITCHES = {
    "topology": ("decoder_only", "encoder_decoder"),
    "norm_position": ("pre", "post"),
    "positions": ("sinusoidal", "learned"),
    "activation": ("relu", "gelu", "gelu_tanh"),
    "tie_embeddings": (True, False),
    "scale_embeddings": (True, False),
}
PAPER_VARIANTS = [dict(zip(SWITCHES, values, strict=True)) for values in itertools.product(*SWITCHES.values())]
# The post-2017 switches (issue 18), each on its own and in the combinations that meet in one code path (Llama's;
# ALiBi's bias with grouped K/V heads), on a GPT-2-like base, for both topologies; NoPE is decoder-only.
MODERN_BASE = {
    "norm_position": "pre",
    "positions": "learned",
    "activation": "gelu_tanh",
    "tie_embeddings": True,
    "scale_embeddings": False,
}
MODERN_SWITCHES = {
    "rope": {"positions": "rope"},
    "alibi": {"positions": "alibi"},
    "rmsnorm": {"norm": "rmsnorm"},
    "rmsnorm-post": {"norm": "rmsnorm", "norm_position": "post"},
    "swiglu": {"activation": "swiglu"},
    "geglu": {"activation": "geglu"},
    "gqa": {"n_kv_heads": 2},
    "mqa": {"n_kv_heads": 1},
    "alibi-gqa": {"positions": "alibi", "n_kv_heads": 2},
    "llama": {"positions": "rope", "norm": "rmsnorm", "activation": "swiglu", "n_kv_heads": 2, "bias": False},
}
MODERN_VARIANTS = [
    {"topology": topology, **MODERN_BASE, **switch}
    for switch in MODERN_SWITCHES.values()
    for topology in ("decoder_only", "encoder_decoder")
] + [{"topology": "decoder_only", **MODERN_BASE, "positions": "none"}]
# The speedrun's switches, each alone on the GPT-2-like base and all together on Llama's block (grouped K/V heads and
# rotary positions meet qk_norm and value_residual in the cache), for both topologies. zero_init_output unties the
# output layer (tied, it is refused); build() gives its zeroed matrices random values, as training would, so that
# the matrix tests outputs that depend on their inputs.
FRONTIER_SWITCHES = {
    "qk_norm": {"qk_norm": True},
    "relu2": {"activation": "relu2"},
    "zero_init_output": {"zero_init_output": True, "tie_embeddings": False},
    "logit_softcap": {"logit_softcap": 3.0},
    "value_residual": {"value_residual": True},
    "frontier": {
        **MODERN_SWITCHES["llama"],
        "activation": "relu2",
        "qk_norm": True,
        "zero_init_output": True,
        "tie_embeddings": False,
        "logit_softcap": 3.0,
        "value_residual": True,
    },
}
FRONTIER_VARIANTS = [
    {"topology": topology, **MODERN_BASE, **switch}
    for switch in FRONTIER_SWITCHES.values()
    for topology in ("decoder_only", "encoder_decoder")
]
VARIANTS = PAPER_VARIANTS + MODERN_VARIANTS + FRONTIER_VARIANTS
# The switches that change decoding paths (activation, tying and scaling do not): enough for slower generation tests.
# Of the modern ones, positions (rope, alibi, none) and grouped K/V heads change the cache and the masks; RMSNorm and
# the gated MLPs change only a block's arithmetic, which the forward tests cover.
DECODING_VARIANTS = [
    v for v in PAPER_VARIANTS if v["activation"] == "gelu_tanh" and v["tie_embeddings"] == v["scale_embeddings"]
] + [v for v in MODERN_VARIANTS if v["positions"] != "learned" or "n_kv_heads" in v]
# Of the frontier ones, qk_norm and value_residual change what the cache keeps, the soft cap what decoding reads.
DECODING_VARIANTS += [v for v in FRONTIER_VARIANTS if {"qk_norm", "value_residual", "logit_softcap"} & v.keys()]
# The encoder-only model over the same switches (tying only matters to its masked-LM head); NoPE needs a causal mask.
ENCODER_VARIANTS = [
    {**v, "topology": "encoder_only"} for v in VARIANTS if v["topology"] == "decoder_only" and v["positions"] != "none"
]
# GPT-2 and the paper's model, both with tied embeddings: the int8 and compiled-decoding tests' two topologies.
GPT2 = {"topology": "decoder_only", "norm_position": "pre", "positions": "learned", "tie_embeddings": True}
PAPER = {
    "topology": "encoder_decoder",
    "norm_position": "post",
    "positions": "sinusoidal",
    "activation": "relu",
    "scale_embeddings": True,
    "tie_embeddings": True,
}
FIRST_TOKEN = 3  # tiny's pad, bos, eos are 0, 1, 2: random inputs avoid them


@pytest.fixture(autouse=True)
def single_thread():
    """Tiny models on a shared 2-core machine: one thread avoids oversubscription (two can be 100x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def variant_id(v: dict) -> str:
    return "-".join(
        [
            v["topology"][:3] if v["topology"] != "encoder_only" else "enc_only",
            v["norm_position"],
            v["positions"][:4],
            v["activation"],
        ]
        + ["tie" * v["tie_embeddings"] or "untied", "scale" * v["scale_embeddings"] or "noscale"]
        + (["rmsnorm"] if v.get("norm") == "rmsnorm" else [])
        + ([f"kv{v['n_kv_heads']}"] if v.get("n_kv_heads") else [])
        + (["nobias"] if v.get("bias") is False else [])
        + [name for name in ("qk_norm", "zero_init_output", "value_residual") if v.get(name)]
        + ([f"softcap{v['logit_softcap']:g}"] if v.get("logit_softcap") else [])
    )


def build(variant: dict, seed: int = 0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(TransformerConfig.preset("tiny", **variant, **overrides)).eval()
    if model.config.zero_init_output:  # as after some training: outputs that depend on the inputs (see above)
        with torch.no_grad():
            for linear in model.output_projections():
                linear.weight.normal_(0.0, model.config.init_std)
    return model


def tokens(batch: int, length: int, seed: int = 1, vocab: int = 128) -> torch.Tensor:
    return torch.randint(FIRST_TOKEN, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def run(model: Transformer, x: torch.Tensor, tgt: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
    """Logits of either topology: decoder-only reads x; encoder-decoder translates x into tgt (default: x itself)."""
    if model.config.is_encoder_decoder:
        return model(x, x if tgt is None else tgt, **kwargs)
    return model(x, **kwargs)
