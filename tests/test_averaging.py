"""Checkpoint averaging: the mean of weights, which checkpoints it takes, what it refuses, and that the result is a
checkpoint every command reads. EMA of weights through Lightning's own callback, and `average --weights trained`."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
import torch

from lit_transformer.checkpoints.averaging import average_checkpoints, parse_steps, select_checkpoints
from lit_transformer.checkpoints.files import CheckpointError, load_checkpoint
from lit_transformer.cli.model_commands import average_main
from lit_transformer.config import TransformerConfig
from lit_transformer.data.text import train_tokenizer
from lit_transformer.errors import ConfigError
from lit_transformer.inference import load_model
from lit_transformer.model import Transformer

ROOT = Path(__file__).resolve().parents[1]
TINY_TRANSLATE = ROOT / "configs" / "presets" / "tiny-translate.yaml"
CONFIG = TransformerConfig(vocab_size=104, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=32, pad_token_id=0)


@pytest.fixture(scope="module")
def tokenizer_json() -> str:
    return train_tokenizer([string.printable * 3], kind="char", vocab_size=128).to_str()


def _write(path: Path, step: int, tokenizer: str, config: TransformerConfig = CONFIG, seed: int | None = None) -> Path:
    """A checkpoint as `fit` writes it (weights under model., config in hyper_parameters, the tokenizer as JSON)."""
    torch.manual_seed(step if seed is None else seed)
    state = {f"model.{k}": v for k, v in Transformer(config).state_dict().items()}
    checkpoint = {
        "global_step": step,
        "state_dict": state,
        "hyper_parameters": {"config": config},
        "tokenizer": tokenizer,
        "optimizer_states": [{"state": {}}],
    }
    torch.save(checkpoint, path)
    return path


def test_the_average_of_checkpoints_is_their_element_wise_mean(tmp_path, tokenizer_json):
    """Four checkpoints with distinct weights: the exact mean (a sum over two, or a division by two, fails)."""
    steps = (100, 200, 300, 400)
    paths = [_write(tmp_path / f"{step}.ckpt", step, tokenizer_json) for step in steps]
    averaged = average_checkpoints(paths)
    states = [torch.load(p)["state_dict"] for p in paths]
    assert set(averaged["state_dict"]) == set(states[0])
    for name, value in averaged["state_dict"].items():
        assert value.dtype == states[0][name].dtype
        exact = (sum(s[name].double() for s in states) / len(states)).to(value.dtype)
        # fp32 sums of four values round at most a few ulps of the largest: 1e-6 relative, far below any wrong count.
        torch.testing.assert_close(value, exact, rtol=1e-6, atol=1e-7)
    # Everything a loader needs, and no training state to resume from by mistake.
    assert averaged["tokenizer"] == tokenizer_json and averaged["global_step"] == 400
    assert "optimizer_states" not in averaged
    assert [e["step"] for e in averaged["averaged_from"]] == list(steps)
    assert average_checkpoints(paths[::-1])["global_step"] == 400  # the newest's metadata, whatever the order


def test_tied_float64_weights_are_averaged_once(tmp_path, tokenizer_json):
    """A float64 run (precision 64-true) with tied embeddings: .double() returned the first checkpoint's tensor
    itself, shared by the tied names, so each name added the others' weights to it again ((w1 + 3 w2) / 2)."""
    config = CONFIG.replace(tie_embeddings=True)
    paths = []
    for step in (100, 200):
        torch.manual_seed(step)
        model = Transformer(config).double()
        state = {f"model.{k}": v for k, v in model.state_dict(keep_vars=False).items()}
        torch.save({"global_step": step, "state_dict": state, "hyper_parameters": {"config": config},
                    "tokenizer": tokenizer_json}, tmp_path / f"{step}.ckpt")  # fmt: skip
        paths.append(tmp_path / f"{step}.ckpt")
    states = [torch.load(p)["state_dict"] for p in paths]
    averaged = average_checkpoints(paths)["state_dict"]
    for name, value in averaged.items():
        torch.testing.assert_close(value, (states[0][name] + states[1][name]) / 2, rtol=0, atol=1e-12, msg=name)


