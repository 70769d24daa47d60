"""An encoder that reads features or image patches instead of tokens (the captioning model's source), with every
other switch unchanged: padding, causality, the KV cache and learning, checked on tiny dimensions."""

from __future__ import annotations

import pytest
import torch
from model_variants import FIRST_TOKEN, PAPER, build, single_thread, tokens  # noqa: F401

from lit_transformer.config import TransformerConfig
from lit_transformer.model import Transformer
from lit_transformer.model.encoder_inputs import sinusoids_2d

SOURCE_DIM = 12
IMAGE = {"source": "patches", "image_size": (8, 12), "patch_size": 4, "image_channels": 3}
FEATURES = {"source": "features", "source_dim": SOURCE_DIM}
# The block switches that meet a non-text source: norm placement, both added position signals, rotary positions
# (features only: patches are a 2-D grid), tying of the decoder's table and output layer.
SOURCE_VARIANTS = [
    {**PAPER, **FEATURES},
    {**PAPER, **FEATURES, "norm_position": "pre", "positions": "learned", "tie_embeddings": False},
    {**PAPER, **FEATURES, "positions": "rope", "norm_position": "pre"},
    {**PAPER, **FEATURES, "source_positions": False},
    {**PAPER, **IMAGE},
    {**PAPER, **IMAGE, "norm_position": "pre", "positions": "learned"},
]


def variant_id(v: dict) -> str:
    return "-".join([v["source"], v["norm_position"], v["positions"]] + ["set"] * (v.get("source_positions") is False))


def source(model: Transformer, batch: int, length: int = 5, seed: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    if cfg.source == "features":
        return torch.randn(batch, length, SOURCE_DIM, generator=g)
    return torch.rand(batch, cfg.image_channels, *cfg.image_size, generator=g)


@pytest.mark.parametrize("variant", SOURCE_VARIANTS, ids=variant_id)
def test_each_row_gives_what_it_gives_alone(variant):
    """A batch of sources (features padded to the longest row, as the mask says) gives each row's own logits."""
    model = build(variant)
    src, tgt = source(model, 3, length=6), tokens(3, 7)
    mask = None
    lengths = [6, 6, 6]
    if model.config.source == "features":
        lengths = [6, 2, 4]
        mask = torch.arange(6)[None, :] < torch.tensor(lengths)[:, None]
        src = src.masked_fill(~mask[..., None], 1e4)  # padded regions hold garbage: the mask alone must hide them
    batched = model(src, tgt, src_mask=mask)
    for row, n in enumerate(lengths):
        alone = src[row : row + 1, :n] if model.config.source == "features" else src[row : row + 1]
        torch.testing.assert_close(batched[row], model(alone, tgt[row : row + 1])[0], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("variant", SOURCE_VARIANTS, ids=variant_id)
def test_the_caption_decoder_stays_causal(variant):
    """A later caption token never changes an earlier position's logits, whatever the source."""
    model = build(variant)
    src, tgt = source(model, 2), tokens(2, 8)
    changed = tgt.clone()
    changed[:, 5:] = FIRST_TOKEN
    torch.testing.assert_close(model(src, tgt)[:, :5], model(src, changed)[:, :5])
    assert not torch.allclose(model(src, tgt)[:, 5:], model(src, changed)[:, 5:])


@pytest.mark.parametrize("variant", SOURCE_VARIANTS, ids=variant_id)
def test_cached_decoding_equals_recomputation(variant):
    """Greedy and beam decoding with the KV cache give the same tokens as recomputing every step, and the cached
    step's logits equal the full forward's."""
    model = build(variant)
    src = source(model, 2)
    for beams in (1, 3):
        cached = model.generate(src, max_new_tokens=6, num_beams=beams, eos_token_id=-1)
        plain = model.generate(src, max_new_tokens=6, num_beams=beams, eos_token_id=-1, use_cache=False)
        assert cached.dtype == torch.long and cached.shape == (2, 6)
        assert torch.equal(cached, plain)
    memory = model.encode(src)
    tgt = torch.cat([torch.full((2, 1), model.config.bos_token_id), tokens(2, 4)], dim=1)
    full = model.decode(tgt, memory)
    cache = model.new_cache(8)
    steps = [model.decode(tgt[:, i : i + 1], memory, cache=cache) for i in range(tgt.shape[1])]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=2e-5, rtol=1e-4)


def test_a_set_of_regions_is_read_in_any_order():
    """source_positions=False: the encoder has no position signal over features, so permuting the regions permutes
    its memory and cross-attention, a weighted sum over the memory, gives the same caption logits."""
    model = build(SOURCE_VARIANTS[3])
    src, tgt = source(model, 2, length=6), tokens(2, 5)
    order = torch.tensor([3, 0, 5, 1, 4, 2])
    torch.testing.assert_close(model.encode(src[:, order]), model.encode(src)[:, order], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(model(src[:, order], tgt), model(src, tgt), atol=2e-5, rtol=1e-4)
    ordered = build(SOURCE_VARIANTS[0])  # with positions, the order is part of the input
    assert not torch.allclose(ordered.encode(src[:, order]), ordered.encode(src)[:, order], atol=1e-2)


def test_patches_are_the_strided_convolution_of_vit():
    """The patch projection equals a Conv2d with kernel = stride = patch_size and the same weights, flattened in
    raster order: each patch one vector, row by row."""
    model = build({**PAPER, **IMAGE})
    embed = model.src_input
    conv = torch.nn.Conv2d(3, model.config.d_model, kernel_size=4, stride=4)
    with torch.no_grad():
        conv.weight.copy_(embed.proj.weight.reshape(conv.weight.shape))
        conv.bias.copy_(embed.proj.bias)
    images = source(model, 2)
    expected = conv(images).flatten(2).transpose(1, 2)  # (B, rows * cols, d_model)
    torch.testing.assert_close(embed(images), expected, atol=1e-5, rtol=1e-5)


def test_two_dimensional_sinusoids_encode_row_and_column():
    """Patches in one row share the row half of their position vectors; patches in one column, the column half."""
    table = sinusoids_2d(2, 3, 8).reshape(2, 3, 8)
    assert torch.equal(table[0, 0, :4], table[0, 2, :4]) and not torch.equal(table[0, 0, :4], table[1, 0, :4])
    assert torch.equal(table[0, 1, 4:], table[1, 1, 4:]) and not torch.equal(table[0, 1, 4:], table[0, 2, 4:])


def test_wrong_shaped_images_name_the_expected_shape():
    model = build({**PAPER, **IMAGE})
    with pytest.raises(ValueError, match=r"\(batch, 3, 8, 12\) images"):
        model.encode(torch.rand(1, 3, 8, 8))


def test_a_source_of_the_other_kind_names_the_data_setting_to_change():
    """Images given to a features model (predict without features_dir) or features to an image model (with it): the
    message said only the shape (and told the latter to resize its features); it names features_dir."""
    images = build({**PAPER, **IMAGE})
    with pytest.raises(
        ValueError, match=r"got shape \(2, 5, 12\): features, .* leave data.init_args.features_dir unset"
    ):
        images.encode(torch.rand(2, 5, SOURCE_DIM))
    features = build({**PAPER, **FEATURES})
    with pytest.raises(ValueError, match=r"got shape \(2, 3, 8, 12\): images, .*--data.init_args.features_dir"):
        features.encode(torch.rand(2, 3, 8, 12))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"source": "features"}, "needs source_dim"),
        ({"source": "patches", "patch_size": 4}, "needs image_size"),
        ({"source": "patches", "image_size": (8, 10), "patch_size": 4}, "not a multiple of patch_size"),
        ({"source": "patches", "image_size": (8, 8), "patch_size": 4, "positions": "rope"}, "sinusoidal \\(2-D\\)"),
        ({"source": "features", "source_dim": 4, "share_embeddings": True}, "has none"),
        ({"source": "pixels"}, "source='pixels' is not one of"),
        ({"source_dim": 4}, "applies to source='features' or 'patches' only"),
    ],
)
def test_bad_source_settings_are_refused_with_the_fix(fields, message):
    with pytest.raises(ValueError, match=message):
        TransformerConfig.preset("tiny", **{**PAPER, **fields})
    with pytest.raises(ValueError, match="needs topology='encoder_decoder'"):
        TransformerConfig.preset("tiny", topology="decoder_only", **FEATURES)


