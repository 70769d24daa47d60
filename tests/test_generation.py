"""Decoding: the KV cache changes nothing, batching and padding change nothing, beams and EOS behave."""

from __future__ import annotations

import pytest
import torch
from model_variants import DECODING_VARIANTS, VARIANTS, build, single_thread, tokens, variant_id  # noqa: F401 (autouse fixture)

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
    cached = model.generate(x, max_new_tokens=NEW, eos_token_id=-1)
    assert cached.shape == (2, NEW) and cached.dtype == torch.long
    # an independent reference: the plain forward on the whole sequence, argmax, append
    seq = x if not model.config.is_encoder_decoder else torch.full((2, 1), model.config.bos_token_id)
    for _ in range(NEW):
        logits = model(seq) if not model.config.is_encoder_decoder else model(x, seq)
        seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    torch.testing.assert_close(cached, seq[:, -NEW:], rtol=0, atol=0)
    torch.testing.assert_close(
        cached, model.generate(x, max_new_tokens=NEW, eos_token_id=-1, use_cache=False), rtol=0, atol=0
    )


def _close(got: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Logits of the same fp32 arithmetic in other matmul shapes (one query row against cached keys, against the whole
    triangle): they differ by rounding, ~1e-6 of the logits' magnitude (which reaches tens with these peaked weights);
    1e-5 of it allows for the summation order, while a cache bug (a wrong position, a stale or misplaced key, a lost
    mask) moves logits by a large fraction of it."""
    scale = expected.abs().max().item()
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5 * max(1.0, scale), msg=what)


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_cached_logits_equal_recomputed_logits(variant):
    """Every variant, step by step, teacher-forced: the KV cache's next-token logits equal (1) the plain forward over
    the whole sequence, and (2) recomputing the window, on a padded batch whose rows are expanded as for beams and
    reordered as beam search does. Logits, not tokens: a cache bug can leave the argmax alone."""
    from lit_transformer.model.generation import IncrementalDecoder

    model = peaky(variant)
    x = prompt(model, batch=2, length=5)
    decoder_only = not model.config.is_encoder_decoder
    with torch.inference_mode():
        cached = IncrementalDecoder(model, x, None, NEW)
        seq = x if decoder_only else torch.full((2, 1), model.config.bos_token_id)
        for step in range(NEW):
            full = (model(seq) if decoder_only else model(x, seq))[:, -1].float()
            _close(cached.logits, full, f"step {step}: the cache against the plain forward")
            token = full.argmax(-1)
            seq = torch.cat([seq, token[:, None]], dim=1)
            cached.step(token)
        mask = torch.ones(2, 5, dtype=torch.bool)
        mask[1, :2] = False  # padding: on the left of a prompt, or inside a source row
        cached = IncrementalDecoder(model, x, mask, NEW, expand=2)
        recomputed = IncrementalDecoder(model, x, mask, NEW, expand=2, use_cache=False)
        reorder = torch.tensor([1, 1, 3, 2])  # beam search's row selection
        for step in range(NEW):
            _close(cached.logits, recomputed.logits, f"step {step}: the cache against recomputation, padded, beams")
            token = recomputed.logits.argmax(-1)
            rows = reorder if step % 2 else None
            cached.step(token, rows)
            recomputed.step(token, rows)


@variants
def test_cached_sampling_equals_full_recomputation(variant):
    model = peaky(variant)
    x = prompt(model)
    kwargs = dict(temperature=0.9, top_k=20, top_p=0.9, eos_token_id=-1)
    a = model.generate(x, max_new_tokens=NEW, generator=torch.Generator().manual_seed(3), **kwargs)
    b = model.generate(x, max_new_tokens=NEW, generator=torch.Generator().manual_seed(3), use_cache=False, **kwargs)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    c = model.generate(x, max_new_tokens=NEW, generator=torch.Generator().manual_seed(4), **kwargs)
    assert not torch.equal(a, c)  # the generator really drives the sampling


@variants
def test_cached_beam_search_equals_full_recomputation(variant):
    model = peaky(variant)
    x = prompt(model)
    a = model.generate(x, max_new_tokens=NEW, num_beams=3, length_penalty=0.8)
    b = model.generate(x, max_new_tokens=NEW, num_beams=3, length_penalty=0.8, use_cache=False)
    torch.testing.assert_close(a, b, rtol=0, atol=0)


@variants
def test_one_beam_equals_greedy(variant):
    model = peaky(variant)
    x = prompt(model)
    eos = model.generate(x, max_new_tokens=3, eos_token_id=-1)[0, 2].item()  # an EOS that row 0 meets early
    greedy = model.generate(x, max_new_tokens=NEW, eos_token_id=eos)
    one_beam = beam_search(model, x, max_new_tokens=NEW, num_beams=1, eos_token_id=eos)
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
    mask = torch.cat(
        [
            torch.arange(6)[None] >= 6 - r.shape[1] if side == "left" else torch.arange(6)[None] < r.shape[1]
            for r in rows
        ]
    )
    batched = model.generate(torch.cat(padded), max_new_tokens=NEW, attention_mask=mask, **kwargs)
    for i, row in enumerate(rows):
        alone = model.generate(row, max_new_tokens=NEW, **kwargs)[0]
        assert torch.equal(batched[i, : len(alone)], alone)
        assert (batched[i, len(alone) :] == pad).all()


@pytest.mark.parametrize("topology", ["decoder_only", "encoder_decoder"])
def test_rows_stop_at_eos_and_are_filled_after_it(topology):
    model = peaky({"topology": topology})
    x = prompt(model)
    free = model.generate(x, max_new_tokens=NEW, eos_token_id=-1)
    eos = free[0, 2].item()
    out = model.generate(x, max_new_tokens=NEW, eos_token_id=eos)
    stop = (free[0] == eos).nonzero()[0].item()
    assert out[0, stop] == eos and (out[0, stop + 1 :] == model.config.pad_token_id).all()
    assert out.shape[1] <= NEW
    if (free[1] != eos).all():
        assert torch.equal(out[1], free[1])
    # without a pad token, the row is filled with EOS
    no_pad = peaky({"topology": topology}, pad_token_id=None)
    out = no_pad.generate(x, max_new_tokens=NEW, eos_token_id=eos)
    assert (out[0, stop:] == eos).all()


def test_generation_stops_when_every_row_is_done():
    model = peaky({"topology": "decoder_only"})
    x = prompt(model, batch=1)
    first = model.generate(x, max_new_tokens=1, eos_token_id=-1)[0, 0].item()
    assert model.generate(x, max_new_tokens=NEW, eos_token_id=first).shape == (1, 1)
    assert model.generate(x, max_new_tokens=NEW, eos_token_id=first, num_beams=2).shape[1] <= NEW


def test_generation_restores_training_mode_and_uses_no_grad():
    model = peaky({"topology": "decoder_only"}).train()
    out = model.generate(prompt(model), max_new_tokens=3)
    assert model.training and not out.requires_grad


def crop_and_recompute(model, x, new, keep, mask=None):
    """The sliding-window rule written out: before each token the model sees tokens[start:], recomputed from
    scratch; a prompt longer than the context starts at its last max_seq_len tokens, and every later overflow moves
    start to keep the last `keep` tokens. Greedy; rows of a padded batch are left-aligned first."""
    window = model.config.max_seq_len
    if mask is not None:
        order = torch.sort(mask.int(), dim=1, stable=True).indices
        x, mask = x.gather(1, order), mask.gather(1, order)
    seq, start, out = x, max(0, x.shape[1] - window), []
    for _ in range(new):
        if seq.shape[1] - start > window:
            start = seq.shape[1] - keep
        m = None if mask is None else mask[:, start:]
        token = model(seq[:, start:], attention_mask=m)[:, -1].argmax(-1)
        out.append(token)
        seq = torch.cat([seq, token[:, None]], dim=1)
        mask = None if mask is None else torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("positions", ["learned", "sinusoidal"])
@pytest.mark.parametrize("keep", [None, 64, 50, 1])
@pytest.mark.parametrize("use_cache", [True, False])
def test_generation_slides_past_the_context_exactly_like_crop_and_recompute(positions, keep, use_cache):
    """3x the context (64): the tokens of every step equal a crop-and-recompute reference. keep=64 is nanoGPT's
    rule (the last max_seq_len tokens before every token); None keeps half a window at each slide."""
    model = peaky({"topology": "decoder_only", "positions": positions})
    x = prompt(model, batch=2, length=5)
    new = 3 * model.config.max_seq_len
    out = model.generate(x, max_new_tokens=new, eos_token_id=-1, window_keep=keep, use_cache=use_cache)
    assert out.shape == (2, new)
    reference = crop_and_recompute(model, x, new, keep or model.config.max_seq_len // 2)
    torch.testing.assert_close(out, reference, rtol=0, atol=0)


def test_sliding_also_holds_for_sampling_single_rows_padded_batches_and_long_prompts():
    model = peaky({"topology": "decoder_only", "positions": "learned"})
    window = model.config.max_seq_len
    # sampling: the cached path and recomputation draw the same tokens from the same generator
    x = prompt(model, batch=1)
    a = model.generate(x, max_new_tokens=150, temperature=1.0, top_k=20, eos_token_id=-1, seed=5)
    b = model.generate(x, max_new_tokens=150, temperature=1.0, top_k=20, eos_token_id=-1, seed=5, use_cache=False)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    # one row takes the column-major weight path, and slides the same
    torch.testing.assert_close(
        model.generate(x, max_new_tokens=150, eos_token_id=-1), crop_and_recompute(model, x, 150, window // 2)
    )
    # a padded batch: each row slides when its own tokens outgrow the context, as it does alone (the batch slid by its
    # padded length, which cut the shorter rows' context: other tokens than alone). Rows 10, 6 and 3 tokens long.
    x = tokens(3, 10, seed=4)
    mask = torch.ones_like(x, dtype=torch.bool)
    mask[1, :4] = False
    mask[2, 5:8] = False
    out = model.generate(x, max_new_tokens=100, eos_token_id=-1, attention_mask=mask)
    for row in range(3):
        alone = x[row : row + 1, mask[row]]
        torch.testing.assert_close(out[row : row + 1], crop_and_recompute(model, alone, 100, window // 2))
        unpadded = model.generate(alone, max_new_tokens=100, eos_token_id=-1)
        torch.testing.assert_close(out[row : row + 1], unpadded, rtol=0, atol=0)
    torch.testing.assert_close(
        out, model.generate(x, max_new_tokens=100, eos_token_id=-1, attention_mask=mask, use_cache=False)
    )
    # a prompt longer than the context: its last max_seq_len tokens
    long = tokens(1, window + 30, seed=6)
    out = model.generate(long, max_new_tokens=40, eos_token_id=-1)
    torch.testing.assert_close(out, crop_and_recompute(model, long, 40, window // 2), rtol=0, atol=0)
    torch.testing.assert_close(out, model.generate(long[:, -window:], max_new_tokens=40, eos_token_id=-1))


def test_beam_search_slides_past_the_context_too():
    model = peaky({"topology": "decoder_only", "positions": "learned"})
    x = prompt(model, batch=2)
    a = model.generate(x, max_new_tokens=100, num_beams=2, eos_token_id=-1)
    b = model.generate(x, max_new_tokens=100, num_beams=2, eos_token_id=-1, use_cache=False)
    assert a.shape == (2, 100)
    torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("positions", ["learned", "sinusoidal"])
def test_an_encoder_decoder_stops_at_its_own_limit_with_a_note(positions):
    model = peaky({"topology": "encoder_decoder", "positions": positions})
    x = prompt(model, batch=1)
    with pytest.warns(UserWarning, match="max_seq_len - 1 = 63"):
        out = model.generate(x, max_new_tokens=100, eos_token_id=-1, max_source_offset=None)
    assert out.shape == (1, model.config.max_seq_len - 1)


def test_the_context_note_comes_only_when_the_context_cuts_a_translation():
    """A translation's defaults (max_new_tokens 200, source length + 50) above a context of 64 warned on every call
    of every CPU translation preset, whatever the sources: only sources whose + 50 bound passes the context do."""
    import warnings

    model = peaky({"topology": "encoder_decoder"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 5 source tokens + 50 fit in the 63 a translation may take
        short = model.generate(tokens(1, 5), max_new_tokens=200, eos_token_id=-1, max_source_offset=50)
    assert short.shape == (1, 55)
    with pytest.warns(UserWarning, match="max_seq_len - 1 = 63"):  # 20 + 50 do not
        long = model.generate(tokens(1, 20), max_new_tokens=200, eos_token_id=-1, max_source_offset=50)
    assert long.shape == (1, 63)


def test_a_translation_is_at_most_its_source_length_plus_the_offset_per_row():
    model = peaky({"topology": "encoder_decoder"})
    x = tokens(2, 6, seed=3)
    mask = torch.ones_like(x, dtype=torch.bool)
    mask[1, 4:] = False  # row 1's source has 4 tokens
    out = model.generate(x, max_new_tokens=30, eos_token_id=-1, max_source_offset=3, attention_mask=mask)
    assert out.shape == (2, 9)
    assert (out[1, 7:] == model.config.pad_token_id).all() and (out[1, :7] != model.config.pad_token_id).all()
    beams = model.generate(x, max_new_tokens=30, eos_token_id=-1, max_source_offset=3, attention_mask=mask, num_beams=2)
    assert beams.shape[1] <= 9 and (beams[1, 7:] == model.config.pad_token_id).all()


def test_repetition_penalty_shrinks_logits_of_seen_tokens():
    from lit_transformer.model.generation import RepetitionPenalty

    tokens_ = torch.tensor([[3, 4, 0]])
    penalty = RepetitionPenalty(2.0, tokens_, torch.tensor([[True, True, False]]), vocab_size=6)
    logits = torch.tensor([[1.0, 1.0, 1.0, 4.0, -4.0, 1.0]])
    assert penalty(logits).tolist() == [[1.0, 1.0, 1.0, 2.0, -8.0, 1.0]]  # padding (id 0) is not "seen"
    penalty.update(torch.tensor([5]))
    assert penalty(logits)[0, 5].item() == 0.5
    assert RepetitionPenalty(1.0, tokens_, None, 6)(logits) is logits


def test_a_high_repetition_penalty_avoids_repeating_tokens():
    model = peaky({"topology": "decoder_only"})
    x = prompt(model, batch=1)
    plain = model.generate(x, max_new_tokens=30, eos_token_id=-1)[0].tolist()
    penalised = model.generate(x, max_new_tokens=30, eos_token_id=-1, repetition_penalty=1e4)[0].tolist()
    seen = x[0].tolist()
    assert len(set(plain)) < len(plain)  # greedy decoding of the peaky model repeats itself
    assert len(set(penalised + seen)) == len(penalised + seen)  # no token twice, prompt included


def test_stop_token_ids_end_rows_like_eos_and_a_streamer_sees_every_step():
    model = peaky({"topology": "decoder_only"})
    x = prompt(model)
    free = model.generate(x, max_new_tokens=NEW, eos_token_id=-1)
    stop = free[0, 3].item()
    out = model.generate(x, max_new_tokens=NEW, eos_token_id=-1, stop_token_ids=[stop])
    first = (free[0] == stop).nonzero()[0].item()
    assert out[0, first] == stop and (out[0, first + 1 :] == model.config.pad_token_id).all()
    seen = []

    def streamer(step_tokens):
        seen.append(step_tokens.clone())
        return torch.tensor([len(seen) == 2, False])  # row 0 ends after its second token

    out = model.generate(x, max_new_tokens=NEW, eos_token_id=-1, streamer=streamer)
    assert torch.equal(torch.stack(seen, 1), out)
    assert torch.equal(out[0, :2], free[0, :2]) and (out[0, 2:] == model.config.pad_token_id).all()
    assert torch.equal(out[1], free[1])
    with pytest.raises(ValueError, match="num_beams=1"):
        model.generate(x, max_new_tokens=NEW, num_beams=2, streamer=streamer)


@pytest.mark.parametrize("num_beams", [1, 2])
def test_without_a_pad_token_or_eos_rows_that_stop_early_are_filled_with_real_ids(num_beams):
    """A model without a pad token (a Hugging Face GPT-2 or Llama folder) decoding with eos_token_id=-1 and a stop
    id or stop string: a row that ends before the others is filled with the model's EOS, not with -1 (which the
    next step fed to the embedding: IndexError, and beam search returned as a token)."""
    model = peaky({"topology": "decoder_only"}, pad_token_id=None)
    x = prompt(model)
    free = model.generate(x, max_new_tokens=NEW, eos_token_id=-1)
    stop = free[0, 1].item()
    assert stop not in free[1].tolist()  # row 1 runs on after row 0 has stopped
    out = model.generate(x, max_new_tokens=NEW, eos_token_id=-1, stop_token_ids=[stop], num_beams=num_beams)
    assert (out >= 0).all()
    first = out[0].tolist().index(stop)
    assert (out[0, first + 1 :] == model.config.eos_token_id).all()
    if num_beams == 1:
        assert out[0, : first + 1].tolist() == free[0, : first + 1].tolist() and torch.equal(out[1], free[1])
    # predict's and serve's rows: the filling is not the row's
    from lit_transformer.config import GenerationConfig
    from lit_transformer.tasks.base import generation_rows

    gen = GenerationConfig(max_new_tokens=NEW, eos_token_id=-1, stop_token_ids=[stop], num_beams=num_beams)
    mask = torch.ones_like(x, dtype=torch.bool)
    rows = generation_rows(model, _numbered_tokenizer(model.config.tgt_vocab_size), gen, x, mask, ["a", "b"])
    assert rows[0]["tokens"] == out[0, : first + 1].tolist()


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
        model.generate(prompt(model), max_new_tokens=3, temperature=-1.0)
    with pytest.raises(ValueError, match="num_beams"):
        model.generate(prompt(model), max_new_tokens=3, num_beams=0)
    with pytest.raises(ValueError, match="window_keep=65 exceeds max_seq_len=64"):
        model.generate(prompt(model), max_new_tokens=3, window_keep=65)
    with pytest.raises(ValueError, match=r"eos_token_id=-2 must be a token id, -1 \(none\) or None"):
        model.generate(prompt(model), max_new_tokens=3, eos_token_id=-2)
    with pytest.raises(ValueError, match=r"stop_token_ids=\[2, -5\] must be token ids"):
        model.generate(prompt(model), max_new_tokens=3, stop_token_ids=[2, -5])
    vocab = model.config.tgt_vocab_size  # an id the model never writes would never stop a row
    with pytest.raises(ValueError, match=rf"\[{vocab}\] are not tokens of this model, whose vocabulary has ids 0 to"):
        model.generate(prompt(model), max_new_tokens=3, stop_token_ids=[vocab])


@variants
def test_single_row_decoding_with_column_major_weights_equals_recomputation(variant):
    """One row and >= 16 new tokens take the column-major weight path; tokens and weights are unchanged by it."""
    model = peaky(variant)
    before = {name: (p.data_ptr(), p.stride()) for name, p in model.named_parameters()}
    x = prompt(model, batch=1)
    cached = model.generate(x, max_new_tokens=20, eos_token_id=-1)
    assert cached.shape == (1, 20)
    torch.testing.assert_close(
        cached, model.generate(x, max_new_tokens=20, eos_token_id=-1, use_cache=False), rtol=0, atol=0
    )
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


# ---- the Transformer paper's decoding rules ---------------------------------------------------------------------


def test_the_gnmt_length_penalty_against_values_written_out():
    from lit_transformer.model.generation import length_penalty

    # ((5 + |Y|) / 6) ** alpha: 1 at |Y| = 1; 2 ** 0.6 at |Y| = 7; 5 ** 0.6 at |Y| = 25.
    assert length_penalty(1, 0.6, "gnmt") == 1.0
    assert length_penalty(7, 0.6, "gnmt") == pytest.approx(1.5157165665103982, rel=1e-12)
    assert length_penalty(25, 0.6, "gnmt") == pytest.approx(2.6265278044037674, rel=1e-12)
    assert length_penalty(13, 1.0, "gnmt") == pytest.approx(3.0)
    # The older form, still the GenerationConfig default: |Y| ** alpha.
    assert length_penalty(4, 0.5, "length") == 2.0 and length_penalty(25, 0.0, "gnmt") == 1.0
    with pytest.raises(ValueError, match="length_penalty_form='wu': use 'length' or 'gnmt'"):
        length_penalty(3, 0.6, "wu")


def test_translation_defaults_are_the_papers_decoding_rules():
    from lit_transformer.config import GenerationConfig, TransformerConfig
    from lit_transformer.tasks import generation_defaults

    gen = generation_defaults(TransformerConfig(topology="encoder_decoder"))
    assert (gen.num_beams, gen.length_penalty, gen.length_penalty_form) == (4, 0.6, "gnmt")
    assert (gen.max_source_offset, gen.early_stopping) == (50, True)
    # Each is overridable; a plain GenerationConfig keeps the old meaning (|Y| ** 1.0, Hugging Face's criterion).
    assert generation_defaults(TransformerConfig(topology="encoder_decoder"), num_beams=1).num_beams == 1
    plain = GenerationConfig()
    assert (plain.length_penalty, plain.length_penalty_form, plain.early_stopping) == (1.0, "length", False)
    with pytest.raises(ValueError, match="length_penalty_form='wu' must be 'length' or 'gnmt'"):
        GenerationConfig(length_penalty_form="wu")


def test_a_finished_beam_set_stops_decoding_early(monkeypatch):
    """Scripted next-token distributions (EOS = 2, tokens a = 5, b = 6) give 2 beams two finished hypotheses after
    step 2, while a live beam, at alpha = 3, still scores better than the worse of them: early_stopping ends the row
    there (2 decoder passes), Hugging Face's criterion decodes on to the limit."""
    model = build({"topology": "encoder_decoder"})
    V, eos, a, b = model.config.vocab_size, 2, 5, 6
    calls = []

    def scripted(tokens, memory, **kwargs):
        calls.append(tokens.shape)
        probs = {eos: 0.5, a: 0.3, b: 0.2} if len(calls) == 1 else {a: 0.45, eos: 0.4, b: 0.15}
        logits = torch.full((tokens.shape[0], 1, V), float("-inf"))
        for token, p in probs.items():
            logits[:, :, token] = torch.tensor(p).log()
        return logits

    monkeypatch.setattr(model, "decode", scripted)
    src = tokens(1, 5, seed=3)
    rules = dict(num_beams=2, length_penalty=3.0, eos_token_id=eos, max_new_tokens=10, max_source_offset=None)
    out = model.generate(src, **rules, early_stopping=True)
    assert len(calls) == 2
    # Hypotheses: [eos] scores log 0.5 / 1; [a, eos] scores (log 0.3 + log 0.4) / 2 ** 3, the better one.
    assert out.tolist() == [[a, eos]]
    calls.clear()
    assert model.generate(src, **rules, early_stopping=False).shape[1] == 10
    assert len(calls) == 10


