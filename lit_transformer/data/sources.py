"""Where records come from: one reader for every task and every form, yielding records per split.

- Local files: .txt (a document each, read in line-bounded chunks of about a megabyte), .jsonl/.json, .csv/.tsv and
  .parquet (row by row; parquet in record batches): a file, a folder or a glob, a folder's train*/valid*/test* files
  becoming the splits. A folder `datasets` saved (save_to_disk), memory-mapped. A hub name, streamed (`datasets`'
  streaming=True); offline it fails within seconds and says how to use local files instead. An embedded corpus
  (corpora.EMBEDDED), given as its DatasetDict.
- A column may be dotted to reach into a nested field (`translation.en`).
- A stream says what a record is: RowStream (rows of named columns) here; a task with records of its own (pieces of
  documents, pairs, ...) subclasses SplitStream (or RowStream) in its own file.
- Held-out splits, for a source without them, are carved from train by one function, `held_out_split`: by a hash of
  the record's content, so its duplicates land in the same split and its position in the source does not matter; each
  missing held-out split takes `held_out` of the hash buckets. A handful of long documents (fewer than
  HASH_MIN_DOCUMENTS) is carved by lines instead (`line_range`): each gives train its first lines.
- Files as users keep them: any of these forms compressed (.gz, .bz2, .xz; .zst with `zstandard` installed),
  decompressed where a file is opened (`open_data`, the one place); a UTF-8 byte order mark (as Excel writes CSV) is
  dropped; another text encoding is read when named (`encoding`).
- Errors say what is wrong and the fix: a malformed line names its file and line, a missing column the columns there
  are; bytes that are not text in the file's encoding stop the run with the file and line (never replaced).
  `DataFileError` (a ValueError) is what a data file that cannot be read as its name says raises.
"""

from __future__ import annotations

import bz2
import codecs
import csv
import glob
import gzip
import hashlib
import io
import json
import lzma
import os
import re
import socket
import threading
import warnings
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from lit_transformer.errors import BadFileError, ConfigError, FileError, MissingFileError

from .cache import fingerprint, hash_texts

TEXT_SUFFIXES = (".txt", ".text", ".md")
BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".tsv": "csv", ".parquet": "parquet"}
SPLIT_ALIASES = {
    "train": "train",
    "valid": "validation",
    "validation": "validation",
    "val": "validation",
    "dev": "validation",
    "test": "test",
}


