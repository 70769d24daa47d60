"""What the AttentionMaps callback costs at each validation, before (one pyplot figure of subplots per layer, with
tight_layout, logged by add_figure) and after (lit_transformer.callbacks.heads_image, logged by add_image).

    python scripts/benchmark_attention_maps.py --json docs/attention_maps.json

One validation is what `AttentionMaps.on_validation_epoch_end` does after the model's forward: for each drawn layer
(the first max_layers), render the heads and log the image to a TensorBoard SummaryWriter (PNG encoding included).
Shapes come from configs: configs/base.yaml (the README's main job) and configs/presets/gpt2-small.yaml, with the
callback's own max_tokens and max_layers defaults; token labels are byte-level BPE-like strings, some 16+ characters.

Each measurement is a fresh child process, so that import and first-use costs (fonts) count: it imports
lit_transformer.callbacks (Lightning, and through torchmetrics matplotlib.pyplot, as every CLI run does), then times
--validations validations in a row: the first, and the later ones (same tokens, as a fixed validation batch gives).
Before and after alternate (A/B/A/B) over --repeats rounds; the machine may be shared, so the host's load average is
recorded beside each child. A separate bare child (torch and the SummaryWriter only) records what importing pyplot, or
only the Figure and the Agg canvas, would cost a process that had not imported them yet.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu_model

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ("configs/base.yaml", "configs/presets/gpt2-small.yaml")
TOKENS = [
    "ĠROMEO", ":", "\\n", "ĠWhat", "Ġis", "Ġthe", "Ġmatter", "?", "Ġthou", "Ġart", "Ġextraordinarily",
    "Ġunaccustomed", "Ġto", "Ġmy", "Ġlord", ",", "Ġand", "Ġthereupon", "Ġinterchangeably", "·", "Ġsweet",
    "Ġnight", "!", "<|endoftext|>",
]  # fmt: skip


# ---- the old rendering, kept here as the baseline -------------------------------------------------------------


def _heads_figure_before(weights, queries: list[str], keys: list[str]):
    """AttentionMaps' figure per layer before this benchmark's change (lit_transformer/callbacks.py, _heads_figure)."""
    import matplotlib.pyplot as plt

    heads = weights.size(0)
    cols = min(4, heads)
    rows = (heads + cols - 1) // cols
    size = 0.25 * max(len(keys), 8)
    fig, grid = plt.subplots(rows, cols, figsize=(cols * size + 1, rows * size + 1), squeeze=False)
    for h, ax in enumerate(grid.flat):
        if h >= heads:
            ax.axis("off")
            continue
        ax.imshow(weights[h].numpy(), vmin=0.0, vmax=1.0, cmap="viridis")
        ax.set_title(f"head {h}", fontsize=8)
        ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=6)
        ax.set_yticks(range(len(queries)), queries, fontsize=6)
    fig.tight_layout()
    return fig


# ---- one child: several validations ---------------------------------------------------------------------------


def _child(variant: str, layers: int, heads: int, tokens: int, validations: int) -> dict:
    import torch
    from torch.utils.tensorboard import SummaryWriter

    from lit_transformer.callbacks import heads_image

    preloaded = "matplotlib.pyplot" in sys.modules  # torchmetrics imports it with Lightning
    generator = torch.Generator().manual_seed(0)
    causal = torch.ones(tokens, tokens, dtype=torch.bool).triu(1)
    attention = [
        (torch.randn(heads, tokens, tokens, generator=generator) * 2).masked_fill(causal, float("-inf")).softmax(-1)
        for _ in range(layers)
    ]
    labels = [TOKENS[i % len(TOKENS)] for i in range(tokens)]
    times, shape = [], None
    with tempfile.TemporaryDirectory() as logdir:
        writer = SummaryWriter(logdir)
        for step in range(validations):
            start = time.perf_counter()
            for layer, weights in enumerate(attention):
                tag = f"attention/self/layer_{layer}"
                if variant == "before":
                    import matplotlib

                    matplotlib.use("Agg")
                    figure = _heads_figure_before(weights, labels, labels)
                    shape = [int(v) for v in reversed(figure.canvas.get_width_height())]
                    writer.add_figure(tag, figure, step)
                else:
                    image = heads_image(weights, labels, labels)
                    shape = list(image.shape[:2])
                    writer.add_image(tag, image, step, dataformats="HWC")
            writer.flush()
            times.append(time.perf_counter() - start)
        writer.close()
    return {"validations_s": times, "image_hw": shape, "pyplot_preloaded": preloaded}


def _bare_imports() -> dict:
    """Seconds to import pyplot, or only the Figure and the Agg canvas, where torch and TensorBoard are loaded."""
    found = {}
    for name, modules in {
        "pyplot": "import matplotlib.pyplot",
        "figure_and_agg": "import matplotlib.figure, matplotlib.backends.backend_agg",
    }.items():
        code = (
            "import time, torch\nfrom torch.utils.tensorboard import SummaryWriter\n"
            f"t = time.perf_counter()\n{modules}\nprint(time.perf_counter() - t)"
        )
        found[name] = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout)
    return found


# ---- the parent -----------------------------------------------------------------------------------------------


def _shape(config: str) -> dict:
    import inspect

    import yaml

    from lit_transformer.callbacks import AttentionMaps

    model = yaml.safe_load((ROOT / config).read_text())["model"]["config"]
    defaults = inspect.signature(AttentionMaps).parameters
    layers = min(model["n_layers"], defaults["max_layers"].default)
    return {"config": config, "layers": layers, "heads": model["n_heads"], "tokens": defaults["max_tokens"].default}


def _run_child(variant: str, shape: dict, validations: int) -> dict:
    args = [sys.executable, __file__, "--child", variant, "--validations", str(validations)]
    args += ["--layers", str(shape["layers"]), "--heads", str(shape["heads"]), "--tokens", str(shape["tokens"])]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    load = os.getloadavg()[0]
    out = subprocess.run(args, capture_output=True, text=True, env=env, check=True).stdout
    return {"variant": variant, "loadavg_1min": round(load, 2), **json.loads(out.strip().splitlines()[-1])}


def _summary(runs: list[dict]) -> dict:
    first = [r["validations_s"][0] for r in runs]
    later = [t for r in runs for t in r["validations_s"][1:]]
    return {"first_median_s": statistics.median(first), "later_median_s": statistics.median(later)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="write the figures here (e.g. docs/attention_maps.json)")
    parser.add_argument("--repeats", type=int, default=5, help="A/B rounds per shape")
    parser.add_argument("--validations", type=int, default=3, help="validations per child process")
    parser.add_argument("--child", choices=["before", "after"], help=argparse.SUPPRESS)
    parser.add_argument("--layers", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--heads", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--tokens", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.layers, args.heads, args.tokens, args.validations)))
        return

    command = "python scripts/benchmark_attention_maps.py " + shlex.join(sys.argv[1:])
    results = []
    for config in CONFIGS:
        shape = _shape(config)
        runs = []
        for repeat in range(args.repeats):
            for variant in ("before", "after"):  # interleaved: a change of load touches both
                runs.append({"repeat": repeat, **_run_child(variant, shape, args.validations)})
                print(json.dumps({**shape, **runs[-1]}), flush=True)
        summary = {v: _summary([r for r in runs if r["variant"] == v]) for v in ("before", "after")}
        for when in ("first_median_s", "later_median_s"):
            summary[f"speedup_{when.split('_')[0]}"] = summary["before"][when] / summary["after"][when]
        results.append({**shape, "summary": summary, "runs": runs})
        print(json.dumps({"config": config, **summary}), flush=True)
    report = {
        "command": command.strip(),
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "1"),
        "note": "wall seconds per validation (all drawn layers rendered and logged), medians over child processes; "
        "the host may be shared (loadavg_1min per child)",
        "bare_import_s": _bare_imports(),
        "shapes": results,
    }
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
