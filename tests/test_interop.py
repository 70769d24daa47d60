"""Interop with the ecosystem: Hugging Face GPT-2 and Marian folders, our safetensors folder, ONNX, `export`, and
fine-tuning from a GPT-2 folder. Tiny random models, saved and loaded in tmp_path; logits compared to 1e-5."""

from __future__ import annotations

import shutil
import string
from pathlib import Path

import pytest
import torch
from model_variants import build, single_thread, tokens  # noqa: F401 (autouse fixture)

from lit_transformer.cli.model_commands import export_main
from lit_transformer.config import TransformerConfig
from lit_transformer.data.text import train_tokenizer
from lit_transformer.errors import UserError
from lit_transformer.interop import (
    OnnxModel,
    gpt2_problems,
    load_hf_gpt2,
    load_safetensors,
    marian_problems,
    save_hf_gpt2,
    save_hf_marian,
    save_safetensors,
)
from lit_transformer.model import Transformer

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")

GPT2 = {"topology": "decoder_only", "norm_position": "pre", "positions": "learned"}
PAPER = {"topology": "encoder_decoder", "norm_position": "post", "positions": "sinusoidal", "activation": "relu"}


@pytest.fixture(scope="module")
def tokenizer():
    """A character tokenizer over printable ASCII: <pad>, <bos>, <eos>, <unk> are ids 0-3, 104 tokens in all."""
    return train_tokenizer([string.printable * 3], kind="char", vocab_size=128)


def large(model: Transformer, std: float = 0.5) -> Transformer:
    """Every parameter random and large: feed-forward pre-activations of several units, where the tanh GELU and the
    exact GELU differ by ~1e-3, and LayerNorm gains and biases far from 1 and 0."""
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, std)
    return model


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


# ---- GPT-2 -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("activation", ["gelu_tanh", "gelu", "relu", "relu2"])
def test_gpt2_folder_loads_in_transformers_with_our_logits(tmp_path, tokenizer, activation):
    model = large(build({**GPT2, "activation": activation}, pad_token_id=None))
    save_hf_gpt2(model, tmp_path, tokenizer)
    hf, info = transformers.GPT2LMHeadModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched weights
    x = tokens(2, 24)
    with torch.no_grad():
        ours, theirs = model(x), hf.eval()(x).logits
        close(ours, theirs)
        close(load_hf_gpt2(tmp_path)(x), ours)
    assert ours.abs().max() > 3  # logits of several units, not the near-zero ones of a fresh init
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert hf_tok("To be, or not")["input_ids"] == tokenizer.encode("To be, or not").ids
    assert (hf_tok.bos_token, hf_tok.eos_token) == ("<bos>", "<eos>")


@pytest.mark.parametrize("n_kv_heads", [2, 1], ids=["gqa", "mqa"])
def test_grouped_query_attention_is_a_gpt2_with_our_logits(tmp_path, n_kv_heads):
    """GPT-2 has one key/value head per query head: each of ours is repeated for its group (the folder had K and V
    weights of n_kv_heads heads, which transformers refused as a size mismatch)."""
    model = large(build({**GPT2, "n_kv_heads": n_kv_heads}, pad_token_id=None))
    save_hf_gpt2(model, tmp_path)
    hf, info = transformers.GPT2LMHeadModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info.values()), info
    x = tokens(2, 24)
    with torch.no_grad():
        ours = model(x)
        close(ours, hf.eval()(x).logits)
        close(load_hf_gpt2(tmp_path)(x), ours)
    assert ours.abs().max() > 3


def test_gpt2_activation_names_are_not_interchangeable(tmp_path):
    """The test above could fail: at these activations exact and tanh GELU differ by far more than its 1e-5."""
    model = large(build({**GPT2, "activation": "gelu_tanh"}, pad_token_id=None))
    exact = Transformer(model.config.replace(activation="gelu")).eval()
    exact.load_state_dict(model.state_dict())
    x = tokens(2, 24)
    with torch.no_grad():
        assert (model(x) - exact(x)).abs().max() > 1e-4


