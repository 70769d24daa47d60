"""LitTransformer: the LightningModule around the plain model: loss, metrics, optimizer and schedule, generation."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
from lightning.fabric.plugins.precision.amp import _optimizer_handles_unscaling
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.utilities import GradClipAlgorithmType
from tokenizers import Tokenizer
from torchmetrics import MeanMetric
from torchmetrics.classification import (
    MulticlassAccuracy,
    MulticlassConfusionMatrix,
    MulticlassF1Score,
    MultilabelAccuracy,
    MultilabelF1Score,
)
from torchmetrics.text import SacreBLEUScore

# Importing checkpointing also allowlists TransformerConfig for weights_only loads: load_from_checkpoint needs it.
from lit_transformer.checkpointing import check_tokenizer_vocabulary
from lit_transformer.config import GenerationConfig, TransformerConfig
from lit_transformer.masking import mask_tokens
from lit_transformer.model import Transformer
from lit_transformer.reliability import gradient_norm
from lit_transformer.schedules import ScheduleName, build_schedule

IGNORE_INDEX = -100
LossNormalization = Literal["tokens", "batch"]


def smoothed_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, smoothing: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(training loss, NLL, token count), the losses summed over the non-ignored labels.

    Per token, the smoothed loss is (1 - eps) * -log p(target) + eps * mean over the vocabulary of -log p(v): the
    target distribution gives eps / V to every id, special tokens included, as fairseq and torch's
    ``cross_entropy(label_smoothing=eps)`` do (the Annotated Transformer zeroes the pad column instead). We keep the
    whole vocabulary because the loss then does not depend on which ids a tokenizer reserves, it matches torch's
    definition, and the mass a special token receives, eps / V, is negligible; padding is never a label, so it is never
    taught as an output. Sums rather than means: the caller picks the normaliser (see LitTransformer's
    loss_normalization). Perplexity comes from the NLL, so label smoothing never inflates it.

    One log-softmax, in fp32 at least (16-bit log-probabilities would round the loss), then F.nll_loss: compiled,
    that keeps one fewer (tokens, vocabulary) fp32 buffer than a gather of the target log-probabilities (measured:
    250 MB less at 4,096 tokens x 16,000 ids, the excess the CLI's step showed on a GPU).
    """
    logits = logits.reshape(-1, logits.size(-1))
    labels = labels.reshape(-1)
    keep = labels != IGNORE_INDEX
    log_probs = logits.to(torch.promote_types(logits.dtype, torch.float32)).log_softmax(dim=-1)  # (N, V)
    nll = F.nll_loss(log_probs, labels, ignore_index=IGNORE_INDEX, reduction="sum")
    count = keep.sum()
    if smoothing == 0.0:
        return nll, nll, count
    uniform = -(log_probs.mean(dim=-1) * keep).sum()
    return (1.0 - smoothing) * nll + smoothing * uniform, nll, count


def check_right_padded(mask: torch.Tensor) -> None:
    """Refuse target masks with padding anywhere but on the right: training attends targets with is_causal alone."""
    mask = mask.bool()
    if not bool((mask[:, 1:] <= mask[:, :-1]).all()):
        raise ValueError(
            "tgt_mask pads targets on the left or in the middle; translation training attends targets causally with no "
            "mask, which is exact only for right padding. Pad target rows on the right (as TranslationDataModule does)."
        )


