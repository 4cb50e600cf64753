//! IR: text round trip, parse and verify errors, and executor ops against direct formulas.

use dsc_ir::*;
use proptest::prelude::*;
use std::collections::{BTreeMap, HashMap};

const ALL_OPS: &str = r#"graph "all-ops" {
  %tokens = input : i32[T]
  %pos = input : i32[T]
  %seq = input : i32[T]
  %slots = input : i32[T]
  %table = input : i32[S, MB]
  %rows = input : i32[R]
  %emb = weight : q8_0[64, 32]
  %norm = weight : f32[32]
  %bias = weight : f32[32]
  %wq = weight : q4_1[32, 32]
  %wkv = weight : bf16[32, 16]
  %kc = state : f32[NB, 4, 2, 8]
  %vc = state : f32[NB, 4, 2, 8]
  %x = gather(%emb, %tokens) : f32[T, 32]
  %h = rms_norm(%x, %norm) {eps = 1e-5} : f32[T, 32]
  %ln = layer_norm(%h, %norm, %bias) {eps = 0.001} : f32[T, 32]
  %q = matmul(%ln, %wq, %bias) {transpose_b = true} : f32[T, 32]
  %k = matmul(%ln, %wkv) {transpose_b = false} : f32[T, 16]
  %q4 = reshape(%q) : f32[T, 4, 8]
  %k2 = reshape(%k) : f32[T, 2, 8]
  %qr = rope(%q4, %pos) {theta = 10000.0, style = interleaved, rotary_dim = 8} : f32[T, 4, 8]
  %kr = rope(%k2, %pos) {theta = 10000.0, style = half, rotary_dim = 4} : f32[T, 2, 8]
  %kw = cache_write(%kc, %kr, %slots) : f32[NB, 4, 2, 8]
  %vw = cache_write(%vc, %k2, %slots) : f32[NB, 4, 2, 8]
  %att = paged_attention(%qr, %kw, %vw, %pos, %seq, %table) {scale = 0.35355338} : f32[T, 4, 8]
  %flat = reshape(%att) : f32[T, 32]
  %t = transpose(%att) {perm = [1, 0, 2]} : f32[4, T, 8]
  %a = silu(%flat) : f32[T, 32]
  %b = gelu(%a) : f32[T, 32]
  %c = gelu_erf(%b) : f32[T, 32]
  %d = sub(%c, %bias) : f32[T, 32]
  %e = max(%d, %flat) : f32[T, 32]
  %sm = softmax(%e) : f32[T, 32]
  %top = top_k(%sm) {k = 3} : i32[T, 3]
  %vals = take_along(%sm, %top) : f32[T, 3]
  %cat = concat(%vals, %vals) {axis = 1} : f32[T, 6]
  %sl = slice(%cat) {axis = 1, start = 1, len = 4} : f32[T, 4]
  %qz = quantize(%sl) : f8e4m3[T, 4]
  %dq = dequantize(%qz) : f32[T, 4]
  %cast = cast(%dq) : bf16[T, 4]
  %am = argmax(%e) : i32[T]
  %ar = all_reduce(%e) : f32[T, 32]
  %aq = act_quant(%h) {dtype = f8e4m3, group = 32} : f32[T, 32]
  %last = gather(%e, %rows) : f32[R, 32]
  output last = %last
  output cast = %cast
  output argmax = %am
  output reduced = %ar
  output t = %t
  output aq = %aq
}
"#;

#[test]
fn text_round_trips_every_op() {
    let g = text::parse(ALL_OPS).unwrap();
    assert_eq!(text::print(&g), ALL_OPS);
    let again = text::parse(&text::print(&g)).unwrap();
    assert_eq!(text::print(&again), ALL_OPS);
    let dot = dot::to_dot(&g);
    assert!(dot.starts_with("digraph \"all-ops\"") && dot.contains("paged_attention") && dot.contains("\"out:last\""));
}

