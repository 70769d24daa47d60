"""`export --format peft`: a LoRA run from a Hugging Face GPT-2 or Llama folder (fine-tuned a few steps through the
CLI) written as peft's adapter folder, which `PeftModel.from_pretrained` applies to the base transformers loads from
that folder, with the LoRA model's logits to 1e-5; and the runs it cannot write refused in one line that points to the
merged export. Tiny bases built in tmp folders, no hub."""

from __future__ import annotations

import io
import json
import string
from contextlib import redirect_stderr
from pathlib import Path

import pytest
import torch
from model_variants import build, single_thread, tokens  # noqa: F401 (autouse fixture)
from test_cli import CONFIGS, ROOT, _cli

pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning", "ignore::UserWarning")

GPT2 = {"topology": "decoder_only", "norm_position": "pre", "positions": "learned"}
LLAMA = {**GPT2, "positions": "rope", "norm": "rmsnorm", "activation": "swiglu", "n_kv_heads": 2, "bias": False}
EVERY_LAYER = "[qkv, out, up, down]"


@pytest.fixture(scope="module")
def tokenizer():
    from lit_transformer.data.text import train_tokenizer

    return train_tokenizer([string.printable * 3], kind="char", vocab_size=128)


def _lora_run(tmp: Path, folder: Path, *lora: str, config: Path = CONFIGS / "presets" / "tiny.yaml") -> Path:
    """Two LoRA steps through the CLI from the Hugging Face folder (its tokenizer as the data's), a large step so the
    adapters move well away from their zero start."""
    corpus = tmp / "corpus.txt"
    corpus.write_text("To be, or not to be, that is the question.\n" * 100)
    _cli(
        "fit", "--config", str(config), "--config", str(CONFIGS / "finetune" / "lora.yaml"),
        "--model.init_from", str(folder), "--model.lora.rank", "4", "--model.optim.lr", "0.05", *lora,
        "--data.init_args.dataset", str(corpus), "--data.init_args.tokenizer", str(folder / "tokenizer.json"),
        "--data.init_args.cache_dir", str(tmp / "cache"), "--trainer.max_steps", "2", "--trainer.limit_val_batches", "0",
        "--trainer.default_root_dir", str(tmp / "run"), "--trainer.logger", "false",
        "--checkpoint.dirpath", str(tmp / "ckpt"), "--checkpoint.every_n_train_steps", "2", cwd=ROOT,
    )  # fmt: skip
    return tmp / "ckpt" / "last.ckpt"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("family", "variant", "lora"),
    [
        ("gpt2", GPT2, ["--model.lora.target_modules", EVERY_LAYER]),
        ("llama", LLAMA, ["--model.lora.target_modules", EVERY_LAYER]),
        ("gpt2", GPT2, ["--model.lora.target_modules", "[decoder_blocks.1.self_attn.qkv]"]),  # one layer of one block
    ],
    ids=["gpt2", "llama", "gpt2-one-layer"],
)
def test_peft_loads_the_adapters_on_the_base_with_our_logits(tmp_path, tokenizer, family, variant, lora):
    from peft import PeftModel

    from lit_transformer.engine.lightning_module import LitTransformer
    from lit_transformer.interop import save_hf_gpt2, save_hf_llama

    save = save_hf_gpt2 if family == "gpt2" else save_hf_llama
    base = build(variant, vocab_size=tokenizer.get_vocab_size(), pad_token_id=None)
    folder = save(base, tmp_path / family, tokenizer)
    checkpoint = _lora_run(tmp_path, folder, *lora)
    out = tmp_path / "adapter"
    printed = _cli("export", "--checkpoint", str(checkpoint), "--format", "peft", "--out", str(out), cwd=ROOT).stdout
    assert f"Wrote {out}" in printed
    assert sorted(p.name for p in out.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (4, 16.0, "LORA")
    assert config["base_model_name_or_path"] == str(folder) and config["fan_in_fan_out"] == (family == "gpt2")
    ours = LitTransformer.load_from_checkpoint(checkpoint, weights_only=True).model.eval()  # adapted, unmerged
    hf_base = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    x = tokens(2, 16, vocab=60)
    with torch.no_grad():
        before = hf_base(x).logits
        adapted = PeftModel.from_pretrained(hf_base, out).eval()
        expected = ours(x)[..., : tokenizer.get_vocab_size()]
        torch.testing.assert_close(adapted(x).logits, expected, atol=1e-5, rtol=1e-5)
    assert (before - expected).abs().max() > 1e-3  # the adapters changed the model: the check has teeth
    if "decoder_blocks.1" in lora[1]:
        assert config["target_modules"] == ["transformer.h.1.attn.c_attn"]
    else:
        names = {"gpt2": ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"],
                 "llama": ["mlp.down_proj", "mlp.gate_proj", "mlp.up_proj", "self_attn.k_proj", "self_attn.o_proj",
                           "self_attn.q_proj", "self_attn.v_proj"]}  # fmt: skip
        assert sorted(config["target_modules"]) == names[family]


def _refusal(*args: str) -> str:
    from lit_transformer.cli.program import main

    err = io.StringIO()
    with redirect_stderr(err), pytest.raises(SystemExit):
        main(["export", *args])
    lines = err.getvalue().strip().splitlines()
    assert 1 <= len(lines) <= 2, err.getvalue()
    return err.getvalue()


def _checkpoint(path: Path, config, state: dict, base: str | None, **hparams) -> Path:
    """A checkpoint as a LoRA (base given) or full run writes it, without a run."""
    checkpoint = {"state_dict": state, "hyper_parameters": {"config": config, **hparams}}
    if base is not None:
        checkpoint["lora"] = {"base": base, "fingerprint": "0" * 16}
        checkpoint["hyper_parameters"]["lora"] = {"rank": 2, "alpha": 4.0, "dropout": 0.0,
                                                  "target_modules": ["qkv"], "trainable": []}  # fmt: skip
    torch.save(checkpoint, path)
    return path


def test_what_peft_cannot_load_is_refused_in_one_line_pointing_to_the_merged_export(tmp_path):
    from lit_transformer.config import TransformerConfig

    adapter = {"model.decoder_blocks.0.self_attn.qkv.lora_A.default.weight": torch.zeros(2, 32)}
    adapter["model.decoder_blocks.0.self_attn.qkv.lora_B.default.weight"] = torch.zeros(96, 2)
    gpt2 = TransformerConfig.preset("tiny", **GPT2)
    out = ["--format", "peft", "--out", str(tmp_path / "adapter")]
    ours = _checkpoint(tmp_path / "ours.ckpt", gpt2, adapter, base="runs/shakespeare/checkpoints/last.ckpt")
    assert "no Hugging Face form" in (text := _refusal("--checkpoint", str(ours), *out)) and "--format hf" in text
    marian = TransformerConfig.preset("tiny", topology="encoder_decoder")
    seq2seq = _checkpoint(tmp_path / "marian.ckpt", marian, adapter, base=str(tmp_path / "opus-mt"))
    assert (
        "encoder-decoder (Marian)" in (text := _refusal("--checkpoint", str(seq2seq), *out)) and "--format hf" in text
    )
    extras = {**adapter, "model.decoder_norm.weight": torch.ones(32)}
    full_norm = _checkpoint(tmp_path / "norms.ckpt", gpt2, extras, base="gpt2")
    assert "decoder_norm.weight in full" in (text := _refusal("--checkpoint", str(full_norm), *out))
    assert "--format hf" in text
    full = _checkpoint(tmp_path / "full.ckpt", gpt2, {}, base=None)
    assert "holds no LoRA adapters" in _refusal("--checkpoint", str(full), *out)
    from lit_transformer.cli.model_commands import export_main
    from lit_transformer.errors import ConfigError

    with pytest.raises(ConfigError, match="safetensors or onnx, not peft"):
        export_main(["--checkpoint", str(ours), *out, "--quantize", "int8"])
    assert not (tmp_path / "adapter").exists()


@pytest.mark.slow
def test_the_docs_recipe_adapts_a_gpt2_folder_with_base_yaml_and_peft_loads_it(tmp_path, tokenizer):
    """docs/finetuning.md's peft recipe as written: configs/base.yaml (RMSNorm, rotary, SwiGLU, Muon) and lora.yaml
    from a GPT-2 folder, which decides the architecture (a GPT-2, LayerNorm and all); the run ended in load_state_dict's
    unexpected LayerNorm biases. Its adapters, exported, give peft's model the LoRA model's logits."""
    from peft import PeftModel

    from lit_transformer.engine.lightning_module import LitTransformer
    from lit_transformer.interop import save_hf_gpt2

    gpt2 = build(GPT2, vocab_size=tokenizer.get_vocab_size(), pad_token_id=None, max_seq_len=128)  # base's blocks
    folder = save_hf_gpt2(gpt2, tmp_path / "gpt2", tokenizer)
    checkpoint = _lora_run(tmp_path, folder, config=CONFIGS / "base.yaml")
    out = tmp_path / "adapter"
    _cli("export", "--checkpoint", str(checkpoint), "--format", "peft", "--out", str(out), cwd=ROOT)
    adapted = json.loads((out / "adapter_config.json").read_text())["target_modules"]
    assert sorted(adapted) == ["attn.c_attn", "attn.c_proj"]  # lora.yaml's qkv and out
    ours = LitTransformer.load_from_checkpoint(checkpoint, weights_only=True).model.eval()
    assert (ours.config.norm, ours.config.positions, ours.config.activation) == ("layernorm", "learned", "gelu_tanh")
    hf_base = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    x = tokens(2, 16, vocab=60)
    with torch.no_grad():
        before = hf_base(x).logits
        expected = ours(x)[..., : tokenizer.get_vocab_size()]
        torch.testing.assert_close(PeftModel.from_pretrained(hf_base, out).eval()(x).logits, expected, atol=1e-5,
                                   rtol=1e-5)  # fmt: skip
    assert (before - expected).abs().max() > 1e-3


@pytest.mark.slow
def test_export_base_is_checked_by_its_fingerprint(tmp_path, tokenizer):
    """`export --format peft --base PATH` (the base moved): PATH is recorded as the adapters' base, so it must be their
    base, as `--base` is for generate and the other exports. Another model's folder there failed with a RuntimeError
    deep in the renaming (or, where the shapes fit, wrote the adapters under another model's layer names), and a path
    that does not exist was written into adapter_config.json without a word."""
    import shutil

    from lit_transformer.interop import save_hf_gpt2, save_hf_llama

    vocab = tokenizer.get_vocab_size()
    folder = save_hf_gpt2(build(GPT2, vocab_size=vocab, pad_token_id=None), tmp_path / "gpt2", tokenizer)
    checkpoint = _lora_run(tmp_path, folder, "--model.lora.target_modules", EVERY_LAYER)
    llama = save_hf_llama(build(LLAMA, vocab_size=vocab, pad_token_id=None), tmp_path / "llama", tokenizer)
    out = ["--checkpoint", str(checkpoint), "--format", "peft", "--out", str(tmp_path / "adapter")]
    assert "trained on other base weights" in _refusal(*out, "--base", str(llama))
    assert f"the LoRA base {tmp_path / 'gone'} does not exist" in _refusal(*out, "--base", str(tmp_path / "gone"))
    assert not (tmp_path / "adapter").exists()
    moved = shutil.move(folder, tmp_path / "moved")
    _cli("export", *out, "--base", str(moved), cwd=ROOT)
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"] == str(
        moved
    )


