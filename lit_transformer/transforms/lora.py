"""LoRA fine-tuning through Hugging Face `peft`, applied to the plain model from outside (as activation checkpointing
and compile are): `--config configs/finetune/lora.yaml` with any preset, task and `--model.init_from`.

peft injects its LoRA layers in place of the targeted Linear layers (`qkv` becomes `qkv.base_layer` beside
`qkv.lora_A.default` and `qkv.lora_B.default`); every other parameter is frozen, except the extras named in
`LoraOptions.trainable` and any the base does not supply (a new classification head). So the optimizer holds only
what trains, and a checkpoint holds only that plus a fingerprint of the frozen base weights: loading it re-reads the
base from `init_from` and refuses one whose fingerprint differs. `merged` folds the adapters back into plain Linear
layers (peft's merge), which is what `generate`, `translate` and `export` use. `LoraAdapters` (below) is all of it that a
training run needs: the ModelTransform that `build_transforms` makes of LitTransformer's `lora` argument.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from lit_transformer.errors import ConfigError, MissingFileError
from lit_transformer.model import ENCODER_PREFIXES
from lit_transformer.transforms.base import ModelTransform
from lit_transformer.transforms.options import ATTENTION, FEED_FORWARD, LoraOptions

ADAPTER = "default"  # peft's adapter name: its parameters are named `lora_A.default.weight`
# A checkpoint's model weights: Lightning's, and the trained weights an EMA callback keeps beside its average.
WEIGHT_STATES = ("state_dict", "current_model_state")
# Prefixes that wrappers add to parameter names but not to state-dict keys (activation checkpointing, compile).
_WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def state_key(name: str) -> str:
    """A parameter's name as its state-dict key: without the parts wrappers add."""
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    return name


def clean_name(name: str) -> str:
    """A parameter's name as the base model knows it: a state-dict key without peft's `base_layer`."""
    return state_key(name).replace(".base_layer.", ".")


def target_names(model: nn.Module, targets: Iterable[str]) -> list[str]:
    """The full names of the Linear layers inside the blocks whose names end with one of `targets`."""
    targets = list(targets)
    linear = [
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and name.startswith(("encoder_blocks.", "decoder_blocks."))
    ]
    chosen = [name for name in linear if any(name == t or name.endswith("." + t) for t in targets)]
    # The model's own names that a topology lacks (cross-attention's q and kv in a decoder-only model) are fine.
    unmatched = [
        t
        for t in targets
        if t not in ATTENTION + FEED_FORWARD and not any(n == t or n.endswith("." + t) for n in linear)
    ]
    if unmatched or not chosen:
        unmatched = unmatched or targets
        endings = sorted({name.split(".", 2)[-1] for name in linear})
        raise ConfigError(
            f"lora.target_modules {unmatched} name no Linear layer of this model's blocks; its blocks have "
            f"{', '.join(endings)} (attention: {', '.join(ATTENTION)}; feed-forward: {', '.join(FEED_FORWARD)})"
        )
    return chosen


def _matches(name: str, pattern: str) -> bool:
    from fnmatch import fnmatchcase

    return any(fnmatchcase(name, p) for p in (pattern, pattern + ".*", "*." + pattern, "*." + pattern + ".*"))


def extra_names(model: nn.Module, patterns: Iterable[str]) -> set[str]:
    """Names of the parameters `patterns` (LoraOptions.trainable) select; a pattern that selects none is an error."""
    norms = {
        f"{module_name}.{param_name}" if module_name else param_name
        for module_name, module in model.named_modules()
        if "norm" in type(module).__name__.lower()
        for param_name, _ in module.named_parameters(recurse=False)
    }
    # Aliases too: a tied output layer's `lm_head.weight` is the embedding's parameter under its own name.
    names = [n for n, _ in model.named_parameters(remove_duplicate=False) if ".lora_" not in n]
    chosen: set[str] = set()
    for pattern in patterns:
        if pattern == "norms":
            found = {n for n in names if n in norms}
        elif pattern == "biases":
            found = {n for n in names if n.endswith(".bias")}
        else:
            found = {n for n in names if _matches(clean_name(n), pattern)}
        if not found:
            # Each block's layers once (decoder_blocks.*.ff.up), then the model's own (tgt_embed, lm_head, ...).
            modules = {re.sub(r"_blocks\.\d+\.", "_blocks.*.", clean_name(n).rsplit(".", 1)[0]) for n in names}
            raise ConfigError(
                f"lora.trainable {pattern!r} selects no parameter; use norms, biases, or a name or glob of: "
                + ", ".join(sorted(modules, key=lambda m: ("_blocks." in m, m)))
            )
        chosen |= found
    return chosen