fn parse_err(src: &str) -> String {
    match text::parse(src) {
        Ok(_) => panic!("parsed but should not:\n{src}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn parse_errors_name_the_line_and_problem() {
    let e = parse_err("graph \"g\" {\n  %x = input : f32[4]\n  %y = exp(%z) : f32[4]\n}\n");
    assert!(e.contains("line 3") && e.contains("undefined value `%z`"), "{e}");
    let e = parse_err("graph \"g\" {\n  %x = input : f32[4]\n  %y = frobnicate(%x) : f32[4]\n}\n");
    assert!(e.contains("line 3") && e.contains("unknown op `frobnicate`"), "{e}");
    let e = parse_err("graph \"g\" {\n  %x = input : f33[4]\n}\n");
    assert!(e.contains("line 2") && e.contains("unknown dtype `f33`"), "{e}");
    let e = parse_err("graph \"g\" {\n  %x = input : f32[4, 8]\n  %y = rms_norm(%x, %x) : f32[4, 8]\n}\n");
    assert!(e.contains("needs attribute `eps`"), "{e}");
    let e = parse_err("graph \"g\" {\n  %x = input : f32[T, 48]\n  %y = act_quant(%x) {dtype = i8, group = 48} : f32[T, 48]\n}\n");
    assert!(e.contains("line 3") && e.contains("multiple of 32"), "{e}");
    let e = parse_err("graph \"g\" {\n  %x = input : f32[T, 64]\n  %y = act_quant(%x) {dtype = f16, group = 32} : f32[T, 64]\n}\n");
    assert!(e.contains("line 3") && e.contains("f8e4m3 or i8"), "{e}");
    let e = parse_err("graph \"g\" {\n  %x = input : f32[4]\n");
    assert!(e.contains("missing closing"), "{e}");
    let e = parse_err("graph \"g\" {\n  %x = input : f32[4]\n  %x = input : f32[4]\n}\n");
    assert!(e.contains("duplicate node name `x`"), "{e}");
}

#[test]
fn verifier_rejects_wrong_declared_types_and_shapes() {
    // matmul contraction mismatch
    let e = parse_err("graph \"g\" {\n  %x = input : f32[T, 8]\n  %w = weight : f32[4, 16]\n  %y = matmul(%x, %w) {transpose_b = true} : f32[T, 4]\n}\n");
    assert!(e.contains("contraction dims differ: 8 != 16"), "{e}");
    // declared type that the op does not produce
    let e = parse_err("graph \"g\" {\n  %x = input : f32[T, 8]\n  %y = exp(%x) : f32[T, 9]\n}\n");
    assert!(e.contains("declared type f32[T, 9]"), "{e}");
    // reshape that changes the element count under symbols
    let e = parse_err("graph \"g\" {\n  %x = input : f32[T, 8]\n  %y = reshape(%x) : f32[S, 8]\n}\n");
    assert!(e.contains("changes the element count"), "{e}");
    // GQA heads must divide
    let e = parse_err("graph \"g\" {\n  %q = input : f32[T, 5, 8]\n  %p = input : i32[T]\n  %t = input : i32[S, MB]\n  %kc = state : f32[NB, 4, 2, 8]\n  %a = paged_attention(%q, %kc, %kc, %p, %p, %t) {scale = 1.0} : f32[T, 5, 8]\n}\n");
    assert!(e.contains("not a multiple of KV heads"), "{e}");
}

fn weights(spec: &[(&str, DType, Vec<usize>, Vec<f32>)]) -> HashMap<String, (DType, Vec<usize>, Vec<u8>)> {
    spec.iter().map(|(n, d, s, v)| (n.to_string(), (*d, s.clone(), quant::encode(*d, v).unwrap()))).collect()
}

/// Relative L2 distance of a from b.
fn rel(a: &[f32], b: &[f32]) -> f32 {
    let d: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    (d / b.iter().map(|y| y * y).sum::<f32>()).sqrt()
}

fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
    use rand::{Rng, SeedableRng};
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| r.random_range(-1.0f32..1.0)).collect()
}

#[test]
fn paged_attention_matches_dense_causal_attention() {
    // 2 sequences of 5 and 3 tokens, 4 query heads over 2 KV heads, blocks of 2, scattered
    let src = r#"graph "attn" {
  %q = input : f32[T, 4, 8]
  %k = input : f32[T, 2, 8]
  %v = input : f32[T, 2, 8]
  %pos = input : i32[T]
  %seq = input : i32[T]
  %slots = input : i32[T]
  %table = input : i32[S, MB]
  %kc = state : f32[NB, 2, 2, 8]
  %vc = state : f32[NB, 2, 2, 8]
  %kw = cache_write(%kc, %k, %slots) : f32[NB, 2, 2, 8]
  %vw = cache_write(%vc, %v, %slots) : f32[NB, 2, 2, 8]
  %o = paged_attention(%q, %kw, %vw, %pos, %seq, %table) {scale = 0.5} : f32[T, 4, 8]
  output o = %o
}
"#;
    let g = text::parse(src).unwrap();
    let lens = [5usize, 3];
    let table = [[6, 1, 3], [0, 4, -1]];
    let t = 8;
    let (q, k, v) = (rand_vec(t * 32, 1), rand_vec(t * 16, 2), rand_vec(t * 16, 3));
    let mut pos = vec![];
    let mut seq = vec![];
    let mut slots = vec![];
    for (s, &n) in lens.iter().enumerate() {
        for p in 0..n {
            pos.push(p as i32);
            seq.push(s as i32);
            slots.push(table[s][p / 2] * 2 + (p % 2) as i32);
        }
    }
    let mut ex = Executor::new(&g, &HashMap::<String, (DType, Vec<usize>, Vec<u8>)>::new(), BTreeMap::from([("NB".into(), 8)])).unwrap();
    let inputs = BTreeMap::from([
        ("q".to_string(), Tensor::new(vec![t, 4, 8], q.clone())),
        ("k".to_string(), Tensor::new(vec![t, 2, 8], k.clone())),
        ("v".to_string(), Tensor::new(vec![t, 2, 8], v.clone())),
        ("pos".to_string(), Tensor::from_i32(vec![t], &pos)),
        ("seq".to_string(), Tensor::from_i32(vec![t], &seq)),
        ("slots".to_string(), Tensor::from_i32(vec![t], &slots)),
        ("table".to_string(), Tensor::from_i32(vec![2, 3], &table.concat())),
    ]);
    let out = ex.run(&inputs).unwrap().remove("o").unwrap();
    // dense reference
    let mut start = 0;
    for &n in &lens {
        for i in 0..n {
            for h in 0..4 {
                let kh = h / 2;
                let qi = &q[((start + i) * 4 + h) * 8..][..8];
                let sc: Vec<f32> = (0..=i).map(|j| qi.iter().zip(&k[((start + j) * 2 + kh) * 8..][..8]).map(|(a, b)| a * b).sum::<f32>() * 0.5).collect();
                let m = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = sc.iter().map(|s| (s - m).exp()).collect();
                let z: f32 = e.iter().sum();
                for dd in 0..8 {
                    let want: f32 = (0..=i).map(|j| e[j] / z * v[((start + j) * 2 + kh) * 8 + dd]).sum();
                    let got = out.data[((start + i) * 4 + h) * 8 + dd];
                    assert!((want - got).abs() < 1e-5, "token {} head {h} dim {dd}: {got} vs {want}", start + i);
                }
            }
        }
        start += n;
    }
    // a position past the block table is an error, not a panic
    let mut bad = inputs.clone();
    bad.insert("pos".into(), Tensor::from_i32(vec![t], &[0, 1, 2, 3, 9, 0, 1, 2]));
    let e = ex.run(&bad).unwrap_err().to_string();
    assert!(e.contains("paged_attention") || e.contains("needs"), "{e}");
}

