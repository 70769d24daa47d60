"""Compiled decoding (GenerationConfig.compile): int8 layers compile through int8_matmul, which computes what the
packed int8 kernel computes; a compiled int8 translation model steps beside eager decoding over a padded, expanded,
reordered batch; fp32 `translate --compile true` prints what eager decoding prints, and `generate` takes the flag
with int8. Behaviour only: the speed-up is measured by `python -m lit_transformer bench speed --only quantized`.
(An ONNX model refuses compile=True: tests/test_onnx_generation.py, beside its exported graphs.)"""

from __future__ import annotations

import copy
import string
import warnings
from pathlib import Path

import pytest
import torch
from model_variants import GPT2, PAPER, build, single_thread, tokens  # noqa: F401 (autouse fixture)
from torch import nn

from lit_transformer.data.text import train_tokenizer
from lit_transformer.transforms.int8 import (
    Int8Linear,
    input_qparams,
    int8_matmul,
    load_quantized_state,
    quantize_int8,
    quantized_state,
)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

INPUTS = {
    "randn": lambda x: x,
    "positive": lambda x: x.abs(),
    "negative": lambda x: -x.abs(),
    "zeros": lambda x: torch.zeros_like(x),
    "tiny range": lambda x: x * 1e-6,
    "offset": lambda x: x + 5.0,
}


def _int8_linear(in_features: int = 48, out_features: int = 80) -> Int8Linear:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(
            nn.Sequential(nn.Linear(in_features, out_features)),
            {nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig},
            dtype=torch.qint8,
            mapping={nn.Linear: Int8Linear},
        )[0]


@pytest.mark.parametrize("kind", INPUTS)
@pytest.mark.parametrize("shape", [(1, 1, 48), (3, 1, 48), (2, 5, 48)], ids=["step", "beams", "prompt"])
def test_int8_matmul_computes_what_the_packed_kernel_computes(kind, shape):
    """The input's scale (as fp32, which the kernel uses) and zero point equal torch's own dynamic choice
    (reduce_range uint8), and the
    output equals the packed kernel's to fp32 rounding (the integers are the same; only the order of the final
    multiplications may differ)."""
    layer = _int8_linear()
    x = INPUTS[kind](torch.randn(*shape))
    q = torch.quantize_per_tensor_dynamic(x, torch.quint8, True)
    scale, zero = input_qparams(x.reshape(-1, 48))
    assert scale.item() == torch.tensor(q.q_scale()).float().item() and zero.item() == q.q_zero_point()
    with torch.inference_mode():
        expected = layer(x)
        got = int8_matmul(x, layer.int8_weight, layer.int8_scale, layer.int8_weight_sum, layer.int8_bias)
        compiled = torch.compile(layer)(x)  # the compilable form, as compile=True runs it
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(compiled, expected, rtol=1e-6, atol=1e-6)


def test_the_compilable_copies_follow_the_packed_weights():
    """The plain int8 copies are not in the state dict, and are remade whenever the packed weights change (set,
    loaded from a state dict, deep-copied), so that a compiled forward never reads stale weights."""
    layer = _int8_linear()
    torch_layer = torch.ao.nn.quantized.dynamic.Linear(48, 80)
    assert layer.state_dict().keys() == torch_layer.state_dict().keys()
    other = _int8_linear()
    with torch.no_grad():
        weight = torch.quantize_per_channel(
            torch.randn(80, 48),
            torch.rand(80, dtype=torch.float64) / 50,
            torch.zeros(80, dtype=torch.long),
            0,
            torch.qint8,
        )
    other.set_weight_bias(weight, torch.randn(80))
    assert torch.equal(other.int8_weight, weight.int_repr())
    layer.load_state_dict(other.state_dict())  # repacks through LinearPackedParams, not set_weight_bias
    layer.compile_ready()
    assert torch.equal(layer.int8_weight, weight.int_repr()) and torch.equal(layer.int8_bias, other.int8_bias)
    copied = copy.deepcopy(layer)
    copied.compile_ready()
    assert torch.equal(copied.int8_weight, weight.int_repr())


