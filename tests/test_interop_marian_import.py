"""Marian the other way: load_hf_marian reads a Marian folder (ours, a save_pretrained MarianMTModel, OPUS-MT's
SentencePiece tokenizers) into our Transformer with the same logits, and `fit --model.init_from DIR` starts from one."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest
import torch
from model_variants import build, single_thread, tokens  # noqa: F401 (autouse fixture)

from lit_transformer.data.text import train_tokenizer
from lit_transformer.interop import load_hf_marian, load_hf_marian_tokenizers, save_hf_marian
from lit_transformer.interop.hf_marian import from_hf_config, spm_tokenizer

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")

PAPER = {"topology": "encoder_decoder", "norm_position": "post", "positions": "sinusoidal", "activation": "relu"}
ROOT = Path(__file__).resolve().parents[1]


def _large(model, std: float = 0.3):
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, std)
    return model


@pytest.mark.parametrize(
    "variant",
    [
        {**PAPER, "scale_embeddings": True, "tie_embeddings": True},
        {**PAPER, "scale_embeddings": True, "tie_embeddings": False, "activation": "silu"},
        {**PAPER, "scale_embeddings": False, "target_vocab_size": 100, "activation": "gelu"},
    ],
    ids=["paper", "untied-silu", "two-vocabularies-gelu"],
)
def test_export_then_import_gives_identical_logits_and_beam_outputs(tmp_path, variant):
    model = _large(build(variant, init="xavier"))
    save_hf_marian(model, tmp_path)
    back = load_hf_marian(tmp_path)
    training = ("dropout", "attention_dropout", "init", "init_std")  # not in the folder's architecture
    assert back.config.replace(**{k: getattr(model.config, k) for k in training}) == model.config
    src = tokens(2, 11)
    mask = torch.ones_like(src, dtype=torch.bool)
    mask[1, 7:] = False
    tgt = tokens(2, 9, seed=2, vocab=100)
    tgt[:, 0] = model.config.bos_token_id
    with torch.no_grad():
        assert torch.equal(model(src, tgt, src_mask=mask), back(src, tgt, src_mask=mask))
    rules = dict(max_new_tokens=8, num_beams=4, length_penalty=0.6, length_penalty_form="gnmt", early_stopping=True)
    assert torch.equal(
        model.generate(src, attention_mask=mask, **rules), back.generate(src, attention_mask=mask, **rules)
    )


def _random_opus_mt(folder: Path, vocab: int = 40) -> transformers.MarianMTModel:
    """A randomly initialised MarianMTModel shaped like OPUS-MT's (swish, decoding starts from the pad token, the
    last id), saved with save_pretrained: no hub needed."""
    config = transformers.MarianConfig(
        vocab_size=vocab,
        decoder_vocab_size=vocab,
        d_model=16,
        encoder_layers=2,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        activation_function="swish",
        max_position_embeddings=64,
        scale_embedding=True,
        pad_token_id=vocab - 1,
        eos_token_id=0,
        decoder_start_token_id=vocab - 1,
        init_std=0.3,
    )
    torch.manual_seed(0)
    hf = transformers.MarianMTModel(config).eval()
    hf.save_pretrained(folder)
    return hf


def test_a_random_marian_saved_with_save_pretrained_loads_with_its_logits(tmp_path):
    hf = _random_opus_mt(tmp_path)
    ours = load_hf_marian(tmp_path)
    cfg = ours.config
    assert (cfg.activation, cfg.bos_token_id, cfg.pad_token_id, cfg.eos_token_id) == ("silu", 39, 39, 0)
    assert (cfg.encoder_layers, cfg.decoder_layers) == (2, 1)
    src = tokens(2, 7, vocab=38)
    src[:, -1] = 0  # </s> ends each source, as Marian's tokenizer writes it
    mask = torch.ones_like(src, dtype=torch.bool)
    mask[1, 5:] = False
    tgt = tokens(2, 6, seed=3, vocab=38)
    tgt[:, 0] = 39  # decoding starts from the pad token
    with torch.no_grad():
        theirs = hf(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
        torch.testing.assert_close(ours(src, tgt, src_mask=mask), theirs, atol=1e-5, rtol=1e-5)


def test_a_marian_model_we_cannot_compute_is_refused_naming_the_fields():
    config = dict(model_type="marian", vocab_size=10, d_model=8, encoder_layers=1, decoder_layers=1)
    config |= dict(encoder_attention_heads=2, decoder_attention_heads=4, encoder_ffn_dim=16, decoder_ffn_dim=16)
    config |= dict(activation_function="tanh", pad_token_id=9, eos_token_id=0)
    with pytest.raises(ValueError) as error:
        from_hf_config(config)
    assert "decoder_attention_heads=4" in str(error.value) and "activation_function='tanh'" in str(error.value)


@pytest.mark.parametrize(
    "block",
    [{"norm": "rmsnorm"}, {"n_kv_heads": 2}, {"pad_vocab_to_multiple_of": 64}],
    ids=["rmsnorm", "gqa", "padded-vocabulary"],
)
def test_a_marian_folder_loaded_over_a_base_of_another_block_has_its_logits(tmp_path, block):
    """The folder decides the architecture: a run config's RMSNorm loaded the folder with its LayerNorm biases
    dropped, silently, into a model of other logits; grouped-query attention and a padded vocabulary (a
    run config's allocation choice, kept: zero rows appended) ended in load_state_dict's size mismatches."""
    from lit_transformer.config import TransformerConfig

    hf = _random_opus_mt(tmp_path)
    ours = load_hf_marian(tmp_path, base=TransformerConfig.preset("tiny", **PAPER, **block))
    src, tgt = tokens(2, 7, vocab=38), tokens(2, 6, seed=3, vocab=38)
    with torch.no_grad():
        theirs = hf(input_ids=src, decoder_input_ids=tgt).logits
        torch.testing.assert_close(ours(src, tgt), theirs, atol=1e-5, rtol=1e-5)
    assert (ours.config.norm, ours.config.n_kv_heads) == ("layernorm", None)


def test_a_marian_folder_is_read_whole_or_refused(tmp_path, monkeypatch):
    """Every weight of our model comes from the folder and every tensor of the folder is read (position tables and a
    zero final_logits_bias aside): a mismatch between the two, whether the folder's or a mapping's, is refused naming
    the tensors. The load kept what the two had in common and dropped the rest without a word."""
    from safetensors.torch import load_file, save_file

    from lit_transformer.errors import BadFileError
    from lit_transformer.interop import hf_marian

    _random_opus_mt(tmp_path)
    path = tmp_path / "model.safetensors"
    clean = load_file(path)
    save_file({**clean, "model.encoder.layernorm_embedding.weight": torch.ones(16)}, path, metadata={"format": "pt"})
    with pytest.raises(BadFileError, match="model.encoder.layernorm_embedding.weight"):
        load_hf_marian(tmp_path)
    save_file(clean, path, metadata={"format": "pt"})
    # A config that maps onto other weights than the folder's (here RMSNorm's, which has no biases).
    read = hf_marian.from_hf_config
    monkeypatch.setattr(hf_marian, "from_hf_config", lambda hf, base=None: read(hf, base).replace(norm="rmsnorm"))
    with pytest.raises(BadFileError, match=r"encoder_blocks\.0\.self_attn_norm\.bias"):
        load_hf_marian(tmp_path)


def test_a_marian_folder_is_refused_as_the_start_of_a_model_of_images(tmp_path):
    """A Marian encoder reads tokens: a captioning run's config (source patches or features) cannot start from one.
    It was refused for lacking src_input.proj.weight, as if the folder were damaged."""
    from lit_transformer.config import TransformerConfig
    from lit_transformer.errors import ConfigError

    _random_opus_mt(tmp_path)
    base = TransformerConfig.preset("tiny", **PAPER, source="features", source_dim=8)
    with pytest.raises(ConfigError, match="source='features'.*Marian.*reads tokens"):
        load_hf_marian(tmp_path, base=base)


def _spm_model(path: Path, pieces: list[tuple[str, float, int]]) -> None:
    """A SentencePiece model file (protobuf), written with the schema transformers ships: no sentencepiece needed."""
    from transformers.convert_slow_tokenizer import import_protobuf

    proto = import_protobuf().ModelProto()
    for piece, score, kind in pieces:
        entry = proto.pieces.add()
        entry.piece, entry.score, entry.type = piece, score, kind
    proto.trainer_spec.model_type = 1  # UNIGRAM
    proto.trainer_spec.unk_id = 0
    proto.normalizer_spec.add_dummy_prefix = True
    path.write_bytes(proto.SerializeToString())


def test_opus_mt_sentencepiece_tokenizers_segment_and_number_as_marian_does(tmp_path):
    # Types: 1 normal, 2 unknown, 3 control. Marian numbers pieces by vocab.json, not by the model's order.
    _spm_model(
        tmp_path / "source.spm",
        [("<unk>", 0, 2), ("<s>", 0, 3), ("</s>", 0, 3), ("\u2581ab", -1.0, 1), ("\u2581a", -2.0, 1), ("b", -2.0, 1)]
        + [("a", -3.0, 1), ("\u2581", -3.0, 1)],
    )
    vocab = {"</s>": 0, "<unk>": 1, "\u2581a": 2, "b": 3, "\u2581ab": 4, "a": 5, "\u2581": 6, "\u2581la": 7, "<pad>": 8}
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    source, target = load_hf_marian_tokenizers(tmp_path)
    # "ab" is one piece (score -1 beats -2 + -2); "a" alone is "▁a"; ▁la (the other language's) is never chosen.
    assert source.encode("ab a").ids == [4, 2]
    assert source.decode([4, 2, 0, 8], skip_special_tokens=True) == "ab a"
    assert target.get_vocab_size() == 9 and source.token_to_id("<pad>") == 8
    with pytest.raises(ValueError, match="does not number its pieces"):
        spm_tokenizer(tmp_path / "source.spm", {"a": 0, "b": 2})


def test_opus_mt_sentencepiece_tokenizers_never_segment_with_the_other_languages_pieces(tmp_path):
    """vocab.json numbers both languages' pieces; SentencePiece (and transformers' MarianTokenizer) segments a source
    with source.spm's own pieces only. The other language's pieces scored min - 10: one of them ("▁abcd", -15) beat
    this model's four pieces (-20), so `abcd` became an id the model never saw on that side."""
    _spm_model(
        tmp_path / "source.spm",
        [("<unk>", 0, 2), ("</s>", 0, 3), ("\u2581a", -5.0, 1), ("b", -5.0, 1), ("c", -5.0, 1), ("d", -5.0, 1)],
    )
    vocab = {"</s>": 0, "<unk>": 1, "\u2581a": 2, "b": 3, "c": 4, "d": 5, "\u2581abcd": 6, "<pad>": 7}
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    source, _ = load_hf_marian_tokenizers(tmp_path)
    assert source.encode("abcd").ids == [2, 3, 4, 5]


