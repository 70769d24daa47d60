"""Dynamic int8 quantization of a Transformer for CPU inference.

Decoding one row on a CPU streams every weight once per token (docs/performance.md): int8 weights are a quarter of
the bytes of fp32 ones. `quantize_int8` replaces the Linear layers with torch's dynamic int8 Linear
(`torch.ao.quantization.quantize_dynamic`, per output channel weight scales; activations are quantized per call from
their own range), leaving embeddings, positions and LayerNorms fp32.

The output layer is a choice (`lm_head`): it is tied to the embedding in most presets. Quantizing it makes an int8
copy for the projection while the embedding lookup keeps the fp32 matrix, so the tie stays exact where it matters
(the embedding) and the projection, the largest single matmul of a decoding step, streams a quarter of the bytes.
It is the default because it is the faster choice (docs/performance.md, "int8 decoding": batch-1 greedy
3.09x fp32 against 2.11x with an fp32 head); `lm_head=False` keeps it fp32.

The KV cache, sampling and beam search are untouched: they see fp32 activations and fp32 logits.
"""

from __future__ import annotations

import copy
import warnings
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from lit_transformer.errors import ConfigError
from lit_transformer.transforms.base import ModelTransform
from lit_transformer.transforms.options import Quantize  # noqa: F401 - its home before the transforms package

if TYPE_CHECKING:  # annotations only: the model package never needs this module, nor this module the model's
    from lit_transformer.model import Transformer


_QUANTIZED_LINEAR = torch.ao.nn.quantized.dynamic.Linear
# The operator itself: both torch.ops call paths (the overload packet and the overload) first scan their arguments in
# Python for fake script objects (which only tracing makes), a cost on every call of a decoding step.
_LINEAR_DYNAMIC = torch.ops.quantized.linear_dynamic.default
_LINEAR_DYNAMIC_OP = getattr(_LINEAR_DYNAMIC, "_op", _LINEAR_DYNAMIC)


class Int8Linear(_QUANTIZED_LINEAR):
    """torch's dynamic int8 Linear (the same packed weights, kernel and result) with a leaner forward, which calls the
    operator directly. torch's forward reaches it through the torch.ops wrappers, whose per-call Python checks and
    an output conversion (to the fp32 it already is) cost a few microseconds on each of a decoding step's 13 Linear
    calls at the translation preset's size (docs/performance.md, "int8 decoding"). Fake weights (tracing) and
    fp16 weights take torch's own forward.

    Under torch.compile (GenerationConfig.compile) the packed weights are opaque to the compiler, so the layer runs
    int8_matmul on plain copies of the same int8 weights and scales instead: the same arithmetic as the packed
    kernel, which the compiler can place in one graph with the rest of the step. The copies are non-persistent
    buffers (state_dict is unchanged), made when the weights are set and refreshed by compile_ready.
    """

    _PLAIN = ("int8_weight", "int8_scale", "int8_weight_sum", "int8_bias")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Empty until weights are set (from_float and loading call set_weight_bias) or compile_ready runs: the
        # placeholder weights torch packs here are never unpacked.
        for name in self._PLAIN:
            self.register_buffer(name, None, persistent=False)
        self._plain_of = None

    def forward(self, x: Tensor) -> Tensor:
        if torch.compiler.is_compiling() and self.int8_weight is not None:
            return int8_matmul(x, self.int8_weight, self.int8_scale, self.int8_weight_sum, self.int8_bias)
        packed = self._packed_params
        weights = packed._packed_params
        if packed.dtype != torch.qint8 or not isinstance(weights, torch.ScriptObject):
            return super().forward(x)
        reduce_range = self.version is not None and self.version >= 4  # as torch's forward decides it
        y = _LINEAR_DYNAMIC_OP(x, weights, reduce_range)
        return y if y.dtype == x.dtype else y.to(x.dtype)

    def set_weight_bias(self, w: Tensor, b: Tensor | None) -> None:
        super().set_weight_bias(w, b)
        self.compile_ready()

    def compile_ready(self) -> None:
        """Make the plain int8 copies that the compiled forward reads, unless they already hold the packed weights
        (loading a state dict or deepcopy repacks them: a new packed object, so the copies are remade)."""
        weights = self._packed_params._packed_params
        if self._plain_of is weights:
            return
        plain = None
        # int8_matmul reproduces fbgemm's arithmetic (the x86 and fbgemm engines) with reduce_range (version 4 on);
        # any other layer keeps the packed kernel when compiled too (dynamo then splits the graph around it).
        fbgemm = torch.backends.quantized.engine in ("x86", "fbgemm") and (self.version or 0) >= 4
        if fbgemm and self._packed_params.dtype == torch.qint8 and isinstance(weights, torch.ScriptObject):
            weight, bias = self._weight_bias()
            if weight.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
                scales, zeros = weight.q_per_channel_scales(), weight.q_per_channel_zero_points()
            else:
                scales = torch.full((weight.shape[0],), weight.q_scale(), dtype=torch.float64)
                zeros = torch.full((weight.shape[0],), weight.q_zero_point())
            if bool((zeros == 0).all()):  # quantize_int8's weights are symmetric
                int8 = weight.int_repr().contiguous()  # (out, in): int8_matmul multiplies by its transpose
                plain = (int8, scales.float(), int8.sum(1, dtype=torch.int32), bias)
        for name, value in zip(self._PLAIN, plain or (None,) * 4, strict=True):
            self.register_buffer(name, None if value is None else value.detach(), persistent=False)
        self._plain_of = weights


