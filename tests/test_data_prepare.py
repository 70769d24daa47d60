"""The streaming `prepare`: every local format into token shards, held-out splits, resume after a kill, the cache,
bounded tokenizer samples, too-small corpora; and the elastic training stream's exact sample accounting."""

from __future__ import annotations

import csv
import errno
import json
import os

import lightning as L
import numpy as np
import pytest
import torch

from lit_transformer import TransformerConfig
from lit_transformer.data import (
    LanguageModelingDataModule,
    cache,
    encode_worker,
    language_modeling,
    loaders,
    shards,
    sources,
)
from lit_transformer.data.loaders import BlockStreamLoader, permute
from lit_transformer.data.text import train_tokenizer
from lit_transformer.errors import WriteError

WORDS = "now is the winter of our discontent made glorious summer by this sun of york".split()


def paragraphs(n: int, length: int = 400, seed: int = 0) -> list[str]:
    """n distinct paragraphs of about `length` characters, several lines each."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        words = [WORDS[j] for j in rng.integers(0, len(WORDS), length // 5)]
        lines = [" ".join(words[k : k + 8]) for k in range(0, len(words), 8)]
        out.append(f"{i}: " + "\n".join(lines) + "\n")
    return out


def write(tmp_path, fmt: str, docs: list[str], column: str = "text"):
    """The documents in one of the formats the DataModule reads; the dataset spec to pass."""
    if fmt == "jsonl":
        path = tmp_path / "corpus.jsonl"
        path.write_text("".join(json.dumps({column: d, "id": i}) + "\n" for i, d in enumerate(docs)))
    elif fmt in ("csv", "tsv"):
        path = tmp_path / f"corpus.{fmt}"
        with open(path, "w", newline="") as handle:
            writer = csv.writer(handle, delimiter="\t" if fmt == "tsv" else ",")
            writer.writerow(["id", column])
            writer.writerows([i, d] for i, d in enumerate(docs))
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = tmp_path / "corpus.parquet"
        pq.write_table(pa.table({"id": list(range(len(docs))), column: docs}), path, row_group_size=37)
    elif fmt in ("txt-folder", "txt-glob"):
        folder = tmp_path / "texts"
        folder.mkdir()
        for i, d in enumerate(docs):
            (folder / f"doc{i:04d}.txt").write_text(d)
        return str(folder) if fmt == "txt-folder" else str(folder / "doc*.txt")
    else:
        raise ValueError(fmt)
    return str(path)


def make(tmp_path, dataset, **kwargs) -> LanguageModelingDataModule:
    args = dict(tokenizer="char", vocab_size=64, block_size=16, batch_size=4, cache_dir=str(tmp_path / "cache"))
    return LanguageModelingDataModule(dataset=str(dataset), **{**args, **kwargs})


def split_tokens(dm: LanguageModelingDataModule, split: str) -> list[int]:
    shards_ = dm._prepared()[split]
    return np.concatenate([np.array(shards_.open(i)) for i in range(len(shards_.paths))]).tolist()


def expected_tokens(dm: LanguageModelingDataModule, docs: list[str]) -> list[int]:
    out = []
    for doc in docs:
        out += dm.tokenizer.encode(doc, add_special_tokens=False).ids + [dm.eos_token_id]
    return out


# ---------------------------------------------------------------------------------------------------- formats


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "tsv", "parquet", "txt-folder", "txt-glob"])
def test_every_local_format_streams_into_shards_that_hold_each_document_then_eos(tmp_path, fmt):
    docs = paragraphs(240)
    dm = make(tmp_path, write(tmp_path, fmt, docs))
    dm.prepare_data()
    info, splits = loaders.load_prepared(dm._root, language_modeling.TokenShards)
    assert info["held_out"] == "hash" and info["dtype"] == "uint16"
    texts = dm.texts()
    assert sorted(texts["train"] + texts["validation"] + texts["test"]) == sorted(docs)  # by document, disjoint
    for split in ("train", "validation", "test"):
        assert split_tokens(dm, split) == expected_tokens(dm, texts[split])
        assert splits[split].documents == len(texts[split])
        assert splits[split].characters == sum(map(len, texts[split]))
    assert 0 < len(texts["validation"]) < 30 and 0 < len(texts["test"]) < 30


def test_a_held_out_document_is_chosen_by_a_hash_of_its_text_whatever_its_position(tmp_path):
    docs = paragraphs(300)
    first = make(tmp_path / "a", write(tmp_path, "jsonl", docs)).texts()
    (tmp_path / "b").mkdir()
    second = make(tmp_path / "b", write(tmp_path / "b", "jsonl", docs[::-1])).texts()
    for split in first:
        assert sorted(first[split]) == sorted(second[split])


def test_a_handful_of_long_documents_are_cut_by_lines(tmp_path):
    docs = ["".join(f"{d}.{i} {' '.join(WORDS)}\n" for i in range(300)) for d in range(3)]
    dm = make(tmp_path, write(tmp_path, "txt-folder", docs))
    texts = dm.texts()
    assert dm.stream.mode == "lines"
    for d, doc in enumerate(docs):  # each document is cut 90/5/5 at line boundaries, in order
        assert texts["train"][d] + texts["validation"][d] + texts["test"][d] == doc


def test_a_large_text_file_is_read_in_line_bounded_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "CHUNK_BYTES", 1000)
    text = "".join(f"line {i} {' '.join(WORDS[: i % 9])}\n" for i in range(2000))
    (tmp_path / "big.txt").write_text(text)
    pieces = list(sources.file_chunks(str(tmp_path / "big.txt"), 0))
    assert len(pieces) > 40 and all(p.text.endswith("\n") for p in pieces if p.text)
    assert max(len(p.text) for p in pieces) < 1100 and "".join(p.text for p in pieces) == text
    assert [p.last for p in pieces].count(True) == 1 and pieces[-1].last


# ---------------------------------------------------------------------------------------------------- small corpora


def test_a_250_paragraph_jsonl_prepares_and_trains(tmp_path):
    """The issue's case: 250 paragraphs (100 KB) failed with "test split has 62 tokens, fewer than one block"."""
    path = write(tmp_path, "jsonl", paragraphs(250))
    assert 90_000 < os.path.getsize(path) < 120_000
    dm = make(tmp_path, path, tokenizer="byte_bpe", vocab_size=512, block_size=128, batch_size=8)
    config = TransformerConfig.preset("tiny", vocab_size=dm.vocab_size, max_seq_len=128)
    from lit_transformer.engine.lightning_module import LitTransformer

    trainer = L.Trainer(
        default_root_dir=tmp_path,  # the run writes its tokenizer.json there
        max_steps=3,
        limit_val_batches=2,
        val_check_interval=3,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(LitTransformer(config, warmup_steps=1), dm)
    assert trainer.global_step == 3 and torch.isfinite(trainer.callback_metrics["val/loss"])
    assert all(len(dm._blocks[s]) >= 2 for s in ("validation", "test"))


@pytest.mark.parametrize("rows", [5, 40])
def test_a_too_small_corpus_names_its_size_and_the_minimum(tmp_path, rows):
    dm = make(tmp_path, write(tmp_path, "jsonl", paragraphs(rows, length=60)), block_size=256)
    with pytest.raises(ValueError) as error:
        dm.setup()
    message = str(error.value)
    assert "fewer than one block of block_size + 1 = 257" in message
    assert "characters in" in message and f"{rows} documents" in message and "needs at least about" in message


# ---------------------------------------------------------------------------------------------------- resume, atomicity, cache


class Killed(Exception):
    pass


def _prepare(stream, tokenizer, root, shard_tokens=5000) -> dict:
    uint16 = np.dtype(np.uint16)
    return shards.prepare_pass(
        stream, "train", root, language_modeling.TEXT, (tokenizer,), 2, uint16, None, shard_tokens
    )


@pytest.mark.parametrize("kill_at_chunk", [2, 5])
def test_a_killed_prepare_resumes_after_its_last_finished_shard(tmp_path, monkeypatch, kill_at_chunk):
    """Chunks of ~2,000 characters, shards of >= 5,000 tokens: the kill lands mid-shard (in the first, or after some
    finished). The resumed run encodes only what the finished shards lack, and its shards are byte for byte those of
    an uninterrupted run, in every split the pass fills (train and the carved validation and test)."""
    monkeypatch.setattr(shards, "CHUNK_CHARS", 2000)
    path = write(tmp_path, "jsonl", paragraphs(260))
    stream = language_modeling.CorpusStream(path)
    tokenizer = train_tokenizer(["".join(WORDS) + "0123456789: \n"], "char", 64)
    real_encode, encoded = encode_worker.encode, []

    def encode(texts, *args, **kwargs):
        if len(encoded) + 1 == kill_at:
            raise Killed  # mid-shard: the current shard's .tmp file is half written
        encoded.append(sum(map(len, texts)))
        return real_encode(texts, *args, **kwargs)

    monkeypatch.setattr(encode_worker, "encode", encode)
    kill_at = 0
    whole = _prepare(stream, tokenizer, tmp_path / "whole")
    assert len(whole["train"]["shards"]) >= 3 and set(whole) == {"train", "validation", "test"}
    encoded.clear()
    kill_at, root = kill_at_chunk, tmp_path / "killed"
    with pytest.raises(Killed):
        _prepare(stream, tokenizer, root)
    progress = {s: json.loads((root / s / "progress.json").read_text()) for s in whole}
    for split in whole:
        assert not (root / split / "index.json").exists()  # nothing reads an unfinished split
        assert sorted(p.name for p in (root / split).glob("*.bin")) == [s["file"] for s in progress[split]["shards"]]
    assert list(root.glob("*/*.tmp"))  # the half shard stayed a temporary file
    assert (sum(len(p["shards"]) for p in progress.values()) > 0) == (kill_at_chunk > 3)
    encoded.clear()
    kill_at = 0
    resumed = _prepare(stream, tokenizer, root)
    done = sum(p["characters"] for p in progress.values())
    assert sum(encoded) == sum(i["characters"] for i in whole.values()) - done  # no finished shard redone
    assert resumed == whole and not list(root.glob("*/*.tmp"))
    for split, index in whole.items():
        for entry in index["shards"]:
            assert (root / split / entry["file"]).read_bytes() == (
                tmp_path / "whole" / split / entry["file"]
            ).read_bytes()


def test_a_second_prepare_is_a_cache_hit_keyed_by_content(tmp_path, monkeypatch):
    docs = paragraphs(220)
    path = write(tmp_path, "jsonl", docs)
    first = make(tmp_path, path).prepare()
    calls = []
    monkeypatch.setattr(
        encode_worker, "encode", lambda *a, **k: calls.append(1) or (_ for _ in ()).throw(AssertionError)
    )
    os.utime(path, (1, 1))  # a new modification time, the same bytes: the same entry
    assert make(tmp_path, path).prepare() == first and not calls
    monkeypatch.undo()
    write(tmp_path, "jsonl", docs[:-1] + ["a changed last paragraph\n"])
    assert make(tmp_path, path).prepare() != first


def test_a_file_edited_in_place_with_its_size_and_mtime_kept_is_prepared_again(tmp_path):
    docs = paragraphs(220)
    path = write(tmp_path, "jsonl", docs)
    before = make(tmp_path, path).texts()["train"]
    i, j = [k for k, doc in enumerate(docs) if doc in before][:2]
    stat = os.stat(path)
    docs[i], docs[j] = docs[j], docs[i]  # the same bytes in another order: the same size, the same tokenizer
    write(tmp_path, "jsonl", docs)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the old modification time back (touch -d, cp -p)
    assert os.stat(path).st_size == stat.st_size
    after = make(tmp_path, path).texts()["train"]
    assert after.index(docs[i]) < after.index(docs[j])  # the file's new order, not the stale shards' old one


class ReadOnlyLock:
    """A FileLock in a folder that cannot be written (a read-only mount, no permission)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def acquire(self) -> None:
        raise OSError(errno.EROFS, "Read-only file system", self.path)

    def __enter__(self) -> ReadOnlyLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        pass


def test_an_unwritable_cache_is_named_with_the_fix_and_a_prepared_one_still_serves(tmp_path, monkeypatch):
    path = write(tmp_path, "jsonl", paragraphs(220))
    with monkeypatch.context() as patched:
        patched.setattr(cache, "FileLock", ReadOnlyLock)
        with pytest.raises(WriteError, match=r"cannot write the data cache: .*cache.*--data\.init_args\.cache_dir"):
            make(tmp_path, path).prepare()
    root = make(tmp_path, path).prepare()  # prepared where the cache is writable
    (tmp_path / "cache" / "file-hashes.json").unlink()  # another node: the files' hashes are not known there
    monkeypatch.setattr(cache, "FileLock", ReadOnlyLock)
    dm = make(tmp_path, path)
    assert dm.prepare() == root and len(dm._prepared()["train"]) > 0


def test_the_tokenizer_trains_on_a_bounded_sample(tmp_path, monkeypatch):
    seen = []
    real = language_modeling.sample_texts

    def sample(stream, limit):
        texts = real(stream, limit)
        seen.append(sum(map(len, texts)))
        return texts

    monkeypatch.setattr("lit_transformer.data.language_modeling.sample_texts", sample)
    dm = make(tmp_path, write(tmp_path, "jsonl", paragraphs(300)), tokenizer_sample_chars=5000)
    assert dm.vocab_size > 10 and seen == [5000]


# ---------------------------------------------------------------------------------------------------- the elastic stream


@pytest.mark.parametrize("n", [1, 2, 3, 17, 1000, 4097])
def test_permute_is_a_seeded_bijection_per_epoch(n):
    order = permute(np.arange(n), n, seed=5, epoch=0)
    assert sorted(order.tolist()) == list(range(n))
    assert np.array_equal(order[::-1], permute(np.arange(n)[::-1], n, seed=5, epoch=0))  # pointwise, pure
    if n > 16:
        assert not np.array_equal(order, permute(np.arange(n), n, seed=5, epoch=1))
        assert not np.array_equal(order, permute(np.arange(n), n, seed=6, epoch=0))


class _Blocks(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitems__(self, indices):
        ids = torch.tensor(indices)[:, None].repeat(1, 3)
        return {"input_ids": ids, "labels": ids}


def _run(loader_state, world: int, steps: int, n: int = 53, batch_size: int = 4, monkeypatch=None):
    """`steps` steps of `world` simulated ranks from a saved state; (global samples in order, blocks, state)."""
    samples, blocks, state = [], [], loader_state
    loaders_ = []
    for rank in range(world):
        monkeypatch.setattr(loaders, "_rank_and_world", lambda rank=rank: (rank, world))
        loader = BlockStreamLoader(_Blocks(n), batch_size, seed=3)
        if state is not None:
            loader.load_state_dict(state)
        loaders_.append([rank, loader, iter(loader)])
    for _ in range(steps):
        for entry in loaders_:
            rank, loader, iterator = entry
            monkeypatch.setattr(loaders, "_rank_and_world", lambda rank=rank: (rank, world))
            batch = next(iterator, None)
            if batch is None:  # the end of Lightning's epoch (53 // (4 x world) steps): it starts the next
                entry[2] = iterator = iter(loader)
                batch = next(iterator)
            samples += batch["sample_index"].tolist()
            blocks += batch["input_ids"][:, 0].tolist()
    return samples, blocks, loaders_[0][1].state_dict()


@pytest.mark.parametrize(("before", "after"), [(1, 2), (2, 1), (2, 3), (3, 1)])
def test_elastic_resume_continues_the_same_global_sequence(monkeypatch, before, after):
    """A run of N ranks checkpointed after k steps, resumed with M ranks: the global sample sequence goes on where it
    stopped, no sample repeated or skipped, across epoch boundaries too (53 blocks, batches of 4)."""
    first, first_blocks, state = _run(None, before, 7, monkeypatch=monkeypatch)
    second, second_blocks, _ = _run(state, after, 9, monkeypatch=monkeypatch)
    total = 4 * (7 * before + 9 * after)
    assert first + second == list(range(total))
    reference, reference_blocks, _ = _run(None, 1, total // 4, monkeypatch=monkeypatch)
    assert first_blocks + second_blocks == reference_blocks
    epoch0 = reference_blocks[:53]
    assert sorted(epoch0) == list(range(53)) and epoch0 != list(range(53))  # each epoch a permutation


# ---------------------------------------------------------------------------------------------------- the command


def test_the_prepare_command_fills_the_cache_that_fit_then_reads(tmp_path, capsys, monkeypatch):
    from lit_transformer.cli.lightning_cli import main

    path = write(tmp_path, "jsonl", paragraphs(220))
    config = tmp_path / "run.yaml"
    config.write_text(
        "model:\n  lr: 1.0e-3\n"  # other sections are ignored by prepare
        "data:\n  class_path: lit_transformer.data.LanguageModelingDataModule\n"
        f"  init_args:\n    dataset: {path}\n    tokenizer: char\n    vocab_size: 64\n    block_size: 32\n"
    )
    cache = str(tmp_path / "cache")
    main(["prepare", "--config", str(config), "--data.init_args.cache_dir", cache])
    assert "prepared LanguageModelingDataModule" in capsys.readouterr().out
    monkeypatch.setattr(encode_worker, "encode", lambda *a, **k: pytest.fail("fit re-tokenized a prepared corpus"))
    dm = LanguageModelingDataModule(path, tokenizer="char", vocab_size=64, block_size=32, cache_dir=cache)
    dm.setup()
    assert len(dm._blocks["train"]) > 0
    with pytest.raises(SystemExit) as refused:
        main(["prepare", "--config", str(config), "--trainer.max_steps", "3"])
    assert refused.value.code == 2
    assert "error: prepare takes --config and --data.* keys only, not --trainer.max_steps" in capsys.readouterr().err
    # a flag before a config that sets it: fit reads the config's value, so prepare must not prepare the flag's
    with pytest.raises(SystemExit) as refused:
        main(["prepare", "--data.init_args.block_size", "16", "--config", str(config)])
    assert refused.value.code == 2
    assert "--data.init_args.block_size 16 is set again by " in capsys.readouterr().err


def test_worker_processes_write_the_same_shards_as_one_process(tmp_path, monkeypatch):
    """A big source is tokenized by spawned worker processes (in order, a bounded number of chunks in flight)."""
    monkeypatch.setattr(shards, "CHUNK_CHARS", 3000)
    monkeypatch.setattr(shards, "POOL_MIN_BYTES", 0)
    stream = language_modeling.CorpusStream(write(tmp_path, "jsonl", paragraphs(300)))
    tokenizer = train_tokenizer(["".join(WORDS) + "0123456789: \n"], "char", 64)
    results = {}
    for workers in (1, 2):
        root = tmp_path / f"workers{workers}"
        args = (root, language_modeling.TEXT, (tokenizer,), 2, np.dtype(np.uint16), None, 4000, workers)
        index = shards.prepare_pass(stream, "train", *args)
        results[workers] = (index, {p.relative_to(root): p.read_bytes() for p in sorted(root.glob("*/*.bin"))})
    assert results[1] == results[2] and len(results[1][1]) > 6


def test_a_hub_dataset_is_read_with_streaming(tmp_path, monkeypatch):
    """No hub is reachable here: the hub path runs against `datasets`' own IterableDataset, built locally."""
    import datasets

    docs, calls = paragraphs(60), []

    def load_dataset(name, config=None, streaming=False, **kwargs):
        calls.append((name, config, streaming))
        split = lambda rows: datasets.IterableDataset.from_generator(lambda: ({"text": r} for r in rows))  # noqa: E731
        return datasets.IterableDatasetDict(
            {"train": split(docs[:50]), "valid": split(docs[50:55]), "test": split(docs[55:])}
        )

    monkeypatch.setattr("lit_transformer.data.sources.ensure_online", lambda what, hint: None)
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    dm = make(tmp_path, "someone/corpus", dataset_config="plain")
    dm.prepare_data()
    assert calls and all(call == ("someone/corpus", "plain", True) for call in calls)
    texts = dm.texts()
    assert (texts["train"], texts["validation"], texts["test"]) == (docs[:50], docs[50:55], docs[55:])
    assert split_tokens(dm, "validation") == expected_tokens(dm, docs[50:55])


@pytest.mark.parametrize("spec", ["/no/such/corpus.jsonl", "missing.parquet", "./texts"])
def test_a_missing_local_path_is_named_not_sent_to_the_hub(tmp_path, spec):
    with pytest.raises(FileNotFoundError, match="does not exist: give an existing local file"):
        make(tmp_path, spec).texts()


@pytest.mark.parametrize("sampling", ["random", "sequential"])
def test_training_batches_are_the_same_with_loader_workers(tmp_path, sampling):
    dm = make(tmp_path, write(tmp_path, "jsonl", paragraphs(220)), sampling=sampling)
    dm.setup()
    blocks = dm._blocks["train"]
    batches = {}
    for workers in (0, 1):
        loader = BlockStreamLoader(blocks, 4, seed=1, shuffle=sampling == "random", num_workers=workers)
        batches[workers] = [b for _, b in zip(range(5), loader)]
    for a, b in zip(batches[0], batches[1]):
        assert all(torch.equal(a[k], b[k]) for k in ("input_ids", "labels", "sample_index"))
    first = batches[0][0]["sample_index"].tolist()
    assert first == [0, 1, 2, 3]
    in_order = torch.equal(batches[0][0]["input_ids"], blocks.__getitems__([0, 1, 2, 3])["input_ids"])
    assert in_order == (sampling == "sequential")


@pytest.mark.parametrize("configured", [False, True])
def test_fit_shows_the_preparation_summaries_where_stderr_is_a_file(tmp_path, configured):
    """`fit` prepares a missing corpus itself; with stderr in a log file (no progress bar) its per-split summaries
    (MB/s, tokens/s) must still be written, once, and an application's own logging setup is left alone."""
    import subprocess
    import sys

    script = (
        "import logging, sys\n"
        + ("logging.basicConfig(level=logging.INFO, format='root: %(message)s')\n" if configured else "")
        + "from lit_transformer.cli import show_package_info_logs\n"
        "show_package_info_logs(); show_package_info_logs()\n"
        "logging.getLogger('lit_transformer.data.shards').info('prepare train: 1.0 MB in 1.0 s (1.0 MB/s)')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if "prepare train" in line]
    assert lines == [("root: " if configured else "") + "prepare train: 1.0 MB in 1.0 s (1.0 MB/s)"]


# ---------------------------------------------------------------------------------------------------- compatibility


def test_caches_prepared_by_earlier_versions_are_found_and_keep_their_layout(tmp_path):
    """A prepared corpus is reused only if the same inputs give the same key: these keys and file layouts are those
    the code wrote before text and pairs shared one machinery (given fixed tokenizer keys, so no tokenizer version
    enters them), so caches prepared then are still found and read."""
    from lit_transformer.data.translation import PairShards, PairStream, prepare_pairs

    (tmp_path / "corpus.jsonl").write_text(
        "".join(json.dumps({"text": f"document {i}\nof a corpus\n"}) + "\n" for i in range(240))
    )
    (tmp_path / "pairs.jsonl").write_text(
        "".join(json.dumps({"en": f"the house {i}", "es": f"la casa {i}"}) + "\n" for i in range(500))
    )
    tokenizer = train_tokenizer(["document of a corpus the house la casa 0123456789\n"], "char", 64)
    text = language_modeling.prepare_corpus(
        language_modeling.CorpusStream(str(tmp_path / "corpus.jsonl")), tokenizer, "tokenizer-key", 2, tmp_path / "c"
    )
    pair_stream = PairStream(str(tmp_path / "pairs.jsonl"))
    pairs = prepare_pairs(
        pair_stream, (tokenizer, tokenizer), ("source-key", "target-key"), tmp_path / "c", max_pairs=400
    )
    assert (text.parent.name, text.name) == ("shards", "23a4cc44b53c49ef521e")
    assert (pairs.parent.name, pairs.name) == ("pairs", "9b992193e3727223ffb4")
    layouts = {
        text: (["tokenizer_key", "vocab_size", "eos_id"], ["tokens", "documents"], {"bin", "docs.npy"}, set()),
        pairs: (["tokenizer_keys", "vocab_sizes"], ["pairs", "src_tokens", "tgt_tokens", "empty", "text"],
                {"src.bin", "tgt.bin", "pairs.npy"}, {"text.bin", "text.npy"}),
    }  # fmt: skip
    for root, (fields, counts, files, held_out_files) in layouts.items():
        manifest = json.loads((root / "manifest.json").read_text())
        assert set(manifest) == {"version", "dataset", "held_out", "dtype", "splits", *fields}
        for split, index in manifest["splits"].items():
            assert set(index) == {"dtype", "shards", "characters", "bytes", *counts}
            names = {p.name.split(".", 1)[1] for p in (root / split).glob("shard-00000.*")}
            assert names == files | (held_out_files if split != "train" else set())
    assert loaders.load_prepared(text, language_modeling.TokenShards)[1]["validation"].documents == 13
    assert len(loaders.load_prepared(pairs, PairShards)[1]["train"]) == 400


_PARENT_OF_WORKERS = """
import sys
from lit_transformer.data import shards
from lit_transformer.data.text import train_tokenizer
import numpy as np

if __name__ == "__main__":
    tokenizer = train_tokenizer(["abc \\n"], "char", 16)
    encoder = shards.Encoder((tokenizer,), None, np.dtype(np.uint16), workers=2)
    chunk = shards.Chunk(1)
    chunk.texts[0].append("abc")
    chunk.ends[0].append(True)
    list(encoder.submit("train", chunk)) + list(encoder.drain())  # the workers are up, their initializer ran
    print(*encoder.pool._processes, flush=True)
    sys.stdin.read()  # wait here until killed
"""


def test_tokenizing_workers_exit_when_their_parent_is_killed(tmp_path):
    """A prepare (or fit) killed by SIGKILL or SIGTERM runs no cleanup: its pool's idle workers waited on their task
    queue forever, hundreds of MB each. They now exit on their own once their parent is gone."""
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "parent.py"
    script.write_text(_PARENT_OF_WORKERS)
    parent = subprocess.Popen(
        [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        cwd=os.getcwd(), env={**os.environ, "PYTHONPATH": os.getcwd()},
    )  # fmt: skip
    workers = [int(pid) for pid in parent.stdout.readline().split()]
    assert workers, "the parent started no worker"
    try:
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 30
        alive = workers
        while alive and time.monotonic() < deadline:
            alive = [pid for pid in alive if _running(pid)]
            time.sleep(0.1)
        assert not alive, f"workers {alive} outlived their killed parent"
    finally:
        for pid in workers:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