@pytest.mark.parametrize("activation", ["gelu_new", "gelu", "relu", "relu2"])
def test_a_transformers_gpt2_loads_with_its_logits(tmp_path, activation):
    config = transformers.GPT2Config(
        vocab_size=96, n_positions=40, n_embd=24, n_layer=2, n_head=3, activation_function=activation,
        bos_token_id=5, eos_token_id=5,
    )  # fmt: skip
    torch.manual_seed(0)
    hf = large(transformers.GPT2LMHeadModel(config)).eval()
    hf.save_pretrained(tmp_path)
    model = load_hf_gpt2(tmp_path)
    assert model.config.activation == {"gelu_new": "gelu_tanh"}.get(activation, activation)
    assert (model.config.pad_token_id, model.config.eos_token_id, model.config.ff_dim) == (None, 5, 96)
    x = tokens(3, 40, vocab=96)
    with torch.no_grad():
        close(model(x), hf(x).logits)


@pytest.mark.parametrize(
    "field, value",
    [
        ("norm_position", "post"),
        ("positions", "sinusoidal"),
        ("topology", "encoder_decoder"),
        ("scale_embeddings", True),
        ("bias", False),
        ("tie_embeddings", False),
        ("norm", "rmsnorm"),  # its norms have no biases: the export ended in a KeyError for ln_f.bias
    ],
)
def test_gpt2_refuses_what_it_cannot_express(tmp_path, field, value):
    cfg = TransformerConfig.preset("tiny", **{field: value})
    assert any(p.startswith(f"{field}=") for p in gpt2_problems(cfg))
    with pytest.raises(ValueError, match=f"{field}={value!r}: GPT-2 can only express") as refusal:
        save_hf_gpt2(Transformer(cfg), tmp_path)
    assert "export --format safetensors (this package's folder) keeps any model, --format onnx any model of text" in (
        str(refusal.value)
    )
    assert not (tmp_path / "model.safetensors").exists()


@pytest.mark.parametrize(
    "option, value",
    [("activation_function", "silu"), ("scale_attn_by_inverse_layer_idx", True), ("tie_word_embeddings", False)],
)
def test_load_refuses_gpt2_options_we_lack(tmp_path, option, value):
    save_hf_gpt2(build(GPT2, pad_token_id=None), tmp_path)
    config = transformers.GPT2Config.from_pretrained(tmp_path)
    setattr(config, option, value)
    config.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=option):
        load_hf_gpt2(tmp_path)


def test_a_hub_name_offline_fails_at_once(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConnectionError, match="'gpt2'.*offline.*local folder"):
        load_hf_gpt2("gpt2")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_hf_gpt2("./no/such/folder")


