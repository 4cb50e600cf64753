//! What the matmul families share: the parameter lists, which 16-bit formats take the tensor
//! cores, the merged-parts wrapper (`MatMulParts`, one kernel over concatenated weights), the
//! epilogue checks, the split-K schedule and the SM count the grids are sized for.

use crate::kernels::*;

/// The split-K schedule of the GEMV kernels: `items` (16-byte units or 32-wide K steps) in
/// chunks of `chunk` (a warp's lanes take one item each), warp w of `nw` taking chunks w,
/// w + nw, ... in rounds. Returns (the rounds every warp runs unguarded — whole chunks only,
/// a multiple of `unroll` —, all rounds); rounds past the first are guarded by item < items.
pub fn split_k_schedule(items: usize, chunk: usize, nw: usize, unroll: usize) -> (usize, usize) {
    let (chunks, full) = (items.div_ceil(chunk), items / chunk);
    ((full / nw) / unroll * unroll, chunks.div_ceil(nw))
}

/// Whether the decode GEMV can carry the SwiGLU epilogue (`KernelSpec::SwiGluGemv`):
/// plain-float weights, K a multiple of 32, an even number of outputs per block.
pub fn swiglu_fits(k: usize, f: usize, wdtype: DType) -> Result<(), String> {
    if !matches!(wdtype, DType::F32 | DType::F16 | DType::BF16 | DType::Q4_1) || !k.is_multiple_of(32) || gemv_tiling(k, 2 * f, 1).0 % 2 != 0 {
        return Err(format!("the SwiGLU GEMV takes plain-float or q4_1 weights, K a multiple of 32 and an even GEMV tiling (K {k}, {wdtype})"));
    }
    Ok(())
}

/// Whether a matmul epilogue applies activation `act` (`KernelSpec::MatMulAct`).
pub fn epilogue_act_fits(act: UnaryOp) -> Result<(), String> {
    if !matches!(act, UnaryOp::Gelu | UnaryOp::GeluErf | UnaryOp::Relu | UnaryOp::Silu | UnaryOp::Tanh | UnaryOp::Sigmoid) {
        return Err(format!("matmul epilogue activation {} is not lowered", dsc_ir::Op::Unary(act).name()));
    }
    Ok(())
}

/// SMs of the GPU the sm_90a kernels' grids are sized for (H100 SXM, H200: 132).
pub const TARGET_SMS: usize = 132;

pub fn tensor_core_f16(wdtype: DType) -> bool {
    !matches!(wdtype, DType::BF16 | DType::F32)
}

/// Parameters of the matmul kernels: x, w, [bias], [res], y, then [M] and N.
pub(crate) fn matmul_params(bias: bool, residual: bool, with_m: bool) -> String {
    format!(
        "%x: !llvm.ptr<1>, %w: !llvm.ptr<1>, {}{}%y: !llvm.ptr<1>, {}%n: i64",
        if bias { "%bias: !llvm.ptr<1>, " } else { "" },
        if residual { "%res: !llvm.ptr<1>, " } else { "" },
        if with_m { "%m: i64, " } else { "" }
    )
}

/// Whether `inner` can run as a merged matmul of `parts` output columns (see
/// `KernelSpec::MatMulParts`): a plain matmul kernel (no bias or residual) whose blocks each
/// fall inside one part.
pub fn parts_fit(inner: &KernelSpec, parts: &[usize]) -> Result<(), String> {
    let (n, bias, residual) = match inner {
        KernelSpec::MatMul { n, bias, residual, .. }
        | KernelSpec::MatMulFew { n, bias, residual, .. }
        | KernelSpec::MatMulFewX16 { n, bias, residual, .. }
        | KernelSpec::MatMulMma { n, bias, residual, .. }
        | KernelSpec::MatMulWgmma { n, bias, residual, .. }
        | KernelSpec::MatMulPipe { n, bias, residual, .. }
        | KernelSpec::MatMulPacked { n, bias, residual, .. } => (*n, *bias, *residual),
        KernelSpec::MatMulF8 { n, residual, .. } => (*n, false, *residual),
        other => return Err(format!("{} is not a matmul kernel", other.symbol())),
    };
    if bias || residual {
        return Err("merged matmuls take no bias or residual".into());
    }
    if parts.len() < 2 || parts.iter().sum::<usize>() != n {
        return Err(format!("parts {parts:?} must be two or more and sum to N = {n}"));
    }
    let cols = columns_per_block(&inner.launch()).ok_or("unknown matmul launch")?;
    if let Some(p) = parts.iter().find(|p| *p % cols != 0) {
        return Err(format!("part of {p} columns is not a multiple of the {cols} columns a block of {} covers", inner.symbol()));
    }
    Ok(())
}

