"""Load a trained checkpoint for inference, and run the `generate` / `translate` commands (their options are parsed
in cli/model_commands.py, before torch is imported).

A checkpoint holds everything needed: the architecture (hyper_parameters.config) and the tokenizer(s) as JSON.
Decoding settings are a GenerationConfig; every one of its fields is a flag of both commands.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer

from lit_transformer.config import GenerationConfig, TransformerConfig
from lit_transformer.data.sources import DataFileError, NotInEncodingError
from lit_transformer.data.text import TextStream, pad_right, read_tokenizer
from lit_transformer.errors import BadFileError, ConfigError, MissingFileError
from lit_transformer.model import Transformer
from lit_transformer.model.generation import check_for_model
from lit_transformer.tasks import Task, build_task, default_task
from lit_transformer.tasks.base import text_stop_ids


@dataclass
class LoadedModel:
    model: Transformer
    tokenizer: Tokenizer
    target_tokenizer: Tokenizer
    task: type[Task] | Task | None = None  # what it was trained at; None: its architecture's; always an object after

    def __post_init__(self) -> None:
        # Always a task object checked against the architecture, as a checkpoint's is: serving picks its route by the
        # object's class, and a classifier's label count comes from the config (names() without label names).
        if self.task is None or isinstance(self.task, type):
            self.task = (self.task or default_task(self.config))()
            self.task.check_config(self.config)

    @property
    def config(self) -> TransformerConfig:
        return self.model.config

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def encode(self, text: str) -> list[int]:
        """A prompt or source, encoded exactly as training encodes it."""
        return self.task.encode_input(self.tokenizer, text, self.config.eos_token_id)

    def batch(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Encoded inputs padded on the right, with the attention mask that says which tokens are real."""
        texts = check_texts(texts)
        if not texts:
            raise ConfigError("no texts to encode: give a list of one or more strings")
        ids, mask = pad_right([self.encode(t) for t in texts], self.config.pad_token_id)
        return ids.to(self.device), mask.to(self.device)

    def decode(self, ids: torch.Tensor) -> list[str]:
        """Generated target ids to text, cut at the first EOS."""
        eos = self.config.eos_token_id
        rows = [row[: row.index(eos)] if eos is not None and eos in row else row for row in ids.tolist()]
        return self.target_tokenizer.decode_batch(rows, skip_special_tokens=True)


def check_texts(texts: Sequence[str]) -> list[str]:
    """The texts as a list of strings (a generator read once): a string alone would be read as its characters, each
    an input of its own."""
    if isinstance(texts, (str, bytes)):
        raise TypeError(f"texts must be a list of strings, not one string: write [{texts!r:.40}] for one input")
    texts = list(texts)
    wrong = [text for text in texts if not isinstance(text, str)]
    if wrong:
        raise TypeError(f"texts must be strings; got {type(wrong[0]).__name__} {wrong[0]!r:.40}")
    return texts


def config_from_checkpoint(checkpoint: dict) -> TransformerConfig:
    """The architecture a Lightning checkpoint was trained with."""
    from lit_transformer.checkpoints.files import CheckpointError

    try:
        config = checkpoint["hyper_parameters"]["config"]
    except (KeyError, TypeError):
        raise CheckpointError(
            "The checkpoint has no hyper_parameters.config: it was not written by lit_transformer's LitTransformer"
        ) from None
    if isinstance(config, TransformerConfig):
        return config
    try:
        return TransformerConfig(**dict(config))
    except (TypeError, ValueError) as error:  # a field this version lacks, or a value it refuses
        raise CheckpointError(
            f"The checkpoint's hyper_parameters.config does not make a TransformerConfig of this version ({error}): "
            "it was written by another version or another program"
        ) from None