COMPRESSIONS = {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz", ".zst": "zstandard"}
ENCODING = "utf-8"  # the default text encoding of data files


class DataFileError(BadFileError):
    """A data file that cannot be read as its name says: bytes that are not text in its encoding, a row that does not
    parse, a compressed file that is not, a file of another format, a file without the columns a task reads, a split
    with nothing in it. The message names the file and, where there is one, the line or row, and the fix."""


class NotInEncodingError(DataFileError):
    """Bytes that are not the encoding a file is read in. `where` (file:line) and `bad` (the bytes) let a caller
    whose fix is another (a command that reads UTF-8 alone and has no encoding setting) say its own."""

    def __init__(self, where: str, bad: bytes, encoding: str) -> None:
        self.where, self.bad, self.encoding = where, bad, encoding
        super().__init__(
            f"{where} is not {encoding} text (bytes {bad!r}); if the file is in another encoding, name it, e.g. "
            "--data.init_args.encoding latin-1 (or cp1252); no byte is replaced silently"
        )


def compression_of(path: str | os.PathLike) -> str | None:
    """The compression a file's name says (its last suffix: .gz, .bz2, .xz, .zst), else None."""
    return COMPRESSIONS.get(Path(path).suffix.lower())


def form_suffix(path: str | os.PathLike) -> str:
    """The suffix that says a file's form, a compression suffix looked through: train.jsonl.gz -> .jsonl."""
    path = Path(path)
    if compression_of(path):
        path = path.with_suffix("")
    return path.suffix.lower()


def _open_zstandard(path: str, mode: str = "rb") -> IO[bytes]:
    try:
        import zstandard
    except ImportError:
        raise DataFileError(f"{path} is compressed with zstandard: pip install zstandard to read it") from None
    return io.BufferedReader(zstandard.open(path, mode))  # its own reader reads blocks, not lines


_OPENERS = {"gzip": gzip.open, "bzip2": bz2.open, "xz": lzma.open, "zstandard": _open_zstandard}


@contextmanager
def open_data(path: str | os.PathLike) -> Iterator[IO[bytes]]:
    """The one place a data file is opened: its bytes, decompressed by its name's suffix. A file that is not what its
    suffix says (not gzip data, cut short) raises DataFileError naming it."""
    kind = compression_of(path)
    if kind is None:
        with open(path, "rb") as handle:
            yield handle
        return
    try:
        with _OPENERS[kind](str(path), "rb") as handle:
            yield handle
    except (EOFError, lzma.LZMAError) as error:
        raise DataFileError(f"{path} is not {kind} data or is cut short ({error}); compress it again") from None
    except OSError as error:
        if isinstance(error, (FileNotFoundError, PermissionError, IsADirectoryError)):
            raise
        raise DataFileError(f"{path} is not {kind} data or is cut short ({error}); compress it again") from None
    except Exception as error:  # zstandard.ZstdError and the like, without importing it
        if type(error).__module__.split(".")[0] != "zstandard":
            raise
        raise DataFileError(f"{path} is not {kind} data or is cut short ({error}); compress it again") from None


def data_size(path: str | os.PathLike) -> int:
    """The bytes a file holds once decompressed (a compressed file is read through once to count them)."""
    if compression_of(path) is None:
        return os.path.getsize(path)
    size = 0
    with open_data(path) as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            size += len(block)
    return size


def size_estimate(path: str | os.PathLike) -> int:
    """About the bytes a file holds once decompressed, without reading it (progress, the choice of a worker pool):
    a gzip file's trailer says it (modulo 4 GiB), another compressed file is taken as four times its size."""
    size = os.path.getsize(path)
    if compression_of(path) == "gzip" and size >= 18:
        with open(path, "rb") as handle:
            handle.seek(-4, os.SEEK_END)
            return max(int.from_bytes(handle.read(4), "little"), size)
    return size if compression_of(path) is None else 4 * size


def check_encoding(encoding: str) -> str:
    """`encoding`, checked to be a text encoding whose newline is the byte 0x0A (files are cut at line ends)."""
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise ConfigError(
            f"encoding={encoding!r} is not a text encoding Python knows (e.g. utf-8, latin-1, cp1252)",
            keys=["data.init_args.encoding"],
        ) from None
    if "\n\r,a".encode(encoding, errors="replace") != b"\n\r,a":
        raise ConfigError(
            f"encoding={encoding!r} is not read line by line (its newline is not one byte 0x0A); convert the files "
            f"to UTF-8 first, e.g. iconv -f {encoding} -t utf-8 in.txt > out.txt",
            keys=["data.init_args.encoding"],
        )
    return encoding


PACKED_MAGIC = ((b"\x1f\x8b", "gzip data"), (b"BZh", "bzip2 data"), (b"\xfd7zXZ\x00", "xz data"),
                (b"\x28\xb5\x2f\xfd", "zstandard data"), (b"PK\x03\x04", "a zip archive"))  # fmt: skip
OTHER_MAGIC = ((b"\x89PNG", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"), (b"GIF8", "a GIF image"),
               (b"%PDF", "a PDF document"), (b"\x7fELF", "a program"), (b"PAR1", "a parquet file"))  # fmt: skip
PACKED_FIX = {
    "gzip data": "name it with its compression's suffix (.gz)",
    "bzip2 data": "name it with its compression's suffix (.bz2)",
    "xz data": "name it with its compression's suffix (.xz)",
    "zstandard data": "name it with its compression's suffix (.zst)",
    "a zip archive": "unzip it (a spreadsheet: save it as CSV)",
}


def decode(
    data: bytes, path: str, line: int | Callable[[int], int], encoding: str = ENCODING, first: bool = False
) -> str:
    """`data` of `path` as text. A UTF-8 byte order mark at the file's start (`first`) is dropped; bytes that are not
    `encoding` stop with DataFileError naming the file and the line (`line`, or a function of the offset of the bad
    byte in `data` that says it), never replaced."""
    if first and encoding.replace("_", "-").lower() in ("utf-8", "utf8") and data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    wide = _wide_encoding(data) if first else None
    if wide:
        name, how = wide
        converted = Path(path).with_name(f"{Path(path).stem}.utf8{''.join(Path(path).suffixes[-1:])}")
        raise DataFileError(
            f"{path} is {name} text ({how}), not {encoding}, and is not read line by line: convert it to UTF-8 first, "
            f"e.g. iconv -f {name} -t UTF-8 {path} > {converted}"
            + (" (Windows Notepad's 'Unicode' and PowerShell 5's > write UTF-16)" if name.startswith("UTF-16") else "")
        )
    controls = len(data) - len(data.translate(None, CONTROL_BYTES))
    if b"\x00" in data or (len(data) >= 8 and controls > len(data) // 4):  # no text reads so, in any encoding
        at = data.index(b"\x00") if b"\x00" in data else 0
        number = line(at) if callable(line) else line
        packed = next((what for magic, what in PACKED_MAGIC if first and data.startswith(magic)), None)
        if packed:
            raise DataFileError(f"{path} is {packed}, not the text its name says; {PACKED_FIX[packed]}")
        raise DataFileError(f"{path}:{number} holds binary data (control bytes), not text: {_binary_fix(path)}")
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as error:
        number = line(error.start) if callable(line) else line
        packed = next((what for magic, what in PACKED_MAGIC if first and data.startswith(magic)), None)
        if packed:
            raise DataFileError(f"{path} is {packed}, not the text its name says; {PACKED_FIX[packed]}") from None
        other = next((what for magic, what in OTHER_MAGIC if first and data.startswith(magic)), None)
        if other:
            raise DataFileError(f"{path} is {other}, not the text its name says: {_binary_fix(path)}") from None
        bad = data[error.start : error.start + 4]
        if error.reason == "unexpected end of data" and not data.endswith(b"\n"):  # only a file's last line lacks one
            raise DataFileError(
                f"{path}:{number} ends inside a character (bytes {bad!r}): the file is cut short (a copy or a "
                "download that stopped)"
            ) from None
        if _mostly_binary(data):
            raise DataFileError(
                f"{path}:{number} holds binary data (bytes {bad!r}), not text: {_binary_fix(path)}"
            ) from None
        raise NotInEncodingError(f"{path}:{number}", bad, encoding) from None


# Byte order marks of the encodings whose newline is not the byte 0x0A; UTF-32's first (its LE mark begins as UTF-16's).
WIDE_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"), (codecs.BOM_UTF16_LE, "UTF-16"),
             (codecs.BOM_UTF16_BE, "UTF-16"))  # fmt: skip


def _wide_encoding(data: bytes) -> tuple[str, str] | None:
    """(encoding, how it was told) of a file's first line in UTF-16 or UTF-32: by its byte order mark, or for UTF-16
    without one, by a zero byte in every other place, as Latin text has; None for any other."""
    mark = next((name for bom, name in WIDE_BOMS if data.startswith(bom)), None)
    if mark:
        return mark, "it starts with that byte order mark"
    sample = data[:4096]
    half = len(sample) // 2
    if half < 4:
        return None
    even, odd = sample[0::2].count(0), sample[1::2].count(0)
    if odd > 0.6 * half and even < 0.1 * half:
        return "UTF-16LE", "a zero byte after each character"
    if even > 0.6 * half and odd < 0.1 * half:
        return "UTF-16BE", "a zero byte before each character"
    return None


# The control bytes text never holds (tab, newlines, vertical tab, form feed and carriage return aside): NUL is one.
CONTROL_BYTES = bytes(range(0, 9)) + bytes(range(14, 32))


def _mostly_binary(data: bytes) -> bool:
    """Bytes no text encoding yields: more than a quarter of control bytes or bytes that are not valid UTF-8."""
    sample = data[:4096]
    control = len(sample) - len(sample.translate(None, CONTROL_BYTES))
    invalid = len(sample) - len(sample.decode("utf-8", errors="ignore").encode("utf-8"))
    return (control + invalid) > len(sample) / 4


def _binary_fix(path: str) -> str:
    form = form_suffix(path)
    kind = {".csv": "CSV", ".tsv": "TSV", ".jsonl": "JSON lines", ".json": "JSON"}.get(form, "plain")
    return f"a {form or 'text'} file holds {kind} text; give the data file itself (another encoding will not help)"


def is_local_name(name: str) -> bool:
    """Whether `name` can only be a local path, never a hub name (`owner/model`): relative, absolute, home-relative,
    or more than one slash deep."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1


class OfflineError(FileError, ConnectionError):
    """The hub cannot be reached and the requested name is not a local path."""


def _hub_reachable(timeout: float = 3.0) -> bool:
    """A quick TCP probe of the hub in a thread, so a hanging resolver cannot stall us past `timeout`."""
    result: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection(("huggingface.co", 443), timeout=timeout):
                result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(result and result[0])


def _offline_flag() -> bool:
    return any(
        os.environ.get(v, "").lower() in ("1", "true", "yes", "on") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def ensure_online(what: str, hint: str) -> None:
    """Fail at once, with a useful message, when `what` needs the hub and the machine is offline."""
    if _offline_flag() or not _hub_reachable():
        raise OfflineError(
            f"Cannot load {what} from the Hugging Face hub: this machine is offline "
            f"(HF_HUB_OFFLINE/HF_DATASETS_OFFLINE set, or huggingface.co unreachable). {hint}"
        )


def hub_offline() -> bool:
    """Whether the hub is out of reach: HF_HUB_OFFLINE/HF_DATASETS_OFFLINE set, or huggingface.co unreachable."""
    return _offline_flag() or not _hub_reachable()


def offline_and_uncached(what: str, hint: str) -> OfflineError:
    """The error for a hub name that is needed offline and is not in the local Hugging Face cache either."""
    try:
        from huggingface_hub.constants import HF_HUB_CACHE as where
    except ImportError:  # pragma: no cover - huggingface_hub is a dependency
        where = "~/.cache/huggingface/hub"
    return OfflineError(
        f"Cannot load {what}: this machine is offline (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE set, or huggingface.co "
        f"unreachable) and it is not in the local Hugging Face cache ({where}). {hint}"
    )


LOCAL_HINT = (
    "Point the DataModule at local files instead, e.g. --data.dataset path/to/corpus.txt, a folder, a glob "
    "('data/*.jsonl'), or .csv/.tsv/.parquet files (a folder's train*/valid*/test* files become the splits); "
    "or use an embedded corpus (shakespeare, kjv-rv1909)."
)


def is_local(spec: str) -> bool:
    return os.path.exists(spec) or any(ch in spec for ch in "*?[")


def local_files(spec: str) -> list[str]:
    if os.path.isdir(spec):  # hidden files and folders left out (.git, .ipynb_checkpoints' stale copies, .cache)
        files = sorted(
            str(p)
            for p in Path(spec).rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(spec).parts)
        )
    elif os.path.isfile(spec):
        files = [spec]
    else:
        files = sorted(f for f in glob.glob(spec, recursive=True) if os.path.isfile(f))
    files = [f for f in files if form_suffix(f) in TEXT_SUFFIXES + tuple(BUILDERS)]
    if not files:
        raise MissingFileError(
            f"No data files found for {spec!r} (looked for {', '.join(TEXT_SUFFIXES + tuple(BUILDERS))}, each also "
            f"compressed: {', '.join(COMPRESSIONS)})"
        )
    return files


def local_root(spec: str) -> str:
    """The folder a local spec's files sit under: the folder itself, a file's folder, or a glob's part before its
    first wildcard."""
    if os.path.isdir(spec):
        return spec
    if os.path.isfile(spec):
        return os.path.dirname(spec)
    head = re.split(r"[*?\[]", spec, maxsplit=1)[0]
    return head if head.endswith(("/", os.sep)) else os.path.dirname(head)


_SPLIT_SUFFIXES = ("sets", "set", "data", "ing")


def _named_split(path: str, root: str | None = None) -> str | None:
    """The split a file's name picks (it starts with the word train, valid, val, dev or test: followed by no letter),
    else the split a folder between
    `root` and the file is named (train/, validation/, test/ ...: a split a folder, as Hugging Face lays data out),
    else None."""
    stem = Path(path).stem.lower()
    for prefix, split in SPLIT_ALIASES.items():
        # the word itself, then anything but a letter: train-00001, valid_2, test (not valley_of_fear, testament);
        # or the word run into set/data/ing: testset, devset, testing (the old prefix rule's, not to be trained on)
        rest = stem[len(prefix) :]
        rest = next((rest[len(s) :] for s in _SPLIT_SUFFIXES if rest.startswith(s)), rest)
        if stem.startswith(prefix) and not rest[:1].isalpha():
            return split
    if root is not None:
        for folder in Path(os.path.relpath(path, root)).parts[:-1]:
            if folder.lower() in SPLIT_ALIASES:
                return SPLIT_ALIASES[folder.lower()]
    return None


def _names_its_split(path: str, root: str | None = None) -> bool:
    return _named_split(path, root) is not None


def split_of(path: str, root: str | None = None) -> str:
    return _named_split(path, root) or "train"


def read_inputs(path: str | Path, field: str = "text", encoding: str = ENCODING) -> list[str]:
    """The inputs of a predict run: a .jsonl/.json file's `field` per line, a .csv/.tsv file's `field` column, or else
    every line of a text file (each may be compressed)."""
    path = Path(path)
    if path.is_dir():
        raise BadFileError(
            f"predict_file {str(path)!r} is a folder: give a file with one input per line (text, or JSON lines or "
            f'CSV with a "{field}" field)',
            keys=["data.init_args.predict_file"],
        )
    if not path.is_file():
        raise MissingFileError(
            f"predict_file {str(path)!r} does not exist; give a text file with one input per line",
            keys=["data.init_args.predict_file"],
        )
    if form_suffix(path) in (".csv", ".tsv"):  # read as rows: a header names the columns, a quoted field may hold ","
        columns = columns_of(str(path), encoding) or []
        if field not in columns:
            raise DataFileError(
                f'{path} has no column "{field}"; its columns are {columns}: name the column "{field}" in the header'
            )
        return [row.get(field) or "" for row, _, _ in records(str(path), [field], encoding)]
    with open_data(path) as handle:
        lines = [decode(line, str(path), n, encoding, n == 1).rstrip("\r\n") for n, line in enumerate(handle, 1)]
    if form_suffix(path) not in (".jsonl", ".json"):
        return lines
    texts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataFileError(f"{path}:{number} is not valid JSON ({error.msg}); write one object per line") from None
        if not isinstance(row, dict) or not isinstance(row.get(field), str):
            raise DataFileError(f'{path}:{number} has no string field "{field}"; write lines like {{"{field}": "..."}}')
        texts.append(row[field])
    return texts


def predict_inputs(path: str | Path, encoding: str = ENCODING) -> list[str]:
    """`predict`'s inputs (read_inputs), refused in one line naming predict_file when there is none: an empty line of a
    text file is an input (an unconditioned sample), an empty file a mistake (a run that would write nothing)."""
    texts = read_inputs(path, encoding=encoding)
    if not texts:
        raise DataFileError(f"predict_file {str(path)!r} holds no input; write one input a line")
    return texts


# ---------------------------------------------------------------------------------------------------- splits

SPLITS = ("train", "validation", "test")
HELD_OUT = 0.05  # the fraction of the training source each missing held-out split takes


def missing_splits(present: Collection[str]) -> list[str]:
    """The held-out splits a source lacks, in order: they are carved from its training split."""
    return [split for split in SPLITS[1:] if split not in present]


def digest_bucket(hexdigest: str) -> int:
    """A hash bucket, 0 to 99, from a hexadecimal digest."""
    return int(hexdigest, 16) % 100


def hash_bucket(*texts: str) -> int:
    """The hash bucket of a record's texts (a pair's two sides joined by a tab)."""
    return digest_bucket(hashlib.md5("\t".join(texts).encode("utf-8", "surrogatepass")).hexdigest())


def carve(bucket: int, missing: Sequence[str], held_out: float = HELD_OUT) -> str:
    """The split of a training record in `bucket`: each missing held-out split takes `held_out` of the buckets."""
    index = int(bucket // (held_out * 100))
    return missing[index] if index < len(missing) else "train"


def held_out_split(*texts: str, missing: Sequence[str], held_out: float = HELD_OUT) -> str:
    """The one carving: the split of a training record by a hash of its content (its texts, a pair's sides joined
    by a tab; a verse's key; an image's name), when `missing` held-out splits are carved from train.

    Each embedded corpus that is split by hash goes through here too; KJV-RV1909 keeps the layout its caches were
    built with (test first, 2% each: `missing=("test", "validation"), held_out=0.02`)."""
    return carve(hash_bucket(*texts), missing, held_out)


def line_range(split: str, missing: Sequence[str], held_out: float = HELD_OUT) -> tuple[float, float]:
    """The fraction of each document `split` takes when carving by lines: train first, then the held-out splits."""
    n = len(missing)
    train_end = 1 - held_out * n
    if split == "train":
        return 0.0, train_end
    i = missing.index(split)
    return train_end + held_out * i, train_end + held_out * (i + 1) if i + 1 < n else 1.0


# ---------------------------------------------------------------------------------------------------- streams of records

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
    """Where one split's records come from: local files, or a table of rows (`datasets`' own: an embedded corpus, a
    folder `datasets` saved, a hub stream), read in order."""

    files: list[str] = field(default_factory=list)
    table: Any = None
    origin: tuple = ()  # how a table is known in the content key: ("rows",) embedded, ("hub", name), ("saved", files)

    @property
    def in_memory(self) -> bool:
        """An embedded corpus's rows: a few MB, tokenized in this process."""
        return self.origin[:1] == ("rows",)


