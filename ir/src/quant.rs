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
        DType::Q5_0 | DType::Q5_1 => {
            // (llama.cpp's dequantize_row_q5_0/1: the fifth bit of element j is bit j of qh)
            let one = dtype == DType::Q5_1;
            for blk in bytes.chunks_exact(dtype.block().1) {
                let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
                let (m, at) = if one { (f16::from_le_bytes([blk[2], blk[3]]).to_f32(), 4) } else { (0.0, 2) };
                let qh = u32::from_le_bytes([blk[at], blk[at + 1], blk[at + 2], blk[at + 3]]);
                let qs = &blk[at + 4..at + 20];
                for half in 0..2 {
                    out.extend(qs.iter().enumerate().map(|(j, &q)| {
                        let v = ((q >> (4 * half)) & 0xF) as u32 | (((qh >> (j + 16 * half)) & 1) << 4);
                        if one {
                            d * v as f32 + m
                        } else {
                            d * (v as i32 - 16) as f32
                        }
                    }));
                }
            }
        }
        DType::I4G128 => {
            for sb in bytes.chunks_exact(272) {
                for gi in 0..4 {
                    let d = f16::from_le_bytes([sb[4 * gi], sb[4 * gi + 1]]).to_f32();
                    let m = f16::from_le_bytes([sb[4 * gi + 2], sb[4 * gi + 3]]).to_f32();
                    let qs = &sb[16 + 64 * gi..80 + 64 * gi];
                    out.extend((0..128).map(|p| {
                        let (byte, shift) = i4g128_nibble(p);
                        d * ((qs[byte] >> shift) & 0xF) as f32 + m
                    }));
                }
            }
        }
        DType::Sp24Bf16 => {
            for blk in bytes.chunks_exact(36) {
                let meta = u32::from_le_bytes(blk[32..36].try_into().expect("4 bytes"));
                for g in 0..8 {
                    let mut grp = [0f32; 4];
                    for j in 0..2 {
                        let i = ((meta >> (4 * g + 2 * j)) & 3) as usize;
                        grp[i] = bf16::from_le_bytes([blk[4 * g + 2 * j], blk[4 * g + 2 * j + 1]]).to_f32();
                    }
                    out.extend(grp);
                }
            }
        }
        DType::F8G32 => {
            for blk in bytes.chunks_exact(36) {
                let s = f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]);
                out.extend(blk[4..].iter().map(|&q| s * f8e4m3_to_f32(q)));
            }
        }
        DType::F8G128 => {
            for sb in bytes.chunks_exact(528) {
                for gi in 0..4 {
                    let s = f32::from_le_bytes([sb[4 * gi], sb[4 * gi + 1], sb[4 * gi + 2], sb[4 * gi + 3]]);
                    out.extend(sb[16 + 128 * gi..144 + 128 * gi].iter().map(|&q| s * f8e4m3_to_f32(q)));
                }
            }
        }
        // (the K-quants in ggml's order of operations, f32 products rounded one at a time:
        // equal to the `gguf` Python package's dequantization bit for bit)
        DType::Q4_K | DType::Q5_K => {
            let five = dtype == DType::Q5_K;
            for blk in bytes.chunks_exact(dtype.block().1) {
                let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
                let dmin = f16::from_le_bytes([blk[2], blk[3]]).to_f32();
                let (sc, mn) = k_scale_min(&blk[4..16]);
                let (qh, qs) = if five { (&blk[16..48], &blk[48..176]) } else { (&blk[16..16], &blk[16..144]) };
                for j in 0..8 {
                    let (dj, mj) = (d * sc[j] as f32, dmin * mn[j] as f32);
                    let (chunk, shift) = (&qs[32 * (j / 2)..32 * (j / 2) + 32], 4 * (j % 2));
                    for (i, &b) in chunk.iter().enumerate() {
                        let hi = if five { ((qh[i] >> j) & 1) << 4 } else { 0 };
                        let q = ((b >> shift) & 0xF) | hi;
                        out.push(dj * q as f32 - mj);
                    }
                }
            }
        }
        DType::Q6_K => {
            for blk in bytes.chunks_exact(210) {
                let (ql, qh, scales) = (&blk[..128], &blk[128..192], &blk[192..208]);
                let d = f16::from_le_bytes([blk[208], blk[209]]).to_f32();
                for e in 0..256 {
                    // (halves of 128: the low nibbles of ql's 64 bytes, then the high ones;
                    // qh's 32 bytes four 2-bit fields)
                    let (h, r) = (e / 128, e % 128);
                    let low = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0xF;
                    let high = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
                    let q = ((low | (high << 4)) as i8 - 32) as f32;
                    out.push(d * scales[e / 16] as i8 as f32 * q);
                }
            }
        }
    }
    Some(out)
}

