"""Serving under load: requests per second and the median and 99th-percentile latency of `serve`'s POST /predict at
1, 8 and 32 concurrent clients, each server setting (unbatched: --max_batch_size 1; batched: 8) a server of its own
started by this command on a free port of 127.0.0.1, then stopped with SIGTERM.

    python -m lit_transformer bench serve --checkpoint runs/shakespeare/checkpoints/last.ckpt --json docs/serving.json

Every request is the same greedy continuation (--prompt, --max_new_tokens), so concurrent requests may share a batch.
Each client is a thread of this process that sends its requests one after another over one keep-alive connection;
a level's requests per second is its requests over its wall time, and its latencies are those the clients saw (queue
and batch waits included). The clients share the machine with the server: on a machine of few cores their own CPU
time is part of what is measured. Each run records the machine, the server's settings and the command; a rerun with
the same --json adds one more run to the file.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lit_transformer.records import child_env

KEYS = ("requests_per_s", "p50_ms", "p99_ms")
HOST = "127.0.0.1"


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile q (0-100) of `values`: a latency some request actually had."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


class Server:
    """`serve` as a process of its own (a session of its own, so a failed run still stops every process of it)."""

    def __init__(self, checkpoint: str, max_batch_size: int, batch_timeout: float, log: Path, start_s: float) -> None:
        self.port = free_port()
        command = [
            sys.executable,
            "-m",
            "lit_transformer",
            "serve",
            "--checkpoint",
            checkpoint,
            "--port",
            str(self.port),
        ]
        command += ["--max_batch_size", str(max_batch_size), "--batch_timeout", str(batch_timeout)]
        command += ["--log_level", "warning", "--timeout", "3600"]
        self.log = log
        with log.open("w") as output:
            self.process = subprocess.Popen(
                command, env=child_env(), stdout=output, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + start_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"serve ended with {self.process.returncode}:\n{log.read_text()[-2000:]}")
            try:
                connection = http.client.HTTPConnection(HOST, self.port, timeout=5)
                connection.request("GET", "/health")
                if connection.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"serve was not ready in {start_s:.0f} s:\n{log.read_text()[-2000:]}")

    def stop(self) -> None:
        try:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        finally:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def client(port: int, body: bytes, count: int, timeout: float) -> list[tuple[float, int, int]]:
    """`count` requests one after another on one connection: (seconds, HTTP status, tokens generated) each."""
    connection = http.client.HTTPConnection(HOST, port, timeout=timeout)
    out = []
    try:
        for _ in range(count):
            start = time.perf_counter()
            connection.request("POST", "/predict", body=body, headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            answer = response.read()
            seconds = time.perf_counter() - start
            tokens = len(json.loads(answer).get("tokens", [])) if response.status == 200 else 0
            out.append((seconds, response.status, tokens))
    finally:
        connection.close()
    return out


def load_level(port: int, body: bytes, clients: int, per_client: int, timeout: float) -> dict:
    """`clients` clients at once, `per_client` requests each: throughput and the latencies they saw."""
    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = [r for rs in pool.map(lambda _: client(port, body, per_client, timeout), range(clients)) for r in rs]
    wall = time.perf_counter() - start
    latencies = [seconds * 1000 for seconds, status, _ in results if status == 200]
    errors = sum(1 for _, status, _ in results if status != 200)
    row = {"clients": clients, "requests": len(results), "errors": errors, "wall_s": round(wall, 3)}
    if latencies:
        row |= {
            "requests_per_s": round(len(latencies) / wall, 3),
            "tokens_per_s": round(sum(tokens for _, _, tokens in results) / wall, 1),
            "p50_ms": round(percentile(latencies, 50), 2),
            "p99_ms": round(percentile(latencies, 99), 2),
            "mean_ms": round(sum(latencies) / len(latencies), 2),
        }
    return row


def main(argv: Sequence[str]) -> None:
    from jsonargparse.typing import NonNegativeInt, PositiveInt

    from lit_transformer.bench.checks import runs_file
    from lit_transformer.cli.arguments import command_parser, parse
    from lit_transformer.records import command_line, machine, write_run

    parser = command_parser("bench serve", __doc__)
    parser.add_argument(
        "--checkpoint", type=str, default="runs/shakespeare/checkpoints/last.ckpt", help="the model served"
    )
    parser.add_argument(
        "--clients", type=PositiveInt, nargs="+", default=[1, 8, 32], help="concurrent clients of each level"
    )
    parser.add_argument(
        "--requests_per_client", type=PositiveInt, default=8, help="requests each client sends in a level"
    )
    parser.add_argument(
        "--batch_sizes",
        type=PositiveInt,
        nargs="+",
        default=[1, 8],
        help="serve --max_batch_size of each server (1: unbatched)",
    )
    parser.add_argument("--batch_timeout", type=float, default=0.01, help="serve --batch_timeout of batched servers")
    parser.add_argument("--prompt", type=str, default="ROMEO:", help="every request's text")
    parser.add_argument(
        "--max_new_tokens", type=PositiveInt, default=32, help="every request's tokens to generate (greedy)"
    )
    parser.add_argument(
        "--warmup", type=NonNegativeInt, default=4, help="requests sent before the levels, not measured"
    )
    parser.add_argument("--start_timeout", type=float, default=600.0, help="seconds a server may take to be ready")
    parser.add_argument("--json", type=Path | None, default=None, help="add this run to the runs of this file")
    args = parse(parser, argv)
    runs_file(args.json)
    if not Path(args.checkpoint).is_file():
        from lit_transformer.errors import UserError

        raise UserError(
            f"--checkpoint {args.checkpoint} does not exist (the README's first command writes the main job's)"
        )
    body = json.dumps({"text": args.prompt, "max_new_tokens": args.max_new_tokens, "temperature": 0}).encode()
    facts = machine(omp_num_threads=os.environ.get("OMP_NUM_THREADS"))
    rows = []
    scratch = tempfile.TemporaryDirectory(prefix="bench-serve-")  # the servers' logs (their tails end a failed start)
    log = Path(scratch.name) / "serve.log"
    for size in args.batch_sizes:
        contender = "unbatched" if size == 1 else f"batched (max_batch_size {size})"
        server = Server(args.checkpoint, size, args.batch_timeout, log, args.start_timeout)
        try:
            if args.warmup:
                client(server.port, body, args.warmup, timeout=3600)
            for clients in args.clients:
                row = load_level(server.port, body, clients, args.requests_per_client, timeout=3600)
                rows.append({"section": f"{clients} clients", "contender": contender, "max_batch_size": size, **row})
                print(json.dumps(rows[-1]), flush=True)
        finally:
            server.stop()
    scratch.cleanup()
    figures = {
        "settings": {
            "checkpoint": args.checkpoint,
            "prompt": args.prompt,
            "max_new_tokens": args.max_new_tokens,
            "batch_timeout": args.batch_timeout,
            "requests_per_client": args.requests_per_client,
            "workers": 1,
        },
        "rows": rows,
    }
    if args.json:
        write_run(args.json, figures, command=command_line("bench serve", argv), machine=facts, summary=KEYS)
        print(f"Wrote {args.json}")
