"""The timed sections of `bench speed` (lit_transformer/bench/speed.py parses its options, then runs `measure` here):
each contender of a section runs once per repetition, in alternating order, so drifting load on a shared machine
touches all alike; a row reports the median time of each and the median of the paired per-repetition ratios. Also
the table of a run (`markdown`), which `bench speed --render` prints and docs/performance.md shows.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_transformer.bench import peers
from lit_transformer.config import TransformerConfig
from lit_transformer.engine.monitoring import matmul_peak_flops
from lit_transformer.model import Transformer
from lit_transformer.records import child_env, process_rss_mb, read_runs
from lit_transformer.transforms.activation_checkpointing import apply_activation_checkpointing

OURS = "lit_transformer"
Row = dict[str, object]
CPU_SECTIONS = ["decoder", "seq2seq", "greedy", "sliding", "beam", "quantized", "memory", "lightning"]

# ---------------------------------------------------------------------------------------------- timing


def alternate(contenders: dict[str, Callable[[], object]], reps: int, warmup: int = 1) -> dict[str, list[float]]:
    """Seconds per call of each contender, `reps` times, in an order that reverses every repetition."""
    for _ in range(warmup):
        for fn in contenders.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for rep in range(reps):
        for name in names if rep % 2 == 0 else reversed(names):
            gc.collect()
            start = time.perf_counter()
            contenders[name]()
            times[name].append(time.perf_counter() - start)
    return times


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} load {os.getloadavg()[0]:.2f}] {message}", file=sys.stderr, flush=True)


def summarize(section: str, times: dict[str, list[float]], reference: str = OURS, **extra: object) -> list[Row]:
    """A row per contender: median seconds and the median paired ratio (its time / the reference's time)."""
    rows = []
    progress(f"{section}: done")
    for name, ts in times.items():
        ratios = [t / r for t, r in zip(ts, times[reference], strict=True)]
        rows.append(
            {
                "section": section,
                "contender": name,
                "median_s": statistics.median(ts),
                "ratio": statistics.median(ratios),  # > 1: the reference is faster
                "reps": len(ts),
                **extra,
            }
        )
    return rows


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, forward: Callable[[], Tensor], targets: Tensor):
    """fwd + cross-entropy + bwd + optimizer step, the same for every contender."""

    def step() -> None:
        logits = forward()
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def adamw(model: nn.Module, device: str) -> torch.optim.Optimizer:
    flag = {"fused": True} if device == "cuda" else {"foreach": True}
    return torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, **flag)


# ---------------------------------------------------------------------------------------------- sizes


def sizes(quick: bool) -> dict[str, dict[str, int]]:
    if quick:
        return {
            "decoder": dict(vocab=4096, d=256, heads=4, layers=4, d_ff=1024, ctx=128, batch=4),
            "seq2seq": dict(vocab=4096, d=128, heads=4, layers=2, d_ff=512, ctx=32, batch=16),
            "greedy": dict(prompt=16, new=32),
            "translation": dict(vocab=1024, d=64, heads=4, layers=2, d_ff=256, ctx=128),
            "sliding": dict(new=192),
            "beam": dict(batch=4, src=32, new=16, beams=4),
            "memory": dict(layers=6, ctx=256, batch=4),
            "lightning": dict(steps=6),
        }
    return {
        "decoder": dict(vocab=8192, d=384, heads=6, layers=6, d_ff=1536, ctx=256, batch=8),
        "seq2seq": dict(vocab=8192, d=256, heads=4, layers=3, d_ff=1024, ctx=64, batch=32),
        "greedy": dict(prompt=32, new=128),
        # configs/presets/translate-en-es.yaml's model: shared 6000-token BPE, three-way tying
        "translation": dict(vocab=6000, d=256, heads=4, layers=2, d_ff=1024, ctx=256),
        "sliding": dict(new=768),
        "beam": dict(batch=8, src=64, new=64, beams=4),
        "memory": dict(layers=12, ctx=512, batch=8),
        "lightning": dict(steps=12),
    }


def decoder_config(s: dict[str, int], **overrides) -> TransformerConfig:
    return TransformerConfig(
        topology="decoder_only",
        norm_position="pre",
        positions="learned",
        vocab_size=s["vocab"],
        d_model=s["d"],
        n_heads=s["heads"],
        n_layers=s["layers"],
        d_ff=s["d_ff"],
        max_seq_len=s["ctx"],
        dropout=0.0,
        activation="gelu_tanh",
        pad_token_id=None,
        **overrides,
    )


def seq2seq_config(s: dict[str, int], norm: str = "post", **overrides) -> TransformerConfig:
    return TransformerConfig(
        topology="encoder_decoder",
        norm_position=norm,
        positions="sinusoidal",
        vocab_size=s["vocab"],
        d_model=s["d"],
        n_heads=s["heads"],
        n_layers=s["layers"],
        d_ff=s["d_ff"],
        max_seq_len=max(s["ctx"], 256),
        dropout=0.0,
        activation="relu",
        scale_embeddings=True,
        init="xavier",
        **overrides,
    )


