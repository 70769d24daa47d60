"""Translation pairs through token shards: every local format and a hub stream prepare into shards that hold each
pair's ids, held-out splits by a hash of the pair, bounded chunks, resume after a kill, the cache, clear errors for
malformed lines; batches within the token budget, equal to the in-memory path's, resuming elastically; and the
CLI's `prepare` and `fit` on a local file."""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from _forked import HARNESS_ENV, warm_python

from lit_transformer.data import TranslationDataModule, encode_worker, loaders, shards, sources, translation
from lit_transformer.data.loaders import load_prepared
from lit_transformer.data.sources import hash_bucket
from lit_transformer.data.translation import PairShards, prepare_pairs

ROOT = Path(__file__).resolve().parents[1]
EN = "the house is red and the dog sleeps by the sea in the morning light".split()
ES = "la casa es roja y el perro duerme junto al mar en la luz de la mañana".split()


def pair_rows(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """n distinct pairs of 2 to 14 words a side."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        k = int(rng.integers(2, 15))
        rows.append((f"{' '.join(rng.choice(EN, k))} {i}", f"{' '.join(rng.choice(ES, k))} {i}"))
    return rows


def write_pairs(path: Path, rows: list[tuple[str, str]], fmt: str) -> Path:
    path = path.with_suffix(f".{fmt}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "jsonl":
        path.write_text("".join(json.dumps({"en": s, "es": t, "id": i}) + "\n" for i, (s, t) in enumerate(rows)))
    elif fmt in ("tsv", "csv"):
        with open(path, "w", newline="") as handle:
            writer = csv.writer(handle, delimiter="\t" if fmt == "tsv" else ",")
            writer.writerow(["en", "es"])
            writer.writerows(rows)
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"en": [s for s, _ in rows], "es": [t for _, t in rows]}), path, row_group_size=50)
    else:
        raise ValueError(fmt)
    return path


def make(tmp_path: Path, dataset, **kwargs) -> TranslationDataModule:
    args = dict(tokenizer="char", vocab_size=100, max_tokens=256, max_length=64, cache_dir=str(tmp_path / "cache"))
    return TranslationDataModule(dataset=str(dataset), **{**args, **kwargs})


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def split_pairs(dm: TranslationDataModule, split: str) -> list[tuple[list[int], list[int]]]:
    _, splits = load_prepared(dm.prepare(), PairShards)
    srcs, tgts, _ = splits[split].read(range(len(splits[split])))
    return [(s.tolist(), t.tolist()) for s, t in zip(srcs, tgts, strict=True)]


# ---------------------------------------------------------------------------------------------------- preparing


@pytest.mark.parametrize("fmt", ["jsonl", "tsv", "csv", "parquet"])
def test_each_format_prepares_into_shards_holding_every_pair_once_with_held_out_splits_by_hash(tmp_path, fmt):
    rows = pair_rows(400)
    dm = make(tmp_path, write_pairs(tmp_path / "corpus", rows, fmt))
    info, splits = load_prepared(dm.prepare(), PairShards)
    assert info["held_out"] == "hash" and info["dtype"] == "uint16"
    by_split = dm.pairs()
    assert sorted(p for s in by_split.values() for p in zip(*s, strict=True)) == sorted(rows)  # each pair once
    owner = {0: "validation", 1: "test"}
    for split, (srcs, tgts) in by_split.items():
        assert {owner.get(hash_bucket(s, t) // 5, "train") for s, t in zip(srcs, tgts)} == {split}
        expected = [(ids(dm.tokenizer, s), ids(dm.target_tokenizer, t)) for s, t in zip(srcs, tgts, strict=True)]
        assert split_pairs(dm, split) == expected
        assert splits[split].characters == sum(map(len, srcs + tgts))
    assert 5 < len(by_split["validation"][0]) < 40 and 5 < len(by_split["test"][0]) < 40


def test_separate_tokenizers_and_a_translation_column(tmp_path):
    folder = tmp_path / "j"
    folder.mkdir()
    rows = pair_rows(120)
    for split in ("train", "valid", "test"):
        lines = [json.dumps({"translation": {"de": s, "en": t}}) for s, t in rows]
        (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    dm = make(tmp_path, folder, source_lang="de", target_lang="en", shared_vocab=False)
    assert dm.target_tokenizer is not dm.tokenizer
    assert split_pairs(dm, "validation")[7] == (ids(dm.tokenizer, rows[7][0]), ids(dm.target_tokenizer, rows[7][1]))
    assert "ñ" not in dm.tokenizer.get_vocab() and "ñ" in dm.target_tokenizer.get_vocab()
    with pytest.raises(ValueError, match="no language"):
        make(tmp_path, folder, source_lang="fr").prepare()


def test_a_hub_dataset_is_read_as_a_stream(tmp_path, monkeypatch):
    """The hub path's code, with `datasets` streaming a local parquet file in place of the hub."""
    import datasets

    rows = pair_rows(300)
    data = write_pairs(tmp_path / "hub" / "train", rows, "parquet")
    real = datasets.load_dataset
    asked = []

    def load_dataset(name, config=None, streaming=False, **kwargs):
        asked.append((name, config, streaming))
        return real("parquet", data_files={"train": str(data)}, streaming=streaming)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setattr(sources, "ensure_online", lambda what, hint: None)
    dm = make(tmp_path, "someone/pairs", dataset_config="en-es")
    info, splits = load_prepared(dm.prepare(), PairShards)
    assert asked and all(a == ("someone/pairs", "en-es", True) for a in asked)
    assert isinstance(dm.pair_stream.sources["train"].table, datasets.IterableDataset)
    assert info["held_out"] == "hash" and sum(len(s) for s in splits.values()) == len(rows)


def test_a_malformed_line_names_the_file_and_the_line(tmp_path):
    good = [json.dumps({"en": s, "es": t}) for s, t in pair_rows(300)]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(good[:2] + ['{"en": "broken", "es": '] + good[2:]) + "\n")
    with pytest.raises(ValueError, match=rf"{path}:3 is not valid JSON"):
        make(tmp_path, path).prepare()
    path = tmp_path / "bad.tsv"
    path.write_text("en\tes\na house\tuna casa\nthe dog\tel perro\textra\n" + "a\tb\n" * 300)
    with pytest.raises(ValueError, match=rf"{path}:3 has 3 fields where the header has 2"):
        make(tmp_path, path).prepare()
    path = tmp_path / "other.jsonl"
    path.write_text(json.dumps({"en": "a house", "de": "ein Haus"}) + "\n")
    with pytest.raises(ValueError, match="has no column 'es'"):
        make(tmp_path, path).prepare()