#[test]
fn rope_rotates_pairs_and_keeps_norms() {
    let src = "graph \"r\" {\n  %x = input : f32[T, 1, 4]\n  %p = input : i32[T]\n  %i = rope(%x, %p) {theta = 10000.0, style = interleaved, rotary_dim = 4} : f32[T, 1, 4]\n  %h = rope(%x, %p) {theta = 10000.0, style = half, rotary_dim = 4} : f32[T, 1, 4]\n  output i = %i\n  output h = %h\n}\n";
    let g = text::parse(src).unwrap();
    let mut ex = Executor::new(&g, &HashMap::<String, (DType, Vec<usize>, Vec<u8>)>::new(), BTreeMap::new()).unwrap();
    let x = vec![1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0];
    let out = ex.run(&BTreeMap::from([("x".into(), Tensor::new(vec![2, 1, 4], x)), ("p".into(), Tensor::from_i32(vec![2], &[0, 1]))])).unwrap();
    // position 0: identity
    assert_eq!(&out["i"].data[..4], &[1.0, 2.0, 3.0, 4.0]);
    // position 1, interleaved: pair (x0, x1) rotated by 1 rad, pair (x2, x3) by 1e-2 rad
    let (c, s) = (1f32.cos(), 1f32.sin());
    let (c2, s2) = (0.01f32.cos(), 0.01f32.sin());
    let want = [1.0 * c - 2.0 * s, 1.0 * s + 2.0 * c, 3.0 * c2 - 4.0 * s2, 3.0 * s2 + 4.0 * c2];
    for (a, b) in out["i"].data[4..].iter().zip(want) {
        assert!((a - b).abs() < 1e-6);
    }
    // half style pairs (x0, x2) and (x1, x3)
    let want = [1.0 * c - 3.0 * s, 2.0 * c2 - 4.0 * s2, 1.0 * s + 3.0 * c, 2.0 * s2 + 4.0 * c2];
    for (a, b) in out["h"].data[4..].iter().zip(want) {
        assert!((a - b).abs() < 1e-6);
    }
}

#[test]
fn matmul_with_packed_weights_equals_dequantized_f32() {
    let wv = rand_vec(16 * 64, 9);
    let x = rand_vec(3 * 64, 4);
    for dt in [DType::Q4_1, DType::F8G32] {
        let src = format!("graph \"m\" {{\n  %x = input : f32[T, 64]\n  %w = weight : {dt}[16, 64]\n  %y = matmul(%x, %w) {{transpose_b = true}} : f32[T, 16]\n  output y = %y\n}}\n");
        let g = text::parse(&src).unwrap();
        let ws = weights(&[("w", dt, vec![16, 64], wv.clone())]);
        let deq = quant::decode(dt, &ws["w"].2, 16 * 64).unwrap();
        assert!(rel(&deq, &wv) < 0.1, "{dt}");
        let out = Executor::new(&g, &ws, BTreeMap::new()).unwrap().run(&BTreeMap::from([("x".into(), Tensor::new(vec![3, 64], x.clone()))])).unwrap();
        for r in 0..3 {
            for n in 0..16 {
                let want: f32 = (0..64).map(|k| x[r * 64 + k] * deq[n * 64 + k]).sum();
                assert!((out["y"].data[r * 16 + n] - want).abs() < 1e-4, "{dt}");
            }
        }
    }
    let src = "graph \"m\" {\n  %x = input : f32[T, 64]\n  %w = weight : q4_1[16, 64]\n  %y = matmul(%x, %w) {transpose_b = true} : f32[T, 16]\n  output y = %y\n}\n";
    let g = text::parse(src).unwrap();
    // a weight whose stored dtype disagrees with the graph is an error naming it
    let bad = weights(&[("w", DType::Q8_0, vec![16, 64], wv)]);
    let e = Executor::new(&g, &bad, BTreeMap::new()).err().expect("dtype mismatch").to_string();
    assert!(e.contains("weight `w`") && e.contains("q8_0"), "{e}");
}