COLOURS = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])


def squares(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Images 3 x 8 x 12 of noise with one 4 x 4 square of a colour, in the left or the right half; the caption is
    the colour word then the side word (ids 3-5, then 6-7), then EOS."""
    g = torch.Generator().manual_seed(seed)
    images = 0.3 * torch.rand(n, 3, 8, 12, generator=g)
    colour = torch.randint(0, 3, (n,), generator=g)
    right = torch.randint(0, 2, (n,), generator=g)
    for i in range(n):
        top = int(torch.randint(0, 5, (1,), generator=g))
        left = int(torch.randint(0, 3, (1,), generator=g)) + 6 * int(right[i])
        images[i, :, top : top + 4, left : left + 4] = COLOURS[colour[i]][:, None, None]
    captions = torch.stack([colour + 3, right + 6, torch.full_like(colour, 2)], dim=1)
    return images, captions


def test_a_tiny_captioning_task_is_learned_from_pixels():
    """The colour of a square and its side, read from raw pixels: held-out images are captioned exactly."""
    torch.manual_seed(0)
    cfg = TransformerConfig.preset(
        "tiny", **{**PAPER, **IMAGE, "norm_position": "pre"}, dropout=0.0, n_layers=1, vocab_size=8
    )
    model = Transformer(cfg)
    images, captions = squares(512, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    bos = torch.full((64, 1), cfg.bos_token_id)
    for step in range(300):
        rows = torch.arange(64) + 64 * (step % 8)
        logits = model(images[rows], torch.cat([bos, captions[rows, :-1]], dim=1))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), captions[rows].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    test_images, test_captions = squares(64, seed=1)
    generated = model.generate(test_images, max_new_tokens=3)
    assert torch.equal(generated, test_captions), f"final training loss {loss.item():.3f}"
