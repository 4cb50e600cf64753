//! The importers agree with each other, and the executor's paged KV cache is consistent:
//! - the same weights as HF safetensors (rotate_half RoPE) and as GGUF (llama.cpp's permuted
//!   Q/K, interleaved RoPE) give the same logits;
//! - sharded safetensors (model.safetensors.index.json) load like one file;
//! - GGUF K-quant weights (Q4_K, Q5_K, Q6_K, and their fallbacks Q5_0, Q5_1) run as their
//!   dequantized values, on the executor and on the compiled CPU kernels;
//! - prefill in one step == token by token == two sequences batched in one step.

use dsc_ir::{DType, Executor};
use dsc_tests::*;
use std::collections::BTreeMap;

const PROMPT: [i32; 7] = [3, 17, 42, 8, 79, 0, 23];

#[test]
fn safetensors_and_gguf_of_the_same_weights_agree() {
    let d = tempfile::tempdir().unwrap();
    let w = tiny_llama_hf(11);
    write_tiny_hf(&d.path().join("hf"), &w);
    let hf = dsc_models::load(&model_toml(d.path(), "safetensors", "hf")).unwrap();
    let reference = prefill_logits(&hf, &PROMPT);
    assert_eq!(reference.shape, vec![7, 80]);
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::F16, 2e-3), (DType::BF16, 2e-2), (DType::Q8_0, 3e-2)] {
        let sub = d.path().join(dtype.name());
        std::fs::create_dir_all(&sub).unwrap();
        write_tiny_gguf(&sub.join("m.gguf"), &tiny_gguf_metadata(), &tiny_gguf_tensors(&w, dtype));
        let gg = dsc_models::load(&model_toml(&sub, "gguf", "m.gguf")).unwrap();
        let got = prefill_logits(&gg, &PROMPT);
        let e = rel_err(&got.data, &reference.data);
        assert!(e < tol, "{dtype} GGUF vs safetensors: relative error {e} > {tol}");
    }
}

