//! Every run-time knob of the GPU backend and the scheduler, as one typed value:
//! [`RuntimeOptions`].
//!
//! `Default` is what production runs. The `dsc` and `dsc-runtime` binaries read the `DSC_*`
//! environment variables once ([`RuntimeOptions::from_env`]; the names stay for the scripts), a
//! value that does not parse is an error naming the variable, and the value is passed down
//! explicitly (`GpuBackend::new(.., &opts)`, `SchedulerConfig`). Nothing else in the runtime
//! reads the environment for them.
//!
//! Two kinds of options:
//! - the top-level fields choose paths and tunables that serve real traffic (CUDA graphs, PDL,
//!   wgmma, the pipelined and multi-step decode, their size limits);
//! - [`MeasureOptions`]: measurement knobs only (per-launch profiling, leaving kernels out,
//!   forced clusters, repeated graphs, moved arenas and KV blocks). Some make results wrong;
//!   each announces itself on stderr where it does.
//!
//! A knob measured worse than the default is deleted, not kept for A/B: git keeps it (gone
//! in session 24: DSC_INPUT_COPY, DSC_INPUTS_PDL, DSC_IDS_SAME_STREAM, DSC_HOST_ARGMAX,
//! DSC_PACK_INPUTS, DSC_ARGMAX_SPLIT, DSC_ARGMAX_FOLD, DSC_NO_FEW, DSC_SMEM_CARVEOUT).

use serde::Serialize;

/// Steps of at most this many tokens keep their bucket (and CUDA graph, and launch with PDL);
/// longer (prefill) steps get a transient one. 128 covers batched decode up to 128 sequences
/// (at 64, a 128-sequence decode step rebuilt its bucket every step, without a graph: ~2 ms of
/// host work per 8B step).
pub const CACHED_MAX_TOKENS: usize = 128;

/// Steps of at most this many tokens launch with programmatic dependent launch. Measured on the
/// H200 (bench/results/gemm-ws-2026-11-30.json, engine bench): PDL wins at 64 tokens (8B
/// 12.0k -> 12.4k tok/s, SmolLM2 shape 49.5k -> 52.4k) and is mixed at 128 (8B +1%, SmolLM2
/// shape with the warp-specialized SwiGLU gate/up 57.9k -> 43.3k: the early-launched
/// dependents hold SMs the 24-block matmul and its successors need).
pub const PDL_MAX_TOKENS: usize = 64;

/// Pipelined greedy steps launched at once by default: 4 — SmolLM2 shape b1 3,925 -> 4,005-4,013
/// tok/s in a b1-only process, 3,930 -> 3,965 in the harness's b1-to-b128 one; k = 3, 5, 6
/// within 0.3% of it, 2 no gain, 8 and 16 less (more of a run's steps fall back to single
/// ones near its length limit); b8-b128 and the 8B shape neutral
/// (bench/results/session20-2026-12-01.json).
pub const MULTI_STEP: usize = 4;

/// The runtime's configuration of one process.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RuntimeOptions {
    /// replay decode-sized steps as CUDA graphs (captured on a bucket's second run);
    /// DSC_NO_CUDA_GRAPHS=1 off (every launch from the host: slower, for debugging)
    pub cuda_graphs: bool,
    /// launch decode-sized steps with programmatic dependent launch on sm_90a (measured +6-10%
    /// SmolLM2 decode, ~0 for the 8B shape; bench/results/pdl-*.json); DSC_NO_PDL=1 off
    pub pdl: bool,
    /// the plan's Hopper (wgmma) alternatives on sm_90a; DSC_NO_WGMMA=1 takes the mma.sync
    /// kernels there too (the kernel check runs the sm_80 matmuls on the H200 with it)
    pub wgmma: bool,
    /// launch a greedy step before the previous one's ids are back (`Backend::launch_greedy`);
    /// DSC_NO_PIPELINE=1 or `--no-pipeline` off
    pub pipeline: bool,
    /// k of the multi-step decode: fed greedy steps launched as one chained graph
    /// ([`MULTI_STEP`]; DSC_MULTI_STEP=k, 1..=16, 1 off; `serve --multi-step` overrides)
    pub multi_step: usize,
    /// steps of at most this many tokens keep a bucket and a CUDA graph ([`CACHED_MAX_TOKENS`];
    /// DSC_CACHED_MAX_TOKENS)
    pub cached_max_tokens: usize,
    /// steps of at most this many tokens launch with PDL ([`PDL_MAX_TOKENS`]; DSC_PDL_MAX_TOKENS)
    pub pdl_max_tokens: usize,
    /// MB of L2 set aside for persisting lines; the logits' matmul marks that much of its weight
    /// persisting (an access policy window). With the wide lm_head +0.2-0.35% at 8-30 MB
    /// (session 19): not on by default. DSC_L2_PERSIST_MB
    pub l2_persist_mb: usize,
    /// tensor-parallel plans: every rank on this one GPU, the collective through the host (a
    /// check of the partitioning without a second GPU); DSC_TP_LOCAL=1
    pub tp_local: bool,
    pub measure: MeasureOptions,
}