def test_a_corpus_too_small_for_held_out_splits_says_how_big_it_must_be(tmp_path):
    with pytest.raises(ValueError, match=r"has 6 pairs and no (validation|test) split.*at least about 400 pairs"):
        make(tmp_path, write_pairs(tmp_path / "tiny", pair_rows(6), "jsonl")).prepare()


def test_preparation_encodes_bounded_chunks_while_reading_row_by_row(tmp_path, monkeypatch):
    """Nothing holds the corpus: each encode call gets one chunk of about CHUNK_CHARS characters, and when it runs the
    reader is at most a few chunks ahead of it (memory bounded by the chunk size, not the corpus)."""
    rows = pair_rows(3000)
    path = write_pairs(tmp_path / "corpus", rows, "jsonl")
    monkeypatch.setattr(shards, "CHUNK_CHARS", 2000)
    read = [0]
    real_records, real_encode = sources.records, encode_worker.encode
    calls = []

    def counting_records(*args, **kwargs):
        for record in real_records(*args, **kwargs):
            read[0] += 1
            yield record

    def recording_encode(texts, *args, **kwargs):
        calls.append((len(texts), sum(map(len, texts)), read[0]))  # rows read so far
        return real_encode(texts, *args, **kwargs)

    dm = make(tmp_path, path, tokenizer_sample_chars=5000)
    monkeypatch.setattr(sources, "records", counting_records)
    assert dm.tokenizer.get_vocab_size() > 4  # trained on a bounded sample: the stream's head only
    assert read[0] < 200
    read[0] = 0
    monkeypatch.setattr(encode_worker, "encode", recording_encode)
    dm.prepare()
    longest = max(len(s) + len(t) for s, t in rows)
    assert len(calls) > 40  # about 2 x corpus characters / CHUNK_CHARS: one call per side of each chunk
    assert max(chars for _, chars, _ in calls) <= 2000 + longest
    pairs_encoded = np.cumsum([n for n, _, _ in calls]) // 2  # both sides of a chunk hold the same pairs
    ahead = [read_so_far - done for (_, _, read_so_far), done in zip(calls, pairs_encoded, strict=True)]
    assert max(ahead) <= 6 * 2000 // 20 + 50  # a few chunks of pairs of >= 20 characters, never the corpus
    assert sum(len(s) for s in load_prepared(dm.prepare(), PairShards)[1].values()) == len(rows)


