"""`init_from`: the weights a run starts from, read once when the LightningModule is built.

A Hugging Face GPT-2 or Llama folder (or hub name), a Marian folder (an OPUS-MT download, or `export --format hf` of an
encoder-decoder), a .ckpt of an encoder (a masked LM or a classifier) for an encoder_only model under a new head, or
any other .ckpt of ours (a LoRA one merged), whose whole model continues. The checkpoint's
or folder's tokenizer, when it names one, must be the one this run's data uses: `check_same_tokenizer`.
"""

from __future__ import annotations

import json

from lit_transformer.checkpoints.files import CheckpointError
from lit_transformer.config import TransformerConfig
from lit_transformer.data.text import same_segmentation
from lit_transformer.errors import ConfigError
from lit_transformer.model import ENCODER_PREFIXES, Transformer
from lit_transformer.transforms.lora import locate_lora_base, new_parameters

# Fields that shape the encoder's weights or their meaning: a fine-tuned model takes them from the pretrained one.
ENCODER_FIELDS = (
    "norm_position",
    "positions",
    "rope_theta",
    "norm",
    "vocab_size",
    "pad_vocab_to_multiple_of",
    "d_model",
    "n_heads",
    "n_kv_heads",
    "n_layers",
    "n_encoder_layers",
    "d_ff",
    "max_seq_len",
    "activation",
    "bias",
    "scale_embeddings",
    "layer_norm_eps",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "mask_token_id",
)


def load_init_from(init_from: str, config: TransformerConfig) -> tuple[Transformer, str | None]:
    """The model to start from (in train mode; its config is the resolved architecture) and the tokenizer JSON the
    data must use (None where the source does not name one: a GPT-2 folder's is checked by the data's own link)."""
    if str(init_from).endswith(".ckpt"):
        if config.is_encoder_only:
            return load_pretrained_encoder(init_from, config)
        return load_checkpoint_model(init_from, config)
    from lit_transformer.interop.hf_files import resolve_folder
    from lit_transformer.interop.hf_marian import is_marian_folder, marian_tokenizer_json

    init_from = str(resolve_folder(str(init_from), "init_from model"))  # a hub name: the folder it downloads to
    model = load_hf_model(init_from, base=config).train()
    # A Marian folder names the tokenizer this run's data must use; a GPT-2 or Llama one's is checked by the data's link.
    return model, marian_tokenizer_json(init_from) if is_marian_folder(init_from) else None


def load_hf_model(folder: str, base: TransformerConfig | None = None) -> Transformer:
    """Our Transformer (eval mode) from a Hugging Face folder (or a hub name, downloaded or cached): Marian, Llama or
    else GPT-2, as its config.json says; `base`, when given, supplies dropout and initialisation."""
    from lit_transformer.interop.hf_files import check_hf_config, resolve_folder
    from lit_transformer.interop.hf_gpt2 import load_hf_gpt2
    from lit_transformer.interop.hf_llama import load_hf_llama
    from lit_transformer.interop.hf_marian import is_marian_folder, load_hf_marian

    folder = str(resolve_folder(folder, "model"))  # a hub name: its config.json says Marian, Llama or GPT-2
    check_hf_config(folder)
    if is_marian_folder(folder):
        return load_hf_marian(folder, base=base)
    if hf_model_type(folder) == "llama":
        return load_hf_llama(folder, base=base)
    return load_hf_gpt2(folder, base=base)


def hf_model_type(folder: str) -> str | None:
    """The model_type of a folder's config.json; None without one (a hub name)."""
    from pathlib import Path

    path = Path(folder) / "config.json"
    return json.loads(path.read_text()).get("model_type") if path.is_file() else None


# What a run chooses of a continued checkpoint's model: how it trains, not what it is.
TRAINING_FIELDS = ("dropout", "attention_dropout", "classifier_dropout")


def topology_mismatch(path: str, checkpoint: dict, topology: str) -> ConfigError | None:
    """The refusal of an init_from checkpoint of another topology than the run's (judged before the data is read, and
    again when the model is built): its task's model cannot start this run, and "set the topology to the
    checkpoint's" led to a second refusal, of the data that feeds no such task."""
    from lit_transformer.tasks import task_class_of

    hparams = dict(checkpoint.get("hyper_parameters") or {})
    saved = hparams.get("config")
    held_topology = (
        saved.get("topology", "decoder_only") if isinstance(saved, dict) else getattr(saved, "topology", None)
    )
    if held_topology is None or held_topology == topology:
        return None
    task = task_class_of(hparams)
    held = f"{task.name} model ({held_topology})" if task is not None else f"{held_topology} model"
    return ConfigError(
        f"init_from {path} holds a {held}, and this run builds a {topology} one: start this run from a checkpoint "
        f"of its own kind, or continue that model with its task's config and data (model.config.topology "
        f"{held_topology})",
        keys=["model.init_from", "model.config.topology"],
    )


