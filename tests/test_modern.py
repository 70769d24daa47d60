"""The post-2017 switches, each against its definition: rotary and ALiBi positions, NoPE, RMSNorm, gated MLPs and
grouped-query attention. The variant matrix (test_model, test_generation, test_encoder_only) proves causality, padding
invariance, cache = recompute and batched = unbatched for them; this file proves each computes what its paper says."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from model_variants import MODERN_BASE, build, single_thread, tokens  # noqa: F401 (autouse fixture)

from lit_transformer.config import TransformerConfig, gated_d_ff
from lit_transformer.model import Transformer
from lit_transformer.model.positions import AlibiBias, RotaryEmbedding, alibi_slopes, rotate

DECODER = {"topology": "decoder_only", **MODERN_BASE}
LLAMA = {**DECODER, "positions": "rope", "norm": "rmsnorm", "activation": "swiglu", "n_kv_heads": 2, "bias": False}


# ---- rotary positions ---------------------------------------------------------------------------------------------


def test_rope_rotates_each_channel_pair_by_position_times_its_frequency():
    """Against the complex-number definition (Su et al. 2021, eq. 34): channel pair (i, i + D/2) is the complex number
    x_i + j x_{i+D/2}, multiplied by exp(j * position * theta^(-2i/D))."""
    cfg = TransformerConfig.preset("tiny", positions="rope", rope_theta=500.0)
    D = cfg.head_dim
    x = torch.randn(1, 1, 5, D, generator=torch.Generator().manual_seed(0))
    positions = torch.tensor([0, 3, 7, 100, 2047])
    got = rotate(x, *RotaryEmbedding(cfg)(positions))
    freq = 500.0 ** (-torch.arange(0, D, 2).double() / D)
    z = torch.complex(x[..., : D // 2].double(), x[..., D // 2 :].double()) * torch.polar(
        torch.ones(5, D // 2, dtype=torch.double), positions[:, None].double() * freq
    )
    # float32 angles, as Llama computes them: at position 2047 the angle is off by ~1e-4 rad; a wrong layout is off by ~1
    torch.testing.assert_close(got, torch.cat([z.real, z.imag], -1).float(), atol=5e-4, rtol=0)


def test_rope_scores_depend_on_the_distance_alone():
    rope = RotaryEmbedding(TransformerConfig.preset("tiny", positions="rope"))
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(m: int, n: int) -> torch.Tensor:
        return (rotate(q, *rope(torch.tensor([m]))) * rotate(k, *rope(torch.tensor([n])))).sum()

    torch.testing.assert_close(score(7, 3), score(107, 103), atol=1e-5, rtol=0)
    assert (score(7, 3) - score(7, 5)).abs() > 1e-3


@pytest.mark.parametrize("positions", ["rope", "alibi", "none"])
def test_relative_positions_give_the_same_logits_wherever_a_sequence_starts(positions):
    """rope, alibi and none see only distances: a sequence after a cached prefix of left padding gives what it gives
    alone. Learned and sinusoidal positions would not (absolute vectors are added)."""
    model = build({**DECODER, "positions": positions}, init_std=0.3)
    x = tokens(1, 8)
    cache = model.new_cache(64)
    with torch.no_grad():
        model.decode(tokens(1, 5, seed=3), cache=cache)  # 5 real tokens cached: the next positions are 5..12
        shifted = model.decode(x, cache=[type(c)(type(c.self_attn)(64)) for c in cache])
        torch.testing.assert_close(shifted, model(x), atol=0, rtol=0)
        # a real shift: keys of a previous sequence dropped, positions counted from 5
        ids = torch.arange(5, 13)
        q_rope, mask, causal = model._attention_positions(ids, ids, None, True)
        zero = model._attention_positions(torch.arange(8), torch.arange(8), None, True)
        if positions == "rope":
            assert not torch.allclose(q_rope[0], zero[0][0])  # rotations differ ...
        if positions == "alibi":
            torch.testing.assert_close(mask, zero[1])  # ... the bias is the same


def test_rope_with_an_odd_head_dimension_is_refused():
    with pytest.raises(ValueError, match="head dimension d_model / n_heads = 36 / 4 = 9 is odd"):
        TransformerConfig.preset("tiny", positions="rope", d_model=36, n_heads=4)


# ---- ALiBi --------------------------------------------------------------------------------------------------------


def test_alibi_slopes_follow_the_paper():
    """8 heads: 1/2, 1/4, ..., 1/256 (Press et al. 2021, section 3); 12 heads: the 8 slopes then every other one of 16."""
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0**-i for i in range(1, 9)]))
    sixteen = [2.0 ** (-0.5 * i) for i in range(1, 17)]
    torch.testing.assert_close(alibi_slopes(12), torch.tensor([2.0**-i for i in range(1, 9)] + sixteen[0::2][:4]))


def test_alibi_bias_is_minus_slope_times_distance_and_minus_infinity_where_masked():
    alibi = AlibiBias(TransformerConfig.preset("tiny", positions="alibi"))  # 4 heads: slopes 1/4, 1/16, 1/64, 1/256
    allowed = torch.ones(4, 4, dtype=torch.bool).tril()
    bias = alibi(torch.arange(4), torch.arange(4), allowed)
    assert bias.shape == (1, 4, 4, 4)
    assert bias[0, 0, 3, 1].item() == -0.25 * 2 and bias[0, 3, 2, 0].item() == -(2**-8) * 2
    assert torch.isinf(bias[0, :, 0, 1]).all() and (bias[0, :, 2, 2] == 0).all()
    # left padding: position ids count real tokens only, so distances between real tokens are unchanged
    padded = alibi(torch.tensor([[0, 0, 0, 1]]), torch.tensor([[0, 0, 0, 1]]), None)
    assert padded[0, 0, 3, 2].item() == -0.25


def test_alibi_attention_weights_are_the_softmax_of_scores_plus_bias():
    """The explicit (weights) path and SDPA agree (test_attention_weights_on_request); here the weights of layer 0 equal
    softmax(q k / sqrt(d) - m |i - j|) computed by hand from its projections."""
    model = build({**DECODER, "positions": "alibi"}, init_std=0.3)
    x = tokens(1, 6)
    _, attentions = model(x, return_attention=True)
    block = model.decoder_blocks[0]
    with torch.no_grad():
        h = block.self_attn_norm(model.tgt_embed(x))
        q, k, _ = block.self_attn.qkv(h).view(1, 6, 3, 4, 8).permute(2, 0, 3, 1, 4)
        distance = (torch.arange(6)[:, None] - torch.arange(6)[None]).float()
        scores = q @ k.transpose(-1, -2) / math.sqrt(8) - alibi_slopes(4)[:, None, None] * distance
        scores = scores.masked_fill(distance < 0, float("-inf"))
    torch.testing.assert_close(attentions["self"][0], scores.softmax(-1), atol=1e-6, rtol=0)


# ---- NoPE ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("topology", ["encoder_decoder", "encoder_only"])
def test_no_positions_need_a_causal_decoder(topology):
    with pytest.raises(ValueError, match="positions='none' \\(NoPE\\) needs topology='decoder_only'"):
        TransformerConfig.preset("tiny", topology=topology, positions="none", num_labels=2)


def test_nope_knows_order_only_through_the_causal_mask_and_depth():
    """Without a position signal, one layer sees each position's prefix as a set: swapping two earlier tokens changes
    only the outputs of the two swapped positions (each reads its own token and a different prefix). A second layer then sees the first layer's
    order-dependent outputs, so order reaches every later position (Kazemnejad et al. 2023)."""
    x = tokens(1, 6)
    swapped = x[:, [1, 0, 2, 3, 4, 5]]
    one_layer = build({**DECODER, "positions": "none"}, init_std=0.3, n_layers=1)
    assert not any("positions" in name for name, _ in one_layer.named_parameters())
    a, b = one_layer(x), one_layer(swapped)
    assert (a[0, 0] - b[0, 0]).abs().max() > 1e-3  # position 0 sees one token, which changed
    torch.testing.assert_close(a[0, 2:], b[0, 2:], atol=1e-5, rtol=0)  # later positions see the same set
    two_layers = build({**DECODER, "positions": "none"}, init_std=0.3)
    assert (two_layers(x)[0, 5] - two_layers(swapped)[0, 5]).abs().max() > 1e-3


# ---- RMSNorm ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("topology", ["decoder_only", "encoder_decoder", "encoder_only"])
def test_rmsnorm_replaces_every_layer_norm(topology):
    model = build({"topology": topology, "norm": "rmsnorm"}, num_labels=2)
    kinds = {type(m) for m in model.modules()}
    assert torch.nn.RMSNorm in kinds and torch.nn.LayerNorm not in kinds
    norm = model.decoder_norm if topology != "encoder_only" else model.encoder_norm
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(3, 32) * 5 + 2
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + model.config.layer_norm_eps) * norm.weight
    torch.testing.assert_close(norm(x), expected, atol=1e-5, rtol=1e-5)
    assert norm(x).mean(-1).abs().max() > 1e-3  # not centred: it is not a LayerNorm


# ---- gated MLPs ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("activation", ["swiglu", "geglu"])
def test_gated_feed_forward_is_down_of_activated_gate_times_value(activation):
    model = build({**DECODER, "activation": activation}, d_ff=24, init_std=0.3)
    ff = model.decoder_blocks[0].ff
    assert ff.up.weight.shape == (48, 32) and ff.down.weight.shape == (32, 24)
    x = torch.randn(2, 5, 32)
    gate, value = x @ ff.up.weight[:24].T + ff.up.bias[:24], x @ ff.up.weight[24:].T + ff.up.bias[24:]
    act = F.silu(gate) if activation == "swiglu" else F.gelu(gate)
    torch.testing.assert_close(ff(x), (act * value) @ ff.down.weight.T + ff.down.bias, atol=1e-5, rtol=1e-5)


def test_gated_d_ff_keeps_the_parameters_of_the_non_gated_mlp():
    """gated_d_ff(512) = 341: 3 x 128 x 341 = 130,944 weights against 2 x 128 x 512 = 131,072 (0.1%). d_ff None on a
    gated model means exactly that."""
    assert gated_d_ff(512) == 341 and gated_d_ff(3072) == 2048 and gated_d_ff(512, multiple_of=64) == 320

    def count(**kw) -> int:
        with torch.device("meta"):
            cfg = TransformerConfig(vocab_size=1024, d_model=128, n_heads=4, n_layers=4, max_seq_len=128, **kw)
            return Transformer(cfg).num_parameters()

    plain = count(activation="gelu", d_ff=512)
    assert count(activation="swiglu", d_ff=None) == count(activation="swiglu", d_ff=341)
    assert abs(count(activation="swiglu") - plain) / plain < 0.002
    assert abs(count(activation="geglu") - plain) / plain < 0.002
    assert count(activation="swiglu", d_ff=512) > 1.1 * plain  # the same d_ff gated is 1.5x the MLP


# ---- grouped-query attention --------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_kv_heads", [1, 2])
def test_grouped_query_attention_equals_multi_head_attention_with_shared_kv_heads(n_kv_heads):
    """A GQA model is an MHA model whose K/V heads are copied into each group of n_heads / n_kv_heads query heads."""
    gqa = build({**DECODER, "n_kv_heads": n_kv_heads}, init_std=0.3)
    mha = build(DECODER)
    group, D = 4 // n_kv_heads, 8
    state = dict(gqa.state_dict())
    for i in range(2):
        for kind in ("weight", "bias"):
            name = f"decoder_blocks.{i}.self_attn.qkv.{kind}"
            q, k, v = state[name].split([32, n_kv_heads * D, n_kv_heads * D])
            k, v = (t.unflatten(0, (n_kv_heads, D)).repeat_interleave(group, 0).flatten(0, 1) for t in (k, v))
            state[name] = torch.cat([q, k, v])
    mha.load_state_dict(state)
    x = tokens(2, 10)
    torch.testing.assert_close(gqa(x), mha(x), atol=1e-5, rtol=0)
    qkv = gqa.decoder_blocks[0].self_attn.qkv.weight
    assert qkv.shape == (32 + 2 * n_kv_heads * D, 32)


@pytest.mark.parametrize("topology", ["decoder_only", "encoder_decoder"])
def test_the_kv_cache_stores_only_the_kv_heads(topology):
    model = build({**MODERN_BASE, "topology": topology, "n_kv_heads": 1}, init_std=0.3)
    seen = []
    original = model.new_cache

    def spy(max_len):
        seen.append(original(max_len))
        return seen[-1]

    model.new_cache = spy
    model.generate(tokens(2, 5), max_new_tokens=4, eos_token_id=-1)
    layer = seen[0][0]
    assert layer.self_attn.k.shape[:2] == (2, 1) and layer.self_attn.v.shape[:2] == (2, 1)
    if topology == "encoder_decoder":  # cross-attention keeps every head: its K/V come from the source once
        assert layer.cross_attn.k.shape[1] == 4


def test_n_heads_not_divisible_by_n_kv_heads_is_refused():
    with pytest.raises(ValueError, match="n_heads=4 is not divisible by n_kv_heads=3.*valid n_kv_heads: \\[1, 2, 4\\]"):
        TransformerConfig.preset("tiny", n_kv_heads=3)


@pytest.mark.parametrize("init", ["gpt2", "xavier"])
def test_initialisation_treats_each_fused_projection_matrix_alone(init):
    """Xavier bounds follow each matrix's own shape: a narrower K/V block (GQA) and a gate/value half of a gated up."""
    cfg = TransformerConfig.preset("tiny", init=init, n_kv_heads=1, activation="swiglu", d_ff=64, d_model=64)
    torch.manual_seed(0)
    model = Transformer(cfg)
    block = model.decoder_blocks[0]
    q, k, _ = block.self_attn.qkv.weight.split(block.self_attn.split_sizes)
    if init == "xavier":
        assert q.abs().max() <= math.sqrt(6 / (64 + 64)) and k.abs().max() <= math.sqrt(6 / (64 + 16))
        assert k.abs().max() > math.sqrt(6 / (64 + 64))  # a K block of 16 rows has the wider bound
    else:
        assert q.std().item() == pytest.approx(0.02, rel=0.1)


