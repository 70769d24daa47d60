"""Resumable loaders and batch layouts: a resumed loader yields exactly the batches an uninterrupted one would."""

import itertools

import lightning as L
import numpy as np
import pytest
import torch

from lit_transformer.data.language_modeling import stack_blocks
from lit_transformer.data.loaders import ResumableLoader, fixed_size_batches, token_budget_batches


class BlockDataset(torch.utils.data.Dataset):
    """A flat token array as blocks of block_size + 1 tokens, each overlapping the next by one (as ShardBlocks reads
    a shard): the loaders' items in these tests."""

    def __init__(self, tokens: np.ndarray, block_size: int) -> None:
        self.tokens, self.block_size = tokens, block_size

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.block_size

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {k: v[0] for k, v in self.__getitems__([index]).items()}

    def __getitems__(self, indices) -> dict[str, torch.Tensor]:
        starts = np.asarray(indices, dtype=np.int64)[:, None] * self.block_size
        return stack_blocks(self.tokens[starts + np.arange(self.block_size + 1)])


def make_loader(num_workers: int = 0, shuffle: bool = True, seed: int = 7) -> ResumableLoader:
    tokens = np.arange(1000, dtype=np.int32)
    data = BlockDataset(tokens, block_size=8)
    batches = fixed_size_batches(len(data), 4, seed=seed, shuffle=shuffle, drop_last=True)
    return ResumableLoader(data, batches, shuffle=shuffle, seed=seed, num_workers=num_workers)


def firsts(batches) -> list[list[int]]:
    return [b["input_ids"][:, 0].tolist() for b in batches]


@pytest.mark.parametrize("num_workers", [0, 1])
@pytest.mark.parametrize("k", [0, 1, 5, 30])
def test_resume_mid_epoch_gives_exactly_the_rest(k, num_workers):
    reference = make_loader()
    uninterrupted = firsts(itertools.chain(reference, reference))  # two epochs

    interrupted = make_loader(num_workers)
    seen = firsts(itertools.islice(iter(interrupted), k))
    state = interrupted.state_dict()

    resumed = make_loader(num_workers)
    resumed.load_state_dict(state)
    rest = firsts(itertools.chain(resumed, resumed))
    assert seen + rest == uninterrupted


def test_epochs_differ_and_repeat_with_seed():
    a, b = make_loader(), make_loader()
    epoch0, epoch1 = firsts(a), firsts(a)
    assert epoch0 != epoch1
    assert firsts(b) == epoch0
    assert sorted(sum(epoch0, [])) == sorted(sum(epoch1, []))


def test_a_repeating_loader_gives_the_same_batches_every_epoch():
    """trainer.overfit_batches: Lightning makes a DataLoader's sampler sequential, for the same batches every epoch;
    the stream has no sampler, and went on through the data."""
    loader = make_loader()
    loader.repeat = True
    epoch0, epoch1 = firsts(itertools.islice(loader, 3)), firsts(itertools.islice(loader, 3))
    assert epoch0 == epoch1 == firsts(itertools.islice(make_loader(), 3))


def test_overfit_batches_trains_on_the_same_batches_every_epoch(tmp_path):
    """`fit --trainer.overfit_batches 1`: 3 epochs of the first batch, not 3 batches of the stream."""
    from test_checkpointing import _tiny_fit

    cli = _tiny_fit(tmp_path / "run", tmp_path / "cache", "--trainer.overfit_batches", "1", "--trainer.max_steps", "3")
    assert cli.trainer.global_step == 3 and cli.trainer.current_epoch == 3
    assert cli.trainer.train_dataloader.consumed == cli.datamodule.batch_size


def test_a_loader_built_again_for_the_next_epoch_goes_on_with_the_stream():
    """trainer.reload_dataloaders_every_n_epochs builds a new training loader every epoch: following the one it
    replaces, it reads what the same loader would have read next, not the first epoch's order again."""
    reference = make_loader()
    epochs = [firsts(reference) for _ in range(3)]
    loader, seen = make_loader(), []
    for _ in range(3):
        seen.append(firsts(loader))
        fresh = make_loader()
        fresh.follow(loader)
        loader = fresh
    assert seen == epochs and seen[0] != seen[1]


def test_reload_dataloaders_every_epoch_reads_on_through_the_blocks(tmp_path):
    """`fit --trainer.reload_dataloaders_every_n_epochs 1` on the language model: 78 blocks, 9 steps of 8 an
    epoch; every epoch's new loader started the stream again, so each epoch read the same 72 blocks in the same
    order and 6 blocks were never read."""
    from test_checkpointing import _tiny_fit

    args = ["--data.init_args.max_chars", "5000", "--trainer.max_steps", "20", "--trainer.limit_val_batches", "0"]
    cli = _tiny_fit(tmp_path / "run", tmp_path / "cache", *args, "--trainer.reload_dataloaders_every_n_epochs", "1")
    assert len(cli.trainer.train_dataloader) == 9  # 20 steps: epochs 0 and 1, then 2 steps of epoch 2
    assert cli.trainer.train_dataloader.consumed == 20 * cli.datamodule.batch_size


