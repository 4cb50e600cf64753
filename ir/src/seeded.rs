//! Seeded weights: element `i` of a tensor is a function of (seed, tensor name, i) alone, so
//! a benchmark model's weights are generated where they are used (on the GPU, or lazily on
//! the CPU) instead of being stored and shipped.
//!
//! value(i) = (2 u - 1) * scale with u = (splitmix64(base + i) >> 40) / 2^24,
//! base = splitmix64(seed ^ fnv1a64(name)); norm weights are exactly 1.0 (`ones`).

/// splitmix64 (Steele, Lea, Flood 2014).
pub fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a (64-bit) of a tensor name.
pub fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x1000_0000_01b3))
}

/// The per-tensor stream start.
pub fn base(seed: u64, name: &str) -> u64 {
    splitmix64(seed ^ name_hash(name))
}

pub fn value(base: u64, i: u64, scale: f32) -> f32 {
    let r = splitmix64(base.wrapping_add(i));
    let u = (r >> 40) as f32 / (1u64 << 24) as f32; // [0, 1), exact in f32
    (2.0 * u - 1.0) * scale
}

pub fn values(seed: u64, name: &str, numel: usize, scale: f32, ones: bool) -> Vec<f32> {
    if ones {
        return vec![1.0; numel];
    }
    let b = base(seed, name);
    (0..numel as u64).map(|i| value(b, i, scale)).collect()
}