def _refuse_other_kinds(path: Path) -> None:
    """Foreign files and folders are not models: say what the file is and what to do instead."""
    from lit_transformer.checkpoints.files import CheckpointError, sharded_checkpoint_message

    sharded = sharded_checkpoint_message(path)
    if sharded:
        raise CheckpointError(sharded)
    if path.is_dir():
        found = sorted(p.name for p in path.glob("*.ckpt"))[:5]
        hint = f"; the .ckpt files in it: {', '.join(found)}" if found else ""
        raise CheckpointError(
            f"{path} is a folder without a config.json, not a model: give a .ckpt file written by `fit` (e.g. "
            f"runs/<name>/checkpoints/last.ckpt){hint}, or a model folder (`export --format safetensors|hf`, or a "
            "Hugging Face GPT-2, Llama or Marian folder)."
        )
    if path.suffix in (".safetensors", ".onnx", ".json", ".bin"):
        raise CheckpointError(
            f"{path} is a {path.suffix} file of an export, not a checkpoint: give its folder (an export of "
            "--format safetensors or hf), or a .ckpt file that `fit` writes (runs/<name>/checkpoints/last.ckpt)."
        )


MODEL_FOLDERS = "a folder `export --format safetensors|hf` wrote, or a Hugging Face GPT-2, Llama or Marian folder"


def load_model_folder(folder: Path) -> LoadedModel:
    """A model folder: what `export --format safetensors` or `--format hf` wrote, or any Hugging Face GPT-2, Llama or
    Marian folder (a download, a `save_pretrained`). The model its config.json describes, the tokenizer(s) saved beside
    it, and its task: the one task.json records (an export of ours: a classifier's label names too), else the one its
    architecture implies."""
    import json

    from lit_transformer.checkpoints.files import CheckpointError
    from lit_transformer.data.marian_tokenizers import is_marian_folder, load_hf_marian_tokenizers
    from lit_transformer.interop.native import FORMAT, load_safetensors
    from lit_transformer.interop.pretrained import load_hf_model

    try:
        described = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{folder}/config.json is not JSON ({error}): give {MODEL_FOLDERS}") from None
    kind = described.get("format") or described.get("model_type") if isinstance(described, dict) else None
    if kind == FORMAT:
        model = load_safetensors(folder)
        tokenizer = _folder_tokenizer(folder / "tokenizer.json")
        target_file = folder / "target_tokenizer.json"
        target = _folder_tokenizer(target_file) if target_file.is_file() else tokenizer
        task = None
        if (folder / "task.json").is_file():  # the training task as its checkpoint recorded it (save_safetensors)
            record = json.loads((folder / "task.json").read_text(encoding="utf-8"))
            task = task_from_checkpoint({"hyper_parameters": {"task": record.get("task")}, **record}, model.config)
        return LoadedModel(model, tokenizer, target, task)
    if is_marian_folder(folder):
        return LoadedModel(load_hf_model(str(folder)), *load_hf_marian_tokenizers(folder))
    if kind in ("gpt2", "llama"):
        tokenizer = _folder_tokenizer(folder / "tokenizer.json")
        return LoadedModel(load_hf_model(str(folder)), tokenizer, tokenizer)
    raise CheckpointError(f"{folder}/config.json describes a {kind or 'model of no known kind'}: give {MODEL_FOLDERS}")


def _folder_tokenizer(path: Path) -> Tokenizer:
    from lit_transformer.checkpoints.files import CheckpointError

    if not path.is_file():
        raise CheckpointError(
            f"{path.parent} holds no {path.name}: a model folder carries its tokenizer as the `tokenizers` library "
            "saves it (`export` writes it; for a transformers download: "
            f"AutoTokenizer.from_pretrained(DIR).backend_tokenizer.save('{path}'))"
        )
    return read_tokenizer(path)


def hub_name(name: str) -> bool:
    """Whether `name` can only be a Hugging Face hub id (`gpt2`, `Helsinki-NLP/opus-mt-en-es`): nothing of that name
    here, no file suffix, at most one slash, not a relative or absolute path, and not a name in a folder here
    (`checkpoints/last`, a checkpoint's path without its suffix: its folder's checkpoints are the hint to give)."""
    from lit_transformer.data.sources import is_local_name

    return (
        not Path(name).expanduser().exists()
        and not is_local_name(name)
        and not ("/" in name and Path(name).expanduser().parent.is_dir())
        and re.fullmatch(r"[\w.-]+(/[\w.-]+)?", name) is not None
        and Path(name).suffix.lower() not in (".ckpt", ".pt", ".pth", ".safetensors", ".onnx", ".json", ".bin")
    )