def test_state_saved_at_epoch_end_resumes_with_next_epoch():
    loader = make_loader()
    first, second = firsts(loader), firsts(loader)
    fresh = make_loader()
    fresh.load_state_dict({**loader.state_dict(), "consumed": len(first), "steps_in_epoch": len(first)})
    assert firsts(fresh) == second


def test_state_loaded_after_an_iterator_was_built_is_not_replayed():
    """Lightning #20550 / litgpt #1712: the state must apply to the next iterator, not be lost or doubled."""
    reference = firsts(make_loader())
    loader = make_loader()
    stale = iter(loader)
    next(stale)
    loader.load_state_dict({**loader.state_dict(), "consumed": 3, "steps_in_epoch": 3})
    assert firsts(loader) == reference[3:]
    assert list(stale) == []  # the superseded iterator stops instead of interleaving


@pytest.mark.parametrize("change", [{"seed": 99}, {"num_items": 1}])
def test_state_of_other_data_is_refused(change):
    loader = make_loader()
    with pytest.raises(ValueError, match="changed since|resume with --data.init_args.seed"):
        loader.load_state_dict({**loader.state_dict(), **change})


def test_state_of_the_former_layout_still_resumes():
    """Checkpoints written before the elastic stream hold (epoch, position, world_size): they resume the same."""
    reference = firsts(make_loader())
    loader = make_loader()
    loader.load_state_dict({"epoch": 0, "position": 5, "seed": 7, "num_batches": len(loader), "world_size": 1})
    assert firsts(loader) == reference[5:]


def test_blocks_are_shifted_inputs_and_labels_without_gaps():
    data = BlockDataset(np.arange(101, dtype=np.int32), block_size=10)
    assert len(data) == 10
    batch = data.__getitems__(list(range(len(data))))
    assert torch.equal(batch["labels"], batch["input_ids"] + 1)
    assert torch.equal(batch["input_ids"].flatten(), torch.arange(100))  # every token used once as input


@pytest.mark.parametrize("max_tokens", [16, 64, 300])
def test_token_budget_batches_cover_every_sample_within_budget(max_tokens):
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(1, 16, 500), rng.integers(1, 16, 500)
    batches = token_budget_batches(src, tgt, max_tokens)
    assert sorted(i for b in batches for i in b) == list(range(500))
    for batch in batches:
        assert len(batch) * max(max(src[batch]), max(tgt[batch])) <= max_tokens