def test_worker_processes_write_the_same_shards_with_separate_tokenizers(tmp_path, monkeypatch):
    """A big source is encoded by spawned workers, each holding both tokenizers: the same bytes as in process."""
    monkeypatch.setattr(shards, "POOL_MIN_BYTES", 0)
    monkeypatch.setattr(shards, "CHUNK_CHARS", 5000)
    dm = make(tmp_path, write_pairs(tmp_path / "corpus", pair_rows(800), "jsonl"), shared_vocab=False)
    tokenizers, keys = dm.tokenizers, dm._tokenizer_keys
    assert tokenizers[0].to_str() != tokenizers[1].to_str()
    files = {}
    for workers in (1, 2):
        root = prepare_pairs(dm.pair_stream, tokenizers, keys, tmp_path / f"w{workers}", workers=workers)
        files[workers] = {p.relative_to(root): p.read_bytes() for p in sorted(root.glob("*/shard-*"))}
    assert len(files[1]) == 3 * 3 + 2 * 2 and files[1] == files[2]  # src, tgt, pairs; + text for held-out splits


def test_a_killed_preparation_resumes_after_its_last_finished_shard(tmp_path, monkeypatch):
    rows = pair_rows(1500)
    path = write_pairs(tmp_path / "corpus", rows, "tsv")
    monkeypatch.setattr(shards, "CHUNK_CHARS", 3000)
    reference = make(tmp_path / "a", path)
    stream = reference.pair_stream
    tokenizers, keys = reference.tokenizers, reference._tokenizer_keys
    fresh = prepare_pairs(stream, tokenizers, keys, tmp_path / "a" / "cache", shard_tokens=20_000)

    cache = tmp_path / "b"
    real_close, closed = shards.ShardWriter.close, []

    def dying_close(self):
        real_close(self)
        closed.append(self.directory.name)
        if closed.count("train") == 2:
            raise KeyboardInterrupt  # killed after the second finished training shard

    monkeypatch.setattr(shards.ShardWriter, "close", dying_close)
    with pytest.raises(KeyboardInterrupt):
        prepare_pairs(stream, tokenizers, keys, cache, shard_tokens=20_000)
    monkeypatch.setattr(shards.ShardWriter, "close", real_close)
    real_encode, encoded = encode_worker.encode, []

    def counting_encode(texts, *args, **kwargs):
        encoded.append(len(texts))
        return real_encode(texts, *args, **kwargs)

    monkeypatch.setattr(encode_worker, "encode", counting_encode)
    resumed = prepare_pairs(stream, tokenizers, keys, cache, shard_tokens=20_000)
    finished = json.loads((cache / "pairs" / resumed.name / "train" / "index.json").read_text())["shards"][:2]
    assert sum(encoded) // 2 <= len(rows) - sum(s["pairs"] for s in finished)  # the finished shards are not redone
    assert resumed.name == fresh.name
    first, second = load_prepared(fresh, PairShards), load_prepared(resumed, PairShards)
    for split in ("train", "validation", "test"):
        a, b = first[1][split], second[1][split]
        assert len(a.names) == len(b.names) and (len(a.names) > 2 or split != "train")
        assert [x.tolist() for x in a.read(range(len(a)))[0]] == [x.tolist() for x in b.read(range(len(b)))[0]]
        assert [x.tolist() for x in a.read(range(len(a)))[1]] == [x.tolist() for x in b.read(range(len(b)))[1]]


def test_a_second_preparation_reads_the_cache(tmp_path, monkeypatch):
    path = write_pairs(tmp_path / "corpus", pair_rows(300), "jsonl")
    root = make(tmp_path, path).prepare()
    monkeypatch.setattr(encode_worker, "encode", lambda *a, **k: pytest.fail("encoded again"))
    assert make(tmp_path, path).prepare() == root
    path.write_text(path.read_text().replace("red", "blue", 1))  # a changed input never reuses the entry
    with pytest.raises(pytest.fail.Exception, match="encoded again"):
        make(tmp_path, path).prepare()


