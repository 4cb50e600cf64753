#!/usr/bin/env bash
# Tensor-parallel check, run ON a GPU machine with 2+ GPUs (kind nvidia-h200-x2) from the repo
# root, with .gpu/ carried (scripts/gpu-prepare.sh --tp builds it):
#   carry [".gpu/check", ".gpu/dsc-runtime", ".gpu/tp"]: bash scripts/gpu-tp.sh
# Kernel checks first (incl. sharded seeded weights), then the Llama-3-8B-shape plan whole on
# GPU 0 vs the same model partitioned: tp=1 (must be bit-identical), tp=2 with every rank on
# GPU 0 and the all-reduces done by local copies, and tp=2 over NCCL on GPUs 0 and 1.
set -uo pipefail
out=${OUT:-.gpu/out}
mkdir -p "$out"
# NVLink multicast must stay off on this shared host (see the device tool's KINDS.md)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# NCCL ships in the image's pip package nvidia-nccl-cu13 as libnccl.so.2; cudarc opens libnccl.so
nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
mkdir -p /tmp/nccl && ln -sf "$nccl_dir/libnccl.so.2" /tmp/nccl/libnccl.so
export LD_LIBRARY_PATH=/tmp/nccl:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
ls -l "$nccl_dir" | tee "$out/nccl.txt"
status=0
[ "${SKIP_CHECK:-0}" = 1 ] || .gpu/dsc-runtime gpu-check .gpu/check --target sm_90a --json "$out/kernels-sm_90a.json" > "$out/kernels.log" 2>&1 || status=1
tail -3 "$out/kernels.log"; grep -E "shard|FAIL" "$out/kernels.log"
ngpu=$(nvidia-smi -L | wc -l)
nccl_args=()
[ "$ngpu" -ge 2 ] && nccl_args=(--nccl .gpu/tp/llama3-8b-tp2.plan)
.gpu/dsc-runtime gpu-tp .gpu/tp/llama3-8b.plan --local .gpu/tp/llama3-8b-tp1.plan --local .gpu/tp/llama3-8b-tp2.plan "${nccl_args[@]}" \
  --steps 128 --json "$out/tp-llama3-8b.json" 2>&1 | tee "$out/tp.log"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
# an 8-token prompt keeps every matmul on the f32 GEMV path (the tensor-core path takes steps
# of 16+ rows and rounds activations to bf16): the difference left is the order of f32 sums
.gpu/dsc-runtime gpu-tp .gpu/tp/llama3-8b.plan --local .gpu/tp/llama3-8b-tp2.plan "${nccl_args[@]}" \
  --prompt-len 8 --steps 32 --json "$out/tp-llama3-8b-gemv.json" 2>&1 | tee "$out/tp-gemv.log"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
exit $status
