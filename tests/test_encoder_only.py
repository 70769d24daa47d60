"""Encoder-only Transformers: the classifier and the masked LM, across the variant matrix on tiny dimensions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from model_variants import ENCODER_VARIANTS, FIRST_TOKEN, build, single_thread, tokens, variant_id  # noqa: F401 (autouse fixture)

from lit_transformer.config import TransformerConfig
from lit_transformer.model import Transformer
from lit_transformer.tasks.losses import IGNORE_INDEX, classification_loss
from lit_transformer.tasks.masked_lm import mask_tokens

POOLINGS = ("mean", "cls", "max")
MASK_ID = 4


def classifier(variant: dict, pooling: str = "mean", **overrides) -> Transformer:
    return build(variant, num_labels=3, pooling=pooling, **overrides)


def masked_lm(variant: dict, **overrides) -> Transformer:
    return build(variant, head="masked_lm", mask_token_id=MASK_ID, **overrides)


def padded(x: torch.Tensor, pad: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x (1, T) padded with `pad` tokens of a value a real token may have (id 7), and its mask."""
    filler = torch.full((1, pad), 7)
    ids = torch.cat([filler, x] if left else [x, filler], dim=1)
    mask = torch.cat(
        [torch.zeros(1, pad), torch.ones_like(x)] if left else [torch.ones_like(x), torch.zeros(1, pad)], 1
    )
    return ids, mask.bool()


@pytest.mark.parametrize("pooling", POOLINGS)
@pytest.mark.parametrize("variant", ENCODER_VARIANTS, ids=variant_id)
def test_a_padded_row_classifies_exactly_as_it_does_alone(variant: dict, pooling: str):
    model = classifier(variant, pooling)
    x = tokens(1, 9)
    alone = model(x)
    assert alone.shape == (1, 3)
    for left in (False, True):
        ids, mask = padded(x, 5, left)
        batch = torch.cat([ids, tokens(1, 14, seed=3)])
        both = torch.cat([mask, torch.ones(1, 14, dtype=torch.bool)])
        torch.testing.assert_close(model(batch, attention_mask=both)[:1], alone, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("variant", ENCODER_VARIANTS[::4], ids=variant_id)
def test_masked_lm_logits_of_real_tokens_ignore_padding(variant: dict):
    model = masked_lm(variant)
    x = tokens(1, 9)
    ids, mask = padded(x, 4, left=False)
    logits = model(ids, attention_mask=mask)
    assert logits.shape == (1, 13, 128)
    torch.testing.assert_close(logits[:, :9], model(x), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("variant", ENCODER_VARIANTS, ids=variant_id)
def test_attention_is_bidirectional(variant: dict):
    """Changing the last token changes the first position's output (a causal model would not)."""
    model = masked_lm(variant)
    x = tokens(1, 10)
    y = x.clone()
    y[0, -1] = FIRST_TOKEN if x[0, -1] != FIRST_TOKEN else FIRST_TOKEN + 1
    assert not torch.allclose(model(x)[0, 0], model(y)[0, 0])
    clf = classifier(variant, "cls")  # the [CLS] output sees every token
    assert not torch.allclose(clf(x), clf(y))


def test_the_masked_lm_output_is_tied_to_the_embedding_and_the_classifier_has_no_token_output():
    variant = {**ENCODER_VARIANTS[0], "tie_embeddings": True}
    mlm = masked_lm(variant)
    assert mlm.lm_head.weight is mlm.src_embed.weight
    clf = classifier(variant)
    assert clf.lm_head is None and clf.classifier.out.out_features == 3
    assert [type(m).__name__ for m in clf.classifier.children()][:1] == ["Linear"]
    with pytest.raises(TypeError, match="does not generate"):
        clf.generate(tokens(1, 4))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"num_labels": None}, "needs num_labels"),
        ({"head": "masked_lm"}, "needs mask_token_id.*--data.init_args.mask_token true"),
        ({"pooling": "cls", "bos_token_id": None}, "set bos_token_id"),
        ({"target_vocab_size": 64}, "encoder_decoder' only"),
        ({"pooling": "sum"}, "pooling='sum'"),
    ],
)
def test_invalid_encoder_configs_fail_naming_the_fields(fields: dict, message: str):
    base = dict(topology="encoder_only", num_labels=3)
    with pytest.raises(ValueError, match=message):
        TransformerConfig.preset("tiny", **{**base, **fields})