def test_a_hub_model_downloaded_before_loads_offline_from_the_cache(tmp_path, monkeypatch):
    """`hf download NAME` then HF_HUB_OFFLINE=1 (Hugging Face's offline workflow): init_from NAME reads the cache."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    model = build(GPT2, pad_token_id=None)
    snapshot = tmp_path / "hub" / "models--acme--tiny-gpt2" / "snapshots" / ("0" * 40)
    save_hf_gpt2(model, snapshot)
    (tmp_path / "hub" / "models--acme--tiny-gpt2" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--tiny-gpt2" / "refs" / "main").write_text("0" * 40)
    loaded = load_hf_gpt2("acme/tiny-gpt2")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
    with pytest.raises(
        ConnectionError, match=r"'acme/other'.*not in the local Hugging Face cache.*hf download acme/other"
    ):
        load_hf_gpt2("acme/other")


def test_a_cached_hub_name_is_read_as_the_architecture_its_config_names(tmp_path, tokenizer, monkeypatch):
    """`--model.init_from Helsinki-NLP/opus-mt-en-es` was read as GPT-2 ("Cannot load GPT-2 model ..."): the
    architecture came from the name's config.json before the name was a folder. The name's folder is found first
    (here in the offline cache), and its config.json says Marian."""
    from lit_transformer.interop.pretrained import load_hf_model, load_init_from

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    model = build({**PAPER, "scale_embeddings": True}, vocab_size=tokenizer.get_vocab_size())
    repo = tmp_path / "hub" / "models--acme--opus-mt-tiny"
    save_hf_marian(model, repo / "snapshots" / ("0" * 40), tokenizer)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    loaded = load_hf_model("acme/opus-mt-tiny")
    assert loaded.config.is_encoder_decoder
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
    started, _ = load_init_from("acme/opus-mt-tiny", model.config)
    assert started.config.is_encoder_decoder


# ---- the paper's encoder-decoder as Marian ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "variant",
    [
        {**PAPER, "scale_embeddings": True, "tie_embeddings": True},  # the paper: three-way tying
        {**PAPER, "scale_embeddings": True, "tie_embeddings": False, "activation": "gelu_tanh"},
        {**PAPER, "scale_embeddings": False, "target_vocab_size": 100, "activation": "gelu"},
        # zero_init_output is an initialisation: the trained (here: random) model is a Marian like any other.
        {**PAPER, "scale_embeddings": True, "tie_embeddings": False, "activation": "relu2", "zero_init_output": True},
        # Marian has no grouped-query attention: each key/value head is written once per query head it serves.
        {**PAPER, "scale_embeddings": True, "n_kv_heads": 2},
        {**PAPER, "scale_embeddings": True, "n_kv_heads": 1},
    ],
    ids=["paper", "untied-gelu_tanh", "two-vocabularies-gelu", "untied-relu2-zero_init_output", "gqa", "mqa"],
)
def test_the_paper_model_is_a_marian_with_our_logits(tmp_path, variant):
    model = large(build(variant, init="xavier"), std=0.3)
    save_hf_marian(model, tmp_path)
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert type(hf).__name__ == "MarianMTModel"
    src = tokens(2, 11)
    src[1, 7:] = 0  # right padding, masked on both sides
    tgt = tokens(2, 9, seed=2, vocab=100)
    tgt[:, 0] = 1  # BOS
    with torch.no_grad():
        ours = model(src, tgt, src_mask=src.ne(0))
        theirs = hf(input_ids=src, attention_mask=src.ne(0), decoder_input_ids=tgt).logits
    close(ours, theirs)
    assert ours.abs().max() > 1


def test_marian_generates_our_translations(tmp_path, tokenizer):
    model = build({**PAPER, "scale_embeddings": True}, vocab_size=tokenizer.get_vocab_size(), init="xavier")
    save_hf_marian(model, tmp_path, tokenizer)
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
    texts = ["In the beginning", "God created the heaven and the earth."]
    batch = hf_tok(texts, return_tensors="pt", padding=True)
    eos = model.config.eos_token_id
    assert batch["input_ids"][0].tolist()[: len(texts[0]) + 1] == tokenizer.encode(texts[0]).ids + [eos]
    with torch.no_grad():
        for beams in (1, 3):
            theirs = hf.generate(**batch, max_new_tokens=12, num_beams=beams, do_sample=False)
            ours = model.generate(
                batch["input_ids"], max_new_tokens=12, num_beams=beams, attention_mask=batch["attention_mask"]
            )
            # transformers returns the start token first and pads finished rows; compare up to each row's EOS.
            assert _until_eos(theirs[:, 1:], eos) == _until_eos(ours, eos)
    decoded = hf_tok.batch_decode(theirs, skip_special_tokens=True)
    assert decoded == tokenizer.decode_batch(_until_eos(ours, eos), skip_special_tokens=True)


def _until_eos(ids: torch.Tensor, eos: int) -> list[list[int]]:
    return [row[: row.index(eos) + 1] if eos in row else row for row in ids.tolist()]


@pytest.mark.parametrize(
    "field, value, extra",
    [
        ("norm_position", "pre", {}),
        ("positions", "learned", {}),
        ("topology", "decoder_only", {}),
        ("norm", "rmsnorm", {}),  # no LayerNorm biases: the export ended in a KeyError
        ("source", "features", {"source_dim": 8}),  # a captioning encoder has no token table: a KeyError too
        ("source", "patches", {"image_size": (32, 32)}),
    ],
)
def test_marian_refuses_what_it_cannot_express(tmp_path, field, value, extra):
    cfg = TransformerConfig.preset("tiny", **{**PAPER, field: value, **extra})
    assert any(p.startswith(f"{field}=") for p in marian_problems(cfg))
    with pytest.raises(ValueError, match=f"{field}={value!r}: Marian can only express"):
        save_hf_marian(Transformer(cfg), tmp_path)


# ---- the speedrun's switches that no Hugging Face layout holds ----------------------------------------------------


FRONTIER_REFUSALS = {
    "qk_norm": (True, "has no norm of queries and keys"),
    "logit_softcap": (15.0, "has no soft cap on its logits"),
    "value_residual": (True, "has no value residual in its attention"),
}


@pytest.mark.parametrize("field", FRONTIER_REFUSALS)
@pytest.mark.parametrize("layout", ["GPT-2", "Llama", "Marian"])
def test_hf_exports_refuse_a_switch_they_cannot_hold_in_one_line_naming_it(tmp_path, layout, field):
    from lit_transformer.interop import llama_problems, save_hf_llama

    value, lacks = FRONTIER_REFUSALS[field]
    base = {
        "GPT-2": GPT2,
        "Llama": {**GPT2, "positions": "rope", "norm": "rmsnorm", "activation": "swiglu"},
        "Marian": {**PAPER, "layer_norm_eps": 1e-5},
    }[layout]
    cfg = TransformerConfig.preset("tiny", **base, **{field: value})
    problems = {"GPT-2": gpt2_problems, "Llama": llama_problems, "Marian": marian_problems}[layout](cfg)
    assert problems == [
        f"{field}={value!r}: {layout} {lacks}; the native format (export --format safetensors) and ONNX keep it"
    ]
    save = {"GPT-2": save_hf_gpt2, "Llama": save_hf_llama, "Marian": save_hf_marian}[layout]
    with pytest.raises(ValueError, match=f"cannot be saved as a Hugging Face.*\\n  - {field}="):
        save(Transformer(cfg), tmp_path)
    assert not (tmp_path / "model.safetensors").exists()


def test_a_gpt2_folder_loaded_over_a_base_with_the_switches_is_a_plain_gpt2(tmp_path):
    """The folder decides the architecture: a base config's qk_norm, value_residual, cap and zero init are not
    GPT-2's (its weights have no norms of queries and keys, and its output is tied)."""
    model = build({**GPT2, "activation": "relu2"}, pad_token_id=None)
    save_hf_gpt2(model, tmp_path)
    base = TransformerConfig.preset(
        "tiny", qk_norm=True, value_residual=True, logit_softcap=15.0, zero_init_output=True, tie_embeddings=False
    )
    loaded = load_hf_gpt2(tmp_path, base=base)
    cfg = loaded.config
    assert (cfg.qk_norm, cfg.value_residual, cfg.logit_softcap, cfg.zero_init_output) == (False, False, None, False)
    x = tokens(2, 10)
    with torch.no_grad():
        close(loaded(x), model(x))


