"""The model's behaviour over every variant: shapes, causality, padding, positions, norms, attention weights, presets."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from model_variants import VARIANTS, build, run, single_thread, tokens, variant_id  # noqa: F401 (autouse fixture)

from lit_transformer.config import TransformerConfig
from lit_transformer.model import BLOCK_CLASSES, DecoderBlock, EncoderBlock, Transformer
from lit_transformer.model.positions import sinusoids

variants = pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
ATOL = 1e-5


@variants
def test_shapes_and_gradients(variant):
    model = build(variant).train()
    x = tokens(2, 9)
    if model.config.is_encoder_decoder:
        logits = model(x, x[:, :5])
        assert model.encode(x).shape == (2, 9, 32)
    else:
        logits = model(x)
    assert logits.shape == (2, 5 if model.config.is_encoder_decoder else 9, 128)
    logits.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


@variants
def test_causality(variant):
    """Changing later target tokens never changes an earlier output."""
    model = build(variant)
    x = tokens(2, 10)
    changed = x.clone()
    changed[:, 6:] = tokens(2, 4, seed=2)
    src = tokens(2, 7, seed=3)
    a, b = (run(model, src, t) if model.config.is_encoder_decoder else model(t) for t in (x, changed))
    torch.testing.assert_close(a[:, :6], b[:, :6], atol=ATOL, rtol=0)
    # and each output depends on every earlier target position and its own: their gradients are non-zero
    embedded = []
    model.embed_dropout.register_forward_hook(lambda module, args, out: embedded.append(out.retain_grad() or out))
    (run(model, src, x) if model.config.is_encoder_decoder else model(x))[:, 5].sum().backward()
    grad = embedded[-1].grad  # the target side's embeddings (the encoder's come first)
    assert (grad[:, 6:] == 0).all() and (grad[:, :6].abs().sum(-1) > 0).all()


@variants
@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_never_changes_a_result(variant, side):
    """A row padded in a batch gives what it gives alone, padding on either side (left padding needs the shifted
    position ids), for the decoder input and for the encoder's source."""
    model = build(variant)
    long, short = tokens(1, 9), tokens(1, 5, seed=2)
    pad = torch.zeros(1, 4, dtype=torch.long)
    padded = torch.cat([pad, short] if side == "left" else [short, pad], dim=1)
    real = slice(4, None) if side == "left" else slice(0, 5)
    batch = torch.cat([long, padded])
    mask = torch.ones_like(batch, dtype=torch.bool)
    mask[1] = torch.arange(9) >= 4 if side == "left" else torch.arange(9) < 5
    if model.config.is_encoder_decoder:
        tgt = tokens(2, 6, seed=4)
        torch.testing.assert_close(model(batch, tgt, src_mask=mask)[1], model(short, tgt[1:])[0], atol=ATOL, rtol=0)
        batch_tgt = torch.cat([tokens(1, 9, seed=5), padded])
        alone = model(long, short)[0]
        out = model(torch.cat([long, long]), batch_tgt, tgt_mask=mask)[1, real]
        torch.testing.assert_close(out, alone, atol=ATOL, rtol=0)
    else:
        torch.testing.assert_close(model(batch, attention_mask=mask)[1, real], model(short)[0], atol=ATOL, rtol=0)


@variants
def test_a_token_equal_to_pad_token_id_is_a_real_token_without_a_mask(variant):
    """Padding comes from the attention mask alone: id 0 (the tiny preset's pad, GPT-2's "!") is attended to like
    any token when no mask says otherwise, and masking it changes the result."""
    model = build(variant, init_std=0.3)
    x = tokens(1, 6)
    x[0, 0] = model.config.pad_token_id
    assert model.config.pad_token_id == 0
    keep = torch.ones_like(x, dtype=torch.bool)
    masked = keep.clone()
    masked[0, 0] = False
    if model.config.is_encoder_decoder:
        plain, explicit, dropped = (model(x, x[:, 1:], src_mask=m) for m in (None, keep, masked))
    else:
        plain, explicit, dropped = (model(x, attention_mask=m)[:, 1:] for m in (None, keep, masked))
    torch.testing.assert_close(plain, explicit, atol=0, rtol=0)
    assert (plain - dropped).abs().max() > 1e-3


