//! `dsc gpu-bundle`: every generated kernel, compiled to PTX, with fresh random inputs and the
//! CPU reference executor's outputs, for `dsc-runtime gpu-check` to run on a GPU.
//!
//! The cases by kernel family, one file each beside the family's kernels in `dsc_codegen::kernels`:
//! `elementwise` (unary, binary, gather, seeded, index ops), `norm` (rms_norm, softmax,
//! layer_norm), `matmul` (GEMV, mma.sync, wgmma, pipelined, split-K), `mlp` (the fused SwiGLU
//! and one-token MLP kernels), `attention` (cache writes, decode and prefill attention, the
//! fused Q/K/V and RoPE variants), `rope`, `argmax`, `moe` (DeepSeekMoE's router and routed
//! experts), `mla` (the latent attention, the per-head matmuls). Each family function appends its cases and
//! specs to one [`Cx`]; [`write_bundle_only`] calls them in a fixed order (the random stream is
//! drawn in that order, so the same seed gives the same bundle), then compiles the specs into
//! one module and writes it with the data.

mod argmax;
mod attention;
mod elementwise;
mod fp8;
mod matmul;
mod mla;
mod mlp;
mod moe;
mod norm;
mod rope;

use anyhow::Context;
use dsc_codegen::kernels::{BinaryOpKey, UnaryOpKey};
use dsc_codegen::{compile_kernels, GpuTarget, KernelSpec, Launch};
use dsc_ir::{text, BinaryOp, DType, Executor, Tensor, UnaryOp};
use dsc_runtime::gpu_check::{Array, Bundle, Case, TmapInput};
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

struct Data(Vec<u8>);
impl Data {
    fn push(&mut self, v: &[f32]) -> Array {
        let a = Array { offset: self.0.len(), len: v.len(), dtype: "f32".into() };
        self.0.extend(v.iter().flat_map(|x| x.to_le_bytes()));
        a
    }
    fn push_i32(&mut self, v: &[i32]) -> Array {
        let a = Array { offset: self.0.len(), len: v.len(), dtype: "i32".into() };
        self.0.extend(v.iter().flat_map(|x| x.to_le_bytes()));
        a
    }
    /// a KV pool's values as `kv` (f32, or bf16 bytes: the values are already bf16-exact)
    fn push_kv(&mut self, v: &[f32], kv: DType) -> Array {
        if kv == DType::F32 {
            return self.push(v);
        }
        let bytes = dsc_ir::quant::encode(DType::BF16, v).expect("bf16 encodes");
        Array { dtype: "bf16".into(), len: v.len(), ..self.push_u8(&bytes) }
    }
    fn push_u8(&mut self, v: &[u8]) -> Array {
        let a = Array { offset: self.0.len(), len: v.len(), dtype: "u8".into() };
        self.0.extend_from_slice(v);
        // keep every array 16-byte aligned
        while self.0.len() % 16 != 0 {
            self.0.push(0);
        }
        a
    }
}

type Weights = HashMap<String, (DType, Vec<usize>, Vec<u8>)>;

/// The bundle's random stream.
struct Rand(rand::rngs::StdRng);
impl Rand {
    /// n values uniform in [lo, hi)
    fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.0.random_range(lo..hi)).collect()
    }
}

/// What the family case builders share: the random stream, the data every case's arrays live
/// in, the cases and the specs to compile, the options the plans would be compiled with.
struct Cx {
    r: Rand,
    data: Data,
    cases: Vec<Case>,
    specs: Vec<KernelSpec>,
    opts: dsc_codegen::CodegenOptions,
    /// no weights (the reference of a graph without any)
    none: Weights,
}

/// Evaluate `src` (a one-op graph) on the CPU reference executor.
fn reference(src: &str, inputs: Vec<(&str, Tensor)>, weights: &Weights) -> anyhow::Result<Vec<f32>> {
    let g = text::parse(src)?;
    let mut ex = Executor::new(&g, weights, BTreeMap::new())?;
    let out = ex.run(&inputs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())?;
    Ok(out.into_values().next().context("one output")?.data)
}