# ---------------------------------------------------------------------------------------------- sections


def bench_decoder(s: dict[str, int], reps: int, device: str, flops_per_step: dict) -> list[Row]:
    """Decoder-only training step against HF GPT-2 (sdpa), x-transformers and litgpt."""
    dims = {k: s[k] for k in ("vocab", "d", "heads", "layers", "d_ff", "ctx")}
    torch.manual_seed(0)
    ids = torch.randint(3, s["vocab"], (s["batch"], s["ctx"] + 1), device=device)
    x, y = ids[:, :-1], ids[:, 1:]
    ours = Transformer(decoder_config(s)).to(device)
    flops_per_step["decoder"] = ours.flops_per_token(s["ctx"]) * x.numel()
    models: dict[str, nn.Module] = {OURS: ours, "HF GPT2LMHeadModel (sdpa)": peers.hf_gpt2(**dims)}
    models["x-transformers"] = peers.x_transformers_decoder(**dims)
    try:
        models["litgpt"] = peers.litgpt_gpt(**dims)
    except ImportError:
        print("litgpt not installed: skipped", file=sys.stderr)
    steps = {}
    for name, model in models.items():
        model.to(device).train()
        steps[name] = train_step(model, adamw(model, device), lambda m=model: m(x), y)
    times = alternate(steps, reps)
    params = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    rows = summarize("decoder-only train step", times)
    for row in rows:
        row["params"] = params[row["contender"]]
    return rows


def bench_seq2seq(s: dict[str, int], reps: int, device: str) -> list[Row]:
    """Encoder-decoder training step against torch.nn.Transformer (post, pre), x-transformers, HF BART and Marian."""
    dims = {k: s[k] for k in ("vocab", "d", "heads", "layers", "d_ff", "ctx")}
    torch.manual_seed(0)
    src = torch.randint(3, s["vocab"], (s["batch"], s["ctx"]), device=device)
    tgt = torch.randint(3, s["vocab"], (s["batch"], s["ctx"] + 1), device=device)
    tgt_in, y = tgt[:, :-1], tgt[:, 1:]
    # Ours without padding masks: the peers are given none either.
    models: dict[str, nn.Module] = {
        OURS: Transformer(seq2seq_config(s, "post", pad_token_id=None)),
        f"{OURS} (pre-LN)": Transformer(seq2seq_config(s, "pre", pad_token_id=None)),
        "torch.nn.Transformer (post-LN)": peers.TorchTransformer(**dims, norm_first=False),
        "torch.nn.Transformer (pre-LN)": peers.TorchTransformer(**dims, norm_first=True),
        "x-transformers XTransformer": peers.XTransformerLogits(**dims),
        "HF BART (sdpa)": peers._LogitsOf(peers.hf_seq2seq("bart", **dims)),
        "HF Marian (sdpa)": peers._LogitsOf(peers.hf_seq2seq("marian", **dims)),
    }
    steps = {}
    for name, model in models.items():
        model.to(device).train()
        steps[name] = train_step(model, adamw(model, device), lambda m=model: m(src, tgt_in), y)
    times = alternate(steps, reps)
    rows = summarize("encoder-decoder train step", times)
    torch_post = times["torch.nn.Transformer (post-LN)"]
    for row in rows:  # the reference for this section is torch.nn.Transformer
        ts = times[row["contender"]]
        row["speedup_vs_torch_nn"] = statistics.median([t / r for t, r in zip(torch_post, ts, strict=True)])
    return rows


def bench_greedy(s: dict[str, int], g: dict[str, int], reps: int, device: str) -> list[Row]:
    """Cached greedy generation, batch 1, against HF generate(use_cache=True) on GPT-2 at the same sizes."""
    dims = {k: s[k] for k in ("vocab", "d", "heads", "layers", "d_ff", "ctx")}
    torch.manual_seed(0)
    prompt = torch.randint(3, s["vocab"], (1, g["prompt"]), device=device)
    ours = Transformer(decoder_config(s, eos_token_id=None)).to(device).eval()
    hf = peers.hf_gpt2(**dims).model.to(device).eval()
    hf.generation_config.pad_token_id = 0
    n = g["new"]
    contenders = {
        OURS: lambda: ours.generate(prompt, max_new_tokens=n),
        "HF generate (use_cache=True)": lambda: hf.generate(
            prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False, use_cache=True, eos_token_id=None
        ),
    }
    with torch.inference_mode():
        times = alternate(contenders, reps)
    return summarize("greedy generation", times, new_tokens=n, prompt=g["prompt"])