def test_kv_cache_reorder_selects_rows_of_the_filled_positions():
    """Beam search's reorder gathers only the filled positions into a second buffer, swapping the two: the cache
    then reads exactly as a plain row selection of everything appended, step after step."""
    from lit_transformer.model.attention import KVCache

    cache, reference = KVCache(max_len=6), None
    generator = torch.Generator().manual_seed(0)
    for step in range(5):
        new = 2 if step == 0 else 1  # a prompt, then one token a step
        k, v = (torch.randn(4, 2, new, 3, generator=generator) for _ in range(2))
        got_k, got_v = cache.append(k, v)
        reference = (
            (k, v) if reference is None else tuple(torch.cat([r, n], 2) for r, n in zip(reference, (k, v), strict=True))
        )
        assert torch.equal(got_k, reference[0]) and torch.equal(got_v, reference[1])
        rows = torch.randint(0, 4, (4,), generator=generator)
        cache.reorder(rows)
        reference = tuple(r.index_select(0, rows) for r in reference)
        assert torch.equal(cache.k[:, :, : cache.length], reference[0])
        assert torch.equal(cache.v[:, :, : cache.length], reference[1])


@pytest.mark.parametrize("num_beams", [1, 3])
def test_predict_rows_hold_each_row_s_own_tokens_not_the_batch_s_padding(num_beams):
    """A translation row ends at its source length + max_source_offset; rows of a batch whose sources differ end at
    different steps, and a row that ended is filled with pad to the batch's longest. `predict` wrote that filling
    into the row's "tokens" (…, 98, 0, 0, 0, … for an empty source beside longer ones)."""
    from lit_transformer.config import GenerationConfig
    from lit_transformer.tasks.base import generation_rows

    model = peaky({"topology": "encoder_decoder"})
    tokenizer = _numbered_tokenizer(model.config.tgt_vocab_size)
    pad = model.config.pad_token_id
    src = torch.full((2, 6), pad, dtype=torch.long)
    src[0, :6], src[1, :2] = tokens(1, 6)[0], tokens(1, 2)[0]
    mask = src != pad
    generation = GenerationConfig(max_new_tokens=20, max_source_offset=3, eos_token_id=-1, num_beams=num_beams)
    rows = generation_rows(model, tokenizer, generation, src, mask, ["long", "short"])
    assert [len(row["tokens"]) for row in rows] == [6 + 3, 2 + 3]  # each row's own limit, no pad after it
    assert all(pad not in row["tokens"][-1:] for row in rows)


