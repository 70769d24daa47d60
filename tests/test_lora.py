"""LoRA through peft (lit_transformer/transforms/lora.py): only the adapters and the named extras train; a checkpoint holds them
and the base's fingerprint; the merged model (generate, translate, export) equals the adapted one for every topology
and task; resume is exact; every task's CLI path runs from a LoRA checkpoint, also under DDP, activation
checkpointing and compile. Tiny models on bases written in tmp dirs; CLI runs of a few steps."""

from __future__ import annotations

import json
import string
from pathlib import Path

import lightning
import pytest
import torch
import yaml
from _forked import HARNESS_ENV
from model_variants import PAPER, build, single_thread, tokens  # noqa: F401 (autouse fixture)
from test_cli import CONFIGS, ROOT, _cli, _process

from lit_transformer.checkpoints.files import CheckpointError, load_checkpoint
from lit_transformer.config import TransformerConfig
from lit_transformer.data.text import train_tokenizer
from lit_transformer.engine.lightning_module import LitTransformer
from lit_transformer.errors import UserError
from lit_transformer.inference import load_model
from lit_transformer.transforms.lora import LoraOptions

pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning", "ignore::UserWarning")

GPT2 = {"topology": "decoder_only", "norm_position": "pre", "positions": "learned"}
LORA = str(CONFIGS / "finetune" / "lora.yaml")
EVERYTHING = ["qkv", "q", "kv", "out", "up", "down"]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer([string.printable * 3], kind="char", vocab_size=128)


def _base_checkpoint(path: Path, model, tokenizer, task: str | None = None) -> Path:
    """A checkpoint as LitTransformer writes it: the model under "model.", the config, the task and the tokenizer."""
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    hparams = {"config": model.config, "task": task}
    torch.save({"state_dict": state, "hyper_parameters": hparams, "tokenizer": tokenizer.to_str()}, path)
    return path


def _randomize(module: torch.nn.Module, seed: int = 0) -> None:
    """Adapters start as a no-op (B = 0): give every trainable tensor values, so merging has something to merge."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            if param.requires_grad:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)


def _lora_checkpoint(path: Path, lit: LitTransformer, tokenizer) -> Path:
    """What fit writes, without fitting: the LoRA module's checkpoint after on_save_checkpoint."""
    lit.tokenizer = lit.target_tokenizer = tokenizer
    checkpoint = {
        "state_dict": lit.state_dict(),
        "hyper_parameters": dict(lit.hparams),
        "pytorch-lightning_version": lightning.__version__,
    }
    lit.on_save_checkpoint(checkpoint)
    torch.save(checkpoint, path)
    return path


def _adapted(config: TransformerConfig, init_from: Path, task: str | None = None, **lora) -> LitTransformer:
    from lit_transformer.engine.optimizers import Optimization

    optim = Optimization(schedule_steps=10)
    lit = LitTransformer(config, task=task, init_from=str(init_from), lora=LoraOptions(**lora), optim=optim)
    lit.configure_model()
    return lit


# ---- what trains ------------------------------------------------------------------------------------------------


def test_only_adapters_and_named_extras_get_gradients_and_optimizer_state(tmp_path, tokenizer):
    from lit_transformer.interop import save_hf_gpt2

    folder = save_hf_gpt2(build(GPT2, vocab_size=128, pad_token_id=None), tmp_path / "gpt2", tokenizer)
    lit = _adapted(TransformerConfig.preset("tiny"), folder, rank=2, trainable=["norms"])
    expected = {n for n, _ in lit.named_parameters() if ".lora_A." in n or ".lora_B." in n or "norm" in n}
    assert {n for n, p in lit.named_parameters() if p.requires_grad} == expected
    assert any("lora_A" in n for n in expected) and any("decoder_norm" in n for n in expected)
    optimizer = lit.configure_optimizers()["optimizer"]
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert held == {id(p) for n, p in lit.named_parameters() if n in expected}
    x = tokens(2, 12)
    lit.model(x).logsumexp(-1).sum().backward()
    optimizer.step()
    with_grad = {n for n, p in lit.named_parameters() if p.grad is not None}
    assert with_grad == expected
    assert {id(p) for p in optimizer.state} == held
    trainable = sum(p.numel() for p in lit.parameters() if p.requires_grad)
    assert 0 < trainable < sum(p.numel() for p in lit.parameters()) / 5


