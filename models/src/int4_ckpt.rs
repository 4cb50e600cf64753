//! AWQ and GPTQ int4 checkpoints (HF safetensors with a `quantization_config` in config.json):
//! each quantized linear's `qweight` / `qzeros` / `scales` (GPTQ: and `g_idx`) become one
//! `{prefix}.weight` in dsc's i4g128 — per 128 input values an f16 scale d and minimum m, the
//! 4-bit quants kept as they are: w = (q − z)·s = d·q + m with d = s, m = −z·s (m rounded once
//! to f16; d, q exact). The layouts read:
//! - AWQ (AutoAWQ's GEMM kernels, `quant_method: "awq"`, `version: "gemm"`): `qweight`
//!   int32 [in, out/8], nibble i of word j holding column 8j + [0, 2, 4, 6, 1, 3, 5, 7][i];
//!   `qzeros` int32 [in/g, out/8] packed the same way; `scales` f16 [in/g, out].
//! - GPTQ (AutoGPTQ / GPTQModel, `quant_method: "gptq"`): `qweight` int32 [in/8, out], nibble
//!   i of row r holding input 8r + i; `qzeros` int32 [in/g, out/8], nibble i of word j column
//!   8j + i, holding z − 1 (`checkpoint_format` "gptq", the default) or z ("gptq_v2");
//!   `scales` f16 [in/g, out]; `g_idx` int32 [in] — only i / g (no act-order reordering).
//!
//! dsc keeps int4 in groups of 128 values within super-blocks of 512: other group sizes, bits
//! other than 4, act-order (`desc_act` with a reordering `g_idx`) and input widths not a
//! multiple of 512 are refused with the tensor and the reason.

use crate::error::{ModelError, Result};
use crate::weights::{Bytes, WeightSet, WeightTensor};
use dsc_ir::quant::pack_i4g128;
use dsc_ir::DType;
use half::f16;
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;

/// Which int4 checkpoint layout a config.json announces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Int4Layout {
    Awq,
    /// `zeros_minus_one`: the "gptq" checkpoint format (stored z − 1), not "gptq_v2"
    Gptq { zeros_minus_one: bool },
}

/// The int4 layout of a config.json's `quantization_config`: None without one; an error
/// naming the field for one dsc does not import (another method, bits, group size).
pub fn layout_from_config(path: &Path, text: &str) -> Result<Option<Int4Layout>> {
    let v: Value = serde_json::from_str(text).map_err(|e| ModelError::Format { path: path.into(), msg: e.to_string() })?;
    let q = &v["quantization_config"];
    if q.is_null() {
        return Ok(None);
    }
    let bad = |msg: String| ModelError::Format { path: path.into(), msg: format!("field `quantization_config`: {msg}") };
    let method = q["quant_method"].as_str().unwrap_or("");
    let bits = q["bits"].as_u64().or_else(|| q["w_bit"].as_u64());
    let group = q["group_size"].as_i64().or_else(|| q["q_group_size"].as_i64());
    if bits != Some(4) {
        return Err(bad(format!("bits {bits:?}: dsc imports 4-bit AWQ/GPTQ checkpoints")));
    }
    if group != Some(128) {
        return Err(bad(format!("group_size {group:?}: dsc keeps int4 in groups of 128 (i4g128); requantize with group size 128, or import the bf16 checkpoint with `dsc compile --quant int4-g128`")));
    }
    match method {
        "awq" => {
            let version = q["version"].as_str().unwrap_or("gemm").to_ascii_lowercase();
            if version != "gemm" {
                return Err(bad(format!("AWQ version {version:?}: dsc reads AutoAWQ's \"gemm\" layout")));
            }
            if q["zero_point"].as_bool() == Some(false) {
                return Err(bad("AWQ without zero points is not imported".into()));
            }
            Ok(Some(Int4Layout::Awq))
        }
        "gptq" => {
            let fmt = q["checkpoint_format"].as_str().unwrap_or("gptq");
            let zeros_minus_one = match fmt {
                "gptq" => true,
                "gptq_v2" => false,
                other => return Err(bad(format!("GPTQ checkpoint_format {other:?}: dsc reads \"gptq\" and \"gptq_v2\""))),
            };
            Ok(Some(Int4Layout::Gptq { zeros_minus_one }))
        }
        other => Err(bad(format!("quant_method {other:?}: dsc imports \"awq\" and \"gptq\" int4 checkpoints (and dequantized bf16/f16 ones)"))),
    }
}