#[test]
fn executor_rejects_bad_inputs_without_panicking() {
    let g = text::parse("graph \"g\" {\n  %t = input : i32[T]\n  %e = weight : f32[4, 2]\n  %x = gather(%e, %t) : f32[T, 2]\n  output x = %x\n}\n").unwrap();
    let ws = weights(&[("e", DType::F32, vec![4, 2], vec![0.0; 8])]);
    let mut ex = Executor::new(&g, &ws, BTreeMap::new()).unwrap();
    let e = ex.run(&BTreeMap::new()).unwrap_err().to_string();
    assert!(e.contains("input `t`: missing"), "{e}");
    let e = ex.run(&BTreeMap::from([("t".into(), Tensor::from_i32(vec![2], &[1, 7]))])).unwrap_err().to_string();
    assert!(e.contains("index 7 out of range 0..4"), "{e}");
    let e = ex.run(&BTreeMap::from([("t".into(), Tensor::new(vec![1], vec![0.5]))])).unwrap_err().to_string();
    assert!(e.contains("non-integer"), "{e}");
}

// Random elementwise graphs: printing and parsing preserves the graph and its values.
fn unary_name(i: u8) -> &'static str {
    ["neg", "exp", "tanh", "sigmoid", "relu", "silu", "gelu", "gelu_erf"][i as usize % 8]
}
fn binary_name(i: u8) -> &'static str {
    ["add", "sub", "mul", "max", "min"][i as usize % 5]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn random_graphs_round_trip_and_evaluate_identically(steps in prop::collection::vec((any::<bool>(), any::<u8>(), any::<u8>(), any::<u8>()), 1..12), seed in any::<u64>()) {
        let mut src = String::from("graph \"p\" {\n  %v0 = input : f32[T, 6]\n");
        for (i, (bin, op, a, b)) in steps.iter().enumerate() {
            let n = i + 1;
            let pa = *a as usize % n;
            if *bin {
                let pb = *b as usize % n;
                src.push_str(&format!("  %v{n} = {}(%v{pa}, %v{pb}) : f32[T, 6]\n", binary_name(*op)));
            } else {
                src.push_str(&format!("  %v{n} = {}(%v{pa}) : f32[T, 6]\n", unary_name(*op)));
            }
        }
        src.push_str(&format!("  output y = %v{}\n}}\n", steps.len()));
        let g = text::parse(&src).unwrap();
        prop_assert_eq!(text::print(&g), src.clone());
        let g2 = text::parse(&text::print(&g)).unwrap();
        let x = Tensor::new(vec![3, 6], rand_vec(18, seed));
        let none = HashMap::<String, (DType, Vec<usize>, Vec<u8>)>::new();
        let a = Executor::new(&g, &none, BTreeMap::new()).unwrap().run(&BTreeMap::from([("v0".into(), x.clone())])).unwrap();
        let b = Executor::new(&g2, &none, BTreeMap::new()).unwrap().run(&BTreeMap::from([("v0".into(), x)])).unwrap();
        prop_assert_eq!(a, b);
    }
}

#[test]
fn a_bf16_pool_stores_rows_rounded_to_bf16() {
    // the cast is part of the write: the pool holds bf16 values, the attention reads them
    let src = "graph \"w\" {\n  %x = input : f32[3, 2, 4]\n  %s = input : i32[3]\n  %c = state : bf16[4, 2, 2, 4]\n  %w = cache_write(%c, %x, %s) : bf16[4, 2, 2, 4]\n  output c = %w\n}\n";
    let g = text::parse(src).unwrap();
    let mut ex = Executor::new(&g, &HashMap::<String, (DType, Vec<usize>, Vec<u8>)>::new(), BTreeMap::new()).unwrap();
    let x: Vec<f32> = (0..24).map(|i| 1.0 + (i + 1) as f32 * 1e-3).collect();
    let slots = [5i32, 0, 7];
    let out = ex.run(&BTreeMap::from([("x".to_string(), Tensor::new(vec![3, 2, 4], x.clone())), ("s".to_string(), Tensor::from_i32(vec![3], &slots))])).unwrap().remove("c").unwrap();
    for (t, &s) in slots.iter().enumerate() {
        for e in 0..8 {
            let (got, v) = (out.data[s as usize * 8 + e], x[t * 8 + e]);
            assert_eq!(got, quant::round_to(DType::BF16, v), "slot {s} element {e}");
            assert_ne!(got, v, "1 + k/1000 is not a bf16 value");
        }
    }
}

