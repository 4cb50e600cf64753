//! Kernel-check cases: the greedy argmax (`dsc_codegen::kernels::argmax`).

use super::*;

/// Argmax: a block per row, split over blocks, a cluster per row.
pub(super) fn cases(cx: &mut Cx) -> anyhow::Result<()> {
    // argmax: a block per row (SmolLM2's and Llama 3's vocabularies: whole loop steps, and a
    // partial last one), and a warp per row (a width not a multiple of 4)
    for (rows, d) in [(2usize, 49152usize), (2, 128256), (3, 1001)] {
        let mut x = cx.r.vec(rows * d, -10.0, 10.0);
        x[(rows - 2) * d + 7] = 50.0; // a tie at the top: the first index wins
        x[(rows - 2) * d + 900] = 50.0;
        x[rows * d - 1] = 60.0; // the row's last element the largest
        let want =
            reference(&format!("graph \"k\" {{\n  %x = input : f32[{rows}, {d}]\n  %y = argmax(%x) : i32[{rows}]\n  output y = %y\n}}\n"), vec![("x", Tensor::new(vec![rows, d], x.clone()))], &cx.none)?;
        // the kernel writes i32: compare bit patterns (small ints are f32 denormals, never NaN)
        let bits: Vec<f32> = want.iter().map(|&v| f32::from_bits(v as i32 as u32)).collect();
        // (one copy of the rows and of the ids for all three kernels: the bundle shares a
        // call's 64 MiB)
        let (xa, ya) = (cx.data.push(&x), cx.data.push(&bits));
        let spec = KernelSpec::Argmax { d };
        let (g, b) = grid(&spec.launch(), rows);
        // (and split over blocks: partials and counters as inputs, the counters zero again)
        if let Some(splits) = dsc_codegen::kernels::argmax_splits(d) {
            let split = KernelSpec::ArgmaxSplit { d, splits };
            let zeros = cx.data.push(&vec![0.0; rows]);
            cx.cases.push(Case {
                name: format!("argmax {rows}x{d} over {splits} blocks per row"),
                kernel: split.symbol(),
                grid: splits as u32,
                grid_y: rows as u32,
                block: 32 * dsc_codegen::kernels::ARGMAX_SPLIT_WARPS as u32,
                inputs: vec![xa.clone(), cx.data.push(&vec![0.0; rows * splits * 2]), zeros.clone()],
                scalars: vec![rows as i64],
                expected: ya.clone(),
                init: None,
                written_inputs: vec![(2, zeros)],
                tmaps: vec![],
                tol: 0.0,
                cluster: None,
            });
            cx.specs.push(split);
            // (and in a thread-block cluster per row, sm_90a)
            let blocks = dsc_codegen::kernels::ARGMAX_CLUSTER_BLOCKS;
            let cl = KernelSpec::ArgmaxCluster { d, blocks };
            cx.cases.push(Case {
                name: format!("argmax {rows}x{d} in clusters of {blocks}"),
                kernel: cl.symbol(),
                grid: rows as u32,
                grid_y: blocks as u32,
                block: 32 * dsc_codegen::kernels::ARGMAX_CLUSTER_WARPS as u32,
                inputs: vec![xa.clone()],
                scalars: vec![rows as i64],
                expected: ya.clone(),
                init: None,
                written_inputs: vec![],
                tmaps: vec![],
                tol: 0.0,
                cluster: Some(blocks as u32),
            });
            cx.specs.push(cl);
        }
        cx.cases.push(Case {
            name: format!("argmax {rows}x{d}"),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![xa.clone()],
            scalars: vec![rows as i64],
            expected: ya.clone(),
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