def test_opus_mt_sentencepiece_tokenizers_give_trailing_whitespace_no_piece(tmp_path):
    """SentencePiece's remove_extra_whitespaces (its default, and OPUS-MT's) drops trailing whitespace: `translate
    --text "ab "` or an input line ending in a space got one more "▁" token than Hugging Face's MarianTokenizer."""
    _spm_model(tmp_path / "source.spm", [("<unk>", 0, 2), ("</s>", 0, 3), ("\u2581ab", -1.0, 1), ("\u2581", -3.0, 1)])
    (tmp_path / "vocab.json").write_text(json.dumps({"</s>": 0, "<unk>": 1, "\u2581ab": 2, "\u2581": 3, "<pad>": 4}))
    source, _ = load_hf_marian_tokenizers(tmp_path)
    for text in ("ab", "ab ", "ab  ", "ab\t", " ab "):
        assert source.encode(text).ids == [2], text


# Words of a toy English -> Spanish corpus: source.spm holds the English ones, target.spm the Spanish ones, and one
# vocab.json numbers both (as OPUS-MT's folders do), with no BOS: </s> first, <pad> last.
EN, ES = ["the", "house", "is", "red", "dog", "big"], ["la", "casa", "es", "roja", "el", "perro", "grande"]
PAIRS = [("the house is red", "la casa es roja"), ("the dog is big", "el perro es grande"), ("the dog", "el perro")]


