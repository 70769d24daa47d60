"""AttentionMaps: each layer's heads as one RGB image, tagged `attention/{kind}/layer_{i}`, its cells the weights in
viridis over 0..1 and its token labels (long BPE tokens too) drawn beside the cells, never over them nor off the edge."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from matplotlib import colormaps

from lit_transformer.engine.task_outputs import _CELL, AttentionMaps, _heads_frame, heads_image

LONG = ["ĠROMEO", ":", "\\n", "Ġextraordinarily", "Ġinterchangeably", "$x$", "<|endoftext|>", "Ġ" + "a" * 30]


def _weights(heads: int, queries: int, keys: int) -> torch.Tensor:
    return torch.randn(heads, queries, keys, generator=torch.Generator().manual_seed(0)).softmax(-1)


def _labels(n: int) -> list[str]:
    return [LONG[i % len(LONG)] for i in range(n)]


@pytest.mark.parametrize(("heads", "queries", "keys"), [(6, 24, 24), (1, 1, 1), (4, 5, 24), (16, 24, 3)])
def test_each_head_is_its_weights_in_viridis_with_labels_beside_the_cells(heads: int, queries: int, keys: int):
    weights = _weights(heads, queries, keys)
    image = heads_image(weights, _labels(queries), _labels(keys))
    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3

    frame, corners = _heads_frame(heads, tuple(_labels(queries)), tuple(_labels(keys)))
    assert frame.shape == image.shape and len(corners) == heads
    colours = colormaps["viridis"](weights.numpy(), bytes=True)[..., :3]
    for h, (top, left) in enumerate(corners):
        cells = image[top : top + queries * _CELL, left : left + keys * _CELL]
        assert cells.shape[:2] == (queries * _CELL, keys * _CELL)  # inside the image
        assert (cells[::_CELL, ::_CELL] == colours[h]).all()  # one block of pixels per weight, viridis over 0..1
        assert (frame[top : top + queries * _CELL, left : left + keys * _CELL] == 255).all()  # no text over cells
    edges = np.concatenate([image[0], image[-1], image[:, 0], image[:, -1]])
    assert (edges == 255).all()  # nothing drawn reaches the border: no label is cut off
    assert (image != 255).any(axis=2).sum() > (image == 0).all(axis=2).sum() > 0  # labels in black, cells in colour


def test_images_are_tagged_by_kind_and_layer_and_the_model_keeps_its_mode():
    model = torch.nn.Linear(1, 1).train()
    layers = [_weights(6, 24, 24)[None] for _ in range(4)]
    attentions = {"self": layers, "cross": [_weights(6, 24, 5)[None]]}
    axes = {"self": (_labels(24), _labels(24)), "cross": (_labels(24), _labels(5))}

    def attention(module, batch, max_tokens):
        assert max_tokens == 24 and not module.model.training
        return attentions, axes

    module = SimpleNamespace(model=model, task=SimpleNamespace(attention=attention))
    images = dict(AttentionMaps(max_tokens=24, max_layers=3).images(module, {}))
    assert list(images) == ["attention/self/layer_0", "attention/self/layer_1", "attention/self/layer_2"] + [
        "attention/cross/layer_0"
    ]
    assert model.training
    for image in images.values():
        assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
    assert images["attention/self/layer_0"].shape == images["attention/self/layer_2"].shape


def test_max_layers_zero_turns_the_maps_off_without_a_forward_pass(monkeypatch):
    from lit_transformer.engine import task_outputs as callbacks

    calls = []
    writer = SimpleNamespace(add_image=lambda *args, **kwargs: calls.append("image"))
    monkeypatch.setattr(callbacks, "_tensorboard", lambda trainer: writer)
    monkeypatch.setattr(callbacks, "_first_validation_batch", lambda trainer: calls.append("batch") or {})
    trainer = SimpleNamespace(sanity_checking=False)
    module = SimpleNamespace(tokenizer=object(), task=SimpleNamespace(attention=lambda *a: calls.append("forward")))
    AttentionMaps(max_layers=0).on_validation_epoch_end(trainer, module)
    assert calls == []


class _Ids:
    """A tokenizer stand-in: each id decodes to its number."""

    def decode(self, ids, skip_special_tokens=False) -> str:
        return str(ids[0])


@pytest.mark.parametrize("kind", ["encoder_only", "encoder_decoder", "decoder_only"])
def test_maps_of_the_first_tokens_are_the_models_weights_on_the_whole_sample_cut_to_them(kind: str):
    """max_tokens cuts what is drawn, not what the model reads: an encoder attends over the whole sample (its later
    tokens and eos), so its weights (and the cross-attention's) are the whole sample's, cut to the first tokens."""
    from lit_transformer.config import TransformerConfig
    from lit_transformer.model import Transformer
    from lit_transformer.tasks.base import Task
    from lit_transformer.tasks.translation import Translation

    torch.manual_seed(0)
    extra = {"encoder_only": {"head": "masked_lm", "mask_token_id": 3}}.get(kind, {})
    model = Transformer(TransformerConfig.preset("tiny", topology=kind, **extra)).eval()
    module = SimpleNamespace(model=model, config=model.config, device=torch.device("cpu"), tokenizer=_Ids(),
                             target_tokenizer=_Ids())  # fmt: skip
    ids = torch.randint(4, 128, (1, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids, dtype=torch.bool)
    n = 4
    with torch.no_grad():
        if kind == "encoder_decoder":
            tgt = ids[:, :7]
            batch = {"src": ids, "src_mask": mask, "tgt_in": tgt, "tgt_mask": torch.ones_like(tgt, dtype=torch.bool)}
            shown, axes = Translation().attention(module, batch, n)
            _, full = model(ids, tgt, src_mask=mask, return_attention=True)
            expected = {"encoder": (n, n), "self": (n, n), "cross": (n, n)}
        else:
            shown, axes = Task().attention(module, {"input_ids": ids, "attention_mask": mask}, n)
            _, full = model(ids, attention_mask=mask, return_attention=True)
            expected = {name: (n, n) for name in full}
    assert set(shown) == set(expected)
    for name, (queries, keys) in expected.items():
        assert [len(axis) for axis in axes[name]] == [queries, keys]
        for layer, weights in enumerate(shown[name]):
            torch.testing.assert_close(weights, full[name][layer][..., :queries, :keys], msg=f"{name} {layer}")


def test_a_cls_pooling_classifiers_maps_have_the_cls_token_on_both_axes():
    """pooling=cls: the model prepends [CLS], so the weights drawn are [CLS] and the first tokens, one label each
    (they were cut to the tokens alone while the labels had [CLS] too, and drawing them failed at validation)."""
    from lit_transformer.config import TransformerConfig
    from lit_transformer.model import Transformer
    from lit_transformer.tasks.classification import Classification

    torch.manual_seed(0)
    config = TransformerConfig.preset("tiny", topology="encoder_only", num_labels=3, pooling="cls", bos_token_id=1)
    model = Transformer(config).eval()
    module = SimpleNamespace(model=model, config=model.config, device=torch.device("cpu"), tokenizer=_Ids())
    ids = torch.randint(4, 128, (1, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids, dtype=torch.bool)
    n = 4
    with torch.no_grad():
        shown, axes = Classification().attention(module, {"input_ids": ids, "attention_mask": mask}, n)
        _, full = model(ids, attention_mask=mask, return_attention=True)
    queries, keys = axes["encoder"]
    assert queries == keys == ["[CLS]", *[str(i) for i in ids[0, :n].tolist()]]
    for layer, weights in enumerate(shown["encoder"]):
        torch.testing.assert_close(weights, full["encoder"][layer][..., : n + 1, : n + 1])
        heads_image(weights[0], queries, keys)  # drawable: one label per row and column
