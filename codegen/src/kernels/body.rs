//! [`Body`]: the family-neutral MLIR text builder every kernel is written with — SSA names,
//! constants, loads and stores, warp shuffles and reductions, mma/wgmma/ldmatrix/TMA/mbarrier
//! wrappers, shared-memory descriptors, the row-piece loops of block-per-row kernels, the GEMV
//! prologues (norm, gather) and epilogues (bias, activation, residual, copies). No kernel's
//! own logic lives here: a helper moves here when a second family needs it (the RoPE
//! arithmetic the families share is an `impl Body` block in rope.rs, the lane-split dot
//! products of the warp-per-output kernels one in dot.rs).
//!
//! Design notes (what each kernel does and why, with the measurements that chose it):
//! - Special PTX instructions (ex2/tanh/rsqrt/sin/cos `.approx`, `sqrt.rn`, `cvt.rni`) are
//!   reached through `llvm.inline_asm`; `math.*` ops would lower to libdevice calls, which we do
//!   not link.

use crate::kernels::*;

/// The body of a split-K round loop: (indices of the rounds it covers, accumulators) → the
/// new accumulators.
pub(crate) type RoundBody<'a> = dyn Fn(&mut Body, &[String], &[String]) -> Vec<String> + 'a;

/// SSA name generator and body buffer.
pub(crate) struct Body {
    pub(crate) s: String,
    pub(crate) n: usize,
    /// a `workgroup(...)` attribution (shared memory) for the gpu.func
    pub(crate) workgroup: Option<String>,
    /// what `gpu.block_id x` stands for (a merged matmul's block index within its part; the
    /// warp-specialized matmul's rasterized column tile)
    pub(crate) block_x: Option<String>,
    /// what `gpu.block_id y` stands for (the warp-specialized matmul's rasterized row tile)
    pub(crate) block_y: Option<String>,
    /// sm_90a with programmatic dependent launch: the kernel must `griddepcontrol.wait` before
    /// reading what the previous kernel wrote (at its start unless the body did: `waited`)
    pub(crate) pdl: bool,
    pub(crate) waited: bool,
    /// the block-per-row RMSNorm reads its x row through `%idx` (`KernelSpec::RowGather`)
    pub(crate) row_gather: bool,
    /// the one-row GEMV reads x as a bf16 table row through `%tok` and block 0 writes it to
    /// `%x` (`KernelSpec::GatherX`)
    pub(crate) gather_x: bool,
    /// the wide lm_head also reduces its logits' argmax (`KernelSpec::ArgmaxFold`)
    pub(crate) argmax_fold: bool,
    /// the decode GEMV normalizes its input on the way in (`KernelSpec::NormMatMul`): RMSNorm
    /// epsilon
    pub(crate) norm: Option<f32>,
    /// the matmul epilogue applies this activation after the bias (`KernelSpec::MatMulAct`)
    pub(crate) act: Option<UnaryOp>,
    /// the decode GEMV is `KernelSpec::SwiGluGemv`: outputs 0..r/2 read `%w0` (gate), r/2..r
    /// `%w1` (up) at the same rows, and the epilogue writes silu(gate) * up
    pub(crate) swiglu: bool,
    /// the pipelined matmul's SwiGLU epilogue (`SwiGluPipe`)
    pub(crate) swiglu_pipe: bool,
    /// (`QkvRopeSplitK`) q, k and v loads sum this many partial-sum slices, `%slice`
    /// elements apart
    pub(crate) sum_slices: Option<usize>,
    /// the pipelined matmul's K steps are cut into this many parts over blocks
    /// (`KernelSpec::SplitK`)
    pub(crate) split_k: Option<usize>,
    /// a split-K merged matmul: the columns of all parts (a partial-sum slice is [M, all]),
    /// where `%n` is the block's part's
    pub(crate) split_n: Option<&'static str>,
    /// the pipelined matmul's W tiles come by TMA: `%w` points at a `CUtensorMap`
    /// (`KernelSpec::Tma`)
    pub(crate) tma: bool,
    /// the pipelined matmul is warp-specialized (`KernelSpec::Ws`): x comes by TMA too, `%x`
    /// pointing at its `CUtensorMap`
    pub(crate) ws: bool,
    /// the prefill attention's products on wgmma (`KernelSpec::FlashWgmma`)
    pub(crate) flash_wg: bool,
    /// (threads a block, blocks an SM) for ptxas (`.maxntid`, `.minnctapersm`): the registers
    /// it may take, and — where loads must stay ahead of the math they feed — room to keep
    /// them there (the packed GEMV: without it ptxas sank the next round's loads to the loop's
    /// end, exposing a DRAM round trip per round)
    pub(crate) launch_bounds: Option<(u32, u32)>,
    /// (the decode attention with the o projection folded in: its N, `KernelSpec::AttentionO`)
    pub(crate) attn_o: Option<usize>,
    /// the GEMV also stores its output into `%y2` (`KernelSpec::MatMulCopy`)
    pub(crate) copy_y: bool,
    /// (`AttentionO` with `red`: the projection added into `%out` and `%out2`, over this many
    /// blocks per head)
    pub(crate) attn_o_red: bool,
    pub(crate) attn_o_splits: usize,
    /// (`AttentionO`: W_o's format, bf16 or Q4_1)
    pub(crate) attn_o_wdtype: DType,
    /// (`QkvAttentionO`: the attention computes its q, k and v from x — K, eps, blocks per
    /// cluster; 1: no cluster)
    pub(crate) qkv_in: Option<(usize, f32, usize)>,
    /// (`QkvAttentionO`: W_q, W_k and W_v's format, bf16 or Q4_1)
    pub(crate) qkv_wdtype: DType,
    /// the one-row GEMV's x row is its block row / this (the routed experts' gate/up:
    /// `top_k` block rows per token)
    pub(crate) x_row_div: Option<usize>,
    /// RoPE with YaRN's frequencies (`KernelSpec::RopeYarn`): (factor, low, high, mscale) for
    /// [`Body::rope_cos_sin`]
    pub(crate) yarn: Option<[f32; 4]>,
    /// how the body is written for this spec (the compile's `KernelOptions`)
    pub(crate) o: KernelOptions,
}