def test_masking_follows_berts_rule():
    """15% of real, non-special tokens are targets; of those 80% become [MASK], 10% random, 10% unchanged."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(FIRST_TOKEN + 2, 1000, (256, 512), generator=generator)
    x[:, ::50] = 2  # EOS: special, never a target
    mask = torch.ones_like(x, dtype=torch.bool)
    mask[:, 400:] = False  # padding: never a target
    inputs, labels = mask_tokens(
        x, MASK_ID, 1000, attention_mask=mask, special_ids=[0, 1, 2, MASK_ID], generator=generator
    )
    chosen = labels != IGNORE_INDEX
    eligible = mask & (x != 2)
    assert not chosen[~eligible].any()
    assert chosen.sum() / eligible.sum() == pytest.approx(0.15, abs=0.005)
    assert torch.equal(labels[chosen], x[chosen])
    assert torch.equal(inputs[~chosen], x[~chosen])
    n = chosen.sum()
    masked = (inputs[chosen] == MASK_ID).sum() / n
    unchanged = (inputs[chosen] == x[chosen]).sum() / n
    randomised = 1 - masked - unchanged
    assert masked == pytest.approx(0.8, abs=0.01)
    assert unchanged == pytest.approx(0.1 + 0.1 / 1000, abs=0.01)  # a random draw may give the same token back
    assert randomised == pytest.approx(0.1, abs=0.01)


def test_classification_loss_matches_torch():
    logits = torch.randn(16, 5, generator=torch.Generator().manual_seed(0))
    labels = torch.randint(5, (16,), generator=torch.Generator().manual_seed(1))
    weights = torch.tensor([1.0, 2.0, 0.5, 1.0, 3.0])
    loss, nll, count = classification_loss(logits, labels, smoothing=0.1, class_weights=weights)
    assert loss / count == pytest.approx(float(F.cross_entropy(logits, labels, weight=weights, label_smoothing=0.1)))
    assert count == pytest.approx(float(weights[labels].sum()))
    loss, nll, count = classification_loss(logits, labels)
    assert loss / count == pytest.approx(float(F.cross_entropy(logits, labels)))
    targets = (torch.rand(16, 5, generator=torch.Generator().manual_seed(2)) > 0.5).float()
    loss, nll, count = classification_loss(logits, targets, multi_label=True)
    assert count == 16
    assert loss / (count * 5) == pytest.approx(float(F.binary_cross_entropy_with_logits(logits, targets)))


@pytest.mark.parametrize("pooling", POOLINGS)
def test_a_tiny_classifier_learns_a_separable_task(pooling: str):
    """Rows of random tokens, padded to varied lengths; the class is which of two marker tokens the row holds."""
    torch.manual_seed(0)
    model = Transformer(
        TransformerConfig.preset("tiny", topology="encoder_only", num_labels=2, pooling=pooling, max_seq_len=32)
    )
    generator = torch.Generator().manual_seed(0)

    def batch(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = torch.randint(10, 128, (n, 16), generator=generator)
        y = torch.randint(2, (n,), generator=generator)
        lengths = torch.randint(4, 17, (n,), generator=generator)
        where = (torch.rand(n, generator=generator) * (lengths - 1)).long()
        x[torch.arange(n), where] = 5 + y  # the marker: token 5 or token 6
        mask = torch.arange(16)[None] < lengths[:, None]
        return x.masked_fill(~mask, 0), mask, y

    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        x, mask, y = batch(32)
        loss = F.cross_entropy(model(x, attention_mask=mask), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    x, mask, y = batch(512)
    with torch.no_grad():
        accuracy = (model(x, attention_mask=mask).argmax(-1) == y).float().mean()
    assert accuracy > 0.95


@pytest.mark.parametrize("head", ["classification", "masked_lm"])
def test_onnx_export_matches_pytorch_with_padding(tmp_path, head: str):
    ort = pytest.importorskip("onnxruntime")
    from lit_transformer.interop import export_onnx

    variant = ENCODER_VARIANTS[0]
    model = classifier(variant, "cls") if head == "classification" else masked_lm(variant)
    path = export_onnx(model, tmp_path / "model.onnx")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch, length in ((3, 11), (1, 5)):
        x = tokens(batch, length, seed=length)
        mask = torch.ones(batch, length, dtype=torch.bool)
        mask[-1, length // 2 :] = False
        out = session.run(None, {"input_ids": x.numpy(), "attention_mask": mask.numpy()})[0]
        with torch.no_grad():
            expected = model(x, attention_mask=mask)
        torch.testing.assert_close(torch.from_numpy(out), expected, atol=1e-5, rtol=1e-5)


def test_balanced_class_weights_come_from_the_training_label_counts():
    from types import SimpleNamespace

    from lit_transformer.engine.lightning_module import LitTransformer
    from lit_transformer.tasks import Classification

    config = TransformerConfig.preset("tiny", topology="encoder_only", num_labels=3)
    module = LitTransformer(config, task=Classification(class_weights="balanced"))
    module.task.attach(module, {"label_counts": lambda: [10, 30, 60]})
    torch.testing.assert_close(module.task._weights, torch.tensor([100 / 30, 100 / 90, 100 / 180]))
    with pytest.raises(ValueError, match="2 values for num_labels=3"):
        task = LitTransformer(config, task=Classification(class_weights=[1.0, 2.0])).task
        task.attach(SimpleNamespace(config=config), {})


@pytest.mark.parametrize("weights", [[1.0, -1.0, 1.0], [1.0, float("nan"), 1.0], [1.0, float("inf"), 1.0]])
def test_a_negative_or_non_finite_class_weight_is_refused_naming_the_key(weights: list[float]):
    """A negative weight makes the loss push that class's probability down (torch's cross_entropy takes it silently);
    nan or inf turn every step's loss into nan."""
    from lit_transformer.errors import ConfigError
    from lit_transformer.tasks import Classification

    with pytest.raises(ConfigError, match="class_weights=.*finite number >= 0"):
        Classification(class_weights=weights)
    Classification(class_weights=[0.0, 1.0, 2.5])  # a zero weight (a class left out of the loss) stays allowed


