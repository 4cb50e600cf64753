//! A set of named weight tensors in their stored dtype: memory-mapped from a checkpoint,
//! converted at compile time, or generated from a seed.

use dsc_ir::{DType, WeightSource};
use memmap2::Mmap;
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Clone)]
pub enum Bytes {
    Mapped { map: Arc<Mmap>, offset: usize, len: usize },
    Owned(Arc<Vec<u8>>),
}

impl Bytes {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped { map, offset, len } => &map[*offset..offset + len],
            Bytes::Owned(v) => v,
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
        self.tensors.values().map(|t| t.bytes.as_slice().len()).sum()
    }
}

impl WeightSource for WeightSet {
    fn weight(&self, name: &str) -> Option<(DType, Vec<usize>, &[u8])> {
        self.tensors.get(name).map(|t| (t.dtype, t.shape.clone(), t.bytes.as_slice()))
    }
}

/// splitmix64: the counter-based generator behind seeded weights. Element `i` of a tensor
/// is a function of (seed, tensor name, i) alone, so any device can regenerate it.
pub fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a of a tensor name, mixed into the seed.
pub fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x1000_0000_01b3))
}

/// Seeded values: uniform in [-scale, scale) (or exactly `1.0` when `ones`, for norm weights).
pub fn seeded_values(seed: u64, name: &str, numel: usize, scale: f32, ones: bool) -> Vec<f32> {
    if ones {
        return vec![1.0; numel];
    }
    let base = splitmix64(seed ^ name_hash(name));
    (0..numel as u64)
        .map(|i| {
            let r = splitmix64(base.wrapping_add(i));
            let u = (r >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
            (2.0 * u - 1.0) * scale
        })
        .collect()
}
