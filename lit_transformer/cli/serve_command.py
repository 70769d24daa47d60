"""`python -m lit_transformer serve --checkpoint PATH`: a checkpoint behind HTTP on LitServe (lit_transformer/serving).

Its options are parsed here before torch is imported, so `serve --help` and a mistyped flag answer at once; LitServe
is an optional dependency, and its absence is said in one line with the install command.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from typing import Literal

from lit_transformer.cli.arguments import command_parser, parse
from lit_transformer.cli.model_commands import CHECKPOINT_HELP, add_base_argument, add_quantize_argument
from lit_transformer.errors import UserError

INSTALL = "pip install -e '.[serve]' (or pip install litserve)"

DESCRIPTION = (
    "Serve a checkpoint over HTTP with LitServe: POST /predict for every task takes one input of predict's file "
    '(JSON: {"text": ...} and decoding options such as "max_new_tokens", "temperature", "num_beams"; a captioning '
    'model: {"image": base64 bytes} or {"features": [[...]]}) and answers the row predict writes for it; a language '
    "model also answers POST /v1/chat/completions as OpenAI's API does (streaming too); GET /health is 200 once "
    "every worker is ready. A malformed request gets a 4xx with a one-line reason; SIGTERM or Ctrl+C stops the server."
)


def serve_main(argv: Sequence[str]) -> None:
    """`serve`: parse, check that LitServe is installed, then start the server (serving/server.py)."""
    parser = command_parser("serve", DESCRIPTION)
    parser.add_argument("--checkpoint", type=str, required=True, help=CHECKPOINT_HELP)
    parser.add_argument(
        "--host",
        type=Literal["127.0.0.1", "0.0.0.0", "::"],
        default="127.0.0.1",
        help="The address to bind: 127.0.0.1 (this machine only), or 0.0.0.0 / :: (every interface: mind who can "
        "reach it).",
    )
    parser.add_argument("--port", type=int, default=8000, help="The port (1024 to 65535).")
    parser.add_argument("--device", type=Literal["auto", "cpu", "cuda"], default="auto", help="cpu, cuda, or auto.")
    add_base_argument(parser)
    add_quantize_argument(parser)
    parser.add_argument(
        "--compile",
        type=bool,
        default=False,
        help="Decode through torch.compile (GenerationConfig.compile); the workers compile before serving, so their "
        "start takes tens of seconds more.",
    )
    parser.add_argument(
        "--max_batch_size",
        type=int,
        default=1,
        help="/predict: run up to this many concurrent requests as one batch (requests whose decoding options "
        "agree decode together); 1 runs each alone.",
    )
    parser.add_argument(
        "--batch_timeout",
        type=float,
        default=0.01,
        help="/predict with max_batch_size above 1: how long (seconds) a batch waits for more requests.",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="Worker processes per device and route, each with its own copy of the model (on a CPU each takes "
        "cores / workers threads unless OMP_NUM_THREADS is set).",
    )
    parser.add_argument(
        "--timeout", type=float, default=120.0, help="Seconds a request may wait for a worker before it gets 504."
    )
    parser.add_argument(
        "--max_new_tokens_limit",
        type=int,
        default=1024,
        help="The most tokens a request may ask to generate (max_new_tokens); above it, 422 (as for num_beams above "
        "16, and a chat request's n).",
    )
    parser.add_argument(
        "--log_level",
        type=Literal["critical", "error", "warning", "info", "debug"],
        default="info",
        help="LitServe's and uvicorn's logging (info: a line per request).",
    )
    args = parse(parser, argv)
    for name, least in (("max_batch_size", 1), ("workers", 1), ("max_new_tokens_limit", 1)):
        if args[name] < least:
            raise UserError(f"--{name} {args[name]}: must be at least {least}")
    if args.batch_timeout < 0 or args.timeout <= 0:
        raise UserError("--batch_timeout must be >= 0 and --timeout > 0 (seconds)")
    if args.quantize == "int8" and args.max_batch_size > 1:
        print(
            "note: --quantize int8 with --max_batch_size above 1: int8 layers quantize their inputs over the whole "
            "batch, so a request's answer can differ from what it gets alone (in fp32 it cannot); --workers N serves "
            "requests side by side without batching them",
            file=sys.stderr,
        )
    if importlib.util.find_spec("litserve") is None:
        raise UserError(f"serve needs LitServe, an optional dependency: {INSTALL}")
    from lit_transformer.serving.handlers import ModelOptions
    from lit_transformer.serving.server import ServeOptions, run_server

    model = ModelOptions(
        checkpoint=args.checkpoint,
        base=args.base,
        quantize=args.quantize,
        compile=args.compile,
        max_new_tokens_limit=args.max_new_tokens_limit,
        workers=args.workers,
    )
    run_server(
        ServeOptions(
            model=model,
            host=args.host,
            port=args.port,
            device=args.device,
            max_batch_size=args.max_batch_size,
            batch_timeout=args.batch_timeout,
            timeout=args.timeout,
            log_level=args.log_level,
        )
    )
