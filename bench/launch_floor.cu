// The launch floor of a batch-1 decode step on this GPU: what a chain of N dependent kernels
// costs per kernel inside one CUDA graph, with and without programmatic dependent launch
// (PDL: the next kernel's blocks start while the previous one runs and wait in
// `griddepcontrol.wait`), for kernels that do nothing and for kernels that do what a
// one-token GEMV does after its wait (read a 576-float vector, one block reduction, one store);
// and what the engine's per-step stream operations around the graph add (an input upload,
// the fed-token copy, the argmax launch, the ids download, an event).
//
// Build and run ON the GPU machine (nvcc is there; see ../shared/docs/GPU.md):
//   nvcc -O3 -arch=sm_90a -o /tmp/launch_floor bench/launch_floor.cu && /tmp/launch_floor [N]
// Prints one line per case and, with --json FILE, the same as JSON. CUDA events around 50
// graph replays after 5 warm-up replays; the median of 7 such timings.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CK(x)                                                                                 \
    do {                                                                                      \
        cudaError_t e_ = (x);                                                                 \
        if (e_ != cudaSuccess) {                                                              \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

__device__ __forceinline__ void pdl_start() {
    asm volatile("griddepcontrol.launch_dependents;");
    asm volatile("griddepcontrol.wait;" ::: "memory");
}

// the block's sum of `s`: warp shuffles, then shared memory and a barrier (every thread gets it)
__device__ __forceinline__ float block_sum(float s) {
    __shared__ float red[32];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(~0u, s, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
    __syncthreads();
    float t = 0.0f;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) t += red[w];
    return t;
}

// nothing but the wait and one store from one thread
__global__ void k_empty(const float* x, float* y, int n) {
    pdl_start();
    if (blockIdx.x == 0 && threadIdx.x == 0) y[0] = x[0] + 1.0f;
}

// a one-token GEMV's dependent chain after its wait: every block reads the whole vector x (n
// floats, written by the previous kernel), one block reduction (warp shuffles, shared memory,
// a barrier), thread 0 stores one output
__global__ void k_vec(const float* x, float* y, int n) {
    pdl_start();
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s = fmaf(x[i], 1.0001f, s);
    float t = block_sum(s);
    if (threadIdx.x == 0) y[blockIdx.x % n] = t * 1e-3f;
}

// a persistent kernel doing `phases` of k_vec's work with a grid barrier after each (every
// block resident: blocks <= SMs): the same dependent chain without kernel boundaries
__global__ void k_persist(float* a, float* b, int n, int phases, unsigned* ctr) {
    for (int p = 0; p < phases; p++) {
        const float* x = p % 2 ? b : a;
        float* y = p % 2 ? a : b;
        float s = 0.0f;
        for (int i = threadIdx.x; i < n; i += blockDim.x) s = fmaf(__ldcg(&x[i]), 1.0001f, s);
        float t = block_sum(s);
        if (threadIdx.x == 0) {
            y[blockIdx.x % n] = t * 1e-3f;
            // grid barrier: release our store, count in, spin until every block has
            __threadfence();
            unsigned target = (unsigned)(p + 1) * gridDim.x;
            atomicAdd(ctr, 1u);
            unsigned v;
            do {
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(ctr) : "memory");
            } while (v < target);
        }
        __syncthreads();
    }
}

// one thread-block cluster doing `phases` dependent stages without leaving the kernel: block r
// of the C blocks owns the vector's slice r (in its shared memory, two buffers in turn); each
// stage every block gathers the whole vector from the cluster's shared memories (DSMEM),
// reduces it (as k_vec), writes its slice of the next vector, and the cluster barrier
// (arrive.release / wait.acquire) orders the stages. `clusters` independent copies run at once.
__global__ void k_cluster(float* out, int n, int phases) {
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    __shared__ float buf[2][576];
    const int C = (int)cl.num_blocks();
    const int r = (int)cl.block_rank();
    const int slice = (n + C - 1) / C;
    for (int i = threadIdx.x; i < slice; i += blockDim.x) buf[0][i] = 1.0f;
    cl.sync();
    for (int p = 0; p < phases; p++) {
        const int cur = p % 2;
        float s = 0.0f;
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const float* remote = cl.map_shared_rank(&buf[cur][0], i / slice);
            s = fmaf(remote[i % slice], 1.0001f, s);
        }
        float t = block_sum(s);
        for (int i = threadIdx.x; i < slice; i += blockDim.x) buf[1 - cur][i] = t * 1e-3f + (float)i;
        cl.sync();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = buf[phases % 2][0];
}

// streaming read bandwidth of `gridDim.x` blocks (one per SM) reading `per` 16-byte words each
// (8 loads in flight per thread): what a few SMs can pull on their own
__global__ void k_stream(const int4* w, size_t per, int* out) {
    const int4* p = w + blockIdx.x * per;
    int acc = 0;
    for (size_t i = threadIdx.x; i < per; i += 8 * blockDim.x) {
        int4 v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) v[u] = (i + u * blockDim.x < per) ? __ldcs(p + i + u * blockDim.x) : make_int4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < 8; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (acc == 0x12345678) out[0] = acc;
}

// k_vec's chain in parts (mode): 0 every block's thread 0 stores one value after the wait;
// 1 every thread loads one element of x and thread 0 stores it; 2 + a warp shuffle
// reduction; 3 + the block reduction (shared memory and a barrier), i.e. k_vec with one load
// per thread
__global__ void k_part(const float* x, float* y, int n, int mode) {
    pdl_start();
    if (mode == 0) {
        if (threadIdx.x == 0) y[blockIdx.x % n] = 1.0f;
        return;
    }
    float s = x[threadIdx.x % n];
    if (mode == 2)
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(~0u, s, o);
    if (mode >= 3) s = block_sum(s);
    if (threadIdx.x == 0) y[blockIdx.x % n] = s * 1e-3f;
}

// the argmax stand-in: one block, one id
__global__ void k_argmax(const float* x, int* ids, int n) {
    pdl_start();
    if (threadIdx.x == 0) ids[0] = (int)x[0] & 1023;
}

struct Case {
    const char* name;
    int kind;  // 0 empty, 1 vec
    int blocks;
    int threads;
    bool pdl;
};

// `k(args...)` as `blocks` x `threads` on stream `s`, with programmatic stream serialization
// (PDL) when `pdl`
template <class... KArgs, class... Args>
static void launch_pdl(cudaStream_t s, int blocks, int threads, bool pdl, void (*k)(KArgs...), Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(threads);
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = pdl ? 1 : 0;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, k, args...));
}

