"""ONNX decoding graphs (past keys and values, padding masks) and the onnxruntime generation loop: the same tokens as
Transformer.generate, greedy and beam search, on padded batches of both topologies; int8 graphs stay close.

Each variant is exported once (a few seconds: torch.export is the cost) and decoded several ways."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from _int8_bound import SIGMAS, rounding_noise

from lit_transformer.config import GenerationConfig, TransformerConfig
from lit_transformer.model import Transformer

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from lit_transformer.interop.onnx import (  # noqa: E402
    OnnxDecoder,
    OnnxModel,
    export_onnx,
    export_onnx_folder,
    quantize_onnx_int8,
)
from lit_transformer.model.generation import IncrementalDecoder  # noqa: E402

SPECIAL = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
# The cache-changing switches over both topologies: each position scheme acts on the cache differently (added to the
# embedding from a start offset, rotated before caching, a distance bias over cached keys); grouped K/V heads shrink
# the cache. Post-LN sinusoidal is the paper's model. GPT-2's learned positions: tests/test_interop.py's export test.
VARIANTS = {
    "decoder_only-rope-gqa": {"topology": "decoder_only", "positions": "rope", "n_kv_heads": 2},
    "encoder_decoder-sinusoidal": {
        "topology": "encoder_decoder",
        "norm_position": "post",
        "positions": "sinusoidal",
        "activation": "relu",
        "scale_embeddings": True,
    },
    "encoder_decoder-alibi-gqa": {"topology": "encoder_decoder", "positions": "alibi", "n_kv_heads": 2},
    # The speedrun's switches, all on, both topologies: ONNX holds each (normalised and mixed keys and values in the
    # past, the capped logits); a cap of 30 leaves these logits unsaturated, so no two tokens tie at the cap.
    **{
        f"{topology}-frontier": {
            "topology": topology,
            "positions": "rope",
            "norm": "rmsnorm",
            "activation": "relu2",
            "n_kv_heads": 2,
            "qk_norm": True,
            "zero_init_output": True,
            "tie_embeddings": False,
            "logit_softcap": 30.0,
            "value_residual": True,
        }  # fmt: skip
        for topology in ("decoder_only", "encoder_decoder")
    },
}


def build(variant: dict) -> Transformer:
    """Large random weights, so that the next token is decided by clear margins and varies along a sequence."""
    torch.manual_seed(0)
    model = Transformer(TransformerConfig.preset("tiny", **SPECIAL, **variant)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


_EXPORTED: dict[str, tuple[Transformer, Path]] = {}
# The folder test's two exports are two of these: the language model's folder, with its logits graph model.onnx, is
# copied into the translation model's folder (with a file of the user's) before the translation model is exported
# there. Exporting both again in that test took 4 more graphs (about 20 s of CPU); the logits graph costs one.
LANGUAGE_MODEL, OVER_IT = "decoder_only-rope-gqa", "encoder_decoder-sinusoidal"


def export_once(name: str, tmp_path_factory) -> tuple[Transformer, Path]:
    """The variant's model and its exported folder, exported once per test session (the export is the slow part)."""
    if name not in _EXPORTED:
        model = build(VARIANTS[name])
        folder = tmp_path_factory.mktemp(name)
        if name == OVER_IT:
            shutil.copytree(export_once(LANGUAGE_MODEL, tmp_path_factory)[1], folder, dirs_exist_ok=True)
            (folder / "notes.txt").write_text("mine")
        _EXPORTED[name] = model, export_onnx_folder(model, folder, logits_graph=name == LANGUAGE_MODEL)
    return _EXPORTED[name]


@pytest.fixture(scope="module", params=list(VARIANTS))
def exported(request, tmp_path_factory):
    model, folder = export_once(request.param, tmp_path_factory)
    return model, OnnxModel(folder, threads=1)


