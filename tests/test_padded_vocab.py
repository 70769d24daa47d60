"""A padded vocabulary (pad_vocab_to_multiple_of): tables and the output layer are allocated at a GPU-friendly width,
while everything outside the model (logits, loss, metrics, decoding, exports) sees the true vocabulary only.

Tiny models: a true vocabulary of 100 tokens padded to 128 rows."""

from __future__ import annotations

import json
import math
import string
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from safetensors.torch import load_file
from torch import Tensor
from torch.utils.data import DataLoader

from lit_transformer.checkpoints.files import CheckpointError, check_tokenizer_vocabulary
from lit_transformer.config import TransformerConfig
from lit_transformer.data.text import train_tokenizer
from lit_transformer.engine.lightning_module import LitTransformer
from lit_transformer.inference import load_model
from lit_transformer.interop import load_hf_gpt2, load_safetensors, save_hf_gpt2, save_hf_marian, save_safetensors
from lit_transformer.model import Transformer

sys.path.insert(0, str(Path(__file__).parent))
from model_variants import single_thread, tokens  # noqa: E402, F401 (autouse fixture)

VOCAB, PADDED = 100, 128
GPT2 = {"topology": "decoder_only", "norm_position": "pre", "positions": "learned", "pad_token_id": None}
PAPER = {"topology": "encoder_decoder", "norm_position": "post", "positions": "sinusoidal", "activation": "relu"}
MLM = {"topology": "encoder_only", "head": "masked_lm", "mask_token_id": 3}
TOPOLOGIES = {
    "decoder_only": GPT2,
    "encoder_decoder": PAPER,
    "encoder_decoder-untied-two-vocabularies": {**PAPER, "target_vocab_size": 90, "tie_embeddings": False},
    "encoder_only-masked_lm": MLM,
}


def config(variant: dict, padded: bool = True, **overrides) -> TransformerConfig:
    overrides.setdefault("pad_vocab_to_multiple_of", 64 if padded else None)
    return TransformerConfig.preset("tiny", **variant, vocab_size=VOCAB, **overrides)


def build(variant: dict, padded: bool = True, seed: int = 0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(config(variant, padded, **overrides)).eval()


def run(model: Transformer, x: Tensor) -> Tensor:
    """Logits of any topology for tokens x (the target is x itself for an encoder-decoder)."""
    return model(x, x) if model.config.is_encoder_decoder else model(x)


def padded_copy(model: Transformer, multiple: int = 64) -> Transformer:
    """The same model with its vocabulary padded: the true rows copied, the padded ones as initialised (zero)."""
    padded = Transformer(model.config.replace(pad_vocab_to_multiple_of=multiple)).eval()
    state = padded.state_dict()
    for name, tensor in model.state_dict().items():
        state[name] = state[name].clone()
        state[name][: tensor.shape[0]] = tensor
    padded.load_state_dict(state)
    return padded


def test_padded_sizes_round_up_to_the_multiple():
    gpt2 = TransformerConfig.preset("gpt2-small")
    assert (gpt2.vocab_size, gpt2.padded_vocab_size, gpt2.padded_tgt_vocab_size) == (50257, 50304, 50304)
    assert TransformerConfig.preset("paper-base").padded_vocab_size == 37056
    assert TransformerConfig.preset("gpt2-small", pad_vocab_to_multiple_of=None).padded_vocab_size == 50257
    two = config({**PAPER, "target_vocab_size": 65})
    assert (two.padded_vocab_size, two.padded_tgt_vocab_size) == (128, 128)
    assert config(PAPER, pad_vocab_to_multiple_of=50).padded_vocab_size == 100  # already a multiple
    for bad in (0, -64):
        with pytest.raises(ValueError, match="pad_vocab_to_multiple_of"):
            config(GPT2, pad_vocab_to_multiple_of=bad)


@pytest.mark.parametrize("variant", TOPOLOGIES.values(), ids=TOPOLOGIES.keys())
def test_tables_are_padded_but_logits_cover_the_true_vocabulary(variant):
    model = build(variant)
    cfg = model.config
    tables = [model.src_embed if cfg.is_encoder_only else model.tgt_embed, model.lm_head]
    if cfg.is_encoder_decoder:
        tables.append(model.src_embed)
    for table in tables:
        assert table.weight.shape[0] == PADDED
        true_rows = cfg.vocab_size if table is getattr(model, "src_embed", None) else cfg.tgt_vocab_size
        assert table.weight[true_rows:].abs().sum() == 0  # padded rows start at zero
    logits = run(model, tokens(2, 12, vocab=90))
    assert logits.shape == (2, 12, cfg.vocab_size if cfg.is_encoder_only else cfg.tgt_vocab_size)


@pytest.mark.parametrize("variant", TOPOLOGIES.values(), ids=TOPOLOGIES.keys())
def test_a_padded_model_computes_what_the_unpadded_one_does(variant):
    unpadded = build(variant, padded=False)
    padded = padded_copy(unpadded)
    x = tokens(2, 12, vocab=90)
    with torch.no_grad():
        torch.testing.assert_close(run(padded, x), run(unpadded, x), atol=1e-6, rtol=1e-6)
    if not unpadded.config.is_encoder_only:
        for settings in ({}, {"num_beams": 3}):
            assert torch.equal(
                padded.generate(x, max_new_tokens=8, **settings), unpadded.generate(x, **settings, max_new_tokens=8)
            )


@pytest.mark.parametrize("variant", TOPOLOGIES.values(), ids=TOPOLOGIES.keys())
def test_padded_rows_get_no_gradient_from_the_loss(variant):
    model = build(variant).train()
    x = tokens(2, 12, vocab=90)
    logits = run(model, x)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), x.flatten()).backward()
    for table, rows in model._vocab_tables():
        assert table.weight.grad[rows:].abs().sum() == 0
        assert table.weight.grad[:rows].abs().sum() > 0


