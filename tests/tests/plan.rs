//! The plan file: round trip, and clear errors for truncated, corrupt, foreign and
//! wrong-version plans.

use dsc_runtime::plan::{Plan, PLAN_FORMAT_VERSION};
use dsc_tests::*;
use std::path::{Path, PathBuf};

fn tiny_plan(dir: &Path) -> PathBuf {
    write_tiny_hf(&dir.join("hf"), &tiny_llama_hf(4));
    let c = dsc_compiler::compile(&model_toml(dir, "safetensors", "hf")).unwrap();
    let out = dir.join("tiny.plan");
    dsc_compiler::write(&c, &out).unwrap();
    out
}

fn open_err(p: &Path) -> String {
    match Plan::open(p) {
        Ok(_) => panic!("{} opened but should not", p.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn plan_round_trips_graph_and_weights() {
    let d = tempfile::tempdir().unwrap();
    let p = tiny_plan(d.path());
    let c = dsc_compiler::compile(&d.path().join("model.toml")).unwrap();
    let plan = Plan::open(&p).unwrap();
    assert_eq!(plan.header.format_version, PLAN_FORMAT_VERSION);
    assert_eq!(plan.header.graph, dsc_ir::text::print(&c.graph));
    assert_eq!(dsc_ir::text::print(&plan.graph().unwrap()), plan.header.graph);
    assert_eq!(plan.header.weights.tensors.len(), c.model.weights.tensors.len());
    for e in &plan.header.weights.tensors {
        assert_eq!(plan.weight_bytes(e), c.model.weights.get(&e.name).unwrap().bytes.as_slice(), "weight {}", e.name);
        assert_eq!(e.offset % 64, 0);
    }
    // the header is readable JSON that names the checkpoint's tensors
    let raw = std::fs::read(&p).unwrap();
    let text = String::from_utf8_lossy(&raw[..4096.min(raw.len())]);
    assert!(text.contains(&format!("\"format_version\": {PLAN_FORMAT_VERSION}")));
}

#[test]
fn truncated_plan() {
    let d = tempfile::tempdir().unwrap();
    let p = tiny_plan(d.path());
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() - 1000]).unwrap();
    let e = open_err(&p);
    assert!(e.contains("tiny.plan") && e.contains("truncated"), "{e}");
    std::fs::write(&p, &bytes[..50]).unwrap();
    assert!(open_err(&p).contains("truncated"));
}

#[test]
fn corrupt_plan() {
    let d = tempfile::tempdir().unwrap();
    let p = tiny_plan(d.path());
    let good = std::fs::read(&p).unwrap();
    let mut b = good.clone();
    let n = b.len();
    b[n - 10] ^= 0x55;
    std::fs::write(&p, &b).unwrap();
    assert!(open_err(&p).contains("weights checksum mismatch"));
    let mut b = good.clone();
    b[200] ^= 0x01;
    std::fs::write(&p, &b).unwrap();
    assert!(open_err(&p).contains("header checksum mismatch"));
    std::fs::write(&p, b"GGUF and other things that are not a plan at all, long enough for the prefix; padding padding padding").unwrap();
    assert!(open_err(&p).contains("not a dsc plan"));
    let mut b = good;
    b[8..12].copy_from_slice(&99u32.to_le_bytes());
    std::fs::write(&p, &b).unwrap();
    let e = open_err(&p);
    assert!(e.contains("plan format version 99") && e.contains(&format!("reads version {PLAN_FORMAT_VERSION}")), "{e}");
    assert!(open_err(&d.path().join("missing.plan")).contains("missing.plan"));
}

#[test]
fn default_model_graph_text_round_trips() {
    let c = dsc_compiler::compile(&default_model()).unwrap();
    let text = dsc_ir::text::print(&c.graph);
    let back = dsc_ir::text::parse(&text).unwrap();
    assert_eq!(dsc_ir::text::print(&back), text);
    // names come from the checkpoint
    assert!(text.contains("%blk.29.ffn_down.weight = weight : q4_1[576, 1536]"));
    // (Q, K and V merged by the optimizer: the Q projection is a slice of that matmul)
    assert!(text.contains("%blk.0.attn_k+attn_q+attn_v = matmul_cat(%blk.0.attn_norm, %blk.0.attn_k.weight, %blk.0.attn_q.weight, %blk.0.attn_v.weight) : f32[T, 960]"), "{text:.3000}");
    assert!(text.contains("%blk.0.attn_q = slice(%blk.0.attn_k+attn_q+attn_v) {axis = 1, start = 192, len = 576} : f32[T, 576]"));
}

#[test]
fn seeded_plans_store_no_weight_bytes_and_regenerate_them_identically() {
    let d = tempfile::tempdir().unwrap();
    let toml = d.path().join("m.toml");
    std::fs::write(
        &toml,
        "[model]\nname = \"s\"\narchitecture = \"llama\"\n[weights]\nformat = \"seeded\"\nseed = 3\ndtype = \"bf16\"\n[dims]\nhidden = 64\nlayers = 2\nheads = 2\nkv_heads = 1\nhead_dim = 32\nffn = 96\nvocab = 50\nrope_theta = 10000.0\nnorm_eps = 1e-5\n[limits]\nkv_block_size = 4\n",
    )
    .unwrap();
    let c = dsc_compiler::compile(&toml).unwrap();
    assert!(c.gpu.is_some(), "every op of the seeded llama lowers: {:?}", c.gpu_skipped);
    let out = d.path().join("s.plan");
    dsc_compiler::write(&c, &out).unwrap();
    let plan = Plan::open(&out).unwrap();
    assert_eq!(plan.blob_len(), 0, "seeded weights are not stored");
    for e in &plan.header.weights.tensors {
        assert!(e.seeded.is_some());
        assert_eq!(plan.weight_bytes(e), c.model.weights.get(&e.name).unwrap().bytes.as_slice(), "{}", e.name);
    }
    // norms are exactly one, matrices are uniform in [-1/sqrt(fan_in), 1/sqrt(fan_in))
    let norm = plan.header.weights.tensors.iter().find(|e| e.name.ends_with("input_layernorm.weight")).unwrap();
    assert!(plan.weight_bytes(norm).chunks_exact(4).all(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) == 1.0));
}

