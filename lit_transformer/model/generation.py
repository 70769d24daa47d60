"""Decoding: greedy, temperature / top-k / top-p sampling, beam search with a length penalty. All use the KV cache.

Decoder-only prompts may be padded on either side with pad_token_id (or described by attention_mask): rows are
left-aligned internally, and position ids count real tokens only, so each row gives exactly what it gives alone.
Encoder-decoder inputs are sources; decoding starts from bos_token_id.
The result holds only new tokens, (B, <= max_new_tokens): after a row's EOS (included) the row is filled with
pad_token_id (eos_token_id when there is no pad token).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from lit_transformer.model.transformer import Transformer


class IncrementalDecoder:
    """The model's next-token logits for a batch of growing sequences, with a KV cache or (use_cache=False, to test the
    cache) by recomputing everything each step. Rows may be expanded `expand` times (beams)."""

    def __init__(
        self,
        model: Transformer,
        input_ids: Tensor,
        attention_mask: Tensor | None,
        max_new_tokens: int,
        expand: int = 1,
        use_cache: bool = True,
    ) -> None:
        cfg = model.config
        self.model = model
        self.memory = self.memory_mask = None
        if cfg.is_encoder_decoder:
            if cfg.bos_token_id is None:
                raise ValueError("encoder_decoder generation starts from bos_token_id; set it in the config")
            src_keep = model.key_mask(input_ids, attention_mask)
            self.memory = model.encode(input_ids, src_keep).repeat_interleave(expand, 0)
            if src_keep is not None:
                self.memory_mask = src_keep.repeat_interleave(expand, 0)
            tokens = input_ids.new_full((input_ids.shape[0] * expand, 1), cfg.bos_token_id)
            keep = None
        else:
            keep = model.key_mask(input_ids, attention_mask)
            tokens = input_ids
            if keep is not None:  # left-align: padding first, then each row's tokens in order
                order = torch.sort(keep.int(), dim=1, stable=True).indices
                tokens, keep = tokens.gather(1, order), keep.gather(1, order)
                keep = keep.repeat_interleave(expand, 0)
            tokens = tokens.repeat_interleave(expand, 0)
        self.tokens, self.keep = tokens, keep
        self.cache = model.new_cache(tokens.shape[1] + max_new_tokens) if use_cache else None
        self.logits = self._run(tokens)

    def _run(self, new_tokens: Tensor) -> Tensor:
        if self.cache is None:
            new_tokens = self.tokens
        logits = self.model.decode(
            new_tokens, self.memory, tgt_mask=self.keep, memory_mask=self.memory_mask, cache=self.cache, last_only=True
        )
        return logits[:, -1].float()

    def step(self, next_tokens: Tensor, rows: Tensor | None = None) -> Tensor:
        """Append next_tokens (N,) to the sequences, first selecting `rows` (beam search); next logits (N, V)."""
        if rows is not None:
            if self.cache is None:
                self.tokens = self.tokens.index_select(0, rows)
            if self.keep is not None:
                self.keep = self.keep.index_select(0, rows)
            for layer in self.cache or []:
                layer.self_attn.reorder(rows)  # cross-attention K/V are identical across a row's beams
        if self.cache is None:  # only recomputation reads the whole sequence
            self.tokens = torch.cat([self.tokens, next_tokens[:, None]], dim=1)
        if self.keep is not None:
            self.keep = torch.cat([self.keep, self.keep.new_ones(len(next_tokens), 1)], dim=1)
        self.logits = self._run(next_tokens[:, None])
        return self.logits


@contextmanager
def vector_friendly_weights(model: Transformer, enabled: bool = True) -> Iterator[None]:
    """Within the block, the decoder's Linear weights (out, in) live in column-major memory, values unchanged.

    Decoding one row, every step is a matrix-vector product per weight, bound by memory bandwidth. On a CPU, BLAS
    streams a weight stored as (in, out) rows about twice as fast as the row-major (out, in) one F.linear gets
    (measured in docs/performance.md, "Greedy generation"). The copy (one pass over the weights) is paid once per generate call;
    the original tensors are put back on exit. GPUs and batches are left alone: there the layout does not help.
    """
    if not enabled or model.lm_head.weight.device.type != "cpu":
        yield
        return
    weights = {}
    for module in [*model.decoder_blocks.modules(), model.lm_head]:
        if isinstance(module, nn.Linear):
            weights[id(module.weight)] = module.weight
    originals = [(w, w.data) for w in weights.values()]
    try:
        for w, data in originals:
            w.data = data.t().contiguous().t()
        yield
    finally:
        for w, data in originals:
            w.data = data


def filter_logits(logits: Tensor, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """Keep the top_k most likely tokens and the smallest set whose probability reaches top_p; -inf elsewhere."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        drop = probs.cumsum(dim=-1) - probs >= top_p  # the mass before a token already reaches top_p; never the first
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


