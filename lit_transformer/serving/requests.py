"""The bodies `serve` accepts, as pydantic models: FastAPI checks a body against them before any worker sees it.

Types are strict (a number sent as a string is refused, not converted) and an unknown field is refused, as the
command line refuses a mistyped flag. Decoding options are GenerationConfig's fields (the same names as `generate`'s
and `translate`'s flags and `predict`'s --model.generation.*), each optional: an option left out keeps the task's
default (GenerationConfig.for_task). `use_cache` and `compile` are the server's choice (`serve --compile`), not a
request's.

The classes are built at import, at module level, so a worker process started by spawn finds them by name when a
request is unpickled there.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from lit_transformer.config import GenerationConfig, field_docs

SERVER_OPTIONS = ("use_cache", "compile")
"""GenerationConfig fields a request cannot set: how the server decodes, not what."""
STRICT = ConfigDict(strict=True, extra="forbid")


def decoding_fields() -> dict[str, Any]:
    """Every GenerationConfig field but the server's, optional (None keeps the task's default), with its docstring."""
    hints, docs = typing.get_type_hints(GenerationConfig), field_docs(GenerationConfig)
    fields = {}
    for field in dataclasses.fields(GenerationConfig):
        if field.name in SERVER_OPTIONS:
            continue
        hint = hints[field.name]
        if typing.get_origin(hint) is list:  # one stop string may be sent without a list, as on the command line
            hint = hint | typing.get_args(hint)[0]
        fields[field.name] = (hint | None, Field(None, description=docs[field.name]))
    return fields


def decoding_options(request: BaseModel) -> dict[str, Any]:
    """The decoding options a request set (None: left to the task's default), lists as lists."""
    options = {name: getattr(request, name) for name in decoding_fields() if getattr(request, name) is not None}
    for name in ("stop", "stop_token_ids"):
        if name in options and not isinstance(options[name], list):
            options[name] = [options[name]]
    return options


TextRequest = create_model(
    "TextRequest",
    __config__=STRICT,
    __module__=__name__,
    __doc__="A prompt (language model) or a source sentence (translation), and how to decode it.",
    text=(str, Field(description="The prompt, or the sentence to translate: one line of predict's input file.")),
    **decoding_fields(),
)


class ClassificationRequest(BaseModel):
    """A text to classify: the answer is predict's row, its label and the probability of every label."""

    model_config = STRICT
    text: str = Field(description="The text to classify: one line of predict's input file.")


CaptionRequest = create_model(
    "CaptionRequest",
    __config__=STRICT,
    __module__=__name__,
    __doc__="An image (or its features) to caption, and how to decode the caption.",
    image=(
        str | None,
        Field(
            None,
            description="The image file's bytes in base64 (PNG, JPEG, ...; a data: URL too), for a model whose "
            "source is patches; it is resized to the model's image_size, as predict resizes it.",
        ),
    ),
    features=(
        list[list[float]] | None,
        Field(None, description="(regions, source_dim) feature vectors, for a model whose source is features."),
    ),
    name=(
        str | None,
        Field(None, description="The image's name, echoed in the answer's `image` (predict writes the file name)."),
    ),
    **decoding_fields(),
)


def validation_reason(errors: list[dict[str, Any]], fields: list[str]) -> str:
    """One line for FastAPI's validation errors of a body: the first field at fault and what is wrong with it
    (`fields`: the request's field names, for an unknown one's nearest)."""
    import difflib

    def named(error: dict[str, Any]) -> str:
        return ".".join(str(part) for part in error.get("loc", ()) if part != "body")

    extra = [e for e in errors if e.get("type") == "extra_forbidden"]
    missing = [e for e in errors if e.get("type") == "missing"]
    if len(extra) == 1 and len(missing) == 1:  # a required field sent under another name ({"prompt": ...})
        more = f" (and {len(errors) - 2} more)" if len(errors) > 2 else ""
        return (
            f"{named(extra[0])} is not a field of this request, and {named(missing[0])} is required: send "
            f"{named(missing[0])} in its place{more}"
        )
    errors = extra + [e for e in errors if e not in extra]  # an unknown field explains the rest, most often
    error = errors[0]
    where = [str(part) for part in error.get("loc", ()) if part != "body"]
    kind = error.get("type")
    if kind == "json_invalid":
        return f"the body is not valid JSON ({error.get('ctx', {}).get('error', error.get('msg'))})"
    if not where or kind == "model_attributes_type":
        return "the body must be a JSON object (sent with Content-Type: application/json)"
    field = where[0] + "".join(f"[{p}]" for p in where[1:] if p.isdigit())
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    if kind == "extra_forbidden":
        close = difflib.get_close_matches(where[0], fields, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else f"; the fields are {', '.join(fields)}"
        return f"{field} is not a field of this request{hint}{more}"
    return f"{field}: {error.get('msg', 'invalid')}{more}"
