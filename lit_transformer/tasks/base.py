"""Task: what a model is trained to do, as one object that the engine (LitTransformer) calls.

A task owns everything that differs between language modelling, translation, classification and masked-LM
pretraining: which batch keys feed the model, the loss as (summed loss, summed NLL, target count), its metrics per
stage, its numbers at the end of an evaluation epoch, its predict rows, its TensorBoard samples and attention axes,
how an inference input is encoded, its decoding defaults, and what it reads from the DataModule. The engine owns the
rest (optimisation, normalisation by the step's target count, compile, checkpoints) and never asks which task it runs.

A task receives the LightningModule as an argument (to log, decode, read its config and device) and never imports
it. It is a torch Module only so that its metrics follow the model to its device; it holds no parameters.

Adding a task is one new file: subclass Task, override what differs (usually `loss` and `predict`), and name it in
the YAML (`model.task: {class_path: my_package.MyTask, init_args: {...}}`). See docs/architecture.md.
"""

from __future__ import annotations

import inspect
import re
import warnings
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import torch

from lit_transformer.data.text import encode_input
from lit_transformer.errors import ConfigError
from lit_transformer.tasks.losses import IGNORE_INDEX, check_label_smoothing, smoothed_cross_entropy

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from lit_transformer.config import GenerationConfig, TransformerConfig
    from lit_transformer.model import Transformer

STAGES = ("val", "test")


def log_reduced(module: Any, name: str, value: torch.Tensor, **kwargs: Any) -> None:
    """Log an epoch's number computed from torchmetrics metrics, whose compute() has already reduced their state over
    the ranks: every rank holds the same value, so it is logged as is. Lightning advises `sync_dist=True` for any
    epoch-level tensor of a distributed run; for these names the advice would only average equal numbers, and read as
    though the figure were rank 0's alone, so it is left out (one warnings filter per name; re-adding one is a no-op)."""
    warnings.filterwarnings(
        "ignore", message=re.escape(f"It is recommended to use `self.log({name!r}, ..., sync_dist=True)`")
    )
    module.log(name, value, **kwargs)


class Loss(NamedTuple):
    """A batch's loss under the one contract: sums over its targets (tokens, or examples), never means."""

    loss_sum: torch.Tensor
    nll_sum: torch.Tensor
    count: torch.Tensor
    logits: torch.Tensor
    labels: torch.Tensor


def data_fields(datamodule: Any, names: Iterable[str]) -> dict[str, Any]:
    """The one way the engine and the tasks read a DataModule: the attributes `names` lists that it has.

    What may be read, and by whom: the engine reads `tokenizer` (required), `target_tokenizer` and `save_tokenizer`;
    each task lists its own names in `Task.reads` (LanguageModeling: `characters_per_token(split)`; Translation:
    `bleu_samples`; Classification: `label_names`, `label_counts()`, `multi_label`). A DataModule without one of them
    simply goes without what it feeds (no bits per character, BLEU on every validation pair, ...).
    """
    if datamodule is None:
        return {}
    return {name: getattr(datamodule, name) for name in names if hasattr(datamodule, name)}


def token_labels(tokenizer: Tokenizer, ids: torch.Tensor) -> list[str]:
    """Each token as a reader recognises it (byte-level BPE shows a leading space as "Ġ"; decoding it alone does not)."""
    return [tokenizer.decode([i], skip_special_tokens=False).replace("\n", "\\n") or "·" for i in ids.tolist()]


def generated_rows(module: Any, batch: dict[str, Any]) -> list[dict[str, Any]]:
    """{"input", "output", "tokens"} per input of a predict batch, decoded as the module's GenerationConfig says and
    cut by its stop strings and ids."""
    return generation_rows(
        module.model, module.target_tokenizer, module.generation, batch["input_ids"], batch["attention_mask"],
        batch["text"],
    )  # fmt: skip