/// Measurement knobs: none is for serving.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct MeasureOptions {
    /// time every launch with CUDA events (no graphs): kernel -> (launches, µs); DSC_PROFILE=1
    pub profile: bool,
    /// leave out every launch whose kernel symbol contains one of these (the results are wrong;
    /// the step's time without them bounds what fusing them away can gain:
    /// scripts/gpu-knockout.sh); DSC_SKIP_KERNELS=a,b
    pub skip_kernels: Vec<String>,
    /// sm_90a launches whose kernel symbol contains the string go in thread-block clusters of N
    /// blocks along grid y (what the cluster launch alone costs); DSC_FORCE_CLUSTER=substr=N
    pub force_cluster: Option<(String, u32)>,
    /// capture a bucket's launches this many times in its CUDA graph (the same step
    /// recomputed: what a graph launch costs its first kernels); DSC_GRAPH_REPEAT=n, 1..=8
    pub graph_repeat: usize,
    /// the activation arena's alignment in bytes (a power of two; default the 2 MiB large
    /// page, 1: unaligned); DSC_ARENA_ALIGN
    pub arena_align: Option<usize>,
    /// every activation this many bytes further into the arena (multiples of 256); DSC_ARENA_PAD
    pub arena_pad: usize,
    /// hand out KV blocks from this one on, then wrap (where a sequence's blocks lie in the
    /// pools); DSC_KV_FIRST_BLOCK
    pub kv_first_block: usize,
    /// this many more blocks in every KV pool (their sizes, so their places in memory, change;
    /// the blocks a sequence gets do not); DSC_KV_EXTRA_BLOCKS
    pub kv_extra_blocks: usize,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            cuda_graphs: true,
            pdl: true,
            wgmma: true,
            pipeline: true,
            multi_step: MULTI_STEP,
            cached_max_tokens: CACHED_MAX_TOKENS,
            pdl_max_tokens: PDL_MAX_TOKENS,
            l2_persist_mb: 0,
            tp_local: false,
            measure: MeasureOptions { graph_repeat: 1, ..Default::default() },
        }
    }
}

/// Where `from_vars` reads a variable: `Some(value)` if set.
pub type VarSource<'a> = &'a dyn Fn(&str) -> Option<String>;

impl RuntimeOptions {
    /// From the process environment (the binaries call this once at start).
    pub fn from_env() -> Result<Self, String> {
        Self::from_vars(&|k| std::env::var(k).ok())
    }

    /// From the variables `get` returns; every value that does not parse or is out of range is
    /// named in the error (all of them at once).
    pub fn from_vars(get: VarSource) -> Result<Self, String> {
        let d = RuntimeOptions::default();
        let mut v = Vars { get, errors: vec![] };
        let o = RuntimeOptions {
            cuda_graphs: !v.set("DSC_NO_CUDA_GRAPHS"),
            pdl: !v.set("DSC_NO_PDL"),
            wgmma: !v.set("DSC_NO_WGMMA"),
            pipeline: !v.set("DSC_NO_PIPELINE"),
            multi_step: v.num("DSC_MULTI_STEP", 1, 16).unwrap_or(d.multi_step),
            cached_max_tokens: v.num("DSC_CACHED_MAX_TOKENS", 1, 1 << 20).unwrap_or(d.cached_max_tokens),
            pdl_max_tokens: v.num("DSC_PDL_MAX_TOKENS", 0, 1 << 20).unwrap_or(d.pdl_max_tokens),
            l2_persist_mb: v.num("DSC_L2_PERSIST_MB", 0, 1 << 16).unwrap_or(0),
            tp_local: v.set("DSC_TP_LOCAL"),
            measure: MeasureOptions {
                profile: v.set("DSC_PROFILE"),
                skip_kernels: v.raw("DSC_SKIP_KERNELS").map(|s| s.split(',').map(str::trim).filter(|x| !x.is_empty()).map(str::to_string).collect()).unwrap_or_default(),
                force_cluster: v.raw("DSC_FORCE_CLUSTER").and_then(|s| match s.rsplit_once('=').map(|(k, n)| (k, n.trim().parse::<u32>())) {
                    Some((k, Ok(n @ 1..=16))) if !k.is_empty() => Some((k.to_string(), n)),
                    _ => {
                        v.bad("DSC_FORCE_CLUSTER", &s, "substr=N with N in 1..=16");
                        None
                    }
                }),
                graph_repeat: v.num("DSC_GRAPH_REPEAT", 1, 8).unwrap_or(1),
                arena_align: v.num("DSC_ARENA_ALIGN", 1, 1 << 30).map(usize::next_power_of_two),
                arena_pad: v.num("DSC_ARENA_PAD", 0, 1 << 30).map_or(0, |p: usize| p / 256 * 256),
                kv_first_block: v.num("DSC_KV_FIRST_BLOCK", 0, usize::MAX).unwrap_or(0),
                kv_extra_blocks: v.num("DSC_KV_EXTRA_BLOCKS", 0, 1 << 24).unwrap_or(0),
            },
        };
        if v.errors.is_empty() {
            Ok(o)
        } else {
            Err(format!("bad runtime option{}: {}", if v.errors.len() > 1 { "s" } else { "" }, v.errors.join("; ")))
        }
    }

