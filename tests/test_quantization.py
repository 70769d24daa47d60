"""int8 dynamic quantization (lit_transformer.transforms.int8): the quantized model decodes with the KV cache and beam
search, stays close to fp32, saves and loads as int8, refuses what it cannot serve, and every command's --quantize
flag works end to end on tiny checkpoints. Behaviour only: the speed-up is measured by `bench speed --only quantized`."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest
import torch
from _int8_bound import SIGMAS, linear_error_sigma
from model_variants import GPT2, PAPER, build, single_thread, tokens  # noqa: F401 (autouse fixture)

from lit_transformer.cli.model_commands import export_main
from lit_transformer.data.text import train_tokenizer
from lit_transformer.errors import ConfigError
from lit_transformer.interop import OnnxModel, load_safetensors
from lit_transformer.model import Transformer
from lit_transformer.transforms.int8 import Int8Linear, QuantizationError, is_quantized, quantize_int8

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

MODERN = {**GPT2, "positions": "rope", "activation": "swiglu", "norm": "rmsnorm", "bias": False}
# The speedrun's switches: qk_norm's gains and value_residual's scalars stay fp32 beside the int8 Linear layers, the
# soft cap acts on whatever logits the (int8 or fp32) output layer gives. Larger weights than the others' (qk_norm
# keeps the attention logits small): clear margins between tokens, so that int8 decoding with the cache and int8
# recomputation (whose inputs, hence rounding grids, differ) pick the same tokens.
FRONTIER = {
    **MODERN, "activation": "relu2", "qk_norm": True, "zero_init_output": True, "tie_embeddings": False,
    "logit_softcap": 15.0, "value_residual": True, "init_std": 0.1,
}  # fmt: skip
VARIANTS = [
    GPT2, PAPER, {**GPT2, "pad_vocab_to_multiple_of": 64}, {**PAPER, "pad_vocab_to_multiple_of": 64}, MODERN, FRONTIER,
    {**FRONTIER, "topology": "encoder_decoder"},
]  # fmt: skip
ROOT = Path(__file__).resolve().parents[1]


def _id(v: dict) -> str:
    kind = "-modern" if v is MODERN else "-frontier" if v.get("qk_norm") else ""
    return v["topology"] + ("-padded" if "pad_vocab_to_multiple_of" in v else "") + kind


def _logits(model: Transformer, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(x, x) if model.config.is_encoder_decoder else model(x)


@pytest.mark.parametrize("lm_head", [True, False], ids=["lm_head_int8", "lm_head_fp32"])
@pytest.mark.parametrize("variant", VARIANTS, ids=_id)
def test_int8_model_stays_close_and_decodes(variant, lm_head):
    """Linear layers become int8 (the output layer as chosen), embeddings stay fp32 and tied; logits keep the true
    vocabulary (a padded one is sliced); greedy and beam search run on the cache. How close: every int8 layer's
    output, on the very input the fp32 layer sees, is within 6 sigma of the rounding-noise bound of its grids
    (tests/_int8_bound.py: input uint8 with reduce_range, 127 steps over its range; weights symmetric int8 per output
    channel, max|W_j| / 127.5), and every other tensor of the model is the fp32 one, untouched. Max logit difference
    printed."""
    model = build(variant, vocab_size=100, eos_token_id=None).eval()
    q = quantize_int8(model, lm_head=lm_head)
    assert is_quantized(q) and not is_quantized(model)  # a copy: the fp32 model is untouched
    assert isinstance(q.lm_head, torch.nn.Linear) != lm_head
    embed = q.tgt_embed
    assert embed.weight.dtype == torch.float32
    if not lm_head and model.config.tie_embeddings:
        assert q.lm_head.weight is embed.weight  # the tie survives
    x = tokens(2, 12, vocab=100)
    inputs = linear_inputs(model, x)
    int8_layers = dict(q.named_modules())
    for name, seen in inputs.items():
        fp32_layer, int8_layer = dict(model.named_modules())[name], int8_layers[name]
        if not lm_head and name == "lm_head":
            assert isinstance(int8_layer, torch.nn.Linear)
            continue
        assert isinstance(int8_layer, Int8Linear), name
        with torch.no_grad():
            expected, got = fp32_layer(seen).double(), int8_layer(seen).double()
        sigma = linear_error_sigma(seen, fp32_layer.weight, activation_levels=127, weight_levels=127.5)
        excess = ((got - expected).abs() - SIGMAS * sigma - 1e-6 * expected.abs()).max().item()
        assert excess <= 0, f"{name}: int8 output beyond {SIGMAS:g} sigma of its rounding by {excess:.3g}"
    fp32_state = dict(model.named_parameters())
    for key, value in q.named_parameters():  # embeddings, positions, norms (the int8 layers hold no parameters)
        assert torch.equal(value, fp32_state[key]), key
    expected, got = _logits(model, x), _logits(q, x)
    assert got.shape == expected.shape == (2, 12, 100)
    diff = (got - expected).abs().max().item()
    print(
        f"{_id(variant)} lm_head_int8={lm_head}: max |logit difference| {diff:.4f} (logit range {expected.abs().max():.2f})"
    )
    greedy = q.generate(x[:, :5], max_new_tokens=6)
    beams = q.generate(x[:, :5], max_new_tokens=6, num_beams=3)
    assert greedy.shape == beams.shape == (2, 6)
    assert int(greedy.max()) < 100 and int(beams.max()) < 100  # a padded id is never chosen
    # the cache gives what recomputing gives, quantized too
    torch.testing.assert_close(greedy, q.generate(x[:, :5], max_new_tokens=6, use_cache=False), atol=0, rtol=0)
    fp32 = model.generate(x[:, :5], max_new_tokens=6)
    print(f"  greedy agreement with fp32: {(fp32 == greedy).float().mean():.0%}")


def linear_inputs(model: Transformer, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The input each Linear layer of the fp32 model receives in a forward pass over x."""
    seen: dict[str, torch.Tensor] = {}

    def keep(name: str):
        def hook(module, args, out) -> None:
            seen.setdefault(name, args[0].detach())

        return hook

    hooks = [
        module.register_forward_hook(keep(name))
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
    ]
    try:
        _logits(model, x)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def test_int8_linear_equals_torchs_dynamic_linear():
    """Our Int8Linear calls torch's operator directly (a leaner forward): the same result as torch's own module for
    the same weights, bit for bit, in its current and its older (version < 4, no reduce_range) serialisation."""
    import torch.ao.nn.quantized.dynamic as nnqd

    from lit_transformer.transforms.int8 import Int8Linear

    q = quantize_int8(build(PAPER, vocab_size=100).eval())
    ours = q.decoder_blocks[0].ff.up
    assert type(ours) is Int8Linear and isinstance(ours, nnqd.Linear)
    theirs = nnqd.Linear(ours.in_features, ours.out_features)
    theirs.set_weight_bias(*ours._weight_bias())
    x = torch.randn(3, 5, ours.in_features)
    for version in (4, 3):
        ours.version = theirs.version = version
        assert torch.equal(ours(x), theirs(x))


