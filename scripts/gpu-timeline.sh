#!/usr/bin/env bash
# Where a decode step's time goes, kernel by kernel, inside its CUDA graph (PDL overlap as it
# runs): CUPTI activity records through an injection library (bench/kernel_timeline.cpp),
# then bench/timeline.py. Run ON the H200 with the runtime and a plan carried, e.g.
#   bash scripts/gpu-timeline.sh .gpu/tl/dsc-runtime .gpu/tl/smol.plan gather_d576_f32 --batches 1 --prefill 16 --new-tokens 64
# (FIRST_KERNEL: the kernel each step starts with.) Writes $OUT/timeline.json.
set -uo pipefail
rt=$1; plan=$2; first=$3; shift 3
out=${OUT:-/tmp}
mkdir -p "$out"
inc=/usr/local/cuda/include
krec=$(grep -ho "CUpti_ActivityKernel[0-9]*" $inc/cupti_activity*.h | sort -V | tail -1)
mrec=$(grep -ho "CUpti_ActivityMemcpy[0-9]*" $inc/cupti_activity*.h | sort -V | tail -1)
g++ -O2 -shared -fPIC -DKREC=$krec -DMREC=$mrec -o /tmp/libtl.so bench/kernel_timeline.cpp -I$inc -L/usr/local/cuda/lib64 -lcupti || exit 1
CUDA_INJECTION64_PATH=/tmp/libtl.so DSC_TIMELINE_OUT=/tmp/tl.csv LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} \
  "$rt" bench "$plan" "$@" 2>&1 | grep -E "^decode|kernel_timeline"
python3 bench/timeline.py /tmp/tl.csv "$first" --json "$out/timeline.json"