@pytest.mark.parametrize("num_beams", [1, 3])
def test_a_blank_source_translates_to_a_blank_row_beside_others_and_a_blank_prompt_is_still_continued(num_beams):
    """A blank line of `translate --input` (or --text '', a predict row, a served request) decoded to max_new_tokens
    of noise: training drops pairs with an empty side, so the model never saw one. Its row is blank, the other rows
    of the batch unchanged; a language model's blank prompt is a sample from nothing and is still continued."""
    from lit_transformer.config import GenerationConfig
    from lit_transformer.tasks.base import generation_rows

    model = peaky({"topology": "encoder_decoder"})
    tokenizer = _numbered_tokenizer(model.config.tgt_vocab_size)
    pad = model.config.pad_token_id
    src = torch.full((2, 4), pad, dtype=torch.long)
    src[0], src[1, :1] = tokens(1, 4)[0], model.config.eos_token_id
    generation = GenerationConfig(max_new_tokens=5, eos_token_id=-1, num_beams=num_beams)
    alone = generation_rows(model, tokenizer, generation, src[:1], src[:1] != pad, ["t4 t5"])
    rows = generation_rows(model, tokenizer, generation, src, src != pad, ["t4 t5", " "])
    assert rows[1] == {"input": " ", "output": "", "tokens": []}
    assert rows[0] == alone[0] and alone[0]["tokens"]

    lm = peaky({})
    prompt = tokens(1, 1)
    (row,) = generation_rows(lm, _numbered_tokenizer(lm.config.vocab_size), generation, prompt, prompt >= 0, [""])
    assert len(row["tokens"]) == 5