def next_token(
    logits: Tensor, temperature: float, top_k: int | None, top_p: float | None, generator: torch.Generator | None
) -> Tensor:
    """(N, V) -> (N,): argmax at temperature 0, else a sample from the filtered, tempered distribution."""
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    probs = filter_logits(logits / temperature, top_k, top_p).softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate(
    model: Transformer,
    input_ids: Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    num_beams: int = 1,
    length_penalty: float = 1.0,
    eos_token_id: int | None = None,
    attention_mask: Tensor | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
) -> Tensor:
    """New tokens (B, <= max_new_tokens), LongTensor.

    temperature 0: greedy; > 0: sampling, optionally restricted by top_k / top_p; num_beams > 1: beam search, scores
    divided by length ** length_penalty. eos_token_id defaults to the config's. use_cache=False recomputes the whole
    sequence every step (slow; to test the cache). The model runs in eval mode and is restored afterwards.
    """
    cfg = model.config
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0 (0 is greedy)")
    if num_beams < 1:
        raise ValueError(f"num_beams={num_beams} must be >= 1")
    if max_new_tokens < 1:
        return input_ids.new_empty(input_ids.shape[0], 0)
    eos = cfg.eos_token_id if eos_token_id is None else eos_token_id
    fill = cfg.pad_token_id if cfg.pad_token_id is not None else eos
    was_training = model.training
    model.eval()
    try:
        if num_beams > 1:
            return beam_search(
                model, input_ids, max_new_tokens, num_beams, length_penalty, eos, fill, attention_mask, use_cache
            )
        single_row = input_ids.shape[0] == 1 and use_cache
        with vector_friendly_weights(model, enabled=single_row and max_new_tokens >= 16):
            decoder = IncrementalDecoder(model, input_ids, attention_mask, max_new_tokens, use_cache=use_cache)
            finished = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
            out = []
            logits = decoder.logits
            for i in range(max_new_tokens):
                token = next_token(logits, temperature, top_k, top_p, generator)
                if fill is not None:
                    token = token.masked_fill(finished, fill)
                out.append(token)
                if eos is not None:
                    finished |= token == eos
                if i == max_new_tokens - 1 or bool(finished.all()):
                    break
                logits = decoder.step(token)
            return torch.stack(out, dim=1)
    finally:
        model.train(was_training)


@torch.no_grad()
def beam_search(
    model: Transformer,
    input_ids: Tensor,
    max_new_tokens: int,
    num_beams: int,
    length_penalty: float = 1.0,
    eos: int | None = None,
    fill: int | None = None,
    attention_mask: Tensor | None = None,
    use_cache: bool = True,
) -> Tensor:
    """Beam search: each step keeps the num_beams best live continuations per row; a beam that emits EOS becomes a
    hypothesis scored log p / length ** length_penalty. A row is done when it holds num_beams hypotheses and its best
    live beam, normalised at the current length, cannot beat the worst of them (Hugging Face's default criterion).
    One beam equals greedy decoding."""
    B, K = input_ids.shape[0], num_beams
    fill = 0 if fill is None else fill
    device = input_ids.device
    decoder = IncrementalDecoder(model, input_ids, attention_mask, max_new_tokens, expand=K, use_cache=use_cache)
    V = decoder.logits.shape[-1]
    scores = torch.zeros(B, K, device=device)
    scores[:, 1:] = float("-inf")  # all beams start identical: expand only the first
    first_row = torch.arange(B, device=device)[:, None] * K  # (B, 1): row of each batch entry's first beam
    generated = input_ids.new_empty(B * K, 0)
    hypotheses: list[list[tuple[float, Tensor]]] = [[] for _ in range(B)]
    # The worst kept hypothesis score of each row once it holds K of them (NaN before: compares False).
    worst = torch.full((B,), float("nan"), device=device)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    logits = decoder.logits
    for step in range(max_new_tokens):
        length = step + 1
        candidates = (scores[..., None] + logits.log_softmax(dim=-1).view(B, K, V)).view(B, K * V)
        top_scores, top_ids = candidates.topk(2 * K, dim=1)  # enough that K live beams survive any EOS among them
        top_beams, top_tokens = top_ids // V, top_ids % V
        is_eos = top_tokens == eos if eos is not None else torch.zeros_like(top_tokens, dtype=torch.bool)
        # EOS among the K best ends a hypothesis (rare: a short Python loop over those only).
        ends = (is_eos[:, :K] & ~done[:, None]).nonzero().tolist()
        for b, rank in ends:
            history = torch.cat([generated[b * K + top_beams[b, rank]], generated.new_tensor([eos])])
            _add_hypothesis(hypotheses[b], top_scores[b, rank].item() / length**length_penalty, history, K)
            if len(hypotheses[b]) == K:
                worst[b] = hypotheses[b][-1][0]
        # The K best non-EOS candidates live on, in rank order (a stable sort moves EOS candidates last).
        live = is_eos.int().sort(dim=1, stable=True).indices[:, :K]
        rows = first_row + top_beams.gather(1, live)
        tokens = top_tokens.gather(1, live)
        scores = top_scores.gather(1, live)
        # Finished rows keep their beams in place, emit padding and score -inf.
        rows = torch.where(done[:, None], first_row + torch.arange(K, device=device), rows)
        tokens = tokens.masked_fill(done[:, None], fill)
        scores = scores.masked_fill(done[:, None], float("-inf"))
        done |= worst >= scores[:, 0] / length**length_penalty
        generated = torch.cat([generated.index_select(0, rows.view(-1)), tokens.view(-1, 1)], dim=1)
        if bool(done.all()) or step == max_new_tokens - 1:
            break
        logits = decoder.step(tokens.view(-1), rows.view(-1))
    for b in (~done).nonzero().view(-1).tolist():  # rows that ran out of steps: their live beams compete too
        for k in range(K):
            score = scores[b, k].item()
            if score > float("-inf"):
                _add_hypothesis(hypotheses[b], score / max_new_tokens**length_penalty, generated[b * K + k], K)
    best = [hypotheses[b][0][1] for b in range(B)]
    out = torch.full((B, max(len(h) for h in best)), fill, dtype=torch.long, device=device)
    for b, h in enumerate(best):
        out[b, : len(h)] = h
    return out


def _add_hypothesis(hypotheses: list[tuple[float, Tensor]], score: float, tokens: Tensor, k: int) -> None:
    """Keep the k best (score, tokens), sorted best first."""
    hypotheses.append((score, tokens))
    hypotheses.sort(key=lambda h: h[0], reverse=True)
    del hypotheses[k:]
