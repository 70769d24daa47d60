"""The compiled training step sees a bounded number of graphs, whatever the batch shapes, and trains as eager does.

Token-budget batches (translation, classification) bring a new (rows, source length, target length) at almost every
step; each graph torch.compile builds costs what the first compile costs (tens of seconds for the paper's model on a
GPU), so a step that recompiles per shape never gets going. Graphs are counted with dynamo's CompileCounter backend,
injected where the package compiles (compilation.compile_function): it counts each compiled frame and runs the graph
eagerly, so the count costs no code generation.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from test_fast_path import SyncTrap, cli
from torch._dynamo.testing import CompileCounter

from lit_transformer.transforms import compilation

TINY = ("--model.config.d_model=16", "--model.config.n_heads=2", "--model.config.n_layers=1", "--model.config.d_ff=32")
QUIET = ("--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--trainer.logger=false")
# One dynamic graph from the first batch. Today's code compiled a static graph for the first batch, then a second,
# dynamic one at the first new shape (dynamo's automatic dynamic shapes): two cold compiles before step 2, and on a
# GPU every guard the dynamic graph met by chance (alignments, equal sizes) could cost one more.
MAX_GRAPHS = 1


class Shapes(L.Callback):
    """The distinct (src, tgt_in) shapes the training step received."""

    def __init__(self) -> None:
        self.seen: set[tuple] = set()
        self.batches = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        key = "src" if "src" in batch else "input_ids"
        self.seen.add((tuple(batch[key].shape), tuple(batch.get("tgt_in", batch[key]).shape)))
        self.batches += 1


def counting_compiler(monkeypatch, backend=None) -> CompileCounter:
    counter = CompileCounter()

    def compile_function(fn, mode=None, fullgraph=False):
        return torch.compile(fn, mode=mode, fullgraph=fullgraph, backend=backend or counter)

    monkeypatch.setattr(compilation, "compile_function", compile_function)
    torch._dynamo.reset()
    return counter


@pytest.mark.slow
def test_translation_preset_compiles_a_bounded_number_of_graphs_over_200_batches(tmp_path: Path, monkeypatch) -> None:
    """translate-en-es's own batching (token budget 2048, max_length 96) on its corpus, compile on, a tiny model
    (and vocabulary): 200 batches of about 80 shapes, at most MAX_GRAPHS graphs."""
    counter = counting_compiler(monkeypatch)
    run = cli(
        tmp_path,
        "translate-en-es.yaml",
        "--model.compile=true",
        *TINY,
        *QUIET,
        "--trainer.max_steps=200",
        "--data.init_args.max_pairs=12000",
        "--data.init_args.vocab_size=1000",  # a tiny model's vocabulary too: the preset's 6,000 took half the time
        "--checkpoint.every_n_train_steps=0",
        "--checkpoint.save_last=false",
    )
    shapes = Shapes()
    run.trainer.callbacks.append(shapes)
    run.trainer.fit(run.model, datamodule=run.datamodule)
    assert run.trainer.global_step == 200 and shapes.batches == 200
    assert len(shapes.seen) >= 50, "the data no longer varies its shapes: the test lost its point"
    assert 1 <= counter.frame_count <= MAX_GRAPHS, f"{counter.frame_count} graphs for {len(shapes.seen)} shapes"


@pytest.mark.slow
def test_classification_batches_compile_a_bounded_number_of_graphs(tmp_path: Path, monkeypatch) -> None:
    """encoder_only classification: length-grouped batches vary in length (and the last in rows): one graph."""
    counter = counting_compiler(monkeypatch)
    run = cli(tmp_path, "classify-genre.yaml", "--model.compile=true", *TINY, *QUIET, "--trainer.max_steps=40",
              "--checkpoint.every_n_train_steps=0", "--checkpoint.save_last=false")  # fmt: skip
    shapes = Shapes()
    run.trainer.callbacks.append(shapes)
    run.trainer.fit(run.model, datamodule=run.datamodule)
    assert len(shapes.seen) >= 10
    assert 1 <= counter.frame_count <= MAX_GRAPHS, f"{counter.frame_count} graphs for {len(shapes.seen)} shapes"


@pytest.mark.parametrize(("preset", "dynamic"), [("tiny.yaml", False), ("tiny-translate.yaml", True)])
def test_accumulation_compiles_one_graph_and_never_reads_the_device(
    tmp_path: Path, monkeypatch, preset: str, dynamic: bool
) -> None:
    """The gpt2-small preset's training settings (accumulation 4, clipping, compile) on the tiny models: one graph
    for every micro-batch (the last of a cycle, inside the optimizer's closure, too), static for language-model
    blocks (they never change shape), dynamic for token-budget batches, and no host read in any micro-batch of the
    steady state."""
    counter = counting_compiler(monkeypatch)
    run = cli(tmp_path, preset, "--model.compile=true", "--model.fused=true", "--trainer.gradient_clip_val=1.0",
              "--trainer.accumulate_grad_batches=4", "--trainer.log_every_n_steps=50", "--trainer.max_steps=6",
              "--trainer.enable_progress_bar=true", "--nonfinite.check_every_n_steps=50",
              "--checkpoint.every_n_train_steps=50")  # fmt: skip
    trap = SyncTrap(
        first=4, last=19, calls=False
    )  # micro-batches of optimizer steps 2..5: past warm-up, no logging step
    run.trainer.callbacks.append(trap)
    run.trainer.fit(run.model, datamodule=run.datamodule)
    assert run.trainer.global_step == 6 and trap.trapped == list(range(4, 20))
    assert counter.frame_count == 1
    assert run.model._compiled_sums.dynamic is dynamic


class Losses(L.Callback):
    """train/loss of every optimizer step (logged at each step with log_every_n_steps=1)."""

    def __init__(self) -> None:
        self.values: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        self.values.append(float(trainer.callback_metrics["train/loss"]))


def _translation_losses(tmp_path: Path, compile: bool, steps: int) -> tuple[list[float], set[tuple]]:
    run = cli(tmp_path, "tiny-translate.yaml", f"--model.compile={compile}", *QUIET, f"--trainer.max_steps={steps}",
              "--trainer.log_every_n_steps=1", "--checkpoint.every_n_train_steps=0", "--checkpoint.save_last=false")  # fmt: skip
    losses, shapes = Losses(), Shapes()
    run.trainer.callbacks += [losses, shapes]
    run.trainer.fit(run.model, datamodule=run.datamodule)
    return losses.values, shapes.seen


@pytest.mark.slow
def test_compiled_translation_trains_with_the_eager_losses(tmp_path: Path, monkeypatch) -> None:
    """tiny-translate's token-budget batches through the one dynamic graph (aot_eager: AOT autograd's real joint
    forward-backward graph, without inductor's code generation) give eager's loss at every step.

    Tolerance, derived: a step's loss is a sum over n <= 1,024 target tokens (max_tokens) of per-token losses near
    log(V) ~ 6, divided by n. The graph runs the same kernels in a traced order, so a per-token loss may differ by a
    few units of fp32 roundoff u = 2**-24, and the sum by at most n * u relative (summation in another order):
    1024 * 6e-8 ~ 6e-5. That bounds step 1; later steps hold to it only while the weights stay equal, because Adam
    moves a weight by ~lr whatever its gradient's size, so a last-bit difference in a tiny gradient can grow.
    Measured with aot_eager: every step's loss equal to the last bit. With inductor (its fused kernels sum in another
    order; too slow to build in a test), step 1 equal, then relative drifts of 1.6e-7 growing to 2.3e-4 by step 12
    (these two fits, _translation_losses, with backend="inductor" in compile_function; torch 2.13 CPU)."""
    steps = 12
    monkeypatch.setattr(compilation, "compile_function",
                        lambda fn, mode=None, fullgraph=False: torch.compile(fn, fullgraph=fullgraph, backend="aot_eager"))  # fmt: skip
    torch._dynamo.reset()
    compiled, shapes = _translation_losses(tmp_path / "compiled", True, steps)
    eager, _ = _translation_losses(tmp_path / "eager", False, steps)
    assert len(shapes) >= steps - 2  # the batches do vary
    assert len(compiled) == len(eager) == steps
    torch.testing.assert_close(torch.tensor(compiled), torch.tensor(eager), rtol=1024 * 2**-24, atol=0)


def _padded(batch: dict, extra_len: int, extra_rows: int, pad_id: int) -> dict:
    """The batch with `extra_len` more positions on both sides and `extra_rows` more rows, all of them padding:
    masked sources, pad inputs, ignored labels (what padding to buckets and to a fixed row budget would add)."""

    def grow(t: torch.Tensor, fill) -> torch.Tensor:
        out = torch.full((t.size(0) + extra_rows, t.size(1) + extra_len), fill, dtype=t.dtype)
        out[: t.size(0), : t.size(1)] = t
        return out

    out = {"src": grow(batch["src"], pad_id), "src_mask": grow(batch["src_mask"], False),
           "tgt_in": grow(batch["tgt_in"], pad_id), "labels": grow(batch["labels"], -100),
           "tgt_mask": grow(batch["tgt_mask"], False)}  # fmt: skip
    out["src_mask"][batch["src"].size(0) :, 0] = True  # a padding row attends to one (pad) key: a finite softmax
    return out


def test_padding_lengths_and_rows_leaves_the_loss_unchanged(tmp_path: Path) -> None:
    """The loss is a sum over real targets divided by their count: pads (longer rows, extra rows) add nothing."""
    run = cli(tmp_path, "tiny-translate.yaml")
    data, module = run.datamodule, run.model
    data.prepare_data()
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    module.eval()
    with torch.no_grad():
        loss, nll, count = module._training_sums(batch)
        p_loss, p_nll, p_count = module._training_sums(_padded(batch, 13, 5, data.pad_token_id))
    assert int(p_count) == int(count)
    rtol = int(count) * 2**-24  # the sums' roundoff bound over `count` terms
    torch.testing.assert_close(p_loss / p_count, loss / count, rtol=rtol, atol=0)
    torch.testing.assert_close(p_nll / p_count, nll / count, rtol=rtol, atol=0)
