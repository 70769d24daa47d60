"""Muon for the hidden matrices and AdamW for the rest, as one optimizer (`model.optim.optimizer: muon`): the split
by role, what reaches torch.optim.Muon, the state of both parts through a checkpoint and a resume (to the bit),
clipping, the non-finite guard and gradient accumulation over both parts, LoRA, every task's model, the momentum
warm-up, and the strategies that cannot take it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from model_variants import GPT2, MODERN_BASE, PAPER, build, single_thread, tokens  # noqa: F401 (autouse fixture)

from lit_transformer.config import TransformerConfig
from lit_transformer.engine.lightning_module import LitTransformer
from lit_transformer.engine.optimizers import (
    MuonWithAdamW,
    Optimization,
    build_optimizer,
    check_optimizer_strategy,
    muon_momentum_at,
    muon_parameters,
)
from lit_transformer.errors import ConfigError
from lit_transformer.model.positions import LearnedPositions

TESTS = Path(__file__).parent
ROOT = TESTS.parent
sys.path.insert(0, str(TESTS))
import _boring  # noqa: E402

VARIANTS = {
    "gpt2-tied": GPT2,
    "paper-encoder_decoder": PAPER,
    "frontier-untied": {
        "topology": "decoder_only",
        **MODERN_BASE,
        "positions": "rope",
        "norm": "rmsnorm",
        "activation": "swiglu",
        "n_kv_heads": 2,
        "qk_norm": True,
        "value_residual": True,
        "tie_embeddings": False,
    },
    "classifier": {"topology": "encoder_only", "positions": "learned", "num_labels": 3},
    "masked_lm-untied": {"topology": "encoder_only", "head": "masked_lm", "mask_token_id": 4, "tie_embeddings": False},
}


def role(model: torch.nn.Module) -> dict[str, str]:
    """Each parameter's role, read from the module that owns it (not from the package's split): hidden (a weight
    of a Linear inside an attention or feed-forward sublayer) or what else it is."""
    roles: dict[int, str] = {}
    for name, module in model.named_modules():
        for attr, param in module.named_parameters(recurse=False):
            in_sublayer = any(f".{part}" in f".{name}" for part in ("self_attn.", "cross_attn.", "ff."))
            if isinstance(module, (torch.nn.Embedding, LearnedPositions)):
                kind = "table"
            elif isinstance(module, (torch.nn.LayerNorm, torch.nn.RMSNorm)):
                kind = "norm"
            elif attr == "bias":
                kind = "bias"
            elif isinstance(module, torch.nn.Linear):
                kind = "hidden" if in_sublayer else "head"
            elif attr == "value_mix":
                kind = "scalar"
            else:
                raise AssertionError(f"a parameter this test does not know: {name}.{attr}")
            roles.setdefault(id(param), kind)  # a tied output layer is its table
    return {name: roles[id(p)] for name, p in model.named_parameters()}


def muon_of(variant: dict, **optim) -> tuple[LitTransformer, MuonWithAdamW]:
    torch.manual_seed(0)
    lit = LitTransformer(
        TransformerConfig.preset("tiny", **variant),
        optim=Optimization(optimizer="muon", schedule="constant", warmup_steps=0, **optim),
    )
    return lit, lit.configure_optimizers()["optimizer"]


# ---- the split ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS.values(), ids=VARIANTS.keys())
def test_hidden_matrices_go_to_muon_and_everything_else_to_adamw(variant: dict) -> None:
    lit, optimizer = muon_of(variant, weight_decay=0.1)
    assert isinstance(optimizer, MuonWithAdamW)
    names = {id(p): n for n, p in lit.model.named_parameters()}
    part: dict[str, str] = {}
    decay: dict[str, float] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            assert names[id(p)] not in part, f"{names[id(p)]} is in two groups"
            part[names[id(p)]], decay[names[id(p)]] = group["optimizer"], group["weight_decay"]
    roles = role(lit.model)
    assert set(part) == set(roles), "every parameter, once"
    assert {n for n, r in roles.items() if r == "hidden"} == {n for n, o in part.items() if o == "muon"}
    # The embedding, the output layer (tied: the embedding; untied: a matrix of its own), norm gains, biases and
    # value_residual's scalars are AdamW's; only an untied output layer or a classifier's matrices decay there.
    assert all(part[n] == "adamw" for n, r in roles.items() if r != "hidden")
    assert {n for n, r in roles.items() if r != "hidden" and decay[n] > 0} == {
        n for n, r in roles.items() if r == "head"
    }
    assert "table" in roles.values() and "norm" in roles.values()
    if not variant.get("tie_embeddings", True) and "lm_head.weight" in roles:
        assert part["lm_head.weight"] == "adamw" and roles["lm_head.weight"] == "head"
    if variant.get("qk_norm"):
        assert part["decoder_blocks.0.self_attn.q_norm.weight"] == "adamw"
        assert part["decoder_blocks.1.self_attn.value_mix"] == "adamw"
    muon = [p for g in optimizer.param_groups if g["optimizer"] == "muon" for p in g["params"]]
    assert muon and all(p.ndim == 2 for p in muon)
    assert [g["lr"] for g in optimizer.param_groups] == [3e-4, 3e-4, 0.02]  # the defaults: lr, muon_lr


def test_only_two_dimensional_matrices_ever_reach_torchs_muon(monkeypatch) -> None:
    """The Newton-Schulz iteration (torch's, spied on) sees exactly the hidden matrices' updates, each 2-D; a 1-D
    piece of one (what a sharding strategy hands over) is refused before Muon is built, naming the parameter."""
    from torch.optim import _muon

    seen: list[tuple[int, ...]] = []
    real = _muon._zeropower_via_newtonschulz

    def spy(grad, *args, **kwargs):
        seen.append(tuple(grad.shape))
        return real(grad, *args, **kwargs)

    monkeypatch.setattr(_muon, "_zeropower_via_newtonschulz", spy)
    lit, optimizer = muon_of(VARIANTS["frontier-untied"])
    lit.model(tokens(2, 8)).logsumexp(-1).sum().backward()
    optimizer.step()
    hidden = [tuple(p.shape) for n, p in lit.model.named_parameters() if role(lit.model)[n] == "hidden"]
    assert sorted(seen) == sorted(hidden) and all(len(s) == 2 for s in seen)
    model = build(GPT2)
    up = model.decoder_blocks[1].ff.up
    up.weight = torch.nn.Parameter(up.weight.detach().flatten())
    with pytest.raises(ConfigError, match=r"decoder_blocks\.1\.ff\.up\.weight is \(2048,\).*use ddp"):
        muon_parameters(model)


def newton_schulz(g: torch.Tensor, dtype: torch.dtype, steps: int = 5) -> torch.Tensor:
    """Keller Jordan's quintic iteration, X <- aX + (bA + cA^2) X with A = X X^T, from g / |g|_F on the wide
    orientation: it pushes the singular values of g towards 1. torch runs it in bf16, where the rounding of the
    small singular values grows from step to step (a quarter of the update's norm apart from fp32's)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = (g.T if g.shape[0] > g.shape[1] else g).to(dtype)
    x = x / x.norm().clamp(min=1e-7)
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return (x.T if g.shape[0] > g.shape[1] else x).float()


def test_a_muon_step_orthogonalises_the_hidden_update_and_adamw_moves_the_rest() -> None:
    """One step from zero momentum, no decay: a hidden matrix moves by -muon_lr * sqrt(max(1, rows/cols)) * NS(g),
    NS the Newton-Schulz iteration in bf16 as torch runs it (and close in direction to the exact iteration), whose
    leading singular values lie near 1; a norm gain moves by AdamW's first step, lr * sign(g)."""
    lit, optimizer = muon_of(GPT2, muon_momentum=0.0, muon_momentum_warmup_steps=0, muon_nesterov=False, lr=1e-3)
    model = lit.model
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model(tokens(2, 8)).logsumexp(-1).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    optimizer.step()
    qkv = "decoder_blocks.0.self_attn.qkv.weight"  # (96, 32): sqrt(96 / 32)
    update = (before[qkv] - model.get_parameter(qkv).detach()) / (0.02 * 3**0.5)
    torch.testing.assert_close(update, newton_schulz(grads[qkv], torch.bfloat16), atol=1e-3, rtol=0.02)
    exact = newton_schulz(grads[qkv].double(), torch.float64)
    assert F.cosine_similarity(update.flatten().double(), exact.flatten(), dim=0) > 0.9
    singular = torch.linalg.svdvals(update)
    assert 0.5 < singular[0] < 1.6 and singular[:4].min() > 0.5  # the gradient's leading directions, at about 1
    gain = "decoder_blocks.0.ff_norm.weight"
    torch.testing.assert_close(
        model.get_parameter(gain).detach(), before[gain] - 1e-3 * grads[gain].sign(), atol=1e-6, rtol=0
    )


def test_lora_trains_only_adapters_with_muon_whose_part_is_then_empty(tmp_path) -> None:
    from tokenizers import Tokenizer, models

    from lit_transformer.interop import save_hf_gpt2
    from lit_transformer.transforms import LoraOptions

    vocab = {f"t{i}": i for i in range(128)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    folder = save_hf_gpt2(build(GPT2, vocab_size=128, pad_token_id=None), tmp_path / "gpt2", tokenizer)
    optim = Optimization(optimizer="muon", schedule_steps=10)
    lit = LitTransformer(
        TransformerConfig.preset("tiny"),
        init_from=str(folder),
        lora=LoraOptions(rank=2, trainable=["norms"]),
        optim=optim,
    )
    lit.configure_model()
    optimizer = lit.configure_optimizers()["optimizer"]
    trainable = {id(p) for p in lit.parameters() if p.requires_grad}
    assert {id(p) for g in optimizer.param_groups for p in g["params"]} == trainable
    (muon_group,) = [g for g in optimizer.param_groups if g["optimizer"] == "muon"]
    assert muon_group["params"] == []  # the frozen base has no trainable hidden matrix; adapters are AdamW's
    lit.model(tokens(2, 12)).logsumexp(-1).sum().backward()
    optimizer.step()
    assert {id(p) for p in optimizer.state} == trainable


# ---- state: checkpoint, resume ------------------------------------------------------------------------------------


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int, seed: int) -> None:
    for step in range(steps):
        x = tokens(4, 12, seed=seed + step)
        optimizer.zero_grad()
        F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten()).backward()
        optimizer.step()