@pytest.mark.parametrize(
    "block",
    [
        {"norm": "rmsnorm"},
        {"n_kv_heads": 2},
        # configs/base.yaml's block, the recipe of docs/finetuning.md's peft section
        {"norm": "rmsnorm", "positions": "rope", "activation": "swiglu", "d_ff": 352, "n_kv_heads": 1},
    ],
    ids=["rmsnorm", "gqa", "base.yaml"],
)
def test_a_gpt2_folder_loaded_over_a_base_of_another_block_is_the_folders_gpt2(tmp_path, block):
    """The folder decides the architecture: a run config's RMSNorm or grouped-query attention is not GPT-2's (its
    LayerNorms have biases, its attention a K/V head per query head). Both ended in load_state_dict's errors."""
    model = large(build(GPT2, pad_token_id=None))
    save_hf_gpt2(model, tmp_path)
    loaded = load_hf_gpt2(tmp_path, base=TransformerConfig.preset("tiny", **{**GPT2, **block}))
    cfg = loaded.config
    assert (cfg.norm, cfg.n_kv_heads, cfg.positions, cfg.activation) == ("layernorm", None, "learned", "gelu_tanh")
    x = tokens(2, 10)
    with torch.no_grad():
        close(loaded(x), model(x))


# ---- safetensors, ONNX and the export command ------------------------------------------------------------------


@pytest.mark.parametrize("variant", [{**GPT2, "tie_embeddings": True}, {**PAPER, "scale_embeddings": True}])
def test_safetensors_folder_round_trips(tmp_path, tokenizer, variant):
    model = large(build(variant))
    save_safetensors(model, tmp_path, tokenizer)
    assert {p.name for p in tmp_path.iterdir()} == {"model.safetensors", "config.json", "tokenizer.json"}
    back = load_safetensors(tmp_path)
    assert back.config == model.config
    x = tokens(2, 10)
    with torch.no_grad():
        y, z = (model(x, x), back(x, x)) if model.config.is_encoder_decoder else (model(x), back(x))
    torch.testing.assert_close(y, z, atol=0, rtol=0)