def test_the_translation_recipe_refuses_a_run_without_an_ema(tmp_path, tokenizer_json):
    """translation-recipe on a run trained without EMAWeightAveraging printed an `ema` row: the last checkpoint's
    weights scored again under the EMA's name. Refused before anything is written, naming the callback."""
    from lit_transformer.recipes import translation_recipe

    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    for step in (100, 200):
        _write(tmp_path / "run" / "checkpoints" / f"step{step:06d}.ckpt", step, tokenizer_json)
    argv = ["--run", str(tmp_path / "run"), "--config", str(TINY_TRANSLATE), "--last", "2"]
    with pytest.raises(ConfigError, match="holds no EMA(.|\n)*EMAWeightAveraging"):
        translation_recipe.main(argv)
    assert not (tmp_path / "run" / "recipe").exists()


@pytest.mark.parametrize("value", [4.2e-05, 3.5e16, 0.0312, 33.77, float("inf")])
def test_the_translation_recipe_reads_the_metrics_test_prints(value):
    """Lightning prints a metric as str(float): a BLEU of 4.2e-05 was read as 4.2, a perplexity of 3.5e+16 as 3.5."""
    from lit_transformer.recipes.translation_recipe import _metric

    table = f"│         test/bleu         │    {value}     │\n│         test/ppl          │    7.11     │"
    assert _metric(table, "test/bleu") == value and _metric(table, "test/ppl") == 7.11


def test_a_mismatched_architecture_is_refused_naming_the_fields(tmp_path, tokenizer_json):
    a = _write(tmp_path / "a.ckpt", 100, tokenizer_json)
    b = _write(tmp_path / "b.ckpt", 200, tokenizer_json, CONFIG.replace(d_model=32, d_ff=64))
    with pytest.raises(CheckpointError, match=r"different architectures(.|\n)*d_ff: (.|\n)*d_model: checkpoint 16"):
        average_checkpoints([a, b])
    other_tokenizer = train_tokenizer([string.ascii_letters * 3], kind="char", vocab_size=128).to_str()
    c = _write(tmp_path / "c.ckpt", 300, other_tokenizer)
    with pytest.raises(CheckpointError, match="different tokenizers"):
        average_checkpoints([a, c])


def test_checkpoints_are_chosen_by_last_n_and_by_step_range_once_per_step(tmp_path, tokenizer_json):
    for step in (100, 200, 300, 400):
        _write(tmp_path / f"step{step:06d}.ckpt", step, tokenizer_json)
    _write(tmp_path / "last.ckpt", 400, tokenizer_json)  # the same step twice counts once
    torch.save(average_checkpoints([tmp_path / "last.ckpt"]), tmp_path / "avg.ckpt")  # an earlier average: skipped
    names = lambda paths: [p.name for p in paths]  # noqa: E731
    assert names(select_checkpoints([tmp_path], last=2)) == ["step000300.ckpt", "step000400.ckpt"]
    assert names(select_checkpoints([tmp_path], steps=(200, 300))) == ["step000200.ckpt", "step000300.ckpt"]
    assert names(select_checkpoints([tmp_path / "step000100.ckpt", tmp_path / "last.ckpt"])) == [
        "step000100.ckpt",
        "last.ckpt",
    ]
    assert parse_steps("200:") == (200, 2**62) and parse_steps(":300") == (0, 300)
    with pytest.raises(ValueError, match="more checkpoints than there are"):
        select_checkpoints([tmp_path], last=9)
    with pytest.raises(ValueError, match="write FIRST:LAST"):
        parse_steps("200-300")
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        select_checkpoints([tmp_path / "missing"])


