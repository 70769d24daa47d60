"""Decoding: the KV cache changes nothing, batching and padding change nothing, beams and EOS behave."""

from __future__ import annotations

import pytest
import torch
from model_variants import DECODING_VARIANTS, build, single_thread, tokens, variant_id  # noqa: F401 (autouse fixture)

from lit_transformer.model.generation import beam_search, filter_logits

variants = pytest.mark.parametrize("variant", DECODING_VARIANTS, ids=variant_id)
NEW = 8


def peaky(variant, **overrides):
    """Large weights give peaked distributions, so near-ties cannot make equal computations pick different tokens."""
    return build(variant, init_std=0.3, **overrides)


def prompt(model, batch=2, length=5):
    return tokens(batch, length, seed=7)


@variants
def test_cached_greedy_equals_full_recomputation(variant):
    model = peaky(variant)
    x = prompt(model)
    cached = model.generate(x, NEW, eos_token_id=-1)
    assert cached.shape == (2, NEW) and cached.dtype == torch.long
    # an independent reference: the plain forward on the whole sequence, argmax, append
    seq = x if not model.config.is_encoder_decoder else torch.full((2, 1), model.config.bos_token_id)
    for _ in range(NEW):
        logits = model(seq) if not model.config.is_encoder_decoder else model(x, seq)
        seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    torch.testing.assert_close(cached, seq[:, -NEW:], rtol=0, atol=0)
    torch.testing.assert_close(cached, model.generate(x, NEW, eos_token_id=-1, use_cache=False), rtol=0, atol=0)


@variants
def test_cached_sampling_equals_full_recomputation(variant):
    model = peaky(variant)
    x = prompt(model)
    kwargs = dict(temperature=0.9, top_k=20, top_p=0.9, eos_token_id=-1)
    a = model.generate(x, NEW, generator=torch.Generator().manual_seed(3), **kwargs)
    b = model.generate(x, NEW, generator=torch.Generator().manual_seed(3), use_cache=False, **kwargs)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    c = model.generate(x, NEW, generator=torch.Generator().manual_seed(4), **kwargs)
    assert not torch.equal(a, c)  # the generator really drives the sampling


@variants
def test_cached_beam_search_equals_full_recomputation(variant):
    model = peaky(variant)
    x = prompt(model)
    a = model.generate(x, NEW, num_beams=3, length_penalty=0.8)
    b = model.generate(x, NEW, num_beams=3, length_penalty=0.8, use_cache=False)
    torch.testing.assert_close(a, b, rtol=0, atol=0)


@variants
def test_one_beam_equals_greedy(variant):
    model = peaky(variant)
    x = prompt(model)
    eos = model.generate(x, 3, eos_token_id=-1)[0, 2].item()  # an EOS that row 0 meets early
    greedy = model.generate(x, NEW, eos_token_id=eos)
    one_beam = beam_search(model, x, NEW, num_beams=1, eos=eos, fill=model.config.pad_token_id)
    torch.testing.assert_close(one_beam, greedy, rtol=0, atol=0)


@variants
@pytest.mark.parametrize("num_beams", [1, 3])
@pytest.mark.parametrize("side", ["left", "right"])
def test_batched_equals_unbatched(variant, num_beams, side):
    """Each row of a padded batch gives exactly what it gives alone (prompts or sources of different lengths)."""
    model = peaky(variant)
    rows = [tokens(1, 6, seed=1), tokens(1, 3, seed=2), tokens(1, 5, seed=3)]
    pad = model.config.pad_token_id
    padded = [
        torch.cat(
            [torch.full((1, 6 - r.shape[1]), pad), r] if side == "left" else [r, torch.full((1, 6 - r.shape[1]), pad)],
            1,
        )
        for r in rows
    ]
    kwargs = dict(num_beams=num_beams)
    batched = model.generate(torch.cat(padded), NEW, **kwargs)
    for i, row in enumerate(rows):
        alone = model.generate(row, NEW, **kwargs)[0]
        assert torch.equal(batched[i, : len(alone)], alone)
        assert (batched[i, len(alone) :] == pad).all()