def _numbered_tokenizer(vocab: int):
    """A word-level tokenizer whose ids are the model's: the special tokens, then t4, t5, ..."""
    from tokenizers import Tokenizer, models

    from lit_transformer.data.text import SPECIAL_TOKENS

    names = [*SPECIAL_TOKENS, *(f"t{i}" for i in range(len(SPECIAL_TOKENS), vocab))]
    return Tokenizer(models.WordLevel({name: i for i, name in enumerate(names)}, unk_token="<unk>"))


@pytest.mark.parametrize("num_beams", [1, 3])
def test_a_row_s_text_ends_at_the_generation_s_eos_token_id(num_beams):
    """The text of predict's and serve's rows ended at the model's EOS whatever the GenerationConfig said: with
    eos_token_id set to a token decoding writes, the row ends there (the tokens before it kept); with -1 no token
    ends it, and it runs to max_new_tokens."""
    from lit_transformer.config import GenerationConfig
    from lit_transformer.tasks.base import generation_rows, text_stop_ids

    model = peaky({"topology": "decoder_only"})
    tokenizer, x = _numbered_tokenizer(model.config.tgt_vocab_size), prompt(model, batch=1)
    mask = torch.ones_like(x, dtype=torch.bool)
    free = GenerationConfig(max_new_tokens=6, eos_token_id=-1, num_beams=num_beams)
    (row,) = generation_rows(model, tokenizer, free, x, mask, ["p"])
    assert len(row["tokens"]) == 6 and text_stop_ids(model.config, free) == []
    tokens = row["tokens"]
    k = next(i for i in range(1, 6) if tokens[i] not in tokens[:i])  # a token not written before it
    ended = free.replace(eos_token_id=tokens[k])
    (row_ended,) = generation_rows(model, tokenizer, ended, x, mask, ["p"])
    assert text_stop_ids(model.config, ended) == [tokens[k]] and tokens[k] not in row_ended["tokens"]
    if num_beams == 1:  # greedy writes the same tokens up to the new EOS (beams search otherwise once it may end)
        assert row_ended["tokens"] == tokens[:k]