def _pairs(folder: Path) -> Path:
    """The toy corpus as train/validation/test JSONL files: fine-tuning needs a few pairs, not a corpus."""
    folder.mkdir()
    for split in ("train", "validation", "test"):
        rows = [json.dumps({"en": en, "es": es}) for en, es in PAIRS * 4]
        (folder / f"{split}.jsonl").write_text("\n".join(rows) + "\n")
    return folder


def test_fit_starts_from_a_marian_folder_with_its_tokenizer(tmp_path, monkeypatch):
    from lit_transformer.checkpoints.files import load_checkpoint
    from lit_transformer.cli.lightning_cli import run_cli

    tokenizer = train_tokenizer([string.printable * 3], kind="char", vocab_size=128)
    model = build({**PAPER, "scale_embeddings": True, "d_model": 48}, vocab_size=tokenizer.get_vocab_size())
    save_hf_marian(model, tmp_path / "marian", tokenizer)
    monkeypatch.chdir(tmp_path)
    args = ["fit", "--config", str(ROOT / "configs" / "presets" / "tiny-translate.yaml")]
    args += ["--model.init_from", str(tmp_path / "marian")]
    args += ["--data.init_args.tokenizer", str(tmp_path / "marian" / "tokenizer.json")]
    args += ["--data.init_args.dataset", str(_pairs(tmp_path / "data")), "--data.init_args.max_tokens", "64"]
    args += ["--data.init_args.cache_dir", str(tmp_path / "cache"), "--trainer.max_steps", "1"]
    args += ["--trainer.val_check_interval", "1", "--trainer.limit_val_batches", "0"]
    args += ["--checkpoint.dirpath", "ckpt", "--checkpoint.every_n_train_steps", "1"]
    args += ["--trainer.logger", "false", "--trainer.enable_progress_bar", "false"]
    run_cli(args)
    checkpoint = load_checkpoint(tmp_path / "ckpt" / "last.ckpt")
    assert checkpoint["hyper_parameters"]["config"]["d_model"] == 48  # the folder's architecture, not the preset's
    assert checkpoint["init_from"] == str(tmp_path / "marian")
    # After one step of Noam warmup the weights are still close to the folder's.
    start = model.state_dict()["decoder_blocks.0.ff.up.weight"]
    after = checkpoint["state_dict"]["model.decoder_blocks.0.ff.up.weight"]
    assert (after - start).abs().max() < 0.05 < start.abs().max()
    # Another tokenizer is refused, with the fix in the message.
    args[args.index("--data.init_args.tokenizer") + 1] = "char"
    with pytest.raises(ValueError, match=r"another tokenizer(.|\n)*--data.init_args.tokenizer .*marian$"):
        run_cli(args)


