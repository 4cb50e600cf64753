//! Element types. Plain types have a fixed byte size per element; packed types (int4 and the
//! GGUF block formats) store a block of elements with its own scale(s) in a fixed number of bytes.

use std::fmt;
use std::str::FromStr;

// (GGUF's names: Q4_K, not Q4K)
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    BF16,
    /// FP8 e4m3 (finite-only, max 448), as in the OCP FP8 spec and Hopper's tensor cores.
    F8E4M3,
    /// FP8 e5m2 (IEEE-like, max 57344).
    F8E5M2,
    I8,
    I32,
    /// Two signed 4-bit values per byte, low nibble first. Scales live in a separate tensor.
    I4,
    /// GGUF Q8_0: blocks of 32, f16 scale d + 32 x i8; x = d * q.
    Q8_0,
    /// GGUF Q4_0: blocks of 32, f16 scale d + 16 bytes of nibbles; x = d * (q - 8).
    Q4_0,
    /// GGUF Q4_1: blocks of 32, f16 scale d, f16 min m + 16 bytes of nibbles; x = d * q + m.
    Q4_1,
    /// GGUF Q5_0: blocks of 32 (22 bytes), f16 scale d, a u32 of fifth bits (bit j: element j),
    /// 16 bytes of nibbles as Q4_0's; x = d · (q − 16). llama.cpp's fallback for Q4_K rows that
    /// are not whole super-blocks (most of SmolLM2-135M's Q4_K_M).
    Q5_0,
    /// GGUF Q5_1: as Q5_0 with an f16 min m after d (24 bytes); x = d · q + m (Q5_K_M's fallback).
    Q5_1,
    /// GGUF Q4_K: super-blocks of 256 (144 bytes): f16 d, f16 dmin, 12 bytes of 6-bit scales
    /// and mins for 8 sub-blocks of 32, 128 bytes of nibbles; x = (d · sc) · q − dmin · m.
    Q4_K,
    /// GGUF Q5_K: as Q4_K (176 bytes) with a fifth bit per value in 32 bytes of high bits.
    Q5_K,
    /// GGUF Q6_K: super-blocks of 256 (210 bytes): 128 bytes of low nibbles, 64 of 2-bit highs,
    /// 16 i8 scales of 16-value groups, f16 d; x = (d · scale) · (q − 32).
    Q6_K,
    /// Int4 with one f16 scale d and one f16 minimum m per group of 128 values (x = d · q + m;
    /// symmetric int4 is m = −8d): super-blocks of 512 values (272 bytes, 4.25 bits a value) —
    /// the four groups' (d, m) pairs, then each group's 64 bytes of nibbles, in the order the
    /// tensor-core GEMV's lanes read them (`kernels/matmul/packed.rs`): 16-byte chunk c of a group
    /// is lane c's, its word w the values 32w + 4c + (0..4) and 32w + 16 + 4c + (0..4), value i
    /// of a word in nibble i / 2 (even i) or 4 + i / 2 (`dsc_ir::quant::i4g128_nibble`). dsc's
    /// own layout, written by `dsc compile --quant int4-g128`.
    I4G128,
    /// FP8 e4m3 with one f32 scale per group of 128 values (x = s · e4m3; s = the group's
    /// |max| / 448): super-blocks of 512 values (528 bytes, 8.25 bits a value) — the four
    /// groups' f32 scales, then the 512 e4m3 bytes in natural order. DeepSeek-V3's 128x128
    /// block scales are this with the block's scale in each of its 128 rows (exact); dsc's own
    /// layout, written by `dsc compile --quant fp8` and read by the tensor-core GEMV
    /// (`kernels/matmul/packed.rs`) and every other weight reader.
    F8G128,
    /// FP8 e4m3 in blocks of 32 values, each block an f32 scale then its 32 e4m3 bytes (36
    /// bytes, 9 bits a value; x = s · e4m3): `--quant fp8` for rows that are not whole
    /// 512-value super-blocks (SmolLM2's 576, DeepSeek-V2-Lite's 1,408-wide experts), every
    /// block carrying its 128-value group's scale (`dsc_ir::quant::f8g32_rows`). The CPU
    /// executor reads it; no GPU kernel yet.
    F8G32,
    /// 2:4 structured-sparse bf16: of every 4 consecutive values of a row at most 2 are
    /// nonzero, and only those are stored. Blocks of 32 values (36 bytes, 9 bits a value): the
    /// 16 kept values as bf16 (group g's two at 2g, 2g + 1), then a little-endian u32 of
    /// positions — group g's in bits 4g..4g+4, the first kept value's index (0..4) in the low
    /// two bits and the second's (greater) in the high two, the 2-bit indices sparse tensor
    /// cores read beside the values. Written by `precision.sparsity = "2:4"`
    /// (`models/src/sparsity.rs`); the CPU executor reads it; no GPU kernel yet.
    Sp24Bf16,
}

impl DType {
    pub const ALL: [DType; 20] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F8E4M3,
        DType::F8E5M2,
        DType::I8,
        DType::I32,
        DType::I4,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::I4G128,
        DType::F8G128,
        DType::F8G32,
        DType::Sp24Bf16,
    ];

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F8E4M3 => "f8e4m3",
            DType::F8E5M2 => "f8e5m2",
            DType::I8 => "i8",
            DType::I32 => "i32",
            DType::I4 => "i4",
            DType::Q8_0 => "q8_0",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q5_0 => "q5_0",
            DType::Q5_1 => "q5_1",
            DType::Q4_K => "q4_k",
            DType::Q5_K => "q5_k",
            DType::Q6_K => "q6_k",
            DType::I4G128 => "i4g128",
            DType::F8G128 => "f8g128",
            DType::F8G32 => "f8g32",
            DType::Sp24Bf16 => "sp24_bf16",
        }
    }

    /// (elements per block, bytes per block). Plain types are blocks of one element
    /// (int4 is a block of two elements in one byte).
    pub fn block(self) -> (usize, usize) {
        match self {
            DType::F32 | DType::I32 => (1, 4),
            DType::F16 | DType::BF16 => (1, 2),
            DType::F8E4M3 | DType::F8E5M2 | DType::I8 => (1, 1),
            DType::I4 => (2, 1),
            DType::Q8_0 => (32, 34),
            DType::Q4_0 => (32, 18),
            DType::Q4_1 => (32, 20),
            DType::Q5_0 => (32, 22),
            DType::Q5_1 => (32, 24),
            DType::Q4_K => (256, 144),
            DType::Q5_K => (256, 176),
            DType::Q6_K => (256, 210),
            DType::I4G128 => (512, 272),
            DType::F8G128 => (512, 528),
            DType::F8G32 => (32, 36),
            DType::Sp24Bf16 => (32, 36),
        }
    }

    /// True for formats whose scales are stored inside the data (GGUF blocks) or that pack
    /// several elements per byte.
    pub fn is_packed(self) -> bool {
        self.block().0 > 1
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2)
    }

    pub fn is_int(self) -> bool {
        matches!(self, DType::I8 | DType::I32 | DType::I4)
    }

    /// Bytes needed for `n` elements, or None when `n` is not a whole number of blocks.
    pub fn bytes_for(self, n: usize) -> Option<usize> {
        let (be, bb) = self.block();
        if n % be != 0 {
            return None;
        }
        (n / be).checked_mul(bb)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        DType::ALL.iter().copied().find(|d| d.name() == s).ok_or_else(|| {
            let names: Vec<_> = DType::ALL.iter().map(|d| d.name()).collect();
            format!("unknown dtype `{s}` (expected one of {})", names.join(", "))
        })
    }
}
