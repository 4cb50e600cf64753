//! Kernel-check cases: rope and YaRN's rope (`dsc_codegen::kernels::rope`).

use super::*;

/// A rope case over x[t, h, d] at positions `pos` (one thread per rotation pair): `op` is the
/// graph text's op with its attributes (`rope(%x, %p) {..}`), checked against the CPU executor.
#[allow(clippy::too_many_arguments)]
fn rope_case(cx: &mut Cx, name: String, spec: KernelSpec, op: &str, t: usize, h: usize, d: usize, pos_max: f32) -> anyhow::Result<()> {
    let x = cx.r.vec(t * h * d, -1.0, 1.0);
    let pos: Vec<i32> = (0..t).map(|i| if i == 0 { 0 } else { cx.r.vec(1, 0.0, pos_max)[0] as i32 }).collect();
    let src = format!("graph \"k\" {{\n  %x = input : f32[{t}, {h}, {d}]\n  %p = input : i32[{t}]\n  %y = {op} : f32[{t}, {h}, {d}]\n  output y = %y\n}}\n");
    let want = reference(&src, vec![("x", Tensor::new(vec![t, h, d], x.clone())), ("p", Tensor::from_i32(vec![t], &pos))], &cx.none)?;
    let pairs = t * h * d / 2;
    let inputs = vec![cx.data.push(&x), cx.data.push_i32(&pos)];
    let expected = cx.data.push(&want);
    let c = case(name, &spec, grid(&spec.launch(), pairs), 1, inputs, vec![pairs as i64], expected, 1e-4);
    cx.cases.push(c);
    cx.specs.push(spec);
    Ok(())
}

/// Rope, both pairings, positions up to ~2000.
pub(super) fn cases(cx: &mut Cx) -> anyhow::Result<()> {
    for (h, interleaved) in [(9usize, true), (3, false)] {
        let (t, d, theta) = (11usize, 64usize, 100000f32);
        let style = if interleaved { "interleaved" } else { "half" };
        let spec = KernelSpec::Rope { h, d, theta_bits: theta.to_bits(), interleaved };
        let op = format!("rope(%x, %p) {{theta = {theta:?}, style = {style}, rotary_dim = {d}}}");
        rope_case(cx, format!("rope {t}x{h}x{d} {style}"), spec, &op, t, h, d, 2000.0)?;
    }
    Ok(())
}

/// YaRN's rope (DeepSeek's: interleaved pairs; V2-Lite's factor 40, and a tiny factor-4 one),
/// positions up to ~3000.
pub(super) fn yarn_cases(cx: &mut Cx) -> anyhow::Result<()> {
    for (h, d, theta, factor, orig, mscale, interleaved) in [(16usize, 64usize, 10000f32, 40f32, 4096usize, 1.0f32, true), (4, 8, 10000.0, 4.0, 64, 1.1386, false)] {
        let t = 13usize;
        let style = if interleaved { "interleaved" } else { "half" };
        let yarn = dsc_ir::Yarn { factor, original_max_position: orig, beta_fast: 32.0, beta_slow: 1.0, attention_factor: mscale };
        let spec = dsc_codegen::kernels::rope_yarn_spec(h, d, theta, interleaved, &yarn);
        let op = format!("rope_yarn(%x, %p) {{theta = {theta:?}, style = {style}, rotary_dim = {d}, factor = {factor:?}, original_max_position = {orig}, beta_fast = 32.0, beta_slow = 1.0, attention_factor = {mscale:?}}}");
        rope_case(cx, format!("rope_yarn {t}x{h}x{d} {style} factor {factor}"), spec, &op, t, h, d, 3000.0)?;
    }
    Ok(())
}