def test_compiled_decoding_readies_every_int8_layer_through_its_hook():
    """Decoding knows no int8 class: CompiledPasses calls compile_ready on each layer that has it, which remakes the
    plain int8 copies the compiled forward reads (here dropped first, as a repack leaves them stale)."""
    from lit_transformer.model.generation import CompiledPasses, CompileReady

    model = quantize_int8(build(GPT2, vocab_size=64))
    layers = [m for m in model.modules() if isinstance(m, CompileReady)]
    assert layers and all(isinstance(m, torch.ao.nn.quantized.dynamic.Linear) for m in layers)
    for layer in layers:
        layer.register_buffer("int8_weight", None, persistent=False)
        layer._plain_of = None
    CompiledPasses(model)
    assert all(torch.equal(m.int8_weight, m._weight_bias()[0].int_repr()) for m in layers)


def test_refuses_training_mode_gpu_and_double_quantization():
    model = build(GPT2, vocab_size=100)
    with pytest.raises(QuantizationError, match="for inference.*model.eval"):
        quantize_int8(model.train())
    q = quantize_int8(model.eval())
    with pytest.raises(QuantizationError, match="already quantized"):
        quantize_int8(q)
    with pytest.raises(QuantizationError, match="starts from fp32"):
        quantize_int8(build(GPT2, vocab_size=100).eval().to(torch.bfloat16))
    meta = build(GPT2, vocab_size=100).eval().to("meta")  # any non-CPU device takes the GPU's path
    with pytest.raises(QuantizationError, match="CPU only.*--device cpu"):
        quantize_int8(meta)