#[test]
fn an_e4m3_pool_keeps_a_scale_per_token_and_head() {
    // each head's row rotated by the normalized Hadamard transform, scaled by its |max| / 448,
    // rounded to e4m3, rotated back: a head of tiny values keeps e4m3's relative precision
    // (unscaled, its values would be e4m3 subnormals or zero), and an outlier channel's error
    // spreads over the row
    let src = "graph \"w\" {\n  %x = input : f32[2, 2, 4]\n  %s = input : i32[2]\n  %c = state : f8e4m3[2, 2, 2, 4]\n  %w = cache_write(%c, %x, %s) : f8e4m3[2, 2, 2, 4]\n  output c = %w\n}\n";
    let g = text::parse(src).unwrap();
    let mut ex = Executor::new(&g, &HashMap::<String, (DType, Vec<usize>, Vec<u8>)>::new(), BTreeMap::new()).unwrap();
    let x: Vec<f32> = (0..16).map(|i| if (i / 4) % 2 == 0 { 1e-4 * (i + 1) as f32 } else { -300.0 + 97.0 * i as f32 }).collect();
    let slots = [3i32, 0];
    let out = ex.run(&BTreeMap::from([("x".to_string(), Tensor::new(vec![2, 2, 4], x.clone())), ("s".to_string(), Tensor::from_i32(vec![2], &slots))])).unwrap().remove("c").unwrap();
    let had = |v: &[f32]| -> Vec<f32> {
        let mut h = v.to_vec();
        dsc_ir::quant::hadamard(&mut h);
        h
    };
    for (t, &s) in slots.iter().enumerate() {
        for hd in 0..2 {
            let (got, v) = (&out.data[s as usize * 8 + 4 * hd..][..4], &x[t * 8 + 4 * hd..][..4]);
            // the stored row, rotated, is e4m3 times the row's scale exactly
            let r = had(v);
            let sc = r.iter().fold(0f32, |a, v| a.max(v.abs())) / 448.0;
            let q: Vec<f32> = r.iter().map(|v| dsc_ir::quant::round_to(DType::F8E4M3, v / sc) * sc).collect();
            let want = had(&q);
            for e in 0..4 {
                assert!((got[e] - want[e]).abs() <= 1e-6 * want[e].abs().max(sc), "slot {s} head {hd} element {e}: {} vs {}", got[e], want[e]);
            }
            // within e4m3's relative error of the row's norm
            let norm = v.iter().map(|a| a * a).sum::<f32>().sqrt();
            let err = got.iter().zip(v).map(|(a, b)| (a - b) * (a - b)).sum::<f32>().sqrt();
            assert!(err <= norm / 16.0, "slot {s} head {hd}: error {err} of norm {norm}");
        }
    }
    // (H is its own inverse)
    let v = [1.0f32, -2.0, 0.5, 4.0, 3.0, 0.0, -1.0, 2.5];
    assert!(had(&had(&v)).iter().zip(&v).all(|(a, b)| (a - b).abs() < 1e-6));
}

fn run1(src: &str, inputs: Vec<(&str, Tensor)>, ws: &HashMap<String, (DType, Vec<usize>, Vec<u8>)>, fixed: BTreeMap<String, usize>) -> BTreeMap<String, Tensor> {
    let g = text::parse(src).unwrap();
    let mut ex = Executor::new(&g, ws, fixed).unwrap();
    ex.run(&inputs.into_iter().map(|(n, t)| (n.to_string(), t)).collect()).unwrap()
}

