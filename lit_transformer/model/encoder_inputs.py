"""What an encoder reads when its source is not text: vectors (region or grid features) or the pixels of an image.

Each module maps the raw source to the (B, S, d_model) sequence the encoder blocks take, as the token embedding
does for text; positions are added by the model, as for tokens. `build_source_positions` picks the signal.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lit_transformer.config import TransformerConfig
from lit_transformer.errors import ConfigError
from lit_transformer.model.positions import LearnedPositions, PositionEmbedding, build_positions, sinusoids


class FeatureProjection(nn.Module):
    """(B, S, source_dim) feature vectors to (B, S, d_model) by one Linear layer: the captioning model of the study
    notes (36 bottom-up regions x 2048 from a CNN), where text attends to image regions through cross-attention."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        assert cfg.source_dim is not None
        self.proj = nn.Linear(cfg.source_dim, cfg.d_model, bias=cfg.bias)

    def forward(self, features: Tensor) -> Tensor:
        if features.dim() != 3 or features.shape[-1] != self.proj.in_features:
            images = (
                ": images, but this model reads precomputed features: give the data --data.init_args.features_dir "
                "(predict: a predict_file folder of .npy or .safetensors feature files)"
                if features.dim() == 4
                else ""
            )
            raise ConfigError(
                f"source='features' takes (batch, regions, source_dim={self.proj.in_features}) vectors; got shape "
                f"{tuple(features.shape)}{images}"
            )
        return self.proj(features)


class PatchEmbedding(nn.Module):
    """(B, C, H, W) images to (B, rows * cols, d_model), one vector a patch in raster order (ViT, Dosovitskiy et al.
    2021). ViT's strided convolution (kernel = stride = patch_size) is exactly a Linear layer on each flattened
    patch; it is written as that Linear, so weight decay, int8 layers and exports treat it as every other matrix."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.patch, self.channels = cfg.patch_size, cfg.image_channels
        self.image_size = tuple(cfg.image_size or ())
        self.proj = nn.Linear(cfg.image_channels * cfg.patch_size**2, cfg.d_model, bias=cfg.bias)

    def forward(self, images: Tensor) -> Tensor:
        if images.dim() != 4 or images.shape[1] != self.channels or tuple(images.shape[2:]) != self.image_size:
            fix = "resize them in the data"
            if images.dim() == 3:  # (batch, regions, dim): precomputed features
                fix = "features, but this model reads the pixels of images: leave data.init_args.features_dir unset"
            raise ConfigError(
                f"source='patches' takes (batch, {self.channels}, {self.image_size[0]}, {self.image_size[1]}) images "
                f"(image_channels, image_size); got shape {tuple(images.shape)}: {fix}"
            )
        b, c, h, w = images.shape
        p = self.patch
        # (B, C, rows, p, cols, p) -> (B, rows, cols, C, p, p): each patch's pixels in the convolution kernel's order.
        patches = images.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
        return self.proj(patches.reshape(b, (h // p) * (w // p), c * p * p))


def sinusoids_2d(rows: int, cols: int, d_model: int) -> Tensor:
    """(rows * cols, d_model) in raster order: the first half of the channels encodes the row with the paper's
    sinusoids, the second half the column (MAE's fixed 2-D table)."""
    half = d_model // 2
    row = sinusoids(rows, half)[:, None, :].expand(rows, cols, half)
    col = sinusoids(cols, d_model - half)[None, :, :].expand(rows, cols, d_model - half)
    return torch.cat([row, col], dim=-1).reshape(rows * cols, d_model)


class Sinusoidal2DPositions(PositionEmbedding):
    """Fixed 2-D sinusoids for a grid of patches: a patch's position is its (row, column), not its raster index."""

    def __init__(self, rows: int, cols: int, d_model: int) -> None:
        super().__init__()
        self.register_buffer("cached", sinusoids_2d(rows, cols, d_model), persistent=False)

    def table(self, n_positions: int) -> Tensor:
        return self.cached[:n_positions]


def build_source(cfg: TransformerConfig) -> nn.Module:
    """The module that turns a non-text source into the encoder's input sequence."""
    return FeatureProjection(cfg) if cfg.source == "features" else PatchEmbedding(cfg)


def build_source_positions(cfg: TransformerConfig) -> PositionEmbedding | None:
    """Patches: 2-D sinusoids, or a learned table of one vector a patch. Features: the model's 1-D signal by index,
    or none for an unordered set of regions (source_positions=False)."""
    if cfg.source == "patches":
        rows, cols = cfg.patch_grid
        if cfg.positions == "learned":
            return LearnedPositions(cfg, n_positions=rows * cols)
        return Sinusoidal2DPositions(rows, cols, cfg.d_model)
    return build_positions(cfg) if cfg.source_positions else None