def test_the_adapter_and_marian_folders_take_the_mode_the_umask_gives(tmp_path):
    """README: files are written with the modes the umask gives. `export --format peft` wrote
    adapter_model.safetensors, and `--format hf` of an encoder-decoder (MarianMTModel.save_pretrained) its
    model.safetensors, 0600 (safetensors writes through a temporary file), beside 0644 files."""
    import os

    from lit_transformer.config import TransformerConfig
    from lit_transformer.interop import save_hf_marian
    from lit_transformer.interop.peft_adapters import save_peft_adapter
    from lit_transformer.model import Transformer

    adapter = {"model.decoder_blocks.0.self_attn.qkv.lora_A.default.weight": torch.zeros(2, 32)}
    adapter["model.decoder_blocks.0.self_attn.qkv.lora_B.default.weight"] = torch.zeros(96, 2)
    gpt2 = TransformerConfig.preset("tiny", **GPT2)
    checkpoint = torch.load(_checkpoint(tmp_path / "a.ckpt", gpt2, adapter, base="gpt2"), weights_only=False)
    old = os.umask(0o022)
    try:
        save_peft_adapter(checkpoint, tmp_path / "adapter")
        paper = {
            "topology": "encoder_decoder",
            "norm_position": "post",
            "positions": "sinusoidal",
            "activation": "relu",
        }
        save_hf_marian(
            Transformer(TransformerConfig.preset("tiny", **paper, scale_embeddings=True)), tmp_path / "marian"
        )
    finally:
        os.umask(old)
    written = [*(tmp_path / "adapter").iterdir(), *(tmp_path / "marian").iterdir()]
    assert {p.name for p in written} >= {"adapter_model.safetensors", "model.safetensors"}
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in written} == {p.name: oct(0o644) for p in written}