def test_lora_needs_a_base_and_names_the_layers_it_can_adapt(tmp_path, tokenizer):
    with pytest.raises(ValueError, match="--model.init_from"):
        LitTransformer(TransformerConfig.preset("tiny"), lora=LoraOptions())
    from lit_transformer.interop import save_hf_gpt2

    folder = save_hf_gpt2(build(GPT2, vocab_size=128, pad_token_id=None), tmp_path / "gpt2", tokenizer)
    with pytest.raises(ValueError, match=r"\['qvk'\].*self_attn.qkv"):
        _adapted(TransformerConfig.preset("tiny"), folder, target_modules=["qvk"])
    with pytest.raises(ValueError, match="'classifer' selects no parameter") as refused:
        _adapted(TransformerConfig.preset("tiny"), folder, trainable=["classifer"])
    # The model's own names are offered (not cut off behind every block's), each block's layers once.
    assert "lm_head" in str(refused.value) and "tgt_embed" in str(refused.value)
    assert "decoder_blocks.*.self_attn.qkv" in str(refused.value) and "decoder_blocks.1." not in str(refused.value)


def test_trainable_lm_head_of_a_tied_model_trains_the_tied_matrix(tmp_path, tokenizer):
    """lora.yaml and the docs name lm_head as a `trainable` extra: with tied embeddings it is the embedding's matrix
    under a second name, which `trainable` selects as `tgt_embed` does (it was refused: 'selects no parameter')."""
    from lit_transformer.interop import save_hf_gpt2

    folder = save_hf_gpt2(build(GPT2, vocab_size=128, pad_token_id=None), tmp_path / "gpt2", tokenizer)
    by_head = _adapted(TransformerConfig.preset("tiny"), folder, rank=2, trainable=["lm_head"])
    by_embedding = _adapted(TransformerConfig.preset("tiny"), folder, rank=2, trainable=["tgt_embed"])
    assert by_head.model.lm_head.weight is by_head.model.tgt_embed.weight and by_head.model.lm_head.weight.requires_grad
    trains = [{n for n, p in lit.named_parameters() if p.requires_grad} for lit in (by_head, by_embedding)]
    assert trains[0] == trains[1] and "model.tgt_embed.weight" in trains[0]


# ---- merged = adapted, for every topology and task ------------------------------------------------------------


def _inputs(config: TransformerConfig) -> tuple:
    if config.source == "patches":
        return torch.rand(2, config.image_channels, *config.image_size), tokens(2, 7)
    if config.is_encoder_decoder:
        return tokens(2, 9), tokens(2, 7)
    return (tokens(2, 12),)