def load_model(path: str | Path, device: str | torch.device = "cpu", base: str | Path | None = None) -> LoadedModel:
    """A Transformer in eval mode with its tokenizer(s), from a checkpoint loaded without running code from it, or
    from a model folder (load_model_folder). `base`: where a LoRA checkpoint's base is now, if it moved from the
    recorded init_from (its fingerprint is checked all the same)."""
    from lit_transformer.checkpoints.files import CheckpointError, load_checkpoint
    from lit_transformer.interop.pretrained import checkpoint_weights

    if hub_name(str(path)):  # `generate --checkpoint gpt2`: the hub's folder, downloaded (or, offline, cached)
        from lit_transformer.checkpoints.files import MissingCheckpointError
        from lit_transformer.errors import UserError
        from lit_transformer.interop.hf_files import resolve_folder

        try:
            path = resolve_folder(str(path), "model")
        except (OSError, UserError) as error:
            raise MissingCheckpointError(f"{path}: no such file or folder here; as a hub name: {error}") from None
    if Path(path).is_dir() and (Path(path) / "config.json").is_file():
        loaded = load_model_folder(Path(path))
        return dataclasses.replace(loaded, model=loaded.model.to(device).eval())
    _refuse_other_kinds(Path(path))
    checkpoint = load_checkpoint(path, map_location="cpu")
    try:
        config = config_from_checkpoint(checkpoint)
    except ValueError as error:
        raise CheckpointError(f"{path}: {error}") from None
    # A LoRA checkpoint's base is read again from its init_from (or `base`), checked, and the adapters merged in.
    model = checkpoint_weights(checkpoint, config, str(path), None if base is None else str(base))
    if "tokenizer" not in checkpoint:
        raise CheckpointError(f"{path} holds no tokenizer: it was saved without a DataModule; retrain with one")
    tokenizer = Tokenizer.from_str(checkpoint["tokenizer"])
    target = checkpoint.get("target_tokenizer")
    target_tokenizer = Tokenizer.from_str(target) if target else tokenizer
    return LoadedModel(model.to(device).eval(), tokenizer, target_tokenizer, task_from_checkpoint(checkpoint, config))


def task_from_checkpoint(checkpoint: dict, config: TransformerConfig) -> Task:
    """The task a checkpoint was trained at: its hyperparameters' task, else (older checkpoints) its architecture's."""
    import warnings

    hparams = checkpoint.get("hyper_parameters") or {}
    options = {name: hparams.get(name) for name in ("label_smoothing", "class_weights", "mlm_probability")}
    with warnings.catch_warnings():  # inference reads no training option: an old checkpoint's need not be named
        warnings.simplefilter("ignore", FutureWarning)
        task = build_task(hparams.get("task"), config, **options)
    task.on_load_checkpoint(checkpoint)  # what it learned from the data: a classifier's label names
    return task


def _device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(name).type
    except RuntimeError:
        kind = None
    if kind not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"--device {name} is not a device decoding runs on: give cpu, cuda (or cuda:N), mps or auto")
    if (kind == "cuda" and not torch.cuda.is_available()) or (kind == "mps" and not torch.backends.mps.is_available()):
        raise ConfigError(f"--device {name} asks for a GPU, but none is available here; use --device cpu")
    return name


SAMPLING = ("temperature", "top_k", "top_p", "seed")


def _generation(args, loaded: LoadedModel) -> GenerationConfig:
    """The decoding settings of a command's flags over the task's defaults, judged against the model before anything
    is printed; sampling flags that beam search does not read are named in a note."""
    gen = _settings(args, loaded.task)
    check_for_model(gen, loaded.config)
    unread = [f"--{name}" for name in SAMPLING if gen.num_beams > 1 and name in args]
    if unread:
        verb = "is" if len(unread) == 1 else "are"
        _note(f"--num_beams {gen.num_beams} decodes deterministically: {', '.join(unread)} {verb} not read")
    return gen


def typed_escapes(text: str) -> str:
    """`text` with the backslash escapes a person types (\\n, \\t, \\u00bf) read as the characters they stand for, and
    every other character kept: "unicode_escape" alone reads the UTF-8 of "¿" or "。" as Latin-1 (mojibake)."""
    return text.encode("latin-1", "backslashreplace").decode("unicode_escape")