def _make_padded_rows_win(model: Transformer) -> None:
    """Give the padded output rows logits far above every true one: without the slice, every decoding picks them.

    The output layer sees all-ones hidden states (a pre-hook), so row r scores the sum of its weights: about N(0, 1)
    for the true rows (set to N(0, 1 / d)), 10 * d_model for the padded rows."""
    d, vocab = model.config.d_model, model.config.tgt_vocab_size
    with torch.no_grad():
        model.lm_head.weight[:vocab].normal_(0.0, d**-0.5)
        model.lm_head.weight[vocab:] = 10.0
    model.lm_head.register_forward_pre_hook(lambda module, args: (torch.ones_like(args[0]),))
    raw = model.lm_head(torch.zeros(1, d))
    assert raw.argmax(-1).item() >= vocab  # the unsliced output layer prefers a padded id


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"temperature": 1.0, "seed": 0},
        {"temperature": 1.0, "top_k": 5, "seed": 0},
        {"temperature": 1.0, "top_p": 0.9, "seed": 0},
        {"repetition_penalty": 1.3},
        {"num_beams": 3},
    ],
    ids=["greedy", "sample", "top_k", "top_p", "repetition_penalty", "beam"],
)
@pytest.mark.parametrize("variant", [GPT2, PAPER], ids=["decoder_only", "encoder_decoder"])
def test_a_padded_id_is_never_generated(variant, settings):
    model = build(variant)
    _make_padded_rows_win(model)
    x = tokens(3, 6, vocab=VOCAB)
    out = model.generate(x, max_new_tokens=12, eos_token_id=None, **settings)
    assert out.shape[1] == 12  # no early stop: every step chose among the true vocabulary
    assert int(out.max()) < VOCAB, out


@pytest.fixture(scope="module")
def tokenizer():
    """A character tokenizer within the true vocabulary (<pad>, <bos>, <eos>, <unk> are 0-3)."""
    tok = train_tokenizer([string.printable * 3], kind="char", vocab_size=VOCAB)
    assert tok.get_vocab_size() <= VOCAB
    return tok


def test_the_tokenizer_check_compares_with_the_true_vocabulary():
    cfg = config(GPT2)
    check_tokenizer_vocabulary(VOCAB, cfg)
    with pytest.raises(CheckpointError, match="holds 100"):  # the padded rows would fit it, the logits would not
        check_tokenizer_vocabulary(VOCAB + 1, cfg)


def test_hf_gpt2_export_writes_the_true_vocabulary_and_loads_into_a_padded_config(tmp_path, tokenizer):
    transformers = pytest.importorskip("transformers")
    unpadded = build(GPT2, padded=False)
    with torch.no_grad():
        for p in unpadded.parameters():
            p.normal_(0.0, 0.3)  # logits of several units, not a fresh init's near-zero ones
    model = padded_copy(unpadded)
    save_hf_gpt2(model, tmp_path, tokenizer)
    assert json.loads((tmp_path / "config.json").read_text())["vocab_size"] == VOCAB
    assert load_file(tmp_path / "model.safetensors")["transformer.wte.weight"].shape == (VOCAB, 32)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    x = tokens(2, 16, vocab=VOCAB)
    with torch.no_grad():
        ours = model(x)
        torch.testing.assert_close(hf(x).logits, ours, atol=1e-5, rtol=1e-5)
        back = load_hf_gpt2(tmp_path)  # its own config: unpadded
        assert back.tgt_embed.weight.shape[0] == VOCAB
        torch.testing.assert_close(back(x), ours, atol=1e-5, rtol=1e-5)
        into_padded = load_hf_gpt2(tmp_path, base=model.config)
        assert into_padded.tgt_embed.weight.shape[0] == PADDED
        assert into_padded.tgt_embed.weight[VOCAB:].abs().sum() == 0
        torch.testing.assert_close(into_padded(x), ours, atol=1e-5, rtol=1e-5)