@pytest.mark.parametrize("topology", ["decoder_only", "encoder_decoder"])
def test_rows_stop_at_eos_and_are_filled_after_it(topology):
    model = peaky({"topology": topology})
    x = prompt(model)
    free = model.generate(x, NEW, eos_token_id=-1)
    eos = free[0, 2].item()
    out = model.generate(x, NEW, eos_token_id=eos)
    stop = (free[0] == eos).nonzero()[0].item()
    assert out[0, stop] == eos and (out[0, stop + 1 :] == model.config.pad_token_id).all()
    assert out.shape[1] <= NEW
    if (free[1] != eos).all():
        assert torch.equal(out[1], free[1])
    # without a pad token, the row is filled with EOS
    no_pad = peaky({"topology": topology}, pad_token_id=None)
    out = no_pad.generate(x, NEW, eos_token_id=eos)
    assert (out[0, stop:] == eos).all()


def test_generation_stops_when_every_row_is_done():
    model = peaky({"topology": "decoder_only"})
    x = prompt(model, batch=1)
    first = model.generate(x, 1, eos_token_id=-1)[0, 0].item()
    assert model.generate(x, NEW, eos_token_id=first).shape == (1, 1)
    assert model.generate(x, NEW, eos_token_id=first, num_beams=2).shape[1] <= NEW


def test_generation_restores_training_mode_and_uses_no_grad():
    model = peaky({"topology": "decoder_only"}).train()
    out = model.generate(prompt(model), 3)
    assert model.training and not out.requires_grad


def test_sinusoidal_generation_runs_past_max_seq_len_and_learned_refuses():
    x = tokens(1, 60)
    assert peaky({"positions": "sinusoidal"}).generate(x, 10, eos_token_id=-1).shape == (1, 10)
    with pytest.raises(ValueError, match="max_seq_len=64"):
        peaky({"positions": "learned"}).generate(x, 10, eos_token_id=-1)


def test_filter_logits_top_k_and_top_p():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    assert torch.isinf(filter_logits(logits, top_k=2)[0, 2:]).all()
    assert torch.isfinite(filter_logits(logits, top_k=2)[0, :2]).all()
    probs = logits.softmax(-1)[0]  # 0.64, 0.24, 0.09, ...
    kept = torch.isfinite(filter_logits(logits, top_p=0.7)[0])
    assert kept.tolist() == [True, True, False, False, False]
    assert torch.isfinite(filter_logits(logits, top_p=0.1)[0]).sum() == 1  # the most likely token always survives
    assert probs[0] > 0.6


def test_invalid_generation_arguments():
    model = peaky({"topology": "decoder_only"})
    with pytest.raises(ValueError, match="temperature"):
        model.generate(prompt(model), 3, temperature=-1.0)
    with pytest.raises(ValueError, match="num_beams"):
        model.generate(prompt(model), 3, num_beams=0)


@variants
def test_single_row_decoding_with_column_major_weights_equals_recomputation(variant):
    """One row and >= 16 new tokens take the column-major weight path; tokens and weights are unchanged by it."""
    model = peaky(variant)
    before = {name: (p.data_ptr(), p.stride()) for name, p in model.named_parameters()}
    x = prompt(model, batch=1)
    cached = model.generate(x, 20, eos_token_id=-1)
    assert cached.shape == (1, 20)
    torch.testing.assert_close(cached, model.generate(x, 20, eos_token_id=-1, use_cache=False), rtol=0, atol=0)
    assert {name: (p.data_ptr(), p.stride()) for name, p in model.named_parameters()} == before


def test_column_major_weights_are_put_back_after_an_error():
    from lit_transformer.model.generation import vector_friendly_weights

    model = build(DECODING_VARIANTS[0])
    weight = model.lm_head.weight
    stride = weight.stride()
    with pytest.raises(RuntimeError, match="inside"):
        with vector_friendly_weights(model):
            assert weight.stride() == (1, weight.shape[0])
            raise RuntimeError("inside")
    assert weight.stride() == stride