def _settings(args, task: type[Task] | Task) -> GenerationConfig:
    # The flags given (null included: --top_k null keeps every token, --max_source_offset null lifts the +50 cap)
    # over the task's defaults; a flag left unset is not in args.
    values = {f.name: args[f.name] for f in dataclasses.fields(GenerationConfig) if f.name in args}
    hints = typing.get_type_hints(GenerationConfig)
    for name in [name for name, value in values.items() if value is None]:
        if type(None) not in typing.get_args(hints[name]):  # null for a field that has no None: its default
            del values[name]
    for name in ("stop", "stop_token_ids"):
        if name in values and not isinstance(values[name], list):
            values[name] = [] if values[name] is None else [values[name]]
    if values.get("stop"):  # --stop "\n\n" means two newlines, as a person typing it means
        values["stop"] = [typed_escapes(s) for s in values["stop"]]
    return GenerationConfig.for_task(task).replace(**values)


def _check_command(loaded: LoadedModel, command: str) -> None:
    """Refuse a checkpoint whose task another command serves (Task.command), naming that command."""
    from lit_transformer.checkpoints.files import CheckpointError

    served = loaded.task.command
    if served != command:
        name = type(loaded.task).__name__
        hint = f"use `python -m lit_transformer {served}`" if served else "no text command decodes it (use `predict`)"
        raise CheckpointError(f"this checkpoint was trained at the {name} task: {hint}")


def _note(message: str) -> None:
    print(f"note: {message}", file=sys.stderr)


def quantize_loaded(loaded: LoadedModel, quantize: str) -> LoadedModel:
    """`loaded` with its model quantized as --quantize says; a QuantizationError becomes the command's error."""
    if quantize == "none":
        return loaded
    from lit_transformer.transforms.int8 import QuantizationError, quantize_int8

    try:
        return dataclasses.replace(loaded, model=quantize_int8(loaded.model, inplace=True))
    except QuantizationError as error:
        raise QuantizationError(f"--quantize {quantize}: {error}") from None


def _load(args) -> LoadedModel:
    device = args.device
    if device == "auto" and args.quantize != "none":
        device = "cpu"  # the int8 kernels are CPU kernels
    device = _device(device)
    if args.quantize != "none" and torch.device(device).type != "cpu":  # judged before the model is loaded there
        from lit_transformer.transforms.int8 import QuantizationError

        raise QuantizationError(
            f"--quantize {args.quantize}: int8 dynamic quantization runs on the CPU only (--device {device}): use "
            "--device cpu, or bf16/fp16 on a GPU instead"
        )
    return quantize_loaded(load_model(args.checkpoint, device, args.base), args.quantize)


def _inputs(flag: str, path: str, what: str) -> list[str]:
    """The lines of a prompt or input file (read as predict_file is: text or JSON lines, compressed or not), each
    refusal naming the flag and the file: missing, binary, not UTF-8, empty."""
    from lit_transformer.data.sources import read_inputs

    if Path(path).is_dir():
        raise BadFileError(f"{flag} {path} is a folder: give a text file with one {what} per line")
    if not Path(path).is_file():
        raise MissingFileError(f"{flag} {path} does not exist: give a text file with one {what} per line")
    try:
        lines = read_inputs(path)
    except NotInEncodingError as error:  # its fix names predict's encoding setting, which this command lacks
        raise DataFileError(
            f"{error.where} is not {error.encoding} text (bytes {error.bad!r}): {flag} reads UTF-8; convert the file "
            f"first, e.g. iconv -f latin-1 -t UTF-8 {path} > {Path(path).stem}.utf8{Path(path).suffix}"
        ) from None
    if not lines:
        raise DataFileError(f"{flag} {path} is empty: write one {what} per line")
    return lines


def _check_source_lengths(loaded: LoadedModel, texts: Sequence[str], where: str) -> None:
    """An encoder reads its whole input at once, and learned positions end at max_seq_len: a longer input cannot be
    read, so it is refused here, naming the input, rather than cut or failing inside the model."""
    limit = loaded.config.max_seq_len
    if loaded.config.positions != "learned":  # the other position schemes reach past max_seq_len
        return
    for number, text in enumerate(texts, 1):
        length = len(loaded.encode(text))
        if length > limit:
            line = "" if where == "--text" else f" line {number}"
            raise DataFileError(
                f"{where}{line} has {length} tokens, more than the {limit} positions the model learned "
                "(max_seq_len): split it into shorter sentences"
            )


