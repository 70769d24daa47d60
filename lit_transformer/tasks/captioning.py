"""Captioning: an encoder-decoder whose source is an image (patches) or its features, a caption as the target.

The loss and decoding are translation's (the decoder reads the source through cross-attention whatever it is);
what differs is evaluation against several reference captions (BLEU and exact match), predictions named by image,
and what TensorBoard shows: validation images with their generated and reference captions, and for each generated
word its cross-attention over the image.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from lit_transformer.errors import ConfigError
from lit_transformer.tasks.base import STAGES, token_labels
from lit_transformer.tasks.translation import Translation


def rank_zero_info(message: str) -> None:
    """Lightning's rank_zero_info, imported when a note is said: a model that only decodes (serve's workers, generate)
    never imports Lightning, nor pays its seconds of imports."""
    from lightning.pytorch.utilities import rank_zero_info as info

    info(message)


class Captioning(Translation):
    """Batches {"src", "src_mask"?, "tgt_in", "tgt_mask", "labels", "references", "image"} (CaptioningDataModule)."""

    name: ClassVar[str] = "captioning"
    architecture: ClassVar[dict[str, str]] = {"topology": "encoder_decoder"}  # and a source other than tokens
    command: ClassVar[str | None] = None  # captions are written by `predict` on a folder of images

    def __init__(self, label_smoothing: float = 0.0, num_images: int = 4) -> None:
        """
        Args:
            label_smoothing: Label smoothing of the loss; perplexity is always the unsmoothed one.
            num_images: Validation images shown in TensorBoard with their captions and attention over the image.
        """
        super().__init__(label_smoothing)
        self.num_images = num_images
        self._shown: dict[str, Any] | None = None
        self._noted_length = False

    def check_config(self, config) -> None:
        super().check_config(config)
        if config.source == "tokens":
            raise ConfigError(
                "the captioning task reads images or features: set model.config.source patches (with image_size, "
                "patch_size, image_channels) or features (with source_dim)"
            )

    def logits(self, model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        # Images have no padding (no src_mask); features have a mask over their regions.
        return model(batch["src"], batch["tgt_in"], src_mask=batch.get("src_mask"))

    def build_metrics(self, config) -> None:
        from torchmetrics import MeanMetric

        super().build_metrics(config)
        for stage in STAGES:
            setattr(self, f"{stage}_exact_match", MeanMetric())

    def evaluate(self, module: Any, stage: str, batch: dict[str, Any], batch_idx: int):
        out = super(Translation, self).evaluate(module, stage, batch, batch_idx)  # the loss metrics only
        budget = self._bleu_budget if stage == "val" else None
        if "references" not in batch or budget == 0:
            return out
        rows = len(batch["references"]) if budget is None else min(budget, len(batch["references"]))
        mask = batch.get("src_mask")
        captions = module.generate_text(batch["src"][:rows], None if mask is None else mask[:rows])
        references = batch["references"][:rows]
        self._note_short_generation(module, references)
        getattr(self, f"{stage}_bleu").update(captions, references)
        exact = [float(any(c == r for r in refs)) for c, refs in zip(captions, references, strict=True)]
        exact_match = getattr(self, f"{stage}_exact_match")
        exact_match.update(torch.tensor(exact, device=module.device))
        module.log(f"{stage}/exact_match", exact_match, prog_bar=True)
        if budget is not None:
            self._bleu_budget = budget - rows
        if stage == "val" and batch_idx == 0:
            self._shown = {key: batch[key][: self.num_images] for key in ("src", "references", "image")}
            self._shown["src_mask"] = None if mask is None else mask[: self.num_images]
        return out

    def _note_short_generation(self, module: Any, references: list[list[str]]) -> None:
        """Say once when a reference needs more tokens (and its eos) than decoding may write: every caption is cut
        there, so BLEU, exact match and predict's captions are of cut captions (the digits preset's max_new_tokens 8
        on captions of a dozen words: exact match 0 with every teacher-forced token right)."""
        limit, tokenizer = module.generation.max_new_tokens, getattr(module, "target_tokenizer", None)
        if self._noted_length or limit is None or tokenizer is None:
            return
        texts = [ref for refs in references for ref in refs]
        longest = max((len(e.ids) for e in tokenizer.encode_batch(texts)), default=0)
        if longest + 1 > limit:
            self._noted_length = True
            rank_zero_info(
                f"note: a reference caption takes {longest} tokens and its eos, but model.generation.max_new_tokens="
                f"{limit} cuts every generated caption there (BLEU, exact match and predict's captions included): "
                f"--model.generation.max_new_tokens {longest + 1} or more"
            )

    def epoch_end(self, module: Any, stage: str) -> None:
        super().epoch_end(module, stage)
        if stage == "val" and self._shown is not None and module.trainer.is_global_zero:
            if not module.trainer.sanity_checking:
                self._log_images(module)
            self._shown = None

    def _log_images(self, module: Any) -> None:
        writers = [lg.experiment for lg in module.loggers if hasattr(lg.experiment, "add_figure")]
        if not writers:
            return
        shown = self._shown
        mask = shown["src_mask"]
        ids = module.model.generate(shown["src"], module.generation, attention_mask=mask)
        for i in range(len(shown["image"])):
            figure = caption_figure(
                module, shown["src"][i], None if mask is None else mask[i], ids[i], shown["references"][i]
            )
            for writer in writers:
                writer.add_figure(f"captions/{i}", figure, module.global_step)

    def predict(self, module: Any, batch: dict[str, Any]) -> list[dict[str, Any]]:
        mask = batch.get("src_mask")
        captions = module.generate_text(batch["src"], mask)
        return [{"image": name, "caption": c} for name, c in zip(batch["image"], captions, strict=True)]

    def samples(self, module: Any, callback: Any, first_batch) -> list[str]:
        return []  # not translation's text samples: the captions are shown with their images (epoch_end)

    def attention(self, module: Any, batch: dict[str, Any], max_tokens: int) -> tuple[dict, dict]:
        """The caption decoder's self-attention (words on both axes); the cross-attention is drawn over the image."""
        tgt = batch["tgt_in"][0][batch["tgt_mask"][0].bool()][:max_tokens]
        mask = batch.get("src_mask")
        _, attentions = module.model(
            batch["src"][:1].to(module.device),
            tgt[None].to(module.device),
            src_mask=None if mask is None else mask[:1].to(module.device),
            return_attention=True,
        )
        words = token_labels(module.target_tokenizer, tgt)
        return {"self": attentions["self"]}, {"self": (words, words)}