@pytest.mark.parametrize("lm_head", [True, False], ids=["lm_head_int8", "lm_head_fp32"])
@pytest.mark.parametrize("variant", [GPT2, {**PAPER, "pad_vocab_to_multiple_of": 64}, FRONTIER], ids=_id)
def test_int8_safetensors_round_trip(tmp_path, variant, lm_head):
    """The native export of an int8 model holds int8 weights and loads back as the same int8 model."""
    q = quantize_int8(build(variant, vocab_size=100).eval(), lm_head=lm_head)
    from lit_transformer.interop import save_safetensors

    save_safetensors(q, tmp_path)
    back = load_safetensors(tmp_path)
    assert (
        is_quantized(back) and json.loads((tmp_path / "config.json").read_text())["quantization"]["lm_head"] == lm_head
    )
    x = tokens(2, 9, vocab=100)
    torch.testing.assert_close(_logits(back, x), _logits(q, x), atol=0, rtol=0)


# ---- the commands ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer([string.printable * 3], kind="char", vocab_size=128)


def _checkpoint(path: Path, model: Transformer, tokenizer) -> Path:
    """A checkpoint as LitTransformer writes it: the model under "model.", the config and the tokenizer."""
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    payload = {"state_dict": state, "hyper_parameters": {"config": model.config}, "tokenizer": tokenizer.to_str()}
    torch.save(payload, path)
    return path