def _checkpoint(path: Path, model: Transformer, tokenizer) -> Path:
    """A checkpoint as LitTransformer writes it: the model under "model.", the config and the tokenizer."""
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    torch.save(
        {"state_dict": state, "hyper_parameters": {"config": model.config}, "tokenizer": tokenizer.to_str()}, path
    )
    return path


def test_the_export_command_refuses_a_switch_hf_cannot_hold_in_a_few_lines_and_writes_it_natively(tmp_path, tokenizer):
    from test_cli import _cli

    model = build({**GPT2, "qk_norm": True}, vocab_size=tokenizer.get_vocab_size(), pad_token_id=None)
    ckpt = _checkpoint(tmp_path / "last.ckpt", model, tokenizer)
    result = _cli(
        "export", "--checkpoint", str(ckpt), "--format", "hf", "--out", str(tmp_path / "hf"), cwd=tmp_path, ok=False
    )
    assert "- qk_norm=True: GPT-2 has no norm of queries and keys" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "hf" / "model.safetensors").exists()
    _cli(
        "export", "--checkpoint", str(ckpt), "--format", "safetensors", "--out", str(tmp_path / "native"), cwd=tmp_path
    )
    x = tokens(2, 10, vocab=tokenizer.get_vocab_size())
    with torch.no_grad():
        torch.testing.assert_close(load_safetensors(tmp_path / "native")(x), model(x), atol=0, rtol=0)