#[test]
fn seeded_q4_k_plans_generate_their_super_blocks_on_both_sides() {
    // (Q4_K seeded: the GPU program carries the device generator, `seeded_init_q4_k`, whose
    // bytes scripts/gpu-kquant.sh's kernel check holds to the host encoder's; the CPU side
    // encodes the same values)
    let d = tempfile::tempdir().unwrap();
    let toml = d.path().join("m.toml");
    std::fs::write(
        &toml,
        "[model]\nname = \"s\"\narchitecture = \"llama\"\n[weights]\nformat = \"seeded\"\nseed = 3\ndtype = \"q4_k\"\n[dims]\nhidden = 256\nlayers = 1\nheads = 8\nkv_heads = 2\nhead_dim = 32\nffn = 512\nvocab = 64\nrope_theta = 10000.0\nnorm_eps = 1e-5\n[limits]\nkv_block_size = 4\n",
    )
    .unwrap();
    let c = dsc_compiler::compile(&toml).unwrap();
    let gpu = c.gpu.as_ref().unwrap_or_else(|| panic!("no GPU program: {:?}", c.gpu_skipped));
    assert!(gpu.ptx.values().all(|p| p.contains(".entry seeded_init_q4_k(")), "the device generator is in every PTX module");
    let out = d.path().join("s.plan");
    dsc_compiler::write(&c, &out).unwrap();
    let plan = Plan::open(&out).unwrap();
    let q4k: Vec<_> = plan.header.weights.tensors.iter().filter(|e| e.dtype == "q4_k").collect();
    assert!(!q4k.is_empty());
    for e in q4k {
        let bytes = plan.weight_bytes(e);
        assert_eq!(bytes.len(), e.shape.iter().product::<usize>() / 256 * 144, "{}", e.name);
        assert_eq!(bytes, c.model.weights.get(&e.name).unwrap().bytes.as_slice(), "{}", e.name);
    }
}

#[test]
fn models_without_a_gpu_lowering_still_compile_for_the_cpu() {
    // head_dim 16 is below the attention kernel's warp width: no GPU program, a clear reason
    let d = tempfile::tempdir().unwrap();
    let p = tiny_plan(d.path());
    let plan = Plan::open(&p).unwrap();
    assert!(plan.header.gpu.is_none());
    assert_eq!(plan.header.targets, vec!["cpu".to_string()]);
    let c = dsc_compiler::compile(&d.path().join("model.toml")).unwrap();
    // (whichever attention kernel is generated first says it: the one-pass or the split's merge)
    let why = c.gpu_skipped.as_deref().unwrap();
    assert!(why.contains("attention") && why.contains("needs D a multiple of 32"), "{why}");
}

