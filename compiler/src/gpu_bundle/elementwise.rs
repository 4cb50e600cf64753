//! Kernel-check cases: elementwise ops, gather, seeded weights and the index ops (`dsc_codegen::kernels::elementwise`).

use super::*;

/// Unary and binary elementwise ops; silu_mul writing the 16-bit copy.
pub(super) fn unary_binary(cx: &mut Cx) -> anyhow::Result<()> {
    let n = 20_011usize; // not a multiple of the block: exercises the bounds check
    let unary = [UnaryOp::Neg, UnaryOp::Exp, UnaryOp::Sqrt, UnaryOp::Rsqrt, UnaryOp::Recip, UnaryOp::Tanh, UnaryOp::Sigmoid, UnaryOp::Relu, UnaryOp::Silu, UnaryOp::Gelu, UnaryOp::GeluErf];
    for u in unary {
        let spec = KernelSpec::Unary(UnaryOpKey(u));
        let (lo, hi) = match u {
            UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Recip => (0.05, 4.0),
            _ => (-4.0, 4.0),
        };
        let x = cx.r.vec(n, lo, hi);
        let name = dsc_ir::Op::Unary(u).name();
        let want = reference(&format!("graph \"k\" {{\n  %x = input : f32[N]\n  %y = {name}(%x) : f32[N]\n  output y = %y\n}}\n"), vec![("x", Tensor::new(vec![n], x.clone()))], &cx.none)?;
        let (g, b) = grid(&spec.launch(), n);
        // approx instructions (ex2/tanh/rsqrt .approx) are good to ~1e-6 relative per element
        let tol = if matches!(u, UnaryOp::Neg | UnaryOp::Relu | UnaryOp::Sqrt | UnaryOp::Recip) { 1e-6 } else { 1e-4 };
        cx.cases.push(Case {
            name: format!("{name} n={n}"),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![cx.data.push(&x)],
            scalars: vec![n as i64],
            expected: cx.data.push(&want),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol,
            cluster: None,
        });
        cx.specs.push(spec);
    }
    for bop in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Max, BinaryOp::Min, BinaryOp::SiluMul] {
        let spec = KernelSpec::Binary(BinaryOpKey(bop));
        let name = dsc_ir::Op::Binary(bop).name();
        for (rows, cols, bcast) in [(33usize, 576usize, false), (33, 576, true)] {
            let a = cx.r.vec(rows * cols, -3.0, 3.0);
            let bl = if bcast { cols } else { rows * cols };
            let bv: Vec<f32> = cx.r.vec(bl, 0.5, 2.0).into_iter().enumerate().map(|(i, v)| if i % 2 == 0 { v } else { -v }).collect();
            let bshape = if bcast { format!("[{cols}]") } else { format!("[{rows}, {cols}]") };
            let src = format!("graph \"k\" {{\n  %a = input : f32[{rows}, {cols}]\n  %b = input : f32{bshape}\n  %y = {name}(%a, %b) : f32[{rows}, {cols}]\n  output y = %y\n}}\n");
            let bt = if bcast { Tensor::new(vec![cols], bv.clone()) } else { Tensor::new(vec![rows, cols], bv.clone()) };
            let want = reference(&src, vec![("a", Tensor::new(vec![rows, cols], a.clone())), ("b", bt)], &cx.none)?;
            let (g, b) = grid(&spec.launch(), rows * cols);
            cx.cases.push(Case {
                name: format!("{name} {rows}x{cols}{}", if bcast { " bcast" } else { "" }),
                kernel: spec.symbol(),
                grid: g,
                grid_y: 1,
                block: b,
                inputs: vec![cx.data.push(&a), cx.data.push(&bv)],
                scalars: vec![(rows * cols) as i64, bl as i64],
                expected: cx.data.push(&want),
                init: None,
                written_inputs: vec![],
                tmaps: vec![],
                tol: 1e-6,
                cluster: None,
            });
        }
        cx.specs.push(spec);
    }
    // silu_mul writing the 16-bit copy the down projection reads (norm + quantize's sibling):
    // y over a NaN-filled buffer, the copy (as 32-bit words of 16-bit pairs) the output
    for f16 in [false, true] {
        let (rows, cols) = (33usize, 576usize);
        let a = cx.r.vec(rows * cols, -3.0, 3.0);
        let bv = cx.r.vec(rows * cols, -2.0, 2.0);
        let src = format!("graph \"k\" {{\n  %a = input : f32[{rows}, {cols}]\n  %b = input : f32[{rows}, {cols}]\n  %y = silu_mul(%a, %b) : f32[{rows}, {cols}]\n  output y = %y\n}}\n");
        let want = reference(&src, vec![("a", Tensor::new(vec![rows, cols], a.clone())), ("b", Tensor::new(vec![rows, cols], bv.clone()))], &cx.none)?;
        let half = dsc_ir::quant::encode(if f16 { DType::F16 } else { DType::BF16 }, &want).context("encode")?;
        let words: Vec<f32> = le_words(&half);
        let spec = KernelSpec::SiluMulHalf { f16 };
        let (g, b) = grid(&spec.launch(), rows * cols);
        cx.cases.push(Case {
            name: format!("silu_mul {rows}x{cols} + {} copy", if f16 { "f16" } else { "bf16" }),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![cx.data.push(&a), cx.data.push(&bv), cx.data.push(&vec![f32::NAN; rows * cols])],
            scalars: vec![(rows * cols) as i64, (rows * cols) as i64],
            expected: cx.data.push(&words),
            init: None,
            written_inputs: vec![(2, cx.data.push(&want))],
            tmaps: vec![],
            tol: 1e-2,
            cluster: None,
        });
        cx.specs.push(spec);
    }
    Ok(())
}

