// Every kernel's start and end on the GPU, CUDA graph nodes included, from CUPTI's activity
// records: a CUDA injection library (the driver loads it at cuInit when CUDA_INJECTION64_PATH
// names it), so any program — dsc-runtime as it is — can be traced without changes. At exit
// it writes one line per kernel (and per memory copy, `memcpy:<kind>:<bytes>`),
// `start_ns,end_ns,name`, sorted by start, to
// $DSC_TIMELINE_OUT (default /tmp/timeline.csv); bench/timeline.py turns that into each
// kernel's share of a decode step.
//
// Build and run ON the GPU machine (CUPTI and its headers are in the CUDA toolkit there):
//   g++ -O2 -shared -fPIC -o /tmp/libtl.so bench/kernel_timeline.cpp \
//       -I/usr/local/cuda/include -L/usr/local/cuda/lib64 -lcupti
//   CUDA_INJECTION64_PATH=/tmp/libtl.so DSC_TIMELINE_OUT=/tmp/tl.csv \
//       dsc-runtime bench PLAN --batches 1 --prefill 16 --new-tokens 32
// (scripts/gpu-timeline.sh does both and the analysis.)
#include <cupti.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

// the kernel record type of this CUPTI (newest first; -DKREC=... overrides)
#ifndef KREC
#define KREC CUpti_ActivityKernel9
#endif
#ifndef MREC
#define MREC CUpti_ActivityMemcpy5
#endif

struct Rec {
    uint64_t start, end;
    std::string name;
};

static std::mutex mu;
static std::vector<Rec>* recs = new std::vector<Rec>();

static void CUPTIAPI buffer_requested(uint8_t** buf, size_t* size, size_t* max_records) {
    *size = 16u << 20;
    *buf = static_cast<uint8_t*>(aligned_alloc(8, *size));
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buf, size_t, size_t valid) {
    CUpti_Activity* r = nullptr;
    std::lock_guard<std::mutex> g(mu);
    while (cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || r->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            const KREC* k = reinterpret_cast<const KREC*>(r);
            recs->push_back({k->start, k->end, k->name ? k->name : "?"});
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            // copies as `memcpy:<kind>:<bytes>` (kind 1 HtoD, 2 DtoH, 8 DtoD, 10 PtoP)
            const MREC* m = reinterpret_cast<const MREC*>(r);
            recs->push_back({m->start, m->end, "memcpy:" + std::to_string((int)m->copyKind) + ":" + std::to_string((unsigned long long)m->bytes)});
        }
    }
    free(buf);
}

static void dump() {
    cuptiActivityFlushAll(1);
    const char* path = getenv("DSC_TIMELINE_OUT");
    FILE* f = fopen(path ? path : "/tmp/timeline.csv", "w");
    if (!f) return;
    std::lock_guard<std::mutex> g(mu);
    std::sort(recs->begin(), recs->end(), [](const Rec& a, const Rec& b) { return a.start < b.start; });
    for (const Rec& r : *recs) fprintf(f, "%llu,%llu,%s\n", (unsigned long long)r.start, (unsigned long long)r.end, r.name.c_str());
    fclose(f);
    fprintf(stderr, "kernel_timeline: %zu kernels written\n", recs->size());
}

extern "C" int InitializeInjection(void) {
    if (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "kernel_timeline: cannot enable kernel activity records\n");
        return 0;
    }
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
    cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    atexit(dump);
    return 1;
}
