"""Parity with Hugging Face Llama: rope + RMSNorm + SwiGLU + grouped-query attention + no bias is LlamaForCausalLM.

Random models from a LlamaConfig (no hub), saved and loaded both ways as safetensors + config.json; logits to 1e-5
and cached greedy generation token for token."""

from __future__ import annotations

import json

import pytest
import torch
from model_variants import single_thread, tokens  # noqa: F401 (autouse fixture)

from lit_transformer.config import TransformerConfig
from lit_transformer.interop import llama_problems, load_hf_llama, save_hf_llama
from lit_transformer.model import Transformer

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")

VOCAB = 96


def hf_llama(tie: bool = False, bias: bool = False, n_kv_heads: int = 2, theta: float = 10000.0):
    """A random LlamaForCausalLM: 2 layers x 32, 4 query heads, large weights and norm gains far from 1."""
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=n_kv_heads, max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=tie,
        attention_bias=bias, mlp_bias=bias, rope_parameters={"rope_type": "default", "rope_theta": theta},
        bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.3)
    return model


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"tie": True}, {"n_kv_heads": 1, "theta": 500000.0}, {"n_kv_heads": 4, "bias": True}],
    ids=["gqa", "tied", "mqa-theta", "mha-bias"],
)
def test_a_transformers_llama_loads_with_its_logits_and_its_greedy_tokens(tmp_path, kwargs):
    hf = hf_llama(**kwargs)
    hf.save_pretrained(tmp_path)
    model = load_hf_llama(tmp_path)
    cfg = model.config
    assert (cfg.positions, cfg.norm, cfg.activation, cfg.kv_heads) == (
        "rope",
        "rmsnorm",
        "swiglu",
        hf.config.num_key_value_heads,
    )
    assert cfg.tie_embeddings == kwargs.get("tie", False) and cfg.bias == kwargs.get("bias", False)
    x = tokens(3, 40, vocab=VOCAB)
    with torch.no_grad():
        ours, theirs = model(x), hf(x).logits
    close(ours, theirs)
    assert ours.abs().max() > 3  # logits of several units: a mistake could not hide under 1e-5
    # greedy decoding with both caches, past the prompt
    prompt = x[:1, :12]
    with torch.no_grad():
        expected = hf.generate(prompt, max_new_tokens=30, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(model.generate(prompt, max_new_tokens=30, eos_token_id=-1), expected[:, 12:])


@pytest.mark.parametrize("pad_vocab", [None, 96], ids=["exact-vocab", "padded-vocab"])
def test_our_llama_folder_loads_in_transformers_with_our_logits(tmp_path, pad_vocab):
    """Padded vocabulary rows (pad_vocab_to_multiple_of) are ours alone: the folder holds the true 128 rows."""
    torch.manual_seed(0)
    cfg = TransformerConfig.preset(
        "tiny", positions="rope", norm="rmsnorm", activation="swiglu", n_kv_heads=2, bias=False,
        tie_embeddings=False, d_ff=40, pad_token_id=None, rope_theta=1000.0, layer_norm_eps=1e-6,
        pad_vocab_to_multiple_of=pad_vocab,
    )  # fmt: skip
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.3)
    save_hf_llama(model, tmp_path)
    assert {p.name for p in tmp_path.iterdir()} >= {"config.json", "model.safetensors"}
    assert json.loads((tmp_path / "config.json").read_text())["num_key_value_heads"] == 2
    hf, info = transformers.LlamaForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched weights
    assert hf.lm_head.weight.shape[0] == 128
    x = tokens(2, 30)
    with torch.no_grad():
        close(model(x), hf.eval()(x).logits)
        close(load_hf_llama(tmp_path, base=cfg)(x), model(x))  # and back, into the padded config too


def test_the_llama_small_preset_is_a_llama():
    with torch.device("meta"):
        model = Transformer(TransformerConfig.preset("llama-small"))
    assert llama_problems(model.config) == []
    d, layers, d_ff, vocab, kv = 768, 12, 2048, 32000, 4 * 64
    block = d * (d + 2 * kv) + d * d + 3 * d * d_ff + 2 * d
    assert model.num_parameters() == 2 * vocab * d + layers * block + d == 124_668_672


def test_a_zero_initialised_llama_exports_with_our_logits(tmp_path):
    """zero_init_output is an initialisation only: once the weights move (here: random), the model is a Llama."""
    cfg = TransformerConfig.preset(
        "tiny", positions="rope", norm="rmsnorm", activation="swiglu", bias=False, tie_embeddings=False,
        zero_init_output=True, pad_token_id=None, layer_norm_eps=1e-6,
    )  # fmt: skip
    model = Transformer(cfg).eval()
    assert model.lm_head.weight.abs().sum() == 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.3)
    save_hf_llama(model, tmp_path)
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    x = tokens(2, 20)
    with torch.no_grad():
        close(model(x), hf(x).logits)


@pytest.mark.parametrize(
    "field, value",
    [("positions", "learned"), ("norm", "layernorm"), ("activation", "gelu"), ("topology", "encoder_decoder")],
)
def test_llama_refuses_what_it_cannot_express(tmp_path, field, value):
    base = dict(positions="rope", norm="rmsnorm", activation="swiglu")
    cfg = TransformerConfig.preset("tiny", **{**base, field: value})
    assert any(p.startswith(f"{field}=") for p in llama_problems(cfg))
    with pytest.raises(ValueError, match=f"{field}={value!r}: Llama can only express"):
        save_hf_llama(Transformer(cfg), tmp_path)
    assert not (tmp_path / "model.safetensors").exists()


def test_load_refuses_llama_options_we_lack(tmp_path):
    hf_llama().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="rope_type='linear'"):
        load_hf_llama(tmp_path)