# ---- generation past the context, and ONNX ------------------------------------------------------------------------


@pytest.mark.parametrize("positions", ["rope", "alibi", "none"])
@pytest.mark.parametrize("keep", [None, 64])
def test_generation_slides_past_the_context_like_crop_and_recompute(positions, keep):
    """Past max_seq_len the cache is refilled from the kept window, whose positions restart at 0: with relative
    positions that is the same model a crop-and-recompute reference runs."""
    from test_generation import crop_and_recompute

    model = build({**DECODER, "positions": positions, "n_kv_heads": 2}, init_std=0.3)
    x = tokens(2, 5, seed=7)
    new = 2 * model.config.max_seq_len
    out = model.generate(x, max_new_tokens=new, eos_token_id=-1, window_keep=keep)
    torch.testing.assert_close(out, crop_and_recompute(model, x, new, keep or 32), rtol=0, atol=0)


@pytest.mark.parametrize(
    "variant",
    [LLAMA, {**DECODER, "positions": "alibi", "n_kv_heads": 1, "activation": "geglu"}],
    ids=["llama", "alibi-mqa-geglu"],
)
def test_onnx_export_matches_pytorch(tmp_path, variant):
    ort = pytest.importorskip("onnxruntime")
    from lit_transformer.interop import export_onnx

    model = build(variant, init_std=0.3)
    path = export_onnx(model, tmp_path / "model.onnx")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for shape in ((1, 5), (3, 64)):  # dynamic batch and sequence, up to max_seq_len
        x = tokens(*shape)
        (logits,) = session.run(None, {"input_ids": x.numpy()})
        torch.testing.assert_close(torch.from_numpy(logits), model(x), atol=1e-4, rtol=1e-4)