def test_the_command_writes_a_checkpoint_that_generate_loads(tmp_path, tokenizer_json, capsys):
    for step in (10, 20, 30):
        _write(tmp_path / f"step{step:06d}.ckpt", step, tokenizer_json)
    average_main(["--checkpoints", str(tmp_path), "--last", "2", "--output", str(tmp_path / "avg" / "avg.ckpt")])
    assert "the mean of 2 checkpoints" in capsys.readouterr().out
    average_main(["--checkpoints", str(tmp_path), "--last", "1", "--output", str(tmp_path / "one.ckpt")])
    assert "its weights are step000030.ckpt (step 30) alone, the one step found: nothing was averaged" in (
        capsys.readouterr().out
    )
    loaded = load_model(tmp_path / "avg" / "avg.ckpt")
    expected = (load_checkpoint(tmp_path / "step000020.ckpt")["state_dict"]["model.lm_head.weight"] * 0.5) + (
        load_checkpoint(tmp_path / "step000030.ckpt")["state_dict"]["model.lm_head.weight"] * 0.5
    )
    torch.testing.assert_close(loaded.model.lm_head.weight, expected)
    assert loaded.model.generate(torch.tensor([loaded.encode("ab")]), max_new_tokens=3).shape == (1, 3)
    with pytest.raises(ConfigError, match="--last 5 asks for more checkpoints"):
        average_main(["--checkpoints", str(tmp_path), "--last", "5", "--output", str(tmp_path / "x.ckpt")])


def _run(*args: str) -> None:
    from lit_transformer.cli.lightning_cli import run_cli

    run_cli([*args, "--trainer.logger", "false", "--trainer.enable_progress_bar", "false"])


@pytest.fixture(scope="module")
def ema_run(tmp_path_factory) -> Path:
    """One tiny translation run with Lightning's EMAWeightAveraging, a step checkpoint every 10 steps kept, and the
    best checkpoint chosen by validation BLEU (mode max)."""
    run = tmp_path_factory.mktemp("ema_run")
    ema = ["--trainer.callbacks+=lightning.pytorch.callbacks.EMAWeightAveraging", "--trainer.callbacks.decay", "0.5"]
    steps = ["--checkpoint.save_top_k", "-1", "--checkpoint.filename", "step{step:06d}"]
    steps += ["--checkpoint.auto_insert_metric_name", "false", "--checkpoint.dirpath", str(run / "checkpoints")]
    best = ["--best_checkpoint.monitor", "val/bleu", "--best_checkpoint.mode", "max"]
    best += ["--best_checkpoint.filename", "best-bleu{val/bleu:.2f}"]
    _run("fit", *_common(run), *steps, *ema, *best, "--model.generation.max_new_tokens", "8")
    return run


def _common(run: Path) -> list[str]:
    return ["--config", str(TINY_TRANSLATE), "--data.init_args.cache_dir", str(run / "cache")]


def test_ema_checkpoints_hold_the_ema_in_state_dict_and_the_trained_weights_beside_it(ema_run):
    last = load_checkpoint(ema_run / "checkpoints" / "step000020.ckpt")
    ema_w, trained = last["state_dict"]["model.lm_head.weight"], last["current_model_state"]["model.lm_head.weight"]
    assert not torch.equal(ema_w, trained)  # test/translate read the EMA; `average --weights trained` the other


def test_the_best_checkpoint_is_chosen_by_validation_bleu(ema_run):
    (best,) = (ema_run / "checkpoints").glob("best-bleu*.ckpt")
    state = next(v for k, v in load_checkpoint(best)["callbacks"].items() if "'monitor': 'val/bleu'" in k)
    assert state["best_model_path"].endswith(best.name)
    assert best.name == f"best-bleu{float(state['best_model_score']):.2f}.ckpt"


def test_the_average_of_an_ema_run_loads_in_test_translate_predict_and_export(ema_run, capsys, monkeypatch):
    from lit_transformer.cli.model_commands import export_main, translate_main

    monkeypatch.chdir(ema_run)
    ckpts = ema_run / "checkpoints"
    average_main(["--checkpoints", str(ckpts), "--last", "2", "--weights", "trained", "--output", "avg.ckpt"])
    avg = load_checkpoint(ema_run / "avg.ckpt")
    first = load_checkpoint(ckpts / "step000010.ckpt")["current_model_state"]["model.lm_head.weight"]
    second = load_checkpoint(ckpts / "step000020.ckpt")["current_model_state"]["model.lm_head.weight"]
    torch.testing.assert_close(avg["state_dict"]["model.lm_head.weight"], (first + second) / 2)
    capsys.readouterr()
    _run("test", *_common(ema_run), "--ckpt_path", "avg.ckpt", "--model.generation.max_new_tokens", "8")
    assert "test/bleu" in capsys.readouterr().out
    source = "In the beginning God created the heaven and the earth."
    translate_main(["--checkpoint", "avg.ckpt", "--text", source, "--max_new_tokens", "8"])
    assert capsys.readouterr().out.strip()
    (ema_run / "sources.txt").write_text(source + "\n")
    predict = ["--data.init_args.predict_file", "sources.txt", "--predictions.output", "out.jsonl"]
    _run("predict", *_common(ema_run), "--ckpt_path", "avg.ckpt", *predict, "--model.generation.max_new_tokens", "8")
    assert (ema_run / "out.jsonl").read_text().count("\n") == 1
    export_main(["--checkpoint", "avg.ckpt", "--format", "safetensors", "--out", "exported"])
    assert (ema_run / "exported" / "config.json").is_file()