def run_generate(args) -> None:
    """`generate` with its parsed options (model_commands.generate_main): continue prompts with a decoder-only
    model, printing tokens as they are produced."""
    if args.prompt is not None and args.prompt_file is not None:  # one of them would be left out without a word
        raise ConfigError("generate takes --prompt TEXT or --prompt_file FILE, not both")
    if args.prompt_file is not None:
        prompts = _inputs("--prompt_file", args.prompt_file, "prompt")
    else:
        prompts = ["\n" if args.prompt is None else args.prompt]
    loaded = _load(args)
    _check_command(loaded, "generate")
    gen = _generation(args, loaded)
    if gen.num_beams > 1 and args.num_samples > 1:  # beam search draws nothing: every sample would be the same text
        raise ConfigError(
            f"--num_samples {args.num_samples} with --num_beams {gen.num_beams}: beam search is deterministic, so "
            "every sample would be the same text; sample several with --num_beams 1 (and a temperature above 0)"
        )
    generator = torch.Generator(device=loaded.device)
    generator.manual_seed(gen.seed) if gen.seed is not None else generator.seed()
    window = loaded.config.max_seq_len
    for p, prompt in enumerate(prompts):
        ids = loaded.encode(prompt)
        if len(ids) > window:
            _note(
                f"prompt {p + 1} has {len(ids)} tokens, more than the model's context of {window}: the model sees its last {window}"
            )
        for s in range(args.num_samples):
            if len(prompts) > 1 or args.num_samples > 1:
                print(f"--- prompt {p + 1}, sample {s + 1}", flush=True)
            sys.stdout.write(prompt)
            if gen.num_beams > 1:  # beam search settles its tokens only at the end: the text is printed then
                out = loaded.model.generate(torch.tensor([ids], device=loaded.device), gen, generator=generator)
                stream = TextStream(
                    loaded.target_tokenizer, 1, gen.stop, text_stop_ids(loaded.config, gen), prompts=[ids]
                )
                for token in out[0].tolist():
                    stream(torch.tensor([token]))
                sys.stdout.write(stream.texts()[0])
            else:
                stops = text_stop_ids(loaded.config, gen)  # the EOS ends the text, as in predict and serve
                stream = TextStream(loaded.target_tokenizer, 1, gen.stop, stops, echo=sys.stdout, prompts=[ids])
                tokens = torch.tensor([ids], device=loaded.device)
                loaded.model.generate(tokens, gen, generator=generator, streamer=stream)
                stream.finish()
            print(flush=True)


def run_translate(args) -> None:
    """`translate` with its parsed options (model_commands.translate_main): translate sentences with an
    encoder-decoder model (beam search by default)."""
    if (args.text is None) == (args.input is None):
        raise ConfigError("translate needs exactly one of --text SENTENCE or --input FILE")
    texts = [args.text] if args.text is not None else _inputs("--input", args.input, "sentence")
    loaded = _load(args)
    _check_command(loaded, "translate")
    gen = _generation(args, loaded)
    _check_source_lengths(loaded, texts, "--text" if args.text is not None else f"--input {args.input}")
    for start in range(0, len(texts), args.batch_size):
        for text in translate(loaded, texts[start : start + args.batch_size], gen):
            print(text, flush=True)


def translate(loaded: LoadedModel, texts: Sequence[str], gen: GenerationConfig | None = None) -> list[str]:
    """Translations of a batch of sentences, decoded as `predict` and `serve` decode them: cut by the stop strings
    (--stop, which this command's flags offer) and at the EOS, which decoding alone left in. `gen` None: the model
    task's decoding defaults (GenerationConfig.for_task), as the commands' unset flags are."""
    from lit_transformer.tasks.base import generation_rows

    gen = GenerationConfig.for_task(loaded.task) if gen is None else gen
    texts = check_texts(texts)
    if not texts:
        return []
    src, mask = loaded.batch(texts)
    rows = generation_rows(loaded.model, loaded.target_tokenizer, gen, src, mask, list(texts))
    return [row["output"] for row in rows]