class _Recorder(L.LightningModule):
    """Records the first token of every training sequence it sees."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[int] = []

    def training_step(self, batch, batch_idx):
        self.seen.extend(batch["input_ids"][:, 0].tolist())
        return (self.weight * batch["input_ids"].float().mean()).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


class _Data(L.LightningDataModule):
    def train_dataloader(self):
        return make_loader(seed=3)


def _trainer(tmp_path, max_steps, callbacks=()):
    return L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=bool(callbacks),
        callbacks=list(callbacks),
        default_root_dir=tmp_path,
    )


def test_lightning_resumes_mid_epoch_on_the_next_batch(tmp_path):
    steps_per_epoch = len(make_loader())
    total, cut = steps_per_epoch + 10, steps_per_epoch + 4  # resume in the second epoch
    full = _Recorder()
    _trainer(tmp_path / "full", total).fit(full, _Data())

    checkpoint = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=cut, save_top_k=-1)
    first = _Recorder()
    _trainer(tmp_path / "a", cut, [checkpoint]).fit(first, _Data())
    second = _Recorder()
    _trainer(tmp_path / "b", total).fit(second, _Data(), ckpt_path=str(next((tmp_path / "ckpt").glob("*.ckpt"))))
    assert first.seen + second.seen == full.seen


@pytest.mark.parametrize(("before", "after"), [(1, 2), (2, 1), (3, 2)])
def test_batch_lists_resume_elastically_on_another_process_count(monkeypatch, before, after):
    """Translation and classification batches (token-budget index lists): a state saved by N ranks resumes on M with
    the global order of batches going on, none repeated or skipped, across the epoch boundary too."""
    from lit_transformer.data import loaders

    def run(world: int, steps: int, state: dict | None) -> tuple[list[list[int]], dict]:
        ranks = []
        for rank in range(world):
            monkeypatch.setattr(loaders, "_rank_and_world", lambda rank=rank: (rank, world))
            loader = make_loader()
            if state is not None:
                loader.load_state_dict(state)
            ranks.append([rank, loader, iter(loader)])
        seen = []
        for _ in range(steps):
            for entry in ranks:
                rank, loader, iterator = entry
                monkeypatch.setattr(loaders, "_rank_and_world", lambda rank=rank: (rank, world))
                batch = next(iterator, None)
                if batch is None:  # Lightning starts the next epoch
                    entry[2] = iterator = iter(loader)
                    batch = next(iterator)
                seen.append(batch["input_ids"][:, 0].tolist())
        return seen, ranks[0][1].state_dict()

    steps_per_epoch = len(make_loader())  # 31 batches of one epoch
    single = make_loader()
    reference = firsts(itertools.chain(single, single, single, single))  # four epochs, one process
    first, state = run(before, 20, None)
    second, _ = run(after, 20, state)
    total = 20 * before + 20 * after
    assert total > steps_per_epoch and first + second == reference[:total]


def test_fewer_training_batches_than_processes_is_refused_as_the_language_model_s(monkeypatch):
    """Classification, translation and captioning batches: with 3 batches on 4 processes, one batch was read by two
    processes every step (counted twice in the step's gradient), without a word; the language model's loader refused
    it. So do these."""
    from lit_transformer.data import loaders
    from lit_transformer.errors import UserError

    monkeypatch.setattr(loaders, "_rank_and_world", lambda: (0, 4))
    tokens = np.arange(100, dtype=np.int32)
    data = BlockDataset(tokens, block_size=8)
    few = ResumableLoader(data, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]], shuffle=True)
    with pytest.raises(UserError, match="makes 3 batches, fewer than the 4 processes"):
        next(iter(few))
    assert len(list(ResumableLoader(data, [[0], [1], [2]], shuffle=False))) == 1  # evaluation: fillers, as before


def test_a_resume_with_another_seed_or_other_batches_names_what_changed():
    """The refusal printed the loader's state dict and "the data or its settings changed": a resume with another
    --data.init_args.seed names the flag and the checkpoint's value; other batches name their counts."""
    from lit_transformer.errors import UserError

    state = make_loader(seed=7).state_dict()
    with pytest.raises(UserError, match=r"seed=7, and this run gives 8: resume with --data.init_args.seed 7"):
        make_loader(seed=8).load_state_dict(state)
    with pytest.raises(UserError, match=r"had 99 items \(blocks or batches\), and this run's has 31"):
        make_loader(seed=7).load_state_dict({**state, "num_items": 99})


@pytest.mark.parametrize("world", [2, 3, 4])
def test_evaluation_batches_are_all_scored_once_over_the_ranks(monkeypatch, world):
    """31 evaluation batches over 2, 3 or 4 ranks: every batch is read by exactly one rank, and every rank reads as
    many batches (a collective would wait for a rank that ran out), the short ones ending with a filler marked so
    (the engine counts it nowhere). The odd batches were dropped: the last ones of a split went unscored."""
    from lit_transformer.data import FILLER, loaders

    single = firsts(make_loader(shuffle=False))
    assert len(single) == 31
    seen, counts = [], set()
    for rank in range(world):
        monkeypatch.setattr(loaders, "_rank_and_world", lambda rank=rank: (rank, world))
        loader = make_loader(shuffle=False)
        batches = list(loader)
        counts.add(len(batches))
        assert len(loader) == len(batches)
        seen += firsts(b for b in batches if not b.get(FILLER))
        fillers = [i for i, b in enumerate(batches) if b.get(FILLER)]
        assert fillers == ([len(batches) - 1] if 31 % world and rank >= 31 % world else [])  # the last, if any
    assert counts == {-(-31 // world)}
    assert sorted(seen) == sorted(single)


def test_a_filler_batch_counts_for_no_metric():
    """The engine skips a filler batch: validation over [a, b, filler] logs what [a, b] logs."""
    from lit_transformer.config import TransformerConfig
    from lit_transformer.data import FILLER
    from lit_transformer.engine.lightning_module import LitTransformer

    torch.manual_seed(0)
    batches = [{"input_ids": torch.randint(4, 60, (2, 9)), "labels": torch.randint(4, 60, (2, 9))} for _ in range(2)]
    results = []
    for extra in ([], [{**batches[0], FILLER: True}]):
        torch.manual_seed(1)
        module = LitTransformer(TransformerConfig.preset("tiny", vocab_size=64))
        trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
        (logged,) = trainer.validate(module, dataloaders=torch.utils.data.DataLoader(batches + extra, batch_size=None))
        results.append(logged)
    assert results[0] == results[1]