/// A GGUF of K-quant matrices (hidden 256: K-quants take rows of whole 256-value super-blocks;
/// and of Q5_0 / Q5_1, llama.cpp's fallbacks for rows that are not)
/// gives the logits of the same file with those matrices stored dequantized as f32: the CPU
/// executor reads the packed blocks as `quant::decode` does (equal to the `gguf` package's,
/// ir/tests/kquants.rs), and so do the plan's compiled x86-64 kernels, which read the
/// super-blocks as stored. The GPU lowering refuses them by name.
#[test]
fn k_quant_ggufs_run_as_their_dequantized_weights() {
    let d = tempfile::tempdir().unwrap();
    let (h, f, v) = (256usize, 512usize, 80usize);
    let meta = vec![
        ("general.architecture", dsc_models::gguf::Value::Str("llama".into())),
        ("llama.block_count", dsc_models::gguf::Value::U32(1)),
        ("llama.embedding_length", dsc_models::gguf::Value::U32(h as u32)),
        ("llama.feed_forward_length", dsc_models::gguf::Value::U32(f as u32)),
        ("llama.attention.head_count", dsc_models::gguf::Value::U32(4)),
        ("llama.attention.head_count_kv", dsc_models::gguf::Value::U32(2)),
        ("llama.rope.freq_base", dsc_models::gguf::Value::F32(10000.0)),
        ("llama.attention.layer_norm_rms_epsilon", dsc_models::gguf::Value::F32(1e-5)),
        ("llama.vocab_size", dsc_models::gguf::Value::U32(v as u32)),
    ];
    let mut seed = 7u32;
    let mut rand = |n: usize, scale: f32| -> Vec<f32> {
        (0..n)
            .map(|_| {
                seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
                ((seed >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    };
    let mats: Vec<(&str, Vec<usize>)> = vec![
        ("blk.0.attn_q.weight", vec![h, h]),
        ("blk.0.attn_k.weight", vec![h / 2, h]),
        ("blk.0.attn_v.weight", vec![h / 2, h]),
        ("blk.0.attn_output.weight", vec![h, h]),
        ("blk.0.ffn_gate.weight", vec![f, h]),
        ("blk.0.ffn_up.weight", vec![f, h]),
        ("blk.0.ffn_down.weight", vec![h, f]),
        ("output.weight", vec![v, h]),
    ];
    let values: Vec<Vec<f32>> = mats.iter().map(|(_, s)| rand(s[0] * s[1], 0.08)).collect();
    let plain: Vec<(String, DType, Vec<usize>, Vec<u8>)> = vec![
        ("token_embd.weight".into(), DType::F32, vec![v, h], dsc_ir::quant::encode(DType::F32, &rand(v * h, 1.0)).unwrap()),
        ("blk.0.attn_norm.weight".into(), DType::F32, vec![h], dsc_ir::quant::encode(DType::F32, &vec![1.0; h]).unwrap()),
        ("blk.0.ffn_norm.weight".into(), DType::F32, vec![h], dsc_ir::quant::encode(DType::F32, &vec![1.0; h]).unwrap()),
        ("output_norm.weight".into(), DType::F32, vec![h], dsc_ir::quant::encode(DType::F32, &vec![1.0; h]).unwrap()),
    ];
    for dt in [DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q5_0, DType::Q5_1] {
        let (mut packed, mut widened) = (plain.clone(), plain.clone());
        for ((name, shape), x) in mats.iter().zip(&values) {
            let b = dsc_ir::quant::encode(dt, x).unwrap();
            let deq = dsc_ir::quant::decode(dt, &b, x.len()).unwrap();
            packed.push((name.to_string(), dt, shape.clone(), b));
            widened.push((name.to_string(), DType::F32, shape.clone(), dsc_ir::quant::encode(DType::F32, &deq).unwrap()));
        }
        let logits = |tensors: &[(String, DType, Vec<usize>, Vec<u8>)], sub: &str| {
            let dir = d.path().join(sub);
            std::fs::create_dir_all(&dir).unwrap();
            write_tiny_gguf(&dir.join("m.gguf"), &meta, tensors);
            let m = dsc_models::load(&model_toml(&dir, "gguf", "m.gguf")).unwrap();
            assert!(m.weights.tensors.values().any(|t| t.dtype == tensors[4].1), "{sub}: the matrices stay {}", tensors[4].1);
            (prefill_logits(&m, &PROMPT), dir)
        };
        let (got, dir) = logits(&packed, dt.name());
        let (want, _) = logits(&widened, &format!("{}-f32", dt.name()));
        let e = rel_err(&got.data, &want.data);
        assert!(e < 1e-6 && got.data.iter().all(|x| x.is_finite()), "{dt} GGUF vs its dequantized f32: relative error {e}");
        // the GPU program reads the blocks as stored too (codegen's kernels/matmul/kquant.rs:
        // the one-row GEMV over them; Q4_K's on the tensor cores, kernels/matmul/packed.rs;
        // checked on the GPU by scripts/gpu-kquant.sh)
        let c = dsc_compiler::compile(&model_toml(&dir, "gguf", "m.gguf")).unwrap();
        let gpu = c.gpu.as_ref().unwrap_or_else(|| panic!("{dt}: no GPU program: {:?}", c.gpu_skipped));
        let one_row = format!("_{}", dt.name());
        let decode = |k: &str| if dt == DType::Q4_K { k.contains("matmul_q4k_t0_") } else { k.starts_with("matmul_k") && k.contains(&one_row) };
        assert!(gpu.steps.iter().any(|s| s.kernel.as_deref().is_some_and(decode)), "{dt}: no decode GEMV over the blocks");
        // ... and batched decode steps the tensor-core batched GEMV over them (not the
        // per-element wgmma staging: 4x slower at 8 rows on an H100)
        let few = |s: &dsc_runtime::plan::GpuStep| s.few.iter().any(|l| l.kernel.starts_with("matmul_few32_") && l.kernel.contains(&one_row));
        assert!(gpu.steps.iter().any(few), "{dt}: no batched GEMV over the blocks");
        // the plan's compiled CPU kernels read the super-blocks as stored: the prompt in one
        // step (the gemm: a 4-row tile and 3 single rows) and token by token (the gemv) give
        // the executor's logits
        let cpu = c.cpu.as_ref().unwrap_or_else(|| panic!("{dt}: no CPU kernels: {:?}", c.cpu_skipped));
        assert!(cpu.matmul_dtypes.iter().any(|n| n == dt.name()), "{dt}: the CPU kernels take {:?}", cpu.matmul_dtypes);
        let plan_path = dir.join("m.plan");
        dsc_compiler::write(&c, &plan_path).unwrap();
        let plan = dsc_runtime::plan::Plan::open(&plan_path).unwrap();
        let graph = plan.graph().unwrap();
        let kernels = std::sync::Arc::new(dsc_runtime::cpu_kernels::CpuKernels::load(&plan, 2).expect("the CPU kernels load"));
        let mut ex = Executor::with_kernels(&graph, &plan, BTreeMap::from([("NB".into(), 8)]), kernels.clone()).unwrap();
        let n = PROMPT.len() as i32;
        let pos: Vec<i32> = (0..n).collect();
        let table = [0, 1];
        let fast = ex.run(&inputs(&PROMPT, &pos, &vec![0; n as usize], &pos, (&table, 1, 2), &pos)).unwrap().remove("logits").unwrap();
        let e = rel_err(&fast.data, &got.data);
        assert!(e < 1e-5, "{dt}: prefill with the {} CPU kernels vs the executor: relative error {e}", kernels.target());
        let mut ex = Executor::with_kernels(&graph, &plan, BTreeMap::from([("NB".into(), 8)]), kernels.clone()).unwrap();
        let v = got.data.len() / PROMPT.len();
        for (p, &tok) in PROMPT.iter().enumerate() {
            let out = ex.run(&inputs(&[tok], &[p as i32], &[0], &[p as i32], (&table, 1, 2), &[0])).unwrap().remove("logits").unwrap();
            let e = rel_err(&out.data, &got.data[p * v..(p + 1) * v]);
            assert!(e < 1e-5, "{dt}: decode step {p} with the CPU kernels vs the executor's prefill: relative error {e}");
        }
    }
}

#[test]
fn sharded_safetensors_load_like_one_file() {
    let d = tempfile::tempdir().unwrap();
    let w = tiny_llama_hf(5);
    let one = d.path().join("one");
    write_tiny_hf(&one, &w);
    let sharded = d.path().join("sharded");
    let (a, b) = w.split_at(w.len() / 2);
    write_tiny_hf(&sharded.join("a"), a);
    write_tiny_hf(&sharded.join("b"), b);
    std::fs::rename(sharded.join("a/model.safetensors"), sharded.join("model-00001-of-00002.safetensors")).unwrap();
    std::fs::rename(sharded.join("b/model.safetensors"), sharded.join("model-00002-of-00002.safetensors")).unwrap();
    std::fs::write(sharded.join("config.json"), TINY_CONFIG_JSON).unwrap();
    let map: serde_json::Map<String, serde_json::Value> =
        a.iter().map(|(n, ..)| (n.clone(), "model-00001-of-00002.safetensors".into())).chain(b.iter().map(|(n, ..)| (n.clone(), "model-00002-of-00002.safetensors".into()))).collect();
    std::fs::write(sharded.join("model.safetensors.index.json"), serde_json::json!({"metadata": {}, "weight_map": map}).to_string()).unwrap();
    let m1 = dsc_models::load(&model_toml(&one, "safetensors", ".")).unwrap();
    let m2 = dsc_models::load(&model_toml(&sharded, "safetensors", ".")).unwrap();
    assert_eq!(prefill_logits(&m1, &PROMPT), prefill_logits(&m2, &PROMPT));
}

#[test]
fn prefill_decode_and_batching_agree() {
    let d = tempfile::tempdir().unwrap();
    write_tiny_hf(&d.path().join("hf"), &tiny_llama_hf(3));
    let m = dsc_models::load(&model_toml(d.path(), "safetensors", "hf")).unwrap();
    let full = prefill_logits(&m, &PROMPT);
    let v = 80;

    // token by token, with the sequence's blocks scattered in the pool (block table [5, 2])
    let mut ex = Executor::new(&m.graph, &m.weights, BTreeMap::from([("NB".into(), 8)])).unwrap();
    let table = [5, 2];
    for (p, &tok) in PROMPT.iter().enumerate() {
        let slot = table[p / 4] * 4 + (p % 4) as i32;
        let out = ex.run(&inputs(&[tok], &[p as i32], &[0], &[slot], (&table, 1, 2), &[0])).unwrap().remove("logits").unwrap();
        let e = rel_err(&out.data, &full.data[p * v..(p + 1) * v]);
        assert!(e < 1e-5, "position {p}: decode vs prefill relative error {e}");
    }

    // two sequences in one step: seq 0 = PROMPT (blocks 1, 3), seq 1 = reversed PROMPT (blocks 6, 0)
    let rev: Vec<i32> = PROMPT.iter().rev().copied().collect();
    let mut ex = Executor::new(&m.graph, &m.weights, BTreeMap::from([("NB".into(), 8)])).unwrap();
    let table = [1, 3, 6, 0];
    let n = PROMPT.len();
    let mut tokens = PROMPT.to_vec();
    tokens.extend(&rev);
    let positions: Vec<i32> = (0..n as i32).chain(0..n as i32).collect();
    let seq: Vec<i32> = std::iter::repeat_n(0, n).chain(std::iter::repeat_n(1, n)).collect();
    let slots: Vec<i32> = (0..2 * n).map(|i| table[(i / n) * 2 + (i % n) / 4] * 4 + ((i % n) % 4) as i32).collect();
    let rows = [n as i32 - 1, 2 * n as i32 - 1];
    let out = ex.run(&inputs(&tokens, &positions, &seq, &slots, (&table, 2, 2), &rows)).unwrap().remove("logits").unwrap();
    let e = rel_err(&out.data[..v], &full.data[(n - 1) * v..n * v]);
    assert!(e < 1e-5, "batched sequence 0 vs alone: relative error {e}");
    // sequence 1 alone
    let mut ex1 = Executor::new(&m.graph, &m.weights, BTreeMap::from([("NB".into(), 8)])).unwrap();
    let pos: Vec<i32> = (0..n as i32).collect();
    let alone = ex1.run(&inputs(&rev, &pos, &vec![0; n], &pos, (&[0, 1], 1, 2), &[n as i32 - 1])).unwrap().remove("logits").unwrap();
    let e = rel_err(&out.data[v..], &alone.data);
    assert!(e < 1e-5, "batched sequence 1 vs alone: relative error {e}");
}

/// A SentencePiece GGUF tokenizer (`tokenizer.ggml.model` = `llama`, tests/fixtures/spm/:
/// written by gguf-py as llama.cpp's converter writes Llama-2/Mistral/TinyLlama vocabularies)
/// encodes every test line to the ids `SentencePieceProcessor.encode` gives (which
/// transformers' conversion of the same model matches), byte fallback, user-defined pieces,
/// digits and leading spaces included, and decodes them back to SentencePiece's text; `<s>` in
/// a template is the bos id, as in HF's Llama tokenizers.
#[test]
fn sentencepiece_gguf_tokenizers_encode_as_sentencepiece_does() {
    #[derive(serde::Deserialize)]
    struct Expected {
        lines: Vec<String>,
        ids: Vec<Vec<u32>>,
        decoded: Vec<String>,
    }
    let dir = root().join("tests/fixtures/spm");
    let e: Expected = serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let g = dsc_models::gguf::GgufFile::open(&dir.join("tiny-llama.gguf")).unwrap();
    let info = dsc_models::tokenizer::from_gguf(&g).unwrap();
    assert_eq!((info.bos_id, info.eos_ids.clone(), info.add_bos), (Some(1), vec![2], true));
    let plan_tok = dsc_runtime::plan::PlanTokenizer { json: info.json.clone(), bos_id: info.bos_id, eos_ids: info.eos_ids.clone(), add_bos: info.add_bos, chat_template: None };
    let tk = dsc_runtime::tokenizer::Tokenizer::new(&plan_tok).unwrap();
    let mut wrong = vec![];
    for ((line, want), text) in e.lines.iter().zip(&e.ids).zip(&e.decoded) {
        let got = tk.encode(line).unwrap();
        assert_eq!(got.first(), Some(&1), "{line:?}: bos first");
        if &got[1..] != want.as_slice() {
            wrong.push(format!("{line:?}: {:?} vs SentencePiece {want:?}", &got[1..]));
        }
        assert_eq!(&tk.decode(want, true).unwrap(), text, "{line:?}: decoded");
    }
    assert!(wrong.is_empty(), "{} of {} lines differ:\n{}", wrong.len(), e.lines.len(), wrong.join("\n"));
    let ids = tk.encode("<s>[INST] hi").unwrap();
    assert_eq!(&ids[..2], &[1, 1], "the template's <s> is the bos id: {ids:?}");
    // a vocabulary without scores cannot rank its merges: an error naming the key
    let meta: Vec<(String, dsc_models::gguf::Value)> = g.metadata.iter().filter(|(k, _)| k.as_str() != "tokenizer.ggml.scores").map(|(k, v)| (k.clone(), v.clone())).collect();
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("noscores.gguf");
    let m: Vec<(&str, dsc_models::gguf::Value)> = meta.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    dsc_models::gguf::write_gguf(&p, &m, &[]).unwrap();
    let err = dsc_models::tokenizer::from_gguf(&dsc_models::gguf::GgufFile::open(&p).unwrap()).err().expect("no scores").to_string();
    assert!(err.contains("tokenizer.ggml.scores") && err.contains("noscores.gguf"), "{err}");
}
