"""The vectorised beam search against a plain reference written here: Python loops over candidates, one row at a
time, the model's full forward pass at every step (no cache, no batching, no masks).

Both follow the same rules: each step keeps the num_beams best continuations that do not end in a stop id (EOS, or
any of stop_token_ids); a stop among the num_beams best candidates makes a hypothesis scored log p / lp(length)
(length ** alpha, or GNMT's ((5 + length) / 6) ** alpha); a row stops once it holds num_beams hypotheses and (unless
early stopping) its best live beam, normalised at the current length, cannot beat the worst; at the step limit the
live beams compete too, also with hypotheses that finish at that very step. docs/performance.md's "identical to the loop version" claim is this test.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from model_variants import build, single_thread, tokens  # noqa: F401 (autouse fixture)

from lit_transformer.model import Transformer

NEW = 7


def next_log_probs(model: Transformer, source: torch.Tensor, prefix: list[int]) -> list[float]:
    """log p(next token | source, prefix) by the plain forward pass over the whole sequence."""
    if model.config.is_encoder_decoder:
        logits = model(source, torch.tensor([[model.config.bos_token_id, *prefix]]))
    else:
        logits = model(torch.cat([source, torch.tensor([prefix], dtype=torch.long)], dim=1))
    return logits[0, -1].float().log_softmax(-1).tolist()


def reference_beam_search(
    model: Transformer,
    source: torch.Tensor,
    max_new: int,
    beams: int,
    length_penalty: float,
    eos: int | None,
    form: str = "length",
    early_stopping: bool = False,
    stop_token_ids: tuple[int, ...] = (),
) -> list[int]:
    """One row (1, S); returns the best hypothesis's tokens (ending in a stop id unless it ran out of steps)."""
    stops = {eos, *stop_token_ids}

    def lp(length: int) -> float:  # written out here, not imported: the reference must not share the code it checks
        return ((5 + length) / 6) ** length_penalty if form == "gnmt" else length**length_penalty

    live: list[tuple[float, list[int]]] = [(0.0, [])]
    hypotheses: list[tuple[float, list[int]]] = []  # best first; ties keep the earlier one first

    def add(score: float, tokens: list[int]) -> None:
        hypotheses.append((score, tokens))
        hypotheses.sort(key=lambda h: -h[0])
        del hypotheses[beams:]

    for step in range(max_new):
        length = step + 1
        candidates = []
        for score, prefix in live:
            for token, log_p in enumerate(next_log_probs(model, source, prefix)):
                candidates.append((score + log_p, prefix + [token]))
        candidates.sort(key=lambda c: -c[0])
        live = []
        for rank, (score, sequence) in enumerate(candidates):  # however many stops come first
            if sequence[-1] in stops:
                if rank < beams:
                    add(score / lp(length), sequence)
            elif len(live) < beams:
                live.append((score, sequence))
            if rank >= beams and len(live) == beams:
                break
        if length == max_new:
            break
        if len(hypotheses) == beams and (early_stopping or hypotheses[-1][0] >= live[0][0] / lp(length)):
            return hypotheses[0][1]
    for score, sequence in live:
        add(score / lp(max_new), sequence)
    return hypotheses[0][1]


CASES = [
    (*case, "length", False)
    for case in itertools.product(["decoder_only", "encoder_decoder"], [2, 3, 4], [0.6, 1.0, 1.2], ["none", "frequent"])
]
# The paper's rules: GNMT's length penalty, with and without stopping as soon as num_beams hypotheses have finished.
CASES += [
    (topology, beams, 0.6, "frequent", "gnmt", early)
    for topology, beams, early in itertools.product(["decoder_only", "encoder_decoder"], [2, 4], [False, True])
]