def batch(model: Transformer) -> tuple[torch.Tensor, torch.Tensor]:
    """Three rows of 9 tokens padded to different lengths: decoder-only prompts on the left and on the right."""
    x = torch.randint(3, 100, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(x, dtype=torch.bool)
    mask[0, 6:] = False
    if model.config.is_encoder_decoder:
        mask[1, 4:] = False
    else:
        mask[1, :4] = False
    return x, mask


def settings(model: Transformer, eos: int) -> dict[str, GenerationConfig]:
    """Greedy and beam search with each length penalty and stopping rule; eos is a token the model does emit."""
    cfg = model.config
    beam = GenerationConfig(num_beams=4, max_new_tokens=16, eos_token_id=eos)
    out = {
        # Past max_seq_len (64): the decoder-only window slides and the cache is refilled.
        "greedy": GenerationConfig(max_new_tokens=30 if cfg.is_encoder_decoder else 70, eos_token_id=eos),
        "beam-gnmt-early": beam.replace(length_penalty=0.6, length_penalty_form="gnmt", early_stopping=True),
        "beam-length": beam.replace(length_penalty=1.2, early_stopping=False),
    }
    if cfg.is_encoder_decoder:
        out["beam-source-offset"] = beam.replace(max_source_offset=3, length_penalty_form="gnmt", length_penalty=0.6)
    return out


def test_an_onnx_model_refuses_compile(tmp_path_factory):
    """compile=True compiles the PyTorch model's passes: an ONNX model says so instead of decoding uncompiled."""
    model, folder = export_once("decoder_only-rope-gqa", tmp_path_factory)
    with pytest.raises(ValueError, match="compile=True compiles the PyTorch model"):
        OnnxModel(folder, threads=1).generate(batch(model)[0], max_new_tokens=3, compile=True)


def test_onnxruntime_generates_our_tokens(exported):
    model, onnx_model = exported
    x, mask = batch(model)
    free = model.generate(x, attention_mask=mask, max_new_tokens=12, eos_token_id=-1)
    eos = int(free[0, 5])  # ends row 0 early: finished rows fill with padding while the others go on
    for name, gen in settings(model, eos).items():
        ours = model.generate(x, gen, attention_mask=mask)
        theirs = onnx_model.generate(x, gen, attention_mask=mask)
        assert torch.equal(theirs, ours), name
    single = onnx_model.generate(x[:1, :6], max_new_tokens=8)
    assert torch.equal(single, model.generate(x[:1, :6], max_new_tokens=8))


def test_the_decoding_graph_takes_any_batch_past_and_source_length(exported):
    """One step from a long past equals the PyTorch cache's logits (dynamic axes beyond the traced sizes)."""
    model, onnx_model = exported
    x = torch.randint(3, 100, (5, 11), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ours, theirs = IncrementalDecoder(model, x, None, 40), OnnxDecoder(onnx_model, x, None, 40)
        token = ours.logits.argmax(-1)
        for _ in range(20):
            a, b = ours.step(token), theirs.step(token)
            torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)
            token = a.argmax(-1)
    cfg = model.config
    cached = 1 if cfg.is_encoder_decoder else x.shape[1]  # BOS or the prompt, then 20 steps, after the masked slot
    assert onnx_model.description["graphs"]["decoder"]["outputs"][1] == "present.0.key"
    assert theirs.cache[0].shape == (5, cfg.kv_heads, 1 + cached + 20, cfg.head_dim)


def test_int8_graphs_stay_within_their_rounding_noise(tmp_path, tmp_path_factory, capsys):
    """onnxruntime's dynamic int8 quantization of the paper model's graphs, teacher-forced for 20 steps beside fp32.
    How close is derived from how it rounds (onnxruntime.quantization: MatMul weights symmetric int8 per output
    channel with reduce_range, max|W_j| / 64 a step; MatMul inputs uint8 over their range, 255 steps; embedding
    tables, quantized as Gather inputs, one uint8 grid of 255 steps): the rounding-noise model (tests/_int8_bound.py)
    run 16 times on the fp32 model gives each logit's spread sigma, and every int8 logit is within 6 sigma of fp32's
    (plus 1e-4, the fp32 graphs' own difference, see above). Agreement follows from it: wherever fp32's best logit
    leads its runner-up by more than twice the row's largest bound, no error within the bounds can change the token,
    so int8 must pick fp32's."""
    import onnx

    model, fp32 = export_once("encoder_decoder-sinusoidal", tmp_path_factory)
    folder = shutil.copytree(fp32, tmp_path / "int8")
    for graph in ("encoder.onnx", "decoder.onnx"):
        quantize_onnx_int8(folder / graph)
    ops = {n.op_type for n in onnx.load(folder / "decoder.onnx").graph.node}
    assert "MatMulInteger" in ops
    int8 = OnnxModel(folder, threads=1)
    x, mask = batch(model)
    steps = 20
    with torch.no_grad():
        ref, q = IncrementalDecoder(model, x, mask, steps), OnnxDecoder(int8, x, mask, steps)
        ours, theirs, forced = [ref.logits], [q.logits], []
        for _ in range(steps - 1):
            forced.append(ref.logits.argmax(-1))
            ours.append(ref.step(forced[-1]))
            theirs.append(q.step(forced[-1]))
        noisy = []
        for seed in range(16):
            with rounding_noise(model, torch.Generator().manual_seed(seed), 255, 64, table_levels=255):
                run = IncrementalDecoder(model, x, mask, steps)
                noisy.append(torch.stack([run.logits] + [run.step(token) for token in forced]))
    ours, theirs = torch.stack(ours), torch.stack(theirs)  # (steps, rows, vocabulary)
    assert torch.isfinite(theirs).all()
    sigma = (torch.stack(noisy) - ours).pow(2).mean(0).sqrt()
    bound = SIGMAS * sigma + 1e-4
    z = ((theirs - ours).abs() / sigma).max().item()
    assert ((theirs - ours).abs() <= bound).all(), f"int8 logits {z:.1f} sigma from fp32's"
    best = ours.argmax(-1, keepdim=True)
    # No logit within its bound can overtake the best: its lead over every other exceeds the two bounds together.
    lead = ours.gather(-1, best) - ours - bound.gather(-1, best) - bound
    clear = (lead.scatter(-1, best, float("inf")) > 0).all(-1)
    agree = theirs.argmax(-1) == best[..., 0]
    assert clear.float().mean() > 0.1 and agree[clear].all()  # (0.25 of the rows and steps are clear here)
    with capsys.disabled():
        print(
            f"\nint8 ONNX: max |logit difference| {(theirs - ours).abs().max():.4f} ({z:.1f} sigma); teacher-forced "
            f"agreement {agree.float().mean():.0%}, {clear.float().mean():.0%} of steps decided beyond the bound"
        )


def test_the_logits_graph_refuses_the_encoder_decoder(tmp_path):
    with pytest.raises(ValueError, match="encoder graph and a decoder-step graph"):
        export_onnx(build(VARIANTS["encoder_decoder-sinusoidal"]), tmp_path / "model.onnx")


def test_an_export_into_a_folder_of_another_models_graphs_leaves_none_of_them(tmp_path_factory):
    """A language model's model.onnx stayed beside a translation model's encoder and decoder exported over it (read
    as one folder, the wrong graph is picked up); files the earlier onnx.json did not list are left alone. The
    translation model's shared export is that export over the language model's folder (export_once)."""
    language_model = export_once(LANGUAGE_MODEL, tmp_path_factory)[1]
    assert sorted(p.name for p in language_model.iterdir()) == ["decoder.onnx", "model.onnx", "onnx.json"]
    translation = export_once(OVER_IT, tmp_path_factory)[1]
    assert sorted(p.name for p in translation.iterdir()) == ["decoder.onnx", "encoder.onnx", "notes.txt", "onnx.json"]
    assert json.loads((translation / "onnx.json").read_text())["topology"] == "encoder_decoder"