    /// The fields that differ from [`Default`], as `name=value` (what `dsc serve` and the
    /// benchmarks announce, so a log says what ran).
    pub fn differences(&self) -> Vec<String> {
        let (a, b) = (serde_json::to_value(self), serde_json::to_value(RuntimeOptions::default()));
        let (Ok(serde_json::Value::Object(a)), Ok(serde_json::Value::Object(b))) = (a, b) else { return vec![] };
        let mut out = vec![];
        for (k, v) in &a {
            match (v, b.get(k)) {
                (serde_json::Value::Object(m), Some(serde_json::Value::Object(n))) => {
                    out.extend(m.iter().filter(|(kk, vv)| n.get(*kk) != Some(vv)).map(|(kk, vv)| format!("{k}.{kk}={vv}")));
                }
                (v, w) if w != Some(v) => out.push(format!("{k}={v}")),
                _ => {}
            }
        }
        // (by name: serde_json keeps insertion order under llguidance's preserve_order)
        out.sort();
        out
    }
}

struct Vars<'a> {
    get: VarSource<'a>,
    errors: Vec<String>,
}

impl Vars<'_> {
    fn raw(&self, name: &str) -> Option<String> {
        (self.get)(name)
    }
    /// a switch: on where the variable is set to anything but "" or "0"
    fn set(&self, name: &str) -> bool {
        self.raw(name).is_some_and(|v| !matches!(v.trim(), "" | "0"))
    }
    fn bad(&mut self, name: &str, v: &str, want: &str) {
        self.errors.push(format!("{name}={v:?}: expected {want}"));
    }
    fn num<T: std::str::FromStr + PartialOrd + Copy + std::fmt::Display>(&mut self, name: &str, lo: T, hi: T) -> Option<T> {
        let v = self.raw(name)?;
        match v.trim().parse::<T>() {
            Ok(x) if x >= lo && x <= hi => Some(x),
            _ => {
                self.bad(name, &v, &format!("an integer in {lo}..={hi}"));
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(kv: &[(&str, &str)]) -> Result<RuntimeOptions, String> {
        let m: std::collections::HashMap<String, String> = kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        RuntimeOptions::from_vars(&|k| m.get(k).cloned())
    }

    #[test]
    fn no_variables_give_the_defaults() {
        let o = vars(&[]).unwrap();
        assert_eq!(o, RuntimeOptions::default());
        assert!(o.differences().is_empty());
        assert!(o.cuda_graphs && o.pdl && o.wgmma && o.pipeline && o.multi_step == MULTI_STEP);
    }

    #[test]
    fn variables_set_fields_and_bad_values_are_named() {
        let o = vars(&[("DSC_NO_PDL", "1"), ("DSC_MULTI_STEP", "2"), ("DSC_SKIP_KERNELS", "rms_norm, argmax"), ("DSC_FORCE_CLUSTER", "paged=2"), ("DSC_ARENA_ALIGN", "3000")]).unwrap();
        assert!(!o.pdl && o.cuda_graphs);
        assert_eq!(o.multi_step, 2);
        assert_eq!(o.measure.skip_kernels, ["rms_norm", "argmax"]);
        assert_eq!(o.measure.force_cluster, Some(("paged".to_string(), 2)));
        assert_eq!(o.measure.arena_align, Some(4096));
        assert_eq!(o.differences(), ["measure.arena_align=4096", "measure.force_cluster=[\"paged\",2]", "measure.skip_kernels=[\"rms_norm\",\"argmax\"]", "multi_step=2", "pdl=false"]);
        // "0" leaves a switch off
        assert!(vars(&[("DSC_NO_CUDA_GRAPHS", "0")]).unwrap().cuda_graphs);
        let e = vars(&[("DSC_MULTI_STEP", "40"), ("DSC_FORCE_CLUSTER", "x"), ("DSC_PDL_MAX_TOKENS", "many")]).unwrap_err();
        assert!(e.contains("DSC_MULTI_STEP=\"40\": expected an integer in 1..=16"), "{e}");
        assert!(e.contains("DSC_FORCE_CLUSTER=\"x\""), "{e}");
        assert!(e.contains("DSC_PDL_MAX_TOKENS=\"many\""), "{e}");
    }
}
