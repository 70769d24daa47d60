"""Token shards -> batches: resumable, elastic loaders and the batch layouts behind them.

A training loader reads an endless stream of items (precomputed batches of records, or blocks
of tokens). The item at global position p is a pure function of (seed, epoch = p // n,
p % n): a seeded permutation of the n items per epoch. Each optimizer step consumes the next `per_rank * world_size`
positions, rank r taking its `per_rank` consecutive ones, so the global sequence of items does not depend on the
number of processes. The checkpointed state is the number of positions consumed (plus the steps taken in Lightning's
current epoch, which Lightning counts too): a run checkpointed with N processes resumes with M, continuing the same
global sequence, no item repeated or skipped.

Lightning (2.6) saves the state of a train loader that has `state_dict`/`load_state_dict` and loads it before the
next `iter()`. The state is applied when the next iterator is built, and a state loaded after an iterator was built
still applies to the next one: no batch is replayed or skipped.

Evaluation loaders (`shuffle=False`) read their items in order from the start at every iteration, each rank taking
every world_size-th batch; a rank whose share is one short ends with a filler batch that no metric counts (FILLER).

Shards are read through short-lived memory maps: a map is opened for the rows of one batch and dropped, so the
resident memory stays flat however much of the corpus is read (`map_file`, for
a task's own shard reader).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from lit_transformer.errors import BadFileError, ConfigError

from . import FILLER
from .sources import DataFileError
from .text import IGNORE_INDEX


def _rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _identity(batch: Any) -> Any:
    return batch


# ---------------------------------------------------------------------------------------------------- permutations

_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a cheap, well-mixed hash of each uint64."""
    x = x + _MIX[0]
    x = (x ^ (x >> np.uint64(30))) * _MIX[1]
    x = (x ^ (x >> np.uint64(27))) * _MIX[2]
    return x ^ (x >> np.uint64(31))


