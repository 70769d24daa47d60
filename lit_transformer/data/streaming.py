"""A dataset's splits as streams of records (`SplitStream`), and a corpus as a stream of text pieces (`CorpusStream`).

Nothing here holds a whole corpus: local files are read file by file and row by row (a .txt file in line-bounded
chunks of about a megabyte, JSON lines one row at a time, CSV and parquet in record batches), a hub dataset through
`datasets`' `streaming=True`. Each piece carries the index of its document and whether it ends it, so the writer can
place an end-of-document token.

Held-out splits, for a source without them, are carved from train (`splits.py`): by a hash of each document when
there are enough documents for each held-out split to get a fair share (`HASH_MIN_DOCUMENTS`), else by lines within
each document (90/5/5 at line boundaries), which suits a handful of long texts.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .cache import fingerprint
from .sources import BUILDERS, LOCAL_HINT, OfflineError, ensure_online, is_local, local_files, split_of
from .splits import HELD_OUT, SPLITS, carve, digest_bucket, held_out_split, line_range, missing_splits

HASH_MIN_DOCUMENTS = 200  # from this many training documents on, held-out splits are whole documents picked by hash
CHUNK_BYTES = 1 << 20  # a .txt file is read in line-bounded chunks of about this size


@dataclass
class Piece:
    """A piece of one document's text; `last` marks the document's end (where the writer places EOS)."""

    text: str
    document: int
    last: bool
    nbytes: int  # input bytes this piece accounts for (progress in MB/s)

    @property
    def texts(self) -> tuple[str]:
        return (self.text,)


@dataclass
class Source:
    """Where one split's records come from: local files, an embedded corpus's rows, or a hub split."""

    files: list[str] = field(default_factory=list)
    rows: list | None = None  # in memory (an embedded corpus, a few MB): a text, or a tuple of texts, per row
    hub_split: str | None = None


class SplitStream:
    """A dataset's splits as streams of records, with held-out splits carved from train when missing.

    dataset: a local file, folder or glob (a folder's train*/valid*/test* files become the splits); a hub name; or an
    embedded corpus's DatasetDict (given as `embedded`). A subclass says what a record is: `routed` yields each
    record of one pass over a source split with the split it belongs to (CorpusStream: pieces of documents;
    pairs.PairStream: sentence pairs).
    """

    key: str  # the content key's tag
    local_hint: str  # what local data may be, for the error naming a missing path

    def __init__(
        self, dataset: str, dataset_config: str | None = None, embedded=None, held_out: float = HELD_OUT
    ) -> None:
        self.dataset, self.dataset_config, self.held_out = dataset, dataset_config, held_out
        self.sources: dict[str, Source] = {}
        self._hub: dict = {}
        if embedded is not None:
            for name, split in embedded.items():
                missing = [c for c in self._columns() if c not in split.column_names]
                if missing:
                    raise ValueError(
                        f"dataset {dataset!r}: split {name!r} has no column {', '.join(map(repr, missing))}; its "
                        f"columns are {split.column_names}"
                    )
                columns = [split[c] for c in self._columns()]
                self.sources[name] = Source(rows=list(columns[0] if len(columns) == 1 else zip(*columns)))
        elif not is_local(dataset) and _looks_like_a_path(dataset):
            raise FileNotFoundError(
                f"{dataset!r} does not exist: give an existing local file, folder or glob {self.local_hint}"
            )
        elif is_local(dataset):
            files = local_files(dataset)
            self._check_files(files)
            for f in files:
                self.sources.setdefault(split_of(f) if len(files) > 1 else "train", Source()).files.append(f)
            if "train" not in self.sources:
                raise ValueError(
                    f"{dataset!r} has no training file (names starting with train/valid/test pick the split)"
                )
            for f in files:
                self._check_columns(f)
        else:
            for canonical, (name, split) in hub_streams(dataset, dataset_config).items():
                self._hub[name] = split
                self.sources[canonical] = Source(hub_split=name)
        self.missing = missing_splits(self.sources)
        self.mode = self._carving_mode() if self.missing else "given"

    # ------------------------------------------------------------------ what a subclass says

    def _columns(self) -> list[str]:
        """The columns a row's texts come from."""
        raise NotImplementedError

    def _settings(self) -> tuple:
        """What else than the sources the records depend on (columns, languages), in the content key."""
        raise NotImplementedError

    def _check_files(self, files: list[str]) -> None:
        """Refuse local files this kind of record cannot come from."""

    def _check_columns(self, path: str) -> None:
        """A row file without the record's columns fails at once, naming the columns it has."""

    def _carving_mode(self) -> str:
        return "hash"

    def routed(self, source_name: str, skip: int = 0) -> Iterator[tuple[str | None, object]]:
        """(split, record) for every record of one pass over a source split, from source record `skip` on; split is
        None for a record that is dropped. The training source also feeds the carved held-out splits."""
        raise NotImplementedError

    # ------------------------------------------------------------------ identity

    def content_key(self, file_hash) -> str:
        """A fingerprint of everything the stream yields: file contents, rows, or the hub name and config."""
        # held_out enters the key only when it is not the default every earlier cache was carved with.
        carving = () if self.held_out == HELD_OUT else (self.held_out,)
        return fingerprint(self.key, 1, self._source_parts(file_hash), *self._settings(), self.mode, *carving)

    def _source_parts(self, file_hash) -> list[tuple]:
        """Each source's identity: its files' hashes, a digest of its in-memory rows (a text or a tuple of texts each),
        or the hub name and config."""
        parts = []
        for name in sorted(self.sources):
            source = self.sources[name]
            if source.rows is not None:
                digest = hashlib.sha256()
                for row in source.rows:
                    for text in row if isinstance(row, tuple) else (row,):
                        data = (text or "").encode("utf-8", "surrogatepass")
                        digest.update(len(data).to_bytes(8, "little") + data)
                parts.append((name, "rows", digest.hexdigest()[:20]))
            elif source.hub_split is not None:
                parts.append((name, "hub", self.dataset, self.dataset_config, source.hub_split))
            else:
                parts.append((name, "files", [(Path(f).suffix.lower(), file_hash(f)) for f in source.files]))
        return parts

    # ------------------------------------------------------------------ passes

    def input_bytes(self, source: str) -> int | None:
        """Bytes a pass over a source split reads (None when unknown: rows in memory or a hub stream)."""
        files = self.sources[source].files
        return sum(os.path.getsize(f) for f in files) if files else None

    def passes(self) -> list[tuple[str, list[str]]]:
        """(source split, the splits one pass over it fills): the training source also fills carved splits."""
        out = [(name, ["train", *self.missing] if name == "train" else [name]) for name in self.sources]
        return sorted(out, key=lambda item: SPLITS.index(item[0]))

    def records_of(self, split: str, skip: int = 0) -> Iterator:
        """The records of `split` in order (dropped ones left out); the first `skip` source records are read past."""
        source = split if split in self.sources else "train"
        if split not in self.sources and split not in self.missing:
            raise ValueError(f"Unknown split {split!r}")
        for owner, record in self.routed(source, skip):
            if owner == split:
                yield record


class CorpusStream(SplitStream):
    """Each split of a corpus as a stream of `Piece`s, with held-out splits carved from train when missing: by
    document hash, or by lines for a handful of long documents (see the module)."""

    key = "corpus"
    local_hint = "(.txt, .jsonl/.json, .csv/.tsv, .parquet), a hub dataset name, or an embedded corpus"

    def __init__(
        self,
        dataset: str,
        dataset_config: str | None = None,
        text_column: str = "text",
        embedded=None,
        held_out: float = HELD_OUT,
    ) -> None:
        self.text_column = text_column
        super().__init__(dataset, dataset_config, embedded, held_out)

    def _columns(self) -> list[str]:
        return [self.text_column]

    def _settings(self) -> tuple:
        return (self.text_column,)

    # ------------------------------------------------------------------ the stream of a split

    def routed(self, source_name: str, skip: int = 0) -> Iterator[tuple[str, Piece]]:
        """(split, piece) for every piece of one pass over a source split; the first `skip` source documents are
        read past (a resumed preparation continues where its last finished shard ended). The training source feeds
        the carved held-out splits too: whole documents by hash, or each document's lines (see the module)."""
        source = self.sources[source_name]
        carving = source_name == "train" and bool(self.missing)
        line_mode = carving and self.mode == "lines"
        document = 0
        for kind, payload, digest in self._documents(source):
            if document < skip:
                document += 1
                continue
            if kind == "file":  # a .txt file: one document, read in line-bounded chunks
                path = payload
                if line_mode:
                    for split in ("train", *self.missing):
                        for piece in self._file_lines(path, document, *line_range(split, self.missing, self.held_out)):
                            yield split, piece
                else:
                    owner = carve(digest_bucket(digest()), self.missing, self.held_out) if carving else source_name
                    for piece in _file_chunks(path, document):
                        yield owner, piece
            else:
                text, nbytes = payload
                if line_mode:
                    for split in ("train", *self.missing):
                        start, end = line_range(split, self.missing, self.held_out)
                        a = 0 if start == 0 else _line_cut(text, start)
                        b = len(text) if end >= 1 else _line_cut(text, end)
                        yield split, Piece(text[a:b], document, True, nbytes if split == "train" else 0)
                else:
                    owner = (
                        held_out_split(text, missing=self.missing, held_out=self.held_out) if carving else source_name
                    )
                    yield owner, Piece(text, document, True, nbytes)
            document += 1

    def _file_lines(self, path: str, document: int, start: float, end: float) -> Iterator[Piece]:
        """The lines of a .txt file between two fractions of its bytes, cut at line boundaries."""
        size = os.path.getsize(path)
        lo = 0 if start == 0 else _byte_line_cut(path, int(size * start))
        hi = size if end >= 1 else _byte_line_cut(path, int(size * end))
        yield from _file_chunks(path, document, lo, hi)

    def _documents(self, source: Source):
        """(kind, payload, digest) per document: ("file", path, lazy hash) for .txt files, ("row", (text, bytes),
        None) for rows. Blank rows are dropped."""
        if source.rows is not None:
            for text in source.rows:
                if text and text.strip():
                    yield "row", (text, len(text)), None
            return
        if source.hub_split is not None:
            for row in self._hub[source.hub_split]:
                text = row.get(self.text_column)
                if isinstance(text, str) and text.strip():
                    yield "row", (text, len(text)), None
            return
        for path in source.files:
            suffix = Path(path).suffix.lower()
            if suffix not in BUILDERS:
                yield "file", path, lambda path=path: _file_digest(path)
                continue
            for text, nbytes in _rows(path, self.text_column):
                if text and text.strip():
                    yield "row", (text, nbytes), None

    # ------------------------------------------------------------------ splits

    def _carving_mode(self) -> str:
        """hash when the training source has at least HASH_MIN_DOCUMENTS documents, else lines."""
        count = 0
        for _ in self._documents(self.sources["train"]):
            count += 1
            if count >= HASH_MIN_DOCUMENTS:
                return "hash"
        return "lines"

    def documents(self, split: str) -> Iterator[str]:
        """Each document of `split` as one string (for inspection and small corpora: a document is held whole)."""
        parts: list[str] = []
        for piece in self.records_of(split):
            parts.append(piece.text)
            if piece.last:
                text = "".join(parts)
                parts = []
                if text.strip():
                    yield text

    # ------------------------------------------------------------------ checks

    def _check_columns(self, path: str) -> None:
        if Path(path).suffix.lower() not in BUILDERS:
            return
        columns = columns_of(path)
        if columns is not None and self.text_column not in columns:
            raise ValueError(
                f"dataset {self.dataset!r}: {path} has no column {self.text_column!r}; its columns are {columns} "
                "(choose one with --data.init_args.text_column)"
            )


# ---------------------------------------------------------------------------------------------------- readers


def hub_streams(dataset: str, config: str | None) -> dict[str, tuple[str, object]]:
    """A hub dataset's splits as streams (`datasets` with streaming=True): {canonical split: (hub name, stream)}.
    Offline, it fails at once and says how to use local files instead."""
    import datasets

    from .sources import SPLIT_ALIASES

    what = f"dataset {dataset!r}" + (f" (config {config!r})" if config else "")
    ensure_online(what, LOCAL_HINT)
    try:
        loaded = datasets.load_dataset(dataset, config, streaming=True)
    except ConnectionError as error:
        raise OfflineError(f"Cannot load {what} from the hub: {error}. {LOCAL_HINT}") from error
    if isinstance(loaded, datasets.IterableDataset):
        loaded = {"train": loaded}
    out: dict[str, tuple[str, object]] = {}
    for name, split in loaded.items():
        canonical = SPLIT_ALIASES.get(name.lower())
        if canonical and canonical not in out:
            out[canonical] = (name, split)
    if "train" not in out:
        raise ValueError(f"The dataset has no training split (found splits: {sorted(loaded)})")
    return out


def _looks_like_a_path(spec: str) -> bool:
    """A spec that names a local file (a leading / . ~ or a data file suffix), never a hub name like owner/name."""
    suffixes = (".txt", ".text", ".md", *BUILDERS)
    return spec.startswith(("/", "./", "../", "~")) or Path(spec).suffix.lower() in suffixes


def _file_digest(path: str) -> str:
    from .cache import hash_file

    return hash_file(path)


def _line_cut(text: str, fraction: float) -> int:
    at = text.find("\n", int(len(text) * fraction))
    return len(text) if at < 0 else at + 1


def _byte_line_cut(path: str, offset: int) -> int:
    """The first line start at or after byte `offset` of a file."""
    with open(path, "rb") as handle:
        handle.seek(offset)
        while True:
            chunk = handle.read(1 << 16)
            if not chunk:
                return os.path.getsize(path)
            at = chunk.find(b"\n")
            if at >= 0:
                return offset + at + 1
            offset += len(chunk)


def _decode(data: bytes, path: str, bad: list[int]) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("utf-8", errors="replace")
        bad[0] += text.count("\ufffd") - data.count("\ufffd".encode())
        return text


def _warn_bad(path: str, bad: list[int]) -> None:
    if bad[0]:
        warnings.warn(f"{path}: {bad[0]} undecodable byte sequence(s) replaced with U+FFFD", stacklevel=3)


def _file_chunks(path: str, document: int, start: int = 0, end: int | None = None) -> Iterator[Piece]:
    """A text file (bytes start..end) in chunks of about CHUNK_BYTES that end at line boundaries.

    A newline byte never occurs inside a UTF-8 sequence, so each chunk decodes on its own."""
    end = os.path.getsize(path) if end is None else end
    bad = [0]
    with open(path, "rb") as handle:
        handle.seek(start)
        position, carry = start, b""
        while position < end:
            data = handle.read(min(CHUNK_BYTES, end - position))
            if not data:
                break
            position += len(data)
            data = carry + data
            cut = data.rfind(b"\n") + 1 if position < end else len(data)
            if cut == 0:  # a line longer than a chunk: keep reading
                carry = data
                continue
            carry = data[cut:]
            yield Piece(_decode(data[:cut], path, bad), document, False, cut)
        if carry:
            yield Piece(_decode(carry, path, bad), document, False, len(carry))
    yield Piece("", document, True, 0)
    _warn_bad(path, bad)


def columns_of(path: str) -> list[str] | None:
    suffix = Path(path).suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).schema_arrow.names
    with open(path, "rb") as handle:
        first = handle.readline(1 << 24).decode("utf-8", errors="replace")
    if suffix in (".csv", ".tsv"):
        return next(csv.reader([first], delimiter="\t" if suffix == ".tsv" else ","), [])
    stripped = first.strip()
    if not stripped or stripped.startswith("["):
        return None  # a JSON array: checked when read
    try:
        row = json.loads(stripped)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}:1 is not valid JSON ({error.msg}); write one object per line") from None
    return list(row) if isinstance(row, dict) else None