def test_a_masked_lm_trains_on_packed_language_model_blocks(tmp_path):
    """With mask_token, the language-model data serves masked-LM pretraining: its blocks are the inputs, and the
    loss is taken at the masked positions only (about 15% of the tokens), never at its next-token labels."""
    from lit_transformer.data import LanguageModelingDataModule
    from lit_transformer.engine.lightning_module import LitTransformer

    text = tmp_path / "corpus.txt"
    text.write_text("to be or not to be, that is the question.\n" * 400)
    data = LanguageModelingDataModule(
        dataset=str(text),
        tokenizer="char",
        vocab_size=64,
        block_size=32,
        batch_size=8,
        mask_token=True,
        cache_dir=str(tmp_path / "cache"),
    )
    assert data.mask_token_id == data.vocab_size - 1
    config = TransformerConfig.preset(
        "tiny",
        topology="encoder_only",
        head="masked_lm",
        vocab_size=data.vocab_size,
        mask_token_id=data.mask_token_id,
        pad_token_id=data.pad_token_id,
    )
    module = LitTransformer(config)
    batch = next(iter(data.train_dataloader()))
    torch.manual_seed(0)
    loss, nll, count, logits, labels = module.task.loss(module.model, batch)
    assert logits.shape == (*batch["input_ids"].shape, data.vocab_size)
    assert count == (labels != IGNORE_INDEX).sum() and 0.08 < count / labels.numel() < 0.22
    assert torch.equal(labels[labels != IGNORE_INDEX], batch["input_ids"][labels != IGNORE_INDEX])
    expected = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
    assert float(loss / count) == pytest.approx(float(expected), rel=1e-5)