@variants
def test_positions_are_added_to_the_token_embeddings(variant):
    """The stack's input is token embedding (times sqrt(d_model) when scaled) plus the position vector, on every side;
    rope, alibi and none add nothing there (they act inside attention, or not at all)."""
    model = build(variant)
    inputs = []
    model.embed_dropout.register_forward_pre_hook(lambda module, args: inputs.append(args[0]))
    x = tokens(2, 8)
    run(model, x)
    sides = [(model.src_embed, model.src_positions)] if model.config.is_encoder_decoder else []
    sides.append((model.tgt_embed, model.tgt_positions))
    assert len(inputs) == len(sides)
    scale = math.sqrt(32) if variant["scale_embeddings"] else 1.0
    for got, (embed, positions) in zip(inputs, sides, strict=True):
        if variant["positions"] in ("rope", "alibi", "none"):
            assert positions is None
            table = torch.zeros(8, 32)
        else:
            table = sinusoids(8, 32) if variant["positions"] == "sinusoidal" else positions.weight[:8]
        torch.testing.assert_close(got, embed.weight[x] * scale + table, atol=1e-6, rtol=0)


@pytest.mark.parametrize("norm_position", ["pre", "post"])
@pytest.mark.parametrize("topology", ["decoder_only", "encoder_decoder"])
def test_the_first_layer_norm_sees_the_sublayer_input_pre_and_the_residual_sum_post(topology, norm_position):
    """pre: LayerNorm(x) feeds attention, which adds to x; post: attention reads x, LayerNorm sees x + attention."""
    model = build({"topology": topology, "norm_position": norm_position})
    block = model.decoder_blocks[0]
    seen: dict[str, torch.Tensor] = {}

    def keep(name: str, value: torch.Tensor) -> None:  # hooks must return None, or they replace values
        seen.setdefault(name, value)

    block.register_forward_pre_hook(lambda m, args: keep("block_in", args[0]))
    block.self_attn_norm.register_forward_pre_hook(lambda m, args: keep("norm_in", args[0]))
    block.self_attn_norm.register_forward_hook(lambda m, args, out: keep("norm_out", out))
    block.self_attn.register_forward_pre_hook(lambda m, args: keep("attn_in", args[0]))
    block.self_attn.register_forward_hook(lambda m, args, out: keep("attn_out", out[0]))
    run(model, tokens(2, 8))
    if norm_position == "pre":
        torch.testing.assert_close(seen["norm_in"], seen["block_in"], atol=0, rtol=0)
        torch.testing.assert_close(seen["attn_in"], seen["norm_out"], atol=0, rtol=0)
    else:
        torch.testing.assert_close(seen["attn_in"], seen["block_in"], atol=0, rtol=0)
        torch.testing.assert_close(seen["norm_in"], seen["block_in"] + seen["attn_out"], atol=1e-6, rtol=0)
    assert (model.decoder_norm is None) == (norm_position == "post")  # pre-LN ends with a final LayerNorm


@variants
def test_attention_weights_on_request(variant):
    """return_attention takes the explicit softmax path: same logits, weights that are causal, mask padding and sum to 1."""
    model = build(variant)
    x = torch.cat([tokens(1, 6), torch.cat([tokens(1, 4, seed=2), torch.zeros(1, 2, dtype=torch.long)], 1)])
    real = x != 0
    masks = dict(src_mask=real, tgt_mask=real) if model.config.is_encoder_decoder else dict(attention_mask=real)
    logits, attentions = run(model, x, return_attention=True, **masks)
    torch.testing.assert_close(logits, run(model, x, **masks), atol=ATOL, rtol=0)
    expected = {"self", "encoder", "cross"} if model.config.is_encoder_decoder else {"self"}
    assert set(attentions) == expected
    for kind, weights in attentions.items():
        assert len(weights) == 2
        for w in weights:
            assert w.shape == (2, 4, 6, 6)
            torch.testing.assert_close(w.sum(-1)[0], torch.ones(4, 6))
            assert (w[1, :, :4, 4:] == 0).all()  # real queries never see padded keys
            if kind == "self":
                assert (w.triu(1) == 0).all()


def test_sinusoidal_positions_follow_the_paper_and_extend_past_max_seq_len():
    table = sinusoids(100, 32)
    pos, i = 37, 5
    assert table[pos, 2 * i].item() == pytest.approx(math.sin(pos / 10000 ** (2 * i / 32)), abs=1e-5)
    assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(pos / 10000 ** (2 * i / 32)), abs=1e-5)
    model = build({"positions": "sinusoidal"})
    assert model.config.max_seq_len == 64
    assert model(tokens(1, 80)).shape == (1, 80, 128)
    torch.testing.assert_close(model.tgt_positions(60, 20), table[60:80])


@pytest.mark.parametrize("topology", ["decoder_only", "encoder_decoder"])
def test_learned_positions_refuse_longer_input(topology):
    model = build({"positions": "learned", "topology": topology})
    with pytest.raises(ValueError, match="max_seq_len=64"):
        run(model, tokens(1, 65))