/// The CPU reference of x[M, K] @ w^T (`w` in `weights`, [N, K] of `wdtype`), plus `r`
/// [M, N] when given (matmul_add: the residual epilogue).
fn matmul_reference(x: &[f32], r: Option<&[f32]>, m: usize, k: usize, n: usize, wdtype: DType, weights: &Weights) -> anyhow::Result<Vec<f32>> {
    let mut inputs = vec![("x", Tensor::new(vec![m, k], x.to_vec()))];
    let src = match r {
        Some(r) => {
            inputs.push(("r", Tensor::new(vec![m, n], r.to_vec())));
            format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n  %r = input : f32[{m}, {n}]\n  %w = weight : {wdtype}[{n}, {k}]\n  %y = matmul_add(%x, %w, %r) {{transpose_b = true}} : f32[{m}, {n}]\n  output y = %y\n}}\n")
        }
        None => format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n  %w = weight : {wdtype}[{n}, {k}]\n  %y = matmul(%x, %w) {{transpose_b = true}} : f32[{m}, {n}]\n  output y = %y\n}}\n"),
    };
    reference(&src, inputs, weights)
}

/// Random weights w0, w1, .. of [N_i, K] for merged-matmul cases: their bytes in `wdtype`, the
/// weight source for the CPU reference, and their declarations in the graph text.
fn part_weights(parts: &[usize], k: usize, wdtype: DType, r: &mut Rand) -> anyhow::Result<(Vec<Vec<u8>>, Weights, String)> {
    let enc: Vec<Vec<u8>> = parts.iter().map(|&p| dsc_ir::quant::encode(wdtype, &r.vec(p * k, -0.1, 0.1))).collect::<Option<_>>().context("encode")?;
    let ws: Weights = parts.iter().zip(&enc).enumerate().map(|(i, (&p, b))| (format!("w{i}"), (wdtype, vec![p, k], b.clone()))).collect();
    let decl = parts.iter().enumerate().map(|(i, p)| format!("  %w{i} = weight : {wdtype}[{p}, {k}]\n")).collect();
    Ok((enc, ws, decl))
}