#[test]
fn referenced_weights_load_like_embedded_ones_and_are_checked() {
    let d = tempfile::tempdir().unwrap();
    let t = tiny_gguf_tensors(&tiny_llama_hf(8), dsc_ir::DType::Q8_0);
    write_tiny_gguf(&d.path().join("m.gguf"), &tiny_gguf_metadata(), &t);
    let c = dsc_compiler::compile(&model_toml(d.path(), "gguf", "m.gguf")).unwrap();
    let (emb, refd) = (d.path().join("e.plan"), d.path().join("r.plan"));
    dsc_compiler::write(&c, &emb).unwrap();
    dsc_compiler::write_with(&c, &refd, true).unwrap();
    assert!(std::fs::metadata(&refd).unwrap().len() < std::fs::metadata(&emb).unwrap().len());
    let (pe, pr) = (Plan::open(&emb).unwrap(), Plan::open(&refd).unwrap());
    assert_eq!(pr.blob_len(), 0);
    assert_eq!(pr.header.weights.files.len(), 1);
    for (a, b) in pe.header.weights.tensors.iter().zip(&pr.header.weights.tensors) {
        assert_eq!(a.name, b.name);
        assert_eq!(pe.weight_bytes(a), pr.weight_bytes(b), "{}", a.name);
    }
    drop(pr);
    // the checkpoint changes under the plan: a clear error naming it
    let g = d.path().join("m.gguf");
    let mut bytes = std::fs::read(&g).unwrap();
    let n = bytes.len();
    bytes[n - 3] ^= 1;
    std::fs::write(&g, &bytes).unwrap();
    let e = open_err(&refd);
    assert!(e.contains("m.gguf") && e.contains("sha256"), "{e}");
    std::fs::remove_file(&g).unwrap();
    let e = open_err(&refd);
    assert!(e.contains("m.gguf") && e.contains("missing"), "{e}");
}

#[test]
fn malformed_step_batches_are_errors() {
    use dsc_runtime::engine::{Backend, CpuBackend, StepBatch};
    let d = tempfile::tempdir().unwrap();
    let plan = Plan::open(&tiny_plan(d.path())).unwrap();
    let graph = plan.graph().unwrap();
    let mut cpu = CpuBackend::new(&graph, &plan, 16).unwrap();
    let good = StepBatch { tokens: vec![1, 2], positions: vec![0, 1], seq_ids: vec![0, 0], slots: vec![0, 1], block_table: vec![0], num_seqs: 1, max_blocks: 1, logit_rows: vec![1] };
    assert_eq!(cpu.step(&good).unwrap().len(), 1);
    for (bad, what) in [
        (StepBatch { positions: vec![0], ..good.clone() }, "one entry per token"),
        (StepBatch { block_table: vec![], ..good.clone() }, "block table"),
        (StepBatch { seq_ids: vec![0, 3], ..good.clone() }, "seq_id"),
        (StepBatch { logit_rows: vec![5], ..good.clone() }, "logit row"),
    ] {
        let e = cpu.step(&bad).unwrap_err().to_string();
        assert!(e.contains(what), "{e}");
    }
}

#[test]
fn a_small_models_wide_lm_head_carries_the_folded_argmax() {
    // hidden 64 (a K the wide GEMV takes) and a 16,384-token vocabulary: the logits step's
    // default kernel is the wide lm_head, and the plan names its argmax-folded twin (in the
    // PTX of every target); hidden 1024 keeps the split-K GEMV and no fold
    for (hidden, fold) in [(64usize, true), (1024, false)] {
        let d = tempfile::tempdir().unwrap();
        let toml = d.path().join("m.toml");
        std::fs::write(
            &toml,
            format!("[model]\nname = \"s\"\narchitecture = \"llama\"\n[weights]\nformat = \"seeded\"\nseed = 3\ndtype = \"bf16\"\n[dims]\nhidden = {hidden}\nlayers = 1\nheads = 2\nkv_heads = 1\nhead_dim = 32\nffn = 96\nvocab = 16384\nrope_theta = 10000.0\nnorm_eps = 1e-5\n[limits]\nkv_block_size = 4\n"),
        )
        .unwrap();
        let c = dsc_compiler::compile(&toml).unwrap();
        let gpu = c.gpu.as_ref().unwrap_or_else(|| panic!("no GPU program: {:?}", c.gpu_skipped));
        let folded: Vec<&str> = gpu.steps.iter().filter_map(|s| s.argmax.as_deref()).collect();
        if fold {
            assert_eq!(folded.len(), 1, "one logits step: {folded:?}");
            assert!(folded[0].starts_with("rms_matmul_wide") && folded[0].ends_with("_argmax"), "{}", folded[0]);
            for (t, ptx) in &gpu.ptx {
                assert!(ptx.contains(&format!(".entry {}(", folded[0])), "{} not in the {t} PTX", folded[0]);
            }
        } else {
            assert!(folded.is_empty(), "{folded:?}");
        }
    }
}