def test_the_state_dict_holds_both_parts_and_a_loaded_optimizer_continues_to_the_bit() -> None:
    variant = VARIANTS["frontier-untied"]
    lit, optimizer = muon_of(variant, muon_momentum_warmup_steps=4)
    _train(lit.model, optimizer, 3, seed=10)
    state = optimizer.state_dict()
    kinds = {g["optimizer"]: {k for i in g["params"] for k in state["state"][i]} for g in state["param_groups"]}
    assert kinds == {"adamw": {"step", "exp_avg", "exp_avg_sq"}, "muon": {"momentum_buffer"}}
    assert [g["steps_taken"] for g in state["param_groups"] if g["optimizer"] == "muon"] == [3]
    saved_model = {k: v.clone() for k, v in lit.model.state_dict().items()}
    saved_state = torch.load(_roundtrip(state), weights_only=True)  # what a checkpoint file gives back

    fresh, other = muon_of(variant, muon_momentum_warmup_steps=4)
    fresh.model.load_state_dict(saved_model)
    other.load_state_dict(saved_state)
    assert other.muon.state is other.state and other.adamw.state is other.state  # the parts read the loaded state
    assert other.muon.param_groups[0] is other.param_groups[-1]
    _train(lit.model, optimizer, 3, seed=20)
    _train(fresh.model, other, 3, seed=20)
    for (name, a), b in zip(lit.model.state_dict().items(), fresh.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert (
        optimizer.param_groups[-1]["momentum"]
        == other.param_groups[-1]["momentum"]
        == muon_momentum_at(5, target=0.95, start=0.85, warmup=4)
    )


def _roundtrip(state: dict):
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


def test_the_momentum_warms_up_linearly_then_holds() -> None:
    assert muon_momentum_at(0, target=0.95, start=0.85, warmup=300) == 0.85
    assert muon_momentum_at(150, target=0.95, start=0.85, warmup=300) == pytest.approx(0.90)
    assert muon_momentum_at(300, target=0.95, start=0.85, warmup=300) == 0.95
    assert muon_momentum_at(10_000, target=0.95, start=0.85, warmup=300) == 0.95
    assert muon_momentum_at(0, target=0.95, start=0.85, warmup=0) == 0.95
    _, optimizer = muon_of(GPT2, muon_momentum_warmup_steps=2, muon_momentum_start=0.5, muon_momentum=0.9)
    momenta = []
    for _ in range(4):
        optimizer.step()
        momenta.append(optimizer.param_groups[-1]["momentum"])
    assert momenta == pytest.approx([0.5, 0.7, 0.9, 0.9])


def _cli_fit(folder: Path, steps: int, cache: Path, *extra: str) -> None:
    from test_cli import _cli

    _cli(
        "fit", "--config", "configs/presets/tiny.yaml",
        "--model.optim.optimizer", "muon", "--model.optim.muon_momentum_warmup_steps", "6",
        "--model.config.dropout", "0.1", "--trainer.max_steps", str(steps), "--trainer.limit_val_batches", "0",
        "--trainer.default_root_dir", str(folder), "--checkpoint.dirpath", str(folder / "ckpt"),
        "--checkpoint.every_n_train_steps", "1", "--data.init_args.cache_dir", str(cache), "--samples.prompts", "[]",
        "--attention.max_layers", "0", "--trainer.enable_progress_bar", "false", "--trainer.logger", "false", *extra,
        cwd=ROOT,
    )  # fmt: skip


@pytest.mark.slow
def test_a_resume_mid_run_with_muon_equals_an_uninterrupted_run_to_the_bit(tmp_path: Path) -> None:
    """fit through the CLI for 8 steps, against 4 steps then `--ckpt_path last` to 8 (the momentum warm-up spans the
    cut, dropout on): the same weights and the same optimizer state (both parts), bit for bit."""
    from lit_transformer.checkpoints.files import load_checkpoint

    cache = tmp_path / "cache"
    _cli_fit(tmp_path / "full", 8, cache)
    _cli_fit(tmp_path / "cut", 4, cache)
    _cli_fit(tmp_path / "cut", 8, cache, "--ckpt_path", "last")
    full, resumed = (load_checkpoint(tmp_path / run / "ckpt" / "last.ckpt") for run in ("full", "cut"))
    assert full["global_step"] == resumed["global_step"] == 8
    for name, value in full["state_dict"].items():
        assert torch.equal(value, resumed["state_dict"][name]), name
    (a,), (b,) = full["optimizer_states"], resumed["optimizer_states"]
    assert a["param_groups"] == b["param_groups"] and a["param_groups"][-1]["steps_taken"] == 8
    assert a["state"].keys() == b["state"].keys()
    for index, values in a["state"].items():
        for key, value in values.items():
            assert torch.equal(value, b["state"][index][key]), (index, key)


# ---- clipping, the non-finite guard, accumulation -----------------------------------------------------------------


class TinyMuon(_boring.TinyModule):
    """_boring's module with Muon on both weight matrices and AdamW on the biases."""

    def configure_optimizers(self):
        first, last = self.net[0], self.net[3]
        optimizer = MuonWithAdamW(
            [{"params": [first.bias, last.bias], "weight_decay": 0.0}],
            [first.weight, last.weight],
            lr=1e-2,
            betas=(0.9, 0.95),
            eps=1e-8,
            fused=False,
            muon_lr=0.05,
        )
        return optimizer


@pytest.mark.parametrize("accumulate", [1, 2])
def test_a_non_finite_step_skips_both_parts_and_clipping_covers_both(tmp_path: Path, accumulate: int) -> None:
    """A NaN loss at step 3: no parameter moves (Muon's matrices nor AdamW's biases), AdamW counts 5 real steps;
    clipping at 1e-3 scales every gradient of both parts, so the clipped norm the parts step with is 1e-3."""
    from lit_transformer.engine.nonfinite_guard import NonFiniteLossGuard

    module = TinyMuon(nan_at=(3,))
    norms: list[float] = []

    class ClippedNorm(_boring.Callback):
        def on_train_start(self, trainer, pl_module) -> None:
            inner = trainer.optimizers[0].muon  # its step runs once clipping is done, before either part moves
            inner.register_step_pre_hook(lambda *args: norms.append(_total_norm(trainer.optimizers[0])))

    import lightning.pytorch as pl

    pl.seed_everything(7, verbose=False)
    trainer = _boring.make_trainer(
        tmp_path, 6, accumulate_grad_batches=accumulate, gradient_clip_val=1e-3, extra_callbacks=[ClippedNorm()]
    )
    trainer.fit(module)
    guard = next(cb for cb in trainer.callbacks if isinstance(cb, NonFiniteLossGuard))
    records = {
        r["step"]: r for r in map(__import__("json").loads, (tmp_path / "losses.jsonl").read_text().splitlines())
    }
    assert guard.skipped == 1 and records[4]["weights"] == records[3]["weights"]
    assert records[5]["weights"] != records[4]["weights"]
    optimizer = trainer.optimizers[0]
    assert all(float(optimizer.state[p]["step"]) == 5 for p in (module.net[0].bias, module.net[3].bias))
    assert all("momentum_buffer" in optimizer.state[p] for p in (module.net[0].weight, module.net[3].weight))
    finite = [n for n in norms if n == n and n > 0]  # the skipped step has no gradient left
    assert len(finite) == 5 and all(n == pytest.approx(1e-3, rel=1e-4) for n in finite)


def _total_norm(optimizer: torch.optim.Optimizer) -> float:
    grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    return float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0


# ---- every task, the strategies that cannot take it ---------------------------------------------------------------


def test_sharding_strategies_are_refused_before_training_naming_the_fix() -> None:
    from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy

    muon = Optimization(optimizer="muon")
    for strategy in ("fsdp", "deepspeed_stage_2", "lightning.pytorch.strategies.ModelParallelStrategy", FSDPStrategy()):
        with pytest.raises(ConfigError, match="optimizer=muon orthogonalises whole weight matrices.*strategy ddp"):
            check_optimizer_strategy(muon, strategy)
    for strategy in ("ddp", "auto", "ddp_spawn", DDPStrategy()):
        check_optimizer_strategy(muon, strategy)
    check_optimizer_strategy(Optimization(optimizer="adamw"), "fsdp")  # AdamW shards fine
    # The engine's own check, for runs built without the command line: in setup, before the optimizer exists.
    from types import SimpleNamespace

    lit, _ = muon_of(GPT2)
    lit._trainer = SimpleNamespace(strategy=FSDPStrategy())
    with pytest.raises(ConfigError, match="trainer.strategy='FSDPStrategy' shards them"):
        lit.setup("fit")


def test_the_command_line_refuses_muon_with_fsdp_in_one_line() -> None:
    from test_cli import _cli

    result = _cli(
        "fit", "--config", "configs/presets/tiny.yaml", "--model.optim.optimizer", "muon", "--trainer.strategy", "fsdp",
        cwd=ROOT, ok=False,
    )  # fmt: skip
    assert "optimizer=muon orthogonalises whole weight matrices" in result.stderr
    assert "Traceback" not in result.stderr


def test_invalid_muon_and_schedule_settings_are_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="model.optim.decay_fraction=0.0 must lie in"):
        Optimization(schedule="wsd", decay_fraction=0.0)
    with pytest.raises(ConfigError, match="model.optim.muon_momentum=1.0 must lie in"):
        Optimization(optimizer="muon", muon_momentum=1.0)
    with pytest.raises(ConfigError, match="model.optim.optimizer='lion' is not one of"):
        Optimization(optimizer="lion")


