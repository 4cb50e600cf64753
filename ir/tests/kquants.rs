//! GGUF K-quants (Q4_K, Q5_K, Q6_K) and their fallbacks Q5_0 / Q5_1: `quant::decode` equal to the `gguf` Python package's
//! dequantization bit for bit on random super-blocks (tests/fixtures/kquants/make.py wrote them
//! and gguf's values), and the plain encoders round-trip within the formats' precision.

use dsc_ir::{quant, DType};
use std::path::PathBuf;

fn fixture(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/kquants").join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn k_quants_decode_as_gguf_does_bit_for_bit() {
    for dt in [DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q5_0, DType::Q5_1] {
        let blocks = fixture(&format!("{}.blocks", dt.name()));
        let want: Vec<u32> = fixture(&format!("{}.f32", dt.name())).chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let n = want.len();
        assert_eq!(dt.bytes_for(n), Some(blocks.len()), "{dt}: whole blocks");
        let got = quant::decode(dt, &blocks, n).unwrap();
        let diff = got.iter().zip(&want).filter(|(g, w)| g.to_bits() != **w).count();
        assert_eq!(diff, 0, "{dt}: {diff} of {n} values differ from gguf's (first: {:?})", got.iter().zip(&want).find(|(g, w)| g.to_bits() != **w).map(|(g, w)| (g, f32::from_bits(*w))));
        // (a byte short is refused)
        assert!(quant::decode(dt, &blocks[1..], n).is_none());
    }
}

#[test]
fn k_quant_encoders_round_trip_within_their_precision() {
    let x: Vec<f32> = (0..1024).map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * (1.0 + (i / 256) as f32)).collect();
    // (relative L2 of the round trip: 4-bit, 5-bit, 6-bit values with 6- or 8-bit scales)
    for (dt, tol) in [(DType::Q4_K, 0.08), (DType::Q5_K, 0.04), (DType::Q6_K, 0.03), (DType::Q5_0, 0.05), (DType::Q5_1, 0.04)] {
        let b = quant::encode(dt, &x).unwrap();
        assert_eq!(b.len(), dt.bytes_for(x.len()).unwrap());
        let y = quant::decode(dt, &b, x.len()).unwrap();
        let num: f32 = x.iter().zip(&y).map(|(a, b)| (a - b) * (a - b)).sum();
        let den: f32 = x.iter().map(|a| a * a).sum();
        let rel = (num / den).sqrt();
        assert!(rel < tol, "{dt}: relative L2 {rel}");
    }
}
