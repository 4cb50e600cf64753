//! Byte-level encode/decode of every [`DType`]: the reference semantics of each storage
//! format. The CPU executor uses these to widen weights to f32; quantization passes and
//! tests use the encoders.

use crate::DType;
use half::{bf16, f16};

/// Decode `bytes` holding `n` elements of `dtype` into f32. Int formats decode to their
/// integer values (their scales, if any, are separate tensors). Returns None when the byte
/// count does not match `n` elements.
pub fn decode(dtype: DType, bytes: &[u8], n: usize) -> Option<Vec<f32>> {
    if dtype.bytes_for(n)? != bytes.len() {
        return None;
    }
    let mut out = Vec::with_capacity(n);
    match dtype {
        DType::F32 => out.extend(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
        DType::F16 => out.extend(bytes.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())),
        DType::BF16 => out.extend(bytes.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())),
        DType::F8E4M3 => out.extend(bytes.iter().map(|&b| f8e4m3_to_f32(b))),
        DType::F8E5M2 => out.extend(bytes.iter().map(|&b| f8e5m2_to_f32(b))),
        DType::I8 => out.extend(bytes.iter().map(|&b| b as i8 as f32)),
        DType::I32 => out.extend(bytes.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32)),
        DType::I4 => {
            for &b in bytes {
                out.push(((b << 4) as i8 >> 4) as f32);
                out.push(((b as i8) >> 4) as f32);
            }
        }
        DType::Q8_0 => {
            for blk in bytes.chunks_exact(34) {
                let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
                out.extend(blk[2..].iter().map(|&q| d * (q as i8) as f32));
            }
        }
        DType::Q4_0 => {
            for blk in bytes.chunks_exact(18) {
                let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
                let qs = &blk[2..];
                out.extend(qs.iter().map(|&q| d * ((q & 0xF) as f32 - 8.0)));
                out.extend(qs.iter().map(|&q| d * ((q >> 4) as f32 - 8.0)));
            }
        }
        DType::Q4_1 => {
            for blk in bytes.chunks_exact(20) {
                let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
                let m = f16::from_le_bytes([blk[2], blk[3]]).to_f32();
                let qs = &blk[4..];
                out.extend(qs.iter().map(|&q| d * (q & 0xF) as f32 + m));
                out.extend(qs.iter().map(|&q| d * (q >> 4) as f32 + m));
            }
        }
    }
    Some(out)
}

/// Encode f32 values as `dtype` (round to nearest even; FP8 and ints saturate). Block formats
/// use llama.cpp's reference quantizers. Returns None when `x.len()` is not a whole number of
/// blocks.
pub fn encode(dtype: DType, x: &[f32]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(dtype.bytes_for(x.len())?);
    match dtype {
        DType::F32 => x.iter().for_each(|v| out.extend(v.to_le_bytes())),
        DType::F16 => x.iter().for_each(|v| out.extend(f16::from_f32(*v).to_le_bytes())),
        DType::BF16 => x.iter().for_each(|v| out.extend(bf16::from_f32(*v).to_le_bytes())),
        DType::F8E4M3 => out.extend(x.iter().map(|&v| f32_to_f8e4m3(v))),
        DType::F8E5M2 => out.extend(x.iter().map(|&v| f32_to_f8e5m2(v))),
        DType::I8 => out.extend(x.iter().map(|&v| v.round_ties_even().clamp(-128.0, 127.0) as i8 as u8)),
        DType::I32 => x.iter().for_each(|v| out.extend((v.round_ties_even() as i32).to_le_bytes())),
        DType::I4 => {
            let q = |v: f32| (v.round_ties_even().clamp(-8.0, 7.0) as i8 as u8) & 0xF;
            out.extend(x.chunks_exact(2).map(|p| q(p[0]) | (q(p[1]) << 4)));
        }
        DType::Q8_0 => {
            for blk in x.chunks_exact(32) {
                let amax = blk.iter().fold(0f32, |a, v| a.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend(f16::from_f32(d).to_le_bytes());
                out.extend(blk.iter().map(|v| (v * id).round() as i8 as u8));
            }
        }
        DType::Q4_0 => {
            for blk in x.chunks_exact(32) {
                let max = blk.iter().fold(0f32, |a, &v| if v.abs() > a.abs() { v } else { a });
                let d = max / -8.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend(f16::from_f32(d).to_le_bytes());
                let q = |v: f32| ((v * id + 8.5) as i32).clamp(0, 15) as u8;
                out.extend((0..16).map(|j| q(blk[j]) | (q(blk[j + 16]) << 4)));
            }
        }
        DType::Q4_1 => {
            for blk in x.chunks_exact(32) {
                let min = blk.iter().copied().fold(f32::INFINITY, f32::min);
                let max = blk.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let d = (max - min) / 15.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend(f16::from_f32(d).to_le_bytes());
                out.extend(f16::from_f32(min).to_le_bytes());
                let q = |v: f32| (((v - min) * id + 0.5) as i32).clamp(0, 15) as u8;
                out.extend((0..16).map(|j| q(blk[j]) | (q(blk[j + 16]) << 4)));
            }
        }
    }
    Some(out)
}

/// Round `x` to the nearest value representable in `dtype` (fake quantization), the f32
/// semantics the reference executor gives a `quantize` op for float formats.
pub fn round_to(dtype: DType, x: f32) -> f32 {
    match dtype {
        DType::F32 => x,
        DType::F16 => f16::from_f32(x).to_f32(),
        DType::BF16 => bf16::from_f32(x).to_f32(),
        DType::F8E4M3 => f8e4m3_to_f32(f32_to_f8e4m3(x)),
        DType::F8E5M2 => f8e5m2_to_f32(f32_to_f8e5m2(x)),
        DType::I8 => x.round_ties_even().clamp(-128.0, 127.0),
        DType::I4 => x.round_ties_even().clamp(-8.0, 7.0),
        DType::I32 => x.round_ties_even(),
        DType::Q8_0 | DType::Q4_0 | DType::Q4_1 => x,
    }
}

pub fn f8e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((b >> 3) & 0xF) as i32;
    let m = (b & 7) as f32;
    if e == 15 && b & 7 == 7 {
        return f32::NAN;
    }
    if e == 0 {
        sign * m / 8.0 * 2f32.powi(-6)
    } else {
        sign * (1.0 + m / 8.0) * 2f32.powi(e - 7)
    }
}

