"""The assembled model: decoder-only (GPT-2), encoder-decoder (the paper) or encoder-only (a classifier or a masked
language model), embeddings, tying, initialisation.

Padding masks are (B, T) with True (or 1) for real tokens and False (0) for padding, as in Hugging Face; without one,
every token is real (no token id is taken to mean padding). Padding may be on either side: position ids count real
tokens only, so a padded row gives exactly what it gives alone.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from lit_transformer.config import TransformerConfig
from lit_transformer.model import generation
from lit_transformer.model.attention import VALUE_MIX_INIT, KVCache, Rope, SelfAttention
from lit_transformer.model.blocks import NORM_CLASSES, DecoderBlock, EncoderBlock, LayerCache, dropout, layer_norm
from lit_transformer.model.encoder_inputs import build_source, build_source_positions
from lit_transformer.model.heads import ClassificationHead, pool
from lit_transformer.model.positions import AlibiBias, LearnedPositions, RotaryEmbedding, build_positions

Attentions = dict[str, list[Tensor]]


def position_ids(keep: Tensor | None) -> Tensor | None:
    """(B, T) positions that count real tokens only, so left padding does not shift a row; None without padding."""
    return None if keep is None else (keep.cumsum(-1) - 1).clamp(min=0)


def causal_self_mask(t: int, total: int, keep: Tensor | None, device: torch.device) -> tuple[Tensor | None, bool]:
    """Mask and is_causal for t queries that end a sequence of `total` keys (earlier ones cached).

    No tensor is built when is_causal or nothing at all describes the pattern (no padding).
    """
    if keep is None:
        if t == 1:
            return None, False
        if t == total:
            return None, True
    causal = torch.ones(t, total, dtype=torch.bool, device=device).tril(total - t)
    if keep is None:
        return causal, False
    # A query on left padding has no real key at or before it; letting it see itself keeps the softmax finite.
    # Its output is never used, and real queries are unaffected (their own key is real).
    itself = causal & ~torch.ones_like(causal).tril(total - t - 1)
    return (causal & keep[:, None, None, :]) | itself, False


def softcap(logits: Tensor, cap: float) -> Tensor:
    """cap * tanh(logits / cap): close to the identity for small logits, never beyond +-cap (Gemma 2's soft cap)."""
    return torch.tanh(logits / cap) * cap


# The encoder's parameters, by the start of their names: what an encoder checkpoint gives a new head.
ENCODER_PREFIXES = ("src_embed.", "src_positions.", "encoder_blocks.", "encoder_norm.")


class Transformer(nn.Module):
    """A Transformer described by a TransformerConfig: GPT-2, every variant of Vaswani et al. (2017), and their
    encoder alone with a classification or masked-LM head."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.config = cfg
        d = cfg.d_model
        pre = cfg.norm_position == "pre"
        self.embed_scale = math.sqrt(d) if cfg.scale_embeddings else 1.0
        self.embed_dropout = dropout(cfg.dropout)
        # Positions that act inside self-attention (no parameters): shared by every layer and both stacks.
        self.rotary = RotaryEmbedding(cfg) if cfg.positions == "rope" else None
        self.alibi = AlibiBias(cfg) if cfg.positions == "alibi" else None
        if cfg.is_encoder_decoder or cfg.is_encoder_only:
            if cfg.source == "tokens":
                self.src_embed = nn.Embedding(cfg.padded_vocab_size, d)
                self.src_positions = build_positions(cfg)
            else:  # features or image patches: no source vocabulary
                self.src_input = build_source(cfg)
                self.src_positions = build_source_positions(cfg)
            self.encoder_blocks = nn.ModuleList(
                EncoderBlock(cfg, mixes_values=cfg.value_residual and i > 0) for i in range(cfg.encoder_layers)
            )
            # Pre-LN leaves the residual stream unnormalised: a final LayerNorm, as torch.nn.Transformer does.
            self.encoder_norm = layer_norm(cfg) if pre else None
        if cfg.is_encoder_only:
            # The encoder's output feeds a head: pooled into a classifier, or per token into a tied output layer.
            self.classifier = ClassificationHead(cfg) if cfg.is_classifier else None
            self.lm_head = None if cfg.is_classifier else nn.Linear(d, cfg.padded_vocab_size, bias=False)
            if self.lm_head is not None and cfg.tie_embeddings:
                self.lm_head.weight = self.src_embed.weight
            self.reset_parameters()
            self._matmul_params = self._count_matmul_params()
            return
        # The paper's three-way tying: one matrix for source, target and output when the vocabulary is shared.
        self.tgt_embed = self.src_embed if cfg.shares_embeddings else nn.Embedding(cfg.padded_tgt_vocab_size, d)
        self.tgt_positions = build_positions(cfg)
        self.decoder_blocks = nn.ModuleList(
            DecoderBlock(cfg, cross_attention=cfg.is_encoder_decoder, mixes_values=cfg.value_residual and i > 0)
            for i in range(cfg.decoder_layers)
        )
        self.decoder_norm = layer_norm(cfg) if pre else None
        self.lm_head = nn.Linear(d, cfg.padded_tgt_vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tgt_embed.weight
        self.reset_parameters()
        # Counted now, while parameters are whole: FSDP later flattens and shards them.
        self._matmul_params = self._count_matmul_params()

    def _count_matmul_params(self) -> int:
        tied_head = self.config.tie_embeddings and self.lm_head is not None
        return self.num_parameters(non_embedding=True) + tied_head * (
            0 if self.lm_head is None else self.lm_head.weight.numel()
        )

    # ---------------------------------------------------------------- initialisation
    @torch.no_grad()
    def reset_parameters(self) -> None:
        """gpt2: normal(0, init_std), residual out-projections scaled by 1/sqrt(residual sublayers in the stack), zero
        biases. xavier (the paper, as fairseq does it): Xavier uniform per projection matrix (a fused QKV is three
        matrices), embeddings and an untied output projection normal(0, d_model**-0.5). zero_init_output then zeroes
        every attention and feed-forward output projection and the output layer (a classifier's last layer)."""
        cfg = self.config
        gpt2 = cfg.init == "gpt2"
        embed_std = cfg.init_std if gpt2 else cfg.d_model**-0.5
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear) and module is not self.lm_head:
                if gpt2:
                    nn.init.normal_(module.weight, 0.0, cfg.init_std)
                else:
                    # Each projection matrix of a fused Linear on its own: Q, K, V (K and V narrower with
                    # grouped-query attention), the cross-attention's K and V, a gated MLP's gate and value.
                    sizes = [module.weight.shape[0]]
                    if name.endswith(".qkv"):
                        sizes = list(self.get_submodule(name.removesuffix(".qkv")).split_sizes)
                    elif name.endswith(".kv") or (name.endswith(".up") and cfg.is_gated):
                        sizes = [module.weight.shape[0] // 2] * 2
                    for matrix in module.weight.split(sizes):
                        nn.init.xavier_uniform_(matrix)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, (nn.Embedding, LearnedPositions)):
                nn.init.normal_(module.weight, 0.0, embed_std)
            elif isinstance(module, NORM_CLASSES):
                module.reset_parameters()
            if isinstance(module, SelfAttention) and module.value_mix is not None:
                module.value_mix.fill_(VALUE_MIX_INIT)
        if not cfg.tie_embeddings and self.lm_head is not None:
            nn.init.normal_(self.lm_head.weight, 0.0, embed_std)
        # Padded vocabulary rows (pad_vocab_to_multiple_of) start at zero. No id looks them up and the logits are
        # sliced before any loss, so they get no gradient; AdamW and weight decay then keep them exactly zero.
        for table, rows in self._vocab_tables():
            table.weight[rows:] = 0.0
        if gpt2:  # GPT-2: keep the residual stream's variance independent of depth
            for stack in (getattr(self, "encoder_blocks", []), getattr(self, "decoder_blocks", [])):
                outs = [m.out for b in stack for m in (b.self_attn, getattr(b, "cross_attn", None)) if m is not None]
                outs += [b.ff.down for b in stack]
                for linear in outs:
                    nn.init.normal_(linear.weight, 0.0, cfg.init_std / math.sqrt(len(outs)))
        if cfg.zero_init_output:  # each block starts as the identity, the first logits uniform (the speedrun's)
            for linear in self.output_projections():
                nn.init.zeros_(linear.weight)

    def output_projections(self) -> list[nn.Linear]:
        """What zero_init_output zeroes: every attention and feed-forward output projection, and the output layer (the
        token output layer, or a classifier's last Linear)."""
        outs: list[nn.Linear] = []
        for stack in (getattr(self, "encoder_blocks", []), getattr(self, "decoder_blocks", [])):
            for block in stack:
                outs += [m.out for m in (block.self_attn, getattr(block, "cross_attn", None)) if m is not None]
                outs.append(block.ff.down)
        if self.lm_head is not None:
            outs.append(self.lm_head)
        if getattr(self, "classifier", None) is not None:
            outs.append(self.classifier.out)
        return outs

    # ---------------------------------------------------------------- forward
    def forward(
        self,
        x: Tensor,
        tgt: Tensor | None = None,
        *,
        attention_mask: Tensor | None = None,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        return_attention: bool = False,
    ) -> Tensor | tuple[Tensor, Attentions]:
        """Logits (B, T, V); (B, num_labels) for an encoder-only classifier.

        decoder_only and encoder_only: ``model(tokens, attention_mask=None)``; encoder_decoder: ``model(src, tgt,
        src_mask=None, tgt_mask=None)``. With return_attention, ``(logits, attentions)``: attentions["self"] (decoder
        self-attention), and for encoder-decoder also ["encoder"] and ["cross"] (encoder-only: ["encoder"] alone), each
        a list per layer of (B, H, T_q, T_k) weights.
        """
        if self.config.is_encoder_only:
            if tgt is not None or src_mask is not None or tgt_mask is not None:
                raise TypeError("encoder_only: call model(tokens, attention_mask=...)")
            return self.encoder_only(x, attention_mask, return_attention=return_attention)
        if self.config.is_encoder_decoder:
            if tgt is None or attention_mask is not None:
                raise TypeError("encoder_decoder: call model(src, tgt, src_mask=..., tgt_mask=...)")
            src_keep = self.key_mask(x, src_mask)
            memory, encoder_weights = self._encode(x, src_keep, return_attention)
            out = self.decode(
                tgt,
                memory,
                tgt_mask=self.key_mask(tgt, tgt_mask),
                memory_mask=src_keep,
                return_attention=return_attention,
            )
            if return_attention:
                out[1]["encoder"] = encoder_weights
            return out
        if tgt is not None or src_mask is not None or tgt_mask is not None:
            raise TypeError("decoder_only: call model(tokens, attention_mask=...)")
        return self.decode(x, tgt_mask=self.key_mask(x, attention_mask), return_attention=return_attention)

    def encoder_only(
        self, tokens: Tensor, attention_mask: Tensor | None = None, *, return_attention: bool = False
    ) -> Tensor | tuple[Tensor, Attentions]:
        """The encoder-only forward: (B, num_labels) classification logits or (B, T, V) masked-LM logits.

        With pooling="cls" the [CLS] token (bos_token_id) is prepended here, so callers feed the same tokens whatever
        the pooling. The mask is used as given (no branch on its values: the graph exports and compiles whole)."""
        cfg = self.config
        if cfg.is_classifier and cfg.pooling == "cls":
            tokens = torch.cat([tokens.new_full((tokens.size(0), 1), cfg.bos_token_id), tokens], dim=1)
            if attention_mask is not None:
                attention_mask = torch.cat([attention_mask.new_ones((tokens.size(0), 1)), attention_mask], dim=1)
        keep = self.key_mask(tokens, attention_mask)
        hidden, weights = self._encode(tokens, keep, return_attention)
        out = self._cap(self.classifier(pool(hidden, keep, cfg.pooling))) if cfg.is_classifier else self._logits(hidden)
        return (out, {"encoder": weights}) if return_attention else out

    @staticmethod
    def key_mask(tokens: Tensor, mask: Tensor | None = None) -> Tensor | None:
        """The (B, T) boolean mask of real tokens as given, None without one. Padding is only ever what `mask` says:
        a token id (even pad_token_id) never means padding by itself. A mask that pads nothing is kept: finding that
        out would read the device, a host synchronisation in every training step (see drop_if_unpadded)."""
        return None if mask is None else mask.bool()

    @staticmethod
    def drop_if_unpadded(mask: Tensor | None) -> Tensor | None:
        """The boolean mask, or None when it pads nothing, so attention runs without one (flash kernels, is_causal).
        One read of the device: generation and other once-per-call paths use it, training steps never do."""
        if mask is None:
            return None
        mask = mask.bool()
        return None if bool(mask.all()) else mask

    def _embed(
        self, tokens: Tensor, embed: nn.Embedding, positions: nn.Module | None, start: int, ids: Tensor | None
    ) -> Tensor:
        x = embed(tokens)
        if self.embed_scale != 1.0:
            x = x * self.embed_scale
        if positions is not None:  # rope, alibi and none add nothing here
            x = x + positions(start, tokens.shape[1], ids)
        return self.embed_dropout(x)

    def _attention_positions(
        self, q_positions: Tensor, k_positions: Tensor, mask: Tensor | None, is_causal: bool
    ) -> tuple[Rope, Tensor | None, bool]:
        """Rotary (cos, sin) for the queries (keys are the same tokens, or cached already rotated), and the mask as
        attention takes it: with alibi, the distance bias with -inf where `mask` (or the causal pattern) forbids.
        Positions are (T,) or (B, T) position ids of the new queries and of all keys."""
        rope = self.rotary(q_positions) if self.rotary is not None else None
        if self.alibi is not None:
            if is_causal:
                t, total = q_positions.shape[-1], k_positions.shape[-1]
                mask = torch.ones(t, total, dtype=torch.bool, device=q_positions.device).tril(total - t)
            mask, is_causal = self.alibi(q_positions, k_positions, mask), False
        return rope, mask, is_causal

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """The encoder's memory (B, S, d_model) for a source (B, S) of ids, (B, S, source_dim) of features or
        (B, C, H, W) images; src_mask (B, S) marks real tokens or regions (None: all are real)."""
        return self._encode(src, self.key_mask(src, src_mask))[0]

    def _encode(self, src: Tensor, keep: Tensor | None, need_weights: bool = False) -> tuple[Tensor, list[Tensor]]:
        """src: token ids (B, S); with source='features', vectors (B, S, source_dim); 'patches', images (B, C, H, W)."""
        ids = position_ids(keep)
        if self.config.source == "tokens":
            x = self._embed(src, self.src_embed, self.src_positions, 0, ids)
        else:
            x = self.src_input(src)
            if self.src_positions is not None:
                x = x + self.src_positions(0, x.shape[1], ids)
            x = self.embed_dropout(x)
        mask = None if keep is None else keep[:, None, None, :]
        rope = None
        ordered = self.config.source != "features" or self.config.source_positions
        if (self.rotary is not None or self.alibi is not None) and ordered:
            positions = ids if ids is not None else torch.arange(x.shape[1], device=src.device)
            rope, mask, _ = self._attention_positions(positions, positions, mask, False)
        weights = []
        first_values = None  # value_residual: the first layer's values, mixed into the later layers'
        for i, block in enumerate(self.encoder_blocks):
            x, w, values = block(x, mask, need_weights, rope, first_values)
            if i == 0 and self.config.value_residual:
                first_values = values
            weights.append(w)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
        return x, weights

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor | None = None,
        *,
        tgt_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        cache: list[LayerCache] | None = None,
        return_attention: bool = False,
        last_only: bool = False,
        project: bool = True,
    ) -> Tensor | tuple[Tensor, Attentions]:
        """The decoder stack and output projection: logits (B, t, V) for tokens tgt (B, t); (B, 1, V) with last_only.

        Masks are taken as given (None means no padding): tgt_mask (B, past + t) covers cached and new tokens,
        memory_mask (B, S). With a cache (see new_cache), tgt continues the tokens already cached. last_only projects
        the last position alone (decoding needs no more), sparing the output layer for a prompt's other tokens.
        project=False returns the final hidden states (B, t, d_model) instead, for a loss that fuses the output layer.
        """
        t = tgt.shape[1]
        past = cache[0].self_attn.length if cache else 0
        ids = position_ids(tgt_mask)
        x = self._embed(tgt, self.tgt_embed, self.tgt_positions, past, None if ids is None else ids[:, past:])
        mask, is_causal = causal_self_mask(t, past + t, tgt_mask, tgt.device)
        rope = None
        if self.rotary is not None or self.alibi is not None:
            k_positions = ids if ids is not None else torch.arange(past + t, device=tgt.device)
            rope, mask, is_causal = self._attention_positions(k_positions[..., past:], k_positions, mask, is_causal)
        memory_mask = None if memory_mask is None else memory_mask[:, None, None, :]
        self_weights, cross_weights = [], []
        first_values = None  # value_residual: the first layer's values of the new tokens, mixed into the later layers'
        for i, block in enumerate(self.decoder_blocks):
            layer_cache = cache[i] if cache else None
            x, w_self, w_cross, values = block(
                x, mask, is_causal, memory, memory_mask, layer_cache, return_attention, rope, first_values
            )
            if i == 0 and self.config.value_residual:
                first_values = values
            self_weights.append(w_self)
            cross_weights.append(w_cross)
        if last_only:
            x = x[:, -1:]
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        if not project:
            return x
        logits = self._logits(x)
        if not return_attention:
            return logits
        attentions = {"self": self_weights}
        if self.config.is_encoder_decoder:
            attentions["cross"] = cross_weights
        return logits, attentions

    def _logits(self, hidden: Tensor) -> Tensor:
        """The output layer, (..., V): the matmul runs at the padded width (fast on GPUs), and the slice (a view)
        hides padded ids from every caller: loss, metrics, sampling and beam search never see one."""
        logits = self.lm_head(hidden)
        vocab = self.config.vocab_size if self.config.is_encoder_only else self.config.tgt_vocab_size
        return self._cap(logits if logits.shape[-1] == vocab else logits[..., :vocab])

    def _cap(self, logits: Tensor) -> Tensor:
        """logit_softcap: cap * tanh(logits / cap), every output's logits (training, evaluation, generation)."""
        cap = self.config.logit_softcap
        return logits if cap is None else softcap(logits, cap)

    def _vocab_tables(self) -> list[tuple[nn.Module, int]]:
        """Each distinct vocabulary-indexed matrix (embeddings, output layer) with its true number of rows."""
        cfg = self.config
        out_rows = cfg.vocab_size if cfg.is_encoder_only else cfg.tgt_vocab_size
        candidates = [
            (getattr(self, "src_embed", None), cfg.vocab_size),
            (getattr(self, "tgt_embed", None), cfg.tgt_vocab_size),
            (self.lm_head, out_rows),
        ]
        tables: dict[int, tuple[nn.Module, int]] = {}
        for module, rows in candidates:
            if module is not None:
                tables.setdefault(id(module.weight), (module, rows))
        return list(tables.values())

    def new_cache(self, max_len: int) -> list[LayerCache]:
        """Empty KV caches for decoding up to max_len target tokens (buffers are allocated on first use)."""
        cross = self.config.is_encoder_decoder
        return [LayerCache(KVCache(max_len), KVCache() if cross else None) for _ in self.decoder_blocks]

    # ---------------------------------------------------------------- generation
    # model.generate(prompt, config, *, attention_mask, generator, streamer, **overrides): the model is the function's
    # first argument, so the method is the function itself (documented there), not a copy of its signature.
    generate = generation.generate

    # ---------------------------------------------------------------- accounting
    def _embedding_parameters(self) -> list[nn.Parameter]:
        tables = [
            getattr(self, "tgt_embed", None),
            getattr(self, "tgt_positions", None),
            getattr(self, "src_embed", None),
        ]
        tables.append(getattr(self, "src_positions", None))
        params = {}
        for table in tables:
            for p in [table] if isinstance(table, torch.Tensor) else (table.parameters() if table is not None else []):
                params[id(p)] = p
        return list(params.values())

    def num_parameters(self, non_embedding: bool = False, padding: bool = True) -> int:
        """Unique parameters (tied matrices count once); non_embedding leaves out token and position tables (a tied
        output projection with them; an untied one stays). padding=False leaves out the padded vocabulary rows
        (pad_vocab_to_multiple_of): the count of the same model unpadded, e.g. the released GPT-2's."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= sum(p.numel() for p in self._embedding_parameters())
        if not padding:
            skip = {id(p) for p in self._embedding_parameters()} if non_embedding else set()
            for module, rows in self._vocab_tables():
                if id(module.weight) not in skip:
                    n -= (module.weight.shape[0] - rows) * module.weight.shape[1]
        return n

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs (forward + backward) per target token at context seq_len, PaLM/nanoGPT style.

        6 per parameter used in a matmul (all but the embedding lookups; the output projection counts even when
        tied, at its padded width: what the GPU runs) plus 12 * d_model * seq_len per attention layer (QK^T and AV, forward and backward, unmasked count).
        Encoder-decoder assumes a source as long as the target: per target token it includes one source token's
        encoder work, and the decoder's self- and cross-attention each attend seq_len keys.
        """
        cfg = self.config
        if cfg.is_encoder_only:
            attention_layers = cfg.encoder_layers
        else:
            attention_layers = cfg.decoder_layers + (cfg.encoder_layers + cfg.decoder_layers) * cfg.is_encoder_decoder
        return 6.0 * self._matmul_params + 12.0 * attention_layers * cfg.d_model * seq_len
