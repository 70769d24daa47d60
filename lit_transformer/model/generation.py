"""Decoding: greedy, temperature / top-k / top-p sampling, beam search with a length penalty. All use the KV cache.

What to decode is a GenerationConfig (lit_transformer.config): the one home of every decoding default.
Decoder-only prompts may be padded on either side, as an attention_mask says (True for real tokens): rows are
left-aligned internally, and position ids count real tokens only, so each row gives exactly what it gives alone.
A sequence longer than max_seq_len slides: the model conditions on its last tokens (GenerationConfig.window_keep
says how the KV cache is refilled). Encoder-decoder inputs are sources; decoding starts from bos_token_id, and a
translation is at most max_seq_len - 1 tokens long (the decoder's own limit).
The result holds only new tokens, (B, <= max_new_tokens): after a row's EOS (included) the row is filled with
pad_token_id (eos_token_id when there is no pad token).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from lit_transformer.config import GenerationConfig, TransformerConfig
from lit_transformer.errors import ConfigError

if TYPE_CHECKING:
    from lit_transformer.model.transformer import Transformer

Streamer = Callable[[Tensor], "Tensor | None"]
"""Called with each step's new tokens (B,) as they are chosen; may return a (B,) boolean tensor of rows that end
there (stop strings are found this way, on text)."""


class IncrementalDecoder:
    """The model's next-token logits for a batch of growing sequences, with a KV cache or (use_cache=False, to test the
    cache) by recomputing the window each step. Rows may be expanded `expand` times (beams).

    Decoder-only sequences slide past max_seq_len: before each token the model sees tokens[start:], where start
    moves only when the window overflows, to keep the last `window_keep` tokens; with the cache, that is one pass
    over window_keep tokens per (max_seq_len - window_keep) new tokens. Recomputation follows the same rule, so the
    two give the same tokens. In a padded batch each row slides when its own tokens outgrow the window (_slide); the
    cache of the whole batch is then refilled, which may change the last digits of the other rows' logits.

    Where the model runs is four methods (_encode, _new_cache, _reorder_cache, _run): a subclass drives an exported
    graph with the same windows, padding and beam bookkeeping (lit_transformer.interop.onnx). `passes` holds the
    encode and decode functions _encode and _run call: the model's own, or compiled ones (CompiledDecoder).
    """

    passes: object = None

    def __init__(
        self,
        model: Transformer,
        input_ids: Tensor,
        attention_mask: Tensor | None,
        max_new_tokens: int,
        expand: int = 1,
        use_cache: bool = True,
        window_keep: int | None = None,
    ) -> None:
        cfg = model.config
        self.model = model
        if self.passes is None:
            self.passes = model
        self.memory = self.memory_mask = None
        self.window = cfg.max_seq_len
        self.window_keep = min(window_keep or max(1, self.window // 2), self.window)
        if cfg.is_encoder_decoder:
            if cfg.bos_token_id is None:
                raise ConfigError("encoder_decoder generation starts from bos_token_id; set it in the config")
            src_keep = model.drop_if_unpadded(attention_mask)
            self.memory = self._encode(input_ids, src_keep, expand)
            if src_keep is not None:
                self.memory_mask = src_keep.repeat_interleave(expand, 0)
            # The source may be ids, features or images: the decoder's tokens are ids whatever it is.
            tokens = torch.full((input_ids.shape[0] * expand, 1), cfg.bos_token_id, device=input_ids.device)
            keep = None
        else:
            keep = model.drop_if_unpadded(attention_mask)
            tokens = input_ids
            if keep is not None:  # left-align: padding first, then each row's tokens in order
                order = torch.sort(keep.int(), dim=1, stable=True).indices
                tokens, keep = tokens.gather(1, order), keep.gather(1, order)
                keep = keep.repeat_interleave(expand, 0)
            tokens = tokens.repeat_interleave(expand, 0)
            if tokens.shape[1] > self.window:  # a prompt longer than the context: its last max_seq_len tokens
                tokens, keep = self._crop(tokens, keep, self.window)
        self.tokens, self.keep = tokens, keep  # the window the model sees
        self.use_cache = use_cache
        cache_len = self.window if not cfg.is_encoder_decoder else tokens.shape[1] + max_new_tokens
        self.cache = self._new_cache(cache_len) if use_cache else None
        self.logits = self._run(tokens)

    def _encode(self, input_ids: Tensor, src_keep: Tensor | None, expand: int) -> Tensor:
        """The encoder's memory, each row repeated `expand` times (beams)."""
        return self.passes.encode(input_ids, src_keep).repeat_interleave(expand, 0)

    def _new_cache(self, max_len: int) -> list:
        return self.model.new_cache(max_len)

    def _reorder_cache(self, rows: Tensor) -> None:
        for layer in self.cache or []:
            layer.self_attn.reorder(rows)  # cross-attention K/V are identical across a row's beams

    @staticmethod
    def _crop(tokens: Tensor, keep: Tensor | None, n: int) -> tuple[Tensor, Tensor | None]:
        return tokens[:, -n:], None if keep is None else keep[:, -n:]

    def _slide(self, tokens: Tensor, keep: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """The window after a row outgrew max_seq_len: each such row keeps its last window_keep tokens, as it would
        alone, and a shorter row of the batch keeps all of its own (its padding makes the batch as wide as the
        longest row, not its context: cropping every row to window_keep cut a short row's context). Dropped tokens
        become padding on the left, where each row's padding is; the columns that are padding in every row go."""
        if keep is None:  # no padding: every row is as long as the window
            return self._crop(tokens, keep, self.window_keep)
        later = keep.flip(1).cumsum(1).flip(1)  # real tokens from each position to the row's end
        outgrown = keep.sum(1, keepdim=True) > self.window
        keep = keep & ~(outgrown & (later > self.window_keep))
        return self._crop(tokens, keep, int(keep.sum(1).max()))

    def _run(self, new_tokens: Tensor) -> Tensor:
        if self.cache is None:
            new_tokens = self.tokens
        logits = self.passes.decode(
            new_tokens, self.memory, tgt_mask=self.keep, memory_mask=self.memory_mask, cache=self.cache, last_only=True
        )
        return logits[:, -1].float()

    def step(self, next_tokens: Tensor, rows: Tensor | None = None) -> Tensor:
        """Append next_tokens (N,) to the sequences, first selecting `rows` (beam search); next logits (N, V)."""
        if rows is not None:
            self.tokens = self.tokens.index_select(0, rows)
            if self.keep is not None:
                self.keep = self.keep.index_select(0, rows)
            self._reorder_cache(rows)
        self.tokens = torch.cat([self.tokens, next_tokens[:, None]], dim=1)
        if self.keep is not None:
            self.keep = torch.cat([self.keep, self.keep.new_ones(len(next_tokens), 1)], dim=1)
        if self.memory is None and self.tokens.shape[1] > self.window:  # slide: keep the window's last tokens
            self.tokens, self.keep = self._slide(self.tokens, self.keep)
            if self.cache is not None:  # refill the cache from the kept tokens, once
                self.cache = self._new_cache(self.window)
                self.logits = self._run(self.tokens)
                return self.logits
        self.logits = self._run(next_tokens[:, None])
        return self.logits


@runtime_checkable
class CompileReady(Protocol):
    """A layer that must make something before torch.compile traces its forward (quantization.Int8Linear: plain
    copies of its packed int8 weights); CompiledPasses calls it on every such layer of the model."""

    def compile_ready(self) -> None: ...


class CompiledPasses:
    """A model's encode and decode run through torch.compile (GenerationConfig.compile), inductor's default mode.

    The unbound Transformer.encode / Transformer.decode are compiled once per process and take the model as their
    first argument, so no compiled function holds a model alive. Shapes start static and a dimension that changes
    (the cache's length after the first step, then the batch or the source length) is recompiled once as dynamic:
    static sizes elsewhere give the fastest kernels (measured once, on a step of the translation preset's model
    both ways). A decoding's distinct graphs (the first pass, later steps, padding or
    not) and several models in one process need more than dynamo's default of 8 graphs per function, so the limit
    is raised to COMPILED_GRAPHS; past it dynamo runs the function eagerly, with the same results. A layer with a
    compilable form of its own (the int8 Linear of lit_transformer.transforms.int8) says so with a `compile_ready()`
    method (`CompileReady`), called here before the first compiled pass: decoding knows no layer class.
    """

    _functions: dict[tuple[type, str, bool | None], Callable] = {}

    def __init__(self, model: Transformer, dynamic: bool | None = None) -> None:
        """dynamic: torch.compile's; None (automatic, as above) is what compile=True uses."""
        for module in model.modules():
            if isinstance(module, CompileReady):
                module.compile_ready()
        dynamo = torch._dynamo.config
        dynamo.recompile_limit = max(dynamo.recompile_limit, COMPILED_GRAPHS)
        self.model, self.dynamic = model, dynamic

    def _run(self, name: str, *args, **kwargs) -> Tensor:
        key = (type(self.model), name, self.dynamic)
        if key not in self._functions:
            self._functions[key] = torch.compile(getattr(type(self.model), name), dynamic=self.dynamic)
        try:
            return self._functions[key](self.model, *args, **kwargs)
        except torch._dynamo.exc.BackendCompilerFailed as error:
            raise ConfigError(
                f"compile=True could not compile the model's {name} pass ({type(error.inner_exception).__name__}: "
                f"{str(error.inner_exception).splitlines()[0] if str(error.inner_exception) else ''}). On a CPU, "
                "torch.compile's inductor needs a working C++ compiler (gcc or clang): install one, or decode "
                "without compile (--compile false)"
            ) from error

    def encode(self, *args, **kwargs) -> Tensor:
        return self._run("encode", *args, **kwargs)

    def decode(self, *args, **kwargs) -> Tensor:
        return self._run("decode", *args, **kwargs)


COMPILED_GRAPHS = 64
"""Graphs per compiled function (dynamo's recompile_limit) that CompiledPasses allows."""


class CompiledDecoder(IncrementalDecoder):
    """IncrementalDecoder over CompiledPasses: the same windows, cache and bookkeeping, compiled model passes."""

    def __init__(self, model: Transformer, *args, **kwargs) -> None:
        self.passes = CompiledPasses(model)
        super().__init__(model, *args, **kwargs)


def decoder_for(gen: GenerationConfig) -> type[IncrementalDecoder]:
    """The decoder a Transformer's generate and beam_search run: compiled passes when gen.compile."""
    return CompiledDecoder if gen.compile else IncrementalDecoder


@contextmanager
def vector_friendly_weights(model: Transformer, enabled: bool = True) -> Iterator[None]:
    """Within the block, the decoder's Linear weights (out, in) live in column-major memory, values unchanged.

    Decoding one row, every step is a matrix-vector product per weight, bound by memory bandwidth. On a CPU, BLAS
    streams a weight stored as (in, out) rows about twice as fast as the row-major (out, in) one F.linear gets
    (measured in docs/performance.md, "Greedy generation"). The copy (one pass over the weights) is paid once per generate call;
    the original tensors are put back on exit. GPUs and batches are left alone: there the layout does not help.
    """
    if not enabled or model.tgt_embed.weight.device.type != "cpu":
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
    if top_k and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        drop = probs.cumsum(dim=-1) - probs >= top_p  # the mass before a token already reaches top_p; never the first
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


def next_token(logits: Tensor, gen: GenerationConfig, generator: torch.Generator | None) -> Tensor:
    """(N, V) -> (N,): argmax at temperature 0, else a sample from the filtered, tempered distribution."""
    if gen.temperature == 0.0:
        return logits.argmax(dim=-1)
    probs = filter_logits(logits / gen.temperature, gen.top_k, gen.top_p).softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


class RepetitionPenalty:
    """Keskar et al. (2019): logits of tokens already in a row shrink, divided by the penalty when positive and
    multiplied when negative. Tracks a (N, V) set of seen tokens; inactive (no cost) at penalty 1."""

    def __init__(self, penalty: float, tokens: Tensor, keep: Tensor | None, vocab_size: int) -> None:
        self.penalty = penalty
        self.seen: Tensor | None = None
        if penalty != 1.0:  # padding is marked in an extra column, then dropped
            ids = tokens if keep is None else tokens.masked_fill(~keep.bool(), vocab_size)
            seen = torch.zeros(tokens.shape[0], vocab_size + 1, dtype=torch.bool, device=tokens.device)
            self.seen = seen.scatter_(1, ids, True)[:, :vocab_size]

    def __call__(self, logits: Tensor) -> Tensor:
        if self.seen is None:
            return logits
        shrunk = torch.where(logits > 0, logits / self.penalty, logits * self.penalty)
        return torch.where(self.seen, shrunk, logits)

    def update(self, tokens: Tensor, rows: Tensor | None = None) -> None:
        if self.seen is not None:
            if rows is not None:
                self.seen = self.seen.index_select(0, rows)
            self.seen.scatter_(1, tokens[:, None], True)


@dataclass
class DecodingPlan:
    """What one generate call decodes: the settings and the limits they come to for this model and input."""

    gen: GenerationConfig
    max_new_tokens: int
    limit: Tensor | None  # per-row limit of an encoder-decoder (source length + max_source_offset)
    stop_ids: Tensor | None
    fill: int | None


def check_for_model(gen: GenerationConfig, cfg: TransformerConfig) -> list[int]:
    """Refuse settings this model cannot decode with (a window past its context, a stop id outside its vocabulary);
    the ids that end a row. Commands call it before they print anything, decoding again when it starts."""
    if gen.window_keep is not None and gen.window_keep > cfg.max_seq_len:
        raise ConfigError(f"window_keep={gen.window_keep} exceeds max_seq_len={cfg.max_seq_len}")
    eos = cfg.eos_token_id if gen.eos_token_id is None else gen.eos_token_id
    stops = [t for t in [eos, *gen.stop_token_ids] if t is not None]
    outside = [t for t in stops if t >= cfg.tgt_vocab_size]
    if outside:  # an id the model never writes: the row would never stop there
        raise ConfigError(
            f"eos_token_id/stop_token_ids {outside} are not tokens of this model, whose vocabulary has ids 0 to "
            f"{cfg.tgt_vocab_size - 1}"
        )
    return stops


def check_inputs(cfg: TransformerConfig, input_ids: Tensor, attention_mask: Tensor | None) -> None:
    """Refuse, in one line, inputs that would otherwise fail deep inside torch (or, a mask of another shape, decode
    silently from the wrong tokens): token ids must be a (B, T) integer tensor of ids of the model's vocabulary, with
    a mask of the same shape. One read of the device per call, as decoding's own length checks do."""
    if not isinstance(input_ids, Tensor):
        raise TypeError(
            f"input_ids must be a torch.Tensor of token ids, shape (B, T), not {type(input_ids).__name__}: encode text "
            "first, e.g. torch.tensor([tokenizer.encode(text).ids])"
        )
    if cfg.is_encoder_decoder and cfg.source != "tokens":
        return  # features or images: the encoder's input layer says what it takes
    if input_ids.dim() != 2 or input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
        raise TypeError(
            f"input_ids must be a (B, T) tensor of integer token ids; got shape {tuple(input_ids.shape)} of "
            f"{input_ids.dtype} (one prompt: ids[None], i.e. shape (1, T))"
        )
    if input_ids.shape[1] == 0:
        raise ConfigError("input_ids holds no token (shape (B, 0)): give each row at least one token id")
    low, high = torch.stack(torch.aminmax(input_ids)).tolist() if input_ids.numel() else (0, 0)  # one device read
    if low < 0 or high >= cfg.vocab_size:
        raise ConfigError(
            f"input_ids holds ids from {low} to {high}, but this model's vocabulary "
            f"has ids 0 to {cfg.vocab_size - 1} (padding positions too are looked up: fill them with a real id, "
            "e.g. pad_token_id, and say they are padding with attention_mask)"
        )
    if attention_mask is not None and tuple(attention_mask.shape) != tuple(input_ids.shape):
        raise ConfigError(
            f"attention_mask has shape {tuple(attention_mask.shape)} but input_ids {tuple(input_ids.shape)}: it must "
            "mark each token of input_ids (True or 1 for a real token, False or 0 for padding)"
        )


def fill_token_id(cfg: TransformerConfig, gen: GenerationConfig) -> int | None:
    """What a row that finished before the batch's longest is filled with: the pad token, else the EOS (the model's
    where eos_token_id is -1, no EOS: a real id, which the next step can embed). Decoding writes it; the rows that
    predict and serve return strip it."""
    if cfg.pad_token_id is not None:
        return cfg.pad_token_id
    eos = cfg.eos_token_id if gen.eos_token_id is None else gen.eos_token_id
    return cfg.eos_token_id if eos == -1 else eos


def plan_decoding(
    model: Transformer, input_ids: Tensor, attention_mask: Tensor | None, config: GenerationConfig | None, overrides
) -> DecodingPlan:
    """The settings (config with overrides) and what they come to for this model and input; shared by every model
    that decodes through `decode` (the Transformer, an exported graph)."""
    cfg = model.config
    if cfg.is_encoder_only:
        raise TypeError("An encoder_only model does not generate: it classifies or fills in masked tokens")
    check_inputs(cfg, input_ids, attention_mask)
    gen = (config or GenerationConfig()).replace(**overrides)
    stops = check_for_model(gen, cfg)
    fill = fill_token_id(cfg, gen)
    max_new, limit = gen.max_new_tokens, None
    if cfg.is_encoder_decoder:
        context = cfg.max_seq_len - 1  # BOS takes the first of the decoder's max_seq_len positions
        lengths = None
        if gen.max_source_offset is not None and cfg.source != "patches":  # an image has no length to bound by
            keep = model.drop_if_unpadded(attention_mask)
            n = input_ids.shape[1]
            lengths = keep.sum(1) if keep is not None else torch.full((input_ids.shape[0],), n, device=input_ids.device)
        # What these rows may ask for: max_new_tokens, or less where their sources bound them. The context cuts a
        # translation only when that is more: a default cap above the context is no news (it warned on every
        # translation preset's defaults, whatever the sources).
        wanted = max_new if lengths is None else min(max_new, int(lengths.max()) + gen.max_source_offset)
        if wanted > context:
            warnings.warn(
                f"max_new_tokens={max_new} exceeds what this encoder-decoder can produce: translations stop at "
                f"max_seq_len - 1 = {context} tokens",
                stacklevel=4,
            )
        max_new = min(max_new, context)
        if lengths is not None:
            limit = (lengths + gen.max_source_offset).clamp(max=max_new)
            max_new = min(max_new, int(limit.max()))
    stop_ids = torch.tensor(stops, device=input_ids.device) if stops else None
    return DecodingPlan(gen, max_new, limit, stop_ids, fill)


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """Eval mode and inference mode (no autograd bookkeeping at all: 7-9% of a decoding step at the translation
    preset's size, against no_grad). Results leave through _outside, as ordinary tensors."""
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        model.train(was_training)


def _outside(tokens: Tensor) -> Tensor:
    """A copy made outside inference mode (unless the caller is in it): callers may change it in place."""
    return tokens.clone()


def generate(
    model: Transformer,
    input_ids: Tensor,
    config: GenerationConfig | None = None,
    *,
    attention_mask: Tensor | None = None,
    generator: torch.Generator | None = None,
    streamer: Streamer | None = None,
    **overrides,
) -> Tensor:
    """Only the new tokens, (B, <= max_new_tokens), LongTensor; after a row's EOS (kept) the row holds pad_token_id.
    Also `Transformer.generate`: ``model.generate(prompt, ...)``.

    config defaults to GenerationConfig() (greedy; see it for what each setting does); keyword overrides change single
    fields: ``model.generate(prompt, GenerationConfig(max_new_tokens=64, temperature=0.8))`` or
    ``model.generate(prompt, max_new_tokens=64, temperature=0.8)``. decoder_only: input_ids is the prompt, padded on
    either side as attention_mask (B, T) says (True for real tokens); each row gives what it gives alone; past
    max_seq_len the model conditions on the last tokens (a sliding window, each row's by its own length). encoder_decoder: input_ids is the source;
    decoding starts from bos_token_id. streamer sees every step's tokens (sampling and greedy only). The model runs
    in eval mode and is restored afterwards.
    """
    plan = plan_decoding(model, input_ids, attention_mask, config, overrides)
    gen = plan.gen
    single_row = input_ids.shape[0] == 1 and gen.use_cache and gen.num_beams == 1
    with _eval_mode(model), vector_friendly_weights(model, enabled=single_row and plan.max_new_tokens >= 16):
        out = decode(model, decoder_for(gen), input_ids, attention_mask, plan, generator, streamer)
    return _outside(out)


def decode(
    model,
    decoder_class: type[IncrementalDecoder],
    input_ids: Tensor,
    attention_mask: Tensor | None,
    plan: DecodingPlan,
    generator: torch.Generator | None = None,
    streamer: Streamer | None = None,
) -> Tensor:
    """Greedy decoding, sampling or beam search (as plan.gen says) over `decoder_class(model, ...)`: PyTorch's
    IncrementalDecoder, or a subclass that runs an exported graph. `model` needs config and drop_if_unpadded."""
    gen = plan.gen
    if plan.max_new_tokens < 1:
        return torch.empty(input_ids.shape[0], 0, dtype=torch.long, device=input_ids.device)
    if gen.num_beams > 1:
        if streamer is not None:
            raise ConfigError("streaming needs num_beams=1: beam search settles its tokens only at the end")
        return _beam_search(model, input_ids, attention_mask, plan, decoder_class)
    if generator is None and gen.seed is not None:
        generator = torch.Generator(device=input_ids.device).manual_seed(gen.seed)
    decoder = decoder_class(
        model, input_ids, attention_mask, plan.max_new_tokens, use_cache=gen.use_cache, window_keep=gen.window_keep
    )
    penalty = RepetitionPenalty(gen.repetition_penalty, decoder.tokens, decoder.keep, decoder.logits.shape[-1])
    finished = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    out = []
    logits = decoder.logits
    for i in range(plan.max_new_tokens):
        token = next_token(penalty(logits), gen, generator)
        if plan.fill is not None:
            token = token.masked_fill(finished, plan.fill)
        out.append(token)
        if plan.stop_ids is not None:
            finished |= torch.isin(token, plan.stop_ids)
        if plan.limit is not None:
            finished |= plan.limit <= i + 1
        if streamer is not None and (ended := streamer(token)) is not None:
            finished |= ended.to(finished.device)
        if i == plan.max_new_tokens - 1 or bool(finished.all()):
            break
        penalty.update(token)
        logits = decoder.step(token)
    return torch.stack(out, dim=1)


def beam_search(
    model: Transformer,
    input_ids: Tensor,
    config: GenerationConfig | None = None,
    *,
    attention_mask: Tensor | None = None,
    **overrides,
) -> Tensor:
    """Beam search even with num_beams=1 (which equals greedy decoding): for tests and callers that want it whatever
    the config says."""
    with _eval_mode(model):
        plan = plan_decoding(model, input_ids, attention_mask, config, overrides)
        out = _beam_search(model, input_ids, attention_mask, plan, decoder_for(plan.gen))
    return _outside(out)


def length_penalty(length: int, alpha: float, form: str = "length") -> float:
    """The divisor of a hypothesis's log-probability: |Y| ** alpha ("length"), or GNMT's ((5 + |Y|) / 6) ** alpha
    ("gnmt", Wu et al. 2016, which the Transformer paper uses with alpha = 0.6). Both are 1 at alpha = 0; GNMT's is
    1 at |Y| = 1 and grows more slowly, so it favours long outputs less than |Y| ** alpha does."""
    if form == "gnmt":
        return ((5.0 + length) / 6.0) ** alpha
    if form == "length":
        return float(length) ** alpha
    raise ValueError(f"length_penalty_form={form!r}: use 'length' or 'gnmt'")


def _beam_search(
    model: Transformer,
    input_ids: Tensor,
    attention_mask: Tensor | None,
    plan: DecodingPlan,
    decoder_class: type[IncrementalDecoder],
) -> Tensor:
    """Each step keeps the num_beams best live continuations per row; a beam that emits a stop token becomes a
    hypothesis scored log p / lp(length) (see length_penalty). A row is done when it holds num_beams hypotheses and,
    unless early_stopping, its best live beam, normalised at the current length, cannot beat the worst of them
    (Hugging Face's default criterion), or when it reaches its length limit (its live beams then compete as they are).
    """
    gen, max_new_tokens, limit, stop_ids = plan.gen, plan.max_new_tokens, plan.limit, plan.stop_ids
    fill = 0 if plan.fill is None else plan.fill
    B, K = input_ids.shape[0], gen.num_beams

    def lp(length: int) -> float:
        return length_penalty(length, gen.length_penalty, gen.length_penalty_form)

    device = input_ids.device
    decoder = decoder_class(
        model, input_ids, attention_mask, max_new_tokens, expand=K, use_cache=gen.use_cache, window_keep=gen.window_keep
    )
    V = decoder.logits.shape[-1]
    n_stops = 0 if stop_ids is None else int((stop_ids >= 0).sum())
    penalty = RepetitionPenalty(gen.repetition_penalty, decoder.tokens, decoder.keep, V)
    limit = torch.full((B,), max_new_tokens, device=device) if limit is None else limit
    scores = torch.zeros(B, K, device=device)
    scores[:, 1:] = float("-inf")  # all beams start identical: expand only the first
    first_row = torch.arange(B, device=device)[:, None] * K  # (B, 1): row of each batch entry's first beam
    generated = torch.empty(B * K, 0, dtype=torch.long, device=device)
    hypotheses: list[list[tuple[float, Tensor]]] = [[] for _ in range(B)]
    # The worst kept hypothesis score of each row once it holds K of them (NaN before: compares False).
    worst = torch.full((B,), float("nan"), device=device)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    logits = decoder.logits
    for step in range(max_new_tokens):
        length = step + 1
        # Rows reaching their length limit now, judged before this step's stops end any: their live beams compete
        # with those stops (a row that fills its num_beams hypotheses at its limit still weighs its live beams).
        at_limit = (limit <= length) & ~done
        candidates = (scores[..., None] + penalty(logits).log_softmax(dim=-1).view(B, K, V)).view(B, K * V)
        # Enough candidates that K live beams survive the stops among them: each beam gives at most n_stops stops.
        top_scores, top_ids = candidates.topk(min((1 + max(1, n_stops)) * K, K * V), dim=1)
        top_beams, top_tokens = top_ids // V, top_ids % V
        is_stop = torch.isin(top_tokens, stop_ids) if stop_ids is not None else torch.zeros_like(top_tokens).bool()
        # A stop token among the K best ends a hypothesis (rare: a short Python loop over those only).
        for b, rank in (is_stop[:, :K] & ~done[:, None]).nonzero().tolist():
            history = torch.cat([generated[b * K + top_beams[b, rank]], top_tokens[b, rank, None]])
            _add_hypothesis(hypotheses[b], top_scores[b, rank].item() / lp(length), history, K)
            if len(hypotheses[b]) == K:
                worst[b] = hypotheses[b][-1][0]
        # The K best non-stop candidates live on, in rank order (a stable sort moves stop candidates last).
        live = is_stop.int().sort(dim=1, stable=True).indices[:, :K]
        rows = first_row + top_beams.gather(1, live)
        tokens = top_tokens.gather(1, live)
        scores = top_scores.gather(1, live)
        # Finished rows keep their beams in place, emit padding and score -inf.
        rows = torch.where(done[:, None], first_row + torch.arange(K, device=device), rows)
        tokens = tokens.masked_fill(done[:, None], fill)
        scores = scores.masked_fill(done[:, None], float("-inf"))
        generated = torch.cat([generated.index_select(0, rows.view(-1)), tokens.view(-1, 1)], dim=1)
        if gen.early_stopping:  # num_beams finished hypotheses end the row
            done |= ~worst.isnan()
        else:
            done |= worst >= scores[:, 0] / lp(length)
        # Rows at their length limit: their live beams compete as they are.
        for b in at_limit.nonzero().view(-1).tolist():
            for k in range(K):
                if (score := scores[b, k].item()) > float("-inf"):
                    _add_hypothesis(hypotheses[b], score / lp(length), generated[b * K + k], K)
        done |= limit <= length
        if bool(done.all()):
            break
        penalty.update(tokens.view(-1), rows.view(-1))
        logits = decoder.step(tokens.view(-1), rows.view(-1))
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