def text_stop_ids(config: TransformerConfig, generation: GenerationConfig) -> list[int]:
    """The id at which a row's text ends (not part of it): the GenerationConfig's eos_token_id, else the model's; none
    for -1 (no token ends a row), as decoding itself reads it."""
    eos_id = config.eos_token_id if generation.eos_token_id is None else generation.eos_token_id
    return [] if eos_id is None or eos_id == -1 else [eos_id]


def generation_rows(
    model: Transformer,
    tokenizer: Tokenizer,
    generation: GenerationConfig,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    texts: list[str],
) -> list[dict[str, Any]]:
    """{"input", "output", "tokens"} per input row: what `predict` writes and `serve` answers, one code path for both.
    The output is cut by the GenerationConfig's stop strings and stops at EOS (not part of "tokens")."""
    from lit_transformer.data.text import TextStream
    from lit_transformer.model.generation import fill_token_id

    # A decoder-only model continues its prompt: its text is decoded after the prompt's ids (TextStream's prompts)
    prompts = []
    if not model.config.is_encoder_decoder:
        masks = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        prompts = [row[m].tolist() for row, m in zip(input_ids, masks, strict=True)]
    stream = TextStream(
        tokenizer, len(input_ids), generation.stop, text_stop_ids(model.config, generation), prompts=prompts
    )
    eos_id = model.config.eos_token_id if generation.eos_token_id is None else generation.eos_token_id
    if generation.num_beams == 1:
        model.generate(input_ids, generation, attention_mask=attention_mask, streamer=stream)
    else:  # beam search settles its tokens at the end: replay them through the same stop rules
        for step_tokens in model.generate(input_ids, generation, attention_mask=attention_mask).T:
            stream(step_tokens)
    fill = fill_token_id(model.config, generation)
    out = []
    for text, output, tokens in zip(texts, stream.texts(), stream.ids, strict=True):
        # A row that ended before the batch's longest (its length limit, a stop id) is filled to that length: the
        # filling is not the row's (it was written into "tokens" while the text, skipping it, read right).
        while fill is not None and fill != eos_id and tokens and tokens[-1] == fill:
            tokens.pop()
        if model.config.is_encoder_decoder and not text.strip():
            # A blank source translates to a blank line (kept, so an input file's lines stay aligned), as Marian's
            # decoder answers one: the model never saw one (training drops pairs with an empty side), and decoded
            # one to max_new_tokens of noise.
            output, tokens = "", []
        out.append({"input": text, "output": output, "tokens": tokens})
    return out