#[test]
fn moe_route_selects_as_the_deepseek_v2_and_v3_gates() {
    // 8 experts in 4 groups of 2; the top 3 logits lie in 3 different groups
    let logits = vec![2.0, 0.0, 1.9, 0.0, 1.8, 1.7, 0.0, 0.0];
    let src = |attrs: &str, bias: bool| {
        format!(
            "graph \"r\" {{\n  %l = input : f32[T, 8]\n  %m = input : f32[8]\n{}  %r = moe_route(%l, %m{}) {{{attrs}}} : f32[T, 8]\n  output r = %r\n}}\n",
            if bias { "  %b = weight : f32[8]\n" } else { "" },
            if bias { ", %b" } else { "" }
        )
    };
    let soft: Vec<f32> = {
        let e: Vec<f32> = logits.iter().map(|v: &f32| v.exp()).collect();
        let s: f32 = e.iter().sum();
        e.iter().map(|v| v / s).collect()
    };
    let x = || vec![("l", Tensor::new(vec![1, 8], logits.clone())), ("m", Tensor::new(vec![8], vec![1.0; 8]))];
    let none = HashMap::new();
    // greedy: experts 0, 2, 4 with their softmax scores, times the scaling
    let r = run1(&src("top_k = 3, n_group = 1, topk_group = 1, scoring = softmax, select = greedy, normalize = false, scaling = 2.0", false), x(), &none, BTreeMap::new());
    let close = |got: &[f32], want: &[f32]| assert!(got.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-6 && (*a == 0.0) == (*b == 0.0)), "{got:?} vs {want:?}");
    let want: Vec<f32> = (0..8).map(|i| if [0, 2, 4].contains(&i) { 2.0 * soft[i] } else { 0.0 }).collect();
    close(&r["r"].data, &want);
    // V2 group-limited: groups 0 and 1 (max 2.0, 1.9) are kept, so expert 1 (a tie at 0 with 3:
    // the lower index) replaces expert 4
    let r = run1(&src("top_k = 3, n_group = 4, topk_group = 2, scoring = softmax, select = group_max, normalize = false, scaling = 1.0", false), x(), &none, BTreeMap::new());
    let want: Vec<f32> = (0..8).map(|i| if [0, 1, 2].contains(&i) { soft[i] } else { 0.0 }).collect();
    close(&r["r"].data, &want);
    // V3 noaux_tc: a bias of 3 on group 3 makes it win; group 2's two best (1.8, 1.7) beat
    // group 0's (2.0, 0.0) by their sum; choice 6, 7 (biased), then 4; weights unbiased, renormalized
    let sig = |v: f32| 1.0 / (1.0 + (-v).exp());
    let ws = weights(&[("b", DType::F32, vec![8], vec![0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 3.0, 3.0])]);
    let r = run1(&src("top_k = 3, n_group = 4, topk_group = 2, scoring = sigmoid, select = noaux_tc, normalize = true, scaling = 2.5", true), x(), &ws, BTreeMap::new());
    let (w6, w7, w4) = (sig(0.0), sig(0.0), sig(1.8));
    let s = w6 + w7 + w4 + 1e-20;
    let want: Vec<f32> = (0..8)
        .map(|i| match i {
            4 => w4 / s * 2.5,
            6 => w6 / s * 2.5,
            7 => w7 / s * 2.5,
            _ => 0.0,
        })
        .collect();
    close(&r["r"].data, &want);
    // failover: expert 2 disabled. Greedy softmax renormalizes over the other 7 and takes 0, 4, 5
    let masked = |dis: usize| vec![("l", Tensor::new(vec![1, 8], logits.clone())), ("m", Tensor::new(vec![8], (0..8).map(|i| if i == dis { 0.0 } else { 1.0 }).collect()))];
    let r = run1(&src("top_k = 3, n_group = 1, topk_group = 1, scoring = softmax, select = greedy, normalize = false, scaling = 1.0", false), masked(2), &none, BTreeMap::new());
    let rest: Vec<f32> = {
        let e: Vec<f32> = logits.iter().enumerate().map(|(i, v)| if i == 2 { 0.0 } else { v.exp() }).collect();
        let s: f32 = e.iter().sum();
        e.iter().map(|v| v / s).collect()
    };
    let want: Vec<f32> = (0..8).map(|i| if [0, 4, 5].contains(&i) { rest[i] } else { 0.0 }).collect();
    close(&r["r"].data, &want);
    // V3: expert 6 disabled; its group still wins on expert 7 + bias, then group 2 gives 4 and 5
    let r = run1(&src("top_k = 3, n_group = 4, topk_group = 2, scoring = sigmoid, select = noaux_tc, normalize = true, scaling = 2.5", true), masked(6), &ws, BTreeMap::new());
    let (w7, w4, w5) = (sig(0.0), sig(1.8), sig(1.7));
    let s = w7 + w4 + w5 + 1e-20;
    let want: Vec<f32> = (0..8)
        .map(|i| match i {
            4 => w4 / s * 2.5,
            5 => w5 / s * 2.5,
            7 => w7 / s * 2.5,
            _ => 0.0,
        })
        .collect();
    close(&r["r"].data, &want);
    // every expert disabled: the token routes nowhere (only the shared experts remain)
    let none_on = vec![("l", Tensor::new(vec![1, 8], logits.clone())), ("m", Tensor::new(vec![8], vec![0.0; 8]))];
    let r = run1(&src("top_k = 3, n_group = 1, topk_group = 1, scoring = softmax, select = greedy, normalize = false, scaling = 1.0", false), none_on, &none, BTreeMap::new());
    assert!(r["r"].data.iter().all(|&v| v == 0.0));
    // inconsistent configurations are verifier errors
    let e = parse_err(&src("top_k = 5, n_group = 4, topk_group = 2, scoring = softmax, select = group_max, normalize = false, scaling = 1.0", false));
    assert!(e.contains("top_k = 5"), "{e}");
    let e = parse_err(&src("top_k = 2, n_group = 4, topk_group = 2, scoring = sigmoid, select = noaux_tc, normalize = true, scaling = 1.0", false));
    assert!(e.contains("correction bias"), "{e}");
}