/// Every quantized linear of `ws` (`{prefix}.qweight` and its siblings) as one i4g128
/// `{prefix}.weight` [out, in]; returns how many were converted. `path` names the checkpoint
/// in errors.
pub fn import(ws: &mut WeightSet, layout: Int4Layout, path: &Path) -> Result<usize> {
    let prefixes: Vec<String> = ws.tensors.keys().filter_map(|n| n.strip_suffix(".qweight")).map(str::to_string).collect();
    for prefix in &prefixes {
        let w = convert(ws, layout, path, prefix)?;
        for s in ["qweight", "qzeros", "scales", "g_idx"] {
            ws.tensors.remove(&format!("{prefix}.{s}"));
        }
        ws.insert(format!("{prefix}.weight"), w);
    }
    Ok(prefixes.len())
}

/// A tensor of `ws` as little-endian i32 words (or f16 values) with its shape, checked.
fn words<'a>(ws: &'a WeightSet, path: &Path, name: &str, dtype: DType) -> Result<(&'a [u8], &'a [usize])> {
    let t = ws.get(name).ok_or_else(|| ModelError::Tensor { path: path.into(), tensor: name.into(), msg: "missing (an int4 linear needs qweight, qzeros and scales)".into() })?;
    if t.dtype != dtype {
        return Err(ModelError::Tensor { path: path.into(), tensor: name.into(), msg: format!("is {}, the int4 layout stores it as {dtype}", t.dtype) });
    }
    if t.shape.len() > 2 {
        return Err(ModelError::Tensor { path: path.into(), tensor: name.into(), msg: format!("shape {:?} is not a matrix", t.shape) });
    }
    Ok((t.bytes.as_slice(), &t.shape))
}

fn convert(ws: &WeightSet, layout: Int4Layout, path: &Path, prefix: &str) -> Result<WeightTensor> {
    let name = |s: &str| format!("{prefix}.{s}");
    let (qw, qs) = words(ws, path, &name("qweight"), DType::I32)?;
    let (qz, zs) = words(ws, path, &name("qzeros"), DType::I32)?;
    let (sc, ss) = words(ws, path, &name("scales"), DType::F16)?;
    let terr = |t: &str, msg: String| ModelError::Tensor { path: path.into(), tensor: name(t), msg };
    let (inp, out) = match (layout, qs) {
        (Int4Layout::Awq, [i, o8]) => (*i, o8 * 8),
        (Int4Layout::Gptq { .. }, [i8, o]) => (i8 * 8, *o),
        _ => return Err(terr("qweight", format!("shape {qs:?} is not a matrix"))),
    };
    let g = 128usize;
    if inp % 512 != 0 || inp == 0 || out == 0 {
        return Err(terr("qweight", format!("{inp} inputs x {out} outputs: dsc's i4g128 takes input widths that are multiples of 512")));
    }
    if zs != [inp / g, out / 8] || out % 8 != 0 {
        return Err(terr("qzeros", format!("shape {zs:?}, expected [{}, {}] for {inp} inputs, {out} outputs and groups of {g}", inp / g, out / 8)));
    }
    if ss != [inp / g, out] {
        return Err(terr("scales", format!("shape {ss:?}, expected [{}, {out}]", inp / g)));
    }
    if let Int4Layout::Gptq { .. } = layout {
        if let Some(t) = ws.get(&name("g_idx")) {
            let (gi, gs) = words(ws, path, &name("g_idx"), DType::I32)?;
            if gs != [inp] || t.dtype != DType::I32 {
                return Err(terr("g_idx", format!("shape {gs:?}, expected [{inp}]")));
            }
            if let Some(i) = (0..inp).find(|&i| word(gi, i) as usize != i / g) {
                return Err(terr("g_idx", format!("input {i} is in group {}, not {}: act-order (desc_act) checkpoints are not imported; requantize without desc_act", word(gi, i), i / g)));
            }
        }
    }
    let word_at = |b: &[u8], cols: usize, r: usize, c: usize| word(b, r * cols + c);
    // (AWQ: nibble i of a word holds column 8j + ORDER[i]; its inverse gives the nibble)
    const AWQ_NIBBLE: [u32; 8] = [0, 4, 1, 5, 2, 6, 3, 7];
    let nib = |w: u32, i: u32| (w >> (4 * i)) & 0xF;
    let q_at = |i: usize, c: usize| -> u8 {
        match layout {
            Int4Layout::Awq => nib(word_at(qw, out / 8, i, c / 8), AWQ_NIBBLE[c % 8]) as u8,
            Int4Layout::Gptq { .. } => nib(word_at(qw, out, i / 8, c), (i % 8) as u32) as u8,
        }
    };
    let z_at = |gi: usize, c: usize| -> f32 {
        match layout {
            Int4Layout::Awq => nib(word_at(qz, out / 8, gi, c / 8), AWQ_NIBBLE[c % 8]) as f32,
            Int4Layout::Gptq { zeros_minus_one } => (nib(word_at(qz, out / 8, gi, c / 8), (c % 8) as u32) + zeros_minus_one as u32) as f32,
        }
    };
    let s_at = |gi: usize, c: usize| f16::from_le_bytes([sc[2 * (gi * out + c)], sc[2 * (gi * out + c) + 1]]);
    let groups = (0..out).flat_map(|c| {
        (0..inp / g).map(move |gi| {
            let s = s_at(gi, c);
            let mut q = [0u8; 128];
            for (p, v) in q.iter_mut().enumerate() {
                *v = q_at(gi * g + p, c);
            }
            (s, f16::from_f32(-z_at(gi, c) * s.to_f32()), q)
        })
    });
    let bytes = pack_i4g128(groups);
    Ok(WeightTensor { dtype: DType::I4G128, shape: vec![out, inp], bytes: Bytes::Owned(Arc::new(bytes)) })
}