CASES = {
    # task: (base architecture, the run's config changes, task)
    "language_modeling": ({**GPT2}, {}, None),
    "llama": (
        {
            "topology": "decoder_only",
            "positions": "rope",
            "norm": "rmsnorm",
            "activation": "swiglu",
            "n_kv_heads": 2,
            "bias": False,
            "tie_embeddings": False,
            "d_ff": 40,
            "pad_token_id": None,
            "layer_norm_eps": 1e-6,
        },
        {},
        None,
    ),  # fmt: skip
    "translation": ({**PAPER}, {}, "translation"),
    "captioning": (
        {
            "topology": "encoder_decoder",
            "source": "patches",
            "image_size": (8, 16),
            "patch_size": 4,
            "image_channels": 1,
            "positions": "sinusoidal",
        },
        {},
        "captioning",
    ),  # fmt: skip
    "masked_lm": ({"topology": "encoder_only", "head": "masked_lm", "mask_token_id": 3}, {}, "masked_lm"),
    "classification": (
        {"topology": "encoder_only", "head": "masked_lm", "mask_token_id": 3},
        {"head": "classification", "num_labels": 3},
        "classification",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_merged_model_equals_the_adapted_one(tmp_path, tokenizer, case):
    base_arch, run_changes, task = CASES[case]
    base = build(base_arch, vocab_size=128)
    if case == "language_modeling":  # Hugging Face folders (GPT-2, Llama); the others our own checkpoints
        from lit_transformer.interop import save_hf_gpt2

        source = save_hf_gpt2(build(GPT2, vocab_size=128, pad_token_id=None), tmp_path / "gpt2", tokenizer)
    elif case == "llama":
        from lit_transformer.interop import save_hf_llama

        source = save_hf_llama(base, tmp_path / "llama", tokenizer)
    else:
        source = _base_checkpoint(tmp_path / "base.ckpt", base, tokenizer, task if case != "classification" else None)
    config = TransformerConfig.preset("tiny", **{**base_arch, **run_changes}, vocab_size=128)
    extras = ["norms"] if case == "llama" else ["biases"]  # Llama has no biases
    lit = _adapted(config, source, task, rank=4, target_modules=EVERYTHING, trainable=extras)
    if case == "classification":  # the new head trains in full by itself
        assert all(p.requires_grad for p in lit.model.classifier.parameters())
    _randomize(lit)
    path = _lora_checkpoint(tmp_path / "lora.ckpt", lit, tokenizer)
    saved = load_checkpoint(path)
    assert all(".lora_" in k or k.endswith(".bias") or "norm" in k or ".classifier." in k for k in saved["state_dict"])
    assert saved["lora"]["base"] == str(source) and len(saved["lora"]["fingerprint"]) == 16
    x = _inputs(lit.config)
    merged = load_model(path).model
    assert not any("lora" in n for n, _ in merged.named_parameters())
    with torch.no_grad():
        adapted = lit.model.eval()(*x)
        torch.testing.assert_close(merged(*x), adapted, atol=1e-5, rtol=1e-5)
    # Every export format takes the merged model.
    from lit_transformer.cli.model_commands import export_main
    from lit_transformer.interop import load_safetensors

    export_main(["--checkpoint", str(path), "--format", "safetensors", "--out", str(tmp_path / "st")])
    with torch.no_grad():
        torch.testing.assert_close(load_safetensors(tmp_path / "st")(*x), adapted, atol=1e-5, rtol=1e-5)
    if case in ("language_modeling", "llama", "translation"):
        export_main(["--checkpoint", str(path), "--format", "hf", "--out", str(tmp_path / "hf")])
        hf = transformers.AutoModelForSeq2SeqLM if lit.config.is_encoder_decoder else transformers.AutoModelForCausalLM
        hf_model = hf.from_pretrained(tmp_path / "hf").eval()
        with torch.no_grad():
            if lit.config.is_encoder_decoder:
                logits = hf_model(input_ids=x[0], decoder_input_ids=x[1]).logits
            else:
                logits = hf_model(x[0]).logits
        torch.testing.assert_close(logits[..., : adapted.shape[-1]], adapted, atol=1e-5, rtol=1e-5)
    if case == "language_modeling":
        ort = pytest.importorskip("onnxruntime")
        export_main(["--checkpoint", str(path), "--format", "onnx", "--out", str(tmp_path / "onnx")])
        session = ort.InferenceSession(str(tmp_path / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
        (logits,) = session.run(["logits"], {"input_ids": x[0].numpy()})
        torch.testing.assert_close(torch.from_numpy(logits), adapted, atol=1e-4, rtol=1e-4)


def test_other_base_weights_are_refused_with_a_message_that_says_so(tmp_path, tokenizer):
    from lit_transformer.interop import save_hf_gpt2

    folder = save_hf_gpt2(build(GPT2, vocab_size=128, pad_token_id=None), tmp_path / "gpt2", tokenizer)
    lit = _adapted(TransformerConfig.preset("tiny"), folder, rank=2)
    _randomize(lit)
    path = _lora_checkpoint(tmp_path / "lora.ckpt", lit, tokenizer)
    load_model(path)  # the same base: fine
    LitTransformer.load_from_checkpoint(path, weights_only=True)
    save_hf_gpt2(build(GPT2, seed=1, vocab_size=128, pad_token_id=None), folder, tokenizer)  # another base there
    for load in (load_model, lambda p: LitTransformer.load_from_checkpoint(p, weights_only=True)):
        with pytest.raises(CheckpointError, match="trained on other base weights than those loaded now") as error:
            load(path)
        assert str(folder) in str(error.value) and "base fingerprint" in str(error.value)


def test_a_base_that_moved_is_named_and_found_again_with_base(tmp_path, tokenizer):
    """The recorded base is gone: loading names it and --base; --base NEWPATH gives the same model, checked by the
    same fingerprint (other weights there are refused)."""
    import shutil

    from lit_transformer.cli.model_commands import generate_main
    from lit_transformer.interop import save_hf_gpt2

    folder = save_hf_gpt2(build(GPT2, vocab_size=128, pad_token_id=None), tmp_path / "gpt2", tokenizer)
    lit = _adapted(TransformerConfig.preset("tiny"), folder, rank=2)
    _randomize(lit)
    path = _lora_checkpoint(tmp_path / "lora.ckpt", lit, tokenizer)
    x = tokens(2, 12)
    with torch.no_grad():
        before = load_model(path).model(x)
    moved = shutil.move(folder, tmp_path / "elsewhere")
    with pytest.raises(CheckpointError, match=f"base {folder}, which does not exist.*--base PATH"):
        load_model(path)
    with pytest.raises(UserError, match=f"base {folder}, which does not exist.*--base PATH"):
        generate_main(["--checkpoint", str(path), "--max_new_tokens", "2"])
    with torch.no_grad():
        torch.testing.assert_close(load_model(path, base=moved).model(x), before, atol=0, rtol=0)
    generate_main(["--checkpoint", str(path), "--base", str(moved), "--max_new_tokens", "2", "--seed", "0"])
    other = save_hf_gpt2(build(GPT2, seed=1, vocab_size=128, pad_token_id=None), tmp_path / "other", tokenizer)
    with pytest.raises(CheckpointError, match=f"than those loaded now from init_from {other}: base fingerprint"):
        load_model(path, base=other)
    with pytest.raises(UserError, match="trained on other base weights"):
        generate_main(["--checkpoint", str(path), "--base", str(other)])


# ---- the command line, from LoRA checkpoints --------------------------------------------------------------------


def _where(run: Path, cache: Path) -> list[str]:
    return [
        "--trainer.default_root_dir", str(run), "--trainer.logger.init_args.save_dir", str(run),
        "--checkpoint.dirpath", str(run / "checkpoints"), "--data.init_args.cache_dir", str(cache),
    ]  # fmt: skip


TINY_LM = ["--config", str(CONFIGS / "presets" / "tiny.yaml"), "--data.init_args.max_chars", "20000"]
STEPS = ["--trainer.val_check_interval", "2", "--trainer.log_every_n_steps", "1"]


def _lora_fit(run: Path, cache: Path, base: Path, steps: int, *extra: str) -> str:
    return _cli(
        "fit", *TINY_LM, "--config", LORA, "--model.init_from", str(base), "--model.lora.rank", "2",
        "--trainer.max_steps", str(steps), *STEPS, "--checkpoint.every_n_train_steps", "2",
        "--checkpoint.save_top_k", "-1", *_where(run, cache), *extra, cwd=ROOT,
    ).stdout  # fmt: skip


@pytest.fixture(scope="module")
def lm_runs(tmp_path_factory) -> Path:
    """A base language model of 2 steps, and a LoRA run of 4 steps from it."""
    root = tmp_path_factory.mktemp("lora_lm")
    cache = root / "cache"
    _cli("fit", *TINY_LM, "--trainer.max_steps", "2", *STEPS, *_where(root / "base", cache), cwd=ROOT)
    out = _lora_fit(root / "lora", cache, root / "base" / "checkpoints" / "last.ckpt", 4)
    (root / "lora" / "stdout.txt").write_text(out)
    return root


@pytest.mark.slow
def test_a_lora_checkpoint_holds_adapters_and_the_base_fingerprint(lm_runs: Path):
    base = lm_runs / "base" / "checkpoints" / "last.ckpt"
    lora = load_checkpoint(lm_runs / "lora" / "checkpoints" / "last.ckpt")
    assert all(".lora_" in k for k in lora["state_dict"]) and lora["state_dict"]
    assert lora["lora"]["base"] == str(base) and lora["hyper_parameters"]["init_from"] == str(base)
    assert lora["lora"]["trainable_params"] < lora["lora"]["total_params"] / 5
    adam = lora["optimizer_states"][0]["state"]
    assert len(adam) == len(lora["state_dict"])  # moments for the adapters only
    assert (lm_runs / "lora" / "checkpoints" / "last.ckpt").stat().st_size < base.stat().st_size / 2
    printed = (lm_runs / "lora" / "stdout.txt").read_text()
    assert f"LoRA: {lora['lora']['trainable_params']:,} of {lora['lora']['total_params']:,} parameters train" in printed
    assert "last.ckpt: " in printed and "on disk; the full model's weights and Adam state" in printed
    # the full model is the base: its size counted the adapters' factors (12 bytes each) too
    from lit_transformer.transforms.lora import _mb

    base_params = lora["lora"]["total_params"] - sum(v.numel() for v in lora["state_dict"].values())
    assert lora["lora"]["base_params"] == base_params and f"alone would take ~{_mb(12 * base_params)}" in printed
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = {p.parent for p in (lm_runs / "lora").rglob("events.out.tfevents.*")}
    acc = EventAccumulator(str(events))
    acc.Reload()
    trainable = acc.Scalars("params/trainable")[0].value
    assert trainable == lora["lora"]["trainable_params"] and acc.Scalars("params/total")[0].value > trainable


@pytest.mark.slow
def test_every_language_model_command_runs_from_a_lora_checkpoint(lm_runs: Path, tmp_path: Path):
    ckpt = lm_runs / "lora" / "checkpoints" / "last.ckpt"
    common = [*TINY_LM, "--trainer.logger", "false", "--data.init_args.cache_dir", str(lm_runs / "cache")]
    for command in ("validate", "test"):
        out = _cli(command, *common, "--ckpt_path", str(ckpt), cwd=tmp_path).stdout
        assert f"{'val' if command == 'validate' else 'test'}/loss" in out
    int8 = _cli("validate", *common, "--ckpt_path", str(ckpt), "--model.quantize", "int8", cwd=tmp_path).stdout
    assert "val/loss" in int8  # int8 layers over the merged weights
    (tmp_path / "prompts.txt").write_text("ROMEO:\nJULIET:\n")
    predict = ["--data.init_args.predict_file", "prompts.txt", "--predictions.output", "out.jsonl"]
    _cli("predict", *common, "--ckpt_path", str(ckpt), *predict, "--model.generation.max_new_tokens", "4", cwd=tmp_path)
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 2
    out = _cli("generate", "--checkpoint", str(ckpt), "--prompt", "ROMEO:", "--max_new_tokens", "8", cwd=tmp_path)
    assert out.stdout.startswith("ROMEO:")
    _cli("average", "--checkpoints", str(ckpt.parent), "--last", "2", "--output", str(tmp_path / "avg.ckpt"), cwd=ROOT)
    averaged = load_checkpoint(tmp_path / "avg.ckpt")
    assert averaged["lora"] == load_checkpoint(ckpt)["lora"] and all(".lora_" in k for k in averaged["state_dict"])
    _cli("generate", "--checkpoint", str(tmp_path / "avg.ckpt"), "--max_new_tokens", "4", cwd=tmp_path)
    # The Hugging Face folder holds the merged model: transformers gives the adapted model's logits.
    _cli("export", "--checkpoint", str(ckpt), "--format", "hf", "--out", str(tmp_path / "hf"), cwd=ROOT)
    adapted = LitTransformer.load_from_checkpoint(ckpt, weights_only=True).model.eval()
    assert any("lora_A" in n for n, _ in adapted.named_parameters())
    x = tokens(2, 16, vocab=60)
    with torch.no_grad():
        hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
        torch.testing.assert_close(hf(x).logits[..., : adapted.config.vocab_size], adapted(x), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_resuming_a_lora_run_continues_exactly(lm_runs: Path, tmp_path: Path):
    """2 steps, then a resume to 4: the same adapters and Adam moments as the uninterrupted 4 steps."""
    base = lm_runs / "base" / "checkpoints" / "last.ckpt"
    _lora_fit(tmp_path, lm_runs / "cache", base, 2)
    _lora_fit(tmp_path, lm_runs / "cache", base, 4, "--ckpt_path", str(tmp_path / "checkpoints" / "last.ckpt"))
    resumed = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    straight = load_checkpoint(lm_runs / "lora" / "checkpoints" / "last.ckpt")
    assert resumed["global_step"] == straight["global_step"] == 4
    assert resumed["state_dict"].keys() == straight["state_dict"].keys()
    for name, value in straight["state_dict"].items():
        assert torch.equal(resumed["state_dict"][name], value), name
    for index, state in straight["optimizer_states"][0]["state"].items():
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(resumed["optimizer_states"][0]["state"][index][key], state[key])


@pytest.mark.slow
def test_an_ema_lora_checkpoint_holds_only_adapters_and_resumes_exactly(lm_runs: Path, tmp_path: Path):
    """With an EMA callback (WeightAveraging), Lightning keeps the trained weights beside the average in
    current_model_state: it held the whole frozen base in every LoRA checkpoint. It holds the adapters, as state_dict
    does, and a resume from step 2 still ends where 4 steps straight do, in both sets of weights."""
    base = lm_runs / "base" / "checkpoints" / "last.ckpt"
    ema = ["--trainer.callbacks+=lightning.pytorch.callbacks.EMAWeightAveraging", "--trainer.callbacks.decay", "0.5"]
    _lora_fit(tmp_path / "straight", lm_runs / "cache", base, 4, *ema)
    straight = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.ckpt")
    assert set(straight["current_model_state"]) == set(straight["state_dict"])
    assert all(".lora_" in k for k in straight["state_dict"])
    assert not torch.equal(*(straight[k]["model.decoder_blocks.0.self_attn.qkv.lora_B.default.weight"]
                             for k in ("state_dict", "current_model_state")))  # fmt: skip
    step2 = tmp_path / "straight" / "checkpoints" / "epoch=0-step=2.ckpt"
    _lora_fit(tmp_path / "resumed", lm_runs / "cache", base, 4, *ema, "--ckpt_path", str(step2))
    resumed = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.ckpt")
    for key in ("state_dict", "current_model_state"):
        assert resumed[key].keys() == straight[key].keys()
        for name, value in straight[key].items():
            assert torch.equal(resumed[key][name], value), (key, name)
    out = _cli("generate", "--checkpoint", str(tmp_path / "resumed" / "checkpoints" / "last.ckpt"),
               "--prompt", "ROMEO:", "--max_new_tokens", "4", cwd=tmp_path)  # fmt: skip
    assert out.stdout.startswith("ROMEO:")


@pytest.mark.slow
def test_validate_and_resume_with_a_base_that_moved(lm_runs: Path, tmp_path: Path):
    """A LoRA checkpoint whose recorded base is gone: validate names it and --model.init_from, which then points at
    the base's new place and wins over the record (fit --ckpt_path resumes the same way)."""
    base = lm_runs / "base" / "checkpoints" / "last.ckpt"
    checkpoint = load_checkpoint(lm_runs / "lora" / "checkpoints" / "last.ckpt")
    gone = str(tmp_path / "old_mount" / "last.ckpt")  # the base as recorded on another machine
    checkpoint["lora"]["base"] = checkpoint["hyper_parameters"]["init_from"] = checkpoint["init_from"] = gone
    torch.save(checkpoint, tmp_path / "lora.ckpt")
    common = [*TINY_LM, "--trainer.logger", "false", "--data.init_args.cache_dir", str(lm_runs / "cache")]
    common += ["--ckpt_path", str(tmp_path / "lora.ckpt")]
    failed = _cli("validate", *common, cwd=tmp_path, ok=False)
    assert f"base {gone}, which does not exist" in failed.stderr and "--model.init_from PATH" in failed.stderr
    assert "Traceback" not in failed.stderr
    assert "val/loss" in _cli("validate", *common, "--model.init_from", str(base), cwd=tmp_path).stdout
    lora = str(lm_runs / "lora" / "checkpoints" / "last.ckpt")  # other weights: the adapted model, merged
    wrong = _cli("validate", *common, "--model.init_from", lora, cwd=tmp_path, ok=False).stderr
    assert f"than those loaded now from init_from {lora}: base fingerprint" in wrong
    # Resuming: 2 more steps from the moved checkpoint; the new checkpoints record where the base is now.
    _lora_fit(tmp_path / "resumed", lm_runs / "cache", base, 6, "--ckpt_path", str(tmp_path / "lora.ckpt"))
    resumed = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.ckpt")
    assert resumed["global_step"] == 6 and resumed["lora"]["base"] == str(base)


@pytest.mark.slow
def test_lora_settings_a_checkpoint_replaces_are_named(lm_runs: Path, tmp_path: Path, caplog):
    """validate --ckpt_path LORA.ckpt --model.lora.alpha 64 scored the checkpoint's alpha (16) and a resume with
    --model.lora.rank 4 went on at rank 2, while the notice of settings not used named none of them."""
    common = [*TINY_LM, "--trainer.logger", "false", "--data.init_args.cache_dir", str(lm_runs / "cache")]
    common += ["--ckpt_path", str(lm_runs / "lora" / "checkpoints" / "last.ckpt"), "--trainer.limit_val_batches", "1"]
    _cli("validate", *common, "--model.lora.alpha", "64", "--model.lora.rank", "4", cwd=tmp_path)
    (notice,) = [r.getMessage() for r in caplog.records if "settings are not used" in r.getMessage()]
    assert (
        "model.lora.alpha 64.0 (the checkpoint's: 16.0)" in notice
        and "model.lora.rank 4 (the checkpoint's: 2)" in notice
    )


@pytest.mark.slow
def test_translation_from_a_lora_checkpoint(tmp_path: Path):
    preset = ["--config", str(CONFIGS / "presets" / "tiny-translate.yaml"), "--data.init_args.max_pairs", "300"]
    short = ["--trainer.max_steps", "2", "--trainer.val_check_interval", "2", "--trainer.num_sanity_val_steps", "0"]
    cache = tmp_path / "cache"
    _cli("fit", *preset, *short, *_where(tmp_path / "base", cache), cwd=ROOT)
    base = tmp_path / "base" / "checkpoints" / "last.ckpt"
    lora = [*preset, "--config", LORA, "--model.init_from", str(base), *short]
    _cli("fit", *lora, *_where(tmp_path / "lora", cache), cwd=ROOT)
    ckpt = tmp_path / "lora" / "checkpoints" / "last.ckpt"
    assert "cross_attn.kv.lora_A.default.weight" in " ".join(load_checkpoint(ckpt)["state_dict"])
    (tmp_path / "sources.txt").write_text("In the beginning God created the heaven and the earth.\n")
    translate = ["--input", "sources.txt", "--max_new_tokens", "6", "--num_beams", "2"]
    translated = _cli("translate", "--checkpoint", str(ckpt), *translate, cwd=tmp_path).stdout.splitlines()
    args = [*preset, "--trainer.logger", "false", "--data.init_args.cache_dir", str(cache), "--ckpt_path", str(ckpt)]
    args += ["--data.init_args.predict_file", "sources.txt", "--predictions.output", "out.jsonl"]
    _cli("predict", *args, "--model.generation.max_new_tokens", "6", cwd=tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["output"] for r in rows] == translated


@pytest.mark.slow
def test_masked_lm_and_classifier_from_lora_checkpoints(tmp_path: Path):
    from test_cli_classification import SHORT, TINY

    mlm, genre = str(CONFIGS / "presets" / "mlm.yaml"), str(CONFIGS / "presets" / "classify-genre.yaml")
    cache = tmp_path / "cache"
    where = lambda name: _where(tmp_path / name, cache)  # noqa: E731
    _cli("fit", "--config", mlm, *TINY, *SHORT, *where("mlm"), cwd=ROOT)
    base = ["--model.init_from", str(tmp_path / "mlm" / "checkpoints" / "last.ckpt"), "--config", LORA]
    _cli("fit", "--config", mlm, *TINY, *SHORT, *base, *where("mlm_lora"), cwd=ROOT)
    _cli("fit", "--config", genre, *TINY, *SHORT, *base, *where("genre_lora"), cwd=ROOT)
    ckpt = tmp_path / "genre_lora" / "checkpoints" / "last.ckpt"
    saved = load_checkpoint(ckpt)
    assert any(".classifier." in k for k in saved["state_dict"])  # the new head trained in full
    assert saved["label_names"] == ["comedy", "history", "tragedy"]
    # Two test batches: the command runs from the LoRA checkpoint and reports its metrics (all 347 took ~6 s of CPU).
    test = ["--ckpt_path", str(ckpt), "--trainer.limit_test_batches", "2"]
    out = _cli("test", "--config", genre, *TINY, *where("genre_lora"), *test, cwd=ROOT).stdout
    assert "test/f1" in out
    mlm_ckpt = str(tmp_path / "mlm_lora" / "checkpoints" / "last.ckpt")
    out = _cli("validate", "--config", mlm, *TINY, *where("mlm_lora"), "--ckpt_path", mlm_ckpt, cwd=ROOT).stdout
    assert "val/accuracy" in out
    (tmp_path / "lines.txt").write_text("To be, or not to be\n")
    predict = ["--data.init_args.predict_file", str(tmp_path / "lines.txt"), "--predictions.output", "p.jsonl"]
    _cli("predict", "--config", genre, *TINY, *where("genre_lora"), "--ckpt_path", str(ckpt), *predict, cwd=tmp_path)
    assert json.loads((tmp_path / "p.jsonl").read_text())["label"] in saved["label_names"]
    # The corpus was tokenized once: the runs from the base's checkpoint key its tokenizer (with the <mask> the
    # base's fit added) as that fit did (they tokenized it again, a second time as long as the first).
    assert len(list((cache / "labelled").glob("*/manifest.json"))) == 1


@pytest.mark.slow
def test_captioning_from_a_lora_checkpoint(tmp_path: Path):
    from test_cli_captioning import PRESET, _small

    _cli("fit", "--config", PRESET, *_small(tmp_path / "base"), cwd=ROOT)
    init = ["--config", LORA, "--model.init_from", str(tmp_path / "base" / "checkpoints" / "last.ckpt")]
    _cli("fit", "--config", PRESET, *_small(tmp_path / "lora"), *init, cwd=ROOT)
    ckpt = ["--ckpt_path", str(tmp_path / "lora" / "checkpoints" / "last.ckpt")]
    out = _cli("test", "--config", PRESET, *_small(tmp_path / "lora"), *ckpt, cwd=ROOT).stdout
    assert "test/" in out


@pytest.mark.slow
@pytest.mark.parametrize("fragment", ["activation_checkpointing", "compile"])
def test_lora_with_activation_checkpointing_and_compile(lm_runs: Path, tmp_path: Path, monkeypatch, fragment: str):
    monkeypatch.setenv("LIT_TRANSFORMER_COMPILE_BACKEND", "aot_eager")  # seconds, not inductor's minutes
    base = lm_runs / "base" / "checkpoints" / "last.ckpt"
    _lora_fit(tmp_path, lm_runs / "cache", base, 2, "--config", str(CONFIGS / "trainer" / f"{fragment}.yaml"))
    saved = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert saved["state_dict"] and all(".lora_" in k for k in saved["state_dict"])
    load_model(tmp_path / "checkpoints" / "last.ckpt")


@pytest.mark.slow
def test_lora_with_ddp_on_two_cpu_processes(lm_runs: Path, tmp_path: Path):
    """Both ranks hold the same adapters after 4 steps; the checkpoint holds the adapters only."""
    base = lm_runs / "base" / "checkpoints" / "last.ckpt"
    _process(
        "fit", *TINY_LM, "--config", str(CONFIGS / "trainer" / "ddp_cpu.yaml"), "--config", LORA,
        "--model.init_from", str(base), "--trainer.max_steps", "4", *STEPS, *_where(tmp_path, lm_runs / "cache"),
        "--trainer.callbacks+=_boring.RankParameters", f"--trainer.callbacks.dirpath={tmp_path / 'ranks'}",
        cwd=ROOT, env=HARNESS_ENV,
    )  # fmt: skip
    saved = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert saved["global_step"] == 4 and all(".lora_" in k for k in saved["state_dict"])
    ranks = [torch.load(tmp_path / "ranks" / f"rank{r}.pt") for r in (0, 1)]
    assert [(r["rank"], r["world_size"]) for r in ranks] == [(0, 2), (1, 2)]
    for name, value in ranks[0]["params"].items():
        assert torch.equal(value, ranks[1]["params"][name]), name
    b_matrices = [v for n, v in ranks[0]["params"].items() if "lora_B" in n]
    assert b_matrices and any(v.abs().sum() > 0 for v in b_matrices)  # the adapters moved


def test_every_command_of_the_finetuning_page_parses(monkeypatch) -> None:
    """docs/finetuning.md's commands parse with the CLI's own parsers (X.yaml, the page's placeholder, read as the tiny
    preset), and the flags do what the page says: LoRA on, the base named, the rank-16 command's settings taken."""
    import re

    from test_multinode import Parsed, lit_transformer_words, parse

    import lit_transformer.cli.export_command as export_command
    import lit_transformer.cli.model_commands as model_commands
    import lit_transformer.inference as inference

    text = (ROOT / "docs" / "finetuning.md").read_text()
    lines = [re.sub(r"\\\n\s*", "", b).splitlines() for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]
    # the CLI's commands (`bench lora`, the benchmark's, is parsed by tests/test_doc_commands.py)
    commands = [
        line.strip() for block in lines for line in block if "lit_transformer" in line and " bench " not in line
    ]
    assert len(commands) == 8, commands
    monkeypatch.setattr(inference, "_load", lambda args: (_ for _ in ()).throw(Parsed(args)))
    monkeypatch.setattr(export_command, "run_export", lambda args: (_ for _ in ()).throw(Parsed(args)))
    for command in commands:
        words = [w.replace("X.yaml", str(CONFIGS / "presets" / "tiny.yaml")) for w in lit_transformer_words(command)[2]]
        if words[0] == "generate":  # its own parser; it stops before loading the checkpoint
            with pytest.raises(Parsed) as parsed:
                model_commands.generate_main(words[1:])
            assert parsed.value.args[0].base == "/mnt/models/gpt2"
            continue
        if words[0] == "export":  # the adapters in peft's format
            with pytest.raises(Parsed) as parsed:
                model_commands.export_main(words[1:])
            assert parsed.value.args[0].format == "peft"
            continue
        model = yaml.safe_load(parse(words))["model"]
        assert model["init_from"] == words[words.index("--model.init_from") + 1], command
        if "configs/finetune/lora.yaml" in words and "--model.lora.rank" not in words:
            assert model["lora"]["rank"] == 8, command
    lora = yaml.safe_load(parse(lit_transformer_words(commands[1])[2]))["model"]["lora"]
    assert (lora["rank"], lora["target_modules"], lora["trainable"]) == (
        16, ["qkv", "q", "kv", "out", "up", "down"], ["norms"]
    )  # fmt: skip
