"""ONNX: the graphs a deployment runs, and a generation loop over onnxruntime that gives our tokens.

Two kinds of graph, both exported with torch.export (dynamo) from thin wrappers around the model's own methods:

- The logits graph (`export_onnx`, `model.onnx`): decoder-only input_ids (batch, sequence) -> logits (batch, sequence,
  vocab), the plain causal pass without cache or padding mask (feed unpadded rows); encoder-only input_ids and
  attention_mask -> logits, (batch, num_labels) for a classifier, (batch, sequence, vocab) for a masked LM.
- The decoding graphs (`export_onnx_folder`): `decoder.onnx`, one decoding step of either topology with the
  self-attention keys and values of earlier tokens as inputs (`past.{i}.key`, `past.{i}.value`, (batch, n_kv_heads,
  past, head_dim)) and outputs (`present.{i}.*`, past + new positions), the padding mask as an input, and the
  next-token logits (batch, vocab) of the last position; for the encoder-decoder also `encoder.onnx`: source_ids
  and source_mask -> the cross-attention keys and values of every decoder layer (`cross.{i}.key`, `cross.{i}.value`,
  computed once per source, as our KV cache does), or with cross_kv="memory" the encoder's memory, from which each
  step recomputes them. `onnx.json` names the files, inputs and outputs.

The past of a decoding graph is never empty: every cache starts with one slot whose attention_mask is 0 (the first
call feeds zeros there). A zero-length axis is what torch.export cannot keep dynamic; a masked slot is what the model
already does with left padding (positions count real tokens only), so one graph serves the prompt and every step.
attention_mask covers that slot, the past and the new tokens: (batch, 1 + past real slots + new).

`vocab` is the true vocabulary: a padded output layer (pad_vocab_to_multiple_of) is sliced inside the graph.
`OnnxModel(folder).generate(...)` decodes with the same GenerationConfig semantics and the same code as
Transformer.generate (greedy, sampling, beam search with its length penalties, early stopping, max_source_offset,
padding on either side, the sliding window): only the forward passes run in onnxruntime.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from lit_transformer.config import GenerationConfig, TransformerConfig
from lit_transformer.errors import BadFileError, ConfigError
from lit_transformer.model import Transformer
from lit_transformer.model.attention import KVCache
from lit_transformer.model.blocks import LayerCache
from lit_transformer.model.generation import IncrementalDecoder, Streamer, decode, plan_decoding

FORMAT = "lit_transformer-onnx"
CrossKV = Literal["cached", "memory"]
PAST_SLOTS = 1
"""Masked slots every decoding cache starts with (see the module docstring)."""


class CausalLogits(nn.Module):
    """The decoder alone, without the padding-mask inference that reads token values (a data-dependent branch)."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.model.decode(input_ids)


