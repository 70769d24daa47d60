"""The speedrun's model switches, each against a few lines of its definition: qk_norm, ReLU², zero-initialised
outputs, the logit soft cap and value residual. The variant matrix (test_model, test_generation, test_encoder_only)
proves causality, padding invariance and cache = recompute for them; this file proves each computes what it says."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from model_variants import MODERN_BASE, build, single_thread, tokens  # noqa: F401 (autouse fixture)

from lit_transformer.config import TransformerConfig
from lit_transformer.model import Transformer
from lit_transformer.model.positions import rotate

DECODER = {"topology": "decoder_only", **MODERN_BASE}
D = 8  # tiny's head dimension: d_model 32 over 4 heads


def rms(x: torch.Tensor, gain: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gain


def inputs_of(module: torch.nn.Module, run) -> list[tuple]:
    """The positional arguments each call of `module` received while `run()` ran."""
    seen: list[tuple] = []
    handle = module.register_forward_pre_hook(lambda m, args: seen.append(args))
    try:
        run()
    finally:
        handle.remove()
    return seen


def causal(scores: torch.Tensor) -> torch.Tensor:
    t = scores.shape[-1]
    return scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))


# ---- qk_norm ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_qk_norm_normalises_each_heads_queries_and_keys_before_the_rotation(positions):
    """Layer 0's weights are softmax(rope(g * rms(q)) . rope(g * rms(k)) / sqrt(D)), from its projections by hand, with
    a gain per head channel shared by the heads (random here, so that a missing or misplaced gain shows)."""
    model = build({**DECODER, "positions": positions, "qk_norm": True}, init_std=0.3)
    attn = model.decoder_blocks[0].self_attn
    with torch.no_grad():
        attn.q_norm.weight.uniform_(0.5, 2.0)
        attn.k_norm.weight.uniform_(0.5, 2.0)
    assert attn.q_norm.weight.shape == (D,)
    x = tokens(1, 6)
    (args,) = inputs_of(attn, lambda: model(x))
    _, attentions = model(x, return_attention=True)
    with torch.no_grad():
        q, k, _ = attn.qkv(args[0]).view(1, 6, 3, 4, D).permute(2, 0, 3, 1, 4)
        q, k = rms(q, attn.q_norm.weight), rms(k, attn.k_norm.weight)
        if positions == "rope":  # normalised first, then rotated
            cos_sin = model.rotary(torch.arange(6))
            q, k = rotate(q, *cos_sin), rotate(k, *cos_sin)
        expected = causal(q @ k.transpose(-1, -2) / math.sqrt(D)).softmax(-1)
    torch.testing.assert_close(attentions["self"][0], expected, atol=1e-6, rtol=0)


def test_qk_norm_bounds_the_attention_logits_whatever_the_projections_grow_to():
    """With unit gains, |q . k| / sqrt(D) <= sqrt(D): scaling Q and K by 100 changes no weight (it would saturate
    the softmax without the norm)."""
    model = build({**DECODER, "qk_norm": True}, init_std=0.3)
    plain = build(DECODER, init_std=0.3)
    x = tokens(1, 6)
    before, plain_before = model(x, return_attention=True)[1], plain(x, return_attention=True)[1]
    for m in (model, plain):
        with torch.no_grad():
            m.decoder_blocks[0].self_attn.qkv.weight[: 2 * 32] *= 100  # the Q and K rows
    after, plain_after = model(x, return_attention=True)[1], plain(x, return_attention=True)[1]
    torch.testing.assert_close(after["self"][0], before["self"][0], atol=1e-5, rtol=0)
    assert (plain_after["self"][0] - plain_before["self"][0]).abs().max() > 0.1


def test_qk_norm_in_cross_attention_normalises_the_decoders_queries_and_the_memorys_keys():
    model = build({"topology": "encoder_decoder", **MODERN_BASE, "qk_norm": True}, init_std=0.3)
    cross = model.decoder_blocks[0].cross_attn
    with torch.no_grad():
        cross.q_norm.weight.uniform_(0.5, 2.0)
        cross.k_norm.weight.uniform_(0.5, 2.0)
    src, tgt = tokens(1, 7), tokens(1, 5, seed=2)
    (args,) = inputs_of(cross, lambda: model(src, tgt))
    _, attentions = model(src, tgt, return_attention=True)
    with torch.no_grad():
        h, memory = args[0], args[1]
        q = rms(cross.q(h).view(1, 5, 4, D).transpose(1, 2), cross.q_norm.weight)
        k = rms(cross.kv(memory)[..., :32].view(1, 7, 4, D).transpose(1, 2), cross.k_norm.weight)
        expected = (q @ k.transpose(-1, -2) / math.sqrt(D)).softmax(-1)
    torch.testing.assert_close(attentions["cross"][0], expected, atol=1e-6, rtol=0)


# ---- ReLU² --------------------------------------------------------------------------------------------------------


def test_relu2_is_relu_squared():
    model = build({**DECODER, "activation": "relu2"}, init_std=0.3)
    ff = model.decoder_blocks[0].ff
    x = torch.randn(2, 5, 32)
    hidden = x @ ff.up.weight.T + ff.up.bias
    torch.testing.assert_close(ff(x), hidden.clamp(min=0) ** 2 @ ff.down.weight.T + ff.down.bias, atol=1e-5, rtol=1e-5)
    assert (hidden < 0).any() and ff.up.weight.shape == (64, 32)  # non-gated: one up projection of d_ff


# ---- zero_init_output ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("topology", ["decoder_only", "encoder_decoder"])
def test_zero_init_output_starts_every_block_as_the_identity_and_the_logits_uniform(topology):
    """Every attention and MLP output projection and the head are zero: each block passes its input through, the
    logits are all 0, so the first loss is exactly ln(V); the other matrices keep their random initialisation."""
    torch.manual_seed(0)
    cfg = TransformerConfig.preset("tiny", topology=topology, zero_init_output=True, tie_embeddings=False)
    model = Transformer(cfg).eval()
    zeroed = {id(m.weight) for m in model.output_projections()}
    names = {name for name, p in model.named_parameters() if id(p) in zeroed}
    expected = {f"decoder_blocks.{i}.{m}.weight" for i in range(2) for m in ("self_attn.out", "ff.down")}
    if topology == "encoder_decoder":
        expected |= {f"decoder_blocks.{i}.cross_attn.out.weight" for i in range(2)}
        expected |= {f"encoder_blocks.{i}.{m}.weight" for i in range(2) for m in ("self_attn.out", "ff.down")}
    assert names == expected | {"lm_head.weight"}
    assert all(p.abs().sum() == 0 for name, p in model.named_parameters() if name in names)
    assert all(p.std() > 0.01 for name, p in model.named_parameters() if name.endswith("qkv.weight"))
    x = tokens(2, 6)
    seen = inputs_of(model.decoder_norm, lambda: model(x, x) if topology == "encoder_decoder" else model(x))
    embedded = model.tgt_embed(x) + model.tgt_positions(0, 6)
    torch.testing.assert_close(seen[0][0], embedded)  # the stack changed nothing
    logits = model(x, x) if topology == "encoder_decoder" else model(x)
    assert logits.abs().max() == 0
    loss = F.cross_entropy(logits.flatten(0, 1), tokens(2, 6, seed=3).flatten())
    assert loss.item() == pytest.approx(math.log(128), abs=1e-6)


def test_zero_init_output_zeroes_a_classifiers_last_layer():
    torch.manual_seed(0)
    cfg = TransformerConfig.preset("tiny", topology="encoder_only", num_labels=3, zero_init_output=True)
    model = Transformer(cfg).eval()  # a classifier has no token output: tie_embeddings is moot
    assert model.classifier.out.weight.abs().sum() == 0 and model.classifier.dense.weight.std() > 0.01
    assert model(tokens(2, 6)).abs().max() == 0


def test_zero_init_output_with_a_tied_output_layer_is_refused_naming_both_fields():
    with pytest.raises(ValueError, match="zero_init_output=True.*tie_embeddings=True.*set tie_embeddings=False"):
        TransformerConfig.preset("tiny", zero_init_output=True)
    with pytest.raises(ValueError, match="zero_init_output=True.*tie_embeddings=True"):
        TransformerConfig.preset(
            "tiny", topology="encoder_only", head="masked_lm", mask_token_id=4, zero_init_output=True
        )


def test_zero_init_output_trains_every_matrix_after_the_first_steps():
    """A zero head gives the blocks no gradient at the first step; once the head moves, gradients reach everything."""
    torch.manual_seed(0)
    model = Transformer(TransformerConfig.preset("tiny", zero_init_output=True, tie_embeddings=False))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = tokens(4, 12), tokens(4, 12, seed=5)
    for _ in range(3):
        optimizer.zero_grad()
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        optimizer.step()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters() if p.dim() == 2)


# ---- logit soft cap -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("topology", ["decoder_only", "encoder_decoder", "encoder_only"])
def test_logit_softcap_is_cap_times_tanh_of_logits_over_cap(topology):
    extra = {"num_labels": 3} if topology == "encoder_only" else {}
    capped = build({**MODERN_BASE, "topology": topology, "logit_softcap": 2.0}, init_std=0.5, **extra)
    plain = build({**MODERN_BASE, "topology": topology}, init_std=0.5, **extra)
    plain.load_state_dict(capped.state_dict())
    x = tokens(2, 7)
    args = (x, x[:, :4]) if topology == "encoder_decoder" else (x,)
    raw, got = plain(*args), capped(*args)
    assert raw.abs().max() > 4  # far past the cap, where tanh bends
    torch.testing.assert_close(got, 2.0 * torch.tanh(raw / 2.0), atol=1e-6, rtol=0)
    assert got.abs().max() < 2.0


def test_generation_samples_from_the_capped_logits():
    """Decoding reads the capped logits (its first step's logits are the capped forward's last row), so sampling at a
    temperature sees the distribution training shaped."""
    from lit_transformer.model.generation import IncrementalDecoder

    model = build({**DECODER, "logit_softcap": 1.5}, init_std=0.5)
    x = tokens(2, 5)
    with torch.inference_mode():
        decoder = IncrementalDecoder(model, x, None, 4)
        torch.testing.assert_close(decoder.logits, model(x)[:, -1], atol=1e-6, rtol=0)
    assert decoder.logits.abs().max() < 1.5


def test_the_fused_losss_reference_caps_as_the_model_does():
    """The fused loss (liger-kernel, GPU) gets the cap as its softcap; its reference (what the kernel computes) on the
    model's hidden states equals the model's own loss on its capped logits."""
    from lit_transformer.tasks.fused_loss import reference_linear_cross_entropy
    from lit_transformer.tasks.losses import smoothed_cross_entropy

    model = build({**DECODER, "logit_softcap": 2.0}, init_std=0.5)
    x, labels = tokens(2, 6), tokens(2, 6, seed=4)
    hidden = model.decode(x, project=False)
    got = reference_linear_cross_entropy(hidden, model.lm_head.weight, labels, 128, 0.1, softcap=2.0)
    want = smoothed_cross_entropy(model(x), labels, 0.1)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


def test_a_non_positive_cap_is_refused():
    with pytest.raises(ValueError, match="logit_softcap=0.0 must be positive"):
        TransformerConfig.preset("tiny", logit_softcap=0.0)


# ---- value residual -----------------------------------------------------------------------------------------------


def attention_by_hand(attn, h: torch.Tensor, first_values: torch.Tensor | None, lam: float | None) -> torch.Tensor:
    """softmax(q k / sqrt(D), causal) v W_out with v = (1 - lam) v + lam v_first: a self-attention layer by hand."""
    B, T, C = h.shape
    q, k, v = attn.qkv(h).view(B, T, 3, 4, D).permute(2, 0, 3, 1, 4)
    if first_values is not None:
        v = (1 - lam) * v + lam * first_values
    y = causal(q @ k.transpose(-1, -2) / math.sqrt(D)).softmax(-1) @ v
    return attn.out(y.transpose(1, 2).reshape(B, T, C))


@pytest.mark.parametrize("topology", ["decoder_only", "encoder_decoder"])
def test_value_residual_mixes_each_layers_values_with_the_first_layers(topology):
    """Layer 1's self-attention by hand, its values (1 - lambda) v + lambda v_1 with v_1 the first layer's values of
    the same tokens (the decoder's own first layer, in an encoder-decoder), lambda a learned scalar at 0.5."""
    model = build({**MODERN_BASE, "topology": topology, "value_residual": True}, init_std=0.3, n_layers=3)
    blocks = model.decoder_blocks
    assert blocks[0].self_attn.value_mix is None  # the first layer has nothing to mix
    assert [b.self_attn.value_mix.item() for b in blocks[1:]] == [0.5, 0.5]
    with torch.no_grad():
        blocks[2].self_attn.value_mix.fill_(0.2)
    x = tokens(2, 6)
    run = (lambda: model(tokens(2, 7, seed=2), x)) if topology == "encoder_decoder" else (lambda: model(x))
    outputs = []
    hooks = [b.self_attn.register_forward_hook(lambda m, a, out: outputs.append(out[0])) for b in blocks]
    calls = [inputs_of(b.self_attn, run)[0] for b in blocks]
    for hook in hooks:
        hook.remove()
    with torch.no_grad():
        h0 = calls[0][0]
        v1 = blocks[0].self_attn.qkv(h0).view(2, 6, 3, 4, D).permute(2, 0, 3, 1, 4)[2]
        for i, lam in ((1, 0.5), (2, 0.2)):
            expected = attention_by_hand(blocks[i].self_attn, calls[i][0], v1, lam)
            torch.testing.assert_close(outputs[-3 + i], expected, atol=1e-6, rtol=0)
        torch.testing.assert_close(
            outputs[-3], attention_by_hand(blocks[0].self_attn, h0, None, None), atol=1e-6, rtol=0
        )


def test_value_residual_at_lambda_zero_is_the_plain_model_and_lambda_learns():
    mixed = build({**DECODER, "value_residual": True}, init_std=0.3)
    plain = build(DECODER, init_std=0.3)
    plain.load_state_dict({k: v for k, v in mixed.state_dict().items() if "value_mix" not in k})
    x = tokens(2, 8)
    assert (mixed(x) - plain(x)).abs().max() > 1e-3
    with torch.no_grad():
        mixed.decoder_blocks[1].self_attn.value_mix.zero_()
    torch.testing.assert_close(mixed(x), plain(x), atol=1e-6, rtol=0)
    mixed(x).square().mean().backward()
    assert mixed.decoder_blocks[1].self_attn.value_mix.grad.abs() > 0


def test_value_residual_mixes_per_kv_head_with_grouped_query_attention():
    """Values have n_kv_heads heads in every layer, so the first layer's mix in head by head, before the K/V heads are
    shared by their query heads, and the cache keeps n_kv_heads mixed heads."""
    model = build({**DECODER, "value_residual": True, "n_kv_heads": 1}, init_std=0.3)
    cache = model.new_cache(16)
    with torch.no_grad():
        model.decode(tokens(2, 5), cache=cache)
    assert cache[1].self_attn.v.shape[:2] == (2, 1)
    block = model.decoder_blocks[1]
    assert block.self_attn.value_mix.shape == (1,)


def test_value_residual_in_the_encoder_uses_the_encoders_first_layer():
    model = build({"topology": "encoder_only", **MODERN_BASE, "value_residual": True}, num_labels=2, init_std=0.3)
    assert (
        model.encoder_blocks[0].self_attn.value_mix is None
        and model.encoder_blocks[1].self_attn.value_mix.item() == 0.5
    )
    plain = build({"topology": "encoder_only", **MODERN_BASE}, num_labels=2, init_std=0.3)
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if "value_mix" not in k})
    x = tokens(2, 6)
    assert (model(x) - plain(x)).abs().max() > 1e-4
    with torch.no_grad():
        model.encoder_blocks[1].self_attn.value_mix.zero_()
    torch.testing.assert_close(model(x), plain(x), atol=1e-6, rtol=0)


# ---- all together -------------------------------------------------------------------------------------------------


def test_every_switch_together_trains_and_round_trips_the_native_format(tmp_path):
    """The speedrun's block (all five switches on Llama's) takes training steps that lower the loss, and its folder
    (safetensors + config.json) loads back to the same logits."""
    from lit_transformer.interop.native import load_safetensors, save_safetensors

    torch.manual_seed(0)
    cfg = TransformerConfig.preset(
        "tiny", positions="rope", norm="rmsnorm", activation="relu2", qk_norm=True, zero_init_output=True,
        tie_embeddings=False, logit_softcap=15.0, value_residual=True, n_kv_heads=2,
    )  # fmt: skip
    model = Transformer(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x = tokens(8, 16)
    losses = []
    for _ in range(30):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(math.log(128), abs=1e-5) and losses[-1] < losses[0] - 0.5
    loaded = load_safetensors(save_safetensors(model, tmp_path / "export"))
    assert loaded.config == cfg
    model.eval()
    torch.testing.assert_close(loaded(x), model(x), atol=0, rtol=0)
    torch.testing.assert_close(
        loaded.generate(x[:2, :4], max_new_tokens=5), model.generate(x[:2, :4], max_new_tokens=5)
    )