impl Body {
    pub(crate) fn v(&mut self) -> String {
        self.n += 1;
        format!("%v{}", self.n)
    }
    pub(crate) fn op(&mut self, rhs: &str) -> String {
        if rhs == "gpu.block_id x" {
            if let Some(bx) = &self.block_x {
                return bx.clone();
            }
        }
        if rhs == "gpu.block_id y" {
            if let Some(by) = &self.block_y {
                return by.clone();
            }
        }
        let v = self.v();
        let _ = writeln!(self.s, "        {v} = {rhs}");
        v
    }
    pub(crate) fn line(&mut self, l: &str) {
        let _ = writeln!(self.s, "        {l}");
    }
    pub(crate) fn cf32(&mut self, x: f32) -> String {
        // hex form: exact, and always a valid MLIR float literal
        self.op(&format!("arith.constant 0x{:08X} : f32", x.to_bits()))
    }
    pub(crate) fn asm1(&mut self, ins: &str, x: &str) -> String {
        self.op(&format!("llvm.inline_asm \"{ins} $0, $1;\", \"=f,f\" {x} : (f32) -> f32"))
    }
    pub(crate) fn exp(&mut self, x: &str) -> String {
        let l2e = self.cf32(std::f32::consts::LOG2_E);
        let t = self.op(&format!("arith.mulf {x}, {l2e} : f32"));
        self.asm1("ex2.approx.ftz.f32", &t)
    }
    pub(crate) fn sigmoid(&mut self, x: &str) -> String {
        let nx = self.op(&format!("arith.negf {x} : f32"));
        let e = self.exp(&nx);
        let one = self.cf32(1.0);
        let d = self.op(&format!("arith.addf {one}, {e} : f32"));
        self.op(&format!("arith.divf {one}, {d} : f32"))
    }
    pub(crate) fn load(&mut self, ptr: &str, idx: &str) -> String {
        let p = self.op(&format!("llvm.getelementptr {ptr}[{idx}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32"));
        self.op(&format!("llvm.load {p} : !llvm.ptr<1> -> f32"))
    }
    /// f32 element `idx` of `ptr`, or with `sum_slices` (S) the sum of elements idx + s·%slice
    /// for s < S (a split-K matmul's partial sums)
    pub(crate) fn load_summed(&mut self, ptr: &str, idx: &str) -> String {
        let mut acc = self.load(ptr, idx);
        for s in 1..self.sum_slices.unwrap_or(1) {
            let cs = self.ci64(s as i64);
            let o = self.op(&format!("arith.muli %slice, {cs} : i64"));
            let at = self.op(&format!("arith.addi {idx}, {o} : i64"));
            let v = self.load(ptr, &at);
            acc = self.op(&format!("arith.addf {acc}, {v} : f32"));
        }
        acc
    }
    pub(crate) fn store(&mut self, val: &str, ptr: &str, idx: &str) {
        let p = self.op(&format!("llvm.getelementptr {ptr}[{idx}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32"));
        self.line(&format!("llvm.store {val}, {p} : f32, !llvm.ptr<1>"));
    }
    pub(crate) fn ci64(&mut self, v: i64) -> String {
        self.op(&format!("arith.constant {v} : i64"))
    }
    /// load a scalar of MLIR type `ty` at element index `idx` (i64) of `ptr`
    pub(crate) fn load_t(&mut self, ptr: &str, idx: &str, ty: &str) -> String {
        let p = self.op(&format!("llvm.getelementptr {ptr}[{idx}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, {ty}"));
        self.op(&format!("llvm.load {p} : !llvm.ptr<1> -> {ty}"))
    }
    /// `n` scalars of MLIR type `ty` from one aligned vector load at byte offset `off`
    pub(crate) fn load_vec(&mut self, ptr: &str, off: &str, n: usize, ty: &str, align: usize) -> Vec<String> {
        let v = self.load_vector(ptr, off, n, ty, align);
        self.elements(&v, n, ty)
    }
    /// `n` f32 of `ptr` from byte offset `at` (i64), one 16-byte load per 4
    pub(crate) fn load_f32s(&mut self, ptr: &str, at: &str, n: usize) -> Vec<String> {
        let mut v = vec![];
        for q in 0..n / 4 {
            let off = if q == 0 {
                at.to_string()
            } else {
                let o = self.ci64(16 * q as i64);
                self.op(&format!("arith.addi {at}, {o} : i64"))
            };
            v.extend(self.load_vec(ptr, &off, 4, "f32", 16));
        }
        v
    }
    /// `acc` + the dot product of `words` (i32 words of two bf16 each, low half first) with
    /// `xs` (two floats per word), one fma at a time in order
    pub(crate) fn fma_bf16_words(&mut self, acc: &str, words: &[String], xs: &[String]) -> String {
        let mut a = acc.to_string();
        for (q, word) in words.iter().enumerate() {
            let [lo, hi] = self.bf16_pair(word);
            a = self.op(&format!("llvm.intr.fma({lo}, {}, {a}) : (f32, f32, f32) -> f32", xs[2 * q]));
            a = self.op(&format!("llvm.intr.fma({hi}, {}, {a}) : (f32, f32, f32) -> f32", xs[2 * q + 1]));
        }
        a
    }
    /// The set bits of the i32 `x` (`popc`)
    pub(crate) fn popc(&mut self, x: &str) -> String {
        self.op(&format!("llvm.inline_asm \"popc.b32 $0, $1;\", \"=r,r\" {x} : (i32) -> i32"))
    }
    /// The lowest set bit of the nonzero i32 `m`: (that bit alone as i32, its index as i64) —
    /// the walk over a ballot's lanes, lowest first (clear it with `xori m, bit`)
    pub(crate) fn lowest_bit(&mut self, m: &str) -> (String, String) {
        let z32 = self.op("arith.constant 0 : i32");
        let one = self.op("arith.constant 1 : i32");
        let neg = self.op(&format!("arith.subi {z32}, {m} : i32"));
        let low = self.op(&format!("arith.andi {m}, {neg} : i32"));
        let lm1 = self.op(&format!("arith.subi {low}, {one} : i32"));
        let bit = self.popc(&lm1);
        let bit = self.op(&format!("arith.extui {bit} : i32 to i64"));
        (low, bit)
    }
    /// The two 16-bit floats of each i32 word (`dtype` bf16 or f16) as f32, low halves first
    pub(crate) fn half_words(&mut self, words: &[String], dtype: DType) -> Vec<String> {
        words.iter().flat_map(|w| if dtype == DType::BF16 { self.bf16_pair(w) } else { self.f16_pair(w) }).collect()
    }
    /// A cluster barrier every thread of the cluster passes: the arrival releases what the
    /// thread wrote (e.g. into another block's shared memory), the wait acquires the others'
    pub(crate) fn cluster_barrier(&mut self) {
        self.line("llvm.inline_asm has_side_effects \"barrier.cluster.arrive.release;\", \"\" : () -> ()");
        self.line("llvm.inline_asm has_side_effects \"barrier.cluster.wait.acquire;\", \"\" : () -> ()");
    }
    /// The warp's ballot of the i1 `bit` (all 32 lanes taking part): bit l of the i32 result
    /// set where lane l's `bit` is
    pub(crate) fn ballot(&mut self, bit: &str) -> String {
        let w = self.op(&format!("arith.extui {bit} : i1 to i32"));
        self.op(&format!("llvm.inline_asm has_side_effects \"{{ .reg .pred p; setp.ne.u32 p, $1, 0; vote.sync.ballot.b32 $0, p, 0xffffffff; }}\", \"=r,r\" {w} : (i32) -> i32"))
    }
    /// the two f16 of an i32 word as f32, the low half first
    pub(crate) fn f16_pair(&mut self, word: &str) -> [String; 2] {
        let c16 = self.op("arith.constant 16 : i32");
        let lo = self.op(&format!("arith.trunci {word} : i32 to i16"));
        let hi = self.op(&format!("arith.shrui {word}, {c16} : i32"));
        let hi = self.op(&format!("arith.trunci {hi} : i32 to i16"));
        [lo, hi].map(|h| {
            let f = self.op(&format!("arith.bitcast {h} : i16 to f16"));
            self.op(&format!("arith.extf {f} : f16 to f32"))
        })
    }
    /// Q4_1 (GGUF: 20-byte blocks of 32 elements, f16 d and min, then 16 nibble bytes —
    /// element i the low nibble of byte i, 16 + i its high nibble) in units of 8 elements, as a
    /// 16-byte bf16 piece has: unit `u` (i64) of a row is quarter t = u % 4 of block u / 4, its
    /// elements 4t..4t+3 and 16+4t..16+4t+3. Returns (the block's byte offset in the row, the
    /// unit's first element).
    pub(crate) fn q4_1_unit(&mut self, u: &str) -> (String, String) {
        let (c4, c20, c32) = (self.ci64(4), self.ci64(20), self.ci64(32));
        let blk = self.op(&format!("arith.divui {u}, {c4} : i64"));
        let t = self.op(&format!("arith.remui {u}, {c4} : i64"));
        let bo = self.op(&format!("arith.muli {blk}, {c20} : i64"));
        let eo = self.op(&format!("arith.muli {blk}, {c32} : i64"));
        let t4 = self.op(&format!("arith.muli {t}, {c4} : i64"));
        (bo, self.op(&format!("arith.addi {eo}, {t4} : i64")))
    }
    /// A Q4_1 unit's two words from the row at byte `base` of `ptr` ([`Body::q4_1_unit`]'s
    /// block offset `bo` and first element `e0`): the nibble word (bytes 4 + 4t..), then the
    /// block's d/min word
    pub(crate) fn q4_1_words(&mut self, ptr: &str, base: &str, bo: &str, e0: &str) -> Vec<String> {
        let (c4, c16) = (self.ci64(4), self.ci64(16));
        let t4 = self.op(&format!("arith.remui {e0}, {c16} : i64"));
        let qo = self.op(&format!("arith.addi {bo}, {t4} : i64"));
        let qo = self.op(&format!("arith.addi {qo}, {c4} : i64"));
        let off = self.op(&format!("arith.addi {base}, {qo} : i64"));
        let hoff = self.op(&format!("arith.addi {base}, {bo} : i64"));
        let mut w = self.load_vec(ptr, &off, 1, "i32", 4);
        w.extend(self.load_vec(ptr, &hoff, 1, "i32", 4));
        w
    }
    /// A Q4_1 unit's 8 weights from its two words ([`Body::q4_1_words`]): d·q + m, the bytes'
    /// low nibbles (elements 4t + i) first, then the high ones (16 + 4t + i)
    pub(crate) fn q4_1_weights(&mut self, words: &[String]) -> Vec<String> {
        let [d, m] = self.f16_pair(&words[1]);
        let c15 = self.op("arith.constant 15 : i32");
        [0, 8, 16, 24, 4, 12, 20, 28]
            .iter()
            .map(|shift| {
                let cs = self.op(&format!("arith.constant {shift} : i32"));
                let q = self.op(&format!("arith.shrui {}, {cs} : i32", words[0]));
                let q = self.op(&format!("arith.andi {q}, {c15} : i32"));
                let q = self.op(&format!("arith.uitofp {q} : i32 to f32"));
                self.op(&format!("llvm.intr.fma({d}, {q}, {m}) : (f32, f32, f32) -> f32"))
            })
            .collect()
    }
    /// `acc` + the dot of a Q4_1 unit's two words ([`Body::q4_1_words`]) with its 8 f32 `xs`
    pub(crate) fn fma_q4_1_words(&mut self, acc: &str, words: &[String], xs: &[String]) -> String {
        let ws = self.q4_1_weights(words);
        ws.iter().zip(xs).fold(acc.to_string(), |a, (w, x)| self.op(&format!("llvm.intr.fma({w}, {x}, {a}) : (f32, f32, f32) -> f32")))
    }
    /// The f32 of `ptr` at a Q4_1 unit's elements, `at` the byte offset of its first: 4 from
    /// there and 4 from 16 elements on
    pub(crate) fn q4_1_f32s(&mut self, ptr: &str, at: &str) -> Vec<String> {
        let mut v = self.load_vec(ptr, at, 4, "f32", 16);
        let c64 = self.ci64(64);
        let o2 = self.op(&format!("arith.addi {at}, {c64} : i64"));
        v.extend(self.load_vec(ptr, &o2, 4, "f32", 16));
        v
    }
    /// the two bf16 of an i32 word as f32: the low half shifted up, the high half masked
    pub(crate) fn bf16_pair(&mut self, word: &str) -> [String; 2] {
        let c16 = self.op("arith.constant 16 : i32");
        let lo = self.op(&format!("arith.shli {word}, {c16} : i32"));
        let m = self.op("arith.constant -65536 : i32");
        let hi = self.op(&format!("arith.andi {word}, {m} : i32"));
        [self.op(&format!("arith.bitcast {lo} : i32 to f32")), self.op(&format!("arith.bitcast {hi} : i32 to f32"))]
    }
    /// one aligned `vector<n x ty>` load at byte offset `off` of `ptr`
    pub(crate) fn load_vector(&mut self, ptr: &str, off: &str, n: usize, ty: &str, align: usize) -> String {
        let p = self.op(&format!("llvm.getelementptr {ptr}[{off}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
        self.op(&format!("llvm.load {p} {{alignment = {align} : i64}} : !llvm.ptr<1> -> vector<{n}x{ty}>"))
    }
    /// the `n` elements of vector `v` of MLIR type `ty`
    pub(crate) fn elements(&mut self, v: &str, n: usize, ty: &str) -> Vec<String> {
        (0..n).map(|i| self.element(v, i, n, ty)).collect()
    }
    /// element `i` of vector `v` (`n` elements of MLIR type `ty`)
    pub(crate) fn element(&mut self, v: &str, i: usize, n: usize, ty: &str) -> String {
        let c = self.op(&format!("arith.constant {i} : i32"));
        self.op(&format!("llvm.extractelement {v}[{c} : i32] : vector<{n}x{ty}>"))
    }
    /// i32 element as i64
    pub(crate) fn load_i32_as_i64(&mut self, ptr: &str, idx: &str) -> String {
        let v = self.load_t(ptr, idx, "i32");
        self.op(&format!("arith.extsi {v} : i32 to i64"))
    }
    /// f16 stored at byte offset `off` of `ptr`, widened to f32
    pub(crate) fn f16_at_byte(&mut self, ptr: &str, off: &str) -> String {
        let p = self.op(&format!("llvm.getelementptr {ptr}[{off}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
        let h = self.op(&format!("llvm.load {p} : !llvm.ptr<1> -> i16"));
        let f = self.op(&format!("arith.bitcast {h} : i16 to f16"));
        self.op(&format!("arith.extf {f} : f16 to f32"))
    }
    /// byte at byte offset `off` (i64), as i32 (unsigned)
    pub(crate) fn u8_at_byte(&mut self, ptr: &str, off: &str) -> String {
        let p = self.op(&format!("llvm.getelementptr {ptr}[{off}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
        let b = self.op(&format!("llvm.load {p} : !llvm.ptr<1> -> i8"));
        self.op(&format!("arith.extui {b} : i8 to i32"))
    }
    /// bf16 bits `h` (i16) widened to f32
    pub(crate) fn bf16_to_f32(&mut self, h: &str) -> String {
        let w = self.op(&format!("arith.extui {h} : i16 to i32"));
        let c = self.op("arith.constant 16 : i32");
        let sh = self.op(&format!("arith.shli {w}, {c} : i32"));
        self.op(&format!("arith.bitcast {sh} : i32 to f32"))
    }
    /// element `idx` of a plain-float buffer of `dtype`, as f32
    pub(crate) fn plain_as_f32(&mut self, ptr: &str, idx: &str, dtype: DType) -> Result<String, String> {
        Ok(match dtype {
            DType::F32 => self.load(ptr, idx),
            DType::F16 => {
                let h = self.load_t(ptr, idx, "i16");
                let f = self.op(&format!("arith.bitcast {h} : i16 to f16"));
                self.op(&format!("arith.extf {f} : f16 to f32"))
            }
            DType::BF16 => {
                let h = self.load_t(ptr, idx, "i16");
                self.bf16_to_f32(&h)
            }
            other => return Err(format!("{other} is not a plain float type")),
        })
    }
    /// f32 `val` rounded to bf16 (`f16`: f16, saturating as [`Body::pack2`]) at element `idx`
    /// (i64) of the 16-bit buffer `ptr`
    pub(crate) fn store_half1(&mut self, val: &str, ptr: &str, idx: &str, f16: bool) {
        let v = if f16 {
            let big = self.cf32(65504.0);
            let nbig = self.cf32(-65504.0);
            let a = self.op(&format!("arith.minimumf {val}, {big} : f32"));
            self.op(&format!("arith.maximumf {a}, {nbig} : f32"))
        } else {
            val.to_string()
        };
        let ins = if f16 { "cvt.rn.f16.f32" } else { "cvt.rn.bf16.f32" };
        let h = self.op(&format!("llvm.inline_asm \"{ins} $0, $1;\", \"=h,f\" {v} : (f32) -> i16"));
        let p = self.op(&format!("llvm.getelementptr {ptr}[{idx}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i16"));
        self.line(&format!("llvm.store {h}, {p} : i16, !llvm.ptr<1>"));
    }
    /// f32 `val` stored at element `idx` (i64) of a KV pool of `kv` (f32, or bf16 rounded to
    /// nearest even)
    pub(crate) fn store_kv(&mut self, val: &str, ptr: &str, idx: &str, kv: DType) -> Result<(), String> {
        match kv {
            DType::F32 => self.store(val, ptr, idx),
            DType::BF16 => self.store_half1(val, ptr, idx, false),
            other => return Err(format!("{other} KV caches are not lowered for the GPU (f32 or bf16)")),
        }
        Ok(())
    }
    /// `n` consecutive elements (1, 2, 4 or 8) from element `e` (i64, a multiple of `n`) of a KV
    /// pool of `kv` (f32 or bf16), as f32: one vector load
    pub(crate) fn load_kv(&mut self, ptr: &str, e: &str, n: usize, kv: DType) -> Result<Vec<String>, String> {
        let size = match kv {
            DType::F32 => 4,
            DType::BF16 => 2,
            other => return Err(format!("{other} KV caches are not lowered for the GPU (f32 or bf16)")),
        };
        if n == 1 {
            return Ok(vec![self.plain_as_f32(ptr, e, kv)?]);
        }
        // (at most 16 bytes per load)
        let most = 16 / size as usize;
        if n > most {
            let mut out = vec![];
            for c in 0..n / most {
                let co = self.ci64((c * most) as i64);
                let ec = self.op(&format!("arith.addi {e}, {co} : i64"));
                out.extend(self.load_kv(ptr, &ec, most, kv)?);
            }
            return Ok(out);
        }
        let cs = self.ci64(size);
        let by = self.op(&format!("arith.muli {e}, {cs} : i64"));
        if kv == DType::F32 {
            return Ok(self.load_vec(ptr, &by, n, "f32", 4 * n));
        }
        let hs = self.load_vec(ptr, &by, n, "i16", 2 * n);
        Ok(hs.iter().map(|h| self.bf16_to_f32(h)).collect())
    }
    /// warp-per-row prologue: opens `scf.if row < %rows`; returns (lane, row base, d, 32) as
    /// index values
    pub(crate) fn open_row(&mut self, d: usize, rows_per_block: u32) -> (String, String, String, String) {
        let t = self.op("gpu.thread_id x");
        let blk = self.op("gpu.block_id x");
        let c32 = self.op("arith.constant 32 : index");
        let lane = self.op(&format!("arith.remui {t}, {c32} : index"));
        let warp = self.op(&format!("arith.divui {t}, {c32} : index"));
        let rpb = self.op(&format!("arith.constant {rows_per_block} : index"));
        let r0 = self.op(&format!("arith.muli {blk}, {rpb} : index"));
        let row = self.op(&format!("arith.addi {r0}, {warp} : index"));
        let rowi = self.op(&format!("arith.index_cast {row} : index to i64"));
        let ok = self.op(&format!("arith.cmpi slt, {rowi}, %rows : i64"));
        self.line(&format!("scf.if {ok} {{"));
        let dd = self.op(&format!("arith.constant {d} : index"));
        let base = self.op(&format!("arith.muli {row}, {dd} : index"));
        (lane, base, dd, c32)
    }
    /// sum over the row: scf.for lane..d step 32 of f(x[base+i]) then a warp reduction
    pub(crate) fn row_reduce(&mut self, lane: &str, base: &str, dd: &str, c32: &str, f: &dyn Fn(&mut Body, &str) -> String, max: bool) -> String {
        let init = if max { self.op("arith.constant 0xFF800000 : f32") } else { self.cf32(0.0) };
        let acc = self.v();
        let (iv, a) = (self.v(), self.v());
        self.line(&format!("{acc} = scf.for {iv} = {lane} to {dd} step {c32} iter_args({a} = {init}) -> (f32) {{"));
        let idx = self.op(&format!("arith.addi {base}, {iv} : index"));
        let idx = self.op(&format!("arith.index_cast {idx} : index to i64"));
        let x = self.load("%x", &idx);
        let v = f(self, &x);
        let a2 = if max { self.op(&format!("arith.maximumf {a}, {v} : f32")) } else { self.op(&format!("arith.addf {a}, {v} : f32")) };
        self.line(&format!("scf.yield {a2} : f32"));
        self.line("}");
        self.warp_reduce(&acc, if max { "arith.maximumf" } else { "arith.addf" })
    }
    /// (a + b) + (c + d)
    /// 1 / sqrt(sum_sq / d + eps): RMSNorm's scale from a row's sum of squares
    pub(crate) fn inv_rms(&mut self, sum_sq: &str, d: usize, eps: f32) -> String {
        let df = self.cf32(d as f32);
        let mean = self.op(&format!("arith.divf {sum_sq}, {df} : f32"));
        let ec = self.cf32(eps);
        let me = self.op(&format!("arith.addf {mean}, {ec} : f32"));
        let sd = self.asm1("sqrt.rn.f32", &me);
        let one = self.cf32(1.0);
        self.op(&format!("arith.divf {one}, {sd} : f32"))
    }
    pub(crate) fn sum4(&mut self, v: &[String]) -> String {
        let a = self.op(&format!("arith.addf {}, {} : f32", v[0], v[1]));
        let c = self.op(&format!("arith.addf {}, {} : f32", v[2], v[3]));
        self.op(&format!("arith.addf {a}, {c} : f32"))
    }
    pub(crate) fn warp_sum(&mut self, x: &str) -> String {
        self.warp_reduce(x, "arith.addf")
    }
    /// The warp sums of several values at once (every lane gets all of them): a transposing
    /// butterfly — at xor offset o each lane keeps half of its values and adds the partner's
    /// copy of them, sending the other half (one shuffle per pair) — then the sum's last
    /// offsets, then each sum broadcast from a lane holding it. For n values padded to P (a
    /// power of two ≤ 32): P - 1 + 5 - log2 P + n shuffles instead of 5n. `lane` (i32) is the
    /// thread's lane.
    pub(crate) fn warp_sums(&mut self, xs: &[String], lane: &str) -> Vec<String> {
        let n = xs.len();
        if n <= 1 {
            return xs.iter().map(|x| self.warp_sum(x)).collect();
        }
        let p = n.next_power_of_two().min(32);
        if p < n {
            return xs.iter().map(|x| self.warp_sum(x)).collect();
        }
        let zero = self.cf32(0.0);
        let mut c: Vec<String> = xs.iter().cloned().chain(std::iter::repeat_n(zero, p - n)).collect();
        let w32 = self.op("arith.constant 32 : i32");
        let z32 = self.op("arith.constant 0 : i32");
        let levels = p.trailing_zeros() as usize;
        for k in 0..levels {
            let off = 16i32 >> k;
            let o = self.op(&format!("arith.constant {off} : i32"));
            let lb = self.op(&format!("arith.andi {lane}, {o} : i32"));
            let hi = self.op(&format!("arith.cmpi ne, {lb}, {z32} : i32"));
            let half = c.len() / 2;
            let mut next = vec![];
            for i in 0..half {
                let send = self.op(&format!("arith.select {hi}, {}, {} : f32", c[i], c[i + half]));
                let keep = self.op(&format!("arith.select {hi}, {}, {} : f32", c[i + half], c[i]));
                let (sh, valid) = (self.v(), self.v());
                self.line(&format!("{sh}, {valid} = gpu.shuffle xor {send}, {o}, {w32} : f32"));
                next.push(self.op(&format!("arith.addf {keep}, {sh} : f32")));
            }
            c = next;
        }
        let rest: Vec<i32> = (levels..5).map(|k| 16 >> k).collect();
        let total = self.xor_reduce(&c[0], "arith.addf", &rest);
        // (value i's sum is in the lanes whose bits 16 >> k are i's bits from the top)
        (0..n)
            .map(|i| {
                let src: i32 = (0..levels).map(|k| if (i >> (levels - 1 - k)) & 1 == 1 { 16 >> k } else { 0 }).sum();
                let s = self.op(&format!("arith.constant {src} : i32"));
                let (sh, valid) = (self.v(), self.v());
                self.line(&format!("{sh}, {valid} = gpu.shuffle idx {total}, {s}, {w32} : f32"));
                sh
            })
            .collect()
    }
    /// butterfly reduction over the warp with `combine` (arith.addf / arith.maximumf); every
    /// lane gets the result
    pub(crate) fn warp_reduce(&mut self, x: &str, combine: &str) -> String {
        self.xor_reduce(x, combine, &[16, 8, 4, 2, 1])
    }
    /// `combine` of `x` over the lanes whose index differs in the bits of `offsets` (xor
    /// shuffles: [16, 8, 4, 2, 1] is the whole warp, [1, 2] an mma fragment's quad)
    pub(crate) fn xor_reduce(&mut self, x: &str, combine: &str, offsets: &[i32]) -> String {
        let w32 = self.op("arith.constant 32 : i32");
        let mut total = x.to_string();
        for off in offsets {
            let o = self.op(&format!("arith.constant {off} : i32"));
            let (sh, valid) = (self.v(), self.v());
            self.line(&format!("{sh}, {valid} = gpu.shuffle xor {total}, {o}, {w32} : f32"));
            total = self.op(&format!("{combine} {total}, {sh} : f32"));
        }
        total
    }
    /// warp-wide (max value, its index), the lower index winning ties; every lane gets it
    pub(crate) fn warp_argmax(&mut self, v: &str, i: &str) -> (String, String) {
        let w32 = self.op("arith.constant 32 : i32");
        let (mut v, mut i) = (v.to_string(), i.to_string());
        for off in [16, 8, 4, 2, 1] {
            let o = self.op(&format!("arith.constant {off} : i32"));
            let (sv, p1, si, p2) = (self.v(), self.v(), self.v(), self.v());
            self.line(&format!("{sv}, {p1} = gpu.shuffle xor {v}, {o}, {w32} : f32"));
            self.line(&format!("{si}, {p2} = gpu.shuffle xor {i}, {o}, {w32} : i32"));
            (v, i) = argmax_take(self, &v, &i, &sv, &si);
        }
        (v, i)
    }
    pub(crate) fn idx64(&mut self, i: &str) -> String {
        self.op(&format!("arith.index_cast {i} : index to i64"))
    }
    /// one element of a weight row-major buffer of `dtype` (plain or GGUF blocks), as f32;
    /// `e` is the flat element index (rows a multiple of 32 for block formats)
    pub(crate) fn weight_elem(&mut self, ptr: &str, e: &str, dtype: DType) -> Result<String, String> {
        Ok(match dtype {
            DType::F32 | DType::F16 | DType::BF16 => self.plain_as_f32(ptr, e, dtype)?,
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 => gguf_block_elem(self, ptr, e, dtype),
            DType::I4G128 => i4g128_elem(self, ptr, e),
            DType::F8G128 => f8g128_elem(self, ptr, e),
            d if kquant_dtype(d) => kquant_elem(self, ptr, e, d),
            other => return Err(weight_elem_fits(other).expect_err("not a weight type the kernels read")),
        })
    }
    /// `vector<N x ty>` of the scalars `elems` (N = elems.len())
    pub(crate) fn vector(&mut self, elems: &[String], ty: &str) -> String {
        let n = elems.len();
        let mut v = self.op(&format!("llvm.mlir.undef : vector<{n}x{ty}>"));
        for (j, e) in elems.iter().enumerate() {
            let cj = self.op(&format!("arith.constant {j} : i32"));
            v = self.op(&format!("llvm.insertelement {e}, {v}[{cj} : i32] : vector<{n}x{ty}>"));
        }
        v
    }
    /// four f32 rounded to bf16 (f16) and stored as one 8-byte vector at element `e` (i64, a
    /// multiple of 4) of the 16-bit buffer `ptr`
    pub(crate) fn store_half4(&mut self, ys: &[String], ptr: &str, e: &str, f16: bool) {
        let lo = self.pack2(&ys[0], &ys[1], f16);
        let hi = self.pack2(&ys[2], &ys[3], f16);
        let v = self.vector(&[lo, hi], "i32");
        let c2 = self.ci64(2);
        let bo = self.op(&format!("arith.muli {e}, {c2} : i64"));
        let p = self.op(&format!("llvm.getelementptr {ptr}[{bo}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
        self.line(&format!("llvm.store {v}, {p} {{alignment = 8 : i64}} : vector<2xi32>, !llvm.ptr<1>"));
    }
    /// two f32 packed as bf16x2 (or f16x2, saturating to the largest finite f16 rather than
    /// overflowing to inf): `lo` in the low half
    pub(crate) fn pack2(&mut self, lo: &str, hi: &str, f16: bool) -> String {
        let (lo, hi) = if f16 {
            // (cvt's .satfinite needs PTX 8.1; LLVM emits an older ISA version)
            let big = self.cf32(65504.0);
            let nbig = self.cf32(-65504.0);
            let mut sat = |v: &str| {
                let a = self.op(&format!("arith.minimumf {v}, {big} : f32"));
                self.op(&format!("arith.maximumf {a}, {nbig} : f32"))
            };
            (sat(lo), sat(hi))
        } else {
            (lo.to_string(), hi.to_string())
        };
        let ins = if f16 { "cvt.rn.f16x2.f32" } else { "cvt.rn.bf16x2.f32" };
        self.op(&format!("llvm.inline_asm \"{ins} $0, $1, $2;\", \"=r,f,f\" {hi}, {lo} : (f32, f32) -> i32"))
    }
    /// `prmt.b32`: the bytes of (`a`, `b`) picked by `sel` (one nibble per result byte, 0-3 `a`'s, 4-7 `b`'s)
    pub(crate) fn prmt(&mut self, a: &str, b: &str, sel: u32) -> String {
        self.op(&format!("llvm.inline_asm \"prmt.b32 $0, $1, $2, {sel:#x};\", \"=r,r,r\" {a}, {b} : (i32, i32) -> i32"))
    }
    /// One row's 8 elements of a GGUF block as f16 pairs, from the words [`MmaTiles`] loads
    /// (`raw`: the quant word(s), then the header: Q4_1's i32 (f16 d low, f16 min high), the
    /// others' i16 d), each value rounded once:
    /// - Q4_0 / Q4_1: the nibble word holds bytes 4t..4t+3 (elements 4t+i low, 16+4t+i high);
    ///   the words are (4t, 4t+2), (4t+1, 4t+3), (16+4t, 16+4t+2), (16+4t+1, 16+4t+3). Each
    ///   nibble pair is or-ed into f16 1024's bits (1024 + q exactly), 1024 (Q4_0: 1032) taken
    ///   off exactly, then one `fma.rn.f16x2` d·q + m (Q4_0: `mul` d·(q − 8)).
    /// - Q8_0: words (8t, 8t+1) .. (8t+6, 8t+7): each byte xor 0x80 under f16 1024's high byte
    ///   (`prmt`: 1024 + q + 128 exactly), 1152 taken off, one `mul.rn.f16x2` by d.
    ///
    /// [`MmaTiles`]: crate::kernels::MmaTiles
    pub(crate) fn gguf_f16_words(&mut self, dtype: DType, raw: &[String]) -> [String; 4] {
        let st = "!llvm.struct<(i32, i32, i32, i32)>";
        let asm = match dtype {
            DType::Q4_0 | DType::Q4_1 => {
                let q1 = dtype == DType::Q4_1;
                let hdr = if q1 { raw[1].clone() } else { self.op(&format!("arith.extui {} : i16 to i32", raw[1])) };
                let mut asm = format!("{{ .reg .b32 d2, m2, k, t, u; prmt.b32 d2, $5, $5, 0x1010; prmt.b32 m2, $5, $5, 0x3232; mov.b32 k, {}; ", if q1 { "0x64006400" } else { "0x64086408" });
                for (o, shift) in [0, 8, 4, 12].iter().enumerate() {
                    if *shift == 0 {
                        asm.push_str("mov.b32 u, $4; ");
                    } else {
                        asm.push_str(&format!("shr.u32 u, $4, {shift}; "));
                    }
                    asm.push_str("lop3.b32 t, u, 0x000F000F, 0x64006400, 0xEA; sub.f16x2 t, t, k; ");
                    asm.push_str(&if q1 { format!("fma.rn.f16x2 ${o}, t, d2, m2; ") } else { format!("mul.rn.f16x2 ${o}, t, d2; ") });
                }
                asm.push('}');
                format!("llvm.inline_asm \"{asm}\", \"=r,=r,=r,=r,r,r\" {}, {hdr} : (i32, i32) -> {st}", raw[0])
            }
            DType::Q8_0 => {
                let hdr = self.op(&format!("arith.extui {} : i16 to i32", raw[2]));
                let mut asm = String::from("{ .reg .b32 d2, k, h, t, u; prmt.b32 d2, $6, $6, 0x1010; mov.b32 k, 0x64806480; mov.b32 h, 0x64646464; ");
                for w in 0..2 {
                    asm.push_str(&format!("xor.b32 u, ${}, 0x80808080; ", 4 + w));
                    for (half, sel) in [(0, "0x4140"), (1, "0x4342")] {
                        asm.push_str(&format!("prmt.b32 t, u, h, {sel}; sub.f16x2 t, t, k; mul.rn.f16x2 ${}, t, d2; ", 2 * w + half));
                    }
                }
                asm.push('}');
                format!("llvm.inline_asm \"{asm}\", \"=r,=r,=r,=r,r,r,r\" {}, {}, {hdr} : (i32, i32, i32) -> {st}", raw[0], raw[1])
            }
            other => unreachable!("gguf_f16_words: {other} is not a GGUF block format the batched GEMV takes"),
        };
        let r = self.op(&asm);
        [0, 1, 2, 3].map(|i| self.op(&format!("llvm.extractvalue {r}[{i}] : {st}")))
    }
    /// `mma.sync m16n8k16` (f32 accumulators, `ty` = bf16 or f16 operands): A fragment `a`
    /// (4 x i32), B fragment `b0`, `b1`, accumulators `acc` (4 x f32); returns the new four.
    pub(crate) fn mma_m16n8k16(&mut self, ty: &str, a: [&str; 4], b0: &str, b1: &str, acc: [&str; 4]) -> Vec<String> {
        let st = "!llvm.struct<(f32, f32, f32, f32)>";
        let r = self.op(&format!(
            "llvm.inline_asm \"mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32 {{$0,$1,$2,$3}}, {{$4,$5,$6,$7}}, {{$8,$9}}, {{$10,$11,$12,$13}};\", \"=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f\" {}, {}, {}, {}, {b0}, {b1}, {}, {}, {}, {} : (i32, i32, i32, i32, i32, i32, f32, f32, f32, f32) -> {st}",
            a[0], a[1], a[2], a[3], acc[0], acc[1], acc[2], acc[3]
        ));
        (0..4).map(|i| self.op(&format!("llvm.extractvalue {r}[{i}] : {st}"))).collect()
    }
    /// `ldmatrix.sync.aligned.m8n8.x{n}[.trans].shared.b16` (n = 2 or 4) from this lane's row
    /// address `addr` (i64, shared window) + `off` bytes (an immediate of the instruction: one
    /// base register serves a tile's loads): the n fragment registers (i32). Marked with side
    /// effects so it stays between the barriers that guard the tile it reads.
    pub(crate) fn ldmatrix(&mut self, addr: &str, off: i64, n: usize, trans: bool) -> Vec<String> {
        let a = self.op(&format!("arith.trunci {addr} : i64 to i32"));
        let st = format!("!llvm.struct<({})>", vec!["i32"; n].join(", "));
        let outs = (0..n).map(|i| format!("${i}")).collect::<Vec<_>>().join(",");
        let cons = vec!["=r"; n].join(",");
        let r = self.op(&format!(
            "llvm.inline_asm has_side_effects \"ldmatrix.sync.aligned.m8n8.x{n}{}.shared.b16 {{{outs}}}, [${n}+{off}];\", \"{cons},r\" {a} : (i32) -> {st}",
            if trans { ".trans" } else { "" }
        ));
        (0..n).map(|i| self.op(&format!("llvm.extractvalue {r}[{i}] : {st}"))).collect()
    }
    /// The D fragments of an m64nN warpgroup MMA (or an m16 mma per warp) stored through
    /// `matmul_store`: this thread's rows `ra` and `ra` + 8, columns `n0` + 8j + 2 tq (+1),
    /// value 4j + q of `vals`, each guarded by `%m` / `%n`.
    pub(crate) fn store_d_fragments(&mut self, ra: &str, n0: &str, tq: &str, cols: usize, vals: &[String], bias: bool, residual: bool) {
        let c8 = self.ci64(8);
        let c1 = self.ci64(1);
        let c2 = self.ci64(2);
        let rb = self.op(&format!("arith.addi {ra}, {c8} : i64"));
        let tq2 = self.op(&format!("arith.muli {tq}, {c2} : i64"));
        let nc = self.op(&format!("arith.addi {n0}, {tq2} : i64"));
        for j in 0..(cols / 8) as i64 {
            let cj = self.ci64(8 * j);
            let col0 = self.op(&format!("arith.addi {nc}, {cj} : i64"));
            for (q, row) in [(0usize, ra), (1, ra), (2, &rb), (3, &rb)] {
                let col = if q % 2 == 0 { col0.clone() } else { self.op(&format!("arith.addi {col0}, {c1} : i64")) };
                let rok = self.op(&format!("arith.cmpi slt, {row}, %m : i64"));
                let cok = self.op(&format!("arith.cmpi slt, {col}, %n : i64"));
                let both = self.op(&format!("arith.andi {rok}, {cok} : i1"));
                self.line(&format!("scf.if {both} {{"));
                self.matmul_store(&vals[4 * j as usize + q], row, &col, bias, residual);
                self.line("}");
            }
        }
    }
    /// The dynamic shared memory (`%dsm`) and its address rounded up to 1 KB (i64): where the
    /// 128-byte swizzle's 1024-byte atoms start (the kernel's launch asks for the 1 KB pad)
    pub(crate) fn smem_base_1k(&mut self) -> String {
        self.line("%dsm = gpu.dynamic_shared_memory : memref<?xi8, #gpu.address_space<workgroup>>");
        let base = self.op("memref.extract_aligned_pointer_as_index %dsm : memref<?xi8, #gpu.address_space<workgroup>> -> index");
        let base = self.idx64(&base);
        let c1023 = self.ci64(1023);
        let base = self.op(&format!("arith.addi {base}, {c1023} : i64"));
        let cmask = self.ci64(!1023);
        self.op(&format!("arith.andi {base}, {cmask} : i64"))
    }
    /// A wgmma shared-memory matrix descriptor of the byte address `addr` (i64): bits 4..17 of
    /// it as the start field, OR'd with `fixed` (LBO, SBO and the swizzle mode)
    pub(crate) fn smem_desc(&mut self, addr: &str, fixed: u64) -> String {
        let mask = self.ci64(0x3FFFF);
        let c4 = self.ci64(4);
        let a = self.op(&format!("arith.andi {addr}, {mask} : i64"));
        let a = self.op(&format!("arith.shrui {a}, {c4} : i64"));
        let f = self.ci64(fixed as i64);
        self.op(&format!("arith.ori {a}, {f} : i64"))
    }
    /// The address field of a shared-memory matrix descriptor (bits 0-13: the address's bits
    /// 4-17) of the i64 address `addr`, as an i32: [`Body::desc_at`] makes descriptors from it
    pub(crate) fn smem_desc_lo(&mut self, addr: &str) -> String {
        let a = self.op(&format!("arith.trunci {addr} : i64 to i32"));
        let m = self.op("arith.constant 262143 : i32");
        let a = self.op(&format!("arith.andi {a}, {m} : i32"));
        let c4 = self.op("arith.constant 4 : i32");
        self.op(&format!("arith.shrui {a}, {c4} : i32"))
    }
    /// [`Body::smem_desc`] of the address `off` bytes past the one whose address field is `lo`
    /// ([`Body::smem_desc_lo`]): one 32-bit add on the low word (the field cannot carry out of
    /// its 14 bits: shared addresses are below 256 KB), the high word a constant — in place of
    /// 64-bit adds, shifts and masks per descriptor (~7 instructions each in the SASS)
    pub(crate) fn desc_at(&mut self, lo: &str, off: usize, fixed: u64) -> String {
        let c = self.op(&format!("arith.constant {} : i32", ((off as u64 >> 4) + (fixed & 0xFFFF_FFFF)) as u32 as i32));
        let l = self.op(&format!("arith.addi {lo}, {c} : i32"));
        let l = self.op(&format!("arith.extui {l} : i32 to i64"));
        let h = self.ci64((fixed & !0xFFFF_FFFF) as i64);
        self.op(&format!("arith.ori {l}, {h} : i64"))
    }
    /// One `wgmma.mma_async.sync.aligned.{shape}` (e.g. m64n64k16) of 16-bit `ty` operands:
    /// `acc` (f32) += A · B, A one shared-memory descriptor or four registers of m16n8k16
    /// fragments per warp, B the descriptor `b_desc`, read N-major where `trans_b`. The new
    /// accumulators are in flight until [`Body::wgmma_wait`]
    pub(crate) fn wgmma(&mut self, shape: &str, ty: &str, acc: &[String], a: &[String], b_desc: &str, trans_b: bool) -> Vec<String> {
        let n = acc.len();
        let f32s = vec!["f32"; n].join(", ");
        let stt = format!("!llvm.struct<({f32s})>");
        let outs: Vec<String> = (0..n).map(|i| format!("${i}")).collect();
        let tied = (0..n).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
        let tb = trans_b as u8;
        let r = if let [ad] = a {
            self.op(&format!(
                "llvm.inline_asm has_side_effects \"wgmma.mma_async.sync.aligned.{shape}.f32.{ty}.{ty} {{{}}}, ${n}, ${}, 1, 1, 1, 0, {tb};\", \"{},l,l,{tied}\" {ad}, {b_desc}, {} : (i64, i64, {f32s}) -> {stt}",
                outs.join(","),
                n + 1,
                vec!["=f"; n].join(","),
                acc.join(", ")
            ))
        } else {
            self.op(&format!(
                "llvm.inline_asm has_side_effects \"wgmma.mma_async.sync.aligned.{shape}.f32.{ty}.{ty} {{{}}}, {{${}, ${}, ${}, ${}}}, ${}, 1, 1, 1, {tb};\", \"{},r,r,r,r,l,{tied}\" {}, {b_desc}, {} : (i32, i32, i32, i32, i64, {f32s}) -> {stt}",
                outs.join(","),
                n,
                n + 1,
                n + 2,
                n + 3,
                n + 4,
                vec!["=f"; n].join(","),
                a.join(", "),
                acc.join(", ")
            ))
        };
        (0..n).map(|i| self.op(&format!("llvm.extractvalue {r}[{i}] : {stt}"))).collect()
    }
    /// `wgmma.wait_group n` (all wgmma groups done but the newest `n`), the accumulators
    /// `vals` passing through it so nothing reads them early
    pub(crate) fn wgmma_wait(&mut self, n: usize, vals: &[String]) -> Vec<String> {
        let k = vals.len();
        let f32s = vec!["f32"; k].join(", ");
        let stt = format!("!llvm.struct<({f32s})>");
        let cons = format!("{},{}", vec!["=f"; k].join(","), (0..k).map(|i| i.to_string()).collect::<Vec<_>>().join(","));
        let r = self.op(&format!("llvm.inline_asm has_side_effects \"wgmma.wait_group.sync.aligned {n};\", \"{cons}\" {} : ({f32s}) -> {stt}", vals.join(", ")));
        (0..k).map(|i| self.op(&format!("llvm.extractvalue {r}[{i}] : {stt}"))).collect()
    }
    /// [`Body::store_d_fragments`] for a whole wgmma tile of `cols` columns from `n0`: where
    /// both of this thread's rows are below %m, the tile's columns below %n and %n is even, the
    /// fragments go out as 8-byte pairs, each group of `chunk` column groups' residual and bias
    /// pairs loaded first (all in flight at once: the per-element path waits for each load in
    /// turn, y and res possibly aliasing); elsewhere the per-element path.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn store_d_tile(&mut self, ra: &str, n0: &str, tq: &str, cols: usize, vals: &[String], bias: bool, residual: bool, chunk: usize) {
        let c8 = self.ci64(8);
        let c1 = self.ci64(1);
        let c2 = self.ci64(2);
        let c0 = self.ci64(0);
        let rb = self.op(&format!("arith.addi {ra}, {c8} : i64"));
        let rok = self.op(&format!("arith.cmpi slt, {rb}, %m : i64"));
        let cc = self.ci64(cols as i64);
        let ne = self.op(&format!("arith.addi {n0}, {cc} : i64"));
        let cok = self.op(&format!("arith.cmpi sle, {ne}, %n : i64"));
        let odd = self.op(&format!("arith.andi %n, {c1} : i64"));
        let even = self.op(&format!("arith.cmpi eq, {odd}, {c0} : i64"));
        let full = self.op(&format!("arith.andi {rok}, {cok} : i1"));
        let full = self.op(&format!("arith.andi {full}, {even} : i1"));
        self.line(&format!("scf.if {full} {{"));
        let tq2 = self.op(&format!("arith.muli {tq}, {c2} : i64"));
        let nc = self.op(&format!("arith.addi {n0}, {tq2} : i64"));
        let c4 = self.ci64(4);
        let ya = self.op(&format!("arith.muli {ra}, %n : i64"));
        let yb = self.op(&format!("arith.muli {rb}, %n : i64"));
        let groups: Vec<usize> = (0..cols / 8).collect();
        for ch in groups.chunks(chunk.max(1)) {
            // (element offsets: columns, and (row, column) of y and res)
            let mut at = vec![];
            for &j in ch {
                let cj = self.ci64(8 * j as i64);
                let col = self.op(&format!("arith.addi {nc}, {cj} : i64"));
                let ia = self.op(&format!("arith.addi {ya}, {col} : i64"));
                let ib = self.op(&format!("arith.addi {yb}, {col} : i64"));
                at.push((col, ia, ib));
            }
            let bytes = |b: &mut Body, e: &str| b.op(&format!("arith.muli {e}, {c4} : i64"));
            let mut loaded = vec![];
            for (col, ia, ib) in &at {
                let bv = if bias {
                    let o = bytes(self, col);
                    Some(self.load_vec("%bias", &o, 2, "f32", 8))
                } else {
                    None
                };
                let rv = if residual {
                    let oa = bytes(self, ia);
                    let ob = bytes(self, ib);
                    Some((self.load_vec("%res", &oa, 2, "f32", 8), self.load_vec("%res", &ob, 2, "f32", 8)))
                } else {
                    None
                };
                loaded.push((bv, rv));
            }
            for (k, &j) in ch.iter().enumerate() {
                let (bv, rv) = &loaded[k];
                for (h, idx) in [(0usize, &at[k].1), (2, &at[k].2)] {
                    let mut out = vec![];
                    for e in 0..2 {
                        let mut v = vals[4 * j + h + e].clone();
                        if let Some(bv) = bv {
                            v = self.op(&format!("arith.addf {v}, {} : f32", bv[e]));
                        }
                        if let Some(a) = self.act {
                            v = unary_expr(self, a, &v).unwrap_or(v);
                        }
                        if let Some((r0, r1)) = rv {
                            let r = if h == 0 { &r0[e] } else { &r1[e] };
                            v = self.op(&format!("arith.addf {v}, {r} : f32"));
                        }
                        out.push(v);
                    }
                    let vv = self.vector(&out, "f32");
                    let o = bytes(self, idx);
                    let p = self.op(&format!("llvm.getelementptr %y[{o}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
                    self.line(&format!("llvm.store {vv}, {p} {{alignment = 8 : i64}} : vector<2xf32>, !llvm.ptr<1>"));
                }
            }
        }
        self.line("} else {");
        self.store_d_fragments(ra, n0, tq, cols, vals, bias, residual);
        self.line("}");
    }
    /// An mma fragment's coordinates of thread `t` (i64): (warp, lane, g = lane / 4, tq = lane
    /// % 4): the thread holds rows g and g + 8 of its warp's 16, columns 2 tq, 2 tq + 1 (+ 8).
    pub(crate) fn mma_coords(&mut self, t: &str) -> (String, String, String, String) {
        let c32 = self.ci64(32);
        let c4 = self.ci64(4);
        let warp = self.op(&format!("arith.divui {t}, {c32} : i64"));
        let lane = self.op(&format!("arith.remui {t}, {c32} : i64"));
        let g = self.op(&format!("arith.divui {lane}, {c4} : i64"));
        let tq = self.op(&format!("arith.remui {lane}, {c4} : i64"));
        (warp, lane, g, tq)
    }
    /// The opening of a block-per-row kernel: `scf.if row < %rows` (row = block x) opened, the
    /// caller closes it; (thread index, row as i64).
    pub(crate) fn open_block_row(&mut self) -> (String, String) {
        let t = self.op("gpu.thread_id x");
        let row = self.op("gpu.block_id x");
        let rowi = self.idx64(&row);
        let ok = self.op(&format!("arith.cmpi slt, {rowi}, %rows : i64"));
        self.line(&format!("scf.if {ok} {{"));
        (t, rowi)
    }
    /// The opening of a block-per-row kernel over rows of `d` floats, 4 per thread per loop
    /// step (`%red`: one f32 per warp of `warps`): `scf.if row < %rows` opened (the caller
    /// closes it); the loop's values.
    pub(crate) fn open_row_pieces(&mut self, d: usize, warps: usize) -> RowPieces {
        let nt = 32 * warps;
        let smt = format!("memref<{warps}xf32, #gpu.address_space<workgroup>>");
        self.workgroup = Some(format!("%red : {smt}"));
        let (t, rowi) = self.open_block_row();
        let c4 = self.op("arith.constant 4 : index");
        let t4 = self.op(&format!("arith.muli {t}, {c4} : index"));
        let dd = self.op(&format!("arith.constant {d} : index"));
        let step = self.op(&format!("arith.constant {} : index", 4 * nt));
        let dd64 = self.ci64(d as i64);
        let base = self.op(&format!("arith.muli {rowi}, {dd64} : i64"));
        let zero = self.cf32(0.0);
        let c4b = self.ci64(4);
        RowPieces { t, t4, dd, step, base, zero, c4b, smt }
    }
    /// An RMSNorm's 4-float piece at element `e` (i64) scaled: `out` = `xs` · `inv` · `gs`,
    /// and with `half` = (f16, pointer) its 16-bit copy.
    pub(crate) fn store_scaled_piece(&mut self, xs: &[String], gs: &[String], inv: &str, e: &str, out: &str, half: Option<(bool, &str)>) {
        let mut ys = vec![];
        for j in 0..4 {
            let xn = self.op(&format!("arith.mulf {}, {inv} : f32", xs[j]));
            let y = self.op(&format!("arith.mulf {xn}, {} : f32", gs[j]));
            let cj = self.ci64(j as i64);
            let yi = self.op(&format!("arith.addi {e}, {cj} : i64"));
            self.store(&y, out, &yi);
            ys.push(y);
        }
        if let Some((f16, ptr)) = half {
            self.store_half4(&ys, ptr, e, f16);
        }
    }
    /// An RMSNorm's scaling pass over the row pieces of [`Body::open_row_pieces`]: `out` =
    /// `src` · `inv` · `g` (g: one f32 per column), and with `half` = (f16, pointer) its
    /// 16-bit copy.
    pub(crate) fn scale_row_pieces(&mut self, r: &RowPieces, src: &str, g: &str, inv: &str, out: &str, half: Option<(bool, &str)>) {
        self.scale_row_pieces_from(r, src, None, g, inv, out, half)
    }
    /// [`Body::scale_row_pieces`] reading `src`'s row at element `src_base` (i64) where given
    /// (a gathered row), writing at the row's own place
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn scale_row_pieces_from(&mut self, r: &RowPieces, src: &str, src_base: Option<&str>, g: &str, inv: &str, out: &str, half: Option<(bool, &str)>) {
        let RowPieces { t4, dd, step, base, c4b, .. } = r;
        let iv2 = self.v();
        self.line(&format!("scf.for {iv2} = {t4} to {dd} step {step} {{"));
        let i = self.idx64(&iv2);
        let e = self.op(&format!("arith.addi {base}, {i} : i64"));
        let se = match src_base {
            Some(sb) => self.op(&format!("arith.addi {sb}, {i} : i64")),
            None => e.clone(),
        };
        let bo = self.op(&format!("arith.muli {se}, {c4b} : i64"));
        let wo = self.op(&format!("arith.muli {i}, {c4b} : i64"));
        let xs = self.load_vec(src, &bo, 4, "f32", 16);
        let ws = self.load_vec(g, &wo, 4, "f32", 16);
        self.store_scaled_piece(&xs, &ws, inv, &e, out, half);
        self.line("}");
    }
    /// The split-K reduce's piece of 4 floats at element `e` (i64) of a row: the `splits` partial
    /// sums (slices `slice` elements apart) added in order (+ the residual), stored as y; returns
    /// the 4 sums and the sum of their squares.
    pub(crate) fn splitk_piece(&mut self, slice: &str, e: &str, splits: usize, residual: bool) -> (Vec<String>, String) {
        let c4b = self.ci64(4);
        let mut loads = vec![];
        for sp in 0..splits {
            let cs = self.ci64(sp as i64);
            let so = self.op(&format!("arith.muli {slice}, {cs} : i64"));
            let at = self.op(&format!("arith.addi {so}, {e} : i64"));
            let bo = self.op(&format!("arith.muli {at}, {c4b} : i64"));
            loads.push(self.load_vec("%parts", &bo, 4, "f32", 16));
        }
        if residual {
            let bo = self.op(&format!("arith.muli {e}, {c4b} : i64"));
            loads.push(self.load_vec("%res", &bo, 4, "f32", 16));
        }
        let mut ys = loads[0].clone();
        for l in &loads[1..] {
            for (y, v) in ys.iter_mut().zip(l) {
                *y = self.op(&format!("arith.addf {y}, {v} : f32"));
            }
        }
        for (j, y) in ys.iter().enumerate() {
            let cj = self.ci64(j as i64);
            let yi = self.op(&format!("arith.addi {e}, {cj} : i64"));
            self.store(y, "%y", &yi);
        }
        let sq: Vec<String> = ys.iter().map(|y| self.op(&format!("arith.mulf {y}, {y} : f32"))).collect();
        let s4 = self.sum4(&sq);
        (ys, s4)
    }
    /// (lane, warp) of thread index `t` (index values)
    pub(crate) fn lane_warp(&mut self, t: &str) -> (String, String) {
        let c32 = self.op("arith.constant 32 : index");
        let lane = self.op(&format!("arith.remui {t}, {c32} : index"));
        let warp = self.op(&format!("arith.divui {t}, {c32} : index"));
        (lane, warp)
    }
    /// Sum of `v` over a block of `warps` warps (`t`: the thread index): a warp sum, one
    /// partial per warp through the shared `%red` (`smt`), a barrier, then every thread adds
    /// the partials to `init`.
    pub(crate) fn block_sum(&mut self, v: &str, t: &str, warps: usize, smt: &str, init: &str) -> String {
        let part = self.warp_sum(v);
        let (lane, warp) = self.lane_warp(&t);
        let zi = self.op("arith.constant 0 : index");
        let l0 = self.op(&format!("arith.cmpi eq, {lane}, {zi} : index"));
        self.line(&format!("scf.if {l0} {{"));
        self.line(&format!("memref.store {part}, %red[{warp}] : {smt}"));
        self.line("}");
        self.line("gpu.barrier");
        let mut total = init.to_string();
        for w in 0..warps {
            let wi = self.op(&format!("arith.constant {w} : index"));
            let v = self.op(&format!("memref.load %red[{wi}] : {smt}"));
            total = self.op(&format!("arith.addf {total}, {v} : f32"));
        }
        total
    }
    /// y at element index `i` of a [T, row] tensor (token t) into the pool row slots[t]
    pub(crate) fn store_to_slot(&mut self, y: &str, i: &str, t: &str, row: usize, cache: &str, kv: DType) -> Result<(), String> {
        let r = self.ci64(row as i64);
        let slot = self.load_i32_as_i64("%slots", t);
        let tb = self.op(&format!("arith.muli {t}, {r} : i64"));
        let sb = self.op(&format!("arith.muli {slot}, {r} : i64"));
        let o = self.op(&format!("arith.subi {i}, {tb} : i64"));
        let dst = self.op(&format!("arith.addi {sb}, {o} : i64"));
        self.store_kv(y, cache, &dst, kv)
    }
    /// The matmul epilogue: y[row, col] = v (+ bias[col]) (+ res[row, col]), row-major with
    /// `%n` columns; shared by the GEMV and the tensor-core kernels.
    pub(crate) fn matmul_store(&mut self, v: &str, row: &str, col: &str, bias: bool, residual: bool) {
        let v = if bias {
            let bv = self.load("%bias", col);
            self.op(&format!("arith.addf {v}, {bv} : f32"))
        } else {
            v.to_string()
        };
        // (the MatMulAct wrapper checked that the activation lowers)
        let v = match self.act {
            Some(a) => unary_expr(self, a, &v).unwrap_or(v),
            None => v,
        };
        let yr = self.op(&format!("arith.muli {row}, %n : i64"));
        let yi = self.op(&format!("arith.addi {yr}, {col} : i64"));
        let v = if residual {
            let r = self.load("%res", &yi);
            self.op(&format!("arith.addf {v}, {r} : f32"))
        } else {
            v
        };
        self.store(&v, "%y", &yi);
        if self.copy_y {
            self.store(&v, "%y2", &yi);
        }
    }
    /// The split-K loop of the GEMV kernels over `rounds` rounds whose item index is `base +
    /// round * stride` (i64): rounds `0..jloop` in an `scf.for`, `unroll` per iteration (the
    /// body gets their indices and the accumulators and returns the new ones), the rest one at
    /// a time under `index < limit`. Returns the `per` f32 accumulators.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn split_k_rounds(&mut self, per: usize, jloop: usize, rounds: usize, unroll: usize, base: &str, stride: i64, limit: i64, body: &RoundBody) -> Vec<String> {
        let zero = self.cf32(0.0);
        self.split_k_rounds_from(0, vec![zero; per], jloop, rounds, unroll, base, stride, limit, body)
    }
    /// [`Body::split_k_rounds`] from round `from` (a multiple of `unroll`, at most `jloop`)
    /// with the accumulators `init`: the caller ran the rounds before it (the GEMV's first
    /// rounds, whose weights it loaded before waiting for the previous kernel)
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn split_k_rounds_from(&mut self, from: usize, init: Vec<String>, jloop: usize, rounds: usize, unroll: usize, base: &str, stride: i64, limit: i64, body: &RoundBody) -> Vec<String> {
        let per = init.len();
        let tys = vec!["f32"; per].join(", ");
        let mut acc = init;
        if jloop > from {
            let res = self.v();
            let j = self.v();
            let args: Vec<String> = (0..per).map(|_| self.v()).collect();
            let lo = self.op(&format!("arith.constant {from} : index"));
            let hi = self.op(&format!("arith.constant {jloop} : index"));
            let st = self.op(&format!("arith.constant {unroll} : index"));
            let inits: Vec<String> = args.iter().zip(&acc).map(|(a, z)| format!("{a} = {z}")).collect();
            self.line(&format!("{res}:{per} = scf.for {j} = {lo} to {hi} step {st} iter_args({}) -> ({tys}) {{", inits.join(", ")));
            let j64 = self.idx64(&j);
            let cs = self.ci64(stride);
            let jo = self.op(&format!("arith.muli {j64}, {cs} : i64"));
            let ub = self.op(&format!("arith.addi {base}, {jo} : i64"));
            let idx: Vec<String> = (0..unroll)
                .map(|q| {
                    let c = self.ci64(q as i64 * stride);
                    self.op(&format!("arith.addi {ub}, {c} : i64"))
                })
                .collect();
            let out = body(self, &idx, &args);
            self.line(&format!("scf.yield {} : {tys}", out.join(", ")));
            self.line("}");
            acc = (0..per).map(|i| format!("{res}#{i}")).collect();
        }
        for jr in jloop..rounds {
            let c = self.ci64(jr as i64 * stride);
            let u = self.op(&format!("arith.addi {base}, {c} : i64"));
            let cu = self.ci64(limit);
            let ok = self.op(&format!("arith.cmpi slt, {u}, {cu} : i64"));
            let res = self.v();
            self.line(&format!("{res}:{per} = scf.if {ok} -> ({tys}) {{"));
            let out = body(self, &[u], &acc);
            self.line(&format!("scf.yield {} : {tys}", out.join(", ")));
            self.line("} else {");
            self.line(&format!("scf.yield {} : {tys}", acc.join(", ")));
            self.line("}");
            acc = (0..per).map(|i| format!("{res}#{i}")).collect();
        }
        acc
    }
    /// The GEMV norm prologue's sum of x² over the block's `nw` warps: slot `per` of each
    /// warp's `slots` partial sums in the reduction memref `%red` (of type `smt`).
    pub(crate) fn norm_sum_of_squares(&mut self, nw: usize, slots: usize, per: usize, smt: &str) -> String {
        let mut ss = self.cf32(0.0);
        for w in 0..nw {
            let at = self.op(&format!("arith.constant {} : index", w * slots + per));
            let v = self.op(&format!("memref.load %red[{at}] : {smt}"));
            ss = self.op(&format!("arith.addf {ss}, {v} : f32"));
        }
        ss
    }
    /// [`Body::split_k_rounds`] of a matmul whose weights do not depend on the previous kernel
    /// (the lowering gives matmuls graph weights only): where the kernel has not waited for
    /// it yet (PDL) and the schedule has a whole unrolled round, that round's weights (`load`:
    /// one item's) are issued before `griddepcontrol.wait`, so a block that starts during the
    /// previous kernel's tail streams its weights meanwhile (no extra traffic, unlike the L2
    /// prefetch; DSC_GEMV_PRELOAD=0 off). `body` does a round's math with its weights loaded
    /// there (None) or already.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn split_k_rounds_preloaded<W>(
        &mut self,
        per: usize,
        jloop: usize,
        rounds: usize,
        unroll: usize,
        base: &str,
        stride: i64,
        limit: i64,
        load: &dyn Fn(&mut Body, &str) -> W,
        body: &dyn Fn(&mut Body, &[String], &[String], Option<&[W]>) -> Vec<String>,
    ) -> Vec<String> {
        let plain = |b: &mut Body, us: &[String], acc: &[String]| body(b, us, acc, None);
        if !(self.pdl && !self.waited && jloop >= unroll && self.o.gemv_preload) {
            return self.split_k_rounds(per, jloop, rounds, unroll, base, stride, limit, &plain);
        }
        let idx: Vec<String> = (0..unroll)
            .map(|q| {
                let c = self.ci64(q as i64 * stride);
                self.op(&format!("arith.addi {base}, {c} : i64"))
            })
            .collect();
        let pre: Vec<W> = idx.iter().map(|u| load(self, u)).collect();
        self.wait_for_previous();
        let zero = self.cf32(0.0);
        let acc0 = body(self, &idx, &vec![zero; per], Some(&pre));
        self.split_k_rounds_from(unroll, acc0, jloop, rounds, unroll, base, stride, limit, &plain)
    }
    /// `xs` (f32 values, at least one) folded left to right by the binary op `op`
    pub(crate) fn chain_reduce(&mut self, xs: &[String], op: &str) -> String {
        let mut acc = xs[0].clone();
        for x in &xs[1..] {
            acc = self.op(&format!("{op} {acc}, {x} : f32"));
        }
        acc
    }
    /// `xs` (f32 values, at least one) reduced by the binary op `op` as a pairwise tree
    /// (log2 dependent steps)
    pub(crate) fn tree_reduce(&mut self, xs: &[String], op: &str) -> String {
        let mut v = xs.to_vec();
        while v.len() > 1 {
            let mut next = Vec::with_capacity(v.len().div_ceil(2));
            for p in v.chunks(2) {
                next.push(if let [a, c] = p { self.op(&format!("{op} {a}, {c} : f32")) } else { p[0].clone() });
            }
            v = next;
        }
        v[0].clone()
    }
    /// Spin until the shared-memory mbarrier at `mb` (i32 address) completes the phase of
    /// parity `par` (i32)
    pub(crate) fn mbar_spin(&mut self, mb: &str, par: &str) {
        self.line("scf.while : () -> () {");
        let r = self.op(&format!(
            "llvm.inline_asm has_side_effects \"{{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2; selp.u32 $0, 1, 0, p; }}\", \"=r,r,r\" {mb}, {par} : (i32, i32) -> i32"
        ));
        let z = self.op("arith.constant 0 : i32");
        let pending = self.op(&format!("arith.cmpi eq, {r}, {z} : i32"));
        self.line(&format!("scf.condition({pending})"));
        self.line("} do {");
        self.line("scf.yield");
        self.line("}");
    }
    /// The paged KV pools' element offset of key `j` of a sequence whose block-table row
    /// starts at `trow`, for KV head `kh` (i64 values; `cbs`, `ckvh`, `cd`: the block size,
    /// KV heads and head dim as i64 constants): ((table[trow + j / bs] · bs + j % bs) · kvh +
    /// kh) · d
    pub(crate) fn paged_key_offset(&mut self, j: &str, trow: &str, kh: &str, cbs: &str, ckvh: &str, cd: &str) -> String {
        let bj = self.op(&format!("arith.divui {j}, {cbs} : i64"));
        let oj = self.op(&format!("arith.remui {j}, {cbs} : i64"));
        let ti = self.op(&format!("arith.addi {trow}, {bj} : i64"));
        let blk = self.load_i32_as_i64("%table", &ti);
        let row = self.op(&format!("arith.muli {blk}, {cbs} : i64"));
        let row = self.op(&format!("arith.addi {row}, {oj} : i64"));
        let row = self.op(&format!("arith.muli {row}, {ckvh} : i64"));
        let row = self.op(&format!("arith.addi {row}, {kh} : i64"));
        self.op(&format!("arith.muli {row}, {cd} : i64"))
    }
    /// `griddepcontrol.wait` here (what the previous kernel wrote is visible after it), not at
    /// the kernel's start (`emit_for`)
    pub(crate) fn wait_for_previous(&mut self) {
        self.line("llvm.inline_asm has_side_effects \"griddepcontrol.wait;\", \"~{memory}\" : () -> ()");
        self.waited = true;
    }
    /// `i` = global thread index; opens `scf.if i < %n` (close it with `b.line("}")`)
    pub(crate) fn open_guarded_gid(&mut self) -> String {
        let i = self.gid();
        let ok = self.op(&format!("arith.cmpi slt, {i}, %n : i64"));
        self.line(&format!("scf.if {ok} {{"));
        i
    }
    /// (row, lane) as i64 of a warp-per-row kernel (`Launch::WarpPerRow`, 4 rows per block);
    /// opens `scf.if row < %n` (close it with `b.line("}")`)
    pub(crate) fn open_guarded_warp_row(&mut self) -> (String, String) {
        let t = self.op("gpu.thread_id x");
        let blk = self.op("gpu.block_id x");
        let (lane, warp) = self.lane_warp(&t);
        let rpb = self.op("arith.constant 4 : index");
        let r0 = self.op(&format!("arith.muli {blk}, {rpb} : index"));
        let row = self.op(&format!("arith.addi {r0}, {warp} : index"));
        let row = self.idx64(&row);
        let lane = self.idx64(&lane);
        let ok = self.op(&format!("arith.cmpi slt, {row}, %n : i64"));
        self.line(&format!("scf.if {ok} {{"));
        (row, lane)
    }
    /// (output, lane) as i64 of a warp-per-output kernel (`Launch::WarpPerOutput`: output =
    /// block x · `warps` + warp); opens `scf.if output < %n` (close it with `b.line("}")`)
    pub(crate) fn open_guarded_warp_output(&mut self, warps: u32) -> (String, String) {
        let bx = self.op("gpu.block_id x");
        let tid = self.op("gpu.thread_id x");
        let (lane_i, warp_i) = self.lane_warp(&tid);
        let cw = self.op(&format!("arith.constant {warps} : index"));
        let o = self.op(&format!("arith.muli {bx}, {cw} : index"));
        let o = self.op(&format!("arith.addi {o}, {warp_i} : index"));
        let o = self.idx64(&o);
        let lane = self.idx64(&lane_i);
        let ok = self.op(&format!("arith.cmpi slt, {o}, %n : i64"));
        self.line(&format!("scf.if {ok} {{"));
        (o, lane)
    }
    /// global thread index as i64
    pub(crate) fn gid(&mut self) -> String {
        let b = self.op("gpu.block_id x");
        let d = self.op("gpu.block_dim x");
        let t = self.op("gpu.thread_id x");
        let m = self.op(&format!("arith.muli {b}, {d} : index"));
        let i = self.op(&format!("arith.addi {m}, {t} : index"));
        self.op(&format!("arith.index_cast {i} : index to i64"))
    }
}

/// The fixed fields of a wgmma descriptor of a K-major tile in the 128-byte swizzle: LBO 1
/// (unused), SBO 1024 bytes (>> 4) between 8-row groups, swizzle mode 1.
pub(crate) const SW128_K_DESC: u64 = (1u64 << 16) | (64u64 << 32) | (1u64 << 62);

/// Byte offset of 16-byte chunk `chunk` (i64) of row `row` (i64) in a tile of `rows` rows
/// laid out for wgmma's K-major 128-byte swizzle: column blocks of 8 chunks (64 16-bit
/// elements), each `rows` x 128 bytes, chunk `chunk % 8` at `(chunk % 8) ^ (row % 8)`.
pub(crate) fn sw128_offset(b: &mut Body, row: &str, chunk: &str, rows: usize) -> String {
    let c8 = b.ci64(8);
    let blk = b.op(&format!("arith.divui {chunk}, {c8} : i64"));
    let cbb = b.ci64((rows * 128) as i64);
    let bo = b.op(&format!("arith.muli {blk}, {cbb} : i64"));
    let c128 = b.ci64(128);
    let ro = b.op(&format!("arith.muli {row}, {c128} : i64"));
    let c7 = b.ci64(7);
    let cl = b.op(&format!("arith.andi {chunk}, {c7} : i64"));
    let r7 = b.op(&format!("arith.andi {row}, {c7} : i64"));
    let sw = b.op(&format!("arith.xori {cl}, {r7} : i64"));
    let c16 = b.ci64(16);
    let so = b.op(&format!("arith.muli {sw}, {c16} : i64"));
    let o = b.op(&format!("arith.addi {bo}, {ro} : i64"));
    b.op(&format!("arith.addi {o}, {so} : i64"))
}

pub(crate) fn unary_expr(b: &mut Body, u: UnaryOp, x: &str) -> Result<String, String> {
    Ok(match u {
        UnaryOp::Neg => b.op(&format!("arith.negf {x} : f32")),
        UnaryOp::Exp => b.exp(x),
        UnaryOp::Sqrt => b.asm1("sqrt.rn.f32", x),
        UnaryOp::Rsqrt => b.asm1("rsqrt.approx.ftz.f32", x),
        UnaryOp::Recip => {
            let one = b.cf32(1.0);
            b.op(&format!("arith.divf {one}, {x} : f32"))
        }
        UnaryOp::Tanh => b.asm1("tanh.approx.f32", x),
        UnaryOp::Sigmoid => b.sigmoid(x),
        UnaryOp::Relu => {
            let z = b.cf32(0.0);
            b.op(&format!("arith.maximumf {x}, {z} : f32"))
        }
        UnaryOp::Silu => {
            let s = b.sigmoid(x);
            b.op(&format!("arith.mulf {x}, {s} : f32"))
        }
        UnaryOp::Gelu => {
            // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
            let x2 = b.op(&format!("arith.mulf {x}, {x} : f32"));
            let x3 = b.op(&format!("arith.mulf {x2}, {x} : f32"));
            let c = b.cf32(0.044715);
            let t = b.op(&format!("arith.mulf {x3}, {c} : f32"));
            let u = b.op(&format!("arith.addf {x}, {t} : f32"));
            let k = b.cf32(0.797_884_6);
            let v = b.op(&format!("arith.mulf {u}, {k} : f32"));
            let th = b.asm1("tanh.approx.f32", &v);
            let one = b.cf32(1.0);
            let w = b.op(&format!("arith.addf {one}, {th} : f32"));
            let half = b.cf32(0.5);
            let hx = b.op(&format!("arith.mulf {x}, {half} : f32"));
            b.op(&format!("arith.mulf {hx}, {w} : f32"))
        }
        UnaryOp::GeluErf => {
            // 0.5 x (1 + erf(x / sqrt 2)); erf by the rational form the CPU executor uses
            let r2 = b.cf32(std::f32::consts::FRAC_1_SQRT_2);
            let z = b.op(&format!("arith.mulf {x}, {r2} : f32"));
            let nz = b.op(&format!("arith.negf {z} : f32"));
            let az = b.op(&format!("arith.maximumf {z}, {nz} : f32"));
            let half = b.cf32(0.5);
            let one = b.cf32(1.0);
            let hz = b.op(&format!("arith.mulf {az}, {half} : f32"));
            let den = b.op(&format!("arith.addf {one}, {hz} : f32"));
            let t = b.op(&format!("arith.divf {one}, {den} : f32"));
            let coef = [0.170_872_77f32, -0.822_152_23, 1.488_515_87, -1.135_203_98, 0.278_868_07, -0.186_288_06, 0.096_784_18, 0.374_091_96, 1.000_023_68];
            let mut p = b.cf32(coef[0]);
            for c in &coef[1..] {
                let cc = b.cf32(*c);
                p = b.op(&format!("llvm.intr.fma({p}, {t}, {cc}) : (f32, f32, f32) -> f32"));
            }
            let c0 = b.cf32(-1.265_512_23);
            let pt = b.op(&format!("llvm.intr.fma({p}, {t}, {c0}) : (f32, f32, f32) -> f32"));
            let z2 = b.op(&format!("arith.mulf {az}, {az} : f32"));
            let e_in = b.op(&format!("arith.subf {pt}, {z2} : f32"));
            let e = b.exp(&e_in);
            let te = b.op(&format!("arith.mulf {t}, {e} : f32"));
            let y = b.op(&format!("arith.subf {one}, {te} : f32"));
            let neg = b.op(&format!("arith.negf {y} : f32"));
            let zero = b.cf32(0.0);
            let pos = b.op(&format!("arith.cmpf oge, {z}, {zero} : f32"));
            let erf = b.op(&format!("arith.select {pos}, {y}, {neg} : f32"));
            let w = b.op(&format!("arith.addf {one}, {erf} : f32"));
            let hx = b.op(&format!("arith.mulf {x}, {half} : f32"));
            b.op(&format!("arith.mulf {hx}, {w} : f32"))
        }
    })
}

/// Element `i` (i64) of an elementwise binary kernel: `op(a[i], b[i % nb])` (params `%a`,
/// `%b`, `%nb`; b repeats every nb elements).
pub(crate) fn binary_at(b: &mut Body, op: BinaryOp, i: &str) -> Result<String, String> {
    let j = b.op(&format!("arith.remui {i}, %nb : i64"));
    let x = b.load("%a", i);
    let y = b.load("%b", &j);
    Ok(match op {
        BinaryOp::SiluMul => {
            let s = unary_expr(b, UnaryOp::Silu, &x)?;
            b.op(&format!("arith.mulf {s}, {y} : f32"))
        }
        other => {
            let f = match other {
                BinaryOp::Add => "arith.addf",
                BinaryOp::Sub => "arith.subf",
                BinaryOp::Mul => "arith.mulf",
                BinaryOp::Div => "arith.divf",
                BinaryOp::Max => "arith.maximumf",
                _ => "arith.minimumf",
            };
            b.op(&format!("{f} {x}, {y} : f32"))
        }
    })
}
