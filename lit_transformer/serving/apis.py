"""The LitServe APIs: `POST /predict` for every task, `POST /v1/chat/completions` (OpenAI's) for a language model.

LitServe reads the request body's type from the annotation of `decode_request`, so each request model has a /predict
API class of its own, and this module keeps real classes in its annotations (no `from __future__ import annotations`:
FastAPI would meet their names as strings where it cannot resolve them).
"""

import asyncio
import json
import uuid
from typing import Any

import litserve as ls
from fastapi import BackgroundTasks, HTTPException
from fastapi.responses import JSONResponse, StreamingResponse
from litserve.specs.openai import (
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionStreamingChoice,
    ChoiceDelta,
    OpenAISpec,
    TextContent,
    UsageInfo,
)
from litserve.utils import LitAPIStatus

from lit_transformer.serving.handlers import (
    MAX_BEAMS,
    Handler,
    ModelOptions,
    Refusal,
    TextGeneration,
    build_handler,
)
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


MAX_CHOICES = MAX_BEAMS
"""The most choices (`n`) a chat request may ask for: each is a decode of its own (as many as beams)."""


class ChatSpec(OpenAISpec):
    """LitServe's OpenAI spec, reading ChatRequest (its own request type drops fields it does not know, `seed` too),
    with three of OpenAI's rules LitServe's lacks: a refused request is an HTTP error whether it streams or not (a
    refused stream was a 200 whose one event was the error, which the `openai` client reads as an empty reply); a
    choice cut by max_tokens ends with finish_reason "length"; a stream's chunks share one id."""

    async def chat_completion(self, request: ChatRequest, background_tasks: BackgroundTasks):
        check_choices(request)
        response = await super().chat_completion(request, background_tasks)
        if not isinstance(response, StreamingResponse):
            return response
        chunks = response.body_iterator
        first = await anext(chunks, None)  # a refusal of the request comes first: raised here, before the 200

        async def replay():
            if first is not None:
                yield first
            async for chunk in chunks:
                yield chunk

        response.body_iterator = replay()
        return response

    async def streaming_completion(self, request: ChatCompletionRequest, pipe_responses: list):
        """LitServe's, but an error in the first event of a choice is raised (chat_completion answers it with its
        status), the chunks carry one id, and each choice's finish_reason is its own."""
        stream_id, reasons, started = f"chatcmpl-{uuid.uuid4().hex[:24]}", ["stop"] * request.n, False
        usages = [UsageInfo() for _ in range(request.n)]  # each choice's counts: its last event carries them
        try:
            async for events in every_event(*pipe_responses):
                choices = []
                for i, event in enumerate(events):
                    if event is None:  # this choice ended before the others
                        continue
                    response, status = event
                    if status == LitAPIStatus.ERROR:
                        raise response if isinstance(response, HTTPException) else HTTPException(500)
                    encoded = json.loads(response)
                    reasons[i] = encoded.pop("finish_reason", reasons[i])
                    counted = UsageInfo(**encoded)
                    if counted.total_tokens:
                        usages[i] = counted
                    choices.append(ChatCompletionStreamingChoice(index=i, delta=ChoiceDelta(**encoded)))
                started = True
                chunk = ChatCompletionChunk(id=stream_id, model=request.model, choices=choices, usage=None)
                yield f"data: {chunk.model_dump_json(by_alias=True)}\n\n"
            last = [
                ChatCompletionStreamingChoice(index=i, delta=ChoiceDelta(), finish_reason=reasons[i])
                for i in range(request.n)
            ]
            completion = sum(u.completion_tokens or 0 for u in usages)
            prompt = usages[0].prompt_tokens  # every choice continues the same prompt: counted once
            usage = UsageInfo(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
            chunk = ChatCompletionChunk(id=stream_id, model=request.model, choices=last, usage=usage)
            yield f"data: {chunk.model_dump_json(by_alias=True)}\n\n"
            yield "data: [DONE]\n\n"
        except HTTPException as error:
            if not started:
                raise
            yield f"data: {json.dumps({'error': {'message': error.detail, 'code': error.status_code}})}\n\n"

    async def non_streaming_completion(self, request: ChatCompletionRequest, generator_list: list):
        """LitServe's, with each choice's finish_reason its own ("length" where max_tokens cut it)."""
        reasons = ["stop"] * len(generator_list)

        async def noting(i: int, pipe):
            async for response, status in pipe:
                if status != LitAPIStatus.ERROR:
                    encoded = json.loads(response)
                    reasons[i] = encoded.pop("finish_reason", reasons[i])
                    response = json.dumps(encoded)
                yield response, status

        answer = await super().non_streaming_completion(
            request, [noting(i, pipe) for i, pipe in enumerate(generator_list)]
        )
        for choice in answer.choices:
            choice.finish_reason = reasons[choice.index]
        if answer.usage is not None:
            answer.usage = one_prompt(answer.usage, len(generator_list))
        return answer


async def every_event(*streams):
    """Each choice's events side by side, until every choice has ended (None for one that ended before the others).
    LitServe's azip stopped at the shortest: with n choices streamed, the longer ones lost their last chunks and
    their counts."""
    iterators = [stream.__aiter__() for stream in streams]
    ended = [False] * len(iterators)
    while not all(ended):
        live = [i for i, done in enumerate(ended) if not done]
        results = await asyncio.gather(*(iterators[i].__anext__() for i in live), return_exceptions=True)
        events: list[Any] = [None] * len(iterators)
        for i, result in zip(live, results, strict=True):
            if isinstance(result, StopAsyncIteration):
                ended[i] = True
            elif isinstance(result, BaseException):
                raise result
            else:
                events[i] = result
        if any(event is not None for event in events):
            yield events


def one_prompt(usage: UsageInfo, choices: int) -> UsageInfo:
    """The usage of a request of `choices` choices, summed over them (LitServe's sum): its prompt counted once, as
    OpenAI's API counts it (every choice continues the same prompt), the completions' tokens all."""
    prompt = usage.prompt_tokens // max(1, choices)
    return UsageInfo(
        prompt_tokens=prompt, completion_tokens=usage.completion_tokens, total_tokens=prompt + usage.completion_tokens
    )


def check_choices(request: ChatRequest) -> None:
    """`n` between 1 and MAX_CHOICES, and choices that can differ: a seed (or greedy decoding) gives every choice the
    same text. n 0 was a 500, n 1000 a thousand decodes."""
    n = 1 if request.n is None else request.n
    if not 1 <= n <= MAX_CHOICES:
        raise HTTPException(422, f"n={n}: ask for 1 to {MAX_CHOICES} choices")
    if n > 1 and (request.seed is not None or ("temperature" in request.model_fields_set and request.temperature == 0)):
        why = "a seed" if request.seed is not None else "temperature 0 (greedy)"
        raise HTTPException(422, f"n={n} with {why}: every choice would be the same text; ask for n=1")


def chat_prompt(request: ChatRequest) -> tuple[str, dict[str, Any]]:
    """(the prompt, GenerationConfig fields) of a chat request, or an HTTPException(400) naming what this model cannot
    do. A base language model knows no roles: the prompt is the messages' texts joined by newlines (a single user
    message is the prompt as `generate --prompt` takes it)."""
    if not request.messages:
        raise HTTPException(400, "messages is empty: give at least one message, whose content is the prompt")
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
