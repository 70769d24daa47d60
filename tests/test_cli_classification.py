"""The encoder-only command line end to end: masked-LM pretraining, a classifier fine-tuned from it (init_from),
its metrics in TensorBoard, test, and predict writing a label and its probability per input line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from _printed import printed_metrics, scalars
from test_cli import CONFIGS, ROOT, _cli

TINY = ["--model.config.d_model", "32", "--model.config.n_heads", "2", "--model.config.n_layers", "1"]
TINY += ["--model.config.d_ff", "64", "--data.init_args.vocab_size", "512", "--data.init_args.batch_size", "8"]
SHORT = ["--trainer.max_steps", "4", "--trainer.val_check_interval", "4", "--trainer.limit_val_batches", "2"]
SHORT += [
    "--trainer.limit_test_batches",
    "2",
    "--trainer.num_sanity_val_steps",
    "0",
    "--trainer.log_every_n_steps",
    "1",
]


def _where(run: Path) -> list[str]:
    return [
        "--trainer.default_root_dir",
        str(run),
        "--trainer.logger.init_args.save_dir",
        str(run),
        "--checkpoint.dirpath",
        str(run / "checkpoints"),
        "--data.init_args.cache_dir",
        str(run.parent / "cache"),
    ]


def _scalars_and_images(run: Path) -> tuple[set[str], set[str]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = {p.parent for p in run.rglob("events.out.tfevents.*")}
    acc = EventAccumulator(str(events), size_guidance={"images": 0, "scalars": 0})
    acc.Reload()
    return set(acc.Tags()["scalars"]), set(acc.Tags()["images"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("encoder")
    mlm = CONFIGS / "presets" / "mlm.yaml"
    _cli("fit", "--config", str(mlm), *TINY, *SHORT, *_where(root / "mlm"), cwd=ROOT)
    genre = CONFIGS / "presets" / "classify-genre.yaml"
    init = ["--model.init_from", str(root / "mlm" / "checkpoints" / "last.ckpt"), "--model.config.d_model", "48"]
    _cli("fit", "--config", str(genre), *TINY, *init[:2], *SHORT, *_where(root / "genre"), cwd=ROOT)
    return root


def test_masked_lm_logs_accuracy_and_perplexity(runs: Path):
    logged = scalars(runs / "mlm")
    assert {"train/loss", "val/loss", "val/accuracy", "val/ppl"} <= set(logged), sorted(logged)
    (step,) = logged["val/ppl"]
    assert logged["val/ppl"][step] == pytest.approx(math.exp(logged["val/nll"][step]), rel=1e-5)
    assert 0.0 <= logged["val/accuracy"][step] <= 1.0


def test_fine_tuning_loads_the_pretrained_encoder_and_a_fresh_head(runs: Path):
    from lit_transformer.checkpoints.files import load_checkpoint
    from lit_transformer.config import TransformerConfig
    from lit_transformer.interop.pretrained import load_pretrained_encoder

    mlm_path = runs / "mlm" / "checkpoints" / "last.ckpt"
    mlm = load_checkpoint(mlm_path)
    clf = load_checkpoint(runs / "genre" / "checkpoints" / "last.ckpt")
    config = clf["hyper_parameters"]["config"]
    assert config["topology"] == "encoder_only" and config["head"] == "classification"
    assert config["d_model"] == 32 and config["num_labels"] == 3  # the architecture is the pretrained one's
    assert clf["hyper_parameters"]["init_from"] is None and clf["init_from"] == str(mlm_path)
    assert clf["label_names"] == ["comedy", "history", "tragedy"]
    model, tokenizer = load_pretrained_encoder(str(mlm_path), TransformerConfig(**config))
    assert tokenizer == mlm["tokenizer"] == clf["tokenizer"]
    state = model.state_dict()
    encoder = [k for k in state if k.startswith(("src_embed.", "encoder_blocks."))]
    assert encoder and all(torch.equal(state[k], mlm["state_dict"][f"model.{k}"]) for k in encoder)
    assert not any(k.startswith("model.classifier.") for k in mlm["state_dict"])


def test_classifier_logs_f1_per_class_and_a_confusion_matrix(runs: Path):
    """The values, not only the names: val/f1 is the macro F1, the mean of the per-class F1s logged beside it (the
    values themselves are checked against scikit-learn in tests/test_task_metrics.py)."""
    _, images = _scalars_and_images(runs / "genre")
    assert "val/confusion_matrix" in images, images
    logged = scalars(runs / "genre")
    (step,) = logged["val/f1"]  # one validation, at the last step
    per_class = [logged[f"val/f1/{name}"][step] for name in ("comedy", "history", "tragedy")]
    assert logged["val/f1"][step] == pytest.approx(sum(per_class) / 3, abs=1e-6)
    assert all(0.0 <= v <= 1.0 for v in [*per_class, logged["val/accuracy"][step]])
    assert logged["val/nll"][step] > 0
    (best,) = (runs / "genre" / "checkpoints").glob("best-*.ckpt")  # the metric's name apart from its value
    assert best.name.startswith("best-step") and best.name.endswith(f"-val_f1_{logged['val/f1'][step]:.3f}.ckpt")


def test_test_and_predict_report_labels(runs: Path):
    genre = ["--config", str(CONFIGS / "presets" / "classify-genre.yaml"), *_where(runs / "genre"), *TINY[-4:]]
    genre += ["--trainer.logger", "false", "--ckpt_path", str(runs / "genre" / "checkpoints" / "last.ckpt")]
    out = _cli("test", *genre, "--trainer.limit_test_batches", "2", cwd=runs).stdout
    metrics = printed_metrics(out)
    per_class = [metrics[f"test/f1/{name}"] for name in ("comedy", "history", "tragedy")]
    assert metrics["test/f1"] == pytest.approx(sum(per_class) / 3, abs=1e-6)  # macro: the mean over classes
    assert 0.0 <= metrics["test/accuracy"] <= 1.0 and metrics["test/nll"] > 0
    lines = ["O Romeo, Romeo, wherefore art thou Romeo?", "", "Once more unto the breach, dear friends"]
    (runs / "lines.txt").write_text("\n".join(lines) + "\n")
    output = runs / "labels.jsonl"
    args = ["--data.init_args.predict_file", "lines.txt", "--predictions.output", str(output)]
    _cli("predict", *genre, *args, cwd=runs)
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert [r["input"] for r in rows] == lines
    for row in rows:
        assert row["label"] in ("comedy", "history", "tragedy")
        assert row["probability"] == max(row["probabilities"].values())
        assert row["label"] == max(row["probabilities"], key=row["probabilities"].get)
        assert sum(row["probabilities"].values()) == pytest.approx(1.0, abs=1e-5)
    # The checkpoint's classes and tokenizer are all predict needs: the same rows without the training data.
    gone = [*genre, "--data.init_args.dataset", str(runs / "gone.jsonl")]
    _cli("predict", *gone, *args[:2], "--predictions.output", str(runs / "labels-nodata.jsonl"), cwd=runs)
    assert (runs / "labels-nodata.jsonl").read_text() == output.read_text()
    # A CSV's text column, not its raw lines (the header "text,label" was classified as an input, each row with its
    # quotes and label)
    rows = ["text,label", *(f'"{line}",comedy' for line in lines)]
    (runs / "lines.csv").write_text("\n".join(rows) + "\n")
    args = ["--data.init_args.predict_file", "lines.csv", "--predictions.output", str(runs / "labels-csv.jsonl")]
    _cli("predict", *genre, *args, cwd=runs)
    assert (runs / "labels-csv.jsonl").read_text() == output.read_text()


def test_predict_with_a_masked_lm_is_refused_before_anything_is_read_or_written(runs: Path):
    """It refused at the first batch, after the data had been read and its output file emptied."""
    (runs / "keep.jsonl").write_text("kept\n")
    mlm = ["--config", str(CONFIGS / "presets" / "mlm.yaml"), *_where(runs / "mlm"), *TINY[-4:]]
    mlm += ["--ckpt_path", str(runs / "mlm" / "checkpoints" / "last.ckpt"), "--data.init_args.predict_file", "k.txt"]
    (runs / "k.txt").write_text("a line\n")
    result = _cli("predict", *mlm, "--predictions.output", str(runs / "keep.jsonl"), cwd=runs, ok=False)
    assert "a masked LM has no labels to predict: fine-tune it into a classifier" in result.stderr, result.stderr
    assert "--model.init_from " + str(runs / "mlm" / "checkpoints" / "last.ckpt") in result.stderr
    assert (runs / "keep.jsonl").read_text() == "kept\n"


def _labelled_folder(folder: Path, labels: list[str]) -> Path:
    """train/validation/test CSVs of Shakespeare-like lines under `labels`, in turn."""
    folder.mkdir()
    lines = ["O Romeo, Romeo, wherefore art thou Romeo?", "Once more unto the breach, dear friends", "To be, or not"]
    for split, n in (("train", 24), ("validation", 6), ("test", 6)):
        rows = ["text,label"] + [f'"{lines[i % 3]} {i}",{labels[i % len(labels)]}' for i in range(n)]
        (folder / f"{split}.csv").write_text("\n".join(rows) + "\n")
    return folder


def test_evaluation_scores_the_checkpoints_classes_on_data_that_holds_fewer(runs: Path, tmp_path: Path):
    """A classifier scored on another dataset: its classes (and their ids) are the checkpoint's, not the ones this
    data's training split holds (two of the three here: another number of outputs, or, were there three, other
    meanings for the same ids)."""
    from lit_transformer.cli.lightning_cli import run_cli

    folder = _labelled_folder(tmp_path / "two", ["tragedy", "comedy"])
    genre = ["--config", str(CONFIGS / "presets" / "classify-genre.yaml"), *TINY[-4:], "--trainer.logger", "false"]
    genre += ["--data.init_args.dataset", str(folder), "--data.init_args.cache_dir", str(tmp_path / "cache")]
    genre += ["--ckpt_path", str(runs / "genre" / "checkpoints" / "last.ckpt")]
    cli = run_cli(["test", *genre])
    assert cli.datamodule.label_names == ["comedy", "history", "tragedy"]
    assert {"test/f1/comedy", "test/f1/history", "test/f1/tragedy"} <= set(cli.trainer.callback_metrics)
    refused = _cli("test", *genre, "--data.init_args.label_names", '["tragedy", "comedy"]', cwd=tmp_path, ok=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert 'is a classifier of the classes ["comedy", "history", "tragedy"] (in id order)' in refused.stderr
    # Resuming on data of other classes is refused before any step (its tokenizer kept, so that the classes differ).
    checkpoint = str(runs / "genre" / "checkpoints" / "last.ckpt")
    resume = [*genre[:-2], "--data.init_args.tokenizer", checkpoint, "--checkpoint.dirpath", str(tmp_path / "ckpt")]
    refused = _cli("fit", *resume, "--ckpt_path", checkpoint, cwd=tmp_path, ok=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert 'but this run\'s data gives ["comedy", "tragedy"]: its outputs would mean other classes' in refused.stderr
    assert not (tmp_path / "ckpt").exists()
    # Data labelled with a class the classifier does not know is refused, naming it (its ids would be another class's).
    other = _labelled_folder(tmp_path / "other", ["tragedy", "poem", "comedy"])
    refused = _cli("test", *genre, "--data.init_args.dataset", str(other), cwd=tmp_path, ok=False)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert "label 'poem' is not one of the label names ['comedy', 'history', 'tragedy']" in refused.stderr
    assert "a checkpoint knows only its classes" in refused.stderr


@pytest.mark.parametrize("multi_label", [True, False])
def test_classification_metrics_count_the_labels_predict_gives(multi_label: bool) -> None:
    """Logits that all lie in [0, 1] are still logits: torchmetrics' Multilabel* metrics read such preds as
    probabilities and thresholded the logit at 0.5 (a probability of 0.62), while predict thresholds sigmoid(logit)
    at 0.5. The task's metrics agree with sklearn on predict's labels (multi-class: the argmax, either way)."""
    from types import SimpleNamespace

    from sklearn.metrics import accuracy_score, f1_score

    from lit_transformer.tasks import Classification
    from lit_transformer.tasks.base import Loss

    task = Classification(multi_label=multi_label)
    task.build_metrics(SimpleNamespace(num_labels=2))
    logits = torch.tensor([[0.3, 0.8], [0.2, 0.1], [0.6, 0.55]])
    if multi_label:
        labels = torch.tensor([[1, 1], [1, 0], [0, 1]])
        predicted = (logits.sigmoid() > 0.5).long()  # predict's rule: every label here
        truth, guess = labels.flatten(), predicted.flatten()  # accuracy is element-wise (1 - Hamming loss)
    else:
        labels = torch.tensor([1, 0, 1])
        predicted = guess = logits.softmax(dim=-1).argmax(dim=-1)
        truth = labels
    zero = torch.tensor(0.0)
    logged = {}
    module = SimpleNamespace(log=lambda name, value, **kwargs: logged.__setitem__(name, value))
    task.update_metrics(module, "val", Loss(zero, zero, zero, logits, labels))
    assert float(logged["val/f1"].compute()) == pytest.approx(f1_score(labels, predicted, average="macro"))
    assert float(logged["val/accuracy"].compute()) == pytest.approx(accuracy_score(truth, guess))


@pytest.mark.parametrize(("trained", "given"), [(True, False), (False, True), (True, True), (False, False)])
def test_evaluation_reads_the_data_multi_label_as_the_checkpoint_was_trained(trained: bool, given: bool) -> None:
    """validate, test and predict of a multi-label checkpoint without --data.init_args.multi_label true read its label
    lists as single labels and ended on "label ['music'] is not one of the label names ['music', ...]" (a single-label
    checkpoint given multi_label true: a gather traceback); the checkpoint decides, as it does the label names."""
    from lit_transformer.data import ClassificationDataModule

    task = {"class_path": "lit_transformer.tasks.classification.Classification", "init_args": {"multi_label": trained}}
    checkpoint = {"hyper_parameters": {"task": task}, "label_names": ["music", "politics"]}
    args = {"tokenizer": "my_tokenizer.json", "multi_label": given}
    changed = ClassificationDataModule.trained_args(args, checkpoint, "clf.ckpt")
    assert changed.get("multi_label", given) is trained
    assert changed["label_names"] == ["music", "politics"]


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_a_cls_classifier_needs_a_position_for_its_cls_token_before_training(pooling: str) -> None:
    """pooling=cls prepends [CLS] to max_length tokens: max_length=max_seq_len passed the check before training and
    the run failed mid-training at the first passage of max_length tokens ("A sequence of 130 positions exceeds")."""
    from jsonargparse import Namespace

    from lit_transformer.cli.lightning_cli import set_once
    from lit_transformer.errors import ConfigError

    def config(max_length: int) -> Namespace:
        data = Namespace(class_path="lit_transformer.data.ClassificationDataModule",
                         init_args=Namespace(max_length=max_length))  # fmt: skip
        architecture = {"topology": "encoder_only", "head": "classification", "pooling": pooling,
                        "positions": "learned", "max_seq_len": 129}  # fmt: skip
        return Namespace(data=data, model=Namespace(config=Namespace(**architecture)))

    set_once(config(128))  # the preset's: 128 tokens and [CLS]
    if pooling == "cls":
        with pytest.raises(ConfigError, match=r"max_length=129 needs 130 positions \(with the \[CLS\] token"):
            set_once(config(129))
    else:
        set_once(config(129))
