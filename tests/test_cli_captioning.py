"""Image captioning through the CLI, as a user runs it: the digits preset fits, tests, shows its captions and the
attention over the image in TensorBoard, and predicts captions for a folder of images."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from _printed import printed_metrics
from _printed import scalars as _scalars
from test_cli import CONFIGS, ROOT, _cli

PRESET = str(CONFIGS / "presets" / "caption-digits.yaml")


@pytest.fixture(scope="module")
def caption_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("caption")
    _cli("fit", "--config", PRESET, *_small(run), cwd=ROOT)
    return run


def _small(run: Path) -> list[str]:
    """The preset on a few hundred strips and a narrow model: the plumbing, in seconds."""
    return [
        "--trainer.max_steps", "6", "--trainer.val_check_interval", "3", "--checkpoint.every_n_train_steps", "3",
        "--trainer.log_every_n_steps", "2",
        "--model.config.d_model", "32", "--model.config.d_ff", "64", "--model.config.n_layers", "1",
        "--data.init_args.strips", "[192, 16, 16]", "--data.init_args.batch_size", "8",
        "--data.init_args.cache_dir", str(run / "cache"), "--trainer.default_root_dir", str(run),
        "--trainer.logger.init_args.save_dir", str(run), "--checkpoint.dirpath", str(run / "checkpoints"),
    ]  # fmt: skip


def test_fit_logs_caption_metrics_and_images_with_attention(caption_run: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = {p.parent for p in caption_run.rglob("events.out.tfevents.*")}
    acc = EventAccumulator(str(events), size_guidance={"images": 0, "scalars": 0})
    acc.Reload()
    scalars, images = set(acc.Tags()["scalars"]), set(acc.Tags()["images"])
    assert {"val/loss", "val/ppl", "val/bleu", "val/exact_match", "train/loss"} <= scalars, sorted(scalars)
    assert {f"captions/{i}" for i in range(4)} <= images, sorted(images)  # image, captions, attention per word
    assert "attention/self/layer_0" in images
    # The values (each is checked against sacreBLEU and a hand count over all references in test_task_metrics.py):
    logged = _scalars(caption_run)
    for step in logged["val/ppl"]:  # validations at steps 3 and 6
        assert logged["val/ppl"][step] == pytest.approx(math.exp(logged["val/nll"][step]), rel=1e-5)
        assert 0.0 <= logged["val/bleu"][step] <= 100.0
        assert 16 * logged["val/exact_match"][step] == pytest.approx(round(16 * logged["val/exact_match"][step]))


def test_test_and_predict_on_a_folder_of_images(caption_run: Path, tmp_path: Path):
    from PIL import Image

    from lit_transformer.data.corpora.digits import digit_strips

    ckpt = ["--ckpt_path", str(caption_run / "checkpoints" / "last.ckpt")]
    out = _cli("test", "--config", PRESET, *_small(caption_run), *ckpt, cwd=ROOT).stdout
    metrics = printed_metrics(out)
    assert metrics["test/ppl"] == pytest.approx(math.exp(metrics["test/nll"]), rel=1e-5)
    assert 0.0 <= metrics["test/bleu"] <= 100.0
    assert 16 * metrics["test/exact_match"] == pytest.approx(round(16 * metrics["test/exact_match"]))  # of 16
    strips = digit_strips("test", 3)
    folder = tmp_path / "images"
    folder.mkdir()
    for i, image in enumerate(strips.images):
        Image.fromarray((image[0] * 255).astype("uint8")).save(folder / f"strip{i}.png")
    output = tmp_path / "captions.jsonl"
    predict = ["--data.init_args.predict_dir", str(folder), "--predictions.output", str(output)]
    _cli("predict", "--config", PRESET, *_small(caption_run), *ckpt, *predict, cwd=ROOT)
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert [r["image"] for r in rows] == ["strip0.png", "strip1.png", "strip2.png"]
    # Each caption is the checkpoint's own for its image (read as predict reads it), decoded as the preset says.
    import torch
    import yaml

    from lit_transformer.config import GenerationConfig
    from lit_transformer.data.captioning import load_image
    from lit_transformer.inference import load_model
    from lit_transformer.tasks import Captioning

    loaded = load_model(caption_run / "checkpoints" / "last.ckpt")
    generation = GenerationConfig.for_task(
        Captioning, **yaml.safe_load(Path(PRESET).read_text())["model"]["generation"]
    )
    images = torch.stack([load_image(folder / r["image"], (8, 48), 1) for r in rows])
    assert [r["caption"] for r in rows] == loaded.decode(loaded.model.eval().generate(images, generation))


def test_the_translation_task_refuses_an_image_source():
    from lit_transformer.config import TransformerConfig
    from lit_transformer.tasks import Captioning, Translation, default_task

    cfg = TransformerConfig.preset(
        "tiny", topology="encoder_decoder", source="patches", image_size=(8, 8), patch_size=4, image_channels=1
    )
    assert default_task(cfg) is Captioning
    with pytest.raises(ValueError, match="model.config.source tokens"):
        Translation().check_config(cfg)
    with pytest.raises(ValueError, match="reads images or features"):
        Captioning().check_config(cfg.replace(source="tokens", image_size=None))


def test_export_to_safetensors_and_int8_decoding(caption_run: Path, tmp_path: Path):
    """The safetensors export gives back the same model (same greedy captions); int8 layers decode it too."""
    import torch

    from lit_transformer.data.corpora.digits import digit_strips
    from lit_transformer.inference import load_model
    from lit_transformer.interop.native import load_safetensors
    from lit_transformer.transforms.int8 import quantize_int8

    ckpt = caption_run / "checkpoints" / "last.ckpt"
    _cli("export", "--checkpoint", str(ckpt), "--format", "safetensors", "--out", str(tmp_path / "export"), cwd=ROOT)
    images = torch.from_numpy(digit_strips("test", 4).images)
    original = load_model(ckpt).model.eval()
    exported = load_safetensors(tmp_path / "export").eval()
    expected = original.generate(images, max_new_tokens=6, num_beams=2)
    assert torch.equal(exported.generate(images, max_new_tokens=6, num_beams=2), expected)
    assert quantize_int8(exported).generate(images, max_new_tokens=6).shape[0] == 4
    # No ONNX graph takes images yet: said as such, before a folder is made (it blamed the data's image size)
    failed = _cli("export", "--checkpoint", str(ckpt), "--format", "onnx", "--out", str(tmp_path / "o"), cwd=ROOT,
                  ok=False)  # fmt: skip
    assert "--format onnx exports models of text; this one's encoder reads patches" in failed.stderr
    assert not (tmp_path / "o").exists()


def test_digit_strips_written_again_leave_no_earlier_strip_and_refuse_a_file(tmp_path: Path):
    """Written again with a smaller --count, the earlier strips past it stayed, captioned by predict on the folder
    though captions.csv no longer named them; an --out that is a file was a FileExistsError traceback."""
    out = tmp_path / "strips"
    _cli("digit-strips", "--out", str(out), "--count", "3", cwd=ROOT)
    (out / "mine.png").write_bytes(b"")  # a file of the user's is left alone
    _cli("digit-strips", "--out", str(out), "--count", "2", "--split", "train", cwd=ROOT)
    assert sorted(p.name for p in out.iterdir()) == ["captions.csv", "mine.png", "strip0.png", "strip1.png"]
    failed = _cli("digit-strips", "--out", str(out / "captions.csv"), cwd=ROOT, ok=False)
    assert "--out " + str(out / "captions.csv") + " is a file: the strips go to a folder" in failed.stderr


def test_references_longer_than_decoding_may_write_are_noted_once(monkeypatch):
    """The digits preset's max_new_tokens 8, kept for one's own captions (docs/data.md's command), cut every caption
    of a dozen words silently: exact match 0 and BLEU 78 with every teacher-forced token right. It is now said once."""
    from types import SimpleNamespace

    from tokenizers import Tokenizer, models, pre_tokenizers

    from lit_transformer.config import GenerationConfig
    from lit_transformer.tasks import captioning
    from lit_transformer.tasks.captioning import Captioning

    words = "a picture of red square on plain background seven two nine".split()
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["<unk>", *words])}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    notes: list[str] = []
    monkeypatch.setattr(captioning, "rank_zero_info", notes.append)
    digits = [["seven two nine"], ["nine nine two seven two seven"]]  # 6 words and eos: within 8
    long = [["a picture of a red square", "a picture of a red square on a plain background"]]  # 10 words
    for max_new_tokens, references, noted in ((8, digits, False), (11, long, False), (8, long, True)):
        task = Captioning()
        module = SimpleNamespace(generation=GenerationConfig(max_new_tokens=max_new_tokens), target_tokenizer=tokenizer)
        notes.clear()
        task._note_short_generation(module, references)
        task._note_short_generation(module, references)
        assert len(notes) == noted, notes
    assert "takes 10 tokens and its eos" in notes[0] and "--model.generation.max_new_tokens 11" in notes[0]