/// The 8 six-bit scales and mins of a Q4_K / Q5_K super-block from its 12 packed bytes:
/// sub-blocks 0-3 in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins), 4-7 in bytes 8-11's
/// nibbles with their top 2 bits in the top bits of bytes 0-7.
fn k_scale_min(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut mn) = ([0u8; 8], [0u8; 8]);
    for j in 0..4 {
        sc[j] = s[j] & 0x3F;
        mn[j] = s[j + 4] & 0x3F;
        sc[j + 4] = (s[j + 8] & 0x0F) | ((s[j] >> 2) & 0x30);
        mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30);
    }
    (sc, mn)
}

/// Pack 8 six-bit scales and mins as [`k_scale_min`] reads them.
fn k_pack_scale_min(sc: &[u8; 8], mn: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..4 {
        s[j] = sc[j] | ((sc[j + 4] & 0x30) << 2);
        s[j + 4] = mn[j] | ((mn[j + 4] & 0x30) << 2);
        s[j + 8] = (sc[j + 4] & 0x0F) | ((mn[j + 4] & 0x0F) << 4);
    }
    s
}

/// One group of 128 values as [`DType::F8G128`] stores it: s = |max| / 448 (0 for a group of
/// zeros), each value e4m3(v / s) rounded to nearest even — the GPU's seeded generator
/// (`cvt.rn.satfinite.e4m3x2.f32` of the same f32 quotient) writes the same bytes.
pub fn f8g128_group(g: &[f32]) -> (f32, [u8; 128]) {
    let amax = g.iter().fold(0f32, |a, v| a.max(v.abs()));
    let s = amax / 448.0;
    let mut q = [0u8; 128];
    if s != 0.0 {
        for (qi, &v) in q.iter_mut().zip(g) {
            *qi = f32_to_f8e4m3(v / s);
        }
    }
    (s, q)
}

/// [`DType::F8G128`] bytes of groups of 128 (f32 scale, e4m3 codes), four a super-block.
pub fn pack_f8g128(groups: impl IntoIterator<Item = (f32, [u8; 128])>) -> Vec<u8> {
    let groups: Vec<_> = groups.into_iter().collect();
    let mut out = Vec::with_capacity(groups.len() / 4 * 528);
    for sb in groups.chunks(4) {
        for (s, _) in sb {
            out.extend(s.to_le_bytes());
        }
        for (_, q) in sb {
            out.extend(q);
        }
    }
    out
}

/// [`DType::F8G32`] bytes of `x` in rows of `row` values (a multiple of 32): each row's groups
/// of `group` values (a multiple of 32; the row's last group may be shorter) scaled as
/// [`f8g128_group`] scales its 128 (s = |max| / 448, e4m3(v / s) to nearest even), every
/// 32-value block of a group carrying the group's scale.
pub fn f8g32_rows(x: &[f32], row: usize, group: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / 32 * 36);
    for r in x.chunks(row.max(1)) {
        for g in r.chunks(group.max(32)) {
            let amax = g.iter().fold(0f32, |a, v| a.max(v.abs()));
            let s = amax / 448.0;
            for blk in g.chunks(32) {
                out.extend(s.to_le_bytes());
                out.extend(blk.iter().map(|&v| if s != 0.0 { f32_to_f8e4m3(v / s) } else { 0 }));
            }
        }
    }
    out
}

/// [`DType::Sp24Bf16`] bytes of `x` (whole 32-value blocks): each group of 4 keeps its two
/// values of largest magnitude (the earlier one on a tie) in bf16, so values already pruned to
/// 2:4 are kept exactly (up to bf16) and a dense group loses its two smallest.
pub fn pack_sp24_bf16(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / 32 * 36);
    for blk in x.chunks_exact(32) {
        let mut meta = 0u32;
        for (g, grp) in blk.chunks_exact(4).enumerate() {
            let mut idx = [0usize, 1, 2, 3];
            idx.sort_by(|&a, &b| grp[b].abs().total_cmp(&grp[a].abs()).then(a.cmp(&b)));
            let (i0, i1) = (idx[0].min(idx[1]), idx[0].max(idx[1]));
            for v in [grp[i0], grp[i1]] {
                out.extend(bf16::from_f32(v).to_le_bytes());
            }
            meta |= ((i0 as u32) | ((i1 as u32) << 2)) << (4 * g);
        }
        out.extend(meta.to_le_bytes());
    }
    out
}