class Task(torch.nn.Module):
    """The base: a token-level task on {"input_ids", "attention_mask"?, "labels"} batches (next-token or masked)."""

    name: ClassVar[str] = ""
    """The short name of `model.task` (language_modeling, translation, classification, masked_lm)."""
    reads: ClassVar[tuple[str, ...]] = ()
    """The DataModule attributes this task reads (see data_fields); attach receives those the DataModule has."""
    command: ClassVar[str | None] = None
    """The inference command that serves a checkpoint of this task (generate, translate), if any."""
    cannot_predict: ClassVar[str | None] = None
    """Why `predict` has nothing to write for this task, and what to do instead; None where it predicts."""
    generation_defaults: ClassVar[dict[str, Any]] = {"temperature": 0.8, "top_k": 50}
    """GenerationConfig fields of this task's decoding defaults (GenerationConfig.for_task)."""
    fullgraph: ClassVar[bool] = True
    """Whether `compile` may trace the model's forward and this task's loss as one graph."""
    static_shapes: ClassVar[bool] = False
    """Whether every training batch has one shape (packed blocks): `compile` then keeps a static graph; otherwise
    one graph marked dynamic from the first batch serves every shape (token-budget batches change at each step)."""
    architecture: ClassVar[dict[str, str]] = {}
    """The TransformerConfig fields this task needs (e.g. {"topology": "encoder_decoder"}); empty: any model."""

    def __init__(self, label_smoothing: float = 0.0) -> None:
        """
        Args:
            label_smoothing: Label smoothing of the loss (the paper's 0.1); perplexity is always the unsmoothed one.
        """
        super().__init__()
        check_label_smoothing(label_smoothing)
        self.label_smoothing = label_smoothing

    # ---- identity ---------------------------------------------------------------------------------------------------

    def init_args(self) -> dict[str, Any]:
        """The constructor's arguments, read back from the attributes of the same names (a task keeps each one)."""
        names = [p for p in inspect.signature(type(self).__init__).parameters if p != "self"]
        return {name: getattr(self, name) for name in names}

    def spec(self) -> dict[str, Any]:
        """{class_path, init_args}: how hyperparameters record the task, so a checkpoint rebuilds the same one."""
        cls = type(self)
        return {"class_path": f"{cls.__module__}.{cls.__qualname__}", "init_args": self.init_args()}

    def check_config(self, config: TransformerConfig) -> None:
        """Refuse an architecture this task cannot train, naming the fields to change."""
        found = {name: getattr(config, name) for name in self.architecture}
        if found != self.architecture:
            wanted = " and ".join(f"model.config.{name} {value}" for name, value in self.architecture.items())
            have = ", ".join(f"{name}={value}" for name, value in found.items())
            raise ConfigError(f"the {self.name or type(self).__name__} task needs {wanted} (not {have}): set them, or "
                             "choose another model.task")  # fmt: skip

    # ---- data -------------------------------------------------------------------------------------------------------

    def attach(self, module: Any, data: dict[str, Any]) -> None:
        """At every setup: read what the DataModule says (`data`, see data_fields); build the metrics, once (Lightning
        finds a logged metric by its attribute, remembered from the first log)."""
        if not getattr(self, "_metrics_built", False):
            self.build_metrics(module.config)
            self._metrics_built = True

    def build_metrics(self, config: TransformerConfig) -> None:
        """Every validation and test number is a per-target mean over the whole split (and all ranks)."""
        from torchmetrics import MeanMetric
        from torchmetrics.classification import MulticlassAccuracy

        for stage in STAGES:
            setattr(self, f"{stage}_loss", MeanMetric())
            setattr(self, f"{stage}_nll", MeanMetric())
            vocab = config.tgt_vocab_size
            accuracy = MulticlassAccuracy(num_classes=vocab, average="micro", ignore_index=IGNORE_INDEX)
            setattr(self, f"{stage}_accuracy", accuracy)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """What the task learned from the data and a checkpoint must carry (e.g. label names)."""

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        pass

    # ---- steps ------------------------------------------------------------------------------------------------------

    def tokens(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The (B, T) tokens the decoder (or encoder) reads: what FLOPs and batch sizes count."""
        return batch["input_ids"]

    def logits(self, model: Transformer, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The model's output for a batch as the DataModule lays it out."""
        return model(batch["input_ids"], attention_mask=batch.get("attention_mask"))

    def loss(
        self, model: Transformer, batch: dict[str, torch.Tensor], generator: torch.Generator | None = None
    ) -> Loss:
        """The batch's summed losses (see tasks/losses.py); `generator` seeds a task that draws (a masked LM)."""
        logits, labels = self.logits(model, batch), batch["labels"]
        return Loss(*smoothed_cross_entropy(logits, labels, self.label_smoothing), logits, labels)

    def check_batch(self, batch: dict[str, torch.Tensor]) -> None:
        """Checks of the data's layout that the loss relies on: run on the first batch only."""

    # ---- evaluation -------------------------------------------------------------------------------------------------

    def eval_generator(self, module: Any, batch_idx: int) -> torch.Generator | None:
        """The generator of an evaluation batch (None: the task draws nothing)."""
        return None

    def epoch_start(self, module: Any, stage: str) -> None:
        pass

    def evaluate(self, module: Any, stage: str, batch: dict[str, Any], batch_idx: int) -> Loss:
        """Update and log the stage's metrics (Lightning logs a metric object's compute() at the epoch's end)."""
        out = self.loss(module.model, batch, self.eval_generator(module, batch_idx))
        loss_metric, nll_metric = getattr(self, f"{stage}_loss"), getattr(self, f"{stage}_nll")
        nll_sum, nll_count = self.plain_nll(out)
        loss_metric.update(out.loss_sum / out.count.clamp(min=1), weight=out.count)  # no targets: weight 0
        nll_metric.update(nll_sum / nll_count.clamp(min=1), weight=nll_count)
        module.log(f"{stage}/loss", loss_metric, prog_bar=stage == "val")
        module.log(f"{stage}/nll", nll_metric)
        self.update_metrics(module, stage, out)
        return out

    def plain_nll(self, out: Loss) -> tuple[torch.Tensor, torch.Tensor]:
        """(summed NLL, count) for {stage}/nll and the perplexity: comparable across runs whatever the loss's options."""
        return out.nll_sum, out.count

    def update_metrics(self, module: Any, stage: str, out: Loss) -> None:
        accuracy = getattr(self, f"{stage}_accuracy")
        accuracy.update(out.logits.reshape(-1, out.logits.size(-1)), out.labels.reshape(-1))
        module.log(f"{stage}/accuracy", accuracy)

    def epoch_end(self, module: Any, stage: str) -> None:
        nll_metric = getattr(self, f"{stage}_nll", None)
        if nll_metric is not None and nll_metric.update_called:
            self.log_nll_numbers(module, stage, nll_metric.compute())

    def log_nll_numbers(self, module: Any, stage: str, nll: torch.Tensor) -> None:
        """What the epoch's per-target NLL says in other units (perplexity; a language model adds bits per char)."""
        log_reduced(module, f"{stage}/ppl", nll.exp(), prog_bar=stage == "val")

    # ---- prediction and inference -----------------------------------------------------------------------------------

    def predict(self, module: Any, batch: dict[str, Any]) -> list[dict[str, Any]]:
        """One JSON row per input of a predict batch (see PredictionWriter)."""
        raise ConfigError(f"the {self.name or type(self).__name__} task has no predictions to write")

    @classmethod
    def encode_input(cls, tokenizer: Tokenizer, text: str, eos_token_id: int | None) -> list[int]:
        """One inference input as training encodes it (a prompt: its tokens; an empty one: EOS alone)."""
        return encode_input(tokenizer, text, encoder_decoder=False, eos_token_id=eos_token_id)

    def samples(self, module: Any, callback: Any, first_batch: Callable[[], dict | None]) -> list[str]:
        """Texts for TensorBoard at each validation (GenerateSamples); none by default: the metrics say it all."""
        return []

    def attention(self, module: Any, batch: dict[str, Any], max_tokens: int) -> tuple[dict, dict]:
        """(attention weights by kind, (query labels, key labels) by kind) of the batch's first row, for AttentionMaps."""
        row = batch["input_ids"][0]
        if "attention_mask" in batch:
            row = row[batch["attention_mask"][0].bool()]
        tokens = row[:max_tokens]
        # A causal model's first tokens attend to each other alone: run on them, their weights are exact. A
        # bidirectional encoder reads the whole row; its weights are then cut to the first tokens (a row of the map
        # sums to less than 1 where later tokens draw attention), not those of the first tokens on their own.
        shown = tokens if not module.config.is_encoder_only else row
        _, attentions = module.model(shown[None].to(module.device), return_attention=True)
        labels = self.attention_labels(module, token_labels(module.tokenizer, tokens))
        n = len(labels)  # a classifier's [CLS], which the model prepends, is a position of the weights too
        attentions = {kind: [w[..., :n, :n] for w in layers] for kind, layers in attentions.items()}
        return attentions, {kind: (labels, labels) for kind in attentions}

    def attention_labels(self, module: Any, labels: list[str]) -> list[str]:
        return labels
