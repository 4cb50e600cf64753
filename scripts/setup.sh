#!/usr/bin/env bash
# Install what building and testing dsc needs on Debian 12 (idempotent):
# - LLVM/MLIR 22 development packages (melior and inkwell link them statically),
# - ptxas from PyPI's nvidia-cuda-nvcc (validates generated PTX without a GPU),
# - the official `openai` Python client (the server tests drive `dsc serve` with it).
set -euo pipefail
pkgs="llvm-22-dev libmlir-22-dev libpolly-22-dev libclang-22-dev libzstd-dev zlib1g-dev"
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $missing
fi
if ! python3 -c "import nvidia, os, sys; sys.exit(0 if os.path.exists(os.path.join(list(nvidia.__path__)[0], 'cu13', 'bin', 'ptxas')) else 1)" 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check nvidia-cuda-nvcc==13.0.88
fi
if ! python3 -c "import openai" 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check openai
fi
echo "setup: LLVM/MLIR 22, ptxas and the openai client present"
