"""The files of a Hugging Face model folder: weights (safetensors, sharded or not), tokenizer files, hub downloads."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from tokenizers.processors import TemplateProcessing

from lit_transformer.checkpoints.files import follow_umask
from lit_transformer.config import TransformerConfig
from lit_transformer.data.sources import is_local_name
from lit_transformer.errors import BadFileError, ConfigError, MissingFileError

# The switches none of the Hugging Face architectures we write can hold: field -> (the value they all have, what
# they lack). zero_init_output is an initialisation only, so any format holds a model trained with it.
HF_LACKS: dict[str, tuple[object, str]] = {
    "qk_norm": (False, "no norm of queries and keys"),
    "logit_softcap": (None, "no soft cap on its logits"),
    "value_residual": (False, "no value residual in its attention"),
}
# What a model loaded from such a folder is, whatever a base config says: the switches off.
HF_SWITCHES_OFF: dict[str, object] = {name: value for name, (value, _) in HF_LACKS.items()} | {
    "zero_init_output": False
}


def switch_problems(cfg: TransformerConfig, architecture: str) -> list[str]:
    """One line per switch of `cfg` that `architecture` cannot hold, naming it and where it can go instead."""
    return [
        f"{name}={getattr(cfg, name)!r}: {architecture} has {lacks}; the native format (export --format "
        "safetensors) and ONNX keep it"
        for name, (value, lacks) in HF_LACKS.items()
        if getattr(cfg, name) != value
    ]


def cannot_save(architecture: str, problems: list[str]) -> ConfigError:
    """The refusal of a model `architecture` cannot express: each field, then where every model can go."""
    return ConfigError(
        f"This model cannot be saved as a Hugging Face {architecture}:\n  - "
        + "\n  - ".join(problems)
        + "\nexport --format safetensors (this package's folder) keeps any model, --format onnx any model of text."
    )


def full_heads_qkv(tensor: torch.Tensor, cfg: TransformerConfig) -> torch.Tensor:
    """A fused QKV weight or bias of grouped-query attention as multi-head attention's: each key/value head repeated
    for the query heads it serves (attend() gives each H / H_kv consecutive ones). The same logits, for formats with no
    grouped-query attention (GPT-2, Marian); unchanged where every query head has its own key/value head."""
    if cfg.kv_heads == cfg.n_heads:
        return tensor
    kv = cfg.kv_heads * cfg.head_dim
    q, k, v = tensor.split((cfg.d_model, kv, kv))
    group = cfg.n_heads // cfg.kv_heads
    k, v = (t.unflatten(0, (cfg.kv_heads, cfg.head_dim)).repeat_interleave(group, 0).flatten(0, 1) for t in (k, v))
    return torch.cat([q, k, v])


WEIGHT_PATTERNS = [
    "config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer*",
    "special_tokens_map.json",
    "vocab.json",  # a Marian folder's tokenizers: its vocabulary and two SentencePiece models
    "*.spm",
]


def resolve_folder(name: str, what: str) -> Path:
    """A local folder as it is; otherwise a hub name, downloaded (config, safetensors, tokenizer) when online.

    Offline, a hub name fails at once with a message that says what was asked and how to pass a local folder.
    """
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if path.exists() or is_local_name(name):
        raise MissingFileError(f"{what} folder {name!r} does not exist (looked for {path.resolve()})")
    from huggingface_hub import snapshot_download

    from lit_transformer.data.sources import hub_offline, offline_and_uncached

    if hub_offline():  # as Hugging Face's own libraries do offline: a name downloaded before is read from the cache
        try:
            return Path(snapshot_download(name, allow_patterns=WEIGHT_PATTERNS, local_files_only=True))
        except Exception:  # LocalEntryNotFoundError, or a repository id huggingface_hub refuses
            raise offline_and_uncached(
                f"{what} {name!r}",
                hint=f"Download it where there is internet (`hf download {name} --local-dir DIR`) and pass the local "
                f"folder DIR instead, or `hf download {name}` into the cache that HF_HOME names here.",
            ) from None
    try:
        return Path(snapshot_download(name, allow_patterns=WEIGHT_PATTERNS))
    except (OSError, ValueError) as error:  # huggingface_hub's not-found and HTTP errors are OSErrors
        raise MissingFileError(
            f"{what} {name!r} is neither a local path nor a model the Hugging Face hub gives ({type(error).__name__}): "
            "check the name, or give a local folder or checkpoint file"
        ) from None


def read_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of model.safetensors, of its shards (model.safetensors.index.json), or of pytorch_model.bin."""
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():
        return load_file(single)
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return {k: v for shard in shards for k, v in load_file(folder / shard).items()}
    legacy = folder / "pytorch_model.bin"
    if legacy.is_file():  # weights_only: a pickle from the internet never runs code here
        return torch.load(legacy, map_location="cpu", weights_only=True)
    raise MissingFileError(f"No model.safetensors, sharded safetensors or pytorch_model.bin in {folder}")