def bench_sliding(s: dict[str, int], g: dict[str, int], reps: int, device: str) -> list[Row]:
    """Generating 3x the context (greedy, batch 1): what sliding past max_seq_len costs per token.

    The reference generates as many tokens within a context large enough to hold them all (no slide). The default
    refills the KV cache from half a window once per half window; window_keep=max_seq_len slides by one token
    every step (nanoGPT's crop, one full-window pass per token, cached); use_cache=False recomputes the cropped
    window every token, as nanoGPT's sample.py does.
    """
    torch.manual_seed(0)
    prompt = torch.randint(3, s["vocab"], (1, 8), device=device)
    n = g["new"]
    ours = Transformer(decoder_config(s, eos_token_id=None)).to(device).eval()
    roomy = Transformer(decoder_config({**s, "ctx": n + 8}, eos_token_id=None)).to(device).eval()
    ctx = s["ctx"]
    contenders = {
        OURS + f" sliding, refill every {ctx // 2} tokens (default)": lambda: ours.generate(prompt, max_new_tokens=n),
        f"context {n + 8}, no slide": lambda: roomy.generate(prompt, max_new_tokens=n),
        "sliding by 1 (crop every token), cached": lambda: ours.generate(prompt, max_new_tokens=n, window_keep=ctx),
        "sliding by 1, recomputed (nanoGPT sample.py)": lambda: ours.generate(
            prompt, max_new_tokens=n, window_keep=ctx, use_cache=False
        ),
    }
    with torch.inference_mode():
        times = alternate(contenders, reps)
    rows = summarize("generation past the context", times, reference=next(iter(contenders)), new_tokens=n, ctx=ctx)
    for row in rows:
        row["ms_per_token"] = 1000 * row["median_s"] / n
    return rows


def bench_beam(s: dict[str, int], b: dict[str, int], reps: int, device: str) -> list[Row]:
    """Beam search for the encoder-decoder against HF BART's generate(num_beams=...), every hypothesis full length."""
    dims = {k: s[k] for k in ("vocab", "d", "heads", "layers", "d_ff", "ctx")}
    torch.manual_seed(0)
    src = torch.randint(3, s["vocab"], (b["batch"], b["src"]), device=device)
    ours = Transformer(seq2seq_config(s, "post", eos_token_id=None)).to(device).eval()
    bart = peers.hf_seq2seq("bart", **dims).to(device).eval()
    n, k = b["new"], b["beams"]
    contenders = {
        OURS: lambda: ours.generate(src, max_new_tokens=n, num_beams=k),
        "HF BART generate": lambda: bart.generate(
            src, max_new_tokens=n, min_new_tokens=n, num_beams=k, do_sample=False, early_stopping=False
        ),
    }
    with torch.inference_mode():
        times = alternate(contenders, reps)
    return summarize(f"beam search ({k} beams)", times, batch=b["batch"], new_tokens=n)


def _hf_linear(model: nn.Module) -> nn.Module:
    """HF GPT-2 with its Conv1D layers (x @ W + b, W stored (in, out)) as nn.Linear, values unchanged, so that
    quantize_dynamic({nn.Linear}) reaches them: applied to the Conv1D model it would quantize the output layer alone."""
    from transformers.pytorch_utils import Conv1D

    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, Conv1D):
                linear = nn.Linear(child.weight.shape[0], child.weight.shape[1])
                linear.weight.data = child.weight.data.t().contiguous()
                linear.bias.data = child.bias.data.clone()
                setattr(module, child_name, linear)
    return model


def _int8(model: nn.Module) -> nn.Module:
    """torch's dynamic int8 quantization of every nn.Linear, per-channel weight scales: what quantize_int8 does."""
    import copy

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(
            copy.deepcopy(model), {nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}, dtype=torch.qint8
        )


def _onnx_contenders(model: Transformer, threads: int, cross_kv: tuple[str, ...] = ("cached",)) -> dict[str, object]:
    """Our exported decoding graphs (past K/V) in onnxruntime, fp32 and onnxruntime's dynamic int8, each driven by
    OnnxModel.generate (lit_transformer.interop.onnx). With several cross_kv modes, one fp32 row per mode."""
    import tempfile

    from lit_transformer.interop.onnx import OnnxModel, export_onnx_folder

    folders = {}
    root = Path(tempfile.mkdtemp(prefix="bench_onnx_"))
    for mode in cross_kv:
        progress(f"exporting ONNX graphs ({mode} cross K/V)" if model.config.is_encoder_decoder else "exporting ONNX")
        label = f", cross K/V {mode}" if len(cross_kv) > 1 else ""
        folders[f"onnxruntime fp32{label}"] = export_onnx_folder(model, root / mode, cross_kv=mode, logits_graph=False)
    folders["onnxruntime int8"] = export_onnx_folder(
        model, root / "int8", cross_kv=cross_kv[0], logits_graph=False, quantize="int8"
    )
    return {name: OnnxModel(folder, threads=threads) for name, folder in folders.items()}


COMPILED = ", compiled (compile=True)"


def _with_compiled(models: dict[str, nn.Module], flags: dict) -> tuple[dict[str, Callable[[], object]], dict]:
    """A generate contender per model, plus compile=True ones for our fp32 and default int8 models; each compiled
    contender's first call (compiling, with inductor's on-disk cache as this machine has it) is timed apart."""
    contenders = {name: (lambda m=m: m.generate(**flags)) for name, m in models.items()}
    first = {}
    for name in (OURS + " fp32", OURS + " int8 (lm_head int8, default)"):
        model = models[name]
        label = name + COMPILED
        contenders[label] = lambda m=model: m.generate(**flags, compile=True)
        progress(f"compiling {label}")
        start = time.perf_counter()
        with torch.inference_mode():
            contenders[label]()
        first[label] = time.perf_counter() - start
    return contenders, first


