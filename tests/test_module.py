"""LitTransformer inside a real Trainer: precision, fused optimizers and clipping; callbacks under sharding."""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import sacrebleu
import torch
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy
from torch.utils.data import DataLoader

from lit_transformer.config import GenerationConfig, TransformerConfig
from lit_transformer.engine.lightning_module import LitTransformer
from lit_transformer.engine.optimizers import weight_decay_groups
from lit_transformer.engine.task_outputs import GenerateSamples, _sharded_across_ranks
from lit_transformer.tasks import LanguageModeling
from lit_transformer.tasks.losses import IGNORE_INDEX, smoothed_cross_entropy

sys.path.insert(0, str(Path(__file__).parent))
from _forked import HARNESS_ENV, warm_python  # noqa: E402
from _token_loss import CONFIG as CONFIG_TINY  # noqa: E402
from _token_loss import GradientRecorder, micro_batches, one_batch, per_token_gradient  # noqa: E402
from _token_loss import module as token_module  # noqa: E402
from model_variants import VARIANTS, build, single_thread, variant_id  # noqa: E402, F401 (autouse fixture)


def _batches(vocab: int, n: int = 4, batch: int = 2, length: int = 16) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        ids = torch.randint(0, vocab, (batch, length + 1), generator=g)
        out.append({"input_ids": ids[:, :-1], "labels": ids[:, 1:]})
    return out


class _GradNormAfterStep(L.Callback):
    """Records the gradient norm the optimizer stepped with (clipping has happened by then)."""

    def __init__(self) -> None:
        self.norms: list[float] = []

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        def record(optimizer, *args) -> None:
            grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            self.norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))

        trainer.optimizers[0].register_step_post_hook(record)


def test_bf16_mixed_with_a_fused_optimizer_clips_gradients(tmp_path) -> None:
    """Lightning's mixed-precision plugin refuses to clip for fused optimizers; bf16 has no scaler, so we clip."""
    cfg = TransformerConfig.preset("tiny", dropout=0.0)
    module = LitTransformer(cfg, fused=True, lr=1e-3, warmup_steps=0, schedule="constant")
    recorder = _GradNormAfterStep()
    trainer = L.Trainer(
        accelerator="cpu",
        precision="bf16-mixed",
        gradient_clip_val=1e-3,
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[recorder],
    )
    trainer.fit(module, train_dataloaders=DataLoader(_batches(cfg.vocab_size), batch_size=None))
    assert trainer.global_step == 3
    assert trainer.optimizers[0].defaults["fused"]
    assert len(recorder.norms) == 3 and all(n <= 1e-3 * 1.01 for n in recorder.norms), recorder.norms


def test_flops_per_token_does_not_read_parameters_after_construction() -> None:
    """FSDP replaces parameters by flat views mid-run: the count is taken once, before."""
    model = LitTransformer(TransformerConfig.preset("tiny")).model
    before = model.flops_per_token(32)
    for name, _ in list(model.named_parameters()):
        module_path, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(module_path) if module_path else model, leaf, None)
    assert model.flops_per_token(32) == before


@pytest.mark.parametrize(
    "strategy, world_size, skipped",
    [(FSDPStrategy(), 2, True), (FSDPStrategy(), 1, False), (DDPStrategy(), 2, False)],
)
def test_model_running_callbacks_stand_aside_when_parameters_are_sharded(strategy, world_size, skipped) -> None:
    trainer = SimpleNamespace(strategy=strategy, world_size=world_size)
    if skipped:
        with pytest.warns(UserWarning, match="GenerateSamples is skipped"):
            assert _sharded_across_ranks(trainer, GenerateSamples())
    else:
        assert not _sharded_across_ranks(trainer, GenerateSamples())


# ---- loss normalisation: per target token of the optimizer step -------------------------------------------------


def _first_step_gradient(lit: LitTransformer, batches: list[dict[str, torch.Tensor]], accumulate: int) -> dict:
    recorder = GradientRecorder()
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=1,
        accumulate_grad_batches=accumulate,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[recorder],
    )
    trainer.fit(lit, train_dataloaders=DataLoader(batches, batch_size=None))
    return recorder.grads[0]


def _assert_same_gradients(actual: dict, expected: dict, atol: float = 1e-6) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], atol=atol, rtol=0, msg=name)