def test_wrong_call_for_topology_is_refused():
    with pytest.raises(TypeError, match="model\\(src, tgt"):
        build({"topology": "encoder_decoder"})(tokens(1, 4))
    with pytest.raises(TypeError, match="attention_mask"):
        build({"topology": "decoder_only"})(tokens(1, 4), tokens(1, 4))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"d_model": 30, "n_heads": 4}, "d_model=30 is not divisible by n_heads=4"),
        ({"topology": "encoder_decoder", "target_vocab_size": 64, "share_embeddings": True}, "share_embeddings=True"),
        ({"topology": "decoder_only", "n_encoder_layers": 2}, "n_encoder_layers applies to topology='encoder_decoder'"),
        ({"norm_position": "middle"}, "norm_position='middle' is not one of 'pre', 'post'"),
        ({"dropout": 1.5}, "dropout=1.5 must lie in"),
        ({"eos_token_id": 500}, "eos_token_id=500 lies outside the vocabulary"),
    ],
)
def test_invalid_configs_are_refused_with_a_message_naming_the_fields(changes, message):
    with pytest.raises(ValueError, match=message.replace("(", "\\(")):
        TransformerConfig.preset("tiny", **changes)


def test_separate_target_vocabulary():
    torch.manual_seed(0)
    model = Transformer(TransformerConfig.preset("tiny", topology="encoder_decoder", target_vocab_size=96))
    assert model.src_embed is not model.tgt_embed
    assert model(tokens(2, 5), tokens(2, 4, vocab=96)).shape == (2, 4, 96)


def test_a_separate_target_vocabulary_of_the_sources_size_has_its_own_embedding():
    """shared_vocab false trains two tokenizers, often of one size (both reach vocab_size): the CLI links
    target_vocab_size == vocab_size, and the source and target embeddings were one matrix, id i standing for an English
    piece on one side and a Spanish one on the other. Only target_vocab_size None (one tokenizer) shares."""
    cfg = TransformerConfig.preset("tiny", topology="encoder_decoder")
    separate = Transformer(cfg.replace(target_vocab_size=cfg.vocab_size))
    assert separate.src_embed is not separate.tgt_embed and separate.lm_head.weight is separate.tgt_embed.weight
    shared = Transformer(cfg)
    assert shared.src_embed is shared.tgt_embed
    forced = Transformer(cfg.replace(target_vocab_size=cfg.vocab_size, share_embeddings=True))
    assert forced.src_embed is forced.tgt_embed


def test_tying():
    three_way = build({"topology": "encoder_decoder", "tie_embeddings": True})
    assert three_way.src_embed.weight is three_way.tgt_embed.weight is three_way.lm_head.weight
    untied = build({"topology": "decoder_only", "tie_embeddings": False})
    assert untied.lm_head.weight is not untied.tgt_embed.weight


@pytest.mark.parametrize("topology", ["decoder_only", "encoder_decoder"])
def test_gpt2_initialisation(topology):
    torch.manual_seed(0)
    cfg = TransformerConfig.preset("tiny", topology=topology, d_model=128, d_ff=512, init="gpt2")
    model = Transformer(cfg)
    block = model.decoder_blocks[0]
    residual_sublayers = 2 * cfg.n_layers + (cfg.n_layers if topology == "encoder_decoder" else 0)
    assert block.self_attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert block.ff.down.weight.std().item() == pytest.approx(0.02 / math.sqrt(residual_sublayers), rel=0.05)
    assert model.tgt_embed.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert (block.self_attn.qkv.bias == 0).all() and (block.ff.up.bias == 0).all()


def test_xavier_initialisation():
    """Xavier uniform per projection matrix: a fused QKV is initialised as three d x d matrices, as the paper's."""
    torch.manual_seed(0)
    model = Transformer(TransformerConfig.preset("paper-base", vocab_size=1000, n_layers=1))
    d = 512
    qkv = model.decoder_blocks[0].self_attn.qkv.weight
    bound = math.sqrt(6 / (d + d))
    assert qkv.abs().max().item() <= bound and qkv.abs().max().item() > 0.95 * bound
    up = model.encoder_blocks[0].ff.up.weight
    assert up.abs().max().item() <= math.sqrt(6 / (d + 2048))
    assert model.tgt_embed.weight.std().item() == pytest.approx(d**-0.5, rel=0.05)


def _count(name: str) -> Transformer:
    with torch.device("meta"):
        return Transformer(TransformerConfig.preset(name))


def _count_unpadded(name: str) -> Transformer:
    with torch.device("meta"):
        return Transformer(TransformerConfig.preset(name, pad_vocab_to_multiple_of=None))