def permute(positions: np.ndarray, n: int, seed: int, epoch: int, rounds: int = 4) -> np.ndarray:
    """A seeded permutation of range(n), evaluated at `positions` only: O(len(positions)) time and memory.

    A balanced Feistel network is a bijection on [0, 2^bits); cycle-walking (applying it again while the value is
    out of range) restricts it to a bijection on [0, n). Nothing of size n is ever built, so a corpus of billions of
    blocks costs no memory to shuffle.
    """
    x = np.asarray(positions, dtype=np.uint64)
    if n <= 1:
        return x.astype(np.int64)
    bits = max(2, (n - 1).bit_length())
    bits += bits % 2
    half = np.uint64(bits // 2)
    mask = np.uint64((1 << (bits // 2)) - 1)
    with np.errstate(over="ignore"):
        keys = _mix64(np.array([seed * 1_000_003 + epoch * 7919 + r for r in range(rounds)], dtype=np.uint64))

        def once(v: np.ndarray) -> np.ndarray:
            left, right = v >> half, v & mask
            for key in keys:
                left, right = right, left ^ (_mix64(right ^ key) & mask)
            return (left << half) | right

        x = once(x)
        out = x >= n
        while out.any():
            x[out] = once(x[out])
            out = x >= n
    return x.astype(np.int64)


# ---------------------------------------------------------------------------------------------------- loaders


class _ElasticStream:
    """What the elastic training loaders share: the position in the global stream and its checkpointed state."""

    num_items: int
    per_rank: int  # items one rank takes per step
    seed: int
    shuffle: bool
    repeat: bool = False  # every Lightning epoch from the stream's start (trainer.overfit_batches: the same batches)

    def _init_stream(self, start_epoch: int = 0) -> None:
        self.consumed = start_epoch * self.num_items  # global stream positions consumed by all ranks together
        self.steps_in_epoch = 0  # steps taken in Lightning's current epoch (Lightning's own count after a resume)
        self._started = False
        self._pending: dict[str, int] | None = None
        self._generation = 0  # bumped by every __iter__ so a superseded iterator stops

    @property
    def global_step_items(self) -> int:
        return self.per_rank * _rank_and_world()[1]

    def __len__(self) -> int:
        """Steps in one Lightning epoch: one pass over the items at this process count."""
        return max(1, self.num_items // self.global_step_items)

    def items_at(self, positions: np.ndarray) -> np.ndarray:
        """The item at each global stream position: a per-epoch seeded permutation (or identity)."""
        positions = np.asarray(positions, dtype=np.int64)
        epochs, within = np.divmod(positions, self.num_items)
        if not self.shuffle:
            return within
        items = np.empty_like(within)
        for epoch in np.unique(epochs):
            chosen = epochs == epoch
            items[chosen] = self._permute(within[chosen], int(epoch))
        return items

    def _permute(self, within: np.ndarray, epoch: int) -> np.ndarray:
        return permute(within, self.num_items, self.seed, epoch)

    def step_positions(self, consumed: int, rank: int, world: int) -> np.ndarray:
        """The global positions rank `rank` reads in the step that starts after `consumed` positions."""
        start = consumed + rank * self.per_rank
        return np.arange(start, start + self.per_rank, dtype=np.int64)

    def _begin(self) -> tuple[int, int, int]:
        """Apply a loaded state or start the next Lightning epoch; returns (consumed, steps to yield, generation)."""
        if self._pending is not None:
            self.consumed, self.steps_in_epoch = self._pending["consumed"], self._pending["steps_in_epoch"]
            self._pending = None
        elif self._started:
            self.steps_in_epoch = 0
            if self.repeat:
                self.consumed = 0
        if self.steps_in_epoch >= len(self):  # saved at the end of an epoch: go on with the next one
            self.steps_in_epoch = 0
        self._started = True
        self._generation += 1
        return self.consumed, len(self) - self.steps_in_epoch, self._generation

    def _advance(self, generation: int) -> bool:
        """Account for one step handed out; False when a newer iterator or a loaded state took over."""
        if generation != self._generation or self._pending is not None:
            return False
        self.consumed += self.global_step_items
        self.steps_in_epoch += 1
        return True

    def follow(self, previous: _ElasticStream) -> None:
        """Go on where `previous`, the training loader of the same data this one replaces, stopped (Lightning's
        reload_dataloaders_every_n_epochs builds a new loader every n epochs: a new one started the stream again,
        so the language model read the same blocks in the same order every epoch). Loaders of other data or
        settings are not followed."""
        if (previous.num_items, previous.seed, previous.shuffle) != (self.num_items, self.seed, self.shuffle):
            return
        self.consumed = previous._pending["consumed"] if previous._pending is not None else previous.consumed

    def state_dict(self) -> dict[str, int]:
        return {
            "consumed": self.consumed,
            "steps_in_epoch": self.steps_in_epoch,
            "seed": self.seed,
            "num_items": self.num_items,
            "world_size": _rank_and_world()[1],  # informational: any process count may resume
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        items = state.get("num_items", state.get("num_batches"))
        if state.get("seed", self.seed) != self.seed:
            raise BadFileError(
                f"The checkpoint's batch order was drawn with data.init_args.seed={state['seed']}, and this run gives "
                f"{self.seed}: resume with --data.init_args.seed {state['seed']}, or start a new run from the "
                "checkpoint's weights (--model.init_from)",
                keys=["data.init_args.seed"],
            )
        if items not in (None, self.num_items):
            raise BadFileError(
                f"The checkpoint's training loader had {items} items (blocks or batches), and this run's has "
                f"{self.num_items}: the data or its settings (batch_size, max_tokens, block_size, the files) changed "
                "since; resume with the run's own settings (its config.yaml), or start a new run from the "
                "checkpoint's weights (--model.init_from)"
            )
        if "consumed" in state:
            consumed, steps = int(state["consumed"]), int(state.get("steps_in_epoch", 0))
        else:  # a checkpoint of the former layout: (epoch, position) of one rank among world_size
            world = int(state.get("world_size", 1))
            steps = int(state["position"])
            consumed = int(state["epoch"]) * self.num_items + steps * world * self.per_rank
        self._pending = {"consumed": consumed, "steps_in_epoch": steps}


class _PositionBatches:
    """The batch sampler of one iterator: this rank's index lists for `steps` steps from `consumed`."""

    def __init__(self, stream: _ElasticStream, consumed: int, steps: int, indices: Callable) -> None:
        self.stream, self.consumed, self.steps, self.indices = stream, consumed, steps, indices
        self.rank, self.world = _rank_and_world()

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[list[int]]:
        step_items = self.stream.per_rank * self.world
        for k in range(self.steps):
            positions = self.stream.step_positions(self.consumed + k * step_items, self.rank, self.world)
            yield self.indices(positions)


class ResumableLoader(_ElasticStream):
    """Batches of `dataset` in a per-epoch seeded order, with a checkpointable, elastic position.

    batches: the index lists of one epoch (their order is shuffled per epoch when `shuffle`).
    collate_fn: turns the list of items (or the result of `dataset.__getitems__`) into a batch.
    Training (`shuffle=True`): each step every rank takes the next batch of the global stream (see the module
    docstring). Evaluation (`shuffle=False`): each rank takes every world_size-th batch, from the first, every time.
    """

    def __init__(
        self,
        dataset: Dataset,
        batches: Sequence[Sequence[int]],
        collate_fn: Callable = _identity,
        shuffle: bool = True,
        seed: int = 0,
        num_workers: int = 0,
        pin_memory: bool | None = None,
        start_epoch: int = 0,
    ) -> None:
        self.dataset = dataset
        # A BatchPlan stays two arrays; lists are normalised to lists of ints.
        self.batches = batches if isinstance(batches, BatchPlan) else [list(map(int, b)) for b in batches]
        self.collate_fn = collate_fn
        self.shuffle = shuffle
        self.seed = seed
        self.num_workers = num_workers
        # Pinned batches copy to a GPU without making the host wait (None: pin when CUDA is available).
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self.num_items = len(self.batches)
        self.per_rank = 1
        self._init_stream(start_epoch)

    def _permute(self, within: np.ndarray, epoch: int) -> np.ndarray:
        # A materialised permutation: batch lists are short, and this order is the one earlier releases used.
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_items)[within]

    def __len__(self) -> int:
        return -(-self.num_items // _rank_and_world()[1]) if not self.shuffle else super().__len__()

    def __iter__(self) -> Iterator[Any]:
        if not self.shuffle:
            return self._evaluation()
        world = _rank_and_world()[1]
        if self.num_items < world:  # as BlockStreamLoader's: the processes would share batches, counted twice
            raise DataFileError(
                f"The training split makes {self.num_items} batches, fewer than the {world} processes, each of which "
                "takes a batch of its own every step: use a smaller batch_size or max_tokens, more data, or fewer "
                "processes"
            )
        consumed, steps, generation = self._begin()
        sampler = _PositionBatches(self, consumed, steps, lambda positions: self.batches[self.items_at(positions)[0]])
        return self._generate(sampler, generation)

    def _evaluation(self) -> Iterator[Any]:
        """Every batch once over the ranks, rank r taking every world_size-th from the r-th. Ranks must run as many
        batches (a rank that ran out would leave the others waiting in a collective), so where the batches do not
        divide evenly a rank whose share is one short ends with a filler: the first batch again, marked FILLER,
        which the model runs and no metric counts. (Dropping the odd batches left the last ones of every split
        unscored with several processes, and a split of one batch unscored with two.)"""
        rank, world = _rank_and_world()
        mine = self.batches[rank::world]
        fillers = -(-self.num_items // world) - len(mine)
        for i, batch in enumerate(self._loader(list(mine) + [self.batches[0]] * fillers)):
            if i >= len(mine) and isinstance(batch, dict):
                batch[FILLER] = True
            yield batch

    def _loader(self, batch_sampler) -> DataLoader:
        return DataLoader(
            self.dataset,
            batch_sampler=batch_sampler,
            collate_fn=self.collate_fn,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
        )

    def _generate(self, sampler, generation: int) -> Iterator[Any]:
        for batch in self._loader(sampler):
            if not self._advance(generation):
                return
            yield batch


class BlockStreamLoader(_ElasticStream):
    """Training batches of `batch_size` blocks drawn from a token-block dataset by global stream position.

    Each batch also carries "sample_index": the global positions it holds (the exact-accounting tests read them).
    `shuffle=False` reads the blocks in order (sequential sampling), epoch after epoch.
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        seed: int = 0,
        shuffle: bool = True,
        num_workers: int = 0,
        pin_memory: bool | None = None,
    ) -> None:
        self.dataset = dataset
        self.num_items = len(dataset)
        self.per_rank = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.num_workers = num_workers
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory  # see ResumableLoader
        self._init_stream()

    def _check(self) -> None:
        world = _rank_and_world()[1]
        if self.num_items < self.per_rank * world:
            raise DataFileError(
                f"The training split has {self.num_items} blocks, fewer than one step's batch_size x processes = "
                f"{self.per_rank} x {world}; use a smaller batch_size or block_size, or more text"
            )

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        self._check()
        consumed, steps, generation = self._begin()
        sampler = _PositionBatches(self, consumed, steps, lambda positions: positions.tolist())
        loader = DataLoader(
            _StreamView(self),
            batch_sampler=sampler,
            collate_fn=_identity,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
        )
        return self._generate(loader, generation)

    def _generate(self, loader: DataLoader, generation: int) -> Iterator[dict[str, torch.Tensor]]:
        for batch in loader:
            if not self._advance(generation):
                return
            yield batch


class _StreamView(Dataset):
    """Stream positions to blocks: what the DataLoader workers index (picklable: no loader state inside)."""

    def __init__(self, loader: BlockStreamLoader) -> None:
        self.dataset = loader.dataset
        self.num_items, self.seed, self.shuffle = loader.num_items, loader.seed, loader.shuffle

    def __len__(self) -> int:
        return self.num_items

    def __getitems__(self, positions: Sequence[int]) -> dict[str, torch.Tensor]:
        positions = np.asarray(positions, dtype=np.int64)
        epochs, within = np.divmod(positions, self.num_items)
        blocks = within.copy()
        if self.shuffle:
            for epoch in np.unique(epochs):
                chosen = epochs == epoch
                blocks[chosen] = permute(within[chosen], self.num_items, self.seed, int(epoch))
        batch = self.dataset.__getitems__(blocks.tolist())
        batch["sample_index"] = torch.from_numpy(positions)
        return batch


def fixed_size_batches(num_items: int, batch_size: int, seed: int, shuffle: bool, drop_last: bool) -> list[list[int]]:
    """Batches of `batch_size` indices; when shuffling, items are regrouped once by `seed` (order then per epoch)."""
    indices = np.random.default_rng(seed).permutation(num_items) if shuffle else np.arange(num_items)
    stop = num_items - num_items % batch_size if drop_last else num_items
    return [indices[i : i + batch_size].tolist() for i in range(0, stop, batch_size)]


class BatchPlan:
    """Batches as two arrays, not lists: `order` (the items, batch after batch) and `bounds` (where each batch
    starts in it, and the end). Indexing gives one batch's item list. A million pairs cost 16 MB, not a list of lists."""

    def __init__(self, order: np.ndarray, bounds: np.ndarray) -> None:
        self.order = np.asarray(order, dtype=np.int64)
        self.bounds = np.asarray(bounds, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        index = int(index)
        if index < 0:
            index += len(self)
        return self.order[self.bounds[index] : self.bounds[index + 1]].tolist()

    def __iter__(self) -> Iterator[list[int]]:
        return (self[i] for i in range(len(self)))


def token_budget_plan(
    src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_tokens: int, seed: int = 0, max_sentences: int | None = None
) -> BatchPlan:
    """fairseq-style batches: samples sorted by length, grouped so that batch_size * longest <= max_tokens.

    Sorting by the longer side, then by the total, keeps neighbours alike on both sides, so padding stays small
    (about 6% of tokens on KJV-RV1909); ties break by `seed`. The batches depend on the lengths and the seed only
    (the order of the batches in each epoch is the loader's, from (seed, epoch)).
    """
    jitter = np.random.default_rng(seed).random(len(src_lengths))
    src_lengths, tgt_lengths = np.asarray(src_lengths), np.asarray(tgt_lengths)
    longer = np.maximum(src_lengths, tgt_lengths)
    order = np.lexsort((jitter, src_lengths + tgt_lengths, longer))
    too_long = np.flatnonzero(longer > max_tokens)
    if len(too_long):
        i = int(too_long[0])
        raise ConfigError(
            f"Sample {i} has {int(longer[i])} tokens, more than max_tokens={max_tokens}: raise data.init_args.max_tokens",
            keys=["data.init_args.max_tokens"],
        )
    # In this order the current sample is the longest of its batch so far (lengths only grow), so a batch is cut
    # when one more sample of this length would pass the budget.
    bounds, size = [0], 0
    for at, length in enumerate(longer[order].tolist()):
        if size and (length * (size + 1) > max_tokens or (max_sentences and size >= max_sentences)):
            bounds.append(at)
            size = 0
        size += 1
    if size:
        bounds.append(len(order))
    return BatchPlan(order, np.asarray(bounds, dtype=np.int64))


def token_budget_batches(
    src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_tokens: int, seed: int = 0, max_sentences: int | None = None
) -> list[list[int]]:
    """`token_budget_plan`'s batches as lists of indices."""
    return list(token_budget_plan(src_lengths, tgt_lengths, max_tokens, seed, max_sentences))


def load_prepared(root: Path, shards: type) -> tuple[dict, dict[str, Any]]:
    """A prepared dataset's manifest and its splits, each read as `shards` (RecordShards, or a task's own
    reader)."""
    info = json.loads((Path(root) / "manifest.json").read_text())
    return info, {split: shards(Path(root) / split, info["splits"][split]) for split in info["splits"]}


# ---------------------------------------------------------------------------------------------------- decoder batches


def target_batch(rows: Sequence[Sequence[int]], pad_id: int, bos_id: int, eos_id: int) -> dict[str, torch.Tensor]:
    """The decoder's side of a batch (an encoder-decoder's): tgt_in is bos then the tokens, labels the tokens then
    eos (IGNORE_INDEX at padding), tgt_mask True on real positions; the mask comes from the lengths, never a token id."""
    width = max(map(len, rows)) + 1
    tgt_in = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    for b, row in enumerate(rows):
        t = torch.as_tensor(np.asarray(row, dtype=np.int64))
        tgt_in[b, 0], tgt_in[b, 1 : len(t) + 1] = bos_id, t
        labels[b, : len(t)], labels[b, len(t)] = t, eos_id
    tgt_mask = torch.arange(width)[None, :] <= torch.tensor([len(r) for r in rows])[:, None]
    return {"tgt_in": tgt_in, "labels": labels, "tgt_mask": tgt_mask}


# ---------------------------------------------------------------------------------------------------- shard files


def map_file(path: Path, dtype) -> np.memmap | np.ndarray:
    """A shard file as an array through a memory map (an empty file, which cannot be mapped, as an empty array)."""
    return np.memmap(path, dtype=dtype, mode="r") if path.stat().st_size else np.zeros(0, dtype)


# ---------------------------------------------------------------------------------------------------- texts with a value


class RecordShards:
    """One prepared split of a TextsKind (one text and a JSON value per record): the texts' lengths (from the index,
    8 bytes a text) and, on demand, the values read whole; the ids through memory maps opened for one batch and
    dropped."""

    def __init__(self, directory: Path, index: dict) -> None:
        self.directory = Path(directory)
        self.dtype = np.dtype(index["dtype"])
        self.names = [s["name"] for s in index["shards"]]
        offsets = [np.load(self.directory / f"{name}.texts.npy") for name in self.names]
        self.offsets = offsets
        self.first = np.concatenate([[0], np.cumsum([len(o) - 1 for o in offsets])]).astype(np.int64)
        self.lengths = np.concatenate([np.diff(o) for o in offsets] or [np.zeros(0, np.int64)]).astype(np.int64)

    def __len__(self) -> int:
        return int(self.first[-1])

    def values(self) -> list:
        """Each record's value as its stream wrote it."""
        out = []
        for name in self.names:
            with open(self.directory / f"{name}.extras.jsonl", encoding="utf-8") as handle:
                out += [json.loads(line) for line in handle]
        return out

    def read(self, rows: Sequence[int]) -> list[np.ndarray]:
        """The ids (copies) of the texts at `rows`."""
        rows = np.asarray(rows, dtype=np.int64)
        shard_of = np.searchsorted(self.first, rows, side="right") - 1
        out: list = [None] * len(rows)
        for shard in np.unique(shard_of).tolist():
            ids = map_file(self.directory / f"{self.names[shard]}.bin", self.dtype)
            offsets = self.offsets[shard]
            for b in np.flatnonzero(shard_of == shard).tolist():
                local = int(rows[b] - self.first[shard])
                out[b] = np.array(ids[offsets[local] : offsets[local + 1]])
            del ids  # the map closes here: nothing stays mapped between batches
        return out