def apply_lora(model: nn.Module, options: LoraOptions, new: Iterable[str] = ()) -> list[str]:
    """Inject peft's LoRA layers into `model` in place and freeze all but the adapters, the extras and `new` (names
    of parameters the base did not supply). Returns the state-dict keys (model-relative) of what trains."""
    from peft import LoraConfig
    from peft.tuners.lora import LoraModel

    config = LoraConfig(
        r=options.rank,
        lora_alpha=options.alpha,
        lora_dropout=options.dropout,
        target_modules=target_names(model, options.target_modules),
        bias="none",
    )
    LoraModel(model, config, ADAPTER)  # injects in place (peft's inject_adapter_in_model) and freezes the rest
    extras = extra_names(model, options.trainable) | {n for n, _ in model.named_parameters() if clean_name(n) in new}
    for name, param in model.named_parameters(remove_duplicate=False):
        if name in extras:
            param.requires_grad_(True)
    return trainable_keys(model)


def trainable_keys(model: nn.Module) -> list[str]:
    """State-dict keys of the trainable parameters, tied aliases included (a trained embedding's tied output)."""
    return sorted({state_key(n) for n, p in model.named_parameters(remove_duplicate=False) if p.requires_grad})


def fingerprint(model: nn.Module) -> str:
    """A SHA-256 of the frozen parameters (names, shapes, dtypes, values): the base the adapters were trained on."""
    digest = hashlib.sha256()
    frozen = {clean_name(n): p for n, p in model.named_parameters() if not p.requires_grad}
    for name in sorted(frozen):
        tensor = frozen[name].detach().cpu().contiguous()
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()[:16]