@pytest.mark.parametrize("topology", ["decoder_only", "encoder_decoder"])
def test_inputs_that_cannot_be_decoded_are_refused_in_one_line_naming_the_fix(topology):
    """Before, an id past the vocabulary failed in torch's embedding ("index out of range in self"), a 1-D prompt in
    an IndexError of the decoder, a list or a string in an AttributeError, and a mask of another shape than the
    prompt's decoded silently."""
    from lit_transformer.config import TransformerConfig
    from lit_transformer.errors import ConfigError
    from lit_transformer.model import Transformer

    model = Transformer(TransformerConfig.preset("tiny", topology=topology, bos_token_id=1, eos_token_id=2))
    vocab = model.config.vocab_size
    ok = torch.tensor([[3, 4, 5]])
    with pytest.raises(ConfigError, match=rf"ids from 3 to {vocab}, but .* ids 0 to {vocab - 1}"):
        model.generate(torch.tensor([[3, 4, vocab]]), max_new_tokens=2)
    with pytest.raises(ConfigError, match="ids from -1 to 4"):
        model.generate(torch.tensor([[-1, 4]]), max_new_tokens=2)
    with pytest.raises(TypeError, match=r"\(B, T\) tensor of integer token ids; got shape \(3,\)"):
        model.generate(ok[0], max_new_tokens=2)
    with pytest.raises(TypeError, match="of torch.float32"):
        model.generate(ok.float(), max_new_tokens=2)
    with pytest.raises(TypeError, match="torch.Tensor of token ids, shape \\(B, T\\), not list"):
        model.generate(ok.tolist(), max_new_tokens=2)
    with pytest.raises(ConfigError, match="holds no token"):
        model.generate(ok[:, :0], max_new_tokens=2)
    with pytest.raises(ConfigError, match=r"attention_mask has shape \(1, 4\) but input_ids \(1, 3\)"):
        model.generate(ok, max_new_tokens=2, attention_mask=torch.ones(1, 4, dtype=torch.bool))
    assert model.generate(ok, max_new_tokens=2, attention_mask=torch.ones_like(ok)).shape[0] == 1


