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
  %last = gather(%e, %rows) : f32[R, 32]
  output last = %last
  output cast = %cast
  output argmax = %am
  output reduced = %ar
  output t = %t
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
    let src = "graph \"m\" {\n  %x = input : f32[T, 64]\n  %w = weight : q4_1[16, 64]\n  %y = matmul(%x, %w) {transpose_b = true} : f32[T, 16]\n  output y = %y\n}\n";
    let g = text::parse(src).unwrap();
    let wv = rand_vec(16 * 64, 9);
    let ws = weights(&[("w", DType::Q4_1, vec![16, 64], wv.clone())]);
    let deq = quant::decode(DType::Q4_1, &ws["w"].2, 16 * 64).unwrap();
    let x = rand_vec(3 * 64, 4);
    let out = Executor::new(&g, &ws, BTreeMap::new()).unwrap().run(&BTreeMap::from([("x".into(), Tensor::new(vec![3, 64], x.clone()))])).unwrap();
    for r in 0..3 {
        for n in 0..16 {
            let want: f32 = (0..64).map(|k| x[r * 64 + k] * deq[n * 64 + k]).sum();
            assert!((out["y"].data[r * 16 + n] - want).abs() < 1e-4);
        }
    }
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