def merged(model: nn.Module) -> nn.Module:
    """`model` with every LoRA layer merged into its base Linear (peft's merge) and unwrapped, in place: a plain
    model again, whose logits equal the adapted model's (1e-5 in fp32), and whose parameters all train."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    for name, module in list(model.named_modules()):
        if isinstance(module, BaseTunerLayer):
            module.merge(safe_merge=True)
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, child, module.get_base_layer())
    if hasattr(model, "peft_config"):
        del model.peft_config
    for param in model.parameters():
        param.requires_grad_(True)
    return model


def count(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameters, each tensor once."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


# ---- checkpoints ----------------------------------------------------------------------------------------------


def base_mismatch_message(what: str, base: str | None, saved: str, now: str) -> str:
    return (
        f"{what} holds LoRA adapters trained on other base weights than those loaded now from init_from {base}: "
        f"base fingerprint {saved} in the checkpoint, {now} now. The adapters only mean something on their own base: "
        "restore the base weights they were trained on (the same folder or checkpoint, unchanged), or start a new "
        "fine-tuning run from this base."
    )


def missing_base_message(what: str, base: str, flag: str | None) -> str:
    """A LoRA checkpoint whose recorded base (init_from) is gone: which path, and how to say where the base is now."""
    where = (
        f"point at where it is now with {flag} (the same weights: their fingerprint is checked)"
        if flag
        else "put the base back at that path"
    )
    return f"{what} holds LoRA adapters for the base {base}, which does not exist (moved, or another machine?): {where}"


def strip_checkpoint(checkpoint: dict[str, Any], keys: Iterable[str], record: dict[str, Any], prefix: str = "") -> None:
    """Keep only the trainable tensors in checkpoint['state_dict'] and record the base (`lora`: its init_from and
    fingerprint, the parameter counts)."""
    keep = {prefix + k for k in keys}
    # current_model_state: the trained weights an EMA (WeightAveraging) callback keeps beside its average in state_dict
    for key in WEIGHT_STATES:
        if isinstance(checkpoint.get(key), Mapping):
            checkpoint[key] = {k: v for k, v in checkpoint[key].items() if k in keep}
    checkpoint["lora"] = dict(record)


def complete_checkpoint(
    checkpoint: dict[str, Any],
    full_state: Mapping[str, torch.Tensor],
    expected: str,
    what: str = "The checkpoint",
    base: str | None = None,
) -> None:
    """Check the checkpoint's base fingerprint against `expected` (the base loaded now, from `base`, by default the
    recorded one) and fill its state dict with the frozen base tensors of `full_state`, so a strict load checks every
    key as usual."""
    from lit_transformer.checkpoints.files import CheckpointError

    record = checkpoint.get("lora")
    if record is None:
        raise CheckpointError(
            f"{what} holds a full model, not LoRA adapters, but this model applies model.lora: load it without "
            "--model.lora (or fine-tune from it: --model.init_from CHECKPOINT --config configs/finetune/lora.yaml)"
        )
    if record.get("fingerprint") != expected:
        loaded = base or record.get("base")
        raise CheckpointError(base_mismatch_message(what, loaded, record.get("fingerprint"), expected))
    for key in WEIGHT_STATES:
        if isinstance(checkpoint.get(key), Mapping):
            checkpoint[key] = {**full_state, **checkpoint[key]}


def load_adapted(
    model: nn.Module,
    checkpoint: dict[str, Any],
    new: Iterable[str] = (),
    path: str = "The checkpoint",
    base: str | None = None,
) -> nn.Module:
    """`model` (the base, read again from init_from) with a LoRA checkpoint's adapters applied, checked against the
    base's fingerprint, loaded, and merged: a plain model. `new`: the parameters the base does not supply."""
    from lit_transformer.checkpoints.files import load_model_state

    hparams = checkpoint.get("hyper_parameters") or {}
    apply_lora(model, LoraOptions.of(hparams.get("lora")) or LoraOptions(), new)
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    checkpoint = {**checkpoint, "state_dict": dict(checkpoint["state_dict"])}
    complete_checkpoint(checkpoint, state, fingerprint(model), str(path), base)
    wrapper = nn.Module()
    wrapper.model = model
    load_model_state(wrapper, checkpoint, current=getattr(model, "config", None))
    return merged(model).eval()


def describe(trainable: int, total: int, record: Mapping[str, Any] | None = None) -> str:
    """One line: what trains, of how much, and what a checkpoint holds against the full model's."""
    line = f"{trainable:,} of {total:,} parameters train ({100 * trainable / max(total, 1):.2f}%)"
    if record is not None:
        # Weights and the two Adam moments of what trains, against the same for the whole model (fp32).
        line += (
            f"; a checkpoint holds ~{_mb(12 * trainable)} (weights and Adam state of what trains) against "
            f"~{_mb(12 * record.get('base_params', total))} for full fine-tuning"
        )
    return line


def report_checkpoint(trainer: Any, record: Mapping[str, Any]) -> None:
    """Print the size of the run's last LoRA checkpoint on disk beside the full model's (its weights and Adam state)."""
    import os

    paths = {getattr(c, "last_model_path", "") for c in trainer.checkpoint_callbacks} - {""}
    for path in sorted(p for p in paths if os.path.isfile(p)):
        print(
            f"LoRA checkpoint {path}: {_mb(os.path.getsize(path))} on disk; the full model's weights and Adam state "
            f"alone would take ~{_mb(12 * record.get('base_params', record['total_params']))}",
            flush=True,
        )


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.2f} MB" if nbytes >= 1e5 else f"{nbytes / 1e3:.1f} kB"


def options_dict(options: LoraOptions | None) -> dict[str, Any] | None:
    """As hyperparameters record it: a plain dict (checkpoints load with weights_only)."""
    return dataclasses.asdict(options) if options is not None else None


# ---- the component LitTransformer applies ----------------------------------------------------------------------


def is_missing_path(init_from: str) -> bool:
    """Whether `init_from` names a local file or folder (a .ckpt, or a path as resolve_folder tells one from a hub
    name) that is not there: a base that moved, or a run on another machine."""
    from pathlib import Path

    from lit_transformer.data.sources import is_local_name

    name = str(init_from)
    local = name.endswith(".ckpt") or is_local_name(name)
    return local and not Path(name).expanduser().exists()