/// Gather (embedding) from plain and packed tables.
pub(super) fn gather(cx: &mut Cx) -> anyhow::Result<()> {
    // gather (embedding) from plain and packed tables
    // (300 rows: the bundle and the runtime share one call's 64 MiB)
    let (v, d, t) = (300usize, 576usize, 13usize);
    let table = cx.r.vec(v * d, -1.0, 1.0);
    let idx: Vec<i32> = (0..t)
        .map(|i| {
            if i == 0 {
                0
            } else if i == 1 {
                v as i32 - 1
            } else {
                (cx.r.vec(1, 0.0, v as f32)[0] as i32).min(v as i32 - 1)
            }
        })
        .collect();
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1] {
        let tb = dsc_ir::quant::encode(dtype, &table).context("encode")?;
        let ws: Weights = HashMap::from([("table".to_string(), (dtype, vec![v, d], tb.clone()))]);
        let src = format!("graph \"k\" {{\n  %idx = input : i32[{t}]\n  %table = weight : {dtype}[{v}, {d}]\n  %y = gather(%table, %idx) : f32[{t}, {d}]\n  output y = %y\n}}\n");
        let want = reference(&src, vec![("idx", Tensor::from_i32(vec![t], &idx))], &ws)?;
        let spec = KernelSpec::Gather { d, dtype };
        let (g, b) = grid(&spec.launch(), t * d);
        // (bf16: also as the first one-token layer's zero fill of its attention's
        // accumulators, `ZeroFill`: two inputs of NaN it writes, d zeros each)
        if dtype == DType::BF16 {
            let zf = KernelSpec::ZeroFill { inner: Box::new(spec.clone()), len: d };
            let nan = cx.data.push(&vec![f32::NAN; d]);
            let zeros = cx.data.push(&vec![0.0; d]);
            cx.cases.push(Case {
                name: format!("gather {t}x{d} {dtype} + zero fill {d}"),
                kernel: zf.symbol(),
                grid: g,
                grid_y: 1,
                block: b,
                inputs: vec![nan.clone(), nan, cx.data.push_u8(&tb), cx.data.push_i32(&idx)],
                scalars: vec![(t * d) as i64],
                expected: cx.data.push(&want),
                init: None,
                written_inputs: vec![(0, zeros.clone()), (1, zeros)],
                tmaps: vec![],
                tol: 1e-6,
                cluster: None,
            });
            cx.specs.push(zf);
        }
        cx.cases.push(Case {
            name: format!("gather {t}x{d} {dtype}"),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![cx.data.push_u8(&tb), cx.data.push_i32(&idx)],
            scalars: vec![(t * d) as i64],
            expected: cx.data.push(&want),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 1e-6,
            cluster: None,
        });
        cx.specs.push(spec);
    }
    Ok(())
}

