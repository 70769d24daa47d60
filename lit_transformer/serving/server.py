"""Start `serve`: every check a user's mistake can fail made before a worker starts, then the LitServer, run until
SIGTERM (or Ctrl+C) ends it.

The checkpoint is loaded once here, as a worker will load it (a LoRA checkpoint's base found and checked, int8 if
asked), so a missing file, a moved base or an option the task lacks is refused in a few lines instead of as a worker
that fails to start. LitServe then starts the workers (processes of their own, `--workers` per device and route) and
the HTTP servers (uvicorn, forked), which bind to 127.0.0.1 unless `--host` says otherwise.

SIGTERM (what `docker stop`, systemd and Kubernetes send) sets LitServe's own shutdown event, as its /shutdown route
does: the HTTP servers finish the requests in flight (at most GRACE_SECONDS), the workers stop, the process exits 0.
"""

from __future__ import annotations

import gc
import os
import signal
import socket
import sys
from dataclasses import dataclass, field
from typing import Any

from lit_transformer.errors import UserError
from lit_transformer.serving.handlers import ImageCaptioning, ModelOptions, TextClassification, TextGeneration

GRACE_SECONDS = 5
"""How long the HTTP servers give the requests in flight once SIGTERM came (LitServe's default is 30 s)."""
MAX_PAYLOAD_BYTES = 32 * 1024 * 1024
"""The largest request body taken (an image in base64 fits many times over); a larger one gets 413."""
OPENAI_PREFIX = "/v1/"
"""Routes that answer as OpenAI's API does, refusals included ({"error": {"message": ...}})."""


@dataclass(frozen=True)
class ServeOptions:
    """Everything `serve` was given (cli/serve_command.py parses it)."""

    model: ModelOptions
    host: str = "127.0.0.1"
    port: int = 8000
    device: str = "auto"
    max_batch_size: int = 1
    batch_timeout: float = 0.01
    timeout: float = 120.0
    log_level: str = "info"


@dataclass
class Served:
    """What the checks found: the handler the workers will use, where they run, and what /info says."""

    handler: type
    accelerator: str
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def chat(self) -> bool:
        return self.metadata.get("chat", False)


def check_options(options: ServeOptions) -> None:
    """Refusals that need no checkpoint: a port LitServe cannot take, or one that is already in use."""
    if not 1024 <= options.port <= 65535:
        raise UserError(f"--port {options.port}: LitServe serves on a port from 1024 to 65535")
    family = socket.AF_INET6 if ":" in options.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a closed port is free
        try:
            probe.bind((options.host, options.port))
        except OSError as error:
            raise UserError(
                f"--port {options.port} on {options.host} cannot be bound ({error.strerror}): another server holds it; "
                "choose another with --port"
            ) from None


def check_model(options: ServeOptions) -> Served:
    """Load the checkpoint as a worker will (every refusal of a file or a base happens here), and refuse options its
    task does not have; the model is dropped again before the servers fork."""
    import torch

    from lit_transformer.serving.handlers import handler_kind, load_for_serving

    device = options.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() and options.model.quantize == "none" else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {options.device} asks for a GPU, but none is available here; use --device cpu")
    if device.startswith("cuda") and options.model.quantize != "none":
        raise UserError("--quantize int8 runs on a CPU (its kernels are CPU kernels); use --device cpu")
    loaded = load_for_serving(options.model, "cpu")
    kind = handler_kind(loaded.task)
    task = type(loaded.task).__name__
    if kind is None:
        raise UserError(
            f"{options.model.checkpoint} holds a {task} model, which no route serves: serve a language model, a "
            "translation model, a classifier (fit one from this encoder with --model.init_from) or a captioning model"
        )
    if options.model.compile and kind is TextClassification:
        raise UserError("--compile compiles decoding; a classifier does not decode: leave it out")
    cfg = loaded.config
    chat = kind is TextGeneration and not cfg.is_encoder_decoder
    metadata: dict[str, Any] = {
        "checkpoint": str(options.model.checkpoint),
        "task": task,
        "context": cfg.max_seq_len,
        "routes": ["POST /predict", *(["POST /v1/chat/completions"] if chat else []), "GET /health", "GET /info"],
        "quantize": options.model.quantize,
        "compile": options.model.compile,
        "max_batch_size": options.max_batch_size,
        "chat": chat,
    }
    if kind is TextClassification:
        metadata["labels"] = loaded.task.names()
    if kind is ImageCaptioning:
        metadata["source"] = cfg.source
        metadata["image_size"] = list(cfg.image_size) if cfg.image_size else None
    del loaded
    gc.collect()
    return Served(kind, "cuda" if device.startswith("cuda") else "cpu", metadata)