def column_value(row: dict, column: str) -> Any:
    """A row's value of `column`, a dotted name reaching into nested fields (translation.en); KeyError if absent."""
    value: Any = row
    for part in column.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(column)
        value = value[part]
    return value


def table_rows(table, batch_size: int = 1024) -> Iterator[dict]:
    """The rows of a `datasets` table (Dataset or IterableDataset) as dicts, read `batch_size` at a time."""
    for batch in table.iter(batch_size=batch_size):
        names = list(batch)
        for values in zip(*batch.values(), strict=True):
            yield dict(zip(names, values, strict=True))


def is_saved_dataset(spec: str) -> bool:
    """A folder that `datasets` wrote (save_to_disk): a DatasetDict's dataset_dict.json or a Dataset's state.json."""
    folder = Path(spec)
    return folder.is_dir() and ((folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file())


class SplitStream:
    """A dataset's splits as streams of records, with held-out splits carved from train when missing.

    dataset: a local file, folder or glob (a folder's train*/valid*/test* files become the splits); a folder that
    `datasets` saved; a hub name; or an embedded corpus's DatasetDict (given as `embedded`). A subclass says what a
    record is: `routed` yields each record of one pass over a source split with the split it belongs to
    (RowStream: rows; a task's own stream in the task's file).
    """

    key: str  # the content key's tag
    local_hint: str  # what local data may be, for the error naming a missing path
    hub_hint = LOCAL_HINT  # how to do without the hub, for the error of a hub name offline

    def __init__(
        self,
        dataset: str,
        dataset_config: str | None = None,
        embedded=None,
        held_out: float = HELD_OUT,
        encoding: str = ENCODING,
    ) -> None:
        self.dataset, self.dataset_config, self.held_out = dataset, dataset_config, held_out
        self.encoding = check_encoding(encoding)
        self.sources: dict[str, Source] = {}
        self.file_hashes: dict[str, str] = {}  # each file's hash as content_key got it: carving reuses, not rereads
        if embedded is not None:
            self._add_tables(embedded, lambda name: ("rows",))
        elif is_saved_dataset(dataset):
            self._add_tables(load_saved(dataset), lambda name: ("saved", name))
        elif not is_local(dataset) and _looks_like_a_path(dataset):
            raise MissingFileError(
                f"{dataset!r} does not exist: give an existing local file, folder or glob {self.local_hint}",
                keys=["data.init_args.dataset"],
            )
        elif is_local(dataset):
            files = local_files(dataset)
            self._check_files(files)
            root = local_root(dataset)
            for f in files:
                self.sources.setdefault(split_of(f, root) if len(files) > 1 else "train", Source()).files.append(f)
            named = [f for f in files if _names_its_split(f, root)]
            unnamed = [Path(f).name for f in files if not _names_its_split(f, root)]
            if named and unnamed:  # eval.txt, a README: training text beside files that name their splits
                warnings.warn(
                    f"{dataset}: {', '.join(unnamed[:5])}{' ...' if len(unnamed) > 5 else ''} "
                    f"{'is' if len(unnamed) == 1 else 'are'} read as training text: a file's name picks its split "
                    f"when it starts with the word {', '.join(SPLIT_ALIASES)} (or a folder of that name holds it); rename or "
                    "move the others",
                    stacklevel=2,
                )
            if "train" not in self.sources:
                raise DataFileError(
                    f"{dataset!r} has no training file (names starting with train/valid/test, or folders of those "
                    "names, pick the split)"
                )
            for f in files:
                self._check_columns(f, split_of(f, root) if len(files) > 1 else "train")
        else:
            for canonical, (name, split) in hub_streams(dataset, dataset_config, self.hub_hint).items():
                self.sources[canonical] = Source(table=split, origin=("hub", name))
        self.missing = missing_splits(self.sources)
        self.mode = self._carving_mode() if self.missing else "given"

    def _add_tables(self, tables, origin) -> None:
        """A DatasetDict's splits (names normalised to train/validation/test), each checked for the columns."""
        for name, table in tables.items():
            canonical = SPLIT_ALIASES.get(name.lower())
            if canonical is None or canonical in self.sources:
                continue
            columns = table.column_names or []
            missing = [c for c in self._columns() if c.split(".")[0] not in columns]
            if missing:
                raise DataFileError(
                    f"dataset {self.dataset!r}: split {name!r} has no column {', '.join(map(repr, missing))}; its "
                    f"columns are {columns}{self.column_hint}"
                )
            self.sources[canonical] = Source(table=table, origin=origin(name))
        if "train" not in self.sources:
            raise DataFileError(f"dataset {self.dataset!r} has no training split (its splits: {sorted(tables)})")

    column_hint = ""  # how to choose the columns, after an error naming the missing ones

    # ------------------------------------------------------------------ what a subclass says

    def _columns(self) -> list[str]:
        """The columns a row's texts come from."""
        raise NotImplementedError

    def _settings(self) -> tuple:
        """What else than the sources the records depend on (columns, languages), in the content key."""
        raise NotImplementedError

    text_files = False  # whether plain .txt files can hold these records (documents), or only row files

    def _check_files(self, files: list[str]) -> None:
        """Refuse local files this kind of record cannot come from."""
        other = sorted({form_suffix(f) for f in files} - set(BUILDERS))
        if other and not self.text_files:
            # named, with the way around them: a cloned Hugging Face dataset folder holds a README.md beside its rows
            strays = [Path(f).name for f in files if form_suffix(f) in other]
            rows = sorted({form_suffix(f) for f in files} & set(BUILDERS))
            glob = ""
            if rows and os.path.isdir(self.dataset):
                glob = f"; or give a glob of the row files, e.g. '{Path(self.dataset) / ('**/*' + rows[0])}'"
            raise DataFileError(
                f"{self.dataset!r}: this task reads rows from .jsonl/.json, .csv/.tsv or .parquet files, not {other} "
                f"({', '.join(strays[:5])}{' ...' if len(strays) > 5 else ''}): move those out of the folder{glob}"
            )
        packed = [f for f in files if form_suffix(f) == ".parquet" and compression_of(f)]
        if packed:
            raise DataFileError(
                f"{packed[0]}: a parquet file compresses its columns itself and is read by random access; give it "
                "uncompressed (.parquet)"
            )

    def _check_columns(self, path: str, split: str) -> None:
        """A row file without the record's columns fails at once, naming the columns it has (and an empty one, the
        split it would have fed)."""
        columns = columns_of(path, self.encoding) if form_suffix(path) in BUILDERS else None
        if columns == []:
            raise DataFileError(
                f"{path} is empty: no header, no rows, so the {split} split has no example; it needs the columns "
                f"{', '.join(map(repr, self._columns()))} and a row for each example"
            )
        missing = [c for c in self._columns() if columns is not None and c.split(".")[0] not in columns]
        if missing:
            raise DataFileError(
                f"dataset {self.dataset!r}: {path} has no column {', '.join(map(repr, missing))}; its columns are "
                f"{columns}{_header_hint(path, columns) or self.column_hint}"
            )

    def _carving_mode(self) -> str:
        return "hash"

    def routed(self, source_name: str, skip: int = 0) -> Iterator[tuple[str | None, object]]:
        """(split, record) for every record of one pass over a source split, from source record `skip` on; split is
        None for a record that is dropped. The training source also feeds the carved held-out splits."""
        raise NotImplementedError

    def owner(self, source_name: str, *content: str) -> str:
        """The split a record of `source_name` goes to: its own, or, for the training source of a stream with
        missing held-out splits, the one carving's choice by a hash of `content`."""
        if source_name != "train" or not self.missing:
            return source_name
        return held_out_split(*content, missing=self.missing, held_out=self.held_out)

    def values(self, row: dict, where: str) -> list[Any]:
        """The row's value of each of the stream's columns (dotted names reach into nested fields); a missing one
        fails naming the columns the row has."""
        values = []
        for column in self._columns():
            try:
                values.append(column_value(row, column))
            except KeyError:
                raise DataFileError(
                    f"dataset {self.dataset!r}: {where} has no column {column!r}; its columns are {sorted(row)}"
                    f"{self.column_hint}"
                ) from None
        return values

    # ------------------------------------------------------------------ identity

    def content_key(self, file_hash) -> str:
        """A fingerprint of everything the stream yields: file contents, rows, or the hub name and config."""
        # held_out enters the key only when it is not the default every earlier cache was carved with.
        carving = () if self.held_out == HELD_OUT else (self.held_out,)
        carving += () if self.encoding == ENCODING else (("encoding", self.encoding),)  # likewise

        def remembered(path: str) -> str:
            self.file_hashes[path] = file_hash(path)
            return self.file_hashes[path]

        return fingerprint(self.key, 1, self._source_parts(remembered), *self._settings(), self.mode, *carving)

    def _source_parts(self, file_hash) -> list[tuple]:
        """Each source's identity: its files' hashes, a digest of its in-memory rows (a text or a tuple of texts each),
        or the hub name and config."""
        parts = []
        for name in sorted(self.sources):
            source = self.sources[name]
            if source.in_memory:  # the texts of the record's columns, row by row (as every earlier cache was keyed)
                columns = self._columns()
                texts = ((row[column] or "") for row in table_rows(source.table) for column in columns)
                parts.append((name, "rows", hash_texts(texts)))
            elif source.origin[:1] == ("hub",):
                parts.append((name, "hub", self.dataset, self.dataset_config, source.origin[1]))
            elif source.origin[:1] == ("saved",):
                files = sorted(p for p in Path(self.dataset).rglob("*") if p.is_file())
                parts.append((name, "saved", source.origin[1], [(p.name, file_hash(str(p))) for p in files]))
            else:
                parts.append((name, "files", [(Path(f).suffix.lower(), file_hash(f)) for f in source.files]))
        return parts

    # ------------------------------------------------------------------ passes

    def input_bytes(self, source: str) -> int | None:
        """Bytes a pass over a source split reads (None when unknown: rows in memory or a hub stream)."""
        files = self.sources[source].files
        return sum(size_estimate(f) for f in files) if files else None

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


# ---------------------------------------------------------------------------------------------------- readers


def load_saved(folder: str):
    """A folder `datasets` saved (save_to_disk), as a DatasetDict (a saved Dataset is the training split), memory-
    mapped: rows are read in order, never all at once."""
    import datasets

    try:
        loaded = datasets.load_from_disk(folder)
    except (FileNotFoundError, ValueError, OSError) as error:
        raise DataFileError(f"{folder} looks like a folder `datasets` saved but cannot be read: {error}") from None
    return datasets.DatasetDict({"train": loaded}) if isinstance(loaded, datasets.Dataset) else loaded


def hub_streams(dataset: str, config: str | None, hint: str = LOCAL_HINT) -> dict[str, tuple[str, object]]:
    """A hub dataset's splits as streams (`datasets` with streaming=True): {canonical split: (hub name, stream)}.
    Offline, it fails at once and says how to do without the hub (`hint`)."""
    import datasets

    what = f"dataset {dataset!r}" + (f" (config {config!r})" if config else "")
    ensure_online(what, hint)
    try:
        loaded = datasets.load_dataset(dataset, config, streaming=True)
    except ConnectionError as error:
        raise OfflineError(f"Cannot load {what} from the hub: {error}. {hint}") from error
    if isinstance(loaded, datasets.IterableDataset):
        loaded = {"train": loaded}
    out: dict[str, tuple[str, object]] = {}
    for name, split in loaded.items():
        canonical = SPLIT_ALIASES.get(name.lower())
        if canonical and canonical not in out:
            out[canonical] = (name, split)
    if "train" not in out:
        raise DataFileError(f"dataset {dataset!r} has no training split (found splits: {sorted(loaded)})")
    return out


def _looks_like_a_path(spec: str) -> bool:
    """A spec that names a local file (a leading / . ~ or a data file suffix), never a hub name like owner/name."""
    suffixes = (".txt", ".text", ".md", *BUILDERS)
    # A hub name is `name` or `owner/name`: one ending in a slash (`my_texts/`) or deeper is a folder path.
    folder = spec.endswith(("/", os.sep)) or (spec.count("/") > 1 and "://" not in spec)
    return spec.startswith(("/", "./", "../", "~")) or folder or form_suffix(spec) in suffixes


def line_cut(text: str, fraction: float) -> int:
    at = text.find("\n", int(len(text) * fraction))
    return len(text) if at < 0 else at + 1


def _skip(handle: IO[bytes], offset: int) -> None:
    """Move a fresh handle to byte `offset` (a decompressing reader that cannot seek reads past them)."""
    try:
        handle.seek(offset)
    except (OSError, ValueError):
        while offset > 0:
            block = handle.read(min(offset, 1 << 20))
            if not block:
                return
            offset -= len(block)


def byte_line_cut(path: str, offset: int, size: int) -> int:
    """The first line start at or after byte `offset` of a file of `size` (decompressed) bytes."""
    with open_data(path) as handle:
        _skip(handle, offset)
        while True:
            chunk = handle.read(1 << 16)
            if not chunk:
                return size
            at = chunk.find(b"\n")
            if at >= 0:
                return offset + at + 1
            offset += len(chunk)


def _line_at(path: str, offset: int) -> int:
    """The line number (from 1) of byte `offset` of a file: for an error only, so read again."""
    lines = 1
    with open_data(path) as handle:
        while offset > 0:
            block = handle.read(min(offset, 1 << 20))
            if not block:
                break
            lines += block.count(b"\n")
            offset -= len(block)
    return lines


def file_chunks(
    path: str, document: int, start: int = 0, end: int | None = None, encoding: str = ENCODING
) -> Iterator[Piece]:
    """A text file (decompressed bytes start..end) in chunks of about CHUNK_BYTES that end at line boundaries.

    A newline byte never occurs inside a UTF-8 sequence (nor in any encoding `check_encoding` lets through), so each
    chunk decodes on its own."""
    with open_data(path) as handle:
        _skip(handle, start)
        position, carry = start, b""
        while end is None or position < end:
            data = handle.read(CHUNK_BYTES if end is None else min(CHUNK_BYTES, end - position))
            if not data:
                break
            offset = position - len(carry)  # where `data` starts in the file
            position += len(data)
            data = carry + data
            cut = data.rfind(b"\n") + 1 if end is None or position < end else len(data)
            if cut == 0:  # a line longer than a chunk: keep reading
                carry = data
                continue
            carry = data[cut:]
            text = decode(data[:cut], path, lambda at, o=offset: _line_at(path, o + at), encoding, offset == 0)
            yield Piece(text, document, False, cut)
        if carry:
            offset = position - len(carry)
            yield Piece(
                decode(carry, path, lambda at: _line_at(path, offset + at), encoding, offset == 0),
                document,
                False,
                len(carry),
            )
    yield Piece("", document, True, 0)


def _delimiter(path: str) -> str:
    return "\t" if form_suffix(path) == ".tsv" else ","


def _parquet(path: str):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as error:
        raise DataFileError(f"{path} is not a parquet file ({error}); give the file its form's suffix") from None


def _header_hint(path: str, columns: list[str] | None) -> str:
    """Why a CSV/TSV header names no usable column, where its look tells: another delimiter (one column holding
    `;` or `,`), or no header at all (a first row of sentences), where choosing a column would read the wrong text."""
    if form_suffix(path) not in (".csv", ".tsv") or not columns:
        return ""
    other = next((d for d in (";", "\t", ",", "|") if len(columns) == 1 and d in columns[0]), None)
    if other is not None:
        shown = "tab" if other == "\t" else repr(other)
        return (
            f" (its header is one column holding {shown}: the file separates its columns with {shown}, not "
            f"{'a tab' if form_suffix(path) == '.tsv' else 'commas'}; write it as CSV (commas) or TSV (tabs))"
        )
    if all(" " in column.strip() for column in columns):
        return (
            " (these read as text, not column names: the first line is taken as the header, so give the file a "
            "first line naming its columns)"
        )
    return ""


def columns_of(path: str, encoding: str = ENCODING) -> list[str] | None:
    """The columns a row file names in its head (a CSV/TSV header, the first JSON line's keys, a parquet schema);
    None when only reading it tells (a JSON array)."""
    suffix = form_suffix(path)
    if suffix == ".parquet":
        return _parquet(path).schema_arrow.names
    with open_data(path) as handle:
        first = decode(handle.readline(1 << 24), path, 1, encoding, first=True)
        # JSON lines name their keys row by row: the first rows' together (a first row without "text" among rows
        # with it was refused as a file with no such column)
        more = [handle.readline(1 << 20) for _ in range(JSONL_HEAD - 1)] if suffix in (".jsonl", ".json") else []
    if suffix in (".csv", ".tsv"):
        try:
            return next(csv.reader([first], delimiter=_delimiter(path)), [])
        except csv.Error as error:
            raise DataFileError(f"{path}:1 is not a {suffix[1:].upper()} header ({error})") from None
    if not first:
        return []  # an empty file
    stripped = first.strip()
    if not stripped or stripped.startswith("["):
        return None  # a JSON array: checked when read
    try:
        row = json.loads(stripped)
    except json.JSONDecodeError as error:
        raise DataFileError(f"{path}:1 is not valid JSON ({error.msg}); write one object per line") from None
    if not isinstance(row, dict):
        return None
    keys = dict.fromkeys(row)
    for line in more:
        try:
            other = json.loads(line.decode(encoding, errors="replace"))
        except (json.JSONDecodeError, ValueError):
            continue  # a malformed line is named where it is read
        if isinstance(other, dict):
            keys.update(dict.fromkeys(other))
    return list(keys)


JSONL_HEAD = 64
"""The JSON lines whose keys columns_of reads together."""

CSV_FIELD_CHARS = 1 << 26
"""The longest CSV/TSV field read (64M characters; Python's csv module stops at 131,072 by default, which refused a
legal file holding one long document): a bound still, so that a quote never closed cannot read a whole corpus into
one field."""


def records(path: str, columns: list[str] | None = None, encoding: str = ENCODING) -> Iterator[tuple[dict, int, int]]:
    """(row, input bytes, line number) per row of a JSON-lines, JSON, CSV/TSV or parquet file (the first three maybe
    compressed), streamed: one row at a time, parquet in record batches of `columns` only (all when None). A line that
    does not parse, or bytes that are not `encoding`, fail with DataFileError naming the file and the line."""
    suffix = form_suffix(path)
    if suffix == ".parquet":
        parquet = _parquet(path)
        per_row = os.path.getsize(path) / max(1, parquet.metadata.num_rows)
        number = 0
        if columns is not None:  # those the file has (an optional column, a split, may be absent)
            columns = [c for c in columns if c in parquet.schema_arrow.names]
        for batch in parquet.iter_batches(columns=columns, batch_size=1024):
            for row in batch.to_pylist():
                number += 1
                yield row, int(per_row), number
        return
    if suffix in (".csv", ".tsv"):
        if csv.field_size_limit() < CSV_FIELD_CHARS:  # the csv module's default, 131,072, refused a long document
            csv.field_size_limit(CSV_FIELD_CHARS)
        with open_data(path) as raw:
            lines = (decode(line, path, n, encoding, n == 1) for n, line in enumerate(raw, 1))
            # strict: a quoted field still open at the end of the file (a copy cut short) is an error, not a row
            reader = csv.reader(lines, delimiter=_delimiter(path), strict=True)
            try:
                header = next(reader, None) or []
                for fields in reader:
                    if not fields:
                        continue
                    if len(fields) != len(header):
                        raise DataFileError(
                            f"{path}:{reader.line_num} has {len(fields)} fields where the header has {len(header)} "
                            f"({header}); quote fields that hold the delimiter"
                        )
                    row = dict(zip(header, fields, strict=True))
                    yield row, sum(map(len, fields)) + len(fields), reader.line_num
            except csv.Error as error:
                if "unexpected end of data" in str(error):
                    raise DataFileError(
                        f"{path}:{reader.line_num} ends inside a quoted field: the file is cut short (a copy or a "
                        "download that stopped), or a quote is never closed"
                    ) from None
                kind = suffix[1:].upper()
                if "field larger than field limit" in str(error):
                    raise DataFileError(
                        f"{path}:{reader.line_num} has a field of more than {csv.field_size_limit():,} characters: a "
                        "quote opened and never closed, or a text that long; close the quote, or write such texts "
                        "as JSON lines (.jsonl), which have no such limit"
                    ) from None
                if "expected after '\"'" in str(error):  # a quote that is text: "the king" he said<TAB>...
                    raise DataFileError(
                        f"{path}:{reader.line_num} is not a {kind} row ({error}): a field that starts with a double "
                        f"quote is read as quoted up to the next quote (perhaps opened on an earlier line), and this "
                        f"one goes on after it. If the file's quotes are text, quote such a field and double its "
                        f'quotes ("""the king"" he said"), or write the file as JSON lines'
                    ) from None
                raise DataFileError(
                    f"{path}:{reader.line_num} is not a {kind} row ({error}); is the file {kind} text?"
                ) from None
        return
    with open_data(path) as handle:
        head = handle.read(4096).lstrip(codecs.BOM_UTF8).lstrip()
    if head.startswith(b"["):  # a JSON array cannot be streamed line by line: read whole (write JSON lines instead)
        warnings.warn(f"{path} is one JSON array, read whole; JSON lines stream in bounded memory", stacklevel=2)
        with open_data(path) as handle:
            data = handle.read()
        try:
            rows = json.loads(decode(data, path, lambda at: data.count(b"\n", 0, at) + 1, encoding, first=True))
        except json.JSONDecodeError as error:
            raise DataFileError(f"{path}:{error.lineno} is not valid JSON ({error.msg})") from None
        for number, row in enumerate(rows, 1):
            yield (row if isinstance(row, dict) else {}), 0, number
        return
    with open_data(path) as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(decode(line, path, number, encoding, number == 1))
            except json.JSONDecodeError as error:
                raise DataFileError(
                    f"{path}:{number} is not valid JSON ({error.msg}); write one object per line"
                ) from None
            yield (row if isinstance(row, dict) else {}), len(line), number


# ---------------------------------------------------------------------------------------------------- rows of columns


@dataclass
class Row:
    """The values of the requested columns of one row, and where it came from (a relative path in it resolves
    against `folder`, the folder of its file)."""

    values: dict[str, Any]
    where: str
    folder: str | None
    row: int
    nbytes: int
    last = True
    texts = ()

    @property
    def document(self) -> int:
        return self.row


class RowStream(SplitStream):
    """Each split's rows of named columns (dotted names reach into nested fields), read through the one reader;
    held-out splits carved from train by a hash of `key_column` (all rows of one key stay together)."""

    key = "rows"
    local_hint = "(.csv/.tsv, .jsonl/.json, .parquet), a folder `datasets` saved, or a hub dataset name"
    rows_per_batch = 1024  # a table's rows read at a time

    def __init__(
        self,
        dataset: str,
        columns: list[str],
        key_column: str,
        dataset_config: str | None = None,
        embedded=None,
        held_out: float = HELD_OUT,
        column_hint: str = "",
        encoding: str = ENCODING,
    ) -> None:
        self.columns, self.key_column, self.column_hint = list(columns), key_column, column_hint
        super().__init__(dataset, dataset_config, embedded, held_out, encoding)

    def _columns(self) -> list[str]:
        return self.columns

    def _settings(self) -> tuple:
        return tuple(self.columns), self.key_column

    def routed(self, source_name: str, skip: int = 0) -> Iterator[tuple[str, Row]]:
        for number, row in enumerate(self._rows(self.sources[source_name])):
            if number >= skip:
                yield self.owner(source_name, str(row.values.get(self.key_column, ""))), row

    def all_rows(self) -> Iterator[tuple[str, Row]]:
        """(split, row) for every row of every source split, in order."""
        for source, _ in self.passes():
            yield from self.routed(source)

    def _rows(self, source: Source) -> Iterator[Row]:
        top = list(dict.fromkeys(c.split(".")[0] for c in self.columns))
        if source.table is not None:
            for number, row in enumerate(table_rows(source.table, self.rows_per_batch), 1):
                where = f"{self.dataset} ({source.origin[-1]}) row {number}"
                yield Row(dict(zip(self.columns, self.values(row, where), strict=True)), where, None, number - 1, 0)
            return
        for path in source.files:
            for number, (row, nbytes, line) in enumerate(records(path, top + ["split"], self.encoding)):
                where = f"{path}:{line}"
                values = dict(zip(self.columns, self.values(row, where), strict=True))
                if row.get("split") not in (None, ""):
                    values["split"] = row["split"]
                yield Row(values, where, str(Path(path).parent), number, nbytes)