def bench_quantized(s: dict[str, int], t: dict[str, int], g: dict[str, int], reps: int, threads: int) -> list[Row]:
    """Greedy generation, batch 1, fp32 vs int8 dynamic quantization (lit_transformer.transforms.int8), our decoder-only
    model against HF GPT-2 generate and our translation-preset-sized encoder-decoder against HF Marian generate, each
    with and without the same int8 quantization of its Linear layers; our fp32 and int8 models with compile=True
    (GenerationConfig.compile); and our exported ONNX decoding graphs in onnxruntime (fp32, and int8 by
    onnxruntime's quantize_dynamic)."""
    from lit_transformer.transforms.int8 import quantize_int8

    n = g["new"]
    rows: list[Row] = []
    torch.manual_seed(0)
    dims = {k: s[k] for k in ("vocab", "d", "heads", "layers", "d_ff", "ctx")}
    prompt = torch.randint(3, s["vocab"], (1, g["prompt"]))
    ours = Transformer(decoder_config(s, eos_token_id=None)).eval()
    hf = _hf_linear(peers.hf_gpt2(**dims).model.eval())
    hf.generation_config.pad_token_id = 0
    hf8 = _int8(hf)

    def hf_run(model: nn.Module, ids: Tensor) -> Callable[[], object]:
        flags = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, use_cache=True, eos_token_id=None)
        return lambda: model.generate(ids, **flags)

    models = {
        OURS + " fp32": ours,
        OURS + " int8 (lm_head int8, default)": quantize_int8(ours),
        OURS + " int8 (lm_head fp32)": quantize_int8(ours, lm_head=False),
    }
    models.update(_onnx_contenders(ours, threads))
    contenders, first = _with_compiled(models, dict(input_ids=prompt, max_new_tokens=n))
    contenders["HF GPT-2 generate fp32"] = hf_run(hf, prompt)
    contenders["HF GPT-2 generate int8"] = hf_run(hf8, prompt)
    with torch.inference_mode():
        times = alternate(contenders, reps)
    rows += summarize("int8 greedy, decoder-only", times, reference=OURS + " fp32", new_tokens=n, prompt=g["prompt"])
    for row in rows:
        row["first_call_s"] = first.get(row["contender"])

    torch.manual_seed(0)
    dims = {k: t[k] for k in ("vocab", "d", "heads", "layers", "d_ff", "ctx")}
    src = torch.randint(3, t["vocab"], (1, g["prompt"]))
    ours = Transformer(seq2seq_config(t, "post", eos_token_id=None, tie_embeddings=True)).eval()
    marian = peers.hf_seq2seq("marian", **dims).eval()
    models = {
        OURS + " fp32": ours,
        OURS + " int8 (lm_head int8, default)": quantize_int8(ours),
        OURS + " int8 (lm_head fp32)": quantize_int8(ours, lm_head=False),
    }
    # Cross-attention K/V: computed once by the encoder graph ("cached", the default) or by every step from the memory.
    models.update(_onnx_contenders(ours, threads, cross_kv=("cached", "memory")))
    # max_source_offset=None: all n tokens, as HF's min_new_tokens forces (by default a translation stops at source + 50)
    flags = dict(input_ids=src, max_new_tokens=n, num_beams=1, max_source_offset=None)
    contenders, first = _with_compiled(models, flags)
    contenders["HF Marian generate fp32"] = hf_run(marian, src)
    contenders["HF Marian generate int8"] = hf_run(_int8(marian), src)
    with torch.inference_mode():
        times = alternate(contenders, reps)
    seq2seq_rows = summarize(
        "int8 greedy, encoder-decoder", times, reference=OURS + " fp32", new_tokens=n, src=g["prompt"]
    )
    for row in seq2seq_rows:
        row["first_call_s"] = first.get(row["contender"])
    rows += seq2seq_rows
    for row in rows:
        row["tokens_per_s"] = n / row["median_s"]
    return rows


def checkpointed_step(mode: str, m: dict[str, int], quick: bool) -> Callable[[], None]:
    """A training step of the decoder-only model at the memory section's depth and context, `mode` checkpointing."""
    s = {**sizes(quick)["decoder"], "layers": m["layers"], "ctx": m["ctx"]}
    torch.manual_seed(0)
    model = Transformer(decoder_config(s))
    if mode != "none":
        apply_activation_checkpointing(model, mode)
    ids = torch.randint(3, s["vocab"], (m["batch"], m["ctx"] + 1))
    return train_step(model, adamw(model, "cpu"), lambda: model(ids[:, :-1]), ids[:, 1:])