/// Seeded weights generated on the device, and a tensor-parallel shard of one.
pub(super) fn seeded(cx: &mut Cx) -> anyhow::Result<()> {
    // seeded weights generated on the device, bit-exact against the host generator
    for (dtype, ones) in [(DType::F32, false), (DType::BF16, false), (DType::F16, false), (DType::F32, true)] {
        let (n, seed, name, scale) = (100_002usize, 7u64, "blk.3.ffn_up.weight", 1.0f32 / 64.0);
        let host = dsc_ir::quant::encode(dtype, &dsc_ir::seeded::values(seed, name, n, scale, ones)).context("encode")?;
        let as_f32: Vec<f32> = le_words(&host);
        let spec = KernelSpec::SeededInit { dtype };
        let (g, b) = grid(&spec.launch(), n);
        let base = dsc_ir::seeded::base(seed, name) as i64;
        cx.cases.push(Case {
            name: format!("seeded_init {n} {dtype}{}", if ones { " ones" } else { "" }),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![],
            scalars: vec![n as i64, base, scale.to_bits() as i64, ones as i64, n as i64, 0, 0],
            expected: cx.data.push(&as_f32),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 0.0,
            cluster: None,
        });
        if !ones {
            cx.specs.push(spec);
        }
    }
    // Q4_1 (a warp per block, the host encoder's min/max quantizer) and i4g128 (4 warps a
    // group): their bytes compared one by one, exactly (written over a 0xAB fill)
    for (dtype, n) in [(DType::Q4_1, 100_000usize - 32 * 7), (DType::I4G128, 512 * 37)] {
        seeded_bytes(cx, dtype, n)?;
    }
    // a tensor-parallel shard of a seeded weight: rank 1 of 2 of the columns of [rows, cols]
    {
        let (rows, cols, seed, name, scale) = (301usize, 512usize, 7u64, "blk.0.ffn_down.weight", 1.0f32 / 64.0);
        let full = dsc_ir::seeded::values(seed, name, rows * cols, scale, false);
        let s = dsc_ir::shard::Shard { axis: 1, start: cols / 2, len: cols / 2 };
        let want: Vec<f32> = (0..rows).flat_map(|r| full[r * cols + s.start..r * cols + s.start + s.len].to_vec()).collect();
        let (row0, len, stride, col0) = dsc_ir::shard::seeded_layout(&[rows, cols], s);
        let spec = KernelSpec::SeededInit { dtype: DType::F32 };
        let n = want.len();
        let (g, b) = grid(&spec.launch(), n);
        let base = dsc_ir::seeded::base(seed, name).wrapping_add(row0) as i64;
        cx.cases.push(Case {
            name: format!("seeded_init shard [{rows}, {cols}] columns {}..{}", s.start, s.start + s.len),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![],
            scalars: vec![n as i64, base, scale.to_bits() as i64, 0, len as i64, stride as i64, col0 as i64],
            expected: cx.data.push(&want),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 0.0,
            cluster: None,
        });
    }
    Ok(())
}