def test_a_reloaded_int8_model_compiles_with_its_loaded_weights():
    model = build(GPT2, vocab_size=128)
    q = quantize_int8(model)
    back = load_quantized_state(build(GPT2, seed=5, vocab_size=128), quantized_state(q), lm_head=True)
    for a, b in zip(q.modules(), back.modules(), strict=True):
        if isinstance(a, Int8Linear):
            assert torch.equal(a.int8_weight, b.int8_weight) and torch.equal(a.int8_weight_sum, b.int8_weight_sum)


TOKENIZER = train_tokenizer([string.printable * 3], kind="char", vocab_size=128)
# One decoder layer: compiling costs seconds per graph, mostly inductor's code generation, which grows with layers.
# The Python test and the commands build the same architectures, so the commands reuse the graphs compiled first.
IDS = {"vocab_size": TOKENIZER.get_vocab_size(), "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
SMALL = {"n_layers": 1}


@pytest.mark.slow
def test_compiled_int8_translation_steps_stay_with_eager_decoding():
    """The int8 encoder-decoder, compiled, step by step beside eager: a padded batch, rows expanded as for beams and
    reordered every step as beam search does. Each int8 layer computes the packed kernel's integers from its input
    (the test above), but inductor's fp32 sums (LayerNorm, softmax) round differently, and an ulp can move an
    activation across a rounding boundary of its int8 grid: the logits stay within a small fraction of their range
    (on the trained translation preset: 0.10-0.16, while int8 against fp32 differs by up to 0.26), not bit-equal.
    Greedy, beam and sampled generate calls run compiled and give eager's tokens."""
    from lit_transformer.model.generation import CompiledDecoder, IncrementalDecoder

    model = quantize_int8(build(PAPER, **SMALL, **IDS))
    x = tokens(3, 7, vocab=IDS["vocab_size"])
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, 4:] = False
    mask[2, 6:] = False
    with torch.inference_mode():
        eager = IncrementalDecoder(model, x, mask, 8, expand=2)
        compiled = CompiledDecoder(model, x, mask, 8, expand=2)
        reorder = torch.tensor([1, 0, 3, 3, 4, 5])  # beam search's row selection
        for step in range(6):
            spread = eager.logits.max() - eager.logits.min()
            torch.testing.assert_close(compiled.logits, eager.logits, atol=0.02 * spread.item(), rtol=0)
            token = eager.logits.argmax(-1)
            eager.step(token, reorder if step % 2 else None)
            compiled.step(token, reorder if step % 2 else None)
    for case in ({}, {"num_beams": 3}, {"temperature": 0.9, "top_k": 20, "seed": 3}):
        out = model.generate(x, max_new_tokens=6, attention_mask=mask, compile=True, **case)
        eager_out = model.generate(x, max_new_tokens=6, attention_mask=mask, **case)
        assert torch.equal(out, eager_out), case
    assert isinstance(model.lm_head, Int8Linear)


# ---- the commands ------------------------------------------------------------------------------------------------


def _checkpoint(path: Path, model, tokenizer) -> Path:
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    torch.save(
        {"state_dict": state, "hyper_parameters": {"config": model.config}, "tokenizer": tokenizer.to_str()}, path
    )
    return path


@pytest.mark.slow
def test_translate_and_generate_take_compile(tmp_path, capsys):
    """`translate --compile true` (fp32: beam search over a padded batch, the command's defaults) prints what it prints
    without it; `generate --quantize int8 --compile true` continues the prompt compiled."""
    from lit_transformer.cli.model_commands import generate_main, translate_main

    mt = _checkpoint(tmp_path / "mt.ckpt", build(PAPER, **SMALL, **IDS), TOKENIZER)
    (tmp_path / "src.txt").write_text("hello there\nhi\nhow are you today\n")
    common = ["--checkpoint", str(mt), "--input", str(tmp_path / "src.txt"), "--max_new_tokens", "8"]
    outputs = []
    for flags in ([], ["--compile", "true"]):
        translate_main([*common, *flags])
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and outputs[0].count("\n") == 3
    lm = _checkpoint(tmp_path / "lm.ckpt", build(GPT2, **SMALL, **IDS), TOKENIZER)
    generate_main(
        ["--checkpoint", str(lm), "--prompt", "abc", "--max_new_tokens", "8", "--temperature", "0"]
        + ["--quantize", "int8", "--compile", "true"]
    )
    assert capsys.readouterr().out.startswith("abc")