#[test]
fn moe_experts_sum_the_routed_swiglu_mlps() {
    let (t, d, e, i) = (3, 8, 4, 6);
    let src = format!("graph \"m\" {{\n  %x = input : f32[T, {d}]\n  %r = input : f32[T, {e}]\n  %g = weight : f32[{e}, {i}, {d}]\n  %u = weight : f32[{e}, {i}, {d}]\n  %w = weight : f32[{e}, {d}, {i}]\n  %y = moe_experts(%x, %r, %g, %u, %w) : f32[T, {d}]\n  output y = %y\n}}\n");
    let (gv, uv, dv) = (rand_vec(e * i * d, 1), rand_vec(e * i * d, 2), rand_vec(e * d * i, 3));
    let ws = weights(&[("g", DType::F32, vec![e, i, d], gv.clone()), ("u", DType::F32, vec![e, i, d], uv.clone()), ("w", DType::F32, vec![e, d, i], dv.clone())]);
    let x = rand_vec(t * d, 4);
    // token 0 -> experts 1 and 3, token 1 -> none, token 2 -> expert 0
    let route = vec![0.0, 0.7, 0.0, 0.2, 0.0, 0.0, 0.0, 0.0, 1.5, 0.0, 0.0, 0.0];
    let out = run1(&src, vec![("x", Tensor::new(vec![t, d], x.clone())), ("r", Tensor::new(vec![t, e], route.clone()))], &ws, BTreeMap::new());
    let silu = |v: f32| v / (1.0 + (-v).exp());
    for ti in 0..t {
        for o in 0..d {
            let mut want = 0f32;
            for ei in 0..e {
                let w = route[ti * e + ei];
                if w == 0.0 {
                    continue;
                }
                let h: Vec<f32> = (0..i)
                    .map(|j| {
                        let dot = |m: &[f32]| (0..d).map(|k| m[(ei * i + j) * d + k] * x[ti * d + k]).sum::<f32>();
                        silu(dot(&gv)) * dot(&uv)
                    })
                    .collect();
                want += w * (0..i).map(|j| dv[(ei * d + o) * i + j] * h[j]).sum::<f32>();
            }
            assert!((out["y"].data[ti * d + o] - want).abs() < 1e-5, "token {ti} dim {o}");
        }
    }
    // with a residual operand: the experts' sum, then + the residual (a token routed nowhere
    // gets the residual alone)
    let with = src.replace("%y = moe_experts(%x, %r, %g, %u, %w)", "%res = input : f32[T, 8]\n  %y = moe_experts(%x, %r, %g, %u, %w, %res)");
    let res = rand_vec(t * d, 5);
    let out2 = run1(&with, vec![("x", Tensor::new(vec![t, d], x.clone())), ("r", Tensor::new(vec![t, e], route.clone())), ("res", Tensor::new(vec![t, d], res.clone()))], &ws, BTreeMap::new());
    for j in 0..t * d {
        assert_eq!(out2["y"].data[j], out["y"].data[j] + res[j], "element {j}");
    }
    let bad = src.replace("%y = moe_experts(%x, %r, %g, %u, %w)", "%res = input : f32[T, 4]\n  %y = moe_experts(%x, %r, %g, %u, %w, %res)");
    let e = parse_err(&bad);
    assert!(e.contains("moe residual"), "{e}");
}

#[test]
fn mla_attention_attends_over_the_latent_rows() {
    // one sequence of 5 tokens, blocks of 2 scattered; 3 heads over a latent of 6 (4 + 2 rope)
    let (t, h, c, l) = (5, 3, 6, 4);
    let src = format!(
        "graph \"mla\" {{\n  %q = input : f32[T, {h}, {c}]\n  %lat = input : f32[T, 1, {c}]\n  %pos = input : i32[T]\n  %seq = input : i32[T]\n  %slots = input : i32[T]\n  %table = input : i32[S, MB]\n  %lc = state : f32[NB, 2, 1, {c}]\n  %w = cache_write(%lc, %lat, %slots) : f32[NB, 2, 1, {c}]\n  %o = mla_attention(%q, %w, %pos, %seq, %table) {{scale = 0.4, kv_lora_rank = {l}}} : f32[T, {h}, {l}]\n  output o = %o\n}}\n"
    );
    let (q, lat) = (rand_vec(t * h * c, 5), rand_vec(t * c, 6));
    let table = [3, 0, 2];
    let slots: Vec<i32> = (0..t as i32).map(|p| table[(p / 2) as usize] * 2 + p % 2).collect();
    let out = run1(
        &src,
        vec![
            ("q", Tensor::new(vec![t, h, c], q.clone())),
            ("lat", Tensor::new(vec![t, 1, c], lat.clone())),
            ("pos", Tensor::from_i32(vec![t], &[0, 1, 2, 3, 4])),
            ("seq", Tensor::from_i32(vec![t], &[0; 5])),
            ("slots", Tensor::from_i32(vec![t], &slots)),
            ("table", Tensor::from_i32(vec![1, 3], &table)),
        ],
        &HashMap::new(),
        BTreeMap::from([("NB".to_string(), 4)]),
    );
    for ti in 0..t {
        for hi in 0..h {
            let qv = &q[(ti * h + hi) * c..(ti * h + hi + 1) * c];
            let s: Vec<f32> = (0..=ti).map(|j| 0.4 * qv.iter().zip(&lat[j * c..(j + 1) * c]).map(|(a, b)| a * b).sum::<f32>()).collect();
            let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let z: f32 = s.iter().map(|v| (v - m).exp()).sum();
            for k in 0..l {
                let want: f32 = (0..=ti).map(|j| (s[j] - m).exp() / z * lat[j * c + k]).sum();
                assert!((out["o"].data[(ti * h + hi) * l + k] - want).abs() < 1e-5);
            }
        }
    }
}