static void launch(cudaStream_t s, int kind, int blocks, int threads, bool pdl, const float* x, float* y, int n) {
    launch_pdl(s, blocks, threads, pdl, kind == 0 ? k_empty : k_vec, x, y, n);
}

static float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// `f` called `reps` times back to back on stream `s` between the events, 7 times: the median
// microseconds per call
template <class F>
static float time_us(cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1, int reps, F f) {
    std::vector<float> us;
    for (int t = 0; t < 7; t++) {
        CK(cudaEventRecord(e0, s));
        for (int r = 0; r < reps; r++) f();
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        us.push_back(ms * 1000.0f / reps);
    }
    return median(us);
}

int main(int argc, char** argv) {
    int N = 154;
    const char* json = nullptr;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json = argv[++i];
        else
            N = atoi(argv[i]);
    }
    const int n = 576;
    float *a, *b;
    int* ids;
    CK(cudaMalloc(&a, 1 << 20));
    CK(cudaMalloc(&b, 1 << 20));
    CK(cudaMalloc(&ids, 4096));
    CK(cudaMemset(a, 0, 1 << 20));
    CK(cudaMemset(b, 0, 1 << 20));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<Case> cases = {
        {"empty_1x32", 0, 1, 32, false},      {"empty_1x32", 0, 1, 32, true},
        {"empty_132x128", 0, 132, 128, false}, {"empty_132x128", 0, 132, 128, true},
        {"vec576_1x128", 1, 1, 128, true},    {"vec576_32x128", 1, 32, 128, false},
        {"vec576_32x128", 1, 32, 128, true},  {"vec576_132x128", 1, 132, 128, false},
        {"vec576_132x128", 1, 132, 128, true}, {"vec576_264x128", 1, 264, 128, true},
    };
    std::string out = "{\"kernels_per_graph\": " + std::to_string(N) + ", \"chain\": [";
    const int reps = 50;
    for (size_t ci = 0; ci < cases.size(); ci++) {
        const Case& c = cases[ci];
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        for (int k = 0; k < N; k++) launch(s, c.kind, c.blocks, c.threads, c.pdl, k % 2 ? b : a, k % 2 ? a : b, n);
        CK(cudaStreamEndCapture(s, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        for (int w = 0; w < 5; w++) CK(cudaGraphLaunch(ge, s));
        float per_graph = time_us(s, e0, e1, reps, [&]() { CK(cudaGraphLaunch(ge, s)); });
        printf("chain %-16s pdl=%d  %3d kernels: %8.2f us per graph, %5.3f us per kernel\n", c.name, c.pdl, N, per_graph, per_graph / N);
        char buf[256];
        snprintf(buf, sizeof buf, "%s{\"case\": \"%s\", \"pdl\": %s, \"us_per_graph\": %.2f, \"us_per_kernel\": %.3f}", ci ? ", " : "", c.name, c.pdl ? "true" : "false", per_graph, per_graph / N);
        out += buf;
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
    }
    out += "], \"parts\": [";
    // the chain's parts, 132 blocks x 128 threads, PDL
    const char* pnames[] = {"store_only", "load_store", "load_warp_reduce", "load_block_reduce"};
    for (int mode = 0; mode < 4; mode++) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        for (int k = 0; k < N; k++) launch_pdl(s, 132, 128, true, k_part, (const float*)(k % 2 ? b : a), k % 2 ? a : b, n, mode);
        CK(cudaStreamEndCapture(s, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        for (int w = 0; w < 5; w++) CK(cudaGraphLaunch(ge, s));
        float per = time_us(s, e0, e1, reps, [&]() { CK(cudaGraphLaunch(ge, s)); });
        printf("parts %-18s 132x128 pdl=1: %5.3f us per kernel\n", pnames[mode], per / N);
        char buf[200];
        snprintf(buf, sizeof buf, "%s{\"case\": \"%s\", \"us_per_kernel\": %.3f}", mode ? ", " : "", pnames[mode], per / N);
        out += buf;
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
    }
    out += "], \"step\": [";
    // a decode step as the engine issues it around a graph of N vec576_132x128 PDL kernels:
    // upload (pinned, 512 B), fed-token copy (4 B device to device), graph, argmax, ids
    // download (pinned, 4 B), event — and the same with parts left out / the argmax captured
    int* hin;
    int* hout;
    CK(cudaMallocHost(&hin, 4096));
    CK(cudaMallocHost(&hout, 4096));
    memset(hin, 0, 4096);
    struct Step {
        const char* name;
        bool upload, fed, argmax_out, argmax_in, download;
    };
    cudaStream_t s2;
    CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    cudaEvent_t ready, dl;
    CK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&dl, cudaEventDisableTiming));
    std::vector<Step> steps = {
        {"graph_alone", false, false, false, false, false},
        {"engine_step", true, true, true, false, true},
        {"no_fed_copy", true, false, true, false, true},
        {"argmax_in_graph", true, true, false, true, true},
        {"argmax_in_graph_no_fed", true, false, false, true, true},
        {"side_download", true, true, true, false, true},
        {"argmax_in_graph_no_fed_side_download", true, false, false, true, true},
        {"no_upload", false, true, true, false, true},
    };
    for (size_t si = 0; si < steps.size(); si++) {
        const Step& st = steps[si];
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        for (int k = 0; k < N; k++) launch(s, 1, 132, 128, true, k % 2 ? b : a, k % 2 ? a : b, n);
        if (st.argmax_in) launch_pdl(s, 1, 32, true, k_argmax, (const float*)a, ids, n);
        CK(cudaStreamEndCapture(s, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        auto one = [&]() {
            if (st.upload) CK(cudaMemcpyAsync(b + 4096, hin, 512, cudaMemcpyHostToDevice, s));
            if (st.fed) CK(cudaMemcpyAsync(b + 8192, ids, 4, cudaMemcpyDeviceToDevice, s));
            CK(cudaGraphLaunch(ge, s));
            if (st.argmax_out) k_argmax<<<1, 32, 0, s>>>(a, ids, n);
            // (side_download: the ids copy and its event on a second stream after an event,
            // off the main stream's path)
            bool side = strstr(st.name, "side_download") != nullptr;
            if (st.download && side) {
                CK(cudaEventRecord(ready, s));
                CK(cudaStreamWaitEvent(s2, ready, 0));
                CK(cudaMemcpyAsync(hout, ids, 4, cudaMemcpyDeviceToHost, s2));
                CK(cudaEventRecord(dl, s2));
            } else if (st.download) {
                CK(cudaMemcpyAsync(hout, ids, 4, cudaMemcpyDeviceToHost, s));
                CK(cudaEventRecord(dl, s));
            }
        };
        for (int w = 0; w < 5; w++) one();
        CK(cudaStreamSynchronize(s));
        float per = time_us(s, e0, e1, reps, [&]() { one(); });
        printf("step  %-24s %8.2f us per step\n", st.name, per);
        char buf[256];
        snprintf(buf, sizeof buf, "%s{\"case\": \"%s\", \"us_per_step\": %.2f}", si ? ", " : "", st.name, per);
        out += buf;
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
    }
    out += "], \"persistent\": [";
    // the persistent kernel: N phases, one grid barrier each (counter zeroed before each launch)
    unsigned* ctr;
    CK(cudaMalloc(&ctr, 4));
    int pblocks[] = {132, 66, 32};
    for (int pi = 0; pi < 3; pi++) {
        int G = pblocks[pi];
        auto one = [&]() {
            CK(cudaMemsetAsync(ctr, 0, 4, s));
            k_persist<<<G, 128, 0, s>>>(a, b, n, N, ctr);
        };
        for (int w = 0; w < 3; w++) one();
        CK(cudaGetLastError());
        float per = time_us(s, e0, e1, 20, [&]() { one(); });
        printf("persistent vec576_%dx128 %3d phases: %8.2f us per launch, %5.3f us per phase\n", G, N, per, per / N);
        char buf[256];
        snprintf(buf, sizeof buf, "%s{\"blocks\": %d, \"us_per_launch\": %.2f, \"us_per_phase\": %.3f}", pi ? ", " : "", G, per, per / N);
        out += buf;
    }
    out += "], \"cluster\": [";
    // one cluster per group of C blocks, N stages each, cluster barriers between them
    CK(cudaFuncSetAttribute(k_cluster, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    int csizes[] = {2, 4, 8, 16};
    int cgroups[] = {1, 8};
    bool first = true;
    for (int cs : csizes) {
        for (int cg : cgroups) {
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3(cs * cg);
            cfg.blockDim = dim3(128);
            cfg.stream = s;
            cudaLaunchAttribute at[1];
            at[0].id = cudaLaunchAttributeClusterDimension;
            at[0].val.clusterDim.x = cs;
            at[0].val.clusterDim.y = 1;
            at[0].val.clusterDim.z = 1;
            cfg.attrs = at;
            cfg.numAttrs = 1;
            auto one = [&]() { return cudaLaunchKernelEx(&cfg, k_cluster, b, n, N); };
            cudaError_t e = one();
            if (e != cudaSuccess) {
                printf("cluster %2d x %d: %s\n", cs, cg, cudaGetErrorString(e));
                cudaGetLastError();
                continue;
            }
            for (int w = 0; w < 3; w++) CK(one());
            float per = time_us(s, e0, e1, 20, [&]() { CK(one()); });
            printf("cluster of %2d blocks x %d clusters, %3d stages: %8.2f us per launch, %5.3f us per stage\n", cs, cg, N, per, per / N);
            char buf[256];
            snprintf(buf, sizeof buf, "%s{\"cluster\": %d, \"clusters\": %d, \"us_per_launch\": %.2f, \"us_per_stage\": %.3f}", first ? "" : ", ", cs, cg, per, per / N);
            first = false;
            out += buf;
        }
    }
    out += "], \"stream\": [";
    // per-SM streaming bandwidth: 1, 16, 132 blocks of 512 threads, 4 MB each, from HBM
    {
        const size_t per = (4u << 20) / 16;
        int4* w;
        CK(cudaMalloc(&w, 132 * per * 16));
        CK(cudaMemset(w, 1, 132 * per * 16));
        int gs[] = {1, 8, 16, 32, 132};
        for (int gi = 0; gi < 5; gi++) {
            int G = gs[gi];
            for (int wu = 0; wu < 2; wu++) k_stream<<<G, 512, 0, s>>>(w, per, ids);
            float t = time_us(s, e0, e1, 1, [&]() { k_stream<<<G, 512, 0, s>>>(w, per, ids); });
            double gbs = (double)G * per * 16 / (t * 1e-6) / 1e9;
            printf("stream %3d blocks x 4 MB: %8.2f us, %7.1f GB/s (%6.1f GB/s per SM)\n", G, t, gbs, gbs / G);
            char buf[200];
            snprintf(buf, sizeof buf, "%s{\"blocks\": %d, \"us\": %.2f, \"gb_per_s\": %.1f}", gi ? ", " : "", G, t, gbs);
            out += buf;
        }
        CK(cudaFree(w));
    }
    out += "]}\n";
    if (json) {
        FILE* f = fopen(json, "w");
        if (f) {
            fputs(out.c_str(), f);
            fclose(f);
        }
    }
    return 0;
}