def test_max_pairs_cuts_the_training_split_and_stops_reading_a_source_with_its_own_held_out_splits(
    tmp_path, monkeypatch
):
    folder = tmp_path / "d"
    for split, rows in (("train", pair_rows(2000)), ("valid", pair_rows(40, 1)), ("test", pair_rows(40, 2))):
        write_pairs(folder / split, rows, "tsv")
    monkeypatch.setattr(shards, "CHUNK_CHARS", 2000)
    real_records, read = sources.records, {}

    def counting_records(path, *args, **kwargs):
        for record in real_records(path, *args, **kwargs):
            read[Path(path).stem] = read.get(Path(path).stem, 0) + 1
            yield record

    monkeypatch.setattr(translation, "records", counting_records)  # the pair stream reads through it
    dm = make(tmp_path, folder, max_pairs=100)
    _, splits = load_prepared(dm.prepare(), PairShards)
    assert {s: len(shards) for s, shards in splits.items()} == {"train": 100, "validation": 40, "test": 40}
    assert read["train"] <= 2 * 100 + 10  # the tokenizer's sample, then the pass: the head of the file only
    assert split_pairs(dm, "train") == [(ids(dm.tokenizer, s), ids(dm.tokenizer, t)) for s, t in pair_rows(100)]


# ---------------------------------------------------------------------------------------------------- batches


def folder_of_splits(tmp_path: Path, n: int = 300) -> Path:
    folder = tmp_path / "d"
    for split, rows in (("train", pair_rows(n)), ("valid", pair_rows(40, 1)), ("test", pair_rows(40, 2))):
        write_pairs(folder / split, rows, "tsv")
    return folder


@pytest.mark.parametrize("max_tokens", [64, 256, 1000])
def test_batches_stay_within_the_token_budget_and_cover_every_kept_pair(tmp_path, max_tokens):
    dm = make(tmp_path, folder_of_splits(tmp_path), max_tokens=max_tokens, max_length=40)
    dm.setup()
    seen = []
    for batch in dm.train_dataloader():
        assert batch["src"].numel() <= max_tokens and batch["tgt_in"].numel() <= max_tokens
        seen += [row[row >= 0].tolist() for row in batch["labels"]]
    data = dm._datasets["train"]
    assert len(seen) == len(data) == len({tuple(s) for s in seen})


def test_the_former_in_memory_storage_is_accepted_with_a_warning_and_streams_into_shards(tmp_path):
    with pytest.warns(FutureWarning, match=r"data\.storage is deprecated and dropped in 0\.2\.0"):
        dm = make(tmp_path, folder_of_splits(tmp_path), storage="memory", max_length=80)
    assert (dm.prepare() / "manifest.json").is_file()


@pytest.mark.parametrize(("before", "after"), [(1, 2), (2, 1)])
def test_training_batches_resume_elastically_on_another_process_count(tmp_path, monkeypatch, before, after):
    """A loader state saved by N ranks resumes on M: the global sequence of batches goes on, none repeated or
    skipped, across the epoch boundary too (the order is a function of seed and epoch only)."""
    dm = make(tmp_path, folder_of_splits(tmp_path), max_tokens=128)
    dm.setup()

    def key(batch) -> tuple:
        return tuple(map(tuple, batch["src"].tolist()))

    def run(world: int, steps: int, state: dict | None) -> tuple[list, dict]:
        ranks = []
        for rank in range(world):
            monkeypatch.setattr(loaders, "_rank_and_world", lambda rank=rank: (rank, world))
            loader = dm.loader("train", shuffle=True)
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
                seen.append(key(batch))
        return seen, ranks[0][1].state_dict()

    monkeypatch.setattr(loaders, "_rank_and_world", lambda: (0, 1))
    single = dm.loader("train", shuffle=True)
    per_epoch = len(single)
    reference = [key(b) for b in itertools.chain(single, single, single)]
    steps = per_epoch // 2 + 3
    first, state = run(before, steps, None)
    second, _ = run(after, steps, state)
    total = steps * (before + after)
    assert total > per_epoch and first + second == reference[:total]


# ---------------------------------------------------------------------------------------------------- the CLI


ENV = HARNESS_ENV  # tests/ on the path for the recorders of the runs below (_samples)