@pytest.mark.parametrize(
    "preset", ["tiny", "tiny-translate", "classify-genre", "mlm", "caption-digits"], ids=lambda p: p
)
def test_muon_takes_an_optimizer_step_for_every_task(preset: str, tmp_path: Path) -> None:
    """One real step through the CLI on each task's preset: the split holds for every head and input."""
    from test_variants import tiny_run

    (tmp_path / "configs").symlink_to(ROOT / "configs")
    tiny_run(tmp_path, "--config", f"configs/presets/{preset}.yaml", "--model.optim.optimizer", "muon")
    from lit_transformer.checkpoints.files import load_checkpoint

    (checkpoint,) = [load_checkpoint(p) for p in (tmp_path / "runs").glob("*/checkpoints/last.ckpt")]
    assert checkpoint["global_step"] == 1
    groups = checkpoint["optimizer_states"][0]["param_groups"]
    assert [g["optimizer"] for g in groups] == ["adamw", "adamw", "muon"] and groups[-1]["params"]


def test_build_optimizer_picks_muon_and_keeps_adam_as_it_was() -> None:
    model = build(GPT2)
    assert isinstance(build_optimizer(model, Optimization(optimizer="muon"), fused=False), MuonWithAdamW)
    assert type(build_optimizer(model, Optimization(), fused=False)) is torch.optim.AdamW


