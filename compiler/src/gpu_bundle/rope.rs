//! Kernel-check cases: rope (`dsc_codegen::kernels::rope`).

use super::*;

/// Rope, both pairings.
pub(super) fn cases(cx: &mut Cx) -> anyhow::Result<()> {
    // rope, both pairings, positions up to ~2000
    for (h, interleaved) in [(9usize, true), (3, false)] {
        let (t, d, theta) = (11usize, 64usize, 100000f32);
        let x = cx.r.vec(t * h * d, -1.0, 1.0);
        let pos: Vec<i32> = (0..t).map(|i| if i == 0 { 0 } else { cx.r.vec(1, 0.0, 2000.0)[0] as i32 }).collect();
        let style = if interleaved { "interleaved" } else { "half" };
        let src = format!("graph \"k\" {{\n  %x = input : f32[{t}, {h}, {d}]\n  %p = input : i32[{t}]\n  %y = rope(%x, %p) {{theta = {theta:?}, style = {style}, rotary_dim = {d}}} : f32[{t}, {h}, {d}]\n  output y = %y\n}}\n");
        let want = reference(&src, vec![("x", Tensor::new(vec![t, h, d], x.clone())), ("p", Tensor::from_i32(vec![t], &pos))], &cx.none)?;
        let spec = KernelSpec::Rope { h, d, theta_bits: theta.to_bits(), interleaved };
        let (g, b) = grid(&spec.launch(), t * h * d / 2);
        cx.cases.push(Case {
            name: format!("rope {t}x{h}x{d} {style}"),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![cx.data.push(&x), cx.data.push_i32(&pos)],
            scalars: vec![(t * h * d / 2) as i64],
            expected: cx.data.push(&want),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 1e-4,
            cluster: None,
        });
        cx.specs.push(spec);
    }
    Ok(())
}
