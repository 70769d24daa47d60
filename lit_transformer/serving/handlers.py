"""What a serving worker does with a checkpoint: a request made into a model input, or refused in one line; a batch of
inputs run; the answers, each the row `predict` writes for that input.

One class per kind of task: TextGeneration (a language model's prompt, a translation model's source sentence),
TextClassification, ImageCaptioning. Each calls the code `predict` calls (tasks.base.generation_rows, Task.predict,
Transformer.generate with LoadedModel.decode), so an answer equals what the command line gives for the same input and
options (greedy, beam search, or sampling with a seed). Requests in one batch are decoded together where their options
agree (decoding is exact under right padding: each row gives what it gives alone); a sampled request with a seed is
decoded alone, from a generator of its own, as `generate --seed` decodes it.

A request the model cannot take (a prompt past its context, an image that is not one, options GenerationConfig
refuses) becomes a `Refusal`, never an exception: LitServe fails every request of a batch when one raises, so a
refusal travels beside the other answers and becomes its own 4xx. A batch that fails anyway (a bug) is run again one
request at a time, so that only the request at fault gets a 500.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import io
import logging
import os
import queue
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lit_transformer.config import GenerationConfig
from lit_transformer.data.text import TextStream, pad_right
from lit_transformer.inference import LoadedModel, load_model
from lit_transformer.serving.requests import CaptionRequest, ClassificationRequest, TextRequest, decoding_options
from lit_transformer.tasks.base import generation_rows, text_stop_ids

log = logging.getLogger(__name__)

MAX_BEAMS = 16
"""The most beams a request may ask for: each beam is a row of the batch, and its KV cache."""
MAX_IMAGE_PIXELS = 50_000_000
"""The largest image a request may send, in pixels (a few bytes of PNG can say a huge size; it is refused before it is
decoded)."""


@dataclass(frozen=True)
class Refusal:
    """A request the model cannot take: the HTTP status, and one line that says why."""

    status: int
    reason: str


@dataclass(frozen=True)
class ModelOptions:
    """How every worker loads and runs the checkpoint (the options of `serve` that concern the model)."""

    checkpoint: str
    base: str | None = None
    quantize: str = "none"
    compile: bool = False
    max_new_tokens_limit: int = 1024
    workers: int = 1


def load_for_serving(options: ModelOptions, device: str = "cpu") -> LoadedModel:
    """The checkpoint as a worker serves it: loaded (a LoRA checkpoint's base checked and merged), int8 if asked.

    A worker takes its share of the CPU cores (all of them over --workers) unless OMP_NUM_THREADS says otherwise: two
    workers each running every core's worth of threads slow each other down."""
    if str(device).startswith("cpu") and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // options.workers))
    loaded = load_model(options.checkpoint, device, options.base)
    if options.quantize == "int8":
        from lit_transformer.transforms.int8 import quantize_int8

        loaded = dataclasses.replace(loaded, model=quantize_int8(loaded.model, inplace=True))
    return loaded


def one_line(error: Exception) -> str:
    """An error's message on one line (GenerationConfig lists its problems one per line)."""
    lines = [line.strip().removeprefix("- ").strip() for line in str(error).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        return f"{lines[0]} {'; '.join(lines[1:])}"
    return "; ".join(lines) or type(error).__name__


def groups(keys: Sequence[Any]) -> list[list[int]]:
    """Indices of `keys` grouped by equal key, in order of first appearance; a None key is a group of its own."""
    out: list[list[int]] = []
    where: dict[Any, int] = {}
    for i, key in enumerate(keys):
        if key is not None and key in where:
            out[where[key]].append(i)
            continue
        if key is not None:
            where[key] = len(out)
        out.append([i])
    return out


def batch_key(gen: GenerationConfig) -> str | None:
    """Which requests decode together: those with the same options. A seeded sample decodes alone, from its own
    generator (in a batch, rows draw from one generator in turn, and the answer would depend on its neighbours)."""
    if gen.num_beams == 1 and gen.temperature > 0 and gen.seed is not None:
        return None
    return repr(gen)


class Handler:
    """The base: `prepare` one request (an item or a Refusal), `run` a batch of items, `answer` both together."""

    request_type: type = TextRequest

    def __init__(self, loaded: LoadedModel, options: ModelOptions) -> None:
        self.loaded, self.options = loaded, options

    @property
    def config(self):
        return self.loaded.config

    def prepare(self, request: Any) -> Any:
        raise NotImplementedError

    def run(self, items: list[Any]) -> list[dict[str, Any]]:
        raise NotImplementedError

    def warm_up(self) -> None:
        """Run the model once before serving (compiled decoding compiles on its first call)."""

    def answer(self, prepared: Sequence[Any]) -> list[dict[str, Any] | Refusal]:
        """Each prepared request's answer: its row, or its Refusal (a request at fault in a failing batch: a 500)."""
        out: list[Any] = list(prepared)
        good = [i for i, item in enumerate(prepared) if not isinstance(item, Refusal)]
        if not good:
            return out
        try:
            rows = self.run([prepared[i] for i in good])
        except Exception as error:
            if len(good) > 1:  # find the request at fault: each alone
                for i in good:
                    out[i] = self.answer([prepared[i]])[0]
                return out
            log.exception("the model failed on a request")
            out[good[0]] = Refusal(500, f"the model failed on this request ({type(error).__name__}: {one_line(error)})")
            return out
        for i, row in zip(good, rows, strict=True):
            out[i] = row
        return out

    def decoding(self, options: dict[str, Any]) -> GenerationConfig | Refusal:
        """GenerationConfig fields over the task's defaults, checked against the model and this server's limits."""
        try:
            gen = GenerationConfig.for_task(self.loaded.task, **options, compile=self.options.compile)
        except (TypeError, ValueError) as error:
            return Refusal(422, one_line(error))
        limit, context = self.options.max_new_tokens_limit, self.config.max_seq_len
        if gen.max_new_tokens > limit:
            return Refusal(
                422,
                f"max_new_tokens={gen.max_new_tokens} is above this server's limit of {limit} (serve --max_new_tokens_limit)",
            )
        if gen.num_beams > MAX_BEAMS:
            return Refusal(422, f"num_beams={gen.num_beams} is above this server's limit of {MAX_BEAMS}")
        if gen.window_keep is not None and gen.window_keep > context:
            return Refusal(422, f"window_keep={gen.window_keep} exceeds the model's context of {context} tokens")
        vocab = self.config.tgt_vocab_size
        outside = [t for t in [gen.eos_token_id, *gen.stop_token_ids] if t is not None and t >= vocab]
        if outside:
            return Refusal(
                422, f"eos_token_id/stop_token_ids {outside} are not tokens of this model (ids 0 to {vocab - 1})"
            )
        return gen


@dataclass
class TextItem:
    text: str
    ids: list[int]
    gen: GenerationConfig


class TextGeneration(Handler):
    """A language model's prompt or a translation model's source sentence, decoded as `predict` decodes it: the answer
    is {"input", "output", "tokens"} (the output without the prompt, cut by the stop strings; its token ids)."""

    request_type = TextRequest

    def prepare(self, request: Any) -> TextItem | Refusal:
        return self.prepare_text(request.text, decoding_options(request))

    def prepare_text(self, text: str, options: dict[str, Any]) -> TextItem | Refusal:
        """A text and GenerationConfig fields (a /predict request's, or the chat route's)."""
        gen = self.decoding(options)
        if isinstance(gen, Refusal):
            return gen
        ids = self.loaded.encode(text)
        context = self.config.max_seq_len
        if len(ids) > context:
            what = "source" if self.config.is_encoder_decoder else "prompt"
            return Refusal(
                400, f"the {what} has {len(ids)} tokens, more than the model's context of {context}: shorten it"
            )
        return TextItem(text, ids, gen)

    def run(self, items: list[TextItem]) -> list[dict[str, Any]]:
        out: list[Any] = [None] * len(items)
        for group in groups([batch_key(item.gen) for item in items]):
            ids, mask = pad_right([items[i].ids for i in group], self.config.pad_token_id)
            device = self.loaded.device
            rows = generation_rows(
                self.loaded.model, self.loaded.target_tokenizer, items[group[0]].gen, ids.to(device),
                mask.to(device), [items[i].text for i in group],
            )  # fmt: skip
            for i, row in zip(group, rows, strict=True):
                out[i] = row
        return out

    def stream(self, item: TextItem) -> Iterator[str | dict[str, int]]:
        """The output's text as it is generated (held back where it could begin a stop string, or a character is
        incomplete), then the token counts: what the chat route streams. Decoding runs in a thread of its own, which
        feeds this generator through a queue."""
        chunks: queue.Queue = queue.Queue()
        done = object()
        stops = text_stop_ids(self.config, item.gen)
        stream = TextStream(
            self.loaded.target_tokenizer, 1, item.gen.stop, stops, echo=_QueueWriter(chunks), prompts=[item.ids]
        )
        gen = item.gen.replace(num_beams=1)  # streaming decodes greedily or samples: beams settle only at the end

        def decode() -> None:
            try:
                prompt = torch.tensor([item.ids], device=self.loaded.device)
                self.loaded.model.generate(prompt, gen, streamer=stream)
                stream.finish()
                chunks.put(done)
            except BaseException as error:  # raised again in the serving thread, where LitServe reports it
                chunks.put(error)

        thread = threading.Thread(target=decode, daemon=True, name="serve-decode")
        thread.start()
        while (chunk := chunks.get()) is not done:
            if isinstance(chunk, BaseException):
                raise chunk
            yield chunk
        thread.join()
        produced = len(stream.ids[0])
        reason = "stop" if stream.done[0] else "length"  # a stop id or string ended it, or max_new_tokens did
        counts = {
            "prompt_tokens": len(item.ids),
            "completion_tokens": produced,
            "total_tokens": len(item.ids) + produced,
        }
        yield {**counts, "finish_reason": reason}

    def warm_up(self) -> None:
        if self.options.compile:
            item = self.prepare_text("", {"max_new_tokens": 2, "num_beams": 1})
            self.run([item])


class _QueueWriter:
    """A text stream's echo that puts each piece of text into a queue."""

    def __init__(self, chunks: queue.Queue) -> None:
        self.chunks = chunks

    def write(self, text: str) -> None:
        if text:
            self.chunks.put(text)

    def flush(self) -> None:
        pass


class TextClassification(Handler):
    """A text classified as `predict` classifies it: {"input", "label", "probability", "probabilities"} (multi-label:
    "labels", those above 0.5, and "probabilities")."""

    request_type = ClassificationRequest

    def prepare(self, request: Any) -> EncodedText | Refusal:
        ids = self.loaded.encode(request.text)
        context = self.config.max_seq_len - (1 if self.config.pooling == "cls" else 0)  # the model adds [CLS]
        # Cut to the context, as predict cuts its inputs (to the DataModule's max_length, which the context is): the
        # served answer is predict's for the same text (a longer one was refused here, classified there).
        return EncodedText(request.text, ids[:context])

    def run(self, items: list[EncodedText]) -> list[dict[str, Any]]:
        ids, mask = pad_right([item.ids for item in items], self.config.pad_token_id)
        batch = {"input_ids": ids.to(self.loaded.device), "attention_mask": mask.to(self.loaded.device)}
        batch["text"] = [item.text for item in items]
        with torch.inference_mode():
            return self.loaded.task.predict(_ModelHolder(self.loaded.model), batch)


@dataclass
class EncodedText:
    text: str
    ids: list[int]


@dataclass
class _ModelHolder:
    """What Task.predict reads of the LightningModule it is given: its model."""

    model: torch.nn.Module


@dataclass
class CaptionItem:
    name: str | None
    source: torch.Tensor
    gen: GenerationConfig


class ImageCaptioning(Handler):
    """An image (source: patches) or its features (source: features) captioned as `predict` captions a folder's
    file: {"image": the request's name, "caption"}."""

    request_type = CaptionRequest

    def prepare(self, request: Any) -> CaptionItem | Refusal:
        gen = self.decoding(decoding_options(request))
        if isinstance(gen, Refusal):
            return gen
        cfg = self.config
        wanted, other = ("image", "features") if cfg.source == "patches" else ("features", "image")
        if getattr(request, wanted) is None or getattr(request, other) is not None:
            what = (
                "an image: `image`, the image file's bytes in base64"
                if wanted == "image"
                else f"image features: `features`, a list of regions, each {cfg.source_dim} numbers"
            )
            return Refusal(422, f"this model captions {what} (and no `{other}`)")
        source = self.image(request.image) if wanted == "image" else self.features(request.features)
        if isinstance(source, Refusal):
            return source
        return CaptionItem(request.name, source, gen)

    def image(self, data: str) -> torch.Tensor | Refusal:
        from PIL import Image, UnidentifiedImageError

        from lit_transformer.data.captioning import load_image

        if data.startswith("data:"):  # a data URL: data:image/png;base64,...
            data = data.partition(",")[2]
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError) as error:
            return Refusal(400, f"image is not base64 ({one_line(error)}): send the file's bytes base64-encoded")
        try:
            with Image.open(io.BytesIO(raw)) as image:  # reads the header: the size is known before any decoding
                if image.width * image.height > MAX_IMAGE_PIXELS:
                    return Refusal(
                        413, f"image is {image.width} x {image.height} pixels, more than {MAX_IMAGE_PIXELS:,}"
                    )
                return load_image(image, tuple(self.config.image_size), self.config.image_channels)
        except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError, SyntaxError) as error:
            return Refusal(400, f"image is not an image file Pillow can read ({one_line(error)}): send a PNG or JPEG")

    def features(self, rows: list[list[float]]) -> torch.Tensor | Refusal:
        cfg = self.config
        widths = {len(row) for row in rows}
        if not rows or widths != {cfg.source_dim}:
            return Refusal(
                422, f"features must be 1 to {cfg.max_seq_len} regions of {cfg.source_dim} numbers each (source_dim); "
                f"got {len(rows)} regions of {sorted(widths) or 0}"
            )  # fmt: skip
        if len(rows) > cfg.max_seq_len:
            return Refusal(400, f"features has {len(rows)} regions, more than the model's context of {cfg.max_seq_len}")
        features = torch.tensor(rows, dtype=torch.float32)
        if not bool(torch.isfinite(features).all()):
            return Refusal(422, "features holds a value that is not a finite number")
        return features

    def run(self, items: list[CaptionItem]) -> list[dict[str, Any]]:
        from lit_transformer.data.captioning import sources_batch

        out: list[Any] = [None] * len(items)
        device = self.loaded.device
        for group in groups([batch_key(item.gen) for item in items]):
            batch = sources_batch([items[i].source for i in group])
            mask = batch.get("src_mask")
            ids = self.loaded.model.generate(
                batch["src"].to(device), items[group[0]].gen, attention_mask=None if mask is None else mask.to(device)
            )
            for i, caption in zip(group, self.loaded.decode(ids), strict=True):
                out[i] = {"image": items[i].name, "caption": caption}
        return out

    def warm_up(self) -> None:
        if self.options.compile:
            cfg = self.config
            shape = (cfg.image_channels, *cfg.image_size) if cfg.source == "patches" else (1, cfg.source_dim)
            gen = GenerationConfig.for_task(self.loaded.task, max_new_tokens=2, compile=True)
            self.run([CaptionItem(None, torch.zeros(shape), gen)])


HANDLERS: dict[str, type[Handler]] = {
    "language_modeling": TextGeneration,
    "translation": TextGeneration,
    "classification": TextClassification,
    "captioning": ImageCaptioning,
}
"""The handler of each built-in task that can be served (a masked LM fills in tokens: no route serves it)."""


def handler_kind(task: Any) -> type[Handler] | None:
    """The handler of a task object (a subclass of a built-in task is served as that task), or None."""
    from lit_transformer.tasks import TASKS

    for name in ("captioning", "translation", "classification", "language_modeling"):  # subclasses before bases
        if isinstance(task, TASKS[name]):
            return HANDLERS[name]
    return None


def build_handler(options: ModelOptions, device: str = "cpu") -> Handler:
    """What a worker serves: the checkpoint loaded, its task's handler, warmed up."""
    loaded = load_for_serving(options, device)
    kind = handler_kind(loaded.task)
    if kind is None:
        raise ValueError(f"the {type(loaded.task).__name__} task has no serving route")
    handler = kind(loaded, options)
    handler.warm_up()
    return handler