/// Little-endian i32 word `i` of `b` as u32.
fn word(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsc_ir::quant::decode;

    /// A random int4 linear (quants, zeros, f16 scales) of `out` x `inp`, packed the way the
    /// quantizers write it (AutoAWQ's `pack`: column 8j + ORDER[i] into nibble i; AutoGPTQ's:
    /// input 8r + i into nibble i of row r, zeros z − 1), in a WeightSet under `p`.
    fn linear(layout: Int4Layout, out: usize, inp: usize, seed: u64) -> (WeightSet, Vec<f32>) {
        let mut s = seed;
        let mut rnd = |m: u64| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (s >> 33) % m
        };
        let g = 128;
        let q: Vec<u32> = (0..inp * out).map(|_| rnd(16) as u32).collect(); // [in][out]
        // (GPTQ's stored z − 1 reads a zero point of 0 as 16, as its kernels do: 1..=15 here)
        let gptq = matches!(layout, Int4Layout::Gptq { .. });
        let z: Vec<u32> = (0..inp / g * out).map(|_| if gptq { 1 + rnd(15) as u32 } else { rnd(16) as u32 }).collect(); // [in/g][out]
        let sc: Vec<f16> = (0..inp / g * out).map(|_| f16::from_f32((rnd(1000) as f32 + 1.0) * 1e-5)).collect();
        let want: Vec<f32> = (0..out * inp).map(|k| (k / inp, k % inp)).map(|(c, i)| (q[i * out + c] as f32 - z[i / g * out + c] as f32) * sc[i / g * out + c].to_f32()).collect();
        const ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];
        let le = |v: &[u32]| v.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>();
        let (qw, qws, qz) = match layout {
            Int4Layout::Awq => {
                let pack = |rows: usize, v: &dyn Fn(usize, usize) -> u32| -> Vec<u32> { (0..rows * out / 8).map(|k| (k / (out / 8), k % (out / 8))).map(|(r, j)| (0..8).fold(0u32, |w, i| w | v(r, 8 * j + ORDER[i]) << (4 * i))).collect() };
                (pack(inp, &|r, c| q[r * out + c]), vec![inp, out / 8], pack(inp / g, &|r, c| z[r * out + c]))
            }
            Int4Layout::Gptq { .. } => {
                let qw: Vec<u32> = (0..inp / 8 * out).map(|k| (k / out, k % out)).map(|(r, c)| (0..8).fold(0u32, |w, i| w | q[(8 * r + i) * out + c] << (4 * i))).collect();
                let qz: Vec<u32> = (0..inp / g * out / 8).map(|k| (k / (out / 8), k % (out / 8))).map(|(r, j)| (0..8).fold(0u32, |w, i| w | (z[r * out + 8 * j + i].wrapping_sub(1) & 0xF) << (4 * i))).collect();
                (qw, vec![inp / 8, out], qz)
            }
        };
        let mut ws = WeightSet::default();
        let t = |dtype, shape: Vec<usize>, b: Vec<u8>| WeightTensor { dtype, shape, bytes: Bytes::Owned(Arc::new(b)) };
        ws.insert("p.qweight", t(DType::I32, qws, le(&qw)));
        ws.insert("p.qzeros", t(DType::I32, vec![inp / g, out / 8], le(&qz)));
        ws.insert("p.scales", t(DType::F16, vec![inp / g, out], sc.iter().flat_map(|v| v.to_le_bytes()).collect()));
        if matches!(layout, Int4Layout::Gptq { .. }) {
            ws.insert("p.g_idx", t(DType::I32, vec![inp], le(&(0..inp as u32).map(|i| i / g as u32).collect::<Vec<_>>())));
        }
        (ws, want)
    }

    #[test]
    fn awq_and_gptq_linears_become_i4g128_with_every_value_as_the_checkpoint_means_it() {
        for layout in [Int4Layout::Awq, Int4Layout::Gptq { zeros_minus_one: true }] {
            let (out, inp) = (24, 1024);
            let (mut ws, want) = linear(layout, out, inp, 7);
            assert_eq!(import(&mut ws, layout, Path::new("ckpt")).unwrap(), 1);
            assert_eq!(ws.tensors.keys().collect::<Vec<_>>(), vec!["p.weight"], "{layout:?}: the packed tensors replaced");
            let w = ws.get("p.weight").unwrap();
            assert_eq!((w.dtype, w.shape.clone()), (DType::I4G128, vec![out, inp]));
            let got = decode(DType::I4G128, w.bytes.as_slice(), out * inp).unwrap();
            // (d·q exact; m = −z·s rounded once to f16: half an f16 ulp of 15·s at most)
            for (k, (g, e)) in got.iter().zip(&want).enumerate() {
                assert!((g - e).abs() <= 15.0 * 0.02 * 2f32.powi(-11) + 1e-9, "{layout:?} value {k}: {g} vs {e}");
            }
            // (a quant read from the wrong nibble would be off by a multiple of d >= 1e-5 in
            // most values; the rounding of m is the same for a whole group: the errors of a
            // group's values are all equal)
            for (c, row) in got.chunks(inp).zip(want.chunks(inp)).map(|(g, e)| g.iter().zip(e).map(|(a, b)| a - b).collect::<Vec<_>>()).enumerate() {
                for grp in row.chunks(128) {
                    assert!(grp.iter().all(|e| (e - grp[0]).abs() <= 1e-7), "{layout:?} row {c}: errors differ within a group: {:?}", &grp[..4]);
                }
            }
        }
    }

    #[test]
    fn unsupported_int4_checkpoints_are_refused_by_name() {
        let p = Path::new("config.json");
        let cfg = |q: &str| format!("{{\"quantization_config\": {q}}}");
        assert_eq!(layout_from_config(p, "{}").unwrap(), None);
        assert_eq!(layout_from_config(p, &cfg(r#"{"quant_method": "awq", "bits": 4, "group_size": 128, "version": "GEMM", "zero_point": true}"#)).unwrap(), Some(Int4Layout::Awq));
        assert_eq!(layout_from_config(p, &cfg(r#"{"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": false}"#)).unwrap(), Some(Int4Layout::Gptq { zeros_minus_one: true }));
        for (q, says) in [
            (r#"{"quant_method": "gptq", "bits": 8, "group_size": 128}"#, "bits"),
            (r#"{"quant_method": "awq", "bits": 4, "group_size": 64}"#, "group_size"),
            (r#"{"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}"#, "version"),
            (r#"{"quant_method": "bitsandbytes", "bits": 4, "group_size": 128}"#, "quant_method"),
        ] {
            let e = layout_from_config(p, &cfg(q)).unwrap_err().to_string();
            assert!(e.contains("quantization_config") && e.contains(says) && e.contains("config.json"), "{q}: {e}");
        }
        // act-order GPTQ: a g_idx that is not i / 128
        let (mut ws, _) = linear(Int4Layout::Gptq { zeros_minus_one: true }, 8, 512, 3);
        let mut gi: Vec<u32> = (0..512u32).map(|i| i / 128).collect();
        gi.swap(5, 300);
        ws.insert("p.g_idx", WeightTensor { dtype: DType::I32, shape: vec![512], bytes: Bytes::Owned(Arc::new(gi.iter().flat_map(|w| w.to_le_bytes()).collect())) });
        let e = import(&mut ws, Int4Layout::Gptq { zeros_minus_one: true }, Path::new("m.safetensors")).unwrap_err().to_string();
        assert!(e.contains("p.g_idx") && e.contains("act-order"), "{e}");
        // input widths outside i4g128's super-blocks, a missing sibling
        let (mut ws, _) = linear(Int4Layout::Awq, 8, 384, 3);
        let e = import(&mut ws, Int4Layout::Awq, Path::new("m.safetensors")).unwrap_err().to_string();
        assert!(e.contains("p.qweight") && e.contains("512"), "{e}");
        let (mut ws, _) = linear(Int4Layout::Awq, 8, 512, 3);
        ws.tensors.remove("p.scales");
        let e = import(&mut ws, Int4Layout::Awq, Path::new("m.safetensors")).unwrap_err().to_string();
        assert!(e.contains("p.scales") && e.contains("missing"), "{e}");
    }
}