def test_gpt2_small_has_exactly_the_released_parameter_count():
    model = _count("gpt2-small")
    assert model.num_parameters(padding=False) == 124_439_808
    # The preset pads the vocabulary's 50,257 rows to 50,304 (pad_vocab_to_multiple_of=64), as nanoGPT does.
    assert model.num_parameters() == 124_439_808 + (50304 - 50257) * 768 == 124_475_904
    assert _count_unpadded("gpt2-small").num_parameters() == 124_439_808
    # nanoGPT's MFU count: 6 N (N without the position table; the tied output matrix counts at its padded width,
    # the matmul the GPU runs) + 12 L d T
    n = 124_475_904 - 1024 * 768
    assert model.flops_per_token(1024) == 6 * n + 12 * 12 * 768 * 1024


def _paper_parameter_count(d: int, d_ff: int, layers: int, vocab: int) -> int:
    """Written out: one shared, three-way tied embedding; post-LN (no final norms); sinusoids have no parameters."""
    attention = 4 * (d * d + d)  # Q, K, V and output projections with biases
    feed_forward = (d * d_ff + d_ff) + (d_ff * d + d)
    norm = 2 * d
    encoder_layer = attention + feed_forward + 2 * norm
    decoder_layer = 2 * attention + feed_forward + 3 * norm
    return vocab * d + layers * (encoder_layer + decoder_layer)


@pytest.mark.parametrize(
    ("name", "exact", "paper_count"),
    [("paper-base", 63_082_496, 65e6), ("paper-big", 214_245_376, 213e6)],
)
def test_paper_presets_have_exactly_the_counted_parameters(name, exact, paper_count):
    # Table 3 says 65M (base) and 213M (big) without saying how it counted. With the stated 37,000-token shared
    # vocabulary and three-way tying we have 63.08M (-2.95%) and 214.25M (+0.6%); an untied output matrix (+18.9M for
    # base) would overshoot by far, so tying is what the paper counted.
    model = _count(name)
    cfg = model.config
    assert _paper_parameter_count(cfg.d_model, cfg.ff_dim, cfg.n_layers, cfg.vocab_size) == exact
    assert model.num_parameters(padding=False) == _count_unpadded(name).num_parameters() == exact
    # The preset pads the shared table's 37,000 rows to 37,056 (pad_vocab_to_multiple_of=64).
    assert model.num_parameters() == exact + (37056 - 37000) * cfg.d_model
    assert abs(exact - paper_count) / paper_count < 0.03


def test_tiny_preset_has_exactly_the_counted_parameters():
    """Decoder-only, pre-LN, learned positions, tied: tables + 2 blocks (attention, feed-forward, 2 norms) + final norm."""
    d, d_ff, vocab, positions = 32, 64, 128, 64
    block = 4 * (d * d + d) + (d * d_ff + d_ff) + (d_ff * d + d) + 2 * 2 * d
    assert _count("tiny").num_parameters() == vocab * d + positions * d + 2 * block + 2 * d == 23_296


def test_flops_per_token_counts_both_stacks():
    model = _count("paper-base")
    cfg = model.config
    # The tied output projection is a matmul, run at the padded width (37,056 rows).
    n_matmul = model.num_parameters(non_embedding=True) + 37056 * 512
    attention_layers = cfg.encoder_layers + 2 * cfg.decoder_layers  # encoder self, decoder self and cross
    assert model.flops_per_token(128) == 6 * n_matmul + 12 * attention_layers * 512 * 128
    assert model.num_parameters(non_embedding=True) == model.num_parameters() - 37056 * 512


def test_block_classes_are_exported_for_wrapping():
    model = build({"topology": "encoder_decoder"})
    kinds = {type(m) for m in model.modules() if isinstance(m, BLOCK_CLASSES)}
    assert kinds == {EncoderBlock, DecoderBlock}


def test_model_package_does_not_import_lightning():
    code = "import sys, lit_transformer.model; assert not any(m.startswith(('lightning', 'pytorch_lightning')) for m in sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("topology", ["decoder_only", "encoder_decoder"])
def test_dropout_acts_in_training_only(topology):
    """In training each dropout zeroes about p of its inputs and scales the rest by 1 / (1 - p); in eval, nothing."""
    p = 0.3
    model = build({"topology": topology}, dropout=p)
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    dropouts = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert dropouts and all(m.p == p for m in dropouts)
    for m in dropouts:
        m.register_forward_hook(lambda module, args, out: pairs.append((args[0], out)))
    x = tokens(2, 8)
    run(model, x)
    assert all(torch.equal(a, b) for a, b in pairs)
    pairs.clear()
    model.train()
    run(model, x)
    dropped = kept = 0
    for a, b in pairs:
        zero = b == 0
        torch.testing.assert_close(b[~zero], a[~zero] / (1 - p))
        dropped, kept = dropped + int(zero.sum()), kept + int((~zero).sum())
    assert abs(dropped / (dropped + kept) - p) < 0.03, dropped / (dropped + kept)