def test_a_file_named_beside_its_folder_counts_once_and_the_output_is_judged_first(tmp_path, tokenizer_json):
    """`--checkpoints DIR DIR/step000020.ckpt --last 2` averaged step 20 with itself ("the mean of 2 checkpoints"),
    an --output that is a folder was told to free disk space, and an --output over the run's last.ckpt replaced the
    file `fit --ckpt_path last` resumes from with weights only."""
    for step in (10, 20):
        _write(tmp_path / f"step{step:06d}.ckpt", step, tokenizer_json)
    _write(tmp_path / "last.ckpt", 20, tokenizer_json)
    names = [p.name for p in select_checkpoints([tmp_path, tmp_path / "step000020.ckpt"], last=2)]
    assert names == ["step000010.ckpt", "step000020.ckpt"]
    (tmp_path / "out").mkdir()
    with pytest.raises(ConfigError, match="--output .*out is a folder: give the file to write"):
        average_main(["--checkpoints", str(tmp_path), "--output", str(tmp_path / "out")])
    before = (tmp_path / "last.ckpt").read_bytes()
    with pytest.raises(ConfigError, match="is a checkpoint a run resumes from"):
        average_main(["--checkpoints", str(tmp_path), "--output", str(tmp_path / "last.ckpt")])
    assert (tmp_path / "last.ckpt").read_bytes() == before


def test_fit_refuses_to_resume_from_an_average_and_names_init_from(tmp_path, tokenizer_json):
    """Lightning's KeyError ("Trying to restore optimizer state but checkpoint contains only the model ...
    save_weights_only") was the answer, a traceback that named the wrong cause."""
    from lit_transformer.cli.lightning_cli import run_cli

    for step in (10, 20):
        _write(tmp_path / f"step{step:06d}.ckpt", step, tokenizer_json)
    average_main(["--checkpoints", str(tmp_path), "--output", str(tmp_path / "avg.ckpt")])
    tiny = str(ROOT / "configs" / "presets" / "tiny.yaml")
    with pytest.raises(
        CheckpointError, match="holds weights only \\(an average of 2 checkpoints\\).*--model.init_from"
    ):
        run_cli(["fit", "--config", tiny, "--ckpt_path", str(tmp_path / "avg.ckpt"), "--trainer.logger", "false"])


def test_lora_adapters_of_another_alpha_are_refused(tmp_path, tokenizer_json):
    """Two LoRA checkpoints of one base and rank but another lora.alpha hold factors of the same shapes that mean
    different updates (alpha / rank B A): averaged, the mean was read with the newest's alpha, without a word."""
    paths = []
    for step, alpha in ((100, 16.0), (200, 64.0), (300, 16.0)):
        path = _write(tmp_path / f"{step}.ckpt", step, tokenizer_json)
        checkpoint = torch.load(path)
        checkpoint["lora"] = {"base": "base.ckpt", "fingerprint": "0" * 16}
        checkpoint["hyper_parameters"]["lora"] = {"rank": 8, "alpha": alpha, "dropout": 0.0,
                                                  "target_modules": ["qkv"], "trainable": []}  # fmt: skip
        torch.save(checkpoint, path)
        paths.append(path)
    assert average_checkpoints([paths[0], paths[2]])["hyper_parameters"]["lora"]["alpha"] == 16.0
    with pytest.raises(CheckpointError, match=r"different lora.alpha \(64.0 and 16.0\)"):
        average_checkpoints(paths)