def memory_child(mode: str, quick: bool) -> dict[str, float]:
    """In a fresh process: peak RSS of training steps with `mode` checkpointing, and what the activations took."""
    step = checkpointed_step(mode, sizes(quick)["memory"], quick)
    step()  # allocates gradients and optimizer state
    # resident now: weights and optimizer state (gradients are freed); peak - resident: the activations' share
    resident = process_rss_mb() * 1e3 / 1024  # MiB, as this section has always reported
    step()
    # VmHWM, this address space's high-water mark: ru_maxrss would carry over the parent's peak across fork + exec.
    peak = process_rss_mb(field="VmHWM") * 1e3 / 1024
    return {"peak_rss_mb": peak, "activations_mb": peak - resident}


def bench_memory(m: dict[str, int], reps: int, quick: bool, threads: int) -> list[Row]:
    """Activation checkpointing: peak memory in fresh subprocesses (VmHWM, the high-water mark), step time in
    this process with the three variants alternating.

    glibc's malloc keeps freed blocks below a threshold it raises by itself (up to 32 MB), so RSS grows step after
    step with fragments of tensors long dead; a fixed threshold returns every large tensor to the system when freed,
    and RSS then follows the live tensors. All modes are measured under the same setting.
    """
    env = child_env(MALLOC_MMAP_THRESHOLD_="131072")
    modes = ["none", "block", "selective"]
    memory = {}
    for mode in modes:
        cmd = [
            sys.executable,
            "-m",
            "lit_transformer.bench",
            "speed",
            "_memory_child",
            mode,
            str(threads),
            str(int(quick)),
        ]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
        memory[mode] = json.loads(out.strip().splitlines()[-1])
    times = alternate({mode: checkpointed_step(mode, m, quick) for mode in modes}, reps)
    section = f"activation checkpointing ({m['layers']} layers, context {m['ctx']}, batch {m['batch']})"
    rows = summarize(section, times, reference="none")
    for row in rows:
        mode = row["contender"]
        row["contender"] = f"{OURS} checkpointing={mode}"
        row.update(memory[mode])
        row["memory_ratio"] = memory[mode]["peak_rss_mb"] / memory["none"]["peak_rss_mb"]
        row["activation_ratio"] = memory[mode]["activations_mb"] / memory["none"]["activations_mb"]
    return rows


def bench_lightning(s: dict[str, int], steps: int, reps: int) -> list[Row]:
    """Lightning's fit loop against a hand-written loop: same model, data, DataLoader, optimizer and schedule.

    Step time is the interval between consecutive step ends (data loading, logging and hooks included), median over
    the steady state; the one-time cost of starting fit is reported apart.
    """
    import lightning as L

    from lit_transformer.engine.lightning_module import LitTransformer
    from lit_transformer.engine.optimizers import Optimization
    from lit_transformer.tasks.losses import smoothed_cross_entropy

    torch.manual_seed(0)
    data = torch.randint(3, s["vocab"], (s["batch"] * steps, s["ctx"] + 1))
    dataset = [{"input_ids": row[:-1], "labels": row[1:]} for row in data]

    def loader():
        return torch.utils.data.DataLoader(dataset, batch_size=s["batch"], shuffle=True)

    def module() -> LitTransformer:
        torch.manual_seed(0)
        return LitTransformer(decoder_config(s), optim=Optimization(schedule="constant", warmup_steps=10))

    class StepClock(L.Callback):
        def __init__(self) -> None:
            self.ends: list[float] = []

        def on_train_batch_end(self, *args) -> None:
            self.ends.append(time.perf_counter())

    def lightning_fit() -> tuple[list[float], float]:
        clock = StepClock()
        trainer = L.Trainer(
            accelerator="cpu",
            devices=1,
            max_steps=steps,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            limit_val_batches=0,
            callbacks=[clock],
        )
        start = time.perf_counter()
        trainer.fit(module(), loader())
        return clock.ends, start

    def hand_loop() -> tuple[list[float], float]:
        lit = module()
        opt = lit.configure_optimizers()
        optimizer, scheduler = opt["optimizer"], opt["lr_scheduler"]["scheduler"]
        lit.train()
        ends, start = [], time.perf_counter()
        for batch in loader():
            loss_sum, _, tokens = smoothed_cross_entropy(lit.model(batch["input_ids"]), batch["labels"], 0.0)
            optimizer.zero_grad(set_to_none=True)
            (loss_sum / tokens).backward()  # the per-token mean, as Trainer.fit's step takes it
            optimizer.step()
            scheduler.step()
            ends.append(time.perf_counter())
        return ends, start

    runs: dict[str, list[tuple[list[float], float]]] = {"Lightning Trainer.fit": [], "hand-written loop": []}
    fns = {"Lightning Trainer.fit": lightning_fit, "hand-written loop": hand_loop}
    for rep in range(reps):
        for name in fns if rep % 2 == 0 else reversed(list(fns)):
            gc.collect()
            runs[name].append(fns[name]())
    times = {}
    startup = {}
    for name, rs in runs.items():
        # steady state: intervals between step ends, the first two steps (warm-up) left out
        times[name] = [statistics.median(b - a for a, b in zip(ends[2:], ends[3:])) for ends, _ in rs]
        startup[name] = statistics.median(ends[0] - start for ends, start in rs)
    rows = summarize("Lightning loop overhead (per step)", times, reference="hand-written loop", steps=steps)
    for row in rows:
        row["first_step_s"] = startup[row["contender"]]
    return rows