def locate_lora_base(recorded: str | None, given: str | None, what: str, flag: str | None) -> str:
    """The base a LoRA checkpoint's adapters are read onto: `given` (where it is now) over the `recorded` init_from.
    FileNotFoundError names the missing path and `flag`, the way to say where the base is now (one message for the
    CLI, inference and the Python API)."""
    from lit_transformer.transforms.lora import missing_base_message

    if given:
        if is_missing_path(given):
            raise MissingFileError(
                f"the LoRA base {given} does not exist (given for {what}, whose recorded base is {recorded})"
            )
        return given
    if not recorded:
        raise MissingFileError(f"{what} holds LoRA adapters but names no base (init_from) to apply them to")
    if is_missing_path(recorded):
        raise MissingFileError(missing_base_message(what, recorded, flag))
    return recorded


def new_parameters(model: nn.Module, init_from: str | None) -> set[str]:
    """Parameters the base does not supply: a new head over an encoder checkpoint (see load_pretrained_encoder)."""
    if not init_from or not str(init_from).endswith(".ckpt") or not model.config.is_encoder_only:
        return set()
    return {n for n, _ in model.named_parameters() if not n.startswith(ENCODER_PREFIXES)}


class LoraAdapters(ModelTransform):
    """All that LoRA does in a run, applied to LitTransformer's model from outside (see ModelTransform): adapters in,
    the rest frozen (configure_model); the parameter report (fit start) and the checkpoint's size (fit end); a
    checkpoint cut to what trains plus the base's fingerprint (save), completed from the base read again (load)."""

    rereads_base = True

    def __init__(self, options: LoraOptions | Mapping[str, Any], base: str | None) -> None:
        """`base`: the init_from the adapters adapt; it must exist (a checkpoint's base that moved, or a typo)."""
        self.options = LoraOptions.of(options)
        if not base:
            raise ConfigError(
                "model.lora adapts pretrained weights: give them with --model.init_from (a Hugging Face GPT-2, Llama or "
                "Marian folder, or a .ckpt of ours)"
            )
        locate_lora_base(base, None, "model.lora", "--model.init_from PATH (load_from_checkpoint(..., init_from=PATH))")
        self.base = base
        self.keys: list[str] = []  # state-dict keys (model-relative) of what trains, once applied
        self.record: dict[str, Any] | None = None  # the base's init_from and fingerprint, the counts, once applied

    def hparams(self) -> dict[str, Any]:
        return {"lora": options_dict(self.options)}

    def apply(self, module: Any) -> None:
        if self.record is not None:
            return
        self.keys = apply_lora(module.model, self.options, new_parameters(module.model, self.base))
        trainable, total = count(module.model)
        # the full model's size is the base's: the adapters' factors are not part of it (they counted 12 bytes each)
        base = sum(p.numel() for name, p in module.model.named_parameters() if ".lora_" not in name)
        self.record = {"base": self.base, "fingerprint": fingerprint(module.model),
                       "trainable_params": trainable, "total_params": total, "base_params": base}  # fmt: skip

    def on_fit_start(self, module: Any) -> None:
        if module.trainer.is_global_zero:
            print("LoRA: " + describe(*count(module.model), self.record), flush=True)

    def on_fit_end(self, module: Any) -> None:
        if self.record is not None and module.trainer.is_global_zero:
            report_checkpoint(module.trainer, self.record)

    def on_save_checkpoint(self, module: Any, checkpoint: dict[str, Any]) -> None:
        if self.record is not None:  # the adapters and extras only, and the base they belong to
            strip_checkpoint(checkpoint, self.keys, self.record, prefix="model.")

    def on_load_checkpoint(self, module: Any, checkpoint: dict[str, Any]) -> None:
        """The base tensors, loaded again from init_from, if they are the adapters' base."""
        self.apply(module)
        complete_checkpoint(checkpoint, module.state_dict(), self.record["fingerprint"], base=self.base)

    def to_plain(self, module: Any) -> None:
        if self.record is not None:  # int8 layers take plain Linear weights: the adapters merged in
            merged(module.model)