def _process(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`command` (`python -m lit_transformer ...`) as a process forked from a warm interpreter (tests/_forked.py)."""
    return warm_python(ENV).run(command, cwd=cwd, timeout=600, text=True)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    result = _process([sys.executable, "-m", "lit_transformer", *args], cwd=cwd)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.mark.slow
def test_prepare_then_fit_on_a_local_file_of_pairs(tmp_path):
    """The user's path, once: the formats are read by the same reader, tested above without a model."""
    path = write_pairs(tmp_path / "pairs", pair_rows(600), "jsonl")
    data = ["--data.init_args.dataset", str(path), "--data.init_args.cache_dir", str(tmp_path / "cache")]
    preset = ["--config", str(ROOT / "configs" / "presets" / "tiny-translate.yaml")]
    prepared = _cli("prepare", *preset, *data, cwd=tmp_path)
    folder = Path(prepared.stdout.strip().rsplit(": ", 1)[1])
    assert folder.parent.name == "pairs" and (folder / "manifest.json").is_file()
    run = [
        "--trainer.max_steps", "3", "--trainer.val_check_interval", "3", "--trainer.limit_val_batches", "2",
        "--trainer.logger", "false", "--checkpoint.dirpath", str(tmp_path / "ckpt"),
        "--data.init_args.bleu_samples", "2",
    ]  # fmt: skip
    fitted = _cli("fit", *preset, *data, *run, cwd=tmp_path)
    assert (tmp_path / "ckpt" / "last.ckpt").is_file(), fitted.stderr[-2000:]
    assert "held-out: hash" in fitted.stdout + fitted.stderr
    assert [p.name for p in (tmp_path / "cache" / "pairs").iterdir() if p.is_dir()] == [folder.name]  # reused


def _fit_recorded(root: Path, corpus: Path, devices: int, max_steps: int, *extra: str) -> None:
    config = {
        "trainer": {
            "max_steps": max_steps, "limit_val_batches": 0, "num_sanity_val_steps": 0, "enable_progress_bar": False,
            "devices": devices, "logger": False,
            "callbacks": [{"class_path": "_samples.BatchRecorder", "init_args": {"path": str(root / "batches")}}],
        },
        "data": {"init_args": {"dataset": str(corpus), "cache_dir": str(root.parent / "cache")}},
        "checkpoint": {"dirpath": str(root / "ckpt"), "every_n_train_steps": 1, "monitor": None, "save_top_k": 0},
    }  # fmt: skip
    if devices > 1:
        config["trainer"].update(strategy="ddp", accelerator="cpu")
    root.mkdir(parents=True, exist_ok=True)
    (root / "run.yaml").write_text(yaml.safe_dump(config))
    preset = str(ROOT / "configs" / "presets" / "tiny-translate.yaml")
    command = [sys.executable, "-m", "lit_transformer", "fit", "--config", preset, "--config", str(root / "run.yaml")]
    result = _process([*command, *extra], cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.slow
def test_a_translation_run_of_one_process_resumes_on_two_with_the_same_global_batches(tmp_path):
    """DDP on CPU (gloo): 4 steps on 1 process, resumed on 2 processes to step 7, trains the first 10 batches of the
    training stream in order (each step of 2 processes takes the next 2), none repeated or skipped."""
    sys.path.insert(0, str(ROOT / "tests"))
    import _samples

    corpus = write_pairs(tmp_path / "pairs", pair_rows(600), "jsonl")
    _fit_recorded(tmp_path / "run", corpus, 1, 4)
    _fit_recorded(tmp_path / "run", corpus, 2, 7, "--ckpt_path", "last")
    # The reference: the first 10 batches of the same data's training stream on one process (epoch after epoch).
    preset = yaml.safe_load((ROOT / "configs" / "presets" / "tiny-translate.yaml").read_text())["data"]["init_args"]
    dm = TranslationDataModule(**{**preset, "dataset": str(corpus), "cache_dir": str(tmp_path / "cache")})
    loader = dm.train_dataloader()
    assert len(loader) < 10  # the run crosses an epoch boundary
    batches = itertools.islice(itertools.chain(loader, loader), 10)
    digest = [
        hashlib.sha1(b["src"].numpy().tobytes() + b["tgt_in"].numpy().tobytes()).hexdigest()[:16] for b in batches
    ]
    rows = sorted(_samples.read_samples(tmp_path / "run" / "batches"), key=lambda r: (r["step"], r["rank"]))
    assert [(r["step"], r["rank"]) for r in rows] == [(s, 0) for s in range(1, 5)] + [
        (s, r) for s in range(5, 8) for r in (0, 1)
    ]
    assert [r["batch"] for r in rows] == digest