@pytest.mark.slow
def test_ddp_ranks_stay_identical_with_muon(tmp_path: Path) -> None:
    """Two CPU processes (gloo): DDP averages the gradients, each rank runs both parts of the optimizer on them, and
    the replicas end the run with the same parameters, bit for bit."""
    from test_resume import MAX_STEPS, _command, _run

    _run(_command(tmp_path, "--model.optim.optimizer", "muon", devices=2), timeout=300)
    ranks = [torch.load(tmp_path / "ranks" / f"rank{r}.pt") for r in (0, 1)]
    assert [(r["rank"], r["step"]) for r in ranks] == [(0, MAX_STEPS), (1, MAX_STEPS)]
    for name, value in ranks[0]["params"].items():
        assert torch.equal(value, ranks[1]["params"][name]), name
    from lit_transformer.checkpoints.files import load_checkpoint

    groups = load_checkpoint(tmp_path / "ckpt" / "last.ckpt")["optimizer_states"][0]["param_groups"]
    assert groups[-1]["optimizer"] == "muon" and groups[-1]["steps_taken"] == MAX_STEPS


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--model.optim.schedule", "wsd", "--model.optim.decay_fraction", "1.5"], "model.optim.decay_fraction=1.5"),
        (["--model.config.zero_init_output", "true"], "zero_init_output=True starts the output layer at zero"),
    ],
)
def test_a_mistake_in_the_new_keys_is_refused_in_a_few_lines_without_a_traceback(flags, message) -> None:
    from test_cli import _cli

    result = _cli("fit", "--config", "configs/presets/tiny.yaml", *flags, cwd=ROOT, ok=False)
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) <= 4