def _rows(path: str, column: str) -> Iterator[tuple[str, int]]:
    """(text, input bytes) per row of a JSON-lines, JSON, CSV/TSV or parquet file, streamed."""
    for row, nbytes, _ in records(path, [column]):
        text = row.get(column)
        yield (text if isinstance(text, str) else ""), nbytes


def records(path: str, columns: list[str] | None = None) -> Iterator[tuple[dict, int, int]]:
    """(row, input bytes, line number) per row of a JSON-lines, JSON, CSV/TSV or parquet file, streamed: one row at a
    time, parquet in record batches of `columns` only (all when None). A line that does not parse fails with a
    message naming the file and the line."""
    suffix = Path(path).suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        parquet = pq.ParquetFile(path)
        per_row = os.path.getsize(path) / max(1, parquet.metadata.num_rows)
        number = 0
        for batch in parquet.iter_batches(columns=columns, batch_size=1024):
            for row in batch.to_pylist():
                number += 1
                yield row, int(per_row), number
        return
    if suffix in (".csv", ".tsv"):
        bad = [0]
        with open(path, "rb") as raw:
            lines = (_decode(line, path, bad) for line in raw)
            reader = csv.reader(lines, delimiter="\t" if suffix == ".tsv" else ",")
            header = next(reader, None) or []
            for fields in reader:
                if not fields:
                    continue
                if len(fields) != len(header):
                    raise ValueError(
                        f"{path}:{reader.line_num} has {len(fields)} fields where the header has {len(header)} "
                        f"({header}); quote fields that hold the delimiter"
                    )
                row = dict(zip(header, fields, strict=True))
                yield row, sum(map(len, fields)) + len(fields), reader.line_num
        _warn_bad(path, bad)
        return
    with open(path, "rb") as handle:
        head = handle.read(4096).lstrip()
    if head.startswith(b"["):  # a JSON array cannot be streamed line by line: read whole (write JSON lines instead)
        warnings.warn(f"{path} is one JSON array, read whole; JSON lines stream in bounded memory", stacklevel=2)
        bad = [0]
        rows = json.loads(_decode(Path(path).read_bytes(), path, bad))
        for number, row in enumerate(rows, 1):
            yield (row if isinstance(row, dict) else {}), 0, number
        return
    bad = [0]
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(_decode(line, path, bad))
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"{path}:{number} is not valid JSON ({error.msg}); write one object per line"
                ) from None
            yield (row if isinstance(row, dict) else {}), len(line), number
    _warn_bad(path, bad)