/// The normalized Walsh-Hadamard transform of `x` in place (length a power of two): H x with
/// H = H^T = H^-1, entries ±1/√n.
pub fn hadamard(x: &mut [f32]) {
    let n = x.len();
    let mut h = 1;
    while h < n {
        for i in (0..n).step_by(2 * h) {
            for j in i..i + h {
                let (a, b) = (x[j], x[j + h]);
                x[j] = a + b;
                x[j + h] = a - b;
            }
        }
        h *= 2;
    }
    let s = 1.0 / (n as f32).sqrt();
    x.iter_mut().for_each(|v| *v *= s);
}

/// Activations rounded to 8 bits the way a W8A8 / W4A8 matmul multiplies them (the reference
/// semantics of [`crate::Op::ActQuant`]): each row of `d` values in groups of `group` (0: the
/// whole row; the last group may be shorter) gets the dynamic scale s = |max| / qmax (448 for
/// e4m3, 127 for int8) and each value becomes s · q(v / s) — e4m3 rounded to nearest even and
/// saturating, int8 rounded to nearest even in [-127, 127]. A group of zeros stays zero.
pub fn act_quant_rows(x: &mut [f32], d: usize, group: usize, dtype: DType) {
    let qmax = if dtype == DType::I8 { 127.0 } else { 448.0 };
    let g = if group == 0 { d.max(1) } else { group };
    for row in x.chunks_mut(d.max(1)) {
        for grp in row.chunks_mut(g) {
            let amax = grp.iter().fold(0f32, |a, v| a.max(v.abs()));
            let s = amax / qmax;
            if s == 0.0 || !s.is_finite() {
                continue;
            }
            for v in grp.iter_mut() {
                *v = s * match dtype {
                    DType::I8 => (*v / s).round_ties_even().clamp(-127.0, 127.0),
                    _ => f8e4m3_to_f32(f32_to_f8e4m3(*v / s)),
                };
            }
        }
    }
}

/// Where value `p` (0..128) of an [`DType::I4G128`] group sits in the group's 64 bytes: (byte,
/// shift). Chunk c (bytes 16c..16c+16) holds words w = 0..3 at 16c + 4w, word (c, w) the values
/// 32w + 4c + (0..4) then 32w + 16 + 4c + (0..4) (i = 0..7 in that order), value i in nibble
/// i / 2 (i even) or 4 + i / 2 (odd).
pub fn i4g128_nibble(p: usize) -> (usize, u32) {
    let (w, r) = (p / 32, p % 32);
    let (c, i) = ((r % 16) / 4, r % 4 + 4 * (r / 16));
    let nib = if i % 2 == 0 { i / 2 } else { 4 + i / 2 };
    (16 * c + 4 * w + nib / 2, 4 * (nib % 2) as u32)
}

/// [`DType::I4G128`] bytes of groups of 128 (scale d, minimum m, quants 0..=15), four a
/// super-block (the group count must be a multiple of 4).
pub fn pack_i4g128(groups: impl IntoIterator<Item = (f16, f16, [u8; 128])>) -> Vec<u8> {
    let groups: Vec<_> = groups.into_iter().collect();
    let mut out = Vec::with_capacity(groups.len() / 4 * 272);
    for sb in groups.chunks(4) {
        for (d, m, _) in sb {
            out.extend(d.to_le_bytes());
            out.extend(m.to_le_bytes());
        }
        for (_, _, q) in sb {
            let mut bytes = [0u8; 64];
            for (p, &v) in q.iter().enumerate() {
                let (byte, shift) = i4g128_nibble(p);
                bytes[byte] |= (v & 0xF) << shift;
            }
            out.extend(bytes);
        }
    }
    out
}

/// The version of [`cpu_layout`] the CPU kernels read, recorded in a plan's CPU program: a plan
/// whose kernels read another is refused (2: f16 scales and minima; 1, before: f32).
pub const CPU_LAYOUT: u32 = 2;

