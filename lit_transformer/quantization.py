"""Dynamic int8 quantization of a Transformer for CPU inference.

Decoding one row on a CPU streams every weight once per token (docs/performance.md): int8 weights are a quarter of
the bytes of fp32 ones. `quantize_int8` replaces the Linear layers with torch's dynamic int8 Linear
(`torch.ao.quantization.quantize_dynamic`, per output channel weight scales; activations are quantized per call from
their own range), leaving embeddings, positions and LayerNorms fp32.

The output layer is a choice (`lm_head`): it is tied to the embedding in most presets. Quantizing it makes an int8
copy for the projection while the embedding lookup keeps the fp32 matrix, so the tie stays exact where it matters
(the embedding) and the projection, the largest single matmul of a decoding step, streams a quarter of the bytes.
It is the default because it is the faster choice (docs/performance.md, "int8 dynamic quantization": batch-1 greedy
3.09x fp32 against 2.11x with an fp32 head); `lm_head=False` keeps it fp32.

The KV cache, sampling and beam search are untouched: they see fp32 activations and fp32 logits.
"""

from __future__ import annotations

import copy
import warnings
from typing import Literal

import torch
from torch import Tensor, nn

from lit_transformer.model import Transformer

Quantize = Literal["none", "int8"]
"""The values of every `--quantize` flag."""

_QUANTIZED_LINEAR = torch.ao.nn.quantized.dynamic.Linear
# The operator itself: both torch.ops call paths (the overload packet and the overload) first scan their arguments in
# Python for fake script objects (which only tracing makes), a cost on every call of a decoding step.
_LINEAR_DYNAMIC = torch.ops.quantized.linear_dynamic.default
_LINEAR_DYNAMIC_OP = getattr(_LINEAR_DYNAMIC, "_op", _LINEAR_DYNAMIC)


class Int8Linear(_QUANTIZED_LINEAR):
    """torch's dynamic int8 Linear (the same packed weights, kernel and result) with a leaner forward, which calls the
    operator directly. torch's forward reaches it through the torch.ops wrappers, whose per-call Python checks and
    an output conversion (to the fp32 it already is) cost a few microseconds on each of a decoding step's 13 Linear
    calls at the translation preset's size (docs/performance.md, "Per-step overhead"). Fake weights (tracing) and
    fp16 weights take torch's own forward."""

    def forward(self, x: Tensor) -> Tensor:
        packed = self._packed_params
        weights = packed._packed_params
        if packed.dtype != torch.qint8 or not isinstance(weights, torch.ScriptObject):
            return super().forward(x)
        reduce_range = self.version is not None and self.version >= 4  # as torch's forward decides it
        y = _LINEAR_DYNAMIC_OP(x, weights, reduce_range)
        return y if y.dtype == x.dtype else y.to(x.dtype)


class QuantizationError(ValueError):
    """A model or setting that dynamic int8 quantization cannot serve; the message says why and what to do."""


def is_quantized(model: nn.Module) -> bool:
    """Whether any layer of `model` is a dynamic int8 Linear."""
    return any(isinstance(m, _QUANTIZED_LINEAR) for m in model.modules())


def check_quantizable(model: nn.Module) -> None:
    """Refuse what the int8 kernels cannot run: a GPU model, a model in training mode, a non-fp32 model."""
    params = list(model.parameters())
    device = params[0].device if params else torch.device("cpu")
    if device.type != "cpu":
        raise QuantizationError(
            f"int8 dynamic quantization runs on the CPU only (the model is on {device}): use --device cpu, or "
            "bf16/fp16 on a GPU instead"
        )
    if model.training:
        raise QuantizationError(
            "int8 dynamic quantization is for inference: its Linear layers have no gradient. Call model.eval(), and "
            "train the fp32 model (quantize the checkpoint afterwards)"
        )
    dtypes = {p.dtype for p in params if p.is_floating_point()}
    if dtypes - {torch.float32}:
        raise QuantizationError(
            f"int8 dynamic quantization starts from fp32 weights; this model has {sorted(map(str, dtypes))}"
        )
    if torch.backends.quantized.engine == "none":
        raise QuantizationError("this PyTorch build has no quantized CPU engine (x86, fbgemm or qnnpack)")