@pytest.mark.parametrize(("topology", "beams", "length_penalty", "eos_kind", "form", "early_stopping"), CASES)
def test_vectorised_beam_search_equals_the_reference_loop(
    topology, beams, length_penalty, eos_kind, form, early_stopping
):
    rules = dict(form=form, early_stopping=early_stopping)
    # Large weights give peaked distributions: no near-ties that rounding could order differently.
    model = build({"topology": topology}, init_std=0.3)
    sources = tokens(3, 5, seed=11)
    eos = -1
    if eos_kind == "frequent":  # the first of greedy decoding's tokens that ends some row's best hypothesis early
        greedy = model.generate(sources, max_new_tokens=NEW, eos_token_id=-1).T.flatten().tolist()
        eos = next(
            t
            for t in dict.fromkeys(greedy)
            if any(
                reference_beam_search(model, s[None], NEW, beams, length_penalty, t, **rules)[-1] == t for s in sources
            )
        )
    out = model.generate(
        sources,
        max_new_tokens=NEW,
        num_beams=beams,
        length_penalty=length_penalty,
        eos_token_id=eos,
        length_penalty_form=form,
        early_stopping=early_stopping,
    )
    fill = model.config.pad_token_id
    ended = 0
    for row in range(3):
        expected = reference_beam_search(model, sources[row : row + 1], NEW, beams, length_penalty, eos, **rules)
        got = out[row].tolist()
        assert got[: len(expected)] == expected, (row, got, expected)
        assert all(t == fill for t in got[len(expected) :])
        ended += expected[-1] == eos
    if eos_kind == "frequent":
        assert ended > 0  # the case exercises hypotheses that end in EOS


def _first_token_logits(model: Transformer, sources: torch.Tensor) -> torch.Tensor:
    if model.config.is_encoder_decoder:
        return model(sources, torch.full((len(sources), 1), model.config.bos_token_id))[:, -1]
    return model(sources)[:, -1]


@pytest.mark.parametrize("topology", ["decoder_only", "encoder_decoder"])
@pytest.mark.parametrize("beams", [2, 3])
def test_a_beam_that_ends_at_a_stop_id_is_never_continued(topology, beams):
    """Several stop ids can fill more than num_beams of the 2 * num_beams best candidates: the live beams are still
    the num_beams best candidates that end in no stop id (a stop candidate kept as a live beam ran on past its stop)."""
    model = build({"topology": topology}, init_std=0.3)
    sources = tokens(3, 5, seed=11)
    with torch.no_grad():
        first = _first_token_logits(model, sources)
    for row in range(3):
        # The 2nd to (2 * beams)-th likeliest first tokens stop: the best candidates of step 1 are nearly all stops.
        stops = first[row].topk(2 * beams).indices[1:].tolist()
        source = sources[row : row + 1]
        got = model.generate(source, max_new_tokens=NEW, num_beams=beams, eos_token_id=-1, stop_token_ids=stops)
        expected = reference_beam_search(model, source, NEW, beams, 1.0, -1, stop_token_ids=tuple(stops))
        assert got[0].tolist()[: len(expected)] == expected, (row, stops)
        assert not set(got[0].tolist()[: len(expected) - 1]) & set(stops), "a beam ran on past a stop id"


@pytest.mark.parametrize("topology", ["decoder_only", "encoder_decoder"])
def test_live_beams_at_the_limit_compete_with_the_hypotheses_that_finish_there(topology):
    """With early stopping, the num_beams-th hypothesis can finish at the very step the row reaches its length
    limit: the live beams, complete at that length too, still compete (the best of them can score higher)."""
    model = build({"topology": topology}, init_std=0.3)
    sources = tokens(3, 5, seed=11)
    greedy = model.generate(sources, max_new_tokens=NEW, eos_token_id=-1).T.flatten().tolist()
    for beams, new, eos in itertools.product([2, 3, 4], range(2, 6), list(dict.fromkeys(greedy))[:6]):
        out = model.generate(sources, max_new_tokens=new, num_beams=beams, eos_token_id=eos, early_stopping=True)
        for row in range(3):
            expected = reference_beam_search(model, sources[row : row + 1], new, beams, 1.0, eos, early_stopping=True)
            assert out[row].tolist()[: len(expected)] == expected, (beams, new, eos, row)