class EncoderLogits(nn.Module):
    """The encoder-only forward with the attention mask always applied (no branch on whether it pads anything)."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.model.encoder_only(input_ids, attention_mask)


def export_onnx(model: Transformer, path: str | os.PathLike, opset: int = 18) -> Path:
    """Write the logits graph `path` (.onnx) with dynamic batch and sequence axes (sequence up to max_seq_len)."""
    cfg = model.config
    if cfg.is_encoder_decoder:
        raise ConfigError(
            "the logits graph covers decoder-only and encoder-only models; an encoder-decoder exports as an encoder "
            "graph and a decoder-step graph: export_onnx_folder (or `export --format onnx`)"
        )
    encoder = cfg.is_encoder_only
    wrapper = EncoderLogits(model) if encoder else CausalLogits(model)
    # Up to max_seq_len (one less when a [CLS] is prepended): the learned table ends there, and the sinusoidal one is
    # traced from its cached table.
    longest = cfg.max_seq_len - (cfg.is_classifier and cfg.pooling == "cls")
    example = torch.full((2, min(8, longest)), cfg.eos_token_id or 0, dtype=torch.long)
    axes = {0: torch.export.Dim("batch", min=1), 1: torch.export.Dim("sequence", min=1, max=longest)}
    args: tuple[Tensor, ...] = (example,)
    names = ["input_ids"]
    dynamic: dict[str, Any] = {"input_ids": axes}
    if encoder:
        args += (torch.ones_like(example, dtype=torch.bool),)
        names.append("attention_mask")
        dynamic["attention_mask"] = axes
    return _export(wrapper, args, names, ["logits"], dynamic, path, opset)


# What torch's exporter says that a user can do nothing about: it skips torchvision's operators when torchvision is
# absent (this model has none), and torch's own pytree code warns about a deprecation inside torch.
EXPORTER_NOISE_LOGGERS = ("torch.onnx._internal.exporter._registration",)
EXPORTER_NOISE_WARNINGS = (r"`isinstance\(treespec, LeafSpec\)` is deprecated",)


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """torch.onnx.export without the lines of EXPORTER_NOISE_*; its other warnings and errors still show."""
    loggers = [logging.getLogger(name) for name in EXPORTER_NOISE_LOGGERS]
    levels = [logger.level for logger in loggers]
    with warnings.catch_warnings():
        for message in EXPORTER_NOISE_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=FutureWarning)
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for logger, level in zip(loggers, levels, strict=True):
                logger.setLevel(level)


def _export(
    wrapper: nn.Module, args: tuple, names: list[str], outputs: list[str], dynamic: Any, path, opset: int
) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad(), _quiet_exporter():
        program = torch.onnx.export(
            wrapper.eval(),
            args,
            input_names=names,
            output_names=outputs,
            dynamic_shapes=dynamic,
            opset_version=opset,
            dynamo=True,
            external_data=False,
            verbose=False,
        )
    program.save(os.fspath(path))
    return path


# ---------------------------------------------------------------- decoding graphs


class _PastKV:
    """A self-attention cache in functional form: the given past, to which a step's keys and values are appended
    (a concatenation the graph outputs as the present). The model's decode reads `length` and calls `append`."""

    def __init__(self, k: Tensor, v: Tensor) -> None:
        self.k, self.v, self.length = k, v, k.shape[2]

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.k, self.v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        return self.k, self.v


class DecoderStep(nn.Module):
    """`Transformer.decode` with its cache as inputs and outputs. Inputs: input_ids (B, t), attention_mask (B, P + t),
    then for the encoder-decoder source_mask (B, S); then past K and V per layer; then, for the encoder-decoder, the
    cross-attention K and V per layer (cross_kv="cached") or the memory (B, S, d_model). Outputs: logits (B, V) of the
    last position, then the present K and V per layer."""

    def __init__(self, model: Transformer, cross_kv: CrossKV = "cached") -> None:
        super().__init__()
        self.model, self.cross_kv = model, cross_kv

    def forward(self, input_ids: Tensor, attention_mask: Tensor, *states: Tensor) -> tuple[Tensor, ...]:
        model, n = self.model, len(self.model.decoder_blocks)
        memory = source_mask = None
        if model.config.is_encoder_decoder:
            source_mask, *states = states
            source_mask = source_mask.bool()
        past, rest = states[: 2 * n], states[2 * n :]
        caches = []
        for i in range(n):
            cross = None
            if model.config.is_encoder_decoder and self.cross_kv == "cached":
                cross = KVCache()
                cross.append(rest[2 * i], rest[2 * i + 1])
            caches.append(LayerCache(_PastKV(past[2 * i], past[2 * i + 1]), cross))
        if model.config.is_encoder_decoder and self.cross_kv == "memory":
            memory = rest[0]
        logits = model.decode(
            input_ids, memory, tgt_mask=attention_mask.bool(), memory_mask=source_mask, cache=caches, last_only=True
        )
        return logits[:, -1], *(t for c in caches for t in (c.self_attn.k, c.self_attn.v))


class EncoderStates(nn.Module):
    """source_ids (B, S), source_mask (B, S) -> the cross-attention K and V of every decoder layer, (B, H, S, D)
    each (cross_kv="cached"), or the memory (B, S, d_model)."""

    def __init__(self, model: Transformer, cross_kv: CrossKV = "cached") -> None:
        super().__init__()
        self.model, self.cross_kv = model, cross_kv

    def forward(self, source_ids: Tensor, source_mask: Tensor) -> tuple[Tensor, ...]:
        memory = self.model.encode(source_ids, source_mask.bool())
        if self.cross_kv == "memory":
            return (memory,)
        return tuple(t for block in self.model.decoder_blocks for t in block.cross_attn.memory_kv(memory))