def quantize_int8(model: Transformer, *, lm_head: bool = True, inplace: bool = False) -> Transformer:
    """`model` with its Linear layers as dynamic int8 Linears (per-channel weight scales), in eval mode, on the CPU.

    lm_head=True quantizes the output projection too (an int8 copy; a tied embedding keeps its fp32 matrix for
    lookups); False keeps it fp32. A padded vocabulary keeps working: Transformer._logits slices whatever the layer.
    """
    check_quantizable(model)
    if is_quantized(model):
        raise QuantizationError("the model is already quantized")
    target = model if inplace else copy.deepcopy(model)
    spec: dict[str, object] = {
        name: torch.ao.quantization.per_channel_dynamic_qconfig
        for name, module in target.named_modules()
        if isinstance(module, nn.Linear) and (lm_head or module is not target.lm_head)
    }
    with warnings.catch_warnings():
        # torch.ao.quantization warns that it moves to torchao; its eager dynamic path still works in this torch and
        # needs no extra dependency (torchao's int8 path is measured in docs/performance.md against it).
        warnings.simplefilter("ignore", category=UserWarning)
        warnings.simplefilter("ignore", category=DeprecationWarning)
        torch.ao.quantization.quantize_dynamic(
            target, spec, dtype=torch.qint8, mapping={nn.Linear: Int8Linear}, inplace=True
        )
    target.quantization = {"method": "int8_dynamic", "lm_head": lm_head}
    return target.eval()


def quantized_state(model: Transformer) -> dict[str, Tensor]:
    """Plain tensors for a safetensors file: each int8 Linear as `.weight` (int8), `.weight_scale`, `.bias`; every
    other tensor as is, aliases (a tied matrix) written once."""
    tensors: dict[str, Tensor] = {}
    skip: set[str] = set()
    for name, module in model.named_modules():
        if isinstance(module, _QUANTIZED_LINEAR):
            weight, bias = module._weight_bias()
            if weight.qscheme() not in (torch.per_channel_affine, torch.per_channel_symmetric):
                raise QuantizationError(f"{name}: expected per-channel weight scales, got {weight.qscheme()}")
            tensors[f"{name}.weight"] = weight.int_repr().contiguous()
            tensors[f"{name}.weight_scale"] = weight.q_per_channel_scales().float().contiguous()
            if bias is not None:
                tensors[f"{name}.bias"] = bias.detach().contiguous()
            skip.add(f"{name}.")
    seen: set[int] = set()
    for key, value in model.state_dict().items():
        if not isinstance(value, Tensor) or any(key.startswith(p) for p in skip) or key in tensors:
            continue
        if value.data_ptr() in seen:  # a tied matrix: Transformer(config) ties it again on load
            continue
        seen.add(value.data_ptr())
        tensors[key] = value.contiguous()
    return tensors


def load_quantized_state(model: Transformer, tensors: dict[str, Tensor], *, lm_head: bool) -> Transformer:
    """The int8 model whose quantized_state is `tensors`: `model` (fp32, fresh) quantized in place, then filled."""
    quantize_int8(model.eval(), lm_head=lm_head, inplace=True)
    tensors = dict(tensors)
    quantized = []
    for name, module in model.named_modules():
        if isinstance(module, _QUANTIZED_LINEAR):
            quantized.append(name)
            int8 = tensors.pop(f"{name}.weight")
            scale = tensors.pop(f"{name}.weight_scale").double()
            zero = torch.zeros_like(scale, dtype=torch.long)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", category=UserWarning)
                weight = torch._make_per_channel_quantized_tensor(int8, scale, zero, 0)
            module.set_weight_bias(weight, tensors.pop(f"{name}.bias", None))
    # Every other tensor is copied into place (load_state_dict would ask the int8 layers for their own entries).
    state = {
        k: v
        for k, v in model.state_dict(keep_vars=True).items()
        if isinstance(v, Tensor) and not any(k.startswith(f"{p}.") for p in quantized)
    }
    unexpected = sorted(set(tensors) - set(state))
    with torch.no_grad():
        for key, value in tensors.items():
            if key in state:
                state[key].copy_(value)
    filled = {state[k].data_ptr() for k in tensors if k in state}
    missing = sorted(k for k, v in state.items() if v.data_ptr() not in filled)  # a tie is filled through its alias
    if missing or unexpected:
        raise QuantizationError(f"the int8 weights do not match the config: missing {missing}, unexpected {unexpected}")
    return model
