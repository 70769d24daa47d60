"""What `serve` uses of LitServe beyond its public API, in one place (checked with LitServe 0.2.19; pyproject.toml
keeps it below 0.3): a batched loop that waits for requests instead of polling for them, and the event that stops a
server from a signal handler.
"""

from __future__ import annotations

import threading
import time
from queue import Empty
from typing import Any

from litserve.loops.base import _StopLoopError
from litserve.loops.simple_loops import BatchedLoop
from litserve.utils import LitAPIStatus, LoopResponseType

SENTINEL = (None, None, None, None)
"""What LitServe puts on a request queue to stop a worker's loop."""


class WaitingBatchLoop(BatchedLoop):
    """LitServe's batched loop, waiting for a batch's first request in one blocking read of the request queue, then
    gathering what arrives within batch_timeout (and what is already queued) up to max_batch_size.

    LitServe's own loop collects a batch by reading its request queue with a 1 ms timeout, over and over, whether
    requests come or not: each read is a round trip to LitServe's manager process, so an idle batched server keeps
    two processes busy, and on a machine of few cores that CPU is taken from the decoding it batches."""

    def get_batch_requests(self, lit_api: Any, request_queue: Any, transport: Any) -> tuple[list, list]:
        try:
            items = [request_queue.get(timeout=1.0)]
        except Empty:
            return [], []
        deadline = time.monotonic() + lit_api.batch_timeout
        while len(items) < lit_api.max_batch_size and items[-1] != SENTINEL:
            remaining = deadline - time.monotonic()
            try:
                items.append(request_queue.get(timeout=remaining) if remaining > 0 else request_queue.get_nowait())
            except Empty:
                break
        timeout = lit_api.request_timeout
        payloads, timed_out = [], []
        for item in items:
            if item == SENTINEL:
                raise _StopLoopError()
            response_queue_id, uid, timestamp, request = item
            self.put_response(transport, response_queue_id, uid, (), LitAPIStatus.START, LoopResponseType.REGULAR)
            if timeout not in (-1, False, None) and time.monotonic() - timestamp > timeout:
                timed_out.append((response_queue_id, uid))
            else:
                payloads.append((response_queue_id, uid, request))
        return payloads, timed_out


def request_shutdown(server: Any) -> bool:
    """Set a running LitServer's shutdown event, as its /shutdown route does; False before run() made it. From a
    thread of its own: the main thread may be waiting on that event's connection to LitServe's manager process."""
    event = getattr(server, "_shutdown_event", None)
    if event is None:
        return False
    threading.Thread(target=event.set, name="serve-shutdown", daemon=True).start()
    return True