/// Floats of scratch one call of the CPU matmul kernels (`dsc_codegen::cpu::matmul`) needs for
/// m x rows of k: the gemv (m < 4) the x rows' block sums and a weight row's scales as f32
/// ((m + 1)·k/32, 16 more for its vector tail); the gemm the larger of the f32 gemm's four
/// widened weight rows (4·k) and the AMX gemm's (`dsc_codegen::cpu::amx`) bf16 halves of the x
/// rows padded to 16 (m16·k), two 16-column weight tiles of halves per 32-element block (32·k)
/// and its 16 x 32 output buffer (512), from a 64-byte boundary (16).
pub fn cpu_matmul_scratch(m: usize, k: usize) -> usize {
    if m < 4 {
        (m + 1) * (k / 32) + 16
    } else {
        m.div_ceil(16) * 16 * k + 32 * k + 512 + 16
    }
}

/// Whether this CPU and OS run the `x86-64-v4-amx` CPU library's AMX tiles: CPUID's AMX-TILE
/// and AMX-BF16 and AVX512-BF16, and Linux's permission to use the tile data
/// (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, asked for the process once).
pub fn amx_usable() -> bool {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        static ASKED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ASKED.get_or_init(|| {
            let id = std::arch::x86_64::__cpuid_count(7, 0);
            let (amx_bf16, amx_tile) = (id.edx >> 22 & 1 == 1, id.edx >> 24 & 1 == 1);
            if !(amx_bf16 && amx_tile && std::arch::is_x86_feature_detected!("avx512bf16")) {
                return false;
            }
            const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
            const XFEATURE_XTILEDATA: libc::c_long = 18;
            // SAFETY: arch_prctl with these arguments only changes the process's permission
            // to use the AMX tile state; it touches no memory of ours.
            unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
        })
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        false
    }
}

/// Weights [n, k] of `dtype` in the CPU kernels' layout (`dsc_codegen::cpu::matmul`), for the
/// block formats that have one: per row, the k/32 blocks' quants back to back (Q4_1: 16 nibble
/// bytes, Q8_0: 32 bytes), then their scales d as f16, then (Q4_1) their minima m as f16 — as
/// few bytes as GGUF's blocks (decode is bound by the weight stream where the cores are fast;
/// f32 scales read 20% more), each row's pieces contiguous for the kernels' vector loads.
/// [`CPU_LAYOUT`] names this layout in the plan. None: the type is read as stored, or the bytes
/// are not n rows of k.
pub fn cpu_layout(dtype: DType, bytes: &[u8], n: usize, k: usize) -> Option<Vec<u8>> {
    if dtype == DType::I4G128 {
        return i4g128_as_q4_1_layout(bytes, n, k);
    }
    let (qb, mins) = match dtype {
        DType::Q4_1 => (16, true),
        DType::Q8_0 => (32, false),
        _ => return None,
    };
    let stored = dtype.block().1;
    if k % 32 != 0 || bytes.len() != n.checked_mul(k / 32)?.checked_mul(stored)? {
        return None;
    }
    let nb = k / 32;
    let row = nb * (qb + 2 + 2 * mins as usize);
    let mut out = vec![0u8; n * row];
    for (src, dst) in bytes.chunks_exact(nb * stored).zip(out.chunks_exact_mut(row)) {
        let (qs, rest) = dst.split_at_mut(nb * qb);
        let (ds, ms) = rest.split_at_mut(nb * 2);
        for (b, blk) in src.chunks_exact(stored).enumerate() {
            qs[b * qb..(b + 1) * qb].copy_from_slice(&blk[stored - qb..]);
            ds[b * 2..b * 2 + 2].copy_from_slice(&blk[0..2]);
            if mins {
                ms[b * 2..b * 2 + 2].copy_from_slice(&blk[2..4]);
            }
        }
    }
    Some(out)
}

/// [`DType::I4G128`] rows in Q4_1's CPU layout ([`cpu_layout`]): each 128-value group's f16
/// d and m become four 32-value blocks' scales and minima, its nibbles re-paired in Q4_1's
/// order (byte i of a block: element i low, i + 16 high) — the same d·q + m for every value, so
/// the Q4_1 kernels compute i4g128 matmuls ([`cpu_kernel_dtype`]).
fn i4g128_as_q4_1_layout(bytes: &[u8], n: usize, k: usize) -> Option<Vec<u8>> {
    if k % 512 != 0 || bytes.len() != n.checked_mul(k / 512)?.checked_mul(272)? {
        return None;
    }
    let nb = k / 32;
    let row = nb * 20;
    let mut out = vec![0u8; n * row];
    for (src, dst) in bytes.chunks_exact(k / 512 * 272).zip(out.chunks_exact_mut(row)) {
        let (qs, rest) = dst.split_at_mut(nb * 16);
        let (ds, ms) = rest.split_at_mut(nb * 2);
        for (s, sb) in src.chunks_exact(272).enumerate() {
            for gi in 0..4 {
                let (d, m) = ([sb[4 * gi], sb[4 * gi + 1]], [sb[4 * gi + 2], sb[4 * gi + 3]]);
                let q = |p: usize| {
                    let (byte, shift) = i4g128_nibble(p);
                    (sb[16 + 64 * gi + byte] >> shift) & 0xF
                };
                for blk in 0..4 {
                    let b = 16 * s + 4 * gi + blk;
                    ds[2 * b..2 * b + 2].copy_from_slice(&d);
                    ms[2 * b..2 * b + 2].copy_from_slice(&m);
                    for i in 0..16 {
                        qs[16 * b + i] = q(32 * blk + i) | (q(32 * blk + 16 + i) << 4);
                    }
                }
            }
        }
    }
    Some(out)
}

