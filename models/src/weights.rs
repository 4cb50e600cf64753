//! A set of named weight tensors in their stored dtype: memory-mapped from a checkpoint,
//! converted at compile time, or generated from a seed.

use dsc_ir::{DType, WeightSource};
use memmap2::Mmap;
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

/// How a seeded tensor is generated (`dsc_ir::seeded`), in its stored dtype.
#[derive(Clone, Debug, PartialEq)]
pub struct SeededSpec {
    pub seed: u64,
    pub scale: f32,
    pub ones: bool,
}

#[derive(Clone)]
pub enum Bytes {
    /// a range of a checkpoint file (kept so a plan can reference it instead of copying it)
    Mapped {
        map: Arc<Mmap>,
        file: Arc<std::path::PathBuf>,
        offset: usize,
        len: usize,
    },
    Owned(Arc<Vec<u8>>),
    /// generated on first use (on the CPU); the GPU runtime generates it on the device
    Seeded {
        spec: SeededSpec,
        name: String,
        dtype: DType,
        numel: usize,
        cache: Arc<OnceLock<Vec<u8>>>,
    },
}

impl Bytes {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped { map, offset, len, .. } => &map[*offset..offset + len],
            Bytes::Owned(v) => v,
            Bytes::Seeded { spec, name, dtype, numel, cache } => cache.get_or_init(|| {
                let v = dsc_ir::seeded::values(spec.seed, name, *numel, spec.scale, spec.ones);
                dsc_ir::quant::encode(*dtype, &v).unwrap_or_default()
            }),
        }
    }

    pub fn seeded(&self) -> Option<&SeededSpec> {
        match self {
            Bytes::Seeded { spec, .. } => Some(spec),
            _ => None,
        }
    }

    /// Stored size without generating anything.
    pub fn len(&self, dtype: DType, numel: usize) -> usize {
        match self {
            Bytes::Mapped { len, .. } => *len,
            Bytes::Owned(v) => v.len(),
            Bytes::Seeded { .. } => dtype.bytes_for(numel).unwrap_or(0),
        }
    }
}

#[derive(Clone)]
pub struct WeightTensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub bytes: Bytes,
}

/// Weights by checkpoint name, in name order.
#[derive(Clone, Default)]
pub struct WeightSet {
    pub tensors: BTreeMap<String, WeightTensor>,
}

impl WeightSet {
    pub fn insert(&mut self, name: impl Into<String>, t: WeightTensor) {
        self.tensors.insert(name.into(), t);
    }
    pub fn get(&self, name: &str) -> Option<&WeightTensor> {
        self.tensors.get(name)
    }
    pub fn total_bytes(&self) -> usize {
        self.tensors.values().map(|t| t.bytes.len(t.dtype, t.shape.iter().product())).sum()
    }
}

impl WeightSource for WeightSet {
    fn weight(&self, name: &str) -> Option<(DType, Vec<usize>, &[u8])> {
        self.tensors.get(name).map(|t| (t.dtype, t.shape.clone(), t.bytes.as_slice()))
    }
}

/// Seeded values (see `dsc_ir::seeded`).
pub fn seeded_values(seed: u64, name: &str, numel: usize, scale: f32, ones: bool) -> Vec<f32> {
    dsc_ir::seeded::values(seed, name, numel, scale, ones)
}