# fbgemm's ChooseQuantizationParams (ATen quantized/cpu/QuantUtils.h): scales below this are raised to it.
_SMALL_SCALE = 6.1e-5


def input_qparams(x: Tensor) -> tuple[Tensor, Tensor]:
    """The scale and zero point (0-dim fp32 tensors) with which the packed dynamic int8 Linear quantizes its input: one
    pair for the whole tensor, uint8 with reduce_range (0..127), the range widened to hold 0, in double precision,
    as fbgemm's ChooseQuantizationParams computes them, in few tensor operations so that it compiles small.

    fbgemm raises a scale below _SMALL_SCALE to it and widens the range by the same factor; the range's ends in
    units of the scale (from which the zero point comes) are then unchanged, so here the zero point is taken from
    the unraised scale and the scale is raised afterwards."""
    lo = x.amin().double().clamp(max=0.0)
    hi = x.amax().double().clamp(min=0.0)
    qmax = 127.0
    scale = (hi - lo) / qmax
    single = scale.float()
    scale = torch.where((single == 0) | torch.isinf(1.0 / single), torch.full_like(scale, 0.1), scale)
    lo, hi = lo / scale, hi / scale
    # The zero point from whichever end of the range loses less, nudged to an integer in range.
    zero = torch.where(-lo.abs() < qmax - hi.abs(), -lo, qmax - hi)
    return scale.clamp(min=_SMALL_SCALE).float(), zero.clamp(0, qmax).round().float()


def int8_matmul(x: Tensor, weight: Tensor, scale: Tensor, weight_sum: Tensor, bias: Tensor | None) -> Tensor:
    """The dynamic int8 Linear as plain tensor operations: x quantized as input_qparams says, an exact int8 x int8 ->
    int32 product (torch._int_mm with the (out, in) int8 weight's transpose, a view: on a CPU several times faster
    than a contiguous (in, out) copy), the zero point's share removed with each output's weight sum, then scaled
    back by the input's and the output channel's scales.
    The integers equal the packed kernel's; the fp32 results differ from it by at most an ulp or so (the order of the
    final multiplications), measured in tests/test_compiled_decoding.py."""
    features = x.shape[-1]
    # 2-D before quantizing: torch._int_mm on a CPU misreads a (1, K) operand whose row stride is 0, a layout the
    # compiler may give a size-1 view of a 3-D buffer.
    rows = x.reshape(-1, features)
    x_scale, x_zero = input_qparams(rows)
    q = (torch.round(rows * (1.0 / x_scale)) + x_zero).clamp(0, 127).to(torch.int8)
    acc = torch._int_mm(q, weight.t()) - x_zero.int() * weight_sum
    y = acc.float() * (x_scale * scale)
    if bias is not None:
        y = y + bias
    return y.view(*x.shape[:-1], weight.shape[0])


class QuantizationError(ConfigError):
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


class Int8Inference(ModelTransform):
    """`--model.quantize int8` in a run: `validate`, `test` and `predict` swap in int8 Linear layers once the
    checkpoint's weights are loaded (in setup they are not yet: the fp32 checkpoint could not fill int8 layers);
    `fit` is refused, since int8 Linear layers have no gradient. The other transforms fold into plain layers first."""

    def setup(self, module: Any, stage: str) -> None:
        if stage == "fit":
            raise QuantizationError(
                "--model.quantize int8 is for validate, test and predict: int8 Linear layers have no gradient. Train "
                "in fp32 and quantize the checkpoint (`predict --ckpt_path C --model.quantize int8`)"
            )
        trainer = getattr(module, "_trainer", None)  # (module.trainer raises where none is attached)
        precision = str(getattr(trainer, "precision", "32-true"))
        if "mixed" in precision:  # autocast hands the int8 kernels bf16/fp16 inputs, which they cannot take
            raise QuantizationError(
                f"--model.quantize int8 runs in fp32 (its int8 layers take fp32 inputs), not under --trainer.precision "
                f"{precision}: use --trainer.precision 32-true (or leave out the mixed-precision config)"
            )

    def on_inference_start(self, module: Any) -> None:
        if is_quantized(module.model):
            return
        for transform in module.transforms:
            if transform is not self:
                transform.to_plain(module)
        quantize_int8(module.model, inplace=True)