def bench_cuda(reps: int, batches: list[int]) -> list[Row]:
    """GPT-2 small, context 1024, bf16 autocast, fused AdamW, flash SDPA, torch.compile: MFU on one GPU.

    The peak is the measured bf16 matmul rate and, where known, the spec sheet's dense bf16 figure.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.backends.cuda.matmul.allow_tf32 = True
    cfg = TransformerConfig.preset("gpt2-small", dropout=0.0, vocab_size=50304)
    model = Transformer(cfg).cuda()
    flops = model.flops_per_token(1024)
    optimizer = adamw(model, "cuda")
    measured_peak = matmul_peak_flops("cuda", torch.bfloat16, repeats=10)
    spec = {"H100": 989e12, "H200": 989e12, "A100": 312e12}
    name = torch.cuda.get_device_name()
    spec_peak = next((v for k, v in spec.items() if k in name), None)

    def loss_of(ids: Tensor) -> Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            logits = model(ids[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1))

    def step(loss_fn: Callable[[Tensor], Tensor], ids: Tensor) -> None:
        loss = loss_fn(ids)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        torch.cuda.synchronize()

    rows = []
    for batch in batches:
        torch._dynamo.reset()
        compiled = torch.compile(loss_of)  # the model, its loss and the logits' cast in one graph
        ids = torch.randint(0, cfg.vocab_size, (batch, 1025), device="cuda")
        contenders = {
            f"{OURS} gpt2-small compiled, batch {batch}": partial(step, compiled, ids),
            f"{OURS} gpt2-small eager, batch {batch}": partial(step, loss_of, ids),
        }
        for run in contenders.values():  # compile and warm up
            for _ in range(3):
                run()
        times = alternate(contenders, reps * 4, warmup=0)
        eager_time = statistics.median(times[f"{OURS} gpt2-small eager, batch {batch}"])
        for contender, runs in times.items():
            t = statistics.median(runs)
            achieved = flops * batch * 1024 / t
            rows.append(
                {
                    "section": f"GPU MFU ({name}, GPT-2 small, ctx 1024, bf16 autocast, flash SDPA, fused AdamW)",
                    "contender": contender,
                    "median_s": t,
                    "ratio": eager_time / t,
                    "tokens_per_s": batch * 1024 / t,
                    "achieved_tflops": achieved / 1e12,
                    "mfu_vs_measured_bf16_matmul": achieved / measured_peak,
                    "mfu_vs_spec": achieved / spec_peak if spec_peak else None,
                    "reps": len(runs),
                }
            )
        progress(f"batch {batch}: {rows[-2]['achieved_tflops']:.0f} TFLOP/s compiled")
    return rows


# ---------------------------------------------------------------------------------------------- the CLI's step

SPEC_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}  # dense bf16 FLOP/s from the spec sheets


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class StepClock:
    """Times optimizer steps warmup+1 .. warmup+steps with two synchronisations (none between), counting target
    tokens on the device and the FLOPs the module reports; a Lightning callback and a hand loop's clock alike."""

    def __init__(self, warmup: int, steps: int, device: str) -> None:
        self.warmup, self.steps, self.device = warmup, steps, device
        self.start = self.seconds = self.cpu_start = self.cpu_seconds = 0.0
        self.tokens: Tensor | int = 0
        self.flops = 0.0
        self.peak_gb: float | None = None
        self.syncs: list[str] = []
        self.train_start = 0.0
        self.first_step_s: float | None = None  # from the start of training to the end of optimizer step 1

    def after_step(self, step: int, batch: dict[str, Tensor], flops: float) -> bool:
        """Call after optimizer step `step` (1-based) with its batch; True once the timed steps are done.

        On CUDA the timed window runs under torch's sync debug mode: every operation that makes the host wait for
        the GPU (a tensor read, a blocking copy) warns, and `host_syncs` counts those warnings."""
        if step <= self.warmup:
            progress(f"step {step} done (warm-up)")
        if step == self.warmup:
            _sync(self.device)
            if self.device == "cuda":
                torch.cuda.reset_peak_memory_stats()
                torch.cuda.set_sync_debug_mode("warn")
            self.start, self.cpu_start = time.perf_counter(), time.process_time()
        elif step > self.warmup:
            self.tokens = self.tokens + (batch["labels"] != -100).sum()
            self.flops += flops
            if step == self.warmup + self.steps:
                if self.device == "cuda":
                    torch.cuda.set_sync_debug_mode("default")
                _sync(self.device)
                self.seconds = time.perf_counter() - self.start
                self.cpu_seconds = time.process_time() - self.cpu_start
                self.tokens = int(self.tokens)
                if self.device == "cuda":
                    self.peak_gb = torch.cuda.max_memory_allocated() / 2**30
                return True
        return False

    def row(self, section: str, contender: str, peak_flops: float | None) -> Row:
        return {
            "section": section,
            "contender": contender,
            "median_s": self.seconds / self.steps,  # the mean step over the timed window
            "tokens_per_s": self.tokens / self.seconds,
            "achieved_tflops": self.flops / self.seconds / 1e12,
            "mfu_vs_spec": self.flops / self.seconds / peak_flops if peak_flops else None,
            "peak_memory_gb": self.peak_gb,
            # The host's CPU time per step: what bounds the step when the device waits for the host (small batches).
            "host_cpu_ms_per_step": self.cpu_seconds / self.steps * 1e3,
            "host_syncs": len(self.syncs),
            "reps": self.steps,
            "first_step_s": self.first_step_s,
        }

    def __enter__(self) -> StepClock:
        self._catch = warnings.catch_warnings(record=True)
        self._recorded = self._catch.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc) -> None:
        self._catch.__exit__(*exc)
        # torch's one-time notice that sync debug mode is a prototype is no synchronisation: left out of the count
        self.syncs = [
            str(w.message)
            for w in self._recorded
            if "synchroniz" in str(w.message).lower() and "prototype feature" not in str(w.message)
        ]
        for message in dict.fromkeys(self.syncs):
            progress(f"host synchronisation in the timed steps: {message[:300]}")