def _kv_names(prefix: str, layers: int) -> list[str]:
    return [f"{prefix}.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]


def export_decoding_graphs(
    model: Transformer, directory: str | os.PathLike, *, cross_kv: CrossKV = "cached", opset: int = 18
) -> dict[str, Any]:
    """Write decoder.onnx (and encoder.onnx for an encoder-decoder) to `directory`; returns their description (the
    "graphs" entry of onnx.json). Batch, new-token, past and source axes are dynamic."""
    cfg = model.config
    if cfg.is_encoder_only:
        raise ConfigError("an encoder_only model does not decode: its graph is the logits graph (export_onnx)")
    directory = Path(directory)
    n, auto = cfg.decoder_layers, torch.export.Dim.AUTO
    # Example sizes all different, so no two dynamic axes are taken for one: batch 2, 3 new tokens, past 4, source 5.
    batch, new, past, source = 2, 3, 4, 5
    first = 3 if cfg.vocab_size > 3 else 0
    ids = torch.full((batch, new), first, dtype=torch.long)
    mask = torch.ones(batch, past + new, dtype=torch.long)
    mask[:, 0] = 0
    kv = torch.zeros(batch, cfg.kv_heads, past, cfg.head_dim)
    args: list[Tensor] = [ids, mask]
    names = ["input_ids", "attention_mask"]
    states = [kv.clone() for _ in range(2 * n)]  # distinct tensors: the exporter would merge aliased inputs
    state_axes = [{0: auto, 2: auto}] * (2 * n)
    state_names = _kv_names("past", n)
    graphs: dict[str, Any] = {}
    if cfg.is_encoder_decoder:
        src = torch.full((batch, source), first, dtype=torch.long)
        src_mask = torch.ones(batch, source, dtype=torch.long)
        encoder_outputs = ["memory"] if cross_kv == "memory" else _kv_names("cross", n)
        _export(
            EncoderStates(model, cross_kv),
            (src, src_mask),
            ["source_ids", "source_mask"],
            encoder_outputs,
            ({0: auto, 1: auto}, {0: auto, 1: auto}),
            directory / "encoder.onnx",
            opset,
        )
        graphs["encoder"] = {
            "file": "encoder.onnx",
            "inputs": ["source_ids", "source_mask"],
            "outputs": encoder_outputs,
        }
        args.append(src_mask)
        names.append("source_mask")
        with torch.no_grad():
            states += list(EncoderStates(model, cross_kv)(src, src_mask))
        state_axes += [{0: auto, 1: auto}] if cross_kv == "memory" else [{0: auto, 2: auto}] * (2 * n)
        state_names += encoder_outputs
    outputs = ["logits", *_kv_names("present", n)]
    # forward(input_ids, attention_mask, *states): the source mask, when there is one, is the first of `states`.
    state_axes = [{0: auto, 1: auto}] * (len(args) - 2) + state_axes
    _export(
        DecoderStep(model, cross_kv),
        (*args, *states),
        names + state_names,
        outputs,
        ({0: auto, 1: auto}, {0: auto, 1: auto}, tuple(state_axes)),
        directory / "decoder.onnx",
        opset,
    )
    graphs["decoder"] = {"file": "decoder.onnx", "inputs": names + state_names, "outputs": outputs}
    return graphs


class _NoPreprocessingAdvice(logging.Filter):
    """quantize_dynamic advises running shape inference first: that concerns static (QDQ) quantization of CNNs; every
    MatMul weight here is an initializer that quantize_dynamic finds without it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()


def quantize_onnx_int8(path: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """onnxruntime's dynamic int8 quantization of a graph's MatMul weights (per output channel); in place by default."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    path = Path(path)
    out = Path(out) if out is not None else path
    quiet = _NoPreprocessingAdvice()
    logging.getLogger().addFilter(quiet)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            target = Path(tmp) / path.name
            quantize_dynamic(path, target, weight_type=QuantType.QInt8, per_channel=True)
            out.write_bytes(target.read_bytes())
    finally:
        logging.getLogger().removeFilter(quiet)
    return out


def _earlier_graphs(directory: Path) -> list[Path]:
    """The graph files an earlier export's onnx.json in `directory` lists: exported again there as another model (a
    language model's model.onnx, then a translation model's encoder and decoder), they stayed beside the new ones.
    Files it does not list are left alone."""
    try:
        listed = json.loads((directory / "onnx.json").read_text()).get("graphs") or {}
    except (OSError, ValueError, AttributeError):
        return []
    names = [graph.get("file") for graph in listed.values() if isinstance(graph, dict)]
    files = [directory / name for name in names if isinstance(name, str) and name == Path(name).name]
    return [path for path in files if path.is_file()]


def export_onnx_folder(
    model: Transformer,
    directory: str | os.PathLike,
    tokenizer=None,
    target_tokenizer=None,
    *,
    quantize: Literal["none", "int8"] = "none",
    cross_kv: CrossKV = "cached",
    logits_graph: bool = True,
    opset: int = 18,
) -> Path:
    """Every graph of `model` and onnx.json describing them, the tokenizer(s) beside; returns the folder.

    decoder-only: model.onnx (the logits graph) and decoder.onnx (a step with past K/V); encoder-decoder:
    encoder.onnx and decoder.onnx; encoder-only: model.onnx. quantize="int8" quantizes every graph's weights with
    onnxruntime (quantize_onnx_int8). logits_graph=False leaves out a decoder-only model's model.onnx (generation
    needs decoder.onnx alone)."""
    from lit_transformer.transforms.int8 import is_quantized

    cfg = model.config
    if is_quantized(model):
        raise ConfigError(
            "the ONNX graphs are traced from the fp32 model: export it with quantize='int8' (onnxruntime quantizes "
            "the graphs) rather than a quantize_int8 model"
        )
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for stale in _earlier_graphs(directory):  # another model's graphs beside this one's would be read as its own
        stale.unlink()
    model = model.cpu().eval()
    graphs: dict[str, Any] = {}
    if cfg.is_encoder_only or (logits_graph and not cfg.is_encoder_decoder):
        export_onnx(model, directory / "model.onnx", opset)
        inputs = ["input_ids", "attention_mask"] if cfg.is_encoder_only else ["input_ids"]
        graphs["logits"] = {"file": "model.onnx", "inputs": inputs, "outputs": ["logits"]}
    if not cfg.is_encoder_only:
        graphs.update(export_decoding_graphs(model, directory, cross_kv=cross_kv, opset=opset))
    if quantize == "int8":
        for graph in graphs.values():
            quantize_onnx_int8(directory / graph["file"])
    description: dict[str, Any] = {
        "format": FORMAT,
        "topology": cfg.topology,
        "graphs": graphs,
        "cross_kv": cross_kv if cfg.is_encoder_decoder else None,
        "past_slots": PAST_SLOTS,
        "layers": 0 if cfg.is_encoder_only else cfg.decoder_layers,
        "kv_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim,
        "quantization": None if quantize == "none" else quantize,
        "config": cfg.to_dict(),
    }
    if tokenizer is not None:
        tokenizer.save(os.fspath(directory / "tokenizer.json"))
        description["tokenizer"] = "tokenizer.json"
        if target_tokenizer is not None and target_tokenizer is not tokenizer:
            target_tokenizer.save(os.fspath(directory / "target_tokenizer.json"))
            description["target_tokenizer"] = "target_tokenizer.json"
    (directory / "onnx.json").write_text(json.dumps(description, indent=2) + "\n")
    return directory


# ---------------------------------------------------------------- generation over onnxruntime


class OnnxModel:
    """The graphs of an export_onnx_folder folder in onnxruntime sessions, generating as Transformer.generate does.

    ``OnnxModel(folder).generate(input_ids, GenerationConfig(num_beams=4), attention_mask=mask)``: the same tokens as
    the PyTorch model (up to float rounding: both are fp32, their sums differ in the last bits). threads sets
    onnxruntime's intra-op threads (None: its default)."""

    drop_if_unpadded = staticmethod(Transformer.drop_if_unpadded)

    def __init__(self, directory: str | os.PathLike, threads: int | None = None, providers=None) -> None:
        import onnxruntime as ort

        self.directory = Path(directory)
        description = json.loads((self.directory / "onnx.json").read_text())
        if description.get("format") != FORMAT:
            raise BadFileError(f"{self.directory}/onnx.json was not written by lit_transformer's ONNX export")
        self.description = description
        self.config = TransformerConfig(**description["config"])
        self.layers, self.cross_kv = description["layers"], description["cross_kv"]
        self.kv_shape = (description["kv_heads"], description["head_dim"])
        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        providers = providers or ["CPUExecutionProvider"]
        self.sessions = {
            name: ort.InferenceSession(os.fspath(self.directory / graph["file"]), options, providers=providers)
            for name, graph in description["graphs"].items()
        }

    def generate(
        self,
        input_ids: Tensor,
        config: GenerationConfig | None = None,
        *,
        attention_mask: Tensor | None = None,
        generator: torch.Generator | None = None,
        streamer: Streamer | None = None,
        **overrides: Any,
    ) -> Tensor:
        """New tokens (B, <= max_new_tokens) as Transformer.generate gives them; use_cache is ignored (the graphs
        always carry the cache)."""
        if "decoder" not in self.sessions:
            raise TypeError("An encoder_only model does not generate: it classifies or fills in masked tokens")
        input_ids = input_ids.cpu()
        attention_mask = None if attention_mask is None else attention_mask.cpu()
        plan = plan_decoding(self, input_ids, attention_mask, config, overrides)
        if plan.gen.compile:
            raise ConfigError(
                "compile=True compiles the PyTorch model's passes; onnxruntime runs its own optimised graphs: leave "
                "compile unset for OnnxModel"
            )
        return decode(self, OnnxDecoder, input_ids, attention_mask, plan, generator, streamer)

    def encode(self, source_ids: np.ndarray, source_mask: np.ndarray) -> list[np.ndarray]:
        """The encoder graph's outputs: cross-attention K/V per layer, or [memory]."""
        return self.sessions["encoder"].run(None, {"source_ids": source_ids, "source_mask": source_mask})

    def step(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        past: list[np.ndarray],
        source_mask: np.ndarray | None = None,
        encoded: list[np.ndarray] | None = None,
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """One decoder-graph call: next-token logits (B, V) and the present K/V (past + new positions)."""
        graph = self.description["graphs"]["decoder"]
        feed = {"input_ids": input_ids, "attention_mask": attention_mask}
        if source_mask is not None:
            feed["source_mask"] = source_mask
        feed.update(zip(graph["inputs"][len(feed) :], [*past, *(encoded or [])], strict=True))
        logits, *present = self.sessions["decoder"].run(None, feed)
        return logits, present


class OnnxDecoder(IncrementalDecoder):
    """IncrementalDecoder whose forward passes run the exported graphs: same windows, padding and beam reordering.
    The cache is the list of present K/V arrays, each starting with the masked slot(s)."""

    model: OnnxModel

    def __init__(
        self,
        model: OnnxModel,
        input_ids: Tensor,
        attention_mask: Tensor | None,
        max_new_tokens: int,
        expand: int = 1,
        use_cache: bool = True,
        window_keep: int | None = None,
    ) -> None:
        self.source_mask: np.ndarray | None = None
        super().__init__(model, input_ids, attention_mask, max_new_tokens, expand, True, window_keep)

    def _encode(self, input_ids: Tensor, src_keep: Tensor | None, expand: int) -> list[np.ndarray]:
        mask = torch.ones_like(input_ids) if src_keep is None else src_keep.long()
        encoded = self.model.encode(input_ids.numpy(), mask.numpy())
        self.source_mask = np.repeat(mask.numpy(), expand, axis=0)
        return [np.repeat(e, expand, axis=0) for e in encoded]

    def _new_cache(self, max_len: int) -> list[np.ndarray]:
        shape = (self.tokens.shape[0], self.model.kv_shape[0], PAST_SLOTS, self.model.kv_shape[1])
        return [np.zeros(shape, dtype=np.float32)] * (2 * self.model.layers)

    def _reorder_cache(self, rows: Tensor) -> None:
        index = rows.numpy()
        self.cache = [c[index] for c in self.cache]

    def _run(self, new_tokens: Tensor) -> Tensor:
        rows, length = self.tokens.shape  # the window, new tokens included: all of it is in the cache after this
        keep = np.ones((rows, length), dtype=np.int64) if self.keep is None else self.keep.long().numpy()
        mask = np.concatenate([np.zeros((rows, PAST_SLOTS), dtype=np.int64), keep], axis=1)
        logits, self.cache = self.model.step(
            np.ascontiguousarray(new_tokens.numpy()), mask, self.cache, self.source_mask, self.memory
        )
        return torch.from_numpy(logits).float()