/// A merged matmul (`KernelSpec::MatMulParts`): a prologue maps the block to its part — its
/// weight pointer becomes `%w`, its column count `%n`, its output (part-major: part i holds
/// [M, N_i] at element M * (N_0 + .. + N_{i-1})) `%y` — and the block index within the part
/// stands in for `gpu.block_id x`; then the plain kernel's body runs unchanged.
pub(crate) fn emit_parts(b: &mut Body, inner: &KernelSpec, parts: &[usize]) -> Result<String, String> {
    parts_fit(inner, parts)?;
    // (split-K: `splits` blocks per column tile, so a block index unit is bn / splits columns)
    let cols = columns_per_block(&inner.launch()).expect("checked") / b.split_k.unwrap_or(1);
    let bx = b.op("gpu.block_id x");
    let bx = b.idx64(&bx);
    let (mut w, mut n, mut boff, mut yoff) = ("%w0".to_string(), b.ci64(parts[0] as i64), b.ci64(0), b.ci64(0));
    let mut start = 0usize;
    for (i, &p) in parts.iter().enumerate().skip(1) {
        start += parts[i - 1];
        let last = i + 1 == parts.len();
        let first = b.ci64((start / cols) as i64);
        let here = b.op(&format!("arith.cmpi sge, {bx}, {first} : i64"));
        // the last select of each chain defines the name the kernel body uses
        let wsel = format!("llvm.select {here}, %w{i}, {w} : i1, !llvm.ptr<1>");
        let np = b.ci64(p as i64);
        let nsel = format!("arith.select {here}, {np}, {n} : i64");
        if last {
            b.line(&format!("%w = {wsel}"));
            b.line(&format!("%n = {nsel}"));
        } else {
            w = b.op(&wsel);
            n = b.op(&nsel);
        }
        boff = b.op(&format!("arith.select {here}, {first}, {boff} : i64"));
        let off = b.ci64(start as i64);
        yoff = b.op(&format!("arith.select {here}, {off}, {yoff} : i64"));
    }
    let local = b.op(&format!("arith.subi {bx}, {boff} : i64"));
    b.block_x = Some(b.op(&format!("arith.index_cast {local} : i64 to index")));
    let c4 = b.ci64(4);
    let rows = b.op(&format!("arith.muli {yoff}, %prows : i64"));
    let bytes = b.op(&format!("arith.muli {rows}, {c4} : i64"));
    // (split-K: this part's place in a partial-sum slice, which the kernel offsets by its K
    // part's slice, [M, all columns] each)
    let yname = if b.split_k.is_some() {
        b.split_n = Some("%nall");
        "%yparts"
    } else {
        "%y"
    };
    b.line(&format!("{yname} = llvm.getelementptr %yall[{bytes}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
    let params = emit_into(b, inner)?;
    let ws: Vec<String> = (0..parts.len()).map(|i| format!("%w{i}: !llvm.ptr<1>")).collect();
    let params = params.replacen("%w: !llvm.ptr<1>", &ws.join(", "), 1).replacen("%y: !llvm.ptr<1>", "%yall: !llvm.ptr<1>", 1).replacen("%n: i64", "%nall: i64, %prows: i64", 1);
    Ok(params)
}
