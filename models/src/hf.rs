//! Hugging Face checkpoints: `config.json` and `*.safetensors` (one file, or shards listed by
//! `model.safetensors.index.json`), memory-mapped.

use crate::config::Dims;
use crate::error::{io, ModelError, Result};
use crate::weights::{Bytes, WeightSet, WeightTensor};
use dsc_ir::DType;
use memmap2::Mmap;
use safetensors::{Dtype as StDtype, SafeTensors};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn st_dtype(d: StDtype) -> Option<DType> {
    Some(match d {
        StDtype::F32 => DType::F32,
        StDtype::F16 => DType::F16,
        StDtype::BF16 => DType::BF16,
        StDtype::F8_E4M3 => DType::F8E4M3,
        StDtype::F8_E5M2 => DType::F8E5M2,
        StDtype::I8 => DType::I8,
        StDtype::I32 => DType::I32,
        _ => return None,
    })
}

/// The safetensors files of a checkpoint: `path` is a .safetensors file or a folder holding
/// `model.safetensors` or `model.safetensors.index.json`.
pub fn safetensors_files(path: &Path) -> Result<Vec<PathBuf>> {
    if path.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    if !path.exists() {
        return Err(ModelError::Io { path: path.into(), source: std::io::Error::new(std::io::ErrorKind::NotFound, "weights not found") });
    }
    let index = path.join("model.safetensors.index.json");
    if index.exists() {
        let text = std::fs::read_to_string(&index).map_err(io(&index))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| ModelError::Format { path: index.clone(), msg: e.to_string() })?;
        let map = v["weight_map"].as_object().ok_or(ModelError::Format { path: index.clone(), msg: "no `weight_map` object".into() })?;
        let mut files: Vec<PathBuf> = map.values().filter_map(|f| f.as_str()).map(|f| path.join(f)).collect();
        files.sort();
        files.dedup();
        return Ok(files);
    }
    let single = path.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    Err(ModelError::Io { path: path.into(), source: std::io::Error::new(std::io::ErrorKind::NotFound, "no model.safetensors or model.safetensors.index.json in this folder") })
}

/// One tensor of a safetensors file: name, dtype, shape, and its bytes' offset and length.
pub type StEntry = (String, DType, Vec<usize>, usize, usize);

/// The tensors a safetensors file's bytes hold (sorted by name), every one checked: header,
/// dtype, shape against its byte length. `path` names the file in errors.
pub fn safetensors_index(path: &Path, bytes: &[u8]) -> Result<Vec<StEntry>> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| ModelError::Format { path: path.into(), msg: format!("not a valid safetensors file: {e}") })?;
    let base = bytes.as_ptr() as usize;
    let mut names = st.names();
    names.sort();
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let terr = |msg: String| ModelError::Tensor { path: path.into(), tensor: name.to_string(), msg };
        let v = st.tensor(name).map_err(|e| terr(e.to_string()))?;
        let dtype = st_dtype(v.dtype()).ok_or_else(|| terr(format!("unsupported dtype {:?}", v.dtype())))?;
        let numel = v.shape().iter().try_fold(1usize, |a, &d| a.checked_mul(d)).ok_or_else(|| terr(format!("shape {:?} overflows", v.shape())))?;
        let data = v.data();
        if dtype.bytes_for(numel) != Some(data.len()) {
            return Err(terr(format!("{} bytes do not hold a {dtype}{:?}", data.len(), v.shape())));
        }
        out.push((name.to_string(), dtype, v.shape().to_vec(), data.as_ptr() as usize - base, data.len()));
    }
    Ok(out)
}

pub fn load_safetensors(files: &[PathBuf]) -> Result<WeightSet> {
    let mut set = WeightSet::default();
    for f in files {
        let file = std::fs::File::open(f).map_err(io(f))?;
        // SAFETY: read-only map of a file we do not modify.
        let map = Arc::new(unsafe { Mmap::map(&file) }.map_err(io(f))?);
        let file_path = Arc::new(f.clone());
        for (name, dtype, shape, offset, len) in safetensors_index(f, &map)? {
            set.insert(name, WeightTensor { dtype, shape, bytes: Bytes::Mapped { map: map.clone(), file: file_path.clone(), offset, len } });
        }
    }
    Ok(set)
}

/// Llama-family dims from an HF `config.json`.
pub fn dims_from_config(path: &Path) -> Result<Dims> {
    let text = std::fs::read_to_string(path).map_err(io(path))?;
    dims_from_config_text(path, &text)
}

/// [`dims_from_config`] from the file's text (`path` names it in errors).
pub fn dims_from_config_text(path: &Path, text: &str) -> Result<Dims> {
    let v: Value = serde_json::from_str(text).map_err(|e| ModelError::Format { path: path.into(), msg: e.to_string() })?;
    let need = |k: &str| -> Result<u64> { v[k].as_u64().ok_or(ModelError::Format { path: path.into(), msg: format!("field `{k}` is missing or not an integer") }) };
    let hidden = need("hidden_size")? as usize;
    let heads = need("num_attention_heads")? as usize;
    if heads == 0 {
        return Err(ModelError::Format { path: path.into(), msg: "field `num_attention_heads` is 0".into() });
    }
    let mt = v["model_type"].as_str().unwrap_or("llama");
    let d = Dims {
        hidden,
        layers: need("num_hidden_layers")? as usize,
        heads,
        kv_heads: v["num_key_value_heads"].as_u64().map(|x| x as usize).unwrap_or(heads),
        head_dim: v["head_dim"].as_u64().map(|x| x as usize).unwrap_or(hidden / heads),
        ffn: need("intermediate_size")? as usize,
        vocab: need("vocab_size")? as usize,
        rope_theta: v["rope_theta"].as_f64().unwrap_or(10000.0) as f32,
        norm_eps: v["rms_norm_eps"].as_f64().unwrap_or(1e-6) as f32,
        tie_embeddings: v["tie_word_embeddings"].as_bool().unwrap_or(false),
        attention_bias: v["attention_bias"].as_bool().unwrap_or(mt == "qwen2"),
        max_position: v["max_position_embeddings"].as_u64().map(|x| x as usize),
    };
    d.check(&crate::config::HF_NAMES).map_err(|msg| ModelError::Format { path: path.into(), msg })?;
    Ok(d)
}