#[test]
fn head_matmul_is_one_matmul_per_head() {
    let (t, h, k, n) = (2, 3, 4, 5);
    for tb in [false, true] {
        let wshape = if tb { format!("{h}, {n}, {k}") } else { format!("{h}, {k}, {n}") };
        let src =
            format!("graph \"h\" {{\n  %a = input : f32[T, {h}, {k}]\n  %b = weight : f32[{wshape}]\n  %y = head_matmul(%a, %b) {{transpose_b = {tb}}} : f32[T, {h}, {n}]\n  output y = %y\n}}\n");
        let (a, b) = (rand_vec(t * h * k, 7), rand_vec(h * k * n, 8));
        let ws = weights(&[("b", DType::F32, if tb { vec![h, n, k] } else { vec![h, k, n] }, b.clone())]);
        let out = run1(&src, vec![("a", Tensor::new(vec![t, h, k], a.clone()))], &ws, BTreeMap::new());
        for ti in 0..t {
            for hi in 0..h {
                for j in 0..n {
                    let want: f32 = (0..k).map(|i| a[(ti * h + hi) * k + i] * if tb { b[(hi * n + j) * k + i] } else { b[(hi * k + i) * n + j] }).sum();
                    assert!((out["y"].data[(ti * h + hi) * n + j] - want).abs() < 1e-5);
                }
            }
        }
    }
}

#[test]
fn yarn_keeps_fast_dims_and_interpolates_slow_ones() {
    // DeepSeek-V2's rope: 64 dims, base 10000, factor 40 over 4096 original positions
    let y = Yarn { factor: 40.0, original_max_position: 4096, beta_fast: 32.0, beta_slow: 1.0, attention_factor: 1.0 };
    let f = y.inv_freq(10000.0, 64);
    let plain: Vec<f32> = (0..32).map(|i| 1.0 / 10000f32.powf((2 * i) as f32 / 64.0)).collect();
    // the correction range is dims 10..23 for these values: below it extrapolated (plain),
    // above it interpolated (plain / factor), a linear blend between
    for i in 0..10 {
        assert!((f[i] - plain[i]).abs() <= 1e-6 * plain[i], "dim {i}");
    }
    for i in 23..32 {
        assert!((f[i] - plain[i] / 40.0).abs() <= 1e-6 * plain[i], "dim {i}");
    }
    for i in 11..22 {
        assert!(f[i] < plain[i] && f[i] > plain[i] / 40.0, "dim {i} blends");
    }
    assert!((yarn_mscale(40.0, 0.707) - (0.1 * 0.707 * 40f32.ln() + 1.0)).abs() < 1e-7);
    assert_eq!(yarn_mscale(1.0, 0.707), 1.0);
}

/// The DeepSeek family's ops print and parse back (the same text seeds the IR fuzz target).
#[test]
fn deepseek_ops_round_trip() {
    let src = r#"graph "ds" {
  %x = input : f32[T, 4, 6]
  %p = input : i32[T]
  %s = input : i32[T]
  %t = input : i32[S, MB]
  %l = input : f32[T, 8]
  %m = input : f32[8]
  %b = weight : f32[8]
  %w = weight : bf16[4, 4, 6]
  %h = input : f32[T, 16]
  %g = weight : bf16[8, 3, 16]
  %d = weight : bf16[8, 16, 3]
  %c = state : f32[NB, 4, 1, 6]
  %r = rope_yarn(%x, %p) {theta = 10000.0, style = interleaved, rotary_dim = 2, factor = 40.0, original_max_position = 4096, beta_fast = 32.0, beta_slow = 1.0, attention_factor = 1.0} : f32[T, 4, 6]
  %q = head_matmul(%r, %w) {transpose_b = true} : f32[T, 4, 4]
  %a = mla_attention(%x, %c, %p, %s, %t) {scale = 0.1, kv_lora_rank = 4} : f32[T, 4, 4]
  %k = moe_route(%l, %m, %b) {top_k = 2, n_group = 4, topk_group = 2, scoring = sigmoid, select = noaux_tc, normalize = true, scaling = 2.5} : f32[T, 8]
  %e = moe_experts(%h, %k, %g, %g, %d) : f32[T, 16]
  output q = %q
  output a = %a
  output e = %e
}
"#;
    let g = text::parse(src).unwrap();
    assert_eq!(text::print(&g), src);
}