def write_state_dict(state: Mapping[str, torch.Tensor], folder: Path) -> Path:
    """model.safetensors with the metadata transformers expects."""
    path = folder / "model.safetensors"
    save_file(dict(state), path, metadata={"format": "pt"})
    follow_umask(path)
    return path


def special_tokens(tokenizer: Tokenizer, cfg: TransformerConfig) -> dict[str, str]:
    """bos/eos/pad token strings for transformers, from the model's special token ids."""
    roles = {"bos_token": cfg.bos_token_id, "eos_token": cfg.eos_token_id, "pad_token": cfg.pad_token_id}
    tokens = {role: tokenizer.id_to_token(i) for role, i in roles.items() if i is not None}
    for unk in ("<unk>", "[UNK]", "<|unk|>"):
        if tokenizer.token_to_id(unk) is not None:
            tokens["unk_token"] = unk
            break
    return {role: token for role, token in tokens.items() if token is not None}


def save_hf_tokenizer(tokenizer: Tokenizer, directory: Path, cfg: TransformerConfig, append_eos: bool = False) -> None:
    """tokenizer.json and tokenizer_config.json via PreTrainedTokenizerFast, so AutoTokenizer loads them.

    append_eos: end every encoded text with EOS, as our translation sources are (the tokenizer is copied first).
    """
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer.from_str(tokenizer.to_str())
    if append_eos and cfg.eos_token_id is not None:
        eos = tokenizer.id_to_token(cfg.eos_token_id)
        tokenizer.post_processor = TemplateProcessing(
            single=f"$A {eos}", pair=f"$A {eos} $B {eos}", special_tokens=[(eos, cfg.eos_token_id)]
        )
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, **special_tokens(tokenizer, cfg))
    fast.save_pretrained(os.fspath(directory))


def write_hf_folder(
    directory: str | os.PathLike,
    hf_config: dict,
    state: Mapping[str, torch.Tensor],
    tokenizer: Tokenizer | None,
    cfg: TransformerConfig,
) -> Path:
    """A Hugging Face model folder: config.json, model.safetensors and, with a tokenizer, its files."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    write_state_dict(state, directory)
    if tokenizer is not None:
        save_hf_tokenizer(tokenizer, directory, cfg)
    return directory


def read_hf_folder(directory: str | os.PathLike, what: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json as a dict, the weights) of a Hugging Face model folder or, when online, a hub name."""
    folder = resolve_folder(str(directory), what=what)
    return check_hf_config(folder, what), read_state_dict(folder)


def check_hf_config(folder: str | os.PathLike, what: str = "Hugging Face model") -> dict | None:
    """A local model folder's config.json as a dict; a folder without one, or one that is not JSON, is refused naming
    it (an empty folder given to init_from was a FileNotFoundError traceback, a torn config.json a JSONDecodeError).
    None for a name that is not a local folder (a hub name)."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    config = folder / "config.json"
    if not config.is_file():
        raise MissingFileError(
            f"{folder} is a folder without a config.json, not a {what} folder: give a Hugging Face model folder "
            "(config.json and model.safetensors) or a .ckpt written by `fit`"
        )
    try:
        return json.loads(config.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BadFileError(f"{config} is not a JSON config ({error}): copy the model folder again") from None
