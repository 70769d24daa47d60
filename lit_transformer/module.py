"""LitTransformer: the LightningModule around the plain model: loss, metrics, optimizer and schedule, generation."""

from __future__ import annotations

import math
from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.utilities import GradClipAlgorithmType
from tokenizers import Tokenizer
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.text import SacreBLEUScore

from lit_transformer.config import GenerationConfig, TransformerConfig
from lit_transformer.model import Transformer
from lit_transformer.schedules import ScheduleName, build_schedule

IGNORE_INDEX = -100


def smoothed_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, smoothing: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(training loss, mean NLL, token count) over non-ignored labels; one log-softmax serves both losses.

    The smoothed loss is the paper's: (1 - eps) * NLL + eps * mean over the vocabulary of -log p. Perplexity is
    reported from the NLL, so label smoothing never inflates it.
    """
    logits = logits.reshape(-1, logits.size(-1))
    labels = labels.reshape(-1)
    nll = F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX)
    count = (labels != IGNORE_INDEX).sum()
    if smoothing == 0.0:
        return nll, nll, count
    loss = F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, label_smoothing=smoothing)
    return loss, nll, count


def weight_decay_groups(model: torch.nn.Module) -> tuple[list[torch.nn.Parameter], list[torch.nn.Parameter]]:
    """(decayed, not decayed): matrices of linear layers decay; biases, norms and embeddings do not.

    Decided by module type, not by parameter name, and each tensor once (a tied output weight is the embedding).
    """
    no_decay_ids: set[int] = set()
    for module in model.modules():
        if isinstance(module, (torch.nn.Embedding, torch.nn.LayerNorm)):
            no_decay_ids.update(id(p) for p in module.parameters(recurse=False))
    decay, no_decay, seen = [], [], set()
    for param in model.parameters():
        if id(param) in seen or not param.requires_grad:
            continue
        seen.add(id(param))
        (no_decay if id(param) in no_decay_ids or param.dim() < 2 else decay).append(param)
    return decay, no_decay


class LitTransformer(L.LightningModule):
    """Trains a `Transformer` as a causal language model or a translation model, by its config's topology."""

    def __init__(
        self,
        config: TransformerConfig,
        optimizer: Literal["adamw", "adam"] = "adamw",
        lr: float = 3e-4,
        betas: tuple[float, float] | None = None,
        eps: float | None = None,
        weight_decay: float = 0.1,
        fused: bool | None = None,
        schedule: ScheduleName = "cosine",
        warmup_steps: int = 100,
        schedule_steps: int | None = None,
        min_lr_ratio: float = 0.1,
        label_smoothing: float = 0.0,
        activation_checkpointing: bool = False,
        compile: bool = False,
        generation: GenerationConfig | None = None,
        init_from: str | None = None,
    ) -> None:
        """
        Args:
            config: The architecture (see TransformerConfig; presets in configs/presets).
            optimizer: adamw (decoupled weight decay, none on biases, norms and embeddings) or adam (the paper's).
            lr: Peak learning rate; with schedule=noam, a multiplier of the paper's formula (1.0 is the paper's).
            betas: Adam betas; None uses (0.9, 0.95) for adamw and the paper's (0.9, 0.98) for adam.
            eps: Adam epsilon; None uses 1e-8 for adamw and the paper's 1e-9 for adam.
            weight_decay: AdamW weight decay on matrices only.
            fused: Use the fused optimizer kernel; None picks fused on CUDA and foreach elsewhere.
            schedule: noam (the paper's), cosine (warmup + cosine decay), constant (warmup, then flat).
            warmup_steps: Optimizer steps of linear warmup (noam: the paper's warmup_steps, 4000).
            schedule_steps: Length of the cosine schedule in optimizer steps; None uses trainer.max_steps.
            min_lr_ratio: Where the cosine schedule ends, as a fraction of lr.
            label_smoothing: Label smoothing of the loss (the paper's 0.1); perplexity is always the unsmoothed one.
            activation_checkpointing: Recompute each block's activations in backward (less memory, more time).
            compile: torch.compile each block (a cold start of tens of seconds; pays off on GPUs).
            generation: How `predict` and validation/test BLEU decode (any GenerationConfig field, e.g.
                --model.generation.num_beams 4); None uses the topology's defaults (GenerationConfig.for_model).
            init_from: A Hugging Face GPT-2 folder (or hub name) to fine-tune: its config.json sets the architecture
                and special token ids (recorded in the hyperparameters), its weights the parameters.
        """
        if init_from:
            from lit_transformer.interop import load_hf_gpt2

            pretrained = load_hf_gpt2(init_from, base=config).train()
            config = pretrained.config  # before save_hyperparameters, so checkpoints record the real architecture
        super().__init__()
        self.save_hyperparameters()
        self.config = config
        self.generation = generation or GenerationConfig.for_model(config)
        self.model = pretrained if init_from else Transformer(config)
        self.tokenizer: Tokenizer | None = None
        self.target_tokenizer: Tokenizer | None = None
        vocab = config.tgt_vocab_size
        self.val_nll = MeanMetric()
        self.val_accuracy = MulticlassAccuracy(num_classes=vocab, average="micro", ignore_index=IGNORE_INDEX)
        self.test_nll = MeanMetric()
        self.test_accuracy = MulticlassAccuracy(num_classes=vocab, average="micro", ignore_index=IGNORE_INDEX)
        self.val_bleu = SacreBLEUScore(tokenize="13a")
        self.test_bleu = SacreBLEUScore(tokenize="13a")
        self.flops_per_batch: float | None = None  # read by the ThroughputMonitor for MFU
        self._bleu_budget: int | None = None

    # ---- wiring -------------------------------------------------------------------------------------------------

    def configure_model(self) -> None:
        """Applied from outside the model code, once, whatever the strategy."""
        if getattr(self, "_parallelized", False):
            return
        from lit_transformer.parallelize import apply_activation_checkpointing, compile_blocks

        strategy = type(self._trainer.strategy).__name__ if self._trainer is not None else ""
        # FSDP applies checkpointing itself from its activation_checkpointing_policy.
        if self.hparams.activation_checkpointing and "FSDP" not in strategy:
            apply_activation_checkpointing(self.model)
        if self.hparams.compile:
            compile_blocks(self.model)
        self._parallelized = True

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None)
        if datamodule is not None and self.tokenizer is None:
            self.tokenizer = datamodule.tokenizer
            self.target_tokenizer = getattr(datamodule, "target_tokenizer", None) or datamodule.tokenizer
        self._check_tokenizer()

    def on_fit_start(self) -> None:
        # The tokenizer beside the TensorBoard logs too, for tools that read the run folder rather than checkpoints.
        datamodule = getattr(self.trainer, "datamodule", None)
        log_dir = self.trainer.log_dir  # a broadcast under DDP: every rank must ask
        if self.trainer.is_global_zero and log_dir and hasattr(datamodule, "save_tokenizer"):
            datamodule.save_tokenizer(log_dir)

    def _check_tokenizer(self) -> None:
        from lit_transformer.checkpointing import check_tokenizer_vocabulary

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
        # The tokenizer travels inside the checkpoint, as a JSON string: generate/translate need nothing else.
        if self.tokenizer is not None:
            checkpoint["tokenizer"] = self.tokenizer.to_str()
        if self.target_tokenizer is not None and self.target_tokenizer is not self.tokenizer:
            checkpoint["target_tokenizer"] = self.target_tokenizer.to_str()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if "tokenizer" in checkpoint:
            self.tokenizer = Tokenizer.from_str(checkpoint["tokenizer"])
            target = checkpoint.get("target_tokenizer")
            self.target_tokenizer = Tokenizer.from_str(target) if target else self.tokenizer

    # ---- steps --------------------------------------------------------------------------------------------------

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.config.is_encoder_decoder:
            return self.model(batch["src"], batch["tgt_in"], src_mask=batch["src_mask"], tgt_mask=batch["tgt_mask"])
        return self.model(batch["input_ids"], attention_mask=batch.get("attention_mask"))

    def _tokens(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return batch["tgt_in"] if self.config.is_encoder_decoder else batch["input_ids"]

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        # Per batch: translation batches vary in shape (token budget), and MFU must follow them.
        tokens = self._tokens(batch)
        self.flops_per_batch = self.model.flops_per_token(tokens.size(1)) * tokens.numel()
        logits = self(batch)
        loss, nll, _ = smoothed_cross_entropy(logits, batch["labels"], self.hparams.label_smoothing)
        batch_size = batch["labels"].size(0)
        self.log("train/loss", loss, prog_bar=True, batch_size=batch_size)
        self.log("train/ppl", nll.detach().exp(), batch_size=batch_size)
        return loss

    def _evaluate(self, batch: dict[str, Any], stage: str, nll_metric: MeanMetric, acc_metric) -> None:
        logits = self(batch)
        labels = batch["labels"]
        loss, nll, count = smoothed_cross_entropy(logits, labels, self.hparams.label_smoothing)
        nll_metric.update(nll, weight=count)
        acc_metric.update(logits.reshape(-1, logits.size(-1)), labels.reshape(-1))
        batch_size = labels.size(0)
        self.log(f"{stage}/loss", loss, prog_bar=stage == "val", batch_size=batch_size, sync_dist=True)
        self.log(f"{stage}/nll", nll_metric, batch_size=batch_size)
        self.log(f"{stage}/accuracy", acc_metric, batch_size=batch_size)

    def on_validation_epoch_start(self) -> None:
        self._bleu_budget = getattr(getattr(self.trainer, "datamodule", None), "bleu_samples", None)

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, "val", self.val_nll, self.val_accuracy)
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
        self._evaluate(batch, "test", self.test_nll, self.test_accuracy)
        if self.config.is_encoder_decoder and "ref_text" in batch:
            self.test_bleu.update(
                self.translate_batch(batch["src"], batch["src_mask"]), [[r] for r in batch["ref_text"]]
            )

    def on_validation_epoch_end(self) -> None:
        self._epoch_end("val", self.val_nll, self.val_bleu)

    def on_test_epoch_end(self) -> None:
        self._epoch_end("test", self.test_nll, self.test_bleu)

    def _epoch_end(self, stage: str, nll_metric: MeanMetric, bleu: SacreBLEUScore) -> None:
        if nll_metric.update_called:
            nll = nll_metric.compute()
            self.log(f"{stage}/ppl", nll.exp(), prog_bar=stage == "val")
            chars_per_token = getattr(getattr(self.trainer, "datamodule", None), "characters_per_token", None)
            if chars_per_token is not None and not self.config.is_encoder_decoder:
                # Bits per character: one scale for any tokenizer (and for character-level models such as nanoGPT's).
                split = "validation" if stage == "val" else "test"
                self.log(f"{stage}/bpc", nll / math.log(2) / chars_per_token(split), prog_bar=stage == "val")
        if self.config.is_encoder_decoder and bleu.update_called:
            self.log(f"{stage}/bleu", bleu.compute() * 100, prog_bar=True)
            bleu.reset()
            self._log_bleu_signature(stage)

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
        self, optimizer: torch.optim.Optimizer, gradient_clip_val=None, gradient_clip_algorithm=None
    ) -> None:
        plugin = self.trainer.precision_plugin
        if gradient_clip_val and isinstance(plugin, MixedPrecision) and plugin.scaler is None:
            # bf16 autocast has no loss scaler, so clipping before a fused step is exact; Lightning's mixed-precision
            # plugin refuses any fused optimizer, so clip with the plain precision plugin's code.
            algorithm = GradClipAlgorithmType(gradient_clip_algorithm or GradClipAlgorithmType.NORM)
            Precision.clip_gradients(plugin, optimizer, gradient_clip_val, algorithm)
            return
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # The gradient norm before clipping, at the logging interval only (it costs one pass over the gradients).
        if self.global_step % max(1, self.trainer.log_every_n_steps) == 0:
            grads = [p.grad.detach() for p in self.parameters() if p.grad is not None]
            if grads:
                self.log("train/grad_norm", torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> list[dict[str, Any]]:
        """Generate for each input of the predict_file: {"input", "output", "tokens"} per row (see PredictionWriter)."""
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
        decay, no_decay = weight_decay_groups(self.model)
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
