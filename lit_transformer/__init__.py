"""lit_transformer: every architectural switch of Attention Is All You Need and GPT-2 as a config field."""

from typing import TYPE_CHECKING

from lit_transformer import moved
from lit_transformer.config import PRESETS, GenerationConfig, TransformerConfig

moved.install()  # the module paths of earlier releases, named by saved configs and checkpoints, keep resolving

__version__ = "0.1.0"
__all__ = ["PRESETS", "GenerationConfig", "LitTransformer", "Transformer", "TransformerConfig"]

if TYPE_CHECKING:
    from lit_transformer.engine.lightning_module import LitTransformer
    from lit_transformer.model import Transformer


def __getattr__(name: str):
    # Lazy: importing the model must not pull in Lightning, and `import lit_transformer` stays fast.
    if name == "Transformer":
        from lit_transformer.model import Transformer

        return Transformer
    if name == "LitTransformer":
        from lit_transformer.engine.lightning_module import LitTransformer

        return LitTransformer
    raise AttributeError(f"module 'lit_transformer' has no attribute {name!r}")