def test_uneven_accumulated_micro_batches_give_the_gradient_of_one_batch_holding_both() -> None:
    """A micro-batch weighs by its target tokens: two of 8 and 27 tokens accumulate to the 35-token batch's gradient."""
    batches = micro_batches(0)
    accumulated = _first_step_gradient(token_module(), batches, accumulate=2)
    together = _first_step_gradient(token_module(), [one_batch(batches)], accumulate=1)
    _assert_same_gradients(accumulated, together)
    _assert_same_gradients(accumulated, per_token_gradient(token_module(), batches))


def test_per_batch_normalization_averages_the_micro_batch_means() -> None:
    """loss_normalization='batch': the mean over micro-batches of each one's per-token mean."""
    batches = micro_batches(0)
    reference = token_module()
    per_batch = [per_token_gradient(reference, [b]) for b in batches]
    expected = {name: (per_batch[0][name] + per_batch[1][name]) / 2 for name in per_batch[0]}
    _assert_same_gradients(_first_step_gradient(token_module(loss_normalization="batch"), batches, 2), expected)


@pytest.mark.parametrize("normalization", ["tokens", "batch"])
def test_an_epochs_short_last_step_is_normalized_by_the_micro_batches_it_has(normalization: str) -> None:
    """3 micro-batches with accumulate_grad_batches=2: the epoch's second step holds one micro-batch, and Lightning
    still divides its loss by 2. Its gradient must be that batch's per-token mean's (both normalisations), not half
    of it. lr 0 keeps the weights, so the reference is taken at the initial ones."""
    batches = [*micro_batches(0), micro_batches(1)[0]]
    recorder = GradientRecorder()
    torch.manual_seed(0)
    lit = LitTransformer(CONFIG_TINY, lr=0.0, warmup_steps=0, schedule="constant", loss_normalization=normalization)
    trainer = L.Trainer(accelerator="cpu", max_steps=2, accumulate_grad_batches=2, logger=False, callbacks=[recorder],
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(lit, train_dataloaders=DataLoader(batches, batch_size=None))
    assert len(recorder.grads) == 2
    _assert_same_gradients(recorder.grads[1], per_token_gradient(token_module(), batches[2:]))


@pytest.mark.parametrize("normalization", ["tokens", "batch"])
def test_the_logged_training_loss_is_the_whole_steps_over_accumulated_micro_batches(normalization: str) -> None:
    """train/loss (and ppl) of a step of two uneven micro-batches is the loss its gradient is of: per target token of
    both (tokens), the mean of the two micro-batches' means (batch); never the last micro-batch's own."""
    batches, logger = micro_batches(0), RecordedLogs("train/loss")
    lit = token_module(loss_normalization=normalization)
    with torch.no_grad():  # (summed NLL, target count) of each micro-batch, by hand
        sums = [
            (
                torch.nn.functional.cross_entropy(
                    lit(b).flatten(0, 1), b["labels"].flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
                ),
                int((b["labels"] != IGNORE_INDEX).sum()),
            )
            for b in batches
        ]
    if normalization == "tokens":
        expected = sum(s[0] for s in sums) / sum(s[1] for s in sums)
    else:
        expected = sum(s[0] / s[1] for s in sums) / len(sums)
    trainer = L.Trainer(accelerator="cpu", max_steps=1, accumulate_grad_batches=2, log_every_n_steps=1,
                        logger=logger, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)  # fmt: skip
    trainer.fit(lit, train_dataloaders=DataLoader(batches, batch_size=None))
    last_alone = sums[1][0] / sums[1][1]
    assert abs(float(expected - last_alone)) > 1e-3  # the case tells the two apart
    assert len(logger.logged) == 1
    assert logger.logged[0][1]["train/loss"] == pytest.approx(float(expected), rel=1e-5)
    assert logger.logged[0][1]["train/ppl"] == pytest.approx(math.exp(float(expected)), rel=1e-5)


@pytest.mark.slow
def test_ddp_two_processes_normalize_by_the_tokens_of_both_ranks(tmp_path) -> None:
    """2 CPU ranks x 2 uneven micro-batches: both ranks step with the gradient of all four batches' tokens, and end
    with equal parameters."""
    tests = Path(__file__).parent
    result = warm_python(HARNESS_ENV).run(  # both ranks forked from a warm interpreter (tests/_forked.py)
        [sys.executable, str(tests / "_token_loss.py"), str(tmp_path)], cwd=tests.parent, timeout=300, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    expected = per_token_gradient(token_module(), micro_batches(0) + micro_batches(1))
    for rank in (0, 1):
        _assert_same_gradients(torch.load(tmp_path / f"grads_rank{rank}.pt"), expected)
    params = [torch.load(tmp_path / f"params_rank{rank}.pt") for rank in (0, 1)]
    _assert_same_gradients(params[1], params[0], atol=0)


# ---- the loss ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_smoothed_cross_entropy_is_the_written_out_formula(smoothing: float) -> None:
    """Per target token: (1 - eps) * -log p(y) + eps / V * sum over every id v (special ids too) of -log p(v)."""
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    labels = torch.tensor([[1, 4, IGNORE_INDEX], [0, IGNORE_INDEX, 2]])  # id 0 (pad in tiny) is a column like any
    loss, nll, count = smoothed_cross_entropy(logits, labels, smoothing)
    vocab, expected_loss, expected_nll = 5, 0.0, 0.0
    for b in range(2):
        for t in range(3):
            y = int(labels[b, t])
            if y == IGNORE_INDEX:
                continue
            z = logits[b, t].tolist()
            log_z = math.log(sum(math.exp(v) for v in z))
            minus_log_p = [log_z - v for v in z]
            expected_nll += minus_log_p[y]
            expected_loss += (1 - smoothing) * minus_log_p[y] + smoothing / vocab * sum(minus_log_p)
    assert int(count) == 4
    assert float(nll) == pytest.approx(expected_nll, rel=1e-12)
    assert float(loss) == pytest.approx(expected_loss, rel=1e-12)


def test_smoothed_cross_entropy_takes_one_log_softmax() -> None:
    logits = torch.randn(4, 7, 11)
    labels = torch.randint(0, 11, (4, 7))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        smoothed_cross_entropy(logits, labels, 0.1)
    assert sum(event.name == "aten::_log_softmax" for event in prof.events()) == 1


# ---- weight decay ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("decay_embeddings", [False, True])
@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_weight_decay_falls_on_exactly_the_linear_weight_matrices(variant: dict, decay_embeddings: bool) -> None:
    """Tables (token embeddings, learned positions, a tied output projection) decay only with decay_embeddings."""
    model = build(variant)
    decay, no_decay = (
        weight_decay_groups(model, decay_embeddings=True) if decay_embeddings else weight_decay_groups(model)
    )
    names = {id(p): name for name, p in model.named_parameters()}  # a tied matrix appears once, as its table
    linear = {f"{m}.weight" for m, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    tables = {
        n for n in names.values() if n.split(".")[0] in ("src_embed", "tgt_embed", "tgt_positions", "src_positions")
    }
    expected = (linear & set(names.values())) | (tables if decay_embeddings else set())
    assert {names[id(p)] for p in decay} == expected
    assert len(decay) + len(no_decay) == len(names) and not {id(p) for p in decay} & {id(p) for p in no_decay}
    assert ("tgt_positions.weight" in tables) == (variant["positions"] == "learned")


# ---- validation ----------------------------------------------------------------------------------------------------


def test_validation_numbers_are_per_token_means_over_the_whole_split() -> None:
    """Batches of 8 and 27 tokens (2 and 3 rows): every number weighs each token once, whatever its batch."""
    batches = micro_batches(0)
    lit = token_module(task=LanguageModeling(label_smoothing=0.1))
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    (logged,) = trainer.validate(lit, dataloaders=DataLoader(batches, batch_size=None), verbose=False)
    loss = nll = correct = tokens = 0.0
    with torch.no_grad():
        for batch in batches:
            logits, labels = lit(batch).flatten(0, 1), batch["labels"].flatten()
            kwargs = {"ignore_index": IGNORE_INDEX, "reduction": "sum"}
            loss += float(torch.nn.functional.cross_entropy(logits, labels, label_smoothing=0.1, **kwargs))
            nll += float(torch.nn.functional.cross_entropy(logits, labels, **kwargs))
            kept = labels != IGNORE_INDEX
            correct += float((logits.argmax(-1)[kept] == labels[kept]).sum())
            tokens += float(kept.sum())
    assert logged["val/loss"] == pytest.approx(loss / tokens, rel=1e-5)
    assert logged["val/nll"] == pytest.approx(nll / tokens, rel=1e-5)
    assert logged["val/ppl"] == pytest.approx(math.exp(nll / tokens), rel=1e-5)
    assert logged["val/accuracy"] == pytest.approx(correct / tokens, rel=1e-5)


# ---- the gradient norm ---------------------------------------------------------------------------------------------


def test_the_gradient_norm_is_computed_once_per_step_for_guard_logging_and_clipping() -> None:
    """NonFiniteLossGuard, train/grad_norm and norm clipping all read one norm, the one before clipping."""
    from lit_transformer.engine.nonfinite_guard import NonFiniteLossGuard

    class Check(L.Callback):
        def __init__(self) -> None:
            self.before: list[float] = []
            self.after: list[float] = []

        def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
            grads = [p.grad for p in pl_module.parameters()]
            self.before.append(float(torch.nn.utils.get_total_norm(grads, foreach=False)))  # not counted below

        def on_train_batch_end(self, trainer, pl_module, *args) -> None:
            self.after.append(float(trainer.callback_metrics["train/grad_norm"]))

    steps, check = 2, Check()
    lit = token_module()
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=steps,
        gradient_clip_val=1e-3,
        log_every_n_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[NonFiniteLossGuard(), check],
    )
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        trainer.fit(lit, train_dataloaders=DataLoader(micro_batches(0), batch_size=None))
    assert sum(event.name == "aten::_foreach_norm" for event in prof.events()) == steps
    assert check.after == pytest.approx(check.before, rel=1e-6)
    assert min(check.before) > 1e-3  # so clipping acted, and train/grad_norm is the norm before it


@pytest.mark.parametrize("fused", [False, True])
def test_the_logged_gradient_norm_is_unscaled_under_an_fp16_loss_scaler(fused: bool) -> None:
    """16-mixed with a fused AdamW (the CUDA default without clipping): Lightning leaves the gradients scaled for the
    optimizer to unscale in its step, so train/grad_norm divides the loss scale out; it is the true gradient's norm."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    class Check(L.Callback):
        def __init__(self) -> None:
            self.true: list[float] = []
            self.logged: list[float] = []

        def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
            grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
            scale = trainer.precision_plugin.scaler.get_scale() if fused else 1.0  # otherwise unscaled already
            self.true.append(float(torch.nn.utils.get_total_norm(grads)) / scale)

        def on_train_batch_end(self, trainer, pl_module, *args) -> None:
            self.logged.append(float(trainer.callback_metrics["train/grad_norm"]))

    check = Check()
    lit = token_module(fused=fused)
    scaler = torch.amp.GradScaler("cpu", init_scale=16.0)  # small: the summed loss's gradients stay finite in fp16
    trainer = L.Trainer(accelerator="cpu", max_steps=2, log_every_n_steps=1, logger=False, callbacks=[check],
                        plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)], enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(lit, train_dataloaders=DataLoader(micro_batches(0), batch_size=None))
    assert bool(trainer.optimizers[0].defaults["fused"]) == fused
    assert len(check.logged) == 2 and all(math.isfinite(n) and n > 0 for n in check.true)
    assert check.logged == pytest.approx(check.true, rel=1e-4)


@pytest.mark.slow
def test_the_gradient_norm_is_global_when_parameters_are_sharded(tmp_path) -> None:
    """FSDP2 (fully_shard) over 2 CPU ranks: each rank holds half of each gradient; the norm is the whole one's."""
    tests = Path(__file__).parent
    result = warm_python(HARNESS_ENV).run(  # forked from a warm interpreter (tests/_forked.py), and its ranks from it
        [sys.executable, str(tests / "_sharded_norm.py"), str(tmp_path)], cwd=os.getcwd(), timeout=300, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        norms = torch.load(tmp_path / f"norms_rank{rank}.pt")
        assert norms["local"] < 0.9 * norms["unsharded"]  # a rank's own pieces are not the whole
        assert norms["sharded"] == pytest.approx(norms["unsharded"], rel=1e-5)


# ---- BLEU ----------------------------------------------------------------------------------------------------------


def _word_tokenizer(words: list[str]):
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel

    specials = ["<pad>", "<bos>", "<eos>", "<unk>"]
    tokenizer = Tokenizer(WordLevel({w: i for i, w in enumerate(specials + words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(specials)
    return tokenizer


@pytest.mark.slow
@pytest.mark.parametrize("interleaved", [False, True], ids=["every-order-matched", "orders-unmatched"])
def test_validation_bleu_is_sacrebleus_corpus_score_of_the_translations(tmp_path, interleaved: bool) -> None:
    """val/bleu over 3 uneven batches equals the sacrebleu command line on the same translations and references,
    also where no n-gram of an order matches (only single words do): sacreBLEU smooths (torchmetrics did not)."""
    words = [f"w{i}" for i in range(60)]
    tokenizer = _word_tokenizer(words)
    torch.manual_seed(0)
    config = TransformerConfig.preset("tiny", topology="encoder_decoder", vocab_size=64, init_std=0.3)
    lit = LitTransformer(config, generation=GenerationConfig(num_beams=2))
    lit.tokenizer = lit.target_tokenizer = tokenizer
    g = torch.Generator().manual_seed(3)
    batches = []
    for rows, length in ((3, 6), (1, 9), (4, 4)):
        src = torch.randint(4, 64, (rows, length), generator=g)
        mask = torch.ones_like(src, dtype=torch.bool)
        batches.append({"src": src, "tgt_in": src, "labels": src, "src_mask": mask, "tgt_mask": mask})
    lit.eval()
    for batch in batches:  # references that share some but not all n-grams with what the model says
        hypotheses = lit.generate_text(batch["src"], batch["src_mask"])
        if interleaved:  # a word between each two of the translation's: only single words match
            edited = [[x for w in h.split() for x in (w, "zz")] for h in hypotheses]
        else:
            edited = [[w if i % 3 else "w0" for i, w in enumerate(h.split())] for h in hypotheses]
        batch["ref_text"] = [" ".join(words + ["w1"]) for words in edited]
    scored: list[str] = []
    translate = lit.generate_text
    lit.generate_text = lambda src, mask: scored.extend(translate(src, mask)) or scored[-len(src) :]
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    (logged,) = trainer.validate(lit, dataloaders=DataLoader(batches, batch_size=None), verbose=False)

    references = [r for batch in batches for r in batch["ref_text"]]
    assert len(scored) == len(references) == 8 and sum(len(h.split()) for h in scored) > 20
    (tmp_path / "hyp.txt").write_text("\n".join(scored) + "\n")
    (tmp_path / "ref.txt").write_text("\n".join(references) + "\n")
    cli = subprocess.run(
        [sys.executable, "-m", "sacrebleu", str(tmp_path / "ref.txt"), "-i", str(tmp_path / "hyp.txt")]
        + ["--tokenize", "13a", "--score-only", "--width", "4"],
        capture_output=True,
        text=True,
        check=True,
    )
    expected = float(cli.stdout.strip())
    unsmoothed = sacrebleu.corpus_bleu(scored, [references], tokenize="13a", smooth_method="none").score
    assert (unsmoothed == 0 < expected < 10) if interleaved else (10 < expected < 90)  # not trivially 0 or 100
    assert logged["val/bleu"] == pytest.approx(expected, abs=0.01)


def test_no_translation_samples_asked_for_translates_nothing(monkeypatch):
    """`--samples.num_translations 0` turns the translation samples off; it used to decode an empty batch and crash."""

    from lit_transformer.engine import task_outputs as callbacks

    batch = {"src": torch.ones(3, 5, dtype=torch.long), "src_mask": torch.ones(3, 5, dtype=torch.bool)}
    batch["src_text"] = ["a", "b", "c"]
    monkeypatch.setattr(callbacks, "_first_validation_batch", lambda trainer: batch)

    def generate_text(src, mask):
        assert len(src) > 0, "an empty batch reached generation"
        return ["x"] * len(src)

    from lit_transformer.tasks import Translation

    module = SimpleNamespace(task=Translation(), device=torch.device("cpu"), generate_text=generate_text)
    assert GenerateSamples(num_translations=0).samples(None, module) == []
    assert len(GenerateSamples(num_translations=2).samples(None, module)) == 2


def test_the_engine_stays_an_engine():
    """lightning_module.py under 450 lines and LitTransformer under 400, importing nothing of LoRA or int8 and with no
    branch on either: each is a ModelTransform (transforms/lora.py, transforms/int8.py) whose hooks the engine calls as
    it calls any transform's."""
    import ast

    from lit_transformer.engine import lightning_module as module

    source = Path(module.__file__).read_text()
    tree = ast.parse(source)
    engine = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "LitTransformer")
    assert len(source.splitlines()) < 450
    assert engine.end_lineno - engine.lineno + 1 < 400
    tests = [n.test for n in ast.walk(tree) if isinstance(n, ast.If | ast.IfExp | ast.While | ast.Assert)]
    tests += [t for n in ast.walk(tree) if isinstance(n, ast.comprehension) for t in n.ifs]
    assert [
        ast.unparse(t) for t in tests if any(w in ast.unparse(t).lower() for w in ("lora", "quantiz", "int8"))
    ] == []
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m and ("lora" in m or "int8" in m or "quantiz" in m)}, imported


def test_the_engine_calls_each_transform_hook_at_its_own():
    """A transform the engine holds is applied once, before compile and checkpointing wrap the model, and its
    checkpoint hooks run after the engine's own (save) and before the state is loaded (load)."""
    from lit_transformer.transforms.base import ModelTransform

    calls = []

    class Recorder(ModelTransform):
        def apply(self, module) -> None:
            calls.append(("apply", type(module.model.decoder_blocks[0]).__name__))

        def on_save_checkpoint(self, module, checkpoint) -> None:
            calls.append(("save", "tokenizer" in checkpoint))
            checkpoint["recorded"] = True

        def on_load_checkpoint(self, module, checkpoint) -> None:
            calls.append(("load", checkpoint.get("recorded")))

    lit = LitTransformer(TransformerConfig.preset("tiny"), activation_checkpointing=True)
    assert lit.transforms == []  # no LoRA: nothing transforms the model
    lit.transforms.append(Recorder())
    lit.configure_model()
    lit.configure_model()
    assert calls == [("apply", "DecoderBlock")]  # once, on the plain blocks
    from lit_transformer.data.text import train_tokenizer

    lit.tokenizer = train_tokenizer(["abc"], kind="char", vocab_size=lit.config.vocab_size)
    checkpoint = {"state_dict": lit.state_dict()}
    lit.on_save_checkpoint(checkpoint)
    lit.on_load_checkpoint(checkpoint)
    assert calls[1:] == [("save", True), ("load", True)]


class RecordedLogs(L.pytorch.loggers.Logger):
    """A logger that keeps (step, metrics) each time the metrics it logs hold `key`."""

    name, version = "recorded", 0

    def __init__(self, key: str = "train/device/items_per_sec") -> None:
        super().__init__()
        self.key = key
        self.logged: list[tuple[int, dict]] = []

    def log_hyperparams(self, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        if self.key in metrics:
            self.logged.append((step, metrics))


def test_throughput_is_logged_at_optimizer_steps_and_counts_every_micro_batch() -> None:
    """With two micro-batches a step, TokenThroughputMonitor logs once per optimizer step (at the trainer's logging
    steps), never between the micro-batches, and each interval counts the tokens of both."""
    from lit_transformer.engine.monitoring import TokenThroughputMonitor

    monitor, logger, batches = TokenThroughputMonitor(peak_flops=1e12), RecordedLogs(), _batches(128, n=8)
    seen: list[tuple[int, int]] = []  # (global_step, logs so far) after each batch

    class Watch(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, *args) -> None:
            seen.append((trainer.global_step, len(logger.logged)))

    trainer = L.Trainer(accelerator="cpu", max_steps=3, accumulate_grad_batches=2, log_every_n_steps=1,
                        logger=logger, callbacks=[monitor, Watch()], enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    lit = LitTransformer(TransformerConfig.preset("tiny", vocab_size=128), optim={"warmup_steps": 0})
    trainer.fit(lit, DataLoader(batches, batch_size=None))
    assert [step for step, _ in logger.logged] == [1, 2, 3]
    assert seen == [(0, 0), (1, 1), (1, 1), (2, 2), (2, 2), (3, 3)]  # a log after each second micro-batch only
    items, samples = (logger.logged[-1][1][f"train/device/{name}_per_sec"] for name in ("items", "samples"))
    assert items / samples == pytest.approx(16)  # 2 micro-batches of 2 rows of 16 tokens


def test_the_cpu_peak_is_measured_at_the_first_mfu_log_once_per_process(monkeypatch) -> None:
    """On a CPU (no spec sheet) MFU's reference is a matmul measured when MFU is first logged, once per process: a run
    that logs nothing measures nothing, a second run reuses the first one's figure."""
    from lit_transformer.engine import monitoring

    calls: list[tuple] = []
    monkeypatch.setattr(monitoring, "_MEASURED", {})
    monkeypatch.setattr(monitoring, "matmul_peak_flops", lambda *args: calls.append(args) or 1e11)

    def fit(**trainer_args) -> list[dict]:
        trainer = L.Trainer(accelerator="cpu", max_steps=2, callbacks=[monitoring.TokenThroughputMonitor()],
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                            **trainer_args)  # fmt: skip
        lit = LitTransformer(TransformerConfig.preset("tiny", vocab_size=128), optim={"warmup_steps": 0})
        trainer.fit(lit, DataLoader(_batches(128, n=2), batch_size=None))
        return [metrics for _, metrics in trainer.logger.logged] if trainer.logger else []

    assert fit(logger=False) == [] and calls == []
    for run in ("first", "second"):
        logged = fit(log_every_n_steps=1, logger=RecordedLogs())
        assert len(logged) == 2, run
        for metrics in logged:  # MFU against the measured peak, from the first log on
            assert metrics["train/device/mfu"] == pytest.approx(metrics["train/device/flops_per_sec"] / 1e11), run
    assert calls == [(torch.device("cpu"), torch.float32)]


def test_a_checkpoint_of_a_module_built_in_python_validates_and_predicts_on_the_command_line(tmp_path) -> None:
    """A LitTransformer built from a TransformerConfig object records that object (not the dict LightningCLI hands
    it) in its hyperparameters; validate and predict of its checkpoint read it as they read a `fit` checkpoint, and
    score what a plain Trainer scores."""
    from test_cli import CONFIGS, _cli

    from lit_transformer.data import LanguageModelingDataModule

    data_args = dict(dataset="shakespeare", block_size=32, max_chars=20000, tokenizer="char", batch_size=8)
    data = LanguageModelingDataModule(**data_args, cache_dir=str(tmp_path / "cache"))
    config = TransformerConfig.preset("tiny", vocab_size=data.vocab_size, pad_token_id=data.pad_token_id,
                                      eos_token_id=data.eos_token_id, max_seq_len=32)  # fmt: skip
    trainer = L.Trainer(accelerator="cpu", max_steps=2, limit_val_batches=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)  # fmt: skip
    trainer.fit(LitTransformer(config), datamodule=data)
    assert not (tmp_path / "tokenizer.json").exists()  # no logger: a notebook's folder stays clean
    ckpt = tmp_path / "python.ckpt"
    trainer.save_checkpoint(ckpt)
    expected = trainer.validate(LitTransformer.load_from_checkpoint(ckpt), datamodule=data, verbose=False)[0]

    (tmp_path / "prompts.txt").write_text("ROMEO:\n")
    common = ["--config", str(CONFIGS / "presets" / "tiny.yaml"), "--ckpt_path", str(ckpt), "--trainer.logger", "false",
              "--trainer.default_root_dir", str(tmp_path / "run"), "--data.init_args.block_size", "32",
              "--data.init_args.max_chars", "20000", "--data.init_args.cache_dir", str(tmp_path / "cache"),
              "--trainer.limit_val_batches", "1", "--trainer.enable_progress_bar", "false"]  # fmt: skip
    out = _cli("validate", *common, cwd=tmp_path).stdout
    assert f"{expected['val/nll']:.6f}"[:7] in out, out
    _cli("predict", *common, "--data.init_args.predict_file", str(tmp_path / "prompts.txt"), cwd=tmp_path)
    assert (tmp_path / "run" / "predictions.jsonl").read_text().startswith('{"input": "ROMEO:"')


def test_a_config_given_as_the_dict_a_checkpoint_holds_builds_the_same_module() -> None:
    """A CLI checkpoint's hyperparameters hold the architecture as a dict (`LitTransformer(**hparams)` from Python):
    it was an AttributeError ('dict' object has no attribute 'topology'); optim= already took a dict."""
    config = TransformerConfig.preset("tiny", vocab_size=70)
    from_dict = LitTransformer(dataclasses.asdict(config))
    assert from_dict.config == config
    shapes = {k: v.shape for k, v in LitTransformer(config).state_dict().items()}
    assert {k: v.shape for k, v in from_dict.state_dict().items()} == shapes