def test_generate_translate_and_export_take_quantize_int8(tmp_path, tokenizer, capsys, monkeypatch):
    from lit_transformer.cli.model_commands import generate_main, translate_main

    vocab = tokenizer.get_vocab_size()
    lm = _checkpoint(tmp_path / "lm.ckpt", build(GPT2, vocab_size=vocab, pad_token_id=0, eos_token_id=2), tokenizer)
    common = ["--checkpoint", str(lm), "--prompt", "abc", "--max_new_tokens", "8", "--temperature", "0"]
    generate_main([*common, "--quantize", "int8"])
    assert capsys.readouterr().out.startswith("abc")
    mt = build(PAPER, vocab_size=vocab, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    mt_ckpt = _checkpoint(tmp_path / "mt.ckpt", mt, tokenizer)
    translate_main(["--checkpoint", str(mt_ckpt), "--text", "hello", "--max_new_tokens", "6", "--quantize", "int8"])
    assert capsys.readouterr().out.endswith("\n")
    export_main(
        ["--checkpoint", str(mt_ckpt), "--format", "safetensors", "--out", str(tmp_path / "q"), "--quantize", "int8"]
    )
    assert "Wrote" in capsys.readouterr().out
    back = load_safetensors(tmp_path / "q")
    assert is_quantized(back)
    assert (tmp_path / "q" / "model.safetensors").stat().st_size < 0.5 * (tmp_path / "mt.ckpt").stat().st_size
    # ONNX: the fp32 graphs quantized by onnxruntime (MatMulInteger), a translation of the same length limits.
    export_main(["--checkpoint", str(mt_ckpt), "--format", "onnx", "--out", str(tmp_path / "o"), "--quantize", "int8"])
    assert "Wrote" in capsys.readouterr().out
    description = json.loads((tmp_path / "o" / "onnx.json").read_text())
    assert description["quantization"] == "int8" and set(description["graphs"]) == {"encoder", "decoder"}
    onnx = pytest.importorskip("onnx")
    assert "MatMulInteger" in {n.op_type for n in onnx.load(tmp_path / "o" / "decoder.onnx").graph.node}
    source = tokens(2, 5, vocab=vocab)
    translation = OnnxModel(tmp_path / "o", threads=1).generate(source, max_new_tokens=6, eos_token_id=-1)
    assert translation.shape == (2, 6)
    with pytest.raises(ConfigError, match="safetensors or onnx, not hf"):
        export_main(["--checkpoint", str(lm), "--format", "hf", "--out", str(tmp_path / "o"), "--quantize", "int8"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # refused before any model is loaded there
    with pytest.raises(ConfigError, match="--quantize int8: int8 dynamic quantization runs on the CPU only"):
        generate_main([*common, "--quantize", "int8", "--device", "cuda"])


def test_predict_quantizes_and_fit_refuses(tmp_path, monkeypatch):
    """predict --model.quantize int8 runs an int8 model on the checkpoint's weights (the checkpoint's own quantize
    value does not override the command line); fit refuses the flag with a message that says what to do."""
    from lit_transformer.cli.lightning_cli import run_cli

    monkeypatch.chdir(tmp_path)
    base = ["--config", str(ROOT / "configs" / "presets" / "tiny.yaml"), "--trainer.logger", "false"]
    base += ["--data.init_args.cache_dir", str(tmp_path / "cache"), "--trainer.enable_progress_bar", "false"]
    run_cli(
        ["fit", *base, "--trainer.max_steps", "1", "--trainer.limit_val_batches", "0", "--checkpoint.dirpath", "ck"]
    )
    (tmp_path / "prompts.txt").write_text("ROMEO:\nJULIET:\n")
    args = [*base, "--ckpt_path", "ck/last.ckpt", "--data.init_args.predict_file", "prompts.txt"]
    args += ["--model.generation.max_new_tokens", "5", "--model.generation.temperature", "0"]
    cli = run_cli(["predict", *args, "--predictions.output", "int8.jsonl", "--model.quantize", "int8"])
    assert is_quantized(cli.model.model)
    rows = [json.loads(line) for line in (tmp_path / "int8.jsonl").read_text().splitlines()]
    assert [r["input"] for r in rows] == ["ROMEO:", "JULIET:"] and all(len(r["tokens"]) <= 5 for r in rows)
    with pytest.raises(ValueError, match="quantize int8 is for validate, test and predict"):
        run_cli(["fit", *base, "--trainer.max_steps", "1", "--model.quantize", "int8", "--checkpoint.dirpath", "ck2"])


def test_int8_under_mixed_precision_is_refused_in_one_line(tmp_path, monkeypatch):
    """validate/test/predict --model.quantize int8 with a mixed-precision trainer (configs/trainer/bf16-mixed.yaml):
    autocast handed the int8 kernels bf16 inputs, a RuntimeError deep in the first batch ("expected scalar type
    Float but found BFloat16"); refused at setup, naming the precision and the fix."""
    from lit_transformer.cli.lightning_cli import run_cli

    monkeypatch.chdir(tmp_path)
    base = ["--config", str(ROOT / "configs" / "presets" / "tiny.yaml"), "--trainer.logger", "false"]
    base += ["--data.init_args.cache_dir", str(tmp_path / "cache"), "--trainer.enable_progress_bar", "false"]
    run_cli(
        ["fit", *base, "--trainer.max_steps", "1", "--trainer.limit_val_batches", "0", "--checkpoint.dirpath", "ck"]
    )
    mixed = [*base, "--ckpt_path", "ck/last.ckpt", "--model.quantize", "int8", "--trainer.precision", "bf16-mixed"]
    with pytest.raises(ConfigError, match="int8 runs in fp32.*not under --trainer.precision bf16-mixed.*32-true"):
        run_cli(["validate", *mixed, "--trainer.limit_val_batches", "1"])
