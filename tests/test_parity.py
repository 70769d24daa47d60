"""Numerical parity with reference implementations, weights copied across, eval mode, to 1e-5."""

from __future__ import annotations

import pytest
import torch
from model_variants import build, single_thread, tokens  # noqa: F401 (autouse fixture)
from torch import nn

from lit_transformer.model import Transformer

pytestmark = pytest.mark.filterwarnings("ignore:.*nested.tensor:UserWarning")


def _randomise(model: nn.Module) -> None:
    """Non-trivial LayerNorm gains and biases everywhere (default inits make them 1 and 0, hiding mistakes)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if "norm" in name or "ln" in name else 0.0))


def _copy_linear(dst: nn.Module, weight: torch.Tensor, bias: torch.Tensor) -> None:
    with torch.no_grad():
        dst.weight.copy_(weight)
        dst.bias.copy_(bias)


def _torch_reference(model: Transformer, norm_first: bool) -> nn.Transformer:
    cfg = model.config
    ref = nn.Transformer(
        d_model=cfg.d_model,
        nhead=cfg.n_heads,
        num_encoder_layers=cfg.encoder_layers,
        num_decoder_layers=cfg.decoder_layers,
        dim_feedforward=cfg.ff_dim,
        dropout=0.0,
        activation="relu",
        layer_norm_eps=cfg.layer_norm_eps,
        batch_first=True,
        norm_first=norm_first,
    ).eval()
    for ours, theirs in zip(model.encoder_blocks, ref.encoder.layers, strict=True):
        theirs.load_state_dict(
            {
                "self_attn.in_proj_weight": ours.self_attn.qkv.weight,
                "self_attn.in_proj_bias": ours.self_attn.qkv.bias,
                "self_attn.out_proj.weight": ours.self_attn.out.weight,
                "self_attn.out_proj.bias": ours.self_attn.out.bias,
                "linear1.weight": ours.ff.up.weight,
                "linear1.bias": ours.ff.up.bias,
                "linear2.weight": ours.ff.down.weight,
                "linear2.bias": ours.ff.down.bias,
                "norm1.weight": ours.self_attn_norm.weight,
                "norm1.bias": ours.self_attn_norm.bias,
                "norm2.weight": ours.ff_norm.weight,
                "norm2.bias": ours.ff_norm.bias,
            }
        )
    for ours, theirs in zip(model.decoder_blocks, ref.decoder.layers, strict=True):
        cross = ours.cross_attn
        theirs.load_state_dict(
            {
                "self_attn.in_proj_weight": ours.self_attn.qkv.weight,
                "self_attn.in_proj_bias": ours.self_attn.qkv.bias,
                "self_attn.out_proj.weight": ours.self_attn.out.weight,
                "self_attn.out_proj.bias": ours.self_attn.out.bias,
                "multihead_attn.in_proj_weight": torch.cat([cross.q.weight, cross.kv.weight]),
                "multihead_attn.in_proj_bias": torch.cat([cross.q.bias, cross.kv.bias]),
                "multihead_attn.out_proj.weight": cross.out.weight,
                "multihead_attn.out_proj.bias": cross.out.bias,
                "linear1.weight": ours.ff.up.weight,
                "linear1.bias": ours.ff.up.bias,
                "linear2.weight": ours.ff.down.weight,
                "linear2.bias": ours.ff.down.bias,
                "norm1.weight": ours.self_attn_norm.weight,
                "norm1.bias": ours.self_attn_norm.bias,
                "norm2.weight": ours.cross_attn_norm.weight,
                "norm2.bias": ours.cross_attn_norm.bias,
                "norm3.weight": ours.ff_norm.weight,
                "norm3.bias": ours.ff_norm.bias,
            }
        )
    if norm_first:
        ref.encoder.norm.load_state_dict(model.encoder_norm.state_dict())
        ref.decoder.norm.load_state_dict(model.decoder_norm.state_dict())
    else:
        # nn.Transformer puts a final LayerNorm on Post-LN stacks too; the paper has none (each sublayer already ends
        # in one), so the reference loses it.
        ref.encoder.norm = None
        ref.decoder.norm = None
    return ref


@pytest.mark.parametrize("norm_position", ["post", "pre"])
@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_encoder_decoder_matches_torch_nn_transformer(norm_position, positions):
    model = build(
        {"topology": "encoder_decoder", "norm_position": norm_position, "positions": positions, "activation": "relu"},
        scale_embeddings=True,
    )
    _randomise(model)
    ref = _torch_reference(model, norm_first=norm_position == "pre")
    src = tokens(2, 9)
    src[1, 6:] = 0  # right padding in the source
    tgt = tokens(2, 7, seed=2)
    keep = src != 0
    with torch.no_grad():
        ours = model(src, tgt, src_mask=keep)
        # nn.Transformer has no embeddings: feed it ours (scaled tokens + positions) and apply our output projection.
        src_x = model._embed(src, model.src_embed, model.src_positions, 0, None)
        tgt_x = model._embed(tgt, model.tgt_embed, model.tgt_positions, 0, None)
        causal = nn.Transformer.generate_square_subsequent_mask(7)
        hidden = ref(
            src_x,
            tgt_x,
            tgt_mask=causal,
            src_key_padding_mask=~keep,
            memory_key_padding_mask=~keep,
            tgt_is_causal=True,
        )
        theirs = model.lm_head(hidden)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_post_ln_is_the_paper_formula():
    """One encoder block by hand: x = LN(x + Attn(x)); x = LN(x + FFN(x))."""
    model = build({"topology": "encoder_decoder", "norm_position": "post", "activation": "relu"})
    _randomise(model)
    block = model.encoder_blocks[0]
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        h = block.self_attn_norm(x + block.self_attn(x)[0])
        expected = block.ff_norm(h + block.ff.down(torch.relu(block.ff.up(h))))
        torch.testing.assert_close(block(x)[0], expected)


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_decoder_only_matches_hugging_face_gpt2(attn_implementation):
    transformers = pytest.importorskip("transformers")
    model = build(
        {"topology": "decoder_only", "norm_position": "pre", "positions": "learned", "activation": "gelu_tanh"},
        tie_embeddings=True,
        pad_token_id=None,
    )
    cfg = model.config
    config = transformers.GPT2Config(
        vocab_size=cfg.vocab_size,
        n_positions=cfg.max_seq_len,
        n_embd=cfg.d_model,
        n_layer=cfg.n_layers,
        n_head=cfg.n_heads,
        n_inner=cfg.ff_dim,
        activation_function="gelu_new",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        layer_norm_epsilon=cfg.layer_norm_eps,
        bos_token_id=None,
        eos_token_id=None,
    )
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel._from_config(config, attn_implementation=attn_implementation).eval()
    _randomise(gpt2)
    hf = gpt2.transformer
    # HF's Conv1D stores (in, out): transpose into our nn.Linear (out, in).
    state = {
        "tgt_embed.weight": hf.wte.weight,
        "tgt_positions.weight": hf.wpe.weight,
        "decoder_norm.weight": hf.ln_f.weight,
        "decoder_norm.bias": hf.ln_f.bias,
    }
    for i, h in enumerate(hf.h):
        p = f"decoder_blocks.{i}."
        state |= {
            p + "self_attn_norm.weight": h.ln_1.weight,
            p + "self_attn_norm.bias": h.ln_1.bias,
            p + "self_attn.qkv.weight": h.attn.c_attn.weight.T,
            p + "self_attn.qkv.bias": h.attn.c_attn.bias,
            p + "self_attn.out.weight": h.attn.c_proj.weight.T,
            p + "self_attn.out.bias": h.attn.c_proj.bias,
            p + "ff_norm.weight": h.ln_2.weight,
            p + "ff_norm.bias": h.ln_2.bias,
            p + "ff.up.weight": h.mlp.c_fc.weight.T,
            p + "ff.up.bias": h.mlp.c_fc.bias,
            p + "ff.down.weight": h.mlp.c_proj.weight.T,
            p + "ff.down.bias": h.mlp.c_proj.bias,
        }
    state["lm_head.weight"] = hf.wte.weight
    model.load_state_dict(state)
    assert model.num_parameters() == gpt2.num_parameters()
    x = tokens(2, 20)
    with torch.no_grad():
        torch.testing.assert_close(model(x), gpt2(x).logits, atol=1e-5, rtol=1e-5)
