"""The tokenizing worker of `prepare`: a spawned process that imports only numpy and tokenizers.

Each worker encodes whole chunks on one thread. Two such processes keep two cores busy with less overhead than one
process running the tokenizer's thread pool (whose idle threads spin, which on a shared machine burns CPU), and the
parent meanwhile reads, parses and routes the next chunks.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time

import numpy as np

_tokenizers: list = []


def init(*tokenizer_jsons: str) -> None:
    """Load the tokenizers (one, or a translation's source and target) once per worker."""
    # Ctrl-C reaches the whole process group: the parent stops the run and says why; a worker's traceback says nothing.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with_parent(os.getppid())
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker: the workers are the parallelism
    from tokenizers import Tokenizer

    _tokenizers[:] = [Tokenizer.from_str(text) for text in tokenizer_jsons]


def _exit_with_parent(parent: int, every: float = 0.5) -> None:
    """Stop this worker once its parent is gone. A parent killed by SIGKILL or SIGTERM (`kill PID`, `timeout`, the
    OOM killer) runs no cleanup, and a pool's idle worker waits on its task queue forever: each killed `prepare` or
    `fit` left its workers behind, hundreds of MB each, for good. A dead parent's children are re-parented, so the
    parent id changes."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def encode(
    texts: list[str],
    ends: list[bool],
    continues: bool,
    eos_id: int | None,
    dtype: str,
    tokenizer=None,
    side: int = 0,
) -> tuple[np.ndarray, list[int]]:
    """A chunk's ids as one array (EOS after each text that ends a document) and the offsets where documents start.

    side: which of the worker's tokenizers encodes (0, or 1 for a translation's separate target tokenizer)."""
    tokenizer = tokenizer or _tokenizers[side]
    batch = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    encoded = batch(texts, add_special_tokens=False)
    lists, starts, at, new_document = [], [], 0, not continues
    for encoding, end in zip(encoded, ends):
        ids = encoding.ids
        if new_document and (ids or end):
            starts.append(at)
            new_document = False
        if end and eos_id is not None:
            ids.append(eos_id)
        lists.append(ids)
        at += len(ids)
        if end:
            new_document = True
    return np.fromiter(itertools.chain.from_iterable(lists), dtype=np.dtype(dtype), count=at), starts