def load_checkpoint_model(path: str, config: TransformerConfig) -> tuple[Transformer, str | None]:
    """The whole model of one of our checkpoints (a LoRA checkpoint's merged), to continue training it, with this
    run's dropout; and its tokenizer (JSON), which the data must use."""
    from lit_transformer.checkpoints.files import load_checkpoint

    checkpoint = load_checkpoint(path)
    saved = _saved_config(checkpoint)
    if saved is None:
        raise CheckpointError(f"init_from {path}: the checkpoint has no hyper_parameters.config (not written by `fit`)")
    mismatch = topology_mismatch(path, checkpoint, config.topology)
    if mismatch is not None:
        raise mismatch
    resolved = saved.replace(**{name: getattr(config, name) for name in TRAINING_FIELDS})
    model = Transformer(resolved)
    model.load_state_dict(checkpoint_weights(checkpoint, saved, path, flag=None).state_dict())
    return model.train(), checkpoint.get("tokenizer")


def _saved_config(checkpoint: dict) -> TransformerConfig | None:
    from lit_transformer.checkpoints.files import saved_config

    saved = saved_config(checkpoint)
    return TransformerConfig(**saved) if isinstance(saved, dict) else saved


def checkpoint_weights(
    checkpoint: dict,
    config: TransformerConfig,
    path: str = "The checkpoint",
    base: str | None = None,
    flag: str | None = "--base PATH",
) -> Transformer:
    """The model a checkpoint holds: its weights, or (LoRA) its base read again from init_from (or from `base`, where
    it is now), the base's fingerprint checked, and the adapters merged in. `flag`: how the caller's user names the
    base's new location, for the message when the recorded one is gone."""
    from lit_transformer.checkpoints.files import CheckpointError, load_model_state

    if "lora" not in checkpoint:
        if base is not None and flag:  # it was ignored: the user meant some other base to be read
            raise ConfigError(
                f"{flag.split()[0]} {base}: {path} is not a LoRA checkpoint (it holds all its weights), so it has no "
                f"base to read: leave {flag.split()[0]} out"
            )
        model = Transformer(config)
        load_model_state(model, checkpoint, current=config, prefix="model.")
        return model
    from lit_transformer.transforms.lora import load_adapted

    try:
        base = locate_lora_base(checkpoint["lora"].get("base"), base, str(path), flag)
    except FileNotFoundError as error:
        raise CheckpointError(str(error)) from None
    try:
        model, _ = load_init_from(base, config)
    except (OSError, ValueError) as error:
        raise CheckpointError(
            f"{path} holds LoRA adapters for the base {base}, which cannot be read: {error}"
        ) from None
    return load_adapted(model, checkpoint, new_parameters(model, base), str(path), base)


def check_same_tokenizer(init_from: str, expected_json: str, data_tokenizer_json: str) -> None:
    """Refuse data whose tokenizer segments otherwise than the one `init_from` was trained with."""
    if not same_segmentation(data_tokenizer_json, expected_json):
        # The .ckpt or the Marian folder itself names the tokenizer (a folder also its decoder's start token).
        raise ConfigError(
            f"init_from {init_from} was trained with another tokenizer than this run's data: its embeddings would "
            f"meet other ids. Use its tokenizer: --data.init_args.tokenizer {init_from}"
        )


def load_pretrained_encoder(path: str, config: TransformerConfig) -> tuple[Transformer, str | None]:
    """An encoder_only model whose encoder (embeddings, positions, blocks, final norm) comes from the checkpoint at
    `path` (an encoder_only masked LM or classifier) and whose head is new, and the checkpoint's tokenizer (JSON).

    The architecture comes from the checkpoint (ENCODER_FIELDS); the task (head, num_labels, pooling, classifier
    fields, dropout, init) from `config`, so `fit --model.init_from mlm.ckpt` turns a masked LM into a classifier.
    """
    from lit_transformer.checkpoints.files import load_checkpoint

    checkpoint = load_checkpoint(path)
    saved = _saved_config(checkpoint)
    if not isinstance(saved, TransformerConfig) or saved.topology != "encoder_only":
        raise CheckpointError(
            f"init_from {path}: a .ckpt must hold an encoder_only model (a masked LM or a classifier)"
        )
    if config.topology != "encoder_only":
        raise ConfigError(f"init_from {path} holds an encoder; this run's model.config.topology must be encoder_only")
    config = config.replace(**{name: getattr(saved, name) for name in ENCODER_FIELDS})
    model = Transformer(config)
    if "lora" in checkpoint:  # adapters: their base read again and the adapters merged in
        state = checkpoint_weights(checkpoint, saved, path, flag=None).state_dict()
    else:
        state = {k.removeprefix("model."): v for k, v in checkpoint["state_dict"].items() if k.startswith("model.")}
    encoder = {k: v for k, v in state.items() if k.startswith(ENCODER_PREFIXES)}
    missing = [k for k in model.state_dict() if k.startswith(ENCODER_PREFIXES) and k not in encoder]
    if missing:
        raise CheckpointError(f"init_from {path}: the checkpoint lacks encoder weights {missing[:5]}")
    model.load_state_dict(encoder, strict=False)
    return model.train(), checkpoint.get("tokenizer")
