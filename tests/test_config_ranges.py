"""Every number of every config dataclass is judged by rule: given -1 (each item of a tuple or list), it is refused
with a ConfigError when the object is built, before a run starts, unless -1 means something there.

The fields are walked, not listed, so a field added later is held to the same rule. Before this walk,
`model.optim.eps`, `weight_decay`, `warmup_steps`, `schedule_steps`, `min_lr_ratio` and `betas` and `model.lora.alpha`
and `dropout` took any value: torch's Adam refused a negative eps or weight decay only once the run had started, with
a traceback, and the others trained a run that made no sense without a word."""

from __future__ import annotations

import dataclasses
import types
import typing

import pytest

from lit_transformer.config import GenerationConfig, TransformerConfig
from lit_transformer.engine.optimizers import Optimization
from lit_transformer.errors import ConfigError
from lit_transformer.transforms.options import LoraOptions

# What each class needs besides the field under test, and where a field applies only to some models, what makes it
# apply (it is judged there; elsewhere it is not read).
BASE = {TransformerConfig: {"vocab_size": 100}}
APPLIES = {
    (TransformerConfig, "rope_theta"): {"positions": "rope"},
    (TransformerConfig, "patch_size"): {"source": "patches", "image_size": (32, 32)},
    (TransformerConfig, "image_channels"): {"source": "patches", "image_size": (32, 32)},
}
# -1 means something: a seed; beam search's alpha (below 0 favours shorter hypotheses); eos_token_id -1, no token ends
# a row.
MEANINGFUL = {(GenerationConfig, "seed"), (GenerationConfig, "length_penalty"), (GenerationConfig, "eos_token_id")}
CLASSES = (TransformerConfig, GenerationConfig, Optimization, LoraOptions)


def numbers(cls: type) -> list[tuple[str, typing.Any]]:
    """(field, its -1 value) for each int or float field, or tuple/list of them, of a dataclass."""
    found = []
    for field in dataclasses.fields(cls):
        hint = typing.get_type_hints(cls)[field.name]
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        kinds = set(typing.get_args(hint)) - {type(None)} if union else {hint}
        if bool in kinds:
            continue
        if kinds & {int, float}:
            found.append((field.name, -1))
            continue
        for kind in kinds:
            items = set(typing.get_args(kind)) - {Ellipsis}
            if typing.get_origin(kind) in (tuple, list) and items and items <= {int, float}:
                default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
                found.append((field.name, (-1,) * max(1, len(default or ())) if typing.get_origin(kind) is tuple
                               else [-1]))  # fmt: skip
                break
    return found


def test_the_walk_sees_the_numbers_of_each_class():
    names = {cls: {name for name, _ in numbers(cls)} for cls in CLASSES}
    assert {"d_model", "dropout", "rope_theta", "layer_norm_eps"} <= names[TransformerConfig]
    assert {"max_new_tokens", "top_p", "stop_token_ids"} <= names[GenerationConfig]
    assert {"lr", "eps", "betas", "warmup_steps", "min_lr_ratio"} <= names[Optimization]
    assert {"rank", "alpha", "dropout"} <= names[LoraOptions]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_number_of_every_config_refuses_minus_one(cls):
    accepted = []
    for name, value in numbers(cls):
        if (cls, name) in MEANINGFUL:
            continue
        try:
            cls(**{**BASE.get(cls, {}), **APPLIES.get((cls, name), {}), name: value})
        except ConfigError as refused:
            assert name in str(refused), (name, str(refused))
        else:
            accepted.append(name)
    assert accepted == []


@pytest.mark.parametrize(
    ("cls", "values", "message"),
    [
        (TransformerConfig, {"bias": "false"}, "bias='false' must be True or False (a bool, not a string)"),
        (TransformerConfig, {"tie_embeddings": "no"}, "tie_embeddings='no' must be True or False"),
        (TransformerConfig, {"n_layers": 2.5}, "n_layers=2.5 must be an integer"),
        (TransformerConfig, {"n_heads": 4.0, "d_model": 32}, "n_heads=4.0 must be an integer"),
        (TransformerConfig, {"d_model": "32"}, "d_model='32' must be an integer"),
        (TransformerConfig, {"dropout": "0.1"}, "dropout='0.1' must be a number"),
        (TransformerConfig, {"init_std": float("nan")}, "init_std=nan must be positive"),
        (GenerationConfig, {"num_beams": 2.0}, "num_beams=2.0 must be an integer"),
        (GenerationConfig, {"top_k": 2.5}, "top_k=2.5 must be an integer"),
        (GenerationConfig, {"temperature": float("nan")}, "temperature=nan must be >= 0"),
    ],
)
def test_a_value_of_another_type_is_refused_naming_the_field(cls, values, message) -> None:
    """Before, a string where a bool goes was taken as True (bias="false" built biases), and a float where an int goes
    failed deep inside torch when the model was built or decoded."""
    with pytest.raises(ConfigError) as error:
        cls(**{**BASE.get(cls, {}), **values})
    assert message in str(error.value)


def test_numpy_integers_and_ints_for_floats_are_taken() -> None:
    np = pytest.importorskip("numpy")
    config = TransformerConfig(vocab_size=np.int64(100), d_model=np.int32(32), n_heads=4, dropout=0, rope_theta=10)
    assert config.d_model == 32


def test_one_stop_string_is_one_stop_string_not_its_characters() -> None:
    """Before, GenerationConfig(stop="\\n\\n") stopped at the first "\\n": the string was read as its characters."""
    assert GenerationConfig(stop="\n\n").stop == ["\n\n"]
    assert GenerationConfig(stop_token_ids=5).stop_token_ids == [5]
    assert GenerationConfig(stop=["a", "b"]).stop == ["a", "b"]
