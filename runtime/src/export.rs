//! A plan's weights back out as an HF safetensors file, under the checkpoint's own names:
//! seeded weights generated, DeepSeek's import-time derivations undone (the stacked experts
//! split per expert, `kv_b_proj`'s per-head halves joined). What lets HF transformers load the
//! exact weights a seeded benchmark plan runs on (the full-width HF comparison), and a plan's
//! weights be checked against its source.

use crate::plan::Plan;
use crate::{Result, RuntimeError};
use dsc_ir::DType;
use safetensors::Dtype;
use std::collections::BTreeMap;
use std::path::Path;

fn st_dtype(d: DType) -> Option<Dtype> {
    Some(match d {
        DType::F32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        _ => return None,
    })
}

/// The tensors of an HF checkpoint with these weights: name -> (dtype, shape, bytes).
pub fn hf_tensors(plan: &Plan) -> Result<BTreeMap<String, (DType, Vec<usize>, Vec<u8>)>> {
    let perr = |msg: String| RuntimeError::Plan { path: plan.path.clone(), msg };
    let mut out = BTreeMap::new();
    for e in &plan.header.weights.tensors {
        let dtype: DType = e.dtype.parse().map_err(|m: String| perr(format!("weight `{}`: {m}", e.name)))?;
        if st_dtype(dtype).is_none() {
            return Err(perr(format!("weight `{}` is {dtype}: the export writes f32/f16/bf16 tensors", e.name)));
        }
        let bytes = plan.weight_bytes(e);
        let name = e.name.as_str();
        // routed experts stacked [E, out, in] -> experts.E.<proj>.weight
        if let Some((layer, proj)) = name.strip_prefix("model.layers.").and_then(|r| r.split_once(".mlp.experts.")).filter(|_| e.shape.len() == 3) {
            let per = bytes.len() / e.shape[0].max(1);
            for x in 0..e.shape[0] {
                out.insert(format!("model.layers.{layer}.mlp.experts.{x}.{proj}"), (dtype, e.shape[1..].to_vec(), bytes[x * per..(x + 1) * per].to_vec()));
            }
            continue;
        }
        if let Some(base) = name.strip_suffix(".kv_b_proj.k_heads.weight") {
            // k [H, L, nope] + v [H, v, L] -> [H * (nope + v), L], rows per head: nope of k (transposed), then v
            let vname = format!("{base}.kv_b_proj.v_heads.weight");
            let ve = plan.header.weights.tensors.iter().find(|t| t.name == vname).ok_or_else(|| perr(format!("`{vname}` missing beside `{name}`")))?;
            let (h, l, nope, vd) = (e.shape[0], e.shape[1], e.shape[2], ve.shape[1]);
            let k = dsc_ir::quant::decode(dtype, bytes, h * l * nope).ok_or_else(|| perr(format!("weight `{name}`: bytes do not match its shape")))?;
            let v = dsc_ir::quant::decode(dtype, plan.weight_bytes(ve), h * vd * l).ok_or_else(|| perr(format!("weight `{vname}`: bytes do not match its shape")))?;
            let mut w = Vec::with_capacity(h * (nope + vd) * l);
            for hi in 0..h {
                for n in 0..nope {
                    w.extend((0..l).map(|c| k[(hi * l + c) * nope + n]));
                }
                w.extend_from_slice(&v[hi * vd * l..(hi + 1) * vd * l]);
            }
            out.insert(format!("{base}.kv_b_proj.weight"), (dtype, vec![h * (nope + vd), l], dsc_ir::quant::encode(dtype, &w).unwrap_or_default()));
            continue;
        }
        if name.ends_with(".kv_b_proj.v_heads.weight") {
            continue;
        }
        out.insert(e.name.clone(), (dtype, e.shape.clone(), bytes.to_vec()));
    }
    Ok(out)
}

/// Write [`hf_tensors`] as `dir/model.safetensors`.
pub fn export_hf(plan: &Plan, dir: &Path) -> Result<()> {
    let tensors = hf_tensors(plan)?;
    std::fs::create_dir_all(dir).map_err(|e| RuntimeError::Request(format!("{}: {e}", dir.display())))?;
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(n, (d, s, b))| safetensors::tensor::TensorView::new(st_dtype(*d).expect("checked"), s.clone(), b).map(|v| (n.clone(), v)))
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| RuntimeError::Request(format!("export: {e}")))?;
    let path = dir.join("model.safetensors");
    safetensors::serialize_to_file(views, None, &path).map_err(|e| RuntimeError::Request(format!("{}: {e}", path.display())))
}