def _opus_mt_folder(folder: Path) -> tuple[transformers.MarianMTModel, dict[str, int]]:
    """An OPUS-MT download as it lies on disk, built without the hub: a random MarianMTModel (decoding starts from
    <pad>), source.spm / target.spm and vocab.json, and no tokenizer.json."""
    letters = [*string.ascii_lowercase, "\u2581"]
    pieces = ["</s>", "<unk>", *(f"\u2581{w}" for w in dict.fromkeys(EN + ES)), *letters, "<pad>"]
    vocab = {piece: i for i, piece in enumerate(pieces)}
    folder.mkdir()
    (folder / "vocab.json").write_text(json.dumps(vocab))
    control = [("<unk>", 0, 2), ("<s>", 0, 3), ("</s>", 0, 3)]
    for name, words in (("source.spm", EN), ("target.spm", ES)):
        _spm_model(folder / name, control + [(f"\u2581{w}", -1.0, 1) for w in words] + [(c, -5.0, 1) for c in letters])
    return _random_opus_mt(folder, vocab=len(vocab)), vocab


def test_fit_and_translate_from_an_opus_mt_folder_start_decoding_from_its_pad_token(tmp_path, monkeypatch, capsys):
    """`fit --model.init_from DIR --data.init_args.tokenizer DIR` on an OPUS-MT folder: targets start from <pad>
    (Marian's decoder_start_token_id) as Marian's training shifts them, so the loss is Hugging Face's on the same
    batch; `translate` starts from <pad> too, and greedy decoding gives Hugging Face's tokens."""
    from lit_transformer.cli.lightning_cli import main, run_cli
    from lit_transformer.inference import load_model
    from lit_transformer.model import Transformer

    hf, vocab = _opus_mt_folder(tmp_path / "opus-mt")
    pad = vocab["<pad>"]
    data = _pairs(tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    args = ["fit", "--config", str(ROOT / "configs" / "presets" / "tiny-translate.yaml")]
    args += ["--model.init_from", "opus-mt", "--data.init_args.tokenizer", "opus-mt"]
    args += ["--data.init_args.dataset", str(data), "--data.init_args.cache_dir", "cache"]
    args += ["--data.init_args.max_tokens", "64", "--trainer.max_steps", "2", "--trainer.limit_val_batches", "0"]
    args += ["--checkpoint.dirpath", "ckpt", "--checkpoint.every_n_train_steps", "2"]
    args += ["--trainer.logger", "false", "--trainer.enable_progress_bar", "false"]
    cli = run_cli(args)
    assert (cli.model.config.bos_token_id, cli.model.config.pad_token_id) == (pad, pad)
    batch = next(iter(cli.datamodule.train_dataloader()))
    assert (batch["tgt_in"][:, 0] == pad).all()
    # Each side segmented by its own SentencePiece model, numbered by the one vocab.json.
    assert cli.datamodule.decode(batch["labels"][0][batch["labels"][0] >= 0]) in [es for _, es in PAIRS]
    # Marian's teacher forcing (shift_tokens_right of the labels from decoder_start_token_id) is ours at every
    # labelled position, and the folder's model, loaded, has Hugging Face's loss on the batch.
    labelled = batch["labels"] != -100
    shifted = transformers.models.marian.modeling_marian.shift_tokens_right(batch["labels"], pad, pad)
    assert torch.equal(batch["tgt_in"][labelled], shifted[labelled])
    ours = load_hf_marian(tmp_path / "opus-mt")
    with torch.no_grad():
        logits = ours(batch["src"], batch["tgt_in"], src_mask=batch["src_mask"])
        theirs = hf(input_ids=batch["src"], attention_mask=batch["src_mask"], labels=batch["labels"])
    torch.testing.assert_close(logits[labelled], theirs.logits[labelled], atol=1e-5, rtol=1e-5)
    loss = torch.nn.functional.cross_entropy(logits[labelled], batch["labels"][labelled])
    torch.testing.assert_close(loss, theirs.loss, atol=1e-5, rtol=1e-5)

    # translate: decoding starts from <pad>, and greedy decoding of the folder's model is Hugging Face's.
    first_inputs = []
    decode = Transformer.decode

    def spy(self, tgt, *rest, **kwargs):
        first_inputs.append(int(tgt[0, 0]))
        return decode(self, tgt, *rest, **kwargs)

    monkeypatch.setattr(Transformer, "decode", spy)
    capsys.readouterr()
    main(["translate", "--checkpoint", "ckpt/last.ckpt", "--text", "the dog is red", "--max_new_tokens", "6"])
    assert first_inputs[0] == pad and capsys.readouterr().out.endswith("\n")
    loaded = load_model("ckpt/last.ckpt")
    assert loaded.target_tokenizer.to_str() != loaded.tokenizer.to_str()  # target.spm travels in the checkpoint
    src = torch.tensor([loaded.encode("the dog is red")])
    greedy = dict(max_new_tokens=6, num_beams=1, do_sample=False)
    expected = hf.generate(src, decoder_start_token_id=pad, forced_eos_token_id=None, **greedy)[:, 1:]
    got = ours.generate(src, max_new_tokens=6, num_beams=1)
    assert torch.equal(got[:, : expected.shape[1]], expected)