def cross_attention_maps(model, source: torch.Tensor, mask: torch.Tensor | None, tokens: torch.Tensor) -> torch.Tensor:
    """(words, source positions): how much each generated word's decoder attends each source position, averaged over
    heads and layers (a teacher-forced pass over the generated caption, which reproduces decoding exactly)."""
    bos = torch.tensor([[model.config.bos_token_id]], device=tokens.device)
    tgt = torch.cat([bos, tokens[None]], dim=1)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        _, attentions = model(source[None], tgt, src_mask=None if mask is None else mask[None], return_attention=True)
    model.train(was_training)
    cross = torch.stack(attentions["cross"])  # (layers, 1, heads, T, S)
    return cross.mean(dim=(0, 2))[0, : len(tokens)]  # word t is predicted at position t


def caption_figure(module: Any, source: torch.Tensor, mask: torch.Tensor | None, ids: torch.Tensor, references):
    """The image with its generated and reference captions, then each generated word's attention over the image."""
    import matplotlib.pyplot as plt

    cfg = module.config
    eos = cfg.eos_token_id
    ids = ids.tolist()
    if eos in ids:
        ids = ids[: ids.index(eos) + 1]
    tokens = torch.tensor(ids, dtype=torch.long, device=source.device)
    weights = cross_attention_maps(module.model, source, mask, tokens).float().cpu()
    words = [module.target_tokenizer.decode([t], skip_special_tokens=False).strip() or "·" for t in ids]
    caption = module.decode(tokens[None])[0]
    image = _displayable(source.float().cpu()) if cfg.source == "patches" else None
    # One row per panel: the image, then each generated word's attention over it (wide strips stack legibly).
    height, width = cfg.image_size if image is not None else (1, 4)
    panels = 1 + len(words)
    figure, axes = plt.subplots(panels, 1, figsize=(5, panels * (0.35 + 5 * height / width)), squeeze=False)
    axes = axes[:, 0]
    if image is not None:
        axes[0].imshow(image, cmap="gray" if image.ndim == 2 else None)
    else:
        axes[0].imshow(source.float().cpu().T, aspect="auto", cmap="viridis")  # features: (dim, regions)
    axes[0].set_title(f"model: {caption}\nref: {references[0]}", fontsize=8, loc="left")
    for ax, word, row in zip(axes[1:], words, weights, strict=True):
        if image is not None:
            rows, cols = cfg.patch_grid
            heat = row.reshape(1, 1, rows, cols)
            heat = torch.nn.functional.interpolate(heat, size=tuple(cfg.image_size), mode="nearest")[0, 0]
            ax.imshow(image, cmap="gray" if image.ndim == 2 else None)
            ax.imshow(heat, cmap="jet", alpha=0.5)
        else:
            regions = row if mask is None else row[mask.bool().cpu()]
            ax.bar(range(len(regions)), regions)
        ax.set_ylabel(word, fontsize=9, rotation=0, ha="right", va="center")
    for ax in axes:
        ax.set_xticks([])
        ax.set_yticks([])
    figure.tight_layout()
    return figure


def _displayable(image: torch.Tensor):
    """(C, H, W) in [0, 1] to what imshow takes: (H, W) greyscale or (H, W, 3)."""
    image = image.clamp(0, 1)
    return image[0].numpy() if image.shape[0] == 1 else image.permute(1, 2, 0).numpy()
