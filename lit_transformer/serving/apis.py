"""The LitServe APIs: `POST /predict` for every task, `POST /v1/chat/completions` (OpenAI's) for a language model.

LitServe reads the request body's type from the annotation of `decode_request`, so each request model has a /predict
API class of its own, and this module keeps real classes in its annotations (no `from __future__ import annotations`:
FastAPI would meet their names as strings where it cannot resolve them).
"""

from typing import Any

import litserve as ls
from fastapi import BackgroundTasks, HTTPException
from fastapi.responses import JSONResponse
from litserve.specs.openai import ChatCompletionRequest, OpenAISpec, TextContent

from lit_transformer.serving.handlers import Handler, ModelOptions, Refusal, TextGeneration, build_handler
from lit_transformer.serving.litserve_private import WaitingBatchLoop
from lit_transformer.serving.requests import CaptionRequest, ClassificationRequest, TextRequest


class PredictAPI(ls.LitAPI):
    """`POST /predict`: one input of `predict`'s file in, the row `predict` writes for it out (see handlers.py).

    With max_batch_size above 1, `predict` gets the requests that arrived within batch_timeout of the first
    (WaitingBatchLoop); a refused request is answered beside the others with its own status."""

    def __init__(self, options: ModelOptions, max_batch_size: int = 1, batch_timeout: float = 0.0) -> None:
        loop = WaitingBatchLoop() if max_batch_size > 1 else "auto"
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout, api_path="/predict", loop=loop)
        self.options = options
        self.handler: Handler | None = None

    def setup(self, device: str) -> None:
        self.handler = build_handler(self.options, device)

    def decode_request(self, request: Any) -> Any:
        return self.handler.prepare(request)

    def predict(self, x: Any) -> Any:
        if self.max_batch_size > 1:  # a list of prepared requests
            return self.handler.answer(x)
        return self.handler.answer([x])[0]

    def encode_response(self, output: Any):
        if isinstance(output, Refusal):
            return JSONResponse({"detail": output.reason}, status_code=output.status)
        return output


class TextPredictAPI(PredictAPI):
    """/predict of a language model (a prompt) or a translation model (a source sentence)."""

    def decode_request(self, request: TextRequest) -> Any:
        return self.handler.prepare(request)


class ClassificationPredictAPI(PredictAPI):
    """/predict of a classifier."""

    def decode_request(self, request: ClassificationRequest) -> Any:
        return self.handler.prepare(request)


class CaptionPredictAPI(PredictAPI):
    """/predict of a captioning model."""

    def decode_request(self, request: CaptionRequest) -> Any:
        return self.handler.prepare(request)


PREDICT_APIS: dict[type, type[PredictAPI]] = {
    TextRequest: TextPredictAPI,
    ClassificationRequest: ClassificationPredictAPI,
    CaptionRequest: CaptionPredictAPI,
}


class ChatRequest(ChatCompletionRequest):
    """OpenAI's chat completion request with the sampling options OpenAI's API lacks and ours has (the `openai`
    client sends them with `extra_body=`, and `seed=` as it is)."""

    seed: int | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None


class ChatSpec(OpenAISpec):
    """LitServe's OpenAI spec, reading ChatRequest (its own request type drops fields it does not know, `seed` too)."""

    async def chat_completion(self, request: ChatRequest, background_tasks: BackgroundTasks):
        return await super().chat_completion(request, background_tasks)


def chat_prompt(request: ChatRequest) -> tuple[str, dict[str, Any]]:
    """(the prompt, GenerationConfig fields) of a chat request, or an HTTPException(400) naming what this model cannot
    do. A base language model knows no roles: the prompt is the messages' texts joined by newlines (a single user
    message is the prompt as `generate --prompt` takes it)."""
    if request.tools:
        raise HTTPException(400, "tools are not supported: this language model has no tool calling")
    if request.presence_penalty or request.frequency_penalty:
        raise HTTPException(400, "presence_penalty and frequency_penalty are not supported; use repetition_penalty")
    if request.response_format is not None and request.response_format.type != "text":
        raise HTTPException(400, f"response_format {request.response_format.type} is not supported: text only")
    texts = []
    for message in request.messages:
        if isinstance(message.content, list):
            for part in message.content:
                if not isinstance(part, TextContent) or part.type != "text":
                    raise HTTPException(400, f"message content of type {part.type} is not supported: text only")
                texts.append(part.text)
        elif message.content is not None:
            texts.append(message.content)
    given = request.model_fields_set
    options: dict[str, Any] = {}
    if "temperature" in given and request.temperature is not None:
        options["temperature"] = request.temperature
    if "top_p" in given and request.top_p is not None:
        options["top_p"] = request.top_p
    max_tokens = request.max_completion_tokens or request.max_tokens
    if max_tokens is not None:
        options["max_new_tokens"] = max_tokens
    if request.stop:
        options["stop"] = [request.stop] if isinstance(request.stop, str) else list(request.stop)
    for name in ("seed", "top_k", "repetition_penalty"):
        if getattr(request, name) is not None:
            options[name] = getattr(request, name)
    return "\n".join(texts), options


class ChatAPI(ls.LitAPI):
    """`POST /v1/chat/completions` of a language model, OpenAI's API through LitServe's OpenAISpec: the reply is the
    model's continuation of the prompt (chat_prompt), streamed as it is generated (`"stream": true`) or whole, with
    the token counts as `usage`. One request decodes at a time per worker (it streams); --workers adds workers."""

    def __init__(self, options: ModelOptions) -> None:
        super().__init__(spec=ChatSpec())
        self.options = options
        self.handler: TextGeneration | None = None

    def setup(self, device: str) -> None:
        handler = build_handler(self.options, device)
        if not isinstance(handler, TextGeneration) or handler.config.is_encoder_decoder:
            raise ValueError("the chat route serves language models (decoder-only) only")
        self.handler = handler

    def decode_request(self, request: ChatRequest) -> Any:
        text, options = chat_prompt(request)
        item = self.handler.prepare_text(text, options)
        if isinstance(item, Refusal):
            raise HTTPException(item.status, item.reason)
        return item

    def predict(self, item: Any):
        yield from self.handler.stream(item)

    def encode_response(self, outputs: Any):
        for output in outputs:
            if isinstance(output, dict):  # the last: the token counts
                yield {"role": "assistant", "content": "", **output}
            else:
                yield {"role": "assistant", "content": output}
