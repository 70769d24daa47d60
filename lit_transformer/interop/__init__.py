"""Meet the ecosystem: Hugging Face folders (GPT-2, Llama, Marian), our safetensors folder, ONNX.

The `export` command that writes them from a checkpoint is lit_transformer.cli.export_command.

transformers is needed for the Hugging Face tokenizer files and Marian; onnx and onnxscript for ONNX. Each is
imported only by the function that needs it.
"""

from lit_transformer.interop.hf_gpt2 import from_hf_config, gpt2_problems, load_hf_gpt2, save_hf_gpt2
from lit_transformer.interop.hf_llama import llama_problems, load_hf_llama, save_hf_llama
from lit_transformer.interop.hf_marian import (
    load_hf_marian,
    load_hf_marian_tokenizers,
    marian_problems,
    save_hf_marian,
)
from lit_transformer.interop.native import load_safetensors, save_safetensors
from lit_transformer.interop.onnx import OnnxModel, export_onnx, export_onnx_folder, quantize_onnx_int8

__all__ = [
    "OnnxModel",
    "export_onnx",
    "export_onnx_folder",
    "from_hf_config",
    "gpt2_problems",
    "load_hf_gpt2",
    "load_hf_llama",
    "llama_problems",
    "load_hf_marian",
    "load_hf_marian_tokenizers",
    "load_safetensors",
    "marian_problems",
    "quantize_onnx_int8",
    "save_hf_gpt2",
    "save_hf_llama",
    "save_hf_marian",
    "save_safetensors",
]
