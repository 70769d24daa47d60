"""Peer implementations at equal dimensions, for `bench speed` (lit_transformer/bench/speed_sections.py; which peer
each section needs, and how to install it: speed.py).

Each builder returns a module whose call maps token ids to logits (B, T, V), so every contender is timed through the
same loss, backward and optimizer. Dropout is 0 everywhere: the comparison is of the arithmetic, not of the RNG.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

# ---------------------------------------------------------------------------------------------- decoder-only


def hf_gpt2(vocab: int, d: int, heads: int, layers: int, d_ff: int, ctx: int) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        vocab_size=vocab,
        n_positions=ctx,
        n_embd=d,
        n_layer=layers,
        n_head=heads,
        n_inner=d_ff,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        activation_function="gelu_new",
        use_cache=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    cfg._attn_implementation = "sdpa"
    return _LogitsOf(GPT2LMHeadModel(cfg))


def x_transformers_decoder(vocab: int, d: int, heads: int, layers: int, d_ff: int, ctx: int) -> nn.Module:
    from x_transformers import Decoder, TransformerWrapper

    return TransformerWrapper(
        num_tokens=vocab,
        max_seq_len=ctx,
        tie_embedding=True,
        attn_layers=Decoder(dim=d, depth=layers, heads=heads, ff_mult=d_ff // d, attn_flash=True),
    )


def litgpt_gpt(vocab: int, d: int, heads: int, layers: int, d_ff: int, ctx: int) -> nn.Module:
    """litgpt has no learned-position GPT-2; its closest: GPT-NeoX MLP, LayerNorm, sequential residual (RoPE)."""
    from litgpt.config import Config
    from litgpt.model import GPT

    cfg = Config(
        block_size=ctx,
        vocab_size=vocab,
        padded_vocab_size=vocab,
        n_layer=layers,
        n_head=heads,
        n_embd=d,
        intermediate_size=d_ff,
        bias=True,
        parallel_residual=False,
        mlp_class_name="GptNeoxMLP",
        norm_class_name="LayerNorm",
        rotary_percentage=0.25,
    )
    return GPT(cfg)


class _LogitsOf(nn.Module):
    """A Hugging Face model called with ids (and optionally decoder ids) that returns plain logits."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: Tensor, tgt: Tensor | None = None) -> Tensor:
        if tgt is None:
            return self.model(input_ids=ids, use_cache=False).logits
        return self.model(input_ids=ids, decoder_input_ids=tgt, use_cache=False).logits


# ---------------------------------------------------------------------------------------------- encoder-decoder


def sinusoids(n: int, d: int) -> Tensor:
    pos = torch.arange(n, dtype=torch.float32)[:, None]
    inv = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    return torch.cat([torch.sin(pos * inv), torch.cos(pos * inv)], dim=-1)


class TorchTransformer(nn.Module):
    """torch.nn.Transformer with the paper's shared, scaled embeddings, sinusoids and tied output projection."""

    def __init__(self, vocab: int, d: int, heads: int, layers: int, d_ff: int, ctx: int, norm_first: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.register_buffer("pe", sinusoids(ctx, d), persistent=False)
        self.body = nn.Transformer(d, heads, layers, layers, d_ff, dropout=0.0, batch_first=True, norm_first=norm_first)
        self.scale = math.sqrt(d)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        s = self.embed(src) * self.scale + self.pe[: src.shape[1]]
        t = self.embed(tgt) * self.scale + self.pe[: tgt.shape[1]]
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], device=tgt.device)
        out = self.body(s, t, tgt_mask=causal, tgt_is_causal=True)
        return out @ self.embed.weight.t()


class XTransformerLogits(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, d_ff: int, ctx: int) -> None:
        super().__init__()
        from x_transformers import XTransformer

        self.model = XTransformer(
            dim=d,
            tie_token_emb=True,
            enc_num_tokens=vocab,
            enc_depth=layers,
            enc_heads=heads,
            enc_max_seq_len=ctx,
            enc_ff_mult=d_ff // d,
            enc_attn_flash=True,
            dec_num_tokens=vocab,
            dec_depth=layers,
            dec_heads=heads,
            dec_max_seq_len=ctx,
            dec_ff_mult=d_ff // d,
            dec_attn_flash=True,
        )

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        enc = self.model.encoder(src, return_embeddings=True)
        return self.model.decoder.net(tgt, context=enc)


def hf_seq2seq(kind: str, vocab: int, d: int, heads: int, layers: int, d_ff: int, ctx: int) -> nn.Module:
    """HF BART or Marian at the given sizes, ReLU feed-forward, no dropout; returns the bare HF model."""
    from transformers import BartConfig, BartForConditionalGeneration, MarianConfig, MarianMTModel

    common = dict(
        vocab_size=vocab,
        d_model=d,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=d_ff,
        decoder_ffn_dim=d_ff,
        max_position_embeddings=ctx + 64,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        activation_function="relu",
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
        forced_eos_token_id=None,
    )
    if kind == "bart":
        cfg = BartConfig(**common)
        cls = BartForConditionalGeneration
    else:
        cfg = MarianConfig(**common, decoder_vocab_size=vocab)
        cls = MarianMTModel
    cfg._attn_implementation = "sdpa"
    return cls(cfg)