def build_cli(args: list[str]):
    """The CLI's own objects (LitTransformer, DataModule, Trainer with every default callback), not yet fitting."""
    from lit_transformer.cli.lightning_cli import run_cli

    return run_cli(args, run=False)


def cli_fit(args: list[str], warmup: int, steps: int, device: str) -> StepClock:
    """`python -m lit_transformer fit <args>` in this process, timed by a StepClock callback."""
    import lightning as L

    clock = StepClock(warmup, steps, device)

    class Clock(L.Callback):
        step_before = -1

        def on_train_start(self, trainer, pl_module) -> None:
            clock.train_start = time.perf_counter()

        def on_train_batch_start(self, trainer, *args) -> None:
            self.step_before = trainer.global_step

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if trainer.global_step == self.step_before:  # a micro-batch of an accumulated step
                return
            if trainer.global_step == 1:  # the first optimizer step: compilation included
                _sync(device)
                clock.first_step_s = time.perf_counter() - clock.train_start
            if clock.after_step(trainer.global_step, batch, pl_module.flops_per_batch):
                trainer.should_stop = True

    cli = build_cli(args)
    cli.trainer.callbacks.append(Clock())
    with clock:
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return clock


def hand_fit(args: list[str], warmup: int, steps: int, device: str) -> StepClock:
    """The same model, data and optimizer as `fit <args>`, in a hand-written loop: a compiled forward and
    F.cross_entropy in one graph, bf16 autocast when the run asks for it, a fused optimizer on CUDA, nothing else."""
    from contextlib import nullcontext

    from lit_transformer.engine.optimizers import build_optimizer

    cli = build_cli(args)
    lit, data = cli.model, cli.datamodule
    cfg, hp = lit.config, lit.hparams
    torch.manual_seed(0)
    model = Transformer(cfg).to(device).train()
    # The run's own optimizer (Adam, AdamW, or Muon with AdamW), so a lever such as --model.optim.optimizer muon
    # costs the hand-built step what it costs the CLI's.
    optimizer = build_optimizer(model, lit.optim, fused=device == "cuda")
    bf16 = "bf16" in str(cli.trainer.precision)
    smoothing = lit.task.label_smoothing

    def loss_of(batch: dict[str, Tensor]) -> Tensor:
        with torch.autocast(device, dtype=torch.bfloat16) if bf16 else nullcontext():
            if cfg.is_encoder_decoder:
                logits = model(batch["src"], batch["tgt_in"], src_mask=batch["src_mask"])
            else:
                logits = model(batch["input_ids"])
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), batch["labels"].reshape(-1), label_smoothing=smoothing
        )

    step_loss = torch.compile(loss_of) if hp.compile else loss_of
    data.prepare_data()
    data.setup("fit")
    with StepClock(warmup, steps, device) as clock:
        return _hand_loop(model, optimizer, step_loss, data, clock)