def test_export_command_writes_every_format(tmp_path, tokenizer, capsys):
    ort = pytest.importorskip("onnxruntime")
    model = large(build(GPT2, vocab_size=tokenizer.get_vocab_size(), pad_token_id=None))
    ckpt = _checkpoint(tmp_path / "last.ckpt", model, tokenizer)
    for fmt in ("hf", "safetensors", "onnx"):
        export_main(["--checkpoint", str(ckpt), "--format", fmt, "--out", str(tmp_path / fmt)])
        assert "Wrote" in capsys.readouterr().out
    x = tokens(2, 16, vocab=tokenizer.get_vocab_size())
    with torch.no_grad():
        expected = model(x)
        close(transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf")(x).logits, expected)
        close(load_safetensors(tmp_path / "safetensors")(x), expected)
    session = ort.InferenceSession(str(tmp_path / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    for batch, length in ((1, 1), (2, 16), (3, model.config.max_seq_len)):  # dynamic batch and sequence axes
        x = tokens(batch, length, vocab=tokenizer.get_vocab_size())
        (logits,) = session.run(["logits"], {"input_ids": x.numpy()})
        with torch.no_grad():
            torch.testing.assert_close(torch.from_numpy(logits), model(x), atol=1e-4, rtol=1e-4)
    # The decoding graph beside it (past K/V, learned positions): onnxruntime greedy decoding gives our tokens.
    assert {"model.onnx", "decoder.onnx", "onnx.json", "tokenizer.json"} <= {
        p.name for p in (tmp_path / "onnx").iterdir()
    }
    x = tokens(2, 6, vocab=tokenizer.get_vocab_size())
    ours = model.generate(x, max_new_tokens=12)
    assert torch.equal(OnnxModel(tmp_path / "onnx", threads=1).generate(x, max_new_tokens=12), ours)


def test_export_command_sends_the_encoder_decoder_to_marian(tmp_path, tokenizer):
    model = build({**PAPER, "scale_embeddings": True}, vocab_size=tokenizer.get_vocab_size())
    ckpt = _checkpoint(tmp_path / "last.ckpt", model, tokenizer)
    export_main(["--checkpoint", str(ckpt), "--format", "hf", "--out", str(tmp_path / "hf")])
    assert transformers.AutoConfig.from_pretrained(tmp_path / "hf").model_type == "marian"


# ---- fine-tuning from a GPT-2 folder ---------------------------------------------------------------------------


def test_init_from_takes_architecture_weights_and_records_them(tmp_path, tokenizer):
    from lit_transformer.engine.lightning_module import LitTransformer

    pretrained = large(build({**GPT2, "activation": "gelu_tanh"}, n_layers=3, d_model=48, pad_token_id=None))
    save_hf_gpt2(pretrained, tmp_path, tokenizer)
    lit = LitTransformer(TransformerConfig.preset("tiny", dropout=0.2), init_from=str(tmp_path))
    assert lit.config.n_layers == 3 and lit.config.d_model == 48 and lit.config.pad_token_id is None
    assert lit.config.dropout == 0.2  # training choices stay the user's
    assert lit.hparams.config == lit.config  # a checkpoint rebuilds the pretrained architecture
    x = tokens(2, 12)
    with torch.no_grad():
        close(lit.model.eval()(x), pretrained(x))


def test_fit_init_from_a_gpt2_folder(tmp_path, tokenizer):
    from lit_transformer.cli.lightning_cli import run_cli

    pretrained = large(build(GPT2, pad_token_id=None))
    folder = save_hf_gpt2(pretrained, tmp_path / "gpt2", tokenizer)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("To be, or not to be, that is the question.\n" * 200)
    cli = run_cli(
        [
            "fit",
            "--config", str(Path(__file__).parents[1] / "configs" / "presets" / "tiny.yaml"),
            "--model.init_from", str(folder),
            "--model.lr", "0",  # the weights stay the pretrained ones, so the logits can be checked
            "--data.init_args.dataset", str(corpus),
            "--data.init_args.tokenizer", str(folder / "tokenizer.json"),
            "--data.init_args.cache_dir", str(tmp_path / "cache"),
            "--trainer.fast_dev_run", "1",
            "--trainer.default_root_dir", str(tmp_path / "run"),
            "--trainer.logger.init_args.save_dir", str(tmp_path / "run"),
        ]
    )  # fmt: skip
    assert cli.model.tokenizer.to_str() == transformers.AutoTokenizer.from_pretrained(folder).backend_tokenizer.to_str()
    x = tokens(2, 12)
    with torch.no_grad():
        close(cli.model.model.eval()(x), pretrained(x))


def test_a_checkpoint_of_an_init_from_model_loads_without_the_folder(tmp_path, tokenizer):
    """The folder is read once: the checkpoint holds the resolved architecture, init_from=None, and the source."""
    import lightning

    from lit_transformer.engine.lightning_module import LitTransformer

    folder = tmp_path / "gpt2"
    pretrained = large(build({**GPT2, "activation": "gelu_tanh"}, n_layers=3, d_model=48, pad_token_id=None))
    save_hf_gpt2(pretrained, folder, tokenizer)
    lit = LitTransformer(TransformerConfig.preset("tiny", dropout=0.2), init_from=str(folder))
    assert lit.hparams.init_from is None and lit.hparams.config == lit.config
    checkpoint = {
        "state_dict": lit.state_dict(),
        "hyper_parameters": dict(lit.hparams),
        "pytorch-lightning_version": lightning.__version__,
    }
    lit.on_save_checkpoint(checkpoint)
    assert checkpoint["init_from"] == str(folder)
    torch.save(checkpoint, tmp_path / "last.ckpt")
    shutil.rmtree(folder)
    loaded = LitTransformer.load_from_checkpoint(tmp_path / "last.ckpt", weights_only=True)
    assert loaded.config == lit.config and loaded.init_from == str(folder)
    x = tokens(2, 12)
    with torch.no_grad():
        close(loaded.model.eval()(x), pretrained(x))


def test_resuming_an_init_from_run_does_not_read_the_folder_again(tmp_path, tokenizer):
    """fit --ckpt_path FILE takes init_from=None and the resolved config from the checkpoint: the folder may be gone."""
    from lit_transformer.checkpoints.files import load_checkpoint
    from lit_transformer.cli.lightning_cli import run_cli

    pretrained = large(build(GPT2, vocab_size=tokenizer.get_vocab_size(), pad_token_id=None))
    folder = save_hf_gpt2(pretrained, tmp_path / "gpt2", tokenizer)
    shutil.copy(folder / "tokenizer.json", tmp_path / "tokenizer.json")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("To be, or not to be, that is the question.\n" * 200)

    def fit(steps: int, *extra: str):
        return run_cli(
            [
                "fit",
                "--config", str(Path(__file__).parents[1] / "configs" / "presets" / "tiny.yaml"),
                "--model.init_from", str(folder),
                "--data.init_args.dataset", str(corpus),
                "--data.init_args.tokenizer", str(tmp_path / "tokenizer.json"),
                "--data.init_args.cache_dir", str(tmp_path / "cache"),
                "--trainer.max_steps", str(steps),
                "--trainer.limit_val_batches", "0",
                "--trainer.default_root_dir", str(tmp_path / "run"),
                "--trainer.logger", "false",
                "--checkpoint.dirpath", str(tmp_path / "ckpt"),
                "--checkpoint.every_n_train_steps", "1",
                *extra,
            ]
        )  # fmt: skip

    resolved = fit(1).model.config
    assert resolved.pad_token_id is None  # the folder's, not the tiny preset's
    hparams = load_checkpoint(tmp_path / "ckpt" / "last.ckpt")["hyper_parameters"]
    assert hparams["init_from"] is None and TransformerConfig(**hparams["config"]) == resolved
    shutil.rmtree(folder)
    resumed = fit(2, "--ckpt_path", str(tmp_path / "ckpt" / "last.ckpt"))
    assert resumed.trainer.global_step == 2 and resumed.model.init_from == str(folder)
    resumed = fit(3, "--ckpt_path", "last")  # "last" names the same kind of file: its hyperparameters apply too
    assert resumed.trainer.global_step == 3 and resumed.model.init_from == str(folder)


LLAMA = {"topology": "decoder_only", "positions": "rope", "norm": "rmsnorm", "activation": "swiglu", "bias": False}


@pytest.mark.parametrize("fmt", ["hf", "safetensors"])
@pytest.mark.parametrize("arch", ["gpt2", "llama", "paper"])
def test_a_model_folder_serves_as_its_checkpoint_does(tmp_path, tokenizer, capsys, fmt, arch):
    """generate, translate, serve and export read a model folder (an export, a Hugging Face download) as they read
    the checkpoint it came from: the same model, tokenizer and task, so the same printed continuation."""
    from lit_transformer.cli.model_commands import generate_main, translate_main
    from lit_transformer.inference import load_model
    from lit_transformer.serving.handlers import handler_kind

    spec = {"gpt2": GPT2, "llama": LLAMA, "paper": {**PAPER, "scale_embeddings": True}}[arch]
    ids = {} if arch == "paper" else {"pad_token_id": None}  # Marian pads; GPT-2 and Llama name no padding token
    model = large(build(spec, vocab_size=tokenizer.get_vocab_size(), **ids), std=0.2)
    ckpt = _checkpoint(tmp_path / "last.ckpt", model, tokenizer)
    export_main(["--checkpoint", str(ckpt), "--format", fmt, "--out", str(tmp_path / fmt)])
    from_checkpoint, from_folder = load_model(ckpt), load_model(tmp_path / fmt)
    assert type(from_folder.task) is type(from_checkpoint.task)
    assert handler_kind(from_folder.task) is handler_kind(from_checkpoint.task) is not None  # `serve` has its route
    x = tokens(2, 8, vocab=tokenizer.get_vocab_size())
    with torch.no_grad():
        close(
            from_folder.model(x, x) if arch == "paper" else from_folder.model(x),
            model(x, x) if arch == "paper" else model(x),
        )
    command, text = (translate_main, "--text") if arch == "paper" else (generate_main, "--prompt")
    printed = []
    for path in (ckpt, tmp_path / fmt):
        capsys.readouterr()
        command(["--checkpoint", str(path), text, "hello there", "--max_new_tokens", "8", "--temperature", "0"]
                + ["--num_beams", "1", "--eos_token_id", "-1"])  # fmt: skip
        printed.append(capsys.readouterr().out)
    assert printed[0] == printed[1] and printed[0].strip()
    (tmp_path / fmt / "tokenizer.json").unlink()  # a download without the `tokenizers` file: said, with the fix
    with pytest.raises(UserError, match=r"holds no tokenizer.json: .*backend_tokenizer.save|holds neither tokenizer"):
        load_model(tmp_path / fmt)


def test_generate_takes_a_hub_name_downloaded_before_and_names_one_it_cannot_get(tmp_path, tokenizer, capsys,
                                                                                 monkeypatch):  # fmt: skip
    """`generate --checkpoint gpt2` (a transformers user's first command) was "Checkpoint gpt2 does not exist ... No
    .ckpt files in .": a hub name is read as `init_from` reads one, from the hub or (offline) the local Hugging Face
    cache, and one found in neither place is named as both."""
    from lit_transformer.cli.model_commands import generate_main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    model = large(build(GPT2, vocab_size=tokenizer.get_vocab_size(), pad_token_id=None), std=0.2)
    ckpt = _checkpoint(tmp_path / "last.ckpt", model, tokenizer)
    snapshot = tmp_path / "hub" / "models--acme--tiny-gpt2" / "snapshots" / ("0" * 40)
    export_main(["--checkpoint", str(ckpt), "--format", "hf", "--out", str(snapshot)])
    (tmp_path / "hub" / "models--acme--tiny-gpt2" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--tiny-gpt2" / "refs" / "main").write_text("0" * 40)
    printed = []
    for path in (str(ckpt), "acme/tiny-gpt2"):
        capsys.readouterr()
        generate_main(["--checkpoint", path, "--prompt", "hello there", "--max_new_tokens", "8", "--temperature", "0"])
        printed.append(capsys.readouterr().out)
    assert printed[0] == printed[1] and printed[0].strip()
    with pytest.raises(UserError, match=r"acme/other: no such file or folder here; as a hub name: .*not in the local"):
        generate_main(["--checkpoint", "acme/other", "--prompt", "hello"])


def test_a_classifier_exported_as_safetensors_keeps_its_task_and_labels(tmp_path, tokenizer):
    """task.json carries what the checkpoint records of its task: the folder predicts the checkpoint's label names,
    and `serve` routes it as a classifier."""
    from lit_transformer.inference import load_model
    from lit_transformer.serving.handlers import handler_kind

    model = build({"topology": "encoder_only", "head": "classification"}, vocab_size=104, num_labels=3)
    ckpt = _checkpoint(tmp_path / "last.ckpt", model, tokenizer)
    checkpoint = torch.load(ckpt, weights_only=False)
    task = {"class_path": "lit_transformer.tasks.classification.Classification", "init_args": {"label_smoothing": 0.1}}
    checkpoint["hyper_parameters"]["task"] = task
    checkpoint["label_names"] = ["comedy", "history", "tragedy"]
    torch.save(checkpoint, ckpt)
    export_main(["--checkpoint", str(ckpt), "--format", "safetensors", "--out", str(tmp_path / "st")])
    folder, trained = load_model(tmp_path / "st"), load_model(ckpt)
    assert folder.task.names() == trained.task.names() == ["comedy", "history", "tragedy"]
    assert folder.task.spec() == trained.task.spec() and handler_kind(folder.task) is handler_kind(trained.task)
    (tmp_path / "st" / "task.json").unlink()  # an export of an earlier version: the architecture's task, labels as ids
    assert load_model(tmp_path / "st").task.names() == ["0", "1", "2"]


def test_a_checkpoint_path_without_its_suffix_is_not_taken_for_a_hub_name(tmp_path, tokenizer, monkeypatch) -> None:
    """`generate --checkpoint checkpoints/last` (the .ckpt left out) was read as the hub name `checkpoints/last` and
    answered with `hf download checkpoints/last`; a name whose folder is here is a local path, refused with that
    folder's checkpoints, as before hub names were taken. `owner/name` with no folder `owner` here is still a hub name."""
    from lit_transformer.cli.model_commands import generate_main
    from lit_transformer.inference import hub_name

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    model = build(GPT2, vocab_size=tokenizer.get_vocab_size(), pad_token_id=None)
    (tmp_path / "checkpoints").mkdir()
    _checkpoint(tmp_path / "checkpoints" / "last.ckpt", model, tokenizer)
    assert not hub_name("checkpoints/last") and hub_name("acme/tiny-gpt2") and hub_name("gpt2")
    with pytest.raises(UserError, match=r"checkpoints/last does not exist .*last\.ckpt"):
        generate_main(["--checkpoint", "checkpoints/last", "--prompt", "hello"])