def test_translate_and_batch_take_a_list_of_texts_not_one_string():
    """Before, a string was read as its characters: translate(loaded, "In the beginning", gen) translated 16 one-letter
    sources without a word; an empty list failed in max()."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from lit_transformer.config import GenerationConfig, TransformerConfig
    from lit_transformer.inference import LoadedModel, translate
    from lit_transformer.model import Transformer

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{c: i + 4 for i, c in enumerate("abcdefgh")}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    config = TransformerConfig.preset("tiny", topology="encoder_decoder", vocab_size=len(vocab), bos_token_id=1,
                                      eos_token_id=2)  # fmt: skip
    loaded = LoadedModel(Transformer(config).eval(), tokenizer, tokenizer)
    gen = GenerationConfig(max_new_tokens=3)
    assert len(translate(loaded, ["a b", "c"], gen)) == 2
    assert translate(loaded, [], gen) == []
    with pytest.raises(TypeError, match=r"a list of strings, not one string: write \['a b c'\] for one input"):
        translate(loaded, "a b c", gen)
    with pytest.raises(TypeError, match="a list of strings, not one string"):
        loaded.batch("a b c")
    with pytest.raises(TypeError, match="texts must be strings; got int"):
        translate(loaded, [5], gen)
    # no GenerationConfig: the task's decoding defaults, as the commands' unset flags (it was an AttributeError)
    assert translate(loaded, ["a b"], None) == translate(loaded, ["a b"], GenerationConfig.for_task(loaded.task))
    assert len(translate(loaded, (text for text in ["a b", "c"]), gen)) == 2  # a generator is read once, not used up