def build_server(options: ServeOptions, served: Served):
    """The LitServer: /predict (batched as asked), the chat route for a language model, one-line 422s for bodies
    that do not fit the request's model."""
    import litserve as ls
    from fastapi.exception_handlers import http_exception_handler
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from lit_transformer.serving.apis import PREDICT_APIS, ChatAPI, ChatRequest
    from lit_transformer.serving.requests import validation_reason

    predict = PREDICT_APIS[served.handler.request_type](options.model, options.max_batch_size, options.batch_timeout)
    apis: list[Any] = [predict]
    fields = {"/predict": list(served.handler.request_type.model_fields)}
    if served.chat:
        apis.append(ChatAPI(options.model))
        fields["/v1/chat/completions"] = list(ChatRequest.model_fields)
    server = ls.LitServer(
        apis,
        accelerator=served.accelerator,
        workers_per_device=options.model.workers,
        timeout=options.timeout,
        model_metadata={k: v for k, v in served.metadata.items() if k != "chat"},
        max_payload_size=MAX_PAYLOAD_BYTES,
        restart_workers=True,  # a worker that dies (killed for memory) is started again; the server stays up
    )
    server.uvicorn_graceful_timeout = GRACE_SECONDS

    def refusal(request, status: int, reason: str) -> JSONResponse:
        if request.url.path.startswith(OPENAI_PREFIX):  # as OpenAI's API answers: the openai client shows the message
            error = {"message": reason, "type": "invalid_request_error", "param": None, "code": None}
            return JSONResponse({"error": error}, status_code=status)
        return JSONResponse({"detail": reason}, status_code=status)

    async def refuse_body(request, error: RequestValidationError):
        return refusal(request, 422, validation_reason(error.errors(), fields.get(request.url.path, [])))

    task = served.metadata.get("task", "this model")

    async def refuse_request(request, error: StarletteHTTPException):
        if not request.url.path.startswith(OPENAI_PREFIX):
            return await http_exception_handler(request, error)
        if error.status_code == 404 and not served.chat:  # a bare "Not Found" said nothing of why
            reason = f"{request.url.path} serves a language model; this server serves a {task} model: POST /predict"
            return refusal(request, 404, reason)
        return refusal(request, error.status_code, str(error.detail))

    server.app.add_exception_handler(RequestValidationError, refuse_body)
    server.app.add_exception_handler(StarletteHTTPException, refuse_request)
    return server


def stop_on_sigterm(server) -> None:
    """SIGTERM to the main process sets LitServe's shutdown event, as its /shutdown route would. Processes forked from
    this one after this call (LitServe's manager) ignore it: the main process shuts them down."""
    from lit_transformer.serving.litserve_private import request_shutdown

    main = os.getpid()

    def stop(signum: int, frame: Any) -> None:
        if os.getpid() != main:
            return
        if not request_shutdown(server):  # before run() set up LitServe's event: nothing started yet
            raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def run_server(options: ServeOptions) -> None:
    """`serve` with its parsed options: check, build, announce, run until SIGTERM or Ctrl+C."""
    check_options(options)
    served = check_model(options)
    server = build_server(options, served)
    host = f"[{options.host}]" if ":" in options.host else options.host
    routes = ", ".join(served.metadata["routes"])
    print(
        f"Serving the {served.metadata['task']} model of {options.model.checkpoint} on http://{host}:{options.port}"
        f" ({routes}); SIGTERM or Ctrl+C stops it",
        file=sys.stderr,
        flush=True,
    )
    stop_on_sigterm(server)
    try:
        server.run(host=options.host, port=options.port, log_level=options.log_level, generate_client_file=False)
    finally:
        for worker in getattr(server, "inference_workers", []):  # a start that failed leaves none behind
            if worker.is_alive():
                worker.terminate()
                worker.join(timeout=5)