/// Slice, take_along, top_k, transpose, concat.
pub(super) fn index_ops(cx: &mut Cx) -> anyhow::Result<()> {
    {
        let x = cx.r.vec(7 * 12 * 64, -1.0, 1.0);
        let want = reference(
            "graph \"k\" {\n  %x = input : f32[7, 12, 64]\n  %y = slice(%x) {axis = 1, start = 3, len = 4} : f32[7, 4, 64]\n  output y = %y\n}\n",
            vec![("x", Tensor::new(vec![7, 12, 64], x.clone()))],
            &cx.none,
        )?;
        let spec = KernelSpec::Slice { inner: 64, d: 12, start: 3, len: 4 };
        let (g, b) = grid(&spec.launch(), want.len());
        cx.cases.push(Case {
            name: "slice 7x12x64 [3..7]".into(),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![cx.data.push(&x)],
            scalars: vec![want.len() as i64],
            expected: cx.data.push(&want),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 0.0,
            cluster: None,
        });
        cx.specs.push(spec);
        let xs = cx.r.vec(9 * 64, -1.0, 1.0);
        let idx: Vec<i32> = cx.r.vec(9 * 6, 0.0, 64.0).into_iter().map(|v| (v as i32).min(63)).collect();
        let want = reference(
            "graph \"k\" {\n  %x = input : f32[9, 64]\n  %i = input : i32[9, 6]\n  %y = take_along(%x, %i) : f32[9, 6]\n  output y = %y\n}\n",
            vec![("x", Tensor::new(vec![9, 64], xs.clone())), ("i", Tensor::from_i32(vec![9, 6], &idx))],
            &cx.none,
        )?;
        let spec = KernelSpec::TakeAlong { n_in: 64, k: 6 };
        let (g, b) = grid(&spec.launch(), want.len());
        cx.cases.push(Case {
            name: "take_along 9x64 k6".into(),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![cx.data.push(&xs), cx.data.push_i32(&idx)],
            scalars: vec![want.len() as i64],
            expected: cx.data.push(&want),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 0.0,
            cluster: None,
        });
        cx.specs.push(spec);
    }
    {
        // top_k with ties: values on a coarse grid so equal values are common
        let (rows, d, k) = (11usize, 64usize, 6usize);
        let x: Vec<f32> = cx.r.vec(rows * d, 0.0, 8.0).into_iter().map(|v| v.floor()).collect();
        let want = reference(
            &format!("graph \"k\" {{\n  %x = input : f32[{rows}, {d}]\n  %y = top_k(%x) {{k = {k}}} : i32[{rows}, {k}]\n  output y = %y\n}}\n"),
            vec![("x", Tensor::new(vec![rows, d], x.clone()))],
            &cx.none,
        )?;
        let bits: Vec<f32> = want.iter().map(|&v| f32::from_bits(v as i32 as u32)).collect();
        let spec = KernelSpec::TopK { d, k };
        let (g, b) = grid(&spec.launch(), rows);
        cx.cases.push(Case {
            name: format!("top_k {rows}x{d} k{k} ties"),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![cx.data.push(&x)],
            scalars: vec![rows as i64],
            expected: cx.data.push(&bits),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 0.0,
            cluster: None,
        });
        cx.specs.push(spec);
        let x = cx.r.vec(5 * 3 * 16, -1.0, 1.0);
        let want = reference(
            "graph \"k\" {\n  %x = input : f32[5, 3, 16]\n  %y = transpose(%x) {perm = [1, 0, 2]} : f32[3, 5, 16]\n  output y = %y\n}\n",
            vec![("x", Tensor::new(vec![5, 3, 16], x.clone()))],
            &cx.none,
        )?;
        let spec = KernelSpec::Transpose { perm: vec![1, 0, 2] };
        let (g, b) = grid(&spec.launch(), want.len());
        cx.cases.push(Case {
            name: "transpose 5x3x16 [1,0,2]".into(),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![cx.data.push(&x)],
            scalars: vec![want.len() as i64, 5, 3, 16],
            expected: cx.data.push(&want),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 0.0,
            cluster: None,
        });
        cx.specs.push(spec);
        let (a, c) = (cx.r.vec(4 * 3 * 16, -1.0, 1.0), cx.r.vec(4 * 5 * 16, -1.0, 1.0));
        let want = reference(
            "graph \"k\" {\n  %a = input : f32[4, 3, 16]\n  %c = input : f32[4, 5, 16]\n  %y = concat(%a, %c) {axis = 1} : f32[4, 8, 16]\n  output y = %y\n}\n",
            vec![("a", Tensor::new(vec![4, 3, 16], a.clone())), ("c", Tensor::new(vec![4, 5, 16], c.clone()))],
            &cx.none,
        )?;
        let spec = KernelSpec::Concat { sizes: vec![3, 5], inner: 16 };
        let (g, b) = grid(&spec.launch(), want.len());
        cx.cases.push(Case {
            name: "concat 4x(3+5)x16".into(),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![cx.data.push(&a), cx.data.push(&c)],
            scalars: vec![want.len() as i64],
            expected: cx.data.push(&want),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 0.0,
            cluster: None,
        });
        cx.specs.push(spec);
    }
    Ok(())
}

/// A seeded weight in a block format generated on the GPU, its bytes compared with the host
/// encoder's one by one, exactly (written over a 0xAB fill).
pub(super) fn seeded_bytes(cx: &mut Cx, dtype: DType, n: usize) -> anyhow::Result<()> {
    let (seed, name, scale) = (7u64, "blk.3.ffn_up.weight", 1.0f32 / 64.0);
    let host = dsc_ir::quant::encode(dtype, &dsc_ir::seeded::values(seed, name, n, scale, false)).context("encode")?;
    let spec = KernelSpec::SeededInit { dtype };
    let (g, b) = grid(&spec.launch(), n);
    let bytes: Vec<f32> = host.iter().map(|&v| v as f32).collect();
    let init = cx.data.push_u8(&vec![0xAB; host.len()]);
    cx.cases.push(Case {
        name: format!("seeded_init {n} {dtype}"),
        kernel: spec.symbol(),
        grid: g,
        grid_y: 1,
        block: b,
        inputs: vec![],
        scalars: vec![n as i64, dsc_ir::seeded::base(seed, name) as i64, scale.to_bits() as i64, 0, n as i64, 0, 0],
        expected: cx.data.push(&bytes),
        init: Some(init),
        written_inputs: vec![],
        tmaps: vec![],
        tol: 0.0,
        cluster: None,
    });
    cx.specs.push(spec);
    Ok(())
}

/// The seeded f8g128 generator (4 warps a group: |max|, s = amax / 448, e4m3 by integer
/// rounding), byte-exact with `dsc_ir::quant::encode`.
pub(super) fn seeded_f8g128(cx: &mut Cx) -> anyhow::Result<()> {
    seeded_bytes(cx, DType::F8G128, 512 * 37)
}