/// The weight type whose CPU kernels read `dtype` once [`cpu_layout`] has laid it out: Q4_1's
/// for [`DType::I4G128`], else its own.
pub fn cpu_kernel_dtype(dtype: DType) -> DType {
    match dtype {
        DType::I4G128 => DType::Q4_1,
        d => d,
    }
}

/// Bytes of [n, k] weights of `dtype` as the CPU kernels read them ([`cpu_layout`] or stored).
pub fn cpu_layout_bytes(dtype: DType, n: usize, k: usize) -> Option<usize> {
    match dtype {
        DType::Q4_1 | DType::I4G128 => n.checked_mul(k / 32)?.checked_mul(20),
        DType::Q8_0 => n.checked_mul(k / 32)?.checked_mul(34),
        _ => dtype.bytes_for(n.checked_mul(k)?),
    }
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
        DType::Q5_0 | DType::Q5_1 => {
            // (llama.cpp's quantize_row_q5_0_ref / q5_1_ref)
            let one = dtype == DType::Q5_1;
            for blk in x.chunks_exact(32) {
                let (d, base, q): (f32, f32, Box<dyn Fn(f32) -> u32>) = if one {
                    let min = blk.iter().copied().fold(f32::INFINITY, f32::min);
                    let max = blk.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let d = (max - min) / 31.0;
                    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                    (d, min, Box::new(move |v: f32| (((v - min) * id + 0.5) as u8 as u32).min(31)))
                } else {
                    let max = blk.iter().fold(0f32, |a, &v| if v.abs() > a.abs() { v } else { a });
                    let d = max / -16.0;
                    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                    (d, 0.0, Box::new(move |v: f32| ((v * id + 16.5) as i8 as i32).min(31) as u32))
                };
                out.extend(f16::from_f32(d).to_le_bytes());
                if one {
                    out.extend(f16::from_f32(base).to_le_bytes());
                }
                let qv: Vec<u32> = blk.iter().map(|&v| q(v)).collect();
                let qh = (0..32).fold(0u32, |h, j| h | ((qv[j] >> 4) & 1) << j);
                out.extend(qh.to_le_bytes());
                out.extend((0..16).map(|j| (qv[j] & 0xF) as u8 | (((qv[j + 16] & 0xF) as u8) << 4)));
            }
        }
        DType::I4G128 => {
            // (Q4_1's rounding, per group of 128)
            let groups = x.chunks_exact(128).map(|g| {
                let min = g.iter().copied().fold(f32::INFINITY, f32::min);
                let max = g.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let d = (max - min) / 15.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                let mut q = [0u8; 128];
                for (qi, &v) in q.iter_mut().zip(g) {
                    *qi = (((v - min) * id + 0.5) as i32).clamp(0, 15) as u8;
                }
                (f16::from_f32(d), f16::from_f32(min), q)
            });
            out.extend(pack_i4g128(groups));
        }
        DType::F8G128 => {
            let groups: Vec<(f32, [u8; 128])> = x.chunks_exact(128).map(f8g128_group).collect();
            out.extend(pack_f8g128(groups));
        }
        DType::Sp24Bf16 => out.extend(pack_sp24_bf16(x)),
        // (one block a group: see `f8g32_rows` for 128-value groups carried by 32-value blocks)
        DType::F8G32 => out.extend(f8g32_rows(x, x.len(), 32)),
        // (plain min/max quantizers in the K-quant layouts — llama.cpp's iterative scale search
        // is not reproduced: these are for tests and seeded shapes; real files come quantized)
        DType::Q4_K | DType::Q5_K => {
            let five = dtype == DType::Q5_K;
            let qmax = if five { 31.0 } else { 15.0 };
            for blk in x.chunks_exact(256) {
                // per sub-block: scale (max - min) / qmax and min (as a positive offset)
                let (mut scale, mut min) = ([0f32; 8], [0f32; 8]);
                for j in 0..8 {
                    let sb = &blk[32 * j..32 * j + 32];
                    let lo = sb.iter().copied().fold(f32::INFINITY, f32::min).min(0.0);
                    let hi = sb.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    scale[j] = (hi - lo) / qmax;
                    min[j] = -lo;
                }
                let smax = scale.iter().copied().fold(0f32, f32::max);
                let mmax = min.iter().copied().fold(0f32, f32::max);
                let d = f16::from_f32(smax / 63.0);
                let dmin = f16::from_f32(mmax / 63.0);
                let (df, mf) = (d.to_f32(), dmin.to_f32());
                let six = |v: f32, unit: f32| if unit > 0.0 { (v / unit).round().clamp(0.0, 63.0) as u8 } else { 0 };
                let sc: [u8; 8] = std::array::from_fn(|j| six(scale[j], df));
                let mn: [u8; 8] = std::array::from_fn(|j| six(min[j], mf));
                out.extend(d.to_le_bytes());
                out.extend(dmin.to_le_bytes());
                out.extend(k_pack_scale_min(&sc, &mn));
                let q: Vec<u8> = (0..256)
                    .map(|e| {
                        let j = e / 32;
                        let (dj, mj) = (df * sc[j] as f32, mf * mn[j] as f32);
                        if dj > 0.0 {
                            ((blk[e] + mj) / dj).round().clamp(0.0, qmax) as u8
                        } else {
                            0
                        }
                    })
                    .collect();
                if five {
                    out.extend((0..32).map(|i| (0..8).fold(0u8, |a, j| a | (((q[32 * j + i] >> 4) & 1) << j))));
                }
                out.extend((0..128).map(|i| {
                    let (c, l) = (i / 32, i % 32);
                    (q[64 * c + l] & 0xF) | ((q[64 * c + 32 + l] & 0xF) << 4)
                }));
            }
        }
        DType::Q6_K => {
            for blk in x.chunks_exact(256) {
                let amax: Vec<f32> = blk.chunks(16).map(|g| g.iter().fold(0f32, |a, v| a.max(v.abs()))).collect();
                let gmax = amax.iter().copied().fold(0f32, f32::max);
                let d = f16::from_f32(gmax / 31.0 / 127.0);
                let df = d.to_f32();
                let scales: Vec<i8> = amax.iter().map(|&a| if df > 0.0 { (a / 31.0 / df).round().clamp(-128.0, 127.0) as i8 } else { 0 }).collect();
                let q: Vec<u8> = (0..256)
                    .map(|e| {
                        let s = df * scales[e / 16] as f32;
                        let v = if s != 0.0 { (blk[e] / s).round().clamp(-32.0, 31.0) } else { 0.0 };
                        (v as i32 + 32) as u8
                    })
                    .collect();
                let (mut ql, mut qh) = (vec![0u8; 128], vec![0u8; 64]);
                for (e, &v) in q.iter().enumerate() {
                    let (h, r) = (e / 128, e % 128);
                    ql[64 * h + r % 64] |= (v & 0xF) << (4 * (r / 64));
                    qh[32 * h + r % 32] |= ((v >> 4) & 3) << (2 * (r / 32));
                }
                out.extend(ql);
                out.extend(qh);
                out.extend(scales.iter().map(|&s| s as u8));
                out.extend(d.to_le_bytes());
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
        DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q4_K | DType::Q5_K | DType::Q6_K | DType::I4G128 | DType::F8G128 | DType::F8G32 | DType::Sp24Bf16 => x,
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
    fn sp24_keeps_two_of_every_four_with_their_positions() {
        // 128 values: groups already 2:4 (kept exactly, bf16 values) and dense groups (the two
        // largest magnitudes survive, in order)
        let x: Vec<f32> = (0..128)
            .map(|i| {
                let (g, j) = (i / 4, i % 4);
                if g % 2 == 0 {
                    if j == (g / 2) % 4 || j == 3 - (g / 2) % 4 || (g / 2) % 4 == 3 - (g / 2) % 4 {
                        (i as f32 - 60.0) * 0.5
                    } else {
                        0.0
                    }
                } else {
                    [0.25f32, -4.0, 1.5, -0.5][(j + g) % 4]
                }
            })
            .collect();
        let enc = encode(DType::Sp24Bf16, &x).unwrap();
        assert_eq!(enc.len(), 4 * 36);
        let y = decode(DType::Sp24Bf16, &enc, 128).unwrap();
        for (g, (a, b)) in x.chunks(4).zip(y.chunks(4)).enumerate() {
            assert!(b.iter().filter(|v| **v != 0.0).count() <= 2, "group {g}: {b:?}");
            if g % 2 == 0 {
                assert_eq!(a, b, "group {g}: a 2:4 group is kept as it is");
            } else {
                let kept: Vec<f32> = a.iter().map(|v| if v.abs() >= 1.5 { *v } else { 0.0 }).collect();
                assert_eq!(b, kept.as_slice(), "group {g}: the two largest magnitudes");
            }
        }
        // group 1 of block 0 is [-4.0, 1.5, -0.5, 0.25] rotated by one: values at 0 and 1
        let meta = u32::from_le_bytes(enc[32..36].try_into().unwrap());
        assert_eq!((meta >> 4) & 0xF, 0b0100, "first index 0 in the low bits, second 1 in the high");
        assert!(encode(DType::Sp24Bf16, &x[..48]).is_none(), "whole 32-value blocks");
    }

    #[test]
    fn act_quant_rounds_each_group_with_its_own_dynamic_scale() {
        // two rows of 80: groups of 32, 32 and the row's last 16
        let mut x: Vec<f32> = (0..160).map(|i| ((i * 29 % 61) as f32 - 30.0) * if i % 80 >= 64 { 100.0 } else { 0.01 }).collect();
        x[32..64].iter_mut().for_each(|v| *v = 0.0);
        let orig = x.clone();
        act_quant_rows(&mut x, 80, 32, DType::F8E4M3);
        assert!(x[32..64].iter().all(|v| *v == 0.0), "a group of zeros stays zero (no NaN)");
        for (r, g) in [(0usize, 0..32), (0, 64..80), (1, 0..32), (1, 64..80)] {
            let (a, b) = (80 * r + g.start, 80 * r + g.end);
            let amax = orig[a..b].iter().fold(0f32, |m, v| m.max(v.abs()));
            let s = amax / 448.0;
            for i in a..b {
                assert_eq!(x[i], s * f8e4m3_to_f32(f32_to_f8e4m3(orig[i] / s)), "value {i}");
                assert!((x[i] - orig[i]).abs() <= orig[i].abs() / 16.0 + s / 512.0, "value {i}: {} vs {}", x[i], orig[i]);
            }
            assert!(x[a..b].iter().any(|v| v.abs() == amax), "the group's largest value is exact (448 s)");
        }
        // int8 per token (group 0): one scale per row, |q| <= 127
        let mut y = orig.clone();
        act_quant_rows(&mut y, 80, 0, DType::I8);
        for r in 0..2 {
            let s = orig[80 * r..80 * r + 80].iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            for i in 80 * r..80 * r + 80 {
                assert_eq!(y[i], s * (orig[i] / s).round_ties_even(), "value {i}");
            }
        }
        // the small first groups round to zero under the row's scale set by the 100x tail
        assert!(y[..32].iter().all(|v| *v == 0.0) && x[..32].iter().any(|v| *v != 0.0), "per token vs per group");
    }

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
    fn i4g128_in_q4_1_cpu_layout_gives_every_value_exactly() {
        let (n, k) = (3usize, 1024usize);
        let x: Vec<f32> = (0..n * k).map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.3).collect();
        let b = encode(DType::I4G128, &x).unwrap();
        let want = decode(DType::I4G128, &b, n * k).unwrap();
        let l = cpu_layout(DType::I4G128, &b, n, k).unwrap();
        assert_eq!(Some(l.len()), cpu_layout_bytes(DType::I4G128, n, k));
        let nb = k / 32;
        // (a row: nb·16 nibble bytes, nb f16 scales, nb f16 minima)
        let f = |at: usize| f16::from_le_bytes([l[at], l[at + 1]]).to_f32();
        for r in 0..n {
            let row = &l[r * nb * 20..];
            for e in 0..k {
                let (blk, i) = (e / 32, e % 32);
                let byte = row[16 * blk + i % 16];
                let q = if i < 16 { byte & 0xF } else { byte >> 4 };
                let (d, m) = (f(r * nb * 20 + nb * 16 + 2 * blk), f(r * nb * 20 + nb * 18 + 2 * blk));
                assert_eq!(d * q as f32 + m, want[r * k + e], "row {r} element {e}");
            }
        }
        assert_eq!(cpu_kernel_dtype(DType::I4G128), DType::Q4_1);
        assert!(cpu_layout(DType::I4G128, &b[1..], n, k).is_none());
    }

    #[test]
    fn i4g128_layout_and_roundtrip() {
        // (the documented byte layout: group g's d and m at 4g, its chunk c's word w at
        // 16 + 64g + 16c + 4w, holding values 32w + 4c + (0..4) and 32w + 16 + 4c + (0..4))
        let q: Vec<u8> = (0..512).map(|i| ((i * 7 + i / 128) % 16) as u8).collect();
        let groups: Vec<_> = (0..4).map(|g| (f16::from_f32(0.5 + g as f32), f16::from_f32(-(g as f32)), q[128 * g..128 * g + 128].try_into().unwrap())).collect();
        let enc = pack_i4g128(groups);
        assert_eq!(enc.len(), 272);
        assert_eq!(f16::from_le_bytes([enc[8], enc[9]]).to_f32(), 2.5);
        let nib = |e: usize, n: usize| -> u8 {
            let (g, p) = (e / 128, e % 128);
            let (w, c) = (p / 32, (p % 16) / 4);
            let word = u32::from_le_bytes(enc[16 + 64 * g + 16 * c + 4 * w..][..4].try_into().unwrap());
            ((word >> (4 * n)) & 0xF) as u8
        };
        for e in 0..512 {
            let i = e % 4 + 4 * ((e % 32) / 16);
            assert_eq!(nib(e, if i % 2 == 0 { i / 2 } else { 4 + i / 2 }), q[e], "value {e}");
        }
        let dec = decode(DType::I4G128, &enc, 512).unwrap();
        for (e, v) in dec.iter().enumerate() {
            let g = e / 128;
            assert_eq!(*v, (0.5 + g as f32) * q[e] as f32 - g as f32, "value {e}");
        }
        let x: Vec<f32> = (0..1024).map(|i| ((i * 37 % 101) as f32 - 50.0) / 9.0).collect();
        let y = decode(DType::I4G128, &encode(DType::I4G128, &x).unwrap(), 1024).unwrap();
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() <= 0.38, "{a} vs {b}"); // (half a step: 100 / 9 / 15 / 2)
        }
        assert!(encode(DType::I4G128, &x[..256]).is_none(), "not whole super-blocks");
    }

    #[test]
    fn f8g128_layout_and_roundtrip() {
        // four f32 scales, then the groups' e4m3 codes in natural order; value = s · e4m3
        let x: Vec<f32> = (0..1024).map(|i| ((i * 37 % 101) as f32 - 50.0) / (9.0 + (i / 128) as f32)).collect();
        let enc = encode(DType::F8G128, &x).unwrap();
        assert_eq!(enc.len(), 2 * 528);
        for g in 0..8 {
            let grp = &x[128 * g..128 * g + 128];
            let amax = grp.iter().fold(0f32, |a, v| a.max(v.abs()));
            let sb = &enc[528 * (g / 4)..];
            let s = f32::from_le_bytes(sb[4 * (g % 4)..4 * (g % 4) + 4].try_into().unwrap());
            assert_eq!(s, amax / 448.0, "group {g}'s scale");
            for p in 0..128 {
                assert_eq!(sb[16 + 128 * (g % 4) + p], f32_to_f8e4m3(grp[p] / s), "value {p} of group {g}");
            }
        }
        let y = decode(DType::F8G128, &enc, 1024).unwrap();
        for (a, b) in x.iter().zip(&y) {
            // (e4m3 keeps 3 mantissa bits: half a step is 1/16 relative; subnormals below 2^-6 s)
            assert!((a - b).abs() <= a.abs() / 16.0 + 1e-3, "{a} vs {b}");
        }
        let z = encode(DType::F8G128, &[0.0; 512]).unwrap();
        assert!(decode(DType::F8G128, &z, 512).unwrap().iter().all(|v| *v == 0.0), "a group of zeros: scale 0, no NaN");
        assert!(encode(DType::F8G128, &x[..256]).is_none(), "not whole super-blocks");
    }

    #[test]
    fn int4_packs_low_nibble_first() {
        let enc = encode(DType::I4, &[-8.0, 7.0, 1.0, -1.0]).unwrap();
        assert_eq!(enc, vec![0x78, 0xF1]);
        assert_eq!(decode(DType::I4, &enc, 4).unwrap(), vec![-8.0, 7.0, 1.0, -1.0]);
    }
}