/// f32 → e4m3fn, round to nearest even, saturating to ±448; NaN stays NaN.
pub fn f32_to_f8e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7F;
    }
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs();
    if a >= 448.0 {
        return sign | 0x7E;
    }
    if a < 2f32.powi(-6) {
        // subnormal range: multiples of 2^-9; q == 8 encodes the smallest normal exactly
        return sign | (a * 512.0).round_ties_even() as u8;
    }
    let bits = a.to_bits();
    // keep 3 mantissa bits, round to nearest even on the 20 dropped bits
    let rounded = bits + ((1 << 19) - 1) + ((bits >> 20) & 1);
    let exp = ((rounded >> 23) as i32) - 127 + 7;
    let man = ((rounded >> 20) & 7) as u8;
    let code = ((exp as u8) << 3) | man;
    if code > 0x7E {
        sign | 0x7E
    } else {
        sign | code
    }
}

pub fn f8e5m2_to_f32(b: u8) -> f32 {
    f16::from_bits((b as u16) << 8).to_f32()
}

/// f32 → e5m2 (via f16, round to nearest even on the dropped byte), saturating to ±57344.
pub fn f32_to_f8e5m2(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7F;
    }
    let h = f16::from_f32(x.clamp(-57344.0, 57344.0)).to_bits();
    let r = h + 0x7F + ((h >> 8) & 1);
    let b = (r >> 8) as u8;
    if b & 0x7F > 0x7B {
        (b & 0x80) | 0x7B
    } else {
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_e4m3_roundtrips_every_finite_code() {
        for b in 0u8..=255 {
            let v = f8e4m3_to_f32(b);
            if v.is_nan() {
                continue;
            }
            let back = f32_to_f8e4m3(v);
            // +0 and -0 are distinct codes; both decode to 0
            assert_eq!(f8e4m3_to_f32(back), v, "code {b:#x} value {v}");
        }
        assert_eq!(f8e4m3_to_f32(0x7E), 448.0);
        assert_eq!(f32_to_f8e4m3(1e6), 0x7E);
    }

    #[test]
    fn fp8_e5m2_roundtrips_every_finite_code() {
        for b in 0u8..=255 {
            let v = f8e5m2_to_f32(b);
            if !v.is_finite() {
                continue;
            }
            assert_eq!(f8e5m2_to_f32(f32_to_f8e5m2(v)), v, "code {b:#x}");
        }
        assert_eq!(f8e5m2_to_f32(f32_to_f8e5m2(1e9)), 57344.0);
    }

    #[test]
    fn block_formats_roundtrip_within_their_step() {
        let x: Vec<f32> = (0..64).map(|i| ((i * 37 % 64) as f32 - 31.5) / 7.0).collect();
        for (dt, tol) in [(DType::Q8_0, 0.05), (DType::Q4_0, 0.6), (DType::Q4_1, 0.3)] {
            let enc = encode(dt, &x).unwrap();
            assert_eq!(enc.len(), dt.bytes_for(64).unwrap());
            let dec = decode(dt, &enc, 64).unwrap();
            for (a, b) in x.iter().zip(&dec) {
                assert!((a - b).abs() <= tol, "{dt}: {a} vs {b}");
            }
        }
        assert!(decode(DType::Q4_1, &[0u8; 19], 32).is_none());
        assert!(encode(DType::Q8_0, &[0.0; 31]).is_none());
    }

    #[test]
    fn int4_packs_low_nibble_first() {
        let enc = encode(DType::I4, &[-8.0, 7.0, 1.0, -1.0]).unwrap();
        assert_eq!(enc, vec![0x78, 0xF1]);
        assert_eq!(decode(DType::I4, &enc, 4).unwrap(), vec![-8.0, 7.0, 1.0, -1.0]);
    }
}