/// Bytes as little-endian f32 words (how a case's 16-bit data travels: pairs in a word).
fn le_words(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// A merged matmul's row-major [m, sum(parts)] result in the GPU's part-major layout: part i
/// is a contiguous [m, N_i] after the parts before it.
fn part_major(rowmajor: &[f32], m: usize, parts: &[usize]) -> Vec<f32> {
    let total: usize = parts.iter().sum();
    let mut out = Vec::with_capacity(rowmajor.len());
    let mut off = 0;
    for &p in parts {
        for r in 0..m {
            out.extend_from_slice(&rowmajor[r * total + off..r * total + off + p]);
        }
        off += p;
    }
    out
}

/// (grid x, threads per block) of a kernel launched as `launch` over `n` outputs: the
/// runtime's launch geometry (the plan's launch kind, `crate::launch_shape`, and
/// `LaunchKind::dims`), the work in the units the schedule gives it (`Launch::work_units`).
fn grid(launch: &Launch, n: usize) -> (u32, u32) {
    let (kind, block, rows_per_block, threads) = crate::launch_shape(Some(launch.clone()));
    let (gx, _, t) = kind.dims(launch.work_units(n) as u32, 1, block, rows_per_block, threads.unwrap_or(128)).expect("a kernel's launch");
    (gx, t)
}

/// Grid y of a kernel launched as `launch` over `rows` activation rows (the runtime's geometry:
/// the tiled kinds cover several rows per block).
fn grid_rows(launch: &Launch, rows: usize) -> u32 {
    let (kind, block, rows_per_block, threads) = crate::launch_shape(Some(launch.clone()));
    kind.dims(1, rows as u32, block, rows_per_block, threads.unwrap_or(128)).expect("a kernel's launch").1
}

/// A pipelined-matmul check case once more warp-specialized (`KernelSpec::Ws`): x and the
/// weights as tensor maps (`tmaps`: x's first), one more warpgroup (the producer), the same
/// data and grid; None where the tiling has no such variant (64-row tiles, x in f32, more
/// stages than the mbarrier space holds).
fn ws_variant(case: &Case, spec: &KernelSpec, m: usize, k: usize, f16: bool, weights: &[usize]) -> Option<(Case, KernelSpec)> {
    // (the SwiGLU epilogue's tile: bn/2 rows from each of the two weights)
    let swiglu = matches!(spec, KernelSpec::SwiGluPipe { .. });
    let KernelSpec::MatMulPipe { bn, stages, a16: true, bm, .. } = *spec.pipe_core() else { return None };
    if stages * 16 > dsc_codegen::kernels::TMA_MBAR_BYTES {
        return None;
    }
    // (a warpgroup's columns: half the tile's in 64-row tiles; SwiGLU boxes half of those)
    let wn = if bm == 64 { bn / 2 } else { bn };
    let rows = if swiglu { wn / 2 } else { bn } as u32;
    let ws = KernelSpec::Ws { inner: Box::new(spec.clone()) };
    let mut tmaps = vec![TmapInput { input: 0, n: m, k, rows: bm as u32, f16, pool: None }];
    tmaps.extend(weights.iter().enumerate().map(|(i, &n)| TmapInput { input: 1 + i, n, k, rows, f16, pool: None }));
    let (_, threads) = grid(&ws.launch(), 1);
    Some((Case { name: format!("{} ws", case.name), kernel: ws.symbol(), tmaps, block: threads, ..case.clone() }, ws))
}

/// A pipelined-matmul check case once more with its W tiles by TMA (`KernelSpec::Tma`): the
/// same data and grid (the wrapper only adds shared memory), `tmaps` naming the weight inputs.
fn tma_variant(case: &Case, spec: &KernelSpec, tmaps: Vec<TmapInput>) -> (Case, KernelSpec) {
    let tma = KernelSpec::Tma { inner: Box::new(spec.clone()) };
    (Case { name: format!("{} tma", case.name), kernel: tma.symbol(), tmaps, ..case.clone() }, tma)
}

pub fn write_bundle(dir: &Path, seed: u64) -> anyhow::Result<usize> {
    write_bundle_only(dir, seed, &[], &dsc_codegen::CodegenOptions::default())
}

/// [`write_bundle`] keeping only the cases whose kernel name contains one of `only` (all when
/// empty), and only their kernels and data: a focused check that fits one device call beside
/// a plan. The kernels' bodies are written as `opts.kernels` says; `opts.schedule` picks the
/// variants the plans would (TMA matmuls, the attention's keys per step and o-projection
/// blocks).
pub fn write_bundle_only(dir: &Path, seed: u64, only: &[String], opts: &dsc_codegen::CodegenOptions) -> anyhow::Result<usize> {
    std::fs::create_dir_all(dir)?;
    let mut cx = Cx { r: Rand(rand::rngs::StdRng::seed_from_u64(seed)), data: Data(vec![]), cases: vec![], specs: vec![], opts: *opts, none: Weights::new() };
    // (in this order: the random stream is drawn by each in turn)
    elementwise::unary_binary(&mut cx)?;
    norm::rms_norm(&mut cx)?;
    matmul::gemv_mma(&mut cx)?;
    matmul::pipe(&mut cx)?;
    matmul::split_k(&mut cx)?;
    mlp::cases(&mut cx)?;
    attention::qkv_rope_cache(&mut cx)?;
    elementwise::gather(&mut cx)?;
    rope::cases(&mut cx)?;
    attention::paged_flash(&mut cx)?;
    attention::rope_qkv_attention(&mut cx)?;
    elementwise::seeded(&mut cx)?;
    norm::softmax_layer_norm(&mut cx)?;
    argmax::cases(&mut cx)?;
    elementwise::index_ops(&mut cx)?;
    // (the DeepSeek families last: the cases before them draw the same random stream as before)
    moe::cases(&mut cx)?;
    mla::cases(&mut cx)?;
    rope::yarn_cases(&mut cx)?;
    matmul::packed(&mut cx, DType::I4G128)?;
    elementwise::seeded_f8g128(&mut cx)?;
    matmul::packed(&mut cx, DType::F8G128)?;
    fp8::cases(&mut cx)?;
    matmul::kquant(&mut cx)?;
    let Cx { mut data, mut cases, mut specs, .. } = cx;
    if !only.is_empty() {
        let keep = |k: &str| only.iter().any(|o| k.contains(o.as_str()));
        cases.retain(|c| keep(&c.kernel));
        if cases.is_empty() {
            anyhow::bail!("no kernel-check case's kernel contains any of {only:?}");
        }
        specs.retain(|s| cases.iter().any(|c| c.kernel == s.symbol()));
        // (the kept cases' arrays copied into a fresh data.bin, offsets remapped)
        let old = std::mem::replace(&mut data, Data(vec![]));
        // (keyed by offset and length: cases share an input's prefix — one row of a matrix
        // another case reads whole —, and a copy of the shorter would cut the longer short)
        let mut moved: HashMap<(usize, usize), usize> = HashMap::new();
        let mut relocate = |a: &mut Array| -> anyhow::Result<()> {
            let key = (a.offset, a.byte_len()?);
            let at = match moved.get(&key) {
                Some(&at) => at,
                None => {
                    let bytes = old.0.get(a.offset..a.offset + key.1).context("array outside the data")?;
                    let at = data.push_u8(bytes).offset;
                    moved.insert(key, at);
                    at
                }
            };
            a.offset = at;
            Ok(())
        };
        for c in &mut cases {
            for a in c.inputs.iter_mut().chain(std::iter::once(&mut c.expected)).chain(c.init.iter_mut()).chain(c.written_inputs.iter_mut().map(|(_, a)| a)) {
                relocate(a)?;
            }
        }
    }
    let m = compile_kernels(&specs, &GpuTarget::ALL, &opts.kernels)?;
    // (kernel options other than the default: every symbol carries their hash)
    let suffix = opts.kernels.symbol_suffix();
    for c in &mut cases {
        c.kernel.push_str(&suffix);
    }
    // the cases name kernels by their readable symbol: two bundle specs that share one (and so
    // were compiled under hashed names) would leave a case without its kernel
    let names: std::collections::BTreeSet<&str> = m.kernels.iter().map(|(n, _)| n.as_str()).collect();
    if let Some(c) = cases.iter().find(|c| !names.contains(c.kernel.as_str())) {
        anyhow::bail!("bundle case `{}`: kernel `{}` is not in the module (two bundle specs share its name: give them distinct shapes)", c.name, c.kernel);
    }
    let mut ptx = BTreeMap::new();
    for (t, text) in &m.ptx {
        let f = format!("kernels.{}.ptx", t.name());
        std::fs::write(dir.join(&f), text)?;
        ptx.insert(t.name().to_string(), f);
    }
    std::fs::write(dir.join("kernels.mlir"), &m.mlir)?;
    std::fs::write(dir.join("kernels.ll"), &m.llvm)?;
    std::fs::write(dir.join("data.bin"), &data.0)?;
    let n = cases.len();
    // dynamic shared memory of the kernels that take it (the pipelined matmuls)
    let smem = specs
        .iter()
        .filter_map(|s| match s.launch() {
            Launch::Tile { smem, .. } => Some((s.symbol(), smem)),
            _ => None,
        })
        .collect();
    let carveout = specs.iter().filter(|s| matches!(s.launch(), Launch::Tile { carveout: true, .. })).map(|s| s.symbol()).collect();
    std::fs::write(dir.join("bundle.json"), serde_json::to_string_pretty(&Bundle { ptx, cases, smem, carveout })?)?;
    Ok(n)
}

/// The paged layout of an attention case's sequences: the block table's width, the table
/// (blocks handed out from a pool of `nb`, the free list reversed after each sequence so
/// their blocks interleave; -1 past a sequence's blocks), and each query's position and
/// sequence.
struct Paged {
    mb: usize,
    table: Vec<i32>,
    pos: Vec<i32>,
    seq: Vec<i32>,
}

/// [`Paged`] of `seqs` ((first query position, length): a sequence's queries are its positions
/// first..length) in blocks of `bs` from a pool of `nb`.
fn paged(seqs: &[(usize, usize)], bs: usize, nb: usize) -> anyhow::Result<Paged> {
    let mb = seqs.iter().map(|s| s.1.div_ceil(bs)).max().unwrap_or(1);
    let mut table = vec![];
    let mut free: Vec<i32> = (0..nb as i32).rev().collect();
    for s in seqs {
        for j in 0..mb {
            table.push(if j < s.1.div_ceil(bs) { free.pop().context("blocks")? } else { -1 });
        }
        free.reverse();
    }
    let (mut pos, mut seq) = (vec![], vec![]);
    for (si, s) in seqs.iter().enumerate() {
        for p in s.0..s.1 {
            pos.push(p as i32);
            seq.push(si as i32);
        }
    }
    Ok(Paged { mb, table, pos, seq })
}

/// A check case of one launch of `spec` with a freshly poisoned output and nothing else
/// (no initial output, no written inputs, no tensor maps, no cluster): `(grid x, threads)` as
/// [`grid`] gives them.
#[allow(clippy::too_many_arguments)]
fn case(name: String, spec: &KernelSpec, (grid, block): (u32, u32), grid_y: u32, inputs: Vec<Array>, scalars: Vec<i64>, expected: Array, tol: f32) -> Case {
    Case { name, kernel: spec.symbol(), grid, grid_y, block, inputs, scalars, expected, init: None, written_inputs: vec![], tmaps: vec![], tol, cluster: None }
}

/// `v` as a `kv` KV pool holds it (bf16: rounded to nearest even).
fn kv_round(v: &[f32], kv: DType) -> Vec<f32> {
    v.iter().map(|&x| dsc_ir::quant::round_to(kv, x)).collect()
}

/// A case name's note of a KV pool's type (none for f32).
fn kv_label(kv: DType) -> String {
    if kv == DType::F32 {
        String::new()
    } else {
        format!(" {kv} pool")
    }
}

/// A KV-writing case's tolerance: `f32` for f32 pools; a bf16 pool's values near a rounding
/// boundary may round the other way from approximate math (half a bf16 ulp, 2^-9, on a few).
fn kv_tol(kv: DType, f32_tol: f32) -> f32 {
    if kv == DType::F32 {
        f32_tol
    } else {
        4e-3
    }
}

/// The split decode attention's partial states (`KernelSpec::PagedAttentionSplit`), computed
/// on the host: for row (token t, head hi) and part s < se (`kernels::split_parts`) of
/// ceil(ctx / se) keys, (m, l, acc[d]) at ((row·ns + s)·(d + 2)); zeros elsewhere.
#[allow(clippy::too_many_arguments)]
fn split_partials(q: &[f32], kc: &[f32], vc: &[f32], pos: &[i32], seq: &[i32], table: &[i32], dims: (usize, usize, usize, usize, usize), scale: f32, ns: usize, mk: usize) -> Vec<f32> {
    let (h, kvh, d, bs, mb) = dims;
    let t = pos.len();
    let mut out = vec![0.0f32; t * h * ns * (d + 2)];
    for ti in 0..t {
        let ctx = pos[ti] as usize + 1;
        let se = dsc_codegen::kernels::split_parts(ctx, t * h, ns, mk);
        let chunk = ctx.div_ceil(se);
        for hi in 0..h {
            let kh = hi / (h / kvh);
            let qrow = &q[(ti * h + hi) * d..][..d];
            for s in 0..se {
                let (lo, hi_k) = (s * chunk, ((s + 1) * chunk).min(ctx));
                let at = |j: usize| {
                    let blk = table[seq[ti] as usize * mb + j / bs] as usize;
                    ((blk * bs + j % bs) * kvh + kh) * d
                };
                let scores: Vec<f32> = (lo..hi_k).map(|j| qrow.iter().zip(&kc[at(j)..][..d]).map(|(a, b)| a * scale * b).sum()).collect();
                let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let base = ((ti * h + hi) * ns + s) * (d + 2);
                out[base] = m;
                for (j, sc) in (lo..hi_k).zip(&scores) {
                    let p = (sc - m).exp();
                    out[base + 1] += p;
                    for (e, v) in vc[at(j)..][..d].iter().enumerate() {
                        out[base + 2 + e] += p * v;
                    }
                }
            }
        }
    }
    out
}