def _hand_loop(model, optimizer, step_loss, data, clock: StepClock) -> StepClock:
    cfg, device, step = model.config, clock.device, 0
    while True:
        for batch in data.train_dataloader():
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items() if isinstance(v, Tensor)}
            loss = step_loss(batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            tokens = batch["tgt_in"] if cfg.is_encoder_decoder else batch["input_ids"]
            if clock.after_step(step, batch, model.flops_per_token(tokens.size(1)) * tokens.numel()):
                return clock


def bench_cli(
    presets: dict[str, list[str]], warmup: int, steps: int, device: str, hand_built: bool = True
) -> list[Row]:
    """The CLI's training step (LitTransformer under Trainer.fit, the shipped configs, every default callback)
    beside a hand-built step on the same model, data and batch, one after the other in this process (hand_built
    False: the CLI's alone)."""
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    peak = next((v for k, v in SPEC_BF16.items() if k in name), None) if device == "cuda" else None
    rows = []
    contenders = (("hand-built step", hand_fit), ("CLI fit", cli_fit)) if hand_built else (("CLI fit", cli_fit),)
    for label, args in presets.items():
        section = f"CLI vs hand-built training step ({name}): {label}"
        pair = []
        for contender, fit in contenders:
            torch._dynamo.reset()
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
            progress(f"{section}: {contender}")
            pair.append(fit(args, warmup, steps, device).row(section, contender, peak))
            print(json.dumps(pair[-1]), flush=True)
        if hand_built:
            hand, cli = pair
            cli["ratio"] = cli["tokens_per_s"] / hand["tokens_per_s"]  # the CLI's share of the hand-built throughput
            hand["ratio"] = 1.0
        else:
            pair[0]["ratio"] = 1.0
        for row in pair:
            row["label"] = label
        rows += pair
    return rows


# ---------------------------------------------------------------------------------------------- report


NOTES = {  # key in a row -> how the table shows it
    "speedup_vs_torch_nn": "{:.2f}x vs torch.nn.Transformer (post-LN)",
    "peak_rss_mb": "peak {:.0f} MB",
    "tokens_per_s": "{:,.0f} tokens/s",
    "peak_memory_gb": "peak {:.1f} GiB",
    "host_cpu_ms_per_step": "host CPU {:.1f} ms/step",
    "host_syncs": "{} host syncs in the timed steps",
    "memory_ratio": "({:.2f}x)",
    "activations_mb": "activations {:.0f} MB",
    "activation_ratio": "({:.2f}x)",
    "first_step_s": "first step {:.2f} s after fit starts",
    "first_call_s": "first call {:.1f} s (compiles)",
    "params": "{:,} params",
    "mfu": "MFU {:.0%}",
    "achieved_tflops": "{:.0f} TFLOP/s",
    "mfu_vs_measured_bf16_matmul": "MFU {:.0%} of measured bf16 matmul",
    "mfu_vs_spec": "MFU {:.0%} of spec",
}


def markdown(rows: list[Row]) -> str:
    lines = []
    section = None
    for row in rows:
        if row["section"] != section:
            section = row["section"]
            ref = (
                "hand loop" if "Lightning" in section else "checkpointing=none" if "checkpointing" in section else OURS
            )
            ratio = "tokens/s / hand-built's" if "CLI vs hand-built" in section else f"time / {ref}"
            lines += ["", f"**{section}**", "", f"| contender | median | {ratio} | notes |", "|---|---:|---:|---|"]
        notes = [fmt.format(row[key]) for key, fmt in NOTES.items() if row.get(key) is not None]
        lines.append(
            f"| {row['contender']} | {row['median_s'] * 1e3:.0f} ms | {row['ratio']:.3f} | {' '.join(notes)} |"
        )
    return "\n".join(lines)


def render(path: Path, run: int = 0) -> None:
    """Print the markdown table of one run of a --json file written earlier (the first by default)."""
    print(markdown(read_runs(path)[run]["rows"]))


# ---------------------------------------------------------------------------------------------- a run


def measure(args: Any, cli_runs: dict[str, list[str]], facts: dict[str, Any]) -> list[Row]:
    """The rows of every section `args.only` names (bench speed's options); `facts`, the run's machine, gets the
    measured fp32 matmul peak and the load average at the end."""
    torch.set_num_threads(args.threads)
    reps = args.reps or (3 if args.quick else 5)
    s = sizes(args.quick)
    rows: list[Row] = []
    only = args.only or (["mfu", "cli"] if args.device == "cuda" else CPU_SECTIONS)
    if "cli" in only:
        rows += bench_cli(cli_runs, args.cli_warmup, args.cli_steps, args.device, hand_built=not args.cli_only)
    if args.device == "cuda":
        if "mfu" in only:
            rows += bench_cuda(reps, args.gpu_batches)
    else:
        peak = matmul_peak_flops("cpu")
        flops_per_step: dict[str, float] = {}
        if "decoder" in only:
            rows += bench_decoder(s["decoder"], reps, "cpu", flops_per_step)
        if "seq2seq" in only:
            rows += bench_seq2seq(s["seq2seq"], reps, "cpu")
        if "greedy" in only:
            rows += bench_greedy(s["decoder"], s["greedy"], reps, "cpu")
        if "sliding" in only:
            rows += bench_sliding(s["decoder"], s["sliding"], reps, "cpu")
        if "beam" in only:
            rows += bench_beam(s["seq2seq"], s["beam"], reps, "cpu")
        if "quantized" in only:
            rows += bench_quantized(s["decoder"], s["translation"], s["greedy"], reps, args.threads)
        if "memory" in only:
            rows += bench_memory(s["memory"], reps, args.quick, args.threads)
        if "lightning" in only:
            rows += bench_lightning(s["decoder"], s["lightning"]["steps"], max(2, reps // 2))
        peak = max(peak, matmul_peak_flops("cpu"))
        facts["fp32_matmul_peak_gflops"] = peak / 1e9
        for row in rows:
            if row["section"] == "decoder-only train step":
                row["mfu"] = flops_per_step["decoder"] / row["median_s"] / peak
    facts["load_average_end"] = list(os.getloadavg())
    return rows
