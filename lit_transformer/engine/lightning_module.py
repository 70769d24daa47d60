"""LitTransformer: the engine around the plain model. It runs any task (lit_transformer/tasks) and owns what every
task shares: hyperparameters, compile and activation checkpointing, strategy checks, the normalisation of a step's
gradient by its target count, clipping, the optimizer and schedule, and the tokenizers in checkpoints. What changes
the model from outside with hooks of its own is a ModelTransform (lit_transformer/transforms): the engine holds the
ones its options ask for and calls their hooks, never asking which they are."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import lightning as L
import torch
from tokenizers import Tokenizer
from typing_extensions import Unpack

# Importing checkpointing also allowlists TransformerConfig for weights_only loads: load_from_checkpoint needs it.
from lit_transformer.checkpoints.files import check_tokenizer_vocabulary
from lit_transformer.config import GenerationConfig, TransformerConfig
from lit_transformer.data import FILLER
from lit_transformer.engine.deprecated_options import DEPRECATED_NAMES, DeprecatedOptions, split_deprecated
from lit_transformer.engine.gradients import clip_gradients, gradient_norm, scale_gradients
from lit_transformer.engine.lightning_compat import trainer_logs_now
from lit_transformer.engine.optimizers import (
    Optimization,
    build_optimizer,
    check_optimizer_precision,
    check_optimizer_strategy,
)
from lit_transformer.engine.schedules import build_schedule, schedule_length
from lit_transformer.errors import ConfigError
from lit_transformer.model import Transformer
from lit_transformer.tasks import Task, build_task, data_fields
from lit_transformer.transforms import LoraOptions, Quantize, build_transforms

LossNormalization = Literal["tokens", "batch"]
__all__ = ["LitTransformer"]


class LitTransformer(L.LightningModule):
    """Trains a `Transformer` at a task (see lit_transformer/tasks): by default the one its config's topology and
    head imply (a causal language model, a translation model, an encoder-only classifier or masked language model)."""

    RUN_CHOICES: tuple[str, ...] = (
        "generation", "quantize", "compile", "compile_mode", "compile_scope", "activation_checkpointing",
    )  # fmt: skip
    """Arguments that say how this run computes, not what the model is or how it learns: with --ckpt_path the
    command line's apply, not the checkpoint's (resume compiled, or with activation checkpointing for a larger batch;
    decode or quantize as this run asks). Each changes no number a checkpoint holds: parameter names and values are
    the same with and without them."""

    def __init__(
        self,
        config: TransformerConfig,
        task: Task | str | None = None,
        optim: Optimization | None = None,
        loss_normalization: LossNormalization = "tokens",
        activation_checkpointing: bool = False,
        compile: bool = False,
        compile_mode: str | None = None,
        compile_scope: Literal["auto", "step", "blocks"] = "auto",
        generation: GenerationConfig | None = None,
        init_from: str | None = None,
        quantize: Quantize = "none",
        lora: LoraOptions | None = None,
        **deprecated: Unpack[DeprecatedOptions],
    ) -> None:
        """
        Args:
            config: The architecture (see TransformerConfig; presets in configs/presets).
            task: What the model learns (lit_transformer.tasks): a short name (language_modeling, translation,
                classification, masked_lm) or {class_path, init_args} of any Task, e.g. `--model.task translation
                --model.task.init_args.label_smoothing 0.1`; None: the task of config's topology and head.
            optim: The optimizer and its schedule (see Optimization); None: its defaults.
            loss_normalization: tokens: a step's loss is its summed target losses (tokens; a classifier's examples)
                over all micro-batches and ranks, divided by its target count (fairseq's default); batch: each
                micro-batch's own mean, averaged (needed with DeepSpeed). With tokens, backward sees summed losses:
                under fp16 the loss scaler settles a few skipped steps lower, as in fairseq.
            activation_checkpointing: Recompute each block's activations in backward (less memory, more time).
            compile: torch.compile the training step's forward and loss (a cold start of tens of seconds; pays off
                on GPUs, where fusing the output layer's softmax and loss is worth most).
            compile_mode: torch.compile's mode (None: its default; "max-autotune-no-cudagraphs", "reduce-overhead").
            compile_scope: step: the model's forward and the loss as one graph (fullgraph where the task allows it);
                blocks: each block on its own (what activation checkpointing and sharded strategies compose with);
                auto: step, unless activation checkpointing or FSDP/DeepSpeed is on.
            generation: How `predict` and validation/test BLEU decode (any GenerationConfig field, e.g.
                --model.generation.num_beams 4): the command line's fields over the task's defaults
                (GenerationConfig.for_task); None uses those defaults.
            init_from: Weights to start from (see lit_transformer.interop.pretrained): a Hugging Face GPT-2, Llama
                or Marian folder (its tokenizer then the data's: --data.init_args.tokenizer DIR/tokenizer.json), an
                encoder's .ckpt (a masked LM or classifier) under a new head, or any other .ckpt of ours. Read once:
                the hyperparameters record the resolved config and init_from=None, so loading or resuming never reads
                it again (except with lora: its checkpoints hold no base weights).
            quantize: int8: `validate`, `test` and `predict` run dynamic int8 Linear layers (CPU only), e.g.
                `predict --ckpt_path C --model.quantize int8`; `fit` refuses it.
            lora: Fine-tune low-rank adapters (peft's LoRA) on init_from's weights, which stay frozen (see
                lit_transformer.transforms.lora.LoraAdapters, configs/finetune/lora.yaml): checkpoints hold the adapters,
                the extras that train and a fingerprint of the base, which loading reads again from init_from and checks.
            deprecated: The arguments before model.optim and model.task (lr, warmup_steps, label_smoothing, ...):
                passed on with a warning naming the new key (see lit_transformer.engine.deprecated_options).
        """
        source, pretrained, self._init_tokenizer = init_from, None, None
        config = TransformerConfig(**config) if isinstance(config, dict) else config  # a checkpoint's hparams: a dict
        # Applied to the model from outside, each with its own hooks (see ModelTransform).
        transforms = build_transforms(lora, quantize, init_from)
        if init_from:
            from lit_transformer.interop.pretrained import load_init_from

            pretrained, self._init_tokenizer = load_init_from(init_from, config)
            # save_hyperparameters reads these arguments: checkpoints record the real architecture, not the source.
            config, init_from = pretrained.config, None
        resolved, task_options = split_deprecated(optim, dict(deprecated))
        the_task = build_task(task, config, **task_options)
        # Checkpoints record the task as {class_path, init_args} and the optimizer as a dict, no old argument again.
        task, optim = the_task.spec(), dataclasses.asdict(resolved)
        deprecated.clear()
        super().__init__()
        self.save_hyperparameters()
        if source:
            # LightningCLI hands save_hyperparameters its parsed arguments (config as a dict, init_from as given)
            # instead of these locals: record the resolved ones in the form it was given.
            given = self.hparams["config"]
            self.hparams["config"] = config.to_dict() if isinstance(given, dict) else config
            # Unless a transform's checkpoints hold no base weights: then loading reads them again from init_from.
            self.hparams["init_from"] = source if any(t.rereads_base for t in transforms) else None
        for name in DEPRECATED_NAMES:  # LightningCLI hands its parsed arguments, old ones included
            self.hparams.pop(name, None)
        self.hparams.update({"task": task, "optim": optim})
        for transform in transforms:
            self.hparams.update(transform.hparams())
        self.transforms = transforms
        self.task, self.optim = the_task, resolved
        self.init_from = source  # where the weights came from: kept in checkpoints for the record, never re-read
        self.config = config
        self.generation = generation or GenerationConfig.for_task(self.task)
        self.model = pretrained if pretrained is not None else Transformer(config)
        self.tokenizer: Tokenizer | None = None
        self.target_tokenizer: Tokenizer | None = None
        self.flops_per_batch: float | None = None  # read by the ThroughputMonitor for MFU
        # (summed loss, summed NLL, target count) of this rank's micro-batches since the last optimizer step.
        self._step_sums: torch.Tensor | None = None
        self._checked_batch = False
        self._compiled_sums: Callable[[dict[str, torch.Tensor]], tuple[torch.Tensor, ...]] | None = None

    # ---- wiring -------------------------------------------------------------------------------------------------

    def configure_model(self) -> None:
        """Applied from outside the model code, once, whatever the strategy."""
        if getattr(self, "_parallelized", False):
            return
        from lit_transformer.transforms.activation_checkpointing import apply_activation_checkpointing
        from lit_transformer.transforms.compilation import CompiledStep, compile_blocks

        for transform in self.transforms:  # first: checkpointing and compile then wrap the transformed blocks
            transform.apply(self)
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
                # The forward and the loss in one graph (the logits' cast, log-softmax and gather fuse), as a function:
                # parameter names and checkpoints are unchanged. Batches of varying shape share one dynamic graph.
                dynamic = not self.task.static_shapes
                self._compiled_sums = CompiledStep(self._training_sums, mode, self.task.fullgraph, dynamic)
        self._parallelized = True

    def setup(self, stage: str) -> None:
        from lightning.pytorch.strategies import DeepSpeedStrategy

        if stage == "fit":
            check_optimizer_strategy(self.optim, self.trainer.strategy)
        if stage == "fit" and self.hparams.loss_normalization == "tokens":
            if isinstance(self.trainer.strategy, DeepSpeedStrategy):
                raise ConfigError(
                    "loss_normalization='tokens' rescales the gradients once a step's tokens are counted, but DeepSpeed "
                    "keeps its gradients to itself; use --model.loss_normalization=batch with DeepSpeed"
                )
        for transform in self.transforms:
            transform.setup(self, stage)
        data = data_fields(self.trainer.datamodule, ("tokenizer", "target_tokenizer", *self.task.reads))
        if self.tokenizer is None and data.get("tokenizer") is not None:
            self.tokenizer = data["tokenizer"]
            self.target_tokenizer = data.get("target_tokenizer") or self.tokenizer
        if self._init_tokenizer is not None and self.tokenizer is not None:  # first: it names the flag that fixes it
            from lit_transformer.interop.pretrained import check_same_tokenizer

            check_same_tokenizer(self.init_from, self._init_tokenizer, self.tokenizer.to_str())
        self._check_tokenizer()
        self.task.attach(self, data)
        self.hparams["task"] = self.task.spec()  # what the task resolved from the data (multi_label) is recorded

    def _inference_starts(self) -> None:
        for transform in self.transforms:
            transform.on_inference_start(self)

    def on_validation_start(self) -> None:
        if self.trainer.state.fn == "validate":  # not the validation inside fit
            self._inference_starts()

    def on_test_start(self) -> None:
        self._inference_starts()

    def on_predict_start(self) -> None:
        self._inference_starts()

    def on_fit_start(self) -> None:
        params = list(self.model.parameters())
        trainable, total = sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)
        for transform in self.transforms:
            transform.on_fit_start(self)
        for logger in self.trainer.loggers:
            logger.log_metrics({"params/trainable": trainable, "params/total": total}, step=0)
        # The tokenizer beside the TensorBoard logs too, for tools that read the run folder rather than checkpoints.
        save = data_fields(self.trainer.datamodule, ("save_tokenizer",)).get("save_tokenizer")
        log_dir = self.trainer.log_dir  # a broadcast under DDP: every rank must ask
        if self.trainer.is_global_zero and self.trainer.loggers and log_dir and save is not None:
            save(log_dir)

    def on_fit_end(self) -> None:
        for transform in self.transforms:
            transform.on_fit_end(self)

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
        # The tokenizer travels inside the checkpoint, once, as a JSON string: generate/translate need nothing else
        # (a DataModule's own state leaves it to this hook).
        tokenizer = self.tokenizer.to_str() if self.tokenizer is not None else None
        if tokenizer is not None:
            checkpoint["tokenizer"] = tokenizer
        if self.target_tokenizer is not None and self.target_tokenizer is not self.tokenizer:
            checkpoint["target_tokenizer"] = self.target_tokenizer.to_str()
        self.task.on_save_checkpoint(checkpoint)
        for transform in self.transforms:
            transform.on_save_checkpoint(self, checkpoint)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.init_from = self.init_from or checkpoint.get("init_from")
        for transform in self.transforms:  # before the state dict is loaded: a transform may complete it
            transform.on_load_checkpoint(self, checkpoint)
        if "tokenizer" in checkpoint:
            self.tokenizer = Tokenizer.from_str(checkpoint["tokenizer"])
            target = checkpoint.get("target_tokenizer")
            self.target_tokenizer = Tokenizer.from_str(target) if target else self.tokenizer
        self.task.on_load_checkpoint(checkpoint)

    # ---- steps --------------------------------------------------------------------------------------------------

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Logits of a batch as the DataModule lays it out (the task says which keys feed the model)."""
        return self.task.logits(self.model, batch)

    def _training_sums(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(summed loss, summed NLL, target count) of a training batch: what `compile` compiles as one graph."""
        out = self.task.loss(self.model, batch)
        return out.loss_sum, out.nll_sum, out.count

    def _check_batch(self, batch: dict[str, torch.Tensor]) -> None:
        if not self._checked_batch:
            self.task.check_batch(batch)
            self._checked_batch = True

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        # Per batch: translation batches vary in shape (token budget), and MFU must follow them.
        tokens = self.task.tokens(batch)
        self.flops_per_batch = self.model.flops_per_token(tokens.size(1)) * tokens.numel()
        self._check_batch(batch)
        loss_sum, nll_sum, count = (self._compiled_sums or self._training_sums)(batch)
        if self.hparams.loss_normalization == "batch":  # its mean, counted once: the step logs the means' mean
            loss_sum, nll_sum = loss_sum / count.clamp(min=1), nll_sum / count.clamp(min=1)
            count = torch.ones_like(count)
        sums = torch.stack([loss_sum.detach(), nll_sum.detach(), count.to(loss_sum.dtype)]).float()
        self._step_sums = sums if self._step_sums is None else self._step_sums + sums
        # The summed loss (batch: the mean); with tokens, optimizer_step divides the step's gradient by its count.
        return loss_sum

    def optimizer_step(
        self,
        epoch: int,
        batch_idx: int,
        optimizer: torch.optim.Optimizer,
        optimizer_closure: Callable[[], Any] | None = None,
    ) -> None:
        if optimizer_closure is not None:
            run_last_micro_batch = optimizer_closure

            def optimizer_closure() -> Any:
                # The closure runs the step's last forward and backward; normalising right after it, before any
                # on_before_optimizer_step hook, lets callbacks, clipping and the optimizer see the true gradient.
                result = run_last_micro_batch()
                self._normalize_by_tokens(optimizer, batch_idx % self.trainer.accumulate_grad_batches + 1)
                return result

        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)

    def _normalize_by_tokens(self, optimizer: torch.optim.Optimizer, micro_batches: int) -> None:
        """Turn the step's gradient into that of (sum of token losses) / (target tokens), over micro-batches and ranks.

        Each micro-batch returned its summed loss; Lightning divided it by accumulate_grad_batches and data-parallel
        strategies average gradients over ranks, so the gradient holds sum / (accumulate * world_size). One all-reduce
        per optimizer step (three numbers) gives the step's token count, as fairseq does (sentence_avg=False). Under
        tensor parallelism both the token count and world_size count each batch tp times, so the ratio still holds.
        """
        trainer, accumulate = self.trainer, self.trainer.accumulate_grad_batches
        if self.hparams.loss_normalization == "batch":  # Lightning's 1/accumulate is too small on a short last step
            return scale_gradients(optimizer, accumulate / micro_batches) if micro_batches < accumulate else None
        if self._step_sums is None:
            return
        sums = self._step_sums
        if trainer.world_size > 1:
            sums = trainer.strategy.reduce(sums, reduce_op="sum")
        self._step_sums = None
        loss_sum, nll_sum, tokens = sums.unbind()
        tokens = tokens.clamp(min=1)
        scale_gradients(optimizer, accumulate * trainer.world_size / tokens)  # on the device
        # The same on every rank: the step's per-token numbers, no further synchronisation needed. Not prog_bar:
        # Lightning reads progress-bar tensors after every batch (a host synchronisation); the CLI's bar shows
        # train/loss read at logging steps (SyncFreeProgressBar).
        if self._logs_this_step():
            self.log("train/loss", (loss_sum / tokens).float())
            self.log("train/ppl", (nll_sum / tokens).exp().float())
            self.log("train/tokens_per_step", tokens.float())

    # ---- evaluation and prediction: the task's ------------------------------------------------------------------

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        if not batch.get(FILLER):  # a filler evens the ranks' batch counts (data/loaders.py): it counts for nothing
            self._check_batch(batch)
            self.task.evaluate(self, "val", batch, batch_idx)

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        if not batch.get(FILLER):
            self._check_batch(batch)
            self.task.evaluate(self, "test", batch, batch_idx)

    def on_validation_epoch_start(self) -> None:
        self.task.epoch_start(self, "val")

    def on_test_epoch_start(self) -> None:
        self.task.epoch_start(self, "test")

    def on_validation_epoch_end(self) -> None:
        self.task.epoch_end(self, "val")

    def on_test_epoch_end(self) -> None:
        self.task.epoch_end(self, "test")

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> list[dict[str, Any]]:
        """One row per input of the predict_file, as the task writes it (see PredictionWriter)."""
        return self.task.predict(self, batch)

    # ---- decoding -----------------------------------------------------------------------------------------------

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
    def generate_text(self, inputs: torch.Tensor, attention_mask: torch.Tensor | None = None) -> list[str]:
        """The model's outputs for a batch of inputs (translations of sources), decoded as self.generation says."""
        return self.decode(self.model.generate(inputs, self.generation, attention_mask=attention_mask))

    # ---- optimization -------------------------------------------------------------------------------------------

    def configure_gradient_clipping(
        self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:  # fmt: skip
        """With the step's one gradient norm (see reliability.clip_gradients), which is global under FSDP too."""
        if not clip_gradients(self.trainer, optimizer, gradient_clip_val, gradient_clip_algorithm):
            super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # The gradient norm before clipping, at the steps the trainer logs (computed once per step, shared with the
        # non-finite guard and clipping).
        if self._logs_this_step():
            self.log("train/grad_norm", gradient_norm(self.trainer, optimizer))
        if self.hparams.loss_normalization == "batch" and self._step_sums is not None:
            (loss, nll, micro_batches), self._step_sums = self._step_sums.unbind(), None
            if self._logs_this_step():
                self.log_dict({"train/loss": loss / micro_batches, "train/ppl": (nll / micro_batches).exp()})

    def _logs_this_step(self) -> bool:
        """Whether training metrics are logged at this step: the steps the trainer writes logs at, the first and the
        last. A `self.log` call costs host time (measured: most of the Lightning step's overhead over a hand-written
        loop), and one whose value nobody reads is waste; between logs callback_metrics keep the last logged values.
        """
        trainer = self._trainer
        if trainer is None:
            return True
        step, last = trainer.global_step, trainer.max_steps
        return step == 0 or (last > 0 and step + 1 >= last) or trainer_logs_now(trainer)

    def configure_optimizers(self):
        optim, trainer = self.optim, self._trainer
        # A fused optimizer unscales fp16 gradients inside its step, after clipping would have seen them scaled.
        scaled_and_clipped = (
            trainer is not None
            and bool(trainer.gradient_clip_val)
            and getattr(trainer.precision_plugin, "scaler", None) is not None
        )
        fused = (self.device.type == "cuda" and not scaled_and_clipped) if optim.fused is None else optim.fused
        if trainer is not None:  # the command line judged it before any data; a Python caller, here
            check_optimizer_precision(optim.optimizer, optim.eps, trainer.precision)
        optimizer = build_optimizer(self.model, optim, fused)
        total = schedule_length(optim, trainer.max_steps if trainer is not None else -1)
        scheduler = build_schedule(optimizer, optim.schedule, warmup_steps=optim.warmup_steps, total_steps=total,
                                   d_model=self.config.d_model, min_lr_ratio=optim.min_lr_ratio,
                                   decay_fraction=optim.decay_fraction, decay_shape=optim.decay_shape)  # fmt: skip
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