def test_marian_export_writes_the_true_vocabularies(tmp_path):
    transformers = pytest.importorskip("transformers")
    variant = {**PAPER, "target_vocab_size": 90, "scale_embeddings": True}
    model = padded_copy(build(variant, padded=False, init="xavier"))
    save_hf_marian(model, tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    assert state["model.encoder.embed_tokens.weight"].shape[0] == VOCAB
    assert state["model.decoder.embed_tokens.weight"].shape[0] == 90
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    src, tgt = tokens(2, 11, vocab=VOCAB), tokens(2, 9, seed=2, vocab=90)
    tgt[:, 0] = 1  # BOS
    with torch.no_grad():
        ours = model(src, tgt)
        torch.testing.assert_close(hf(input_ids=src, decoder_input_ids=tgt).logits, ours, atol=1e-5, rtol=1e-5)
    assert ours.shape[-1] == 90


def test_onnx_logits_cover_the_true_vocabulary(tmp_path):
    """The decoder-only graph; the encoder-only one ends in the same sliced output layer (Transformer._logits)."""
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from lit_transformer.interop import export_onnx

    model = build(GPT2)
    export_onnx(model, tmp_path / "model.onnx")
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    x = tokens(2, 10, vocab=VOCAB)
    (logits,) = session.run(["logits"], {"input_ids": x.numpy()})
    assert logits.shape == (2, 10, VOCAB)
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(logits), model(x), atol=1e-4, rtol=1e-4)


def test_the_safetensors_folder_keeps_the_padded_shapes(tmp_path):
    model = build(PAPER)
    save_safetensors(model, tmp_path)
    back = load_safetensors(tmp_path)
    assert back.config == model.config and back.src_embed.weight.shape[0] == PADDED
    x = tokens(2, 8, vocab=VOCAB)
    with torch.no_grad():
        torch.testing.assert_close(back(x, x), model(x, x), atol=0, rtol=0)


def _batches(n: int, batch: int = 2, length: int = 16) -> list[dict[str, Tensor]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        ids = torch.randint(0, VOCAB, (batch, length + 1), generator=g)
        out.append({"input_ids": ids[:, :-1], "labels": ids[:, 1:]})
    return out


def _trainer(tmp_path: Path, max_steps: int) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        max_steps=max_steps,
        limit_val_batches=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )


def test_training_with_padding_keeps_padded_rows_zero_and_checkpoints_round_trip(tmp_path, tokenizer):
    """Two steps of AdamW with weight decay on every table and smoothing over the (true) vocabulary: the loss and
    the accuracy are finite, the padded rows get no gradient and stay zero, and the checkpoint loads and resumes."""
    cfg = config(GPT2, tie_embeddings=False)
    lit = LitTransformer(cfg, lr=1e-2, warmup_steps=0, schedule="constant", decay_embeddings=True, label_smoothing=0.1)
    lit.tokenizer = tokenizer
    trainer = _trainer(tmp_path, 2)
    trainer.fit(lit, DataLoader(_batches(2), batch_size=None), DataLoader(_batches(1), batch_size=None))
    metrics = trainer.callback_metrics
    assert math.isfinite(metrics["train/loss"]) and 0.0 <= float(metrics["val/accuracy"]) <= 1.0
    model = lit.model
    assert model.lm_head.weight[VOCAB:].abs().sum() == 0 and model.tgt_embed.weight[VOCAB:].abs().sum() == 0
    assert model.lm_head.weight[:VOCAB].abs().sum() > 0

    path = tmp_path / "padded.ckpt"
    trainer.save_checkpoint(path)
    loaded = load_model(path)
    assert loaded.config == cfg and loaded.model.lm_head.weight.shape[0] == PADDED
    x = tokens(2, 10, vocab=VOCAB)
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(x), model.eval()(x), atol=0, rtol=0)

    resumed = LitTransformer(cfg, lr=1e-2, warmup_steps=0, schedule="constant", decay_embeddings=True)
    trainer = _trainer(tmp_path, 3)
    trainer.fit(resumed, DataLoader(_batches(3), batch_size=None), ckpt_path=path)
    assert trainer.global_step == 3 and resumed.model.lm_head.weight[VOCAB:].abs().sum() == 0