def classification_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    smoothing: float = 0.0,
    class_weights: torch.Tensor | None = None,
    multi_label: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(training loss, NLL, weight), each summed over the batch's examples: the same contract as
    smoothed_cross_entropy, with an example in the place of a token, so the step normalisation is shared.

    Single-label: cross-entropy of (B, C) logits against (B,) class ids, label smoothing as smoothed_cross_entropy
    defines it; with class_weights, an example's NLL weighs class_weights[label] and the weight is the sum of those,
    so a step's loss is torch's ``cross_entropy(weight=..., label_smoothing=...)`` mean, taken over the whole
    optimizer step (all micro-batches and ranks) rather than per micro-batch.
    Multi-label: binary cross-entropy of (B, C) logits against (B, C) 0/1 targets, summed over labels per example
    (smoothing pulls targets towards 1/2; class_weights weigh each label's term); the weight is the example count.
    """
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if multi_label:
        targets = labels.to(logits.dtype)
        nll = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
        smoothed = targets * (1 - smoothing) + 0.5 * smoothing
        loss = F.binary_cross_entropy_with_logits(logits, smoothed, reduction="none") if smoothing else nll
        if class_weights is not None:
            loss, nll = loss * class_weights, nll * class_weights
        count = torch.tensor(float(len(labels)), device=logits.device)
        return loss.sum(), nll.sum(), count
    log_probs = logits.log_softmax(dim=-1)  # (B, C)
    weight = torch.ones_like(log_probs[:, 0]) if class_weights is None else class_weights.to(logits.dtype)[labels]
    nll = -log_probs.gather(1, labels[:, None]).squeeze(1) * weight
    if not smoothing:
        return nll.sum(), nll.sum(), weight.sum()
    # The smoothing term weighs each class by its own weight, as torch's cross_entropy(weight=, label_smoothing=) does.
    per_class = log_probs if class_weights is None else log_probs * class_weights.to(logits.dtype)
    loss = (1.0 - smoothing) * nll - smoothing * per_class.mean(dim=-1)
    return loss.sum(), nll.sum(), weight.sum()


def weight_decay_groups(
    model: torch.nn.Module, decay_embeddings: bool = False
) -> tuple[list[torch.nn.Parameter], list[torch.nn.Parameter]]:
    """(decayed, not decayed), decided by the role of each tensor, each tensor once.

    Decayed: the weight matrices of Linear layers. Never decayed: biases and norms. Token and position tables
    (``nn.Embedding`` and ``LearnedPositions``, also when the output projection is tied to one) are decayed only with
    ``decay_embeddings`` (nanoGPT decays them; the paper's and GPT-2's Adam applied no decay at all).
    """
    from lit_transformer.model.positions import LearnedPositions

    tables: set[int] = set()
    matrices: set[int] = set()
    for module in model.modules():
        if isinstance(module, (torch.nn.Embedding, LearnedPositions)):
            tables.add(id(module.weight))
        elif isinstance(module, torch.nn.Linear):
            matrices.add(id(module.weight))
    decayed_ids = (matrices - tables) | (tables if decay_embeddings else set())
    decay, no_decay, seen = [], [], set()
    for param in model.parameters():
        if id(param) in seen or not param.requires_grad:
            continue
        seen.add(id(param))
        (decay if id(param) in decayed_ids else no_decay).append(param)
    return decay, no_decay


class LitTransformer(L.LightningModule):
    """Trains a `Transformer` by its config's topology: a causal language model, a translation model, or an encoder-only
    sequence classifier or masked language model."""

    def __init__(
        self,
        config: TransformerConfig,
        optimizer: Literal["adamw", "adam"] = "adamw",
        lr: float = 3e-4,
        betas: tuple[float, float] | None = None,
        eps: float | None = None,
        weight_decay: float = 0.1,
        decay_embeddings: bool = False,
        fused: bool | None = None,
        schedule: ScheduleName = "cosine",
        warmup_steps: int = 100,
        schedule_steps: int | None = None,
        min_lr_ratio: float = 0.1,
        label_smoothing: float = 0.0,
        class_weights: list[float] | Literal["balanced"] | None = None,
        mlm_probability: float = 0.15,
        loss_normalization: LossNormalization = "tokens",
        activation_checkpointing: bool = False,
        compile: bool = False,
        compile_mode: str | None = None,
        compile_scope: Literal["auto", "step", "blocks"] = "auto",
        fused_loss: bool = False,
        generation: GenerationConfig | None = None,
        init_from: str | None = None,
        quantize: Literal["none", "int8"] = "none",
    ) -> None:
        """
        Args:
            config: The architecture (see TransformerConfig; presets in configs/presets).
            optimizer: adamw (decoupled weight decay, none on biases, norms and embeddings) or adam (the paper's).
            lr: Peak learning rate; with schedule=noam, a multiplier of the paper's formula (1.0 is the paper's).
            betas: Adam betas; None uses (0.9, 0.95) for adamw and the paper's (0.9, 0.98) for adam.
            eps: Adam epsilon; None uses 1e-8 for adamw and the paper's 1e-9 for adam.
            weight_decay: AdamW weight decay, on the weight matrices of linear layers only (see weight_decay_groups).
            decay_embeddings: Decay the token and position tables too (nanoGPT does; off by default).
            fused: Use the fused optimizer kernel; None picks fused on CUDA and foreach elsewhere.
            schedule: noam (the paper's), cosine (warmup + cosine decay), constant (warmup, then flat).
            warmup_steps: Optimizer steps of linear warmup (noam: the paper's warmup_steps, 4000).
            schedule_steps: Length of the cosine schedule in optimizer steps; None uses trainer.max_steps.
            min_lr_ratio: Where the cosine schedule ends, as a fraction of lr.
            label_smoothing: Label smoothing of the loss (the paper's 0.1); perplexity is always the unsmoothed one.
            class_weights: encoder_only classification: a weight per class in the loss (one per label, multi-label),
                or "balanced": n / (num_labels * n_class) from the training split's label counts; None weighs all
                equally.
            mlm_probability: masked_lm: the fraction of real tokens chosen as targets (BERT's 0.15; 80/10/10 rule).
            loss_normalization: tokens: the loss of an optimizer step is its summed token losses over every accumulated
                micro-batch and every rank, divided by the step's target tokens (fairseq's default), so a short batch
                weighs by its tokens (a classifier's targets are examples: the step's per-example mean; a masked LM's
                are its masked tokens); batch: each micro-batch's own mean, averaged over micro-batches and ranks (needed
                with DeepSpeed). With tokens, backward sees summed losses: under fp16 the loss scaler settles a few
                skipped steps lower, as in fairseq; bf16 and fp32 are unaffected.
            activation_checkpointing: Recompute each block's activations in backward (less memory, more time).
            compile: torch.compile the training step's forward and loss (a cold start of tens of seconds; pays off
                on GPUs, where fusing the output layer's softmax and loss is worth most).
            compile_mode: torch.compile's mode (None: its default; "max-autotune-no-cudagraphs", "reduce-overhead").
            compile_scope: step: the model's forward and the loss as one graph (fullgraph for decoder-only and
                encoder-decoder models); blocks: each block on its own (what activation checkpointing and sharded
                strategies compose with); auto: step, unless activation checkpointing or FSDP/DeepSpeed is on.
            fused_loss: decoder_only on CUDA: the output layer and the cross-entropy in one liger-kernel kernel
                (lit_transformer/fused_loss.py, `pip install -e '.[gpu]'`), never materialising the logits; the
                same loss. Refused on a CPU or without liger-kernel.
            generation: How `predict` and validation/test BLEU decode (any GenerationConfig field, e.g.
                --model.generation.num_beams 4); None uses the topology's defaults (GenerationConfig.for_model).
            init_from: A Hugging Face GPT-2 folder (or hub name) to fine-tune: its config.json sets the architecture
                and special token ids, its weights the parameters. Or a Marian folder (an OPUS-MT download, or
                `export --format hf` of an encoder-decoder): the same, and the data must use its tokenizer
                (--data.init_args.tokenizer DIR/tokenizer.json). Or a .ckpt of an encoder (a masked LM, or a
                classifier) for an encoder_only model: its architecture and encoder weights load, the task head (and
                config's head, num_labels, pooling, dropout) are this run's and start fresh. Read once: the hyperparameters record the resolved
                config and init_from=None, so loading or resuming a checkpoint never reads the folder again.
            quantize: int8: `validate`, `test` and `predict` run the model with dynamic int8 Linear layers
                (lit_transformer.quantization; CPU only), e.g. `predict --ckpt_path C --model.quantize int8`, or
                `validate` to measure what int8 costs. Never applies to `fit`, which refuses it.
        """
        source, pretrained = init_from, None
        self._init_tokenizer: str | None = None
        if init_from and str(init_from).endswith(".ckpt"):
            pretrained, self._init_tokenizer = load_pretrained_encoder(init_from, config)
            config, init_from = pretrained.config, None
        elif init_from:
            from lit_transformer.interop import load_hf_gpt2
            from lit_transformer.interop.hf_marian import is_marian_folder, load_hf_marian, marian_tokenizer_json

            if is_marian_folder(init_from):  # the encoder-decoder, and the tokenizer this run's data must use
                pretrained = load_hf_marian(init_from, base=config).train()
                self._init_tokenizer = marian_tokenizer_json(init_from)
            else:
                pretrained = load_hf_gpt2(init_from, base=config).train()
            # save_hyperparameters reads these arguments: checkpoints record the real architecture, not the folder.
            config, init_from = pretrained.config, None
        super().__init__()
        self.save_hyperparameters()
        if source:
            # LightningCLI hands save_hyperparameters its parsed arguments (config as a dict, init_from as given)
            # instead of these locals: record the resolved ones in the form it was given.
            given = self.hparams["config"]
            self.hparams["config"] = config.to_dict() if isinstance(given, dict) else config
            self.hparams["init_from"] = None
        self.init_from = source  # where the weights came from: kept in checkpoints for the record, never re-read
        self.config = config
        self.generation = generation or GenerationConfig.for_model(config)
        self.model = pretrained if pretrained is not None else Transformer(config)
        self.tokenizer: Tokenizer | None = None
        self.target_tokenizer: Tokenizer | None = None
        self.label_names: list[str] | None = None  # class names, from the data; saved in checkpoints
        self._class_weights: torch.Tensor | None = None
        # Every validation and test number is a per-token (classification: per-example) mean over the whole split
        # (and all ranks).
        for stage in ("val", "test"):
            setattr(self, f"{stage}_loss", MeanMetric())
            setattr(self, f"{stage}_nll", MeanMetric())
            if config.is_classifier:
                n = config.num_labels
                if config.multi_label:
                    setattr(self, f"{stage}_accuracy", MultilabelAccuracy(num_labels=n, average="micro"))
                    setattr(self, f"{stage}_f1", MultilabelF1Score(num_labels=n, average="macro"))
                    setattr(self, f"{stage}_class_f1", MultilabelF1Score(num_labels=n, average="none"))
                else:
                    setattr(self, f"{stage}_accuracy", MulticlassAccuracy(num_classes=n, average="micro"))
                    setattr(self, f"{stage}_f1", MulticlassF1Score(num_classes=n, average="macro"))
                    setattr(self, f"{stage}_class_f1", MulticlassF1Score(num_classes=n, average="none"))
                    setattr(self, f"{stage}_confusion", MulticlassConfusionMatrix(num_classes=n))
            else:
                vocab = config.tgt_vocab_size
                accuracy = MulticlassAccuracy(num_classes=vocab, average="micro", ignore_index=IGNORE_INDEX)
                setattr(self, f"{stage}_accuracy", accuracy)
        self.val_bleu = SacreBLEUScore(tokenize="13a")
        self.test_bleu = SacreBLEUScore(tokenize="13a")
        self.flops_per_batch: float | None = None  # read by the ThroughputMonitor for MFU
        self._bleu_budget: int | None = None
        # (summed loss, summed NLL, target tokens) of this rank's micro-batches since the last optimizer step.
        self._step_sums: torch.Tensor | None = None
        self._checked_target_padding = False
        self._compiled_sums: Callable[[dict[str, torch.Tensor]], tuple[torch.Tensor, ...]] | None = None

    # ---- wiring -------------------------------------------------------------------------------------------------

    def configure_model(self) -> None:
        """Applied from outside the model code, once, whatever the strategy."""
        if getattr(self, "_parallelized", False):
            return
        from lit_transformer.parallelize import CompiledStep, apply_activation_checkpointing, compile_blocks

        strategy = type(self._trainer.strategy).__name__ if self._trainer is not None else ""
        # FSDP applies checkpointing itself from its activation_checkpointing_policy.
        if self.hparams.activation_checkpointing and "FSDP" not in strategy:
            apply_activation_checkpointing(self.model)
        if self.hparams.compile:
            mode, scope = self.hparams.get("compile_mode"), self.hparams.get("compile_scope", "auto")
            sharded = any(name in strategy for name in ("FSDP", "DeepSpeed", "ModelParallel"))
            if scope == "auto":
                scope = "blocks" if self.hparams.activation_checkpointing or sharded else "step"
            if scope == "blocks":
                compile_blocks(self.model, mode=mode)
            else:
                # The forward and the loss in one graph, so the (tokens, vocabulary) logits' cast, log-softmax and
                # gather fuse; a function, not a wrapped module, so parameter names and checkpoints are unchanged.
                fullgraph = not self.config.is_encoder_only  # the masked LM's corruption draws on a generator
                # Language-model blocks have one shape; token-budget batches a new one at each step: one dynamic graph.
                dynamic = self.config.topology != "decoder_only"
                self._compiled_sums = CompiledStep(self._training_sums, mode, fullgraph, dynamic)
        self._parallelized = True

    def setup(self, stage: str) -> None:
        from lightning.pytorch.strategies import DeepSpeedStrategy

        if stage == "fit" and self.hparams.loss_normalization == "tokens":
            if isinstance(self.trainer.strategy, DeepSpeedStrategy):
                raise ValueError(
                    "loss_normalization='tokens' rescales the gradients once a step's tokens are counted, but DeepSpeed "
                    "keeps its gradients to itself; use --model.loss_normalization=batch with DeepSpeed"
                )
        datamodule = getattr(self.trainer, "datamodule", None)
        if datamodule is not None and self.tokenizer is None:
            self.tokenizer = datamodule.tokenizer
            self.target_tokenizer = getattr(datamodule, "target_tokenizer", None) or datamodule.tokenizer
        if datamodule is not None and getattr(datamodule, "label_names", None) is not None:
            self.label_names = list(datamodule.label_names)
        self._check_tokenizer()
        if self._init_tokenizer is not None and self.tokenizer is not None:
            if not _same_segmentation(self.tokenizer.to_str(), self._init_tokenizer):
                # The .ckpt or the Marian folder itself names the tokenizer (a folder also its decoder's start token).
                raise ValueError(
                    f"init_from {self.init_from} was trained with another tokenizer than this run's data: the encoder's "
                    f"embeddings would meet other ids. Use its tokenizer: --data.init_args.tokenizer {self.init_from}"
                )
        self._class_weights = self._resolve_class_weights(datamodule)
        if stage == "fit" and self.hparams.get("fused_loss"):
            from lit_transformer.fused_loss import require_fused_loss

            if self.config.topology != "decoder_only":
                raise ValueError("fused_loss=true is for decoder_only language models; drop it for this topology")
            require_fused_loss(self.trainer.strategy.root_device)
        if stage == "fit" and self.hparams.get("quantize", "none") != "none":
            raise ValueError(
                "--model.quantize int8 is for validate, test and predict: int8 Linear layers have no gradient. Train "
                "in fp32 and quantize the checkpoint (`predict --ckpt_path C --model.quantize int8`)"
            )

    def _quantize_for_inference(self) -> None:
        """Swap in int8 Linear layers once the checkpoint's weights are loaded and the model is in eval mode (in
        setup they are not loaded yet: the fp32 checkpoint could not fill int8 layers)."""
        if self.hparams.get("quantize", "none") == "none":
            return
        from lit_transformer.quantization import is_quantized, quantize_int8

        if not is_quantized(self.model):
            quantize_int8(self.model, inplace=True)

    def on_validation_start(self) -> None:
        if self.trainer.state.fn == "validate":  # not the validation inside fit
            self._quantize_for_inference()

    def on_test_start(self) -> None:
        self._quantize_for_inference()

    def on_predict_start(self) -> None:
        self._quantize_for_inference()

    def _resolve_class_weights(self, datamodule: Any) -> torch.Tensor | None:
        weights = self.hparams.get("class_weights")
        if weights is None or not self.config.is_classifier:
            return None
        if weights == "balanced":
            counts = getattr(datamodule, "label_counts", None)
            if counts is None:
                raise ValueError('class_weights="balanced" needs a DataModule that counts its labels (label_counts)')
            counts = torch.as_tensor(counts(), dtype=torch.float32).clamp(min=1)
            return counts.sum() / (len(counts) * counts)
        if len(weights) != self.config.num_labels:
            raise ValueError(f"class_weights has {len(weights)} values for num_labels={self.config.num_labels}")
        return torch.tensor(weights, dtype=torch.float32)

    def on_fit_start(self) -> None:
        # The tokenizer beside the TensorBoard logs too, for tools that read the run folder rather than checkpoints.
        datamodule = getattr(self.trainer, "datamodule", None)
        log_dir = self.trainer.log_dir  # a broadcast under DDP: every rank must ask
        if self.trainer.is_global_zero and log_dir and hasattr(datamodule, "save_tokenizer"):
            datamodule.save_tokenizer(log_dir)

    def _check_tokenizer(self) -> None:
        if self.tokenizer is not None:
            check_tokenizer_vocabulary(self.tokenizer.get_vocab_size(), self.config)
        if self.target_tokenizer is not None and self.config.target_vocab_size is not None:
            check_tokenizer_vocabulary(
                self.target_tokenizer.get_vocab_size(),
                self.config.replace(
                    vocab_size=self.config.tgt_vocab_size, target_vocab_size=None, share_embeddings=None
                ),
                what="target tokenizer",
            )

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.init_from:
            checkpoint["init_from"] = self.init_from
        # The tokenizer travels inside the checkpoint, as a JSON string: generate/translate need nothing else.
        if self.tokenizer is not None:
            checkpoint["tokenizer"] = self.tokenizer.to_str()
        if self.target_tokenizer is not None and self.target_tokenizer is not self.tokenizer:
            checkpoint["target_tokenizer"] = self.target_tokenizer.to_str()
        if self.label_names is not None:
            checkpoint["label_names"] = list(self.label_names)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.init_from = self.init_from or checkpoint.get("init_from")
        if "tokenizer" in checkpoint:
            self.tokenizer = Tokenizer.from_str(checkpoint["tokenizer"])
            target = checkpoint.get("target_tokenizer")
            self.target_tokenizer = Tokenizer.from_str(target) if target else self.tokenizer
        if "label_names" in checkpoint:
            self.label_names = list(checkpoint["label_names"])

    # ---- steps --------------------------------------------------------------------------------------------------

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Logits of a batch as the DataModules lay it out (a masked LM's inputs are corrupted in _loss, not here)."""
        if self.config.is_encoder_decoder:
            # Targets are padded on the right (TranslationDataModule's layout, checked once by _check_target_padding):
            # under causal attention no real position sees a padded one, and padded positions have no label, so
            # is_causal alone is exact there and keeps the fastest attention kernels; the source keeps its mask.
            return self.model(batch["src"], batch["tgt_in"], src_mask=batch["src_mask"])
        return self.model(batch["input_ids"], attention_mask=batch.get("attention_mask"))

    def _tokens(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return batch["tgt_in"] if self.config.is_encoder_decoder else batch["input_ids"]

    def _loss(
        self, batch: dict[str, torch.Tensor], generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(logits, labels, summed loss, summed NLL, target count) of a batch, for any topology and head.

        A masked LM corrupts its inputs here (BERT's rule, see mask_tokens), so any batch of tokens serves: the
        classification data's passages, or the language-model data's packed blocks (whose next-token labels it
        ignores). Training draws from torch's generator (seeded per step by StepSeed); evaluation passes a fixed one.
        """
        cfg, smoothing = self.config, self.hparams.label_smoothing
        if cfg.is_encoder_only and cfg.head == "masked_lm":
            tokens, mask = batch["input_ids"], batch.get("attention_mask")
            special = [
                i for i in (cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id, cfg.mask_token_id) if i is not None
            ]
            inputs, labels = mask_tokens(
                tokens,
                cfg.mask_token_id,
                cfg.vocab_size,
                probability=self.hparams.get("mlm_probability", 0.15),
                attention_mask=mask,
                special_ids=special,
                generator=generator,
            )
            logits = self.model(inputs, attention_mask=mask)
            return logits, labels, *smoothed_cross_entropy(logits, labels, smoothing)
        logits = self(batch)
        labels = batch["labels"]
        if cfg.is_classifier:
            weights = None if self._class_weights is None else self._class_weights.to(logits.device)
            return logits, labels, *classification_loss(logits, labels, smoothing, weights, cfg.multi_label)
        return logits, labels, *smoothed_cross_entropy(logits, labels, smoothing)

    def _check_target_padding(self, batch: dict[str, torch.Tensor]) -> None:
        if not self._checked_target_padding and self.config.is_encoder_decoder and batch.get("tgt_mask") is not None:
            check_right_padded(batch["tgt_mask"])  # one read of the device, on the first batch only
            self._checked_target_padding = True

    def _training_sums(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(summed loss, summed NLL, target count) of a training batch: what `compile` compiles as one graph."""
        if self.hparams.get("fused_loss"):
            from lit_transformer.fused_loss import fused_linear_cross_entropy

            tokens = batch["input_ids"]
            hidden = self.model.decode(tokens, tgt_mask=self.model.key_mask(tokens, batch.get("attention_mask")),
                                       project=False)  # fmt: skip
            weight, vocab = self.model.lm_head.weight, self.config.tgt_vocab_size
            return fused_linear_cross_entropy(hidden, weight, batch["labels"], vocab, self.hparams.label_smoothing)
        return self._loss(batch)[2:]

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        # Per batch: translation batches vary in shape (token budget), and MFU must follow them.
        tokens = self._tokens(batch)
        self.flops_per_batch = self.model.flops_per_token(tokens.size(1)) * tokens.numel()
        self._check_target_padding(batch)
        loss_sum, nll_sum, count = (self._compiled_sums or self._training_sums)(batch)
        if self.hparams.loss_normalization == "batch":
            batch_size = batch["labels"].size(0)
            loss = loss_sum / count.clamp(min=1)
            if self._logs_this_step():
                self.log("train/loss", loss, batch_size=batch_size)
                self.log("train/ppl", (nll_sum.detach() / count.clamp(min=1)).exp(), batch_size=batch_size)
            return loss
        sums = torch.stack([loss_sum.detach(), nll_sum.detach(), count.to(loss_sum.dtype)]).float()
        self._step_sums = sums if self._step_sums is None else self._step_sums + sums
        # The summed loss; optimizer_step divides the step's gradient by its token count once all are known.
        return loss_sum

    def optimizer_step(
        self,
        epoch: int,
        batch_idx: int,
        optimizer: torch.optim.Optimizer,
        optimizer_closure: Callable[[], Any] | None = None,
    ) -> None:
        if self.hparams.loss_normalization == "tokens" and optimizer_closure is not None:
            run_last_micro_batch = optimizer_closure

            def optimizer_closure() -> Any:
                # The closure runs the step's last forward and backward; normalising right after it, before any
                # on_before_optimizer_step hook, lets callbacks, clipping and the optimizer see the true gradient.
                result = run_last_micro_batch()
                self._normalize_by_tokens(optimizer)
                return result

        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)

    def _normalize_by_tokens(self, optimizer: torch.optim.Optimizer) -> None:
        """Turn the step's gradient into that of (sum of token losses) / (target tokens), over micro-batches and ranks.

        Each micro-batch returned its summed loss; Lightning divided it by accumulate_grad_batches and data-parallel
        strategies average gradients over ranks, so the gradient holds sum / (accumulate * world_size). One all-reduce
        per optimizer step (three numbers) gives the step's token count, as fairseq does (sentence_avg=False). Under
        tensor parallelism both the token count and world_size count each batch tp times, so the ratio still holds.
        """
        if self._step_sums is None:
            return
        trainer = self.trainer
        sums = self._step_sums
        if trainer.world_size > 1:
            sums = trainer.strategy.reduce(sums, reduce_op="sum")
        self._step_sums = None
        loss_sum, nll_sum, tokens = sums.unbind()
        tokens = tokens.clamp(min=1)
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if grads:  # a scale on the device: no host synchronisation
            scale = (trainer.accumulate_grad_batches * trainer.world_size / tokens).to(grads[0].device)
            torch._foreach_mul_(grads, scale)
        # The same on every rank: the step's per-token numbers, no further synchronisation needed. Not prog_bar:
        # Lightning reads progress-bar tensors after every batch (a host synchronisation); the CLI's bar shows
        # train/loss read at logging steps (SyncFreeProgressBar).
        if self._logs_this_step():
            self.log("train/loss", (loss_sum / tokens).float())
            self.log("train/ppl", (nll_sum / tokens).exp().float())
            self.log("train/tokens_per_step", tokens.float())

    def _evaluate(self, batch: dict[str, Any], stage: str, batch_idx: int = 0) -> None:
        loss_metric, nll_metric, acc_metric = (getattr(self, f"{stage}_{name}") for name in ("loss", "nll", "accuracy"))
        # A masked LM's evaluation masks the same positions every time: its numbers then compare across validations.
        generator = torch.Generator(self.device).manual_seed(batch_idx) if self.config.is_encoder_only else None
        self._check_target_padding(batch)
        logits, labels, loss_sum, nll_sum, count = self._loss(batch, generator)
        if self.config.is_classifier and self._class_weights is not None:
            # The weighted loss stays val/loss; val/nll is the plain per-example NLL, comparable across weightings.
            _, nll_sum, _ = classification_loss(logits, labels, multi_label=self.config.multi_label)
            count_nll = torch.tensor(float(len(labels)), device=logits.device)
        else:
            count_nll = count
        loss_metric.update(loss_sum / count.clamp(min=1), weight=count)  # a batch without targets adds weight 0
        nll_metric.update(nll_sum / count_nll.clamp(min=1), weight=count_nll)
        if self.config.is_classifier:
            for name in ("accuracy", "f1", "class_f1", "confusion"):
                metric = getattr(self, f"{stage}_{name}", None)
                if metric is not None:
                    metric.update(logits, labels)
            self.log(f"{stage}/f1", getattr(self, f"{stage}_f1"), prog_bar=stage == "val")
        else:
            acc_metric.update(logits.reshape(-1, logits.size(-1)), labels.reshape(-1))
        # Metric objects: Lightning logs their compute() at the end of the epoch, weighted by tokens, all ranks.
        self.log(f"{stage}/loss", loss_metric, prog_bar=stage == "val")
        self.log(f"{stage}/nll", nll_metric)
        self.log(f"{stage}/accuracy", acc_metric, prog_bar=stage == "val" and self.config.is_classifier)

    def on_validation_epoch_start(self) -> None:
        self._bleu_budget = getattr(getattr(self.trainer, "datamodule", None), "bleu_samples", None)

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, "val", batch_idx)
        if self.config.is_encoder_decoder and "ref_text" in batch and self._bleu_budget != 0:
            # BLEU on the first bleu_samples validation pairs (the DataModule's setting): beam search is slow.
            rows = (
                len(batch["ref_text"]) if self._bleu_budget is None else min(self._bleu_budget, len(batch["ref_text"]))
            )
            translations = self.translate_batch(batch["src"][:rows], batch["src_mask"][:rows])
            self.val_bleu.update(translations, [[r] for r in batch["ref_text"][:rows]])
            if self._bleu_budget is not None:
                self._bleu_budget -= rows

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, "test", batch_idx)
        if self.config.is_encoder_decoder and "ref_text" in batch:
            self.test_bleu.update(
                self.translate_batch(batch["src"], batch["src_mask"]), [[r] for r in batch["ref_text"]]
            )

    def on_validation_epoch_end(self) -> None:
        self._epoch_end("val", self.val_nll, self.val_bleu)

    def on_test_epoch_end(self) -> None:
        self._epoch_end("test", self.test_nll, self.test_bleu)

    def _epoch_end(self, stage: str, nll_metric: MeanMetric, bleu: SacreBLEUScore) -> None:
        if self.config.is_classifier:
            self._classification_epoch_end(stage)
            return
        if nll_metric.update_called:
            nll = nll_metric.compute()
            self.log(f"{stage}/ppl", nll.exp(), prog_bar=stage == "val")
            chars_per_token = getattr(getattr(self.trainer, "datamodule", None), "characters_per_token", None)
            if chars_per_token is not None and self.config.topology == "decoder_only":
                # Bits per character: one scale for any tokenizer (and for character-level models such as nanoGPT's).
                split = "validation" if stage == "val" else "test"
                self.log(f"{stage}/bpc", nll / math.log(2) / chars_per_token(split), prog_bar=stage == "val")
        if self.config.is_encoder_decoder and bleu.update_called:
            self.log(f"{stage}/bleu", bleu.compute() * 100, prog_bar=True)
            bleu.reset()
            self._log_bleu_signature(stage)

    def _classification_epoch_end(self, stage: str) -> None:
        """Per-class F1 as scalars named by label, and the confusion matrix as an image in TensorBoard."""
        class_f1 = getattr(self, f"{stage}_class_f1")
        if not class_f1.update_called:
            return
        names = self.label_names or [str(i) for i in range(self.config.num_labels)]
        for name, value in zip(names, class_f1.compute(), strict=True):
            self.log(f"{stage}/f1/{name}", value)
        class_f1.reset()
        confusion = getattr(self, f"{stage}_confusion", None)
        if confusion is None or not confusion.update_called:
            return
        matrix = confusion.compute()  # (true, predicted), synchronised over ranks
        confusion.reset()
        if self.trainer.is_global_zero and not self.trainer.sanity_checking:
            from lit_transformer.callbacks import confusion_figure

            for logger in self.loggers:
                if hasattr(logger.experiment, "add_figure"):
                    logger.experiment.add_figure(
                        f"{stage}/confusion_matrix", confusion_figure(matrix.cpu(), names), self.global_step
                    )

    def _log_bleu_signature(self, stage: str) -> None:
        """sacreBLEU's signature beside the score, so a reported BLEU says how it was computed."""
        import sacrebleu

        scorer = sacrebleu.BLEU(tokenize="13a")
        scorer.corpus_score(["a"], [["a"]])  # the signature is known once the number of references is
        signature = str(scorer.get_signature())
        for logger in self.loggers:
            if self.trainer.is_global_zero and hasattr(logger.experiment, "add_text"):
                logger.experiment.add_text(f"{stage}/bleu_signature", signature, self.global_step)

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Norm clipping uses the step's one gradient norm (see gradient_norm), which is the global norm under FSDP
        too, where Lightning refuses norm clipping; value clipping and fp16 with an unscaling optimizer go to Lightning.
        """
        algorithm = GradClipAlgorithmType(gradient_clip_algorithm or GradClipAlgorithmType.NORM)
        plugin = self.trainer.precision_plugin
        scaler = getattr(plugin, "scaler", None)
        if (
            gradient_clip_val
            and algorithm == GradClipAlgorithmType.NORM
            and not (scaler is not None and _optimizer_handles_unscaling(optimizer))
        ):
            params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            torch.nn.utils.clip_grads_with_norm_(params, gradient_clip_val, gradient_norm(self.trainer, optimizer))
            return
        if gradient_clip_val and isinstance(plugin, MixedPrecision) and scaler is None:
            # bf16 autocast has no loss scaler, so clipping before a fused step is exact; Lightning's mixed-precision
            # plugin refuses any fused optimizer, so clip with the plain precision plugin's code.
            Precision.clip_gradients(plugin, optimizer, gradient_clip_val, algorithm)
            return
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # The gradient norm before clipping, at the steps the trainer logs (computed once per step, shared with the
        # non-finite guard and clipping).
        if self._logs_this_step():
            self.log("train/grad_norm", gradient_norm(self.trainer, optimizer))

    def _logs_this_step(self) -> bool:
        """Whether training metrics are logged at this step: the steps the trainer writes logs at, the first and the
        last. A `self.log` call costs host time (measured: most of the Lightning step's overhead over a hand-written
        loop), and one whose value nobody reads is waste; between logs callback_metrics keep the last logged values.
        """
        trainer = self._trainer
        if trainer is None:
            return True
        step, last = trainer.global_step, trainer.max_steps
        return step == 0 or (last > 0 and step + 1 >= last) or trainer._logger_connector.should_update_logs

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> list[dict[str, Any]]:
        """Generate for each input of the predict_file: {"input", "output", "tokens"} per row (see PredictionWriter).
        A classifier writes {"input", "label", "probability", "probabilities"} (multi-label: "labels", the names
        above 0.5)."""
        if self.config.is_encoder_only:
            return self._classify_rows(batch)
        from lit_transformer.inference import TextStream

        ids, mask = batch["input_ids"], batch["attention_mask"]
        stream = TextStream(self.target_tokenizer, len(ids), self.generation.stop, [self.config.eos_token_id])
        if self.generation.num_beams == 1:
            self.model.generate(ids, self.generation, attention_mask=mask, streamer=stream)
        else:  # beam search settles its tokens at the end: replay them through the same stop rules
            for step_tokens in self.model.generate(ids, self.generation, attention_mask=mask).T:
                stream(step_tokens)
        rows = zip(batch["text"], stream.texts(), stream.ids, strict=True)
        return [{"input": text, "output": output, "tokens": tokens} for text, output, tokens in rows]

    def _classify_rows(self, batch: dict[str, Any]) -> list[dict[str, Any]]:
        if not self.config.is_classifier:
            raise ValueError("predict classifies with an encoder_only classification model; a masked LM has no labels")
        logits = self.model(batch["input_ids"], attention_mask=batch["attention_mask"]).float()
        probs = logits.sigmoid() if self.config.multi_label else logits.softmax(dim=-1)
        names = self.label_names or [str(i) for i in range(self.config.num_labels)]
        rows = []
        for text, p in zip(batch["text"], probs.tolist(), strict=True):
            row: dict[str, Any] = {"input": text}
            if self.config.multi_label:
                row["labels"] = [name for name, q in zip(names, p, strict=True) if q > 0.5]
            else:
                best = max(range(len(p)), key=p.__getitem__)
                row["label"], row["probability"] = names[best], p[best]
            row["probabilities"] = dict(zip(names, p, strict=True))
            rows.append(row)
        return rows

    # ---- generation helpers -------------------------------------------------------------------------------------

    def decode(self, ids: torch.Tensor, target: bool = True) -> list[str]:
        """Token ids to text, cut at the first EOS; special tokens dropped."""
        tokenizer = self.target_tokenizer if target else self.tokenizer
        if tokenizer is None:
            raise RuntimeError("No tokenizer attached: train with a DataModule or load a checkpoint that holds one")
        eos = self.config.eos_token_id
        rows = []
        for row in ids.tolist():
            if eos is not None and eos in row:
                row = row[: row.index(eos)]
            rows.append(row)
        return tokenizer.decode_batch(rows, skip_special_tokens=True)

    @torch.no_grad()
    def translate_batch(self, src: torch.Tensor, src_mask: torch.Tensor | None = None) -> list[str]:
        """Translations of a batch of sources, decoded as the module's GenerationConfig says."""
        out = self.model.generate(src, self.generation, attention_mask=src_mask)
        return self.decode(out)

    # ---- optimization -------------------------------------------------------------------------------------------

    def configure_optimizers(self):
        hp = self.hparams
        decay, no_decay = weight_decay_groups(self.model, hp.decay_embeddings)
        adam = hp.optimizer == "adam"
        betas = hp.betas or ((0.9, 0.98) if adam else (0.9, 0.95))
        eps = hp.eps or (1e-9 if adam else 1e-8)
        on_cuda = self.device.type == "cuda"
        # A fused optimizer unscales fp16 gradients inside its step, after clipping would have seen them scaled.
        trainer = self._trainer
        scaled_and_clipped = (
            trainer is not None
            and bool(trainer.gradient_clip_val)
            and getattr(trainer.precision_plugin, "scaler", None) is not None
        )
        fused = (on_cuda and not scaled_and_clipped) if hp.fused is None else hp.fused
        kwargs: dict[str, Any] = {"lr": hp.lr, "betas": tuple(betas), "eps": eps}
        kwargs["fused" if fused else "foreach"] = True
        if adam:
            optimizer = torch.optim.Adam(decay + no_decay, **kwargs)
        else:
            groups = [
                {"params": decay, "weight_decay": hp.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ]
            optimizer = torch.optim.AdamW(groups, **kwargs)
        max_steps = self.trainer.max_steps if self._trainer is not None else -1
        total = hp.schedule_steps or (max_steps if max_steps and max_steps > 0 else None)
        scheduler = build_schedule(
            optimizer,
            hp.schedule,
            warmup_steps=hp.warmup_steps,
            total_steps=total,
            d_model=self.config.d_model,
            min_lr_ratio=hp.min_lr_ratio,
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


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
ENCODER_PREFIXES = ("src_embed.", "src_positions.", "encoder_blocks.", "encoder_norm.")


def _same_segmentation(tokenizer_json: str, other_json: str) -> bool:
    """Whether two tokenizers give the same ids: post-processors aside, which our encoding never runs (the DataModules
    place BOS/EOS themselves; save_hf_marian's tokenizer.json has one for transformers' sake)."""
    if tokenizer_json == other_json:
        return True
    a, b = json.loads(tokenizer_json), json.loads(other_json)
    a.pop("post_processor", None)
    b.pop("post_processor", None)
    return a == b


def load_pretrained_encoder(path: str, config: TransformerConfig) -> tuple[Transformer, str | None]:
    """An encoder_only model whose encoder (embeddings, positions, blocks, final norm) comes from the checkpoint at
    `path` (an encoder_only masked LM or classifier) and whose head is new, and the checkpoint's tokenizer (JSON).

    The architecture comes from the checkpoint (ENCODER_FIELDS); the task (head, num_labels, pooling, classifier
    fields, dropout, init) from `config`, so `fit --model.init_from mlm.ckpt` turns a masked LM into a classifier.
    """
    from lit_transformer.checkpointing import load_checkpoint

    checkpoint = load_checkpoint(path)
    saved = (checkpoint.get("hyper_parameters") or {}).get("config")
    if isinstance(saved, dict):
        saved = TransformerConfig(**saved)
    if not isinstance(saved, TransformerConfig) or not saved.is_encoder_only:
        raise ValueError(f"init_from {path}: a .ckpt must hold an encoder_only model (a masked LM or a classifier)")
    if not config.is_encoder_only:
        raise ValueError(f"init_from {path} holds an encoder; this run's model.config.topology must be encoder_only")
    config = config.replace(**{name: getattr(saved, name) for name in ENCODER_FIELDS})
    model = Transformer(config)
    state = {k.removeprefix("model."): v for k, v in checkpoint["state_dict"].items() if k.startswith("model.")}
    encoder = {k: v for k, v in state.items() if k.startswith(ENCODER_PREFIXES)}
    missing = [k for k in model.state_dict() if k.startswith(ENCODER_PREFIXES) and k not in encoder]
    if missing:
        raise ValueError(f"init_from {path}: the checkpoint lacks encoder weights {missing[:5]}")
    model.load_state_dict(encoder, strict=False)
    return model.train(), checkpoint.get("tokenizer")
