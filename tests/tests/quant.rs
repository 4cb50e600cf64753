//! Weight quantization at compile time (model.toml `[precision]`, `dsc compile --quant`):
//! - the policy converts the layer types it names, keeps Q/K/V and the lm_head as stored under
//!   a quantized default, and a bad format or layer type is an error naming the field;
//! - the activation-aware scales fold into the norms and W_up without changing what the model
//!   computes, and never raise a group's error over round-to-nearest on the calibration tokens;
//! - SmolLM2 compiled with `--quant int4-g128 --calibration awq` runs close to the GGUF as
//!   shipped.

use dsc_ir::DType;
use dsc_models::quantize::{Format, Policy};
use dsc_models::{load, load_with, PrecisionOverride};
use dsc_tests::*;
use std::path::Path;

const PROMPT: [i32; 7] = [3, 17, 42, 8, 79, 0, 23];

/// The tiny HF model's model.toml with `extra` appended.
fn tiny(dir: &Path, extra: &str) -> std::path::PathBuf {
    write_tiny_hf(&dir.join("hf"), &tiny_llama_hf(5));
    let p = model_toml(dir, "safetensors", "hf");
    let mut t = std::fs::read_to_string(&p).unwrap();
    t.push_str(extra);
    std::fs::write(&p, t).unwrap();
    p
}

/// The tiny model's build options (f32, no 8-bit activations), to rebuild its graph over
/// rewritten weights.
fn tiny_opts(dims: &dsc_models::config::Dims) -> dsc_models::llama::BuildOptions {
    dsc_models::llama::BuildOptions {
        name: "tiny".into(),
        dims: dims.clone(),
        naming: dsc_models::llama::Naming::Hf,
        activations: DType::F32,
        act_quant: None,
        act_quant_weights: Default::default(),
        kv_cache: DType::F32,
        kv_block_size: 4,
        weights_path: "tiny".into(),
    }
}

fn dtype(m: &dsc_models::LoadedModel, name: &str) -> DType {
    m.weights.get(name).unwrap_or_else(|| panic!("{name}")).dtype
}

#[test]
fn the_policy_converts_the_layer_types_it_names() {
    let d = tempfile::tempdir().unwrap();
    let float = load(&tiny(d.path(), "")).unwrap();
    let want = prefill_logits(&float, &PROMPT);
    let m = load(&tiny(d.path(), "\n[precision]\nweights = \"int4-g64\"\n")).unwrap();
    let l0 = |w: &str| format!("model.layers.0.{w}.weight");
    // sensitive layers stay as stored; the rest become int4 in Q4_1 blocks
    for (w, dt) in [("self_attn.q_proj", DType::F32), ("self_attn.o_proj", DType::Q4_1), ("mlp.gate_proj", DType::Q4_1), ("mlp.down_proj", DType::Q4_1)] {
        assert_eq!(dtype(&m, &l0(w)), dt, "{w}");
    }
    assert_eq!(dtype(&m, "lm_head.weight"), DType::F32);
    assert_eq!(dtype(&m, "model.embed_tokens.weight"), DType::F32);
    assert_eq!(dtype(&m, "model.layers.0.input_layernorm.weight"), DType::F32, "vectors are never converted");
    let e = rel_err(&prefill_logits(&m, &PROMPT).data, &want.data);
    assert!(e > 1e-4 && e < 0.2, "int4-g64 MLP and W_o: logits relative error {e}");
    assert!(m.precision.as_ref().unwrap().contains("attn_qkv stored, attn_o int4-g64"), "{:?}", m.precision);

    // named layer types, and the command line's flags over the file
    let p = tiny(d.path(), "\n[precision]\nweights = \"int4-g64\"\n\n[precision.layers]\nattn_qkv = \"int8-g32\"\nlm_head = \"int4-sym-g32\"\n");
    let m = load(&p).unwrap();
    assert_eq!(dtype(&m, &l0("self_attn.k_proj")), DType::Q8_0);
    assert_eq!(dtype(&m, "lm_head.weight"), DType::Q4_0);
    let ov = PrecisionOverride { weights: Some("int8".into()), calibration: None, layers: vec![("mlp".into(), "bf16".into())], ..Default::default() };
    let m = load_with(&p, &ov).unwrap();
    assert_eq!(dtype(&m, &l0("self_attn.o_proj")), DType::Q8_0);
    assert_eq!(dtype(&m, &l0("mlp.up_proj")), DType::BF16);
    let e = rel_err(&prefill_logits(&m, &PROMPT).data, &want.data);
    assert!(e < 0.15, "int8 / bf16 / int4-sym lm_head: {e}");

    // errors name the field
    for (extra, field) in [
        ("weights = \"int4-g100\"", "precision.weights"),
        ("weights = \"int4\"\n[precision.layers]\nattention = \"int8\"", "precision.layers.attention"),
        ("weights = \"bf16\"\ncalibration = \"awq\"", "precision.calibration"),
        ("weights = \"int8-asym\"", "precision.weights"),
    ] {
        let err = load(&tiny(d.path(), &format!("\n[precision]\n{extra}\n"))).err().expect(extra).to_string();
        assert!(err.contains(field) && err.contains("model.toml"), "{extra}: {err}");
    }
}

#[test]
fn eight_bit_activations_take_the_matmuls_with_quantized_weights() {
    use dsc_ir::Op;
    let d = tempfile::tempdir().unwrap();
    let w8 = load(&tiny(d.path(), "\n[precision]\nweights = \"fp8\"\n")).unwrap();
    // (64- and 96-wide rows: fp8 in 32-value blocks, each carrying its 128-group's scale)
    assert_eq!(dtype(&w8, "model.layers.0.mlp.down_proj.weight"), DType::F8G32);
    assert!(w8.graph.node_ids().all(|id| !matches!(w8.graph.node(id).op, Op::ActQuant { .. })));
    let m = load(&tiny(d.path(), "\n[precision]\nweights = \"fp8\"\nact_quant = \"fp8-g32\"\n")).unwrap();
    let g = &m.graph;
    let quantized: Vec<&str> = g.node_ids().filter(|&id| matches!(g.node(id).op, Op::ActQuant { dtype: DType::F8E4M3, group: 32 })).map(|id| g.node(id).name.as_str()).collect();
    // per layer: the attention output's input, the MLP's normed input (shared by gate and up)
    // and down's input; Q/K/V (sensitive: stored) and the lm_head read their inputs as they are
    assert_eq!(quantized.len(), 6, "{quantized:?}");
    for id in g.node_ids() {
        let n = g.node(id);
        if let Op::MatMul { .. } = n.op {
            let w = &g.node(g.operands(id)[1]).name;
            let aq = matches!(g.node(g.operands(id)[0]).op, Op::ActQuant { .. });
            assert_eq!(aq, w.contains("o_proj") || w.contains("mlp."), "{} reads {}", n.name, w);
        }
    }
    let (base, e4m3) = (prefill_logits(&w8, &PROMPT), prefill_logits(&m, &PROMPT));
    let e = rel_err(&e4m3.data, &base.data);
    assert!(e > 1e-5 && e < 0.05, "e4m3 activations in groups of 32 move the fp8-weight logits by {e}");
    // int8 per token: the same places, another rounding
    let i8 = load(&tiny(d.path(), "\n[precision]\nweights = \"fp8\"\nact_quant = \"int8\"\n")).unwrap();
    let e8 = rel_err(&prefill_logits(&i8, &PROMPT).data, &base.data);
    assert!(e8 > 1e-5 && e8 < 0.05 && e8 != e, "int8 per-token activations: {e8}");
    for extra in ["weights = \"fp8\"\nact_quant = \"fp8-g100\"", "weights = \"fp8\"\nact_quant = \"fp4\"", "act_quant = \"fp8\""] {
        let err = load(&tiny(d.path(), &format!("\n[precision]\n{extra}\n"))).err().expect(extra).to_string();
        assert!(err.contains("precision.act_quant") && err.contains("model.toml"), "{extra}: {err}");
    }
}

#[test]
fn sparsity_prunes_two_of_four_by_magnitude_or_wanda() {
    let d = tempfile::tempdir().unwrap();
    let dense = load(&tiny(d.path(), "")).unwrap();
    let values = |m: &dsc_models::LoadedModel, name: &str| {
        let t = m.weights.get(name).unwrap();
        dsc_ir::quant::decode(t.dtype, t.bytes.as_slice(), t.shape.iter().product()).unwrap()
    };
    let mag = load(&tiny(d.path(), "\n[precision]\nsparsity = \"2:4\"\n")).unwrap();
    // (Wanda through the pass itself: the tiny model has no tokenizer for the calibration text)
    let spec = dsc_models::sparsity::SparsitySpec::parse("2:4", "wanda", None).unwrap().unwrap();
    let mut ws = dense.weights.clone();
    let tokens: Vec<u32> = (0..40).map(|i| (i * 31 + 5) % 80).collect();
    let r = dsc_models::sparsity::prune(&dense.config, &spec, &dense.graph, &mut ws, &tokens, 4, false, Path::new("tiny")).unwrap();
    assert_eq!((r.matrices, r.calibration_tokens), (8, 40));
    let opts = tiny_opts(&dense.dims);
    let wanda = dsc_models::LoadedModel { graph: dsc_models::llama::build(&opts, &ws).unwrap(), weights: ws, ..load(&tiny(d.path(), "")).unwrap() };
    let bf = |v: f32| half::bf16::from_f32(v).to_f32();
    let mut differ = 0;
    for w in ["self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"] {
        let name = format!("model.layers.1.{w}.weight");
        assert_eq!((dtype(&mag, &name), dtype(&wanda, &name)), (DType::Sp24Bf16, DType::Sp24Bf16), "{w}");
        let (orig, m, wv) = (values(&dense, &name), values(&mag, &name), values(&wanda, &name));
        for ((o, a), b) in orig.chunks(4).zip(m.chunks(4)).zip(wv.chunks(4)) {
            // magnitude keeps exactly the two largest |w| of each group
            let mut idx = [0usize, 1, 2, 3];
            idx.sort_by(|&x, &y| o[y].abs().total_cmp(&o[x].abs()));
            let want: Vec<f32> = (0..4).map(|j| if idx[..2].contains(&j) { bf(o[j]) } else { 0.0 }).collect();
            assert_eq!(a, want.as_slice(), "{w}: {o:?}");
            // wanda keeps two of the group's own values
            assert_eq!(b.iter().filter(|v| **v != 0.0).count(), 2);
            assert!(b.iter().zip(o).all(|(v, x)| *v == 0.0 || *v == bf(*x)));
            differ += (a != b) as usize;
        }
    }
    assert!(differ > 0, "the input norms change some groups' choice");
    // Q/K/V and the lm_head stay dense
    assert_eq!(dtype(&mag, "model.layers.0.self_attn.q_proj.weight"), DType::F32);
    assert_eq!(dtype(&mag, "lm_head.weight"), DType::F32);
    assert!(mag.precision.as_ref().unwrap().contains("2:4 magnitude"), "{:?}", mag.precision);
    let err = load(&tiny(d.path(), "\n[precision]\nsparsity = \"2:4\"\nsparsity_method = \"wanda\"\n")).err().unwrap().to_string();
    assert!(err.contains("sparsity_method") && err.contains("tokenizer"), "{err}");
    let want = prefill_logits(&dense, &PROMPT);
    let (em, ew) = (rel_err(&prefill_logits(&mag, &PROMPT).data, &want.data), rel_err(&prefill_logits(&wanda, &PROMPT).data, &want.data));
    assert!(em > 1e-3 && ew > 1e-3 && em < 2.0 && ew < 2.0, "half the MLP and W_o gone: {em} / {ew}");
    // 4:8: bf16 with four zeros in every eight
    let m48 = load(&tiny(d.path(), "\n[precision]\nsparsity = \"4:8\"\nsparse_layers = [\"mlp\"]\n")).unwrap();
    assert_eq!(dtype(&m48, "model.layers.0.mlp.up_proj.weight"), DType::BF16);
    assert_eq!(dtype(&m48, "model.layers.0.self_attn.o_proj.weight"), DType::F32);
    assert!(values(&m48, "model.layers.0.mlp.up_proj.weight").chunks(8).all(|g| g.iter().filter(|v| **v == 0.0).count() >= 4));
    // errors name the field or the tensor
    for (extra, what) in [
        ("sparsity = \"3:4\"", "precision.sparsity"),
        ("sparsity = \"2:4\"\nsparsity_method = \"sparsegpt\"", "precision.sparsity_method"),
        ("sparsity = \"2:4\"\nsparse_layers = [\"ffn\"]", "precision.sparse_layers"),
        ("sparsity = \"2:4\"\nweights = \"fp8\"", "a sparse layer keeps 16-bit values"),
    ] {
        let err = load(&tiny(d.path(), &format!("\n[precision]\n{extra}\n"))).err().expect(extra).to_string();
        assert!(err.contains(what), "{extra}: {err}");
    }
}

#[test]
fn awq_scales_keep_the_function_and_never_lose_to_round_to_nearest() {
    let d = tempfile::tempdir().unwrap();
    let m = load(&tiny(d.path(), "")).unwrap();
    let want = prefill_logits(&m, &PROMPT);
    let policy = Policy { default: Format::parse("int4-g32").unwrap(), layers: [(dsc_models::quantize::LayerKind::AttnQkv, Format::parse("int4-g32").unwrap())].into(), awq: true };
    let mut ws = m.weights.clone();
    let tokens: Vec<u32> = (0..48).map(|i| (i * 29 + 7) % 80).collect();
    let report = dsc_models::awq::search_and_scale(&m.graph, &mut ws, &tokens, dsc_models::llama::Naming::Hf, &m.dims, 4, &policy, Path::new("tiny")).unwrap();
    // two layers: Q/K/V, gate/up and down (W_o not: two query heads share a KV head)
    assert_eq!(report.groups.len(), 6, "{:?}", report.groups);
    assert!(report.groups.iter().all(|g| g.2 <= 1.0 + 1e-9), "{:?}", report.groups);
    assert!(report.groups.iter().any(|g| g.1 > 0.0 && g.2 < 1.0), "some group found scales better than none: {:?}", report.groups);
    // the scaled weights, unrounded, compute what the model did
    let opts = tiny_opts(&m.dims);
    let scaled = dsc_models::LoadedModel { graph: dsc_models::llama::build(&opts, &ws).unwrap(), weights: ws, ..m };
    assert_ne!(
        scaled.weights.get("model.layers.0.input_layernorm.weight").unwrap().bytes.as_slice(),
        load(&tiny(d.path(), "")).unwrap().weights.get("model.layers.0.input_layernorm.weight").unwrap().bytes.as_slice()
    );
    let e = rel_err(&prefill_logits(&scaled, &PROMPT).data, &want.data);
    assert!(e < 1e-5, "scales folded into the norms and W_up change the logits by {e}");
}

/// The default model with int4-g128 MLP and W_o, scales searched on 64 tokens of the shipped
/// text: the plan records the policy, and its logits stay near the GGUF's own.
#[test]
fn smollm2_int4_awq_stays_near_the_shipped_weights() {
    let d = tempfile::tempdir().unwrap();
    let src = std::fs::read_to_string(default_model()).unwrap();
    let gguf = root().join(".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let toml = src
        .replace("../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf", &gguf.display().to_string())
        .replace("weights = \"stored\"", "weights = \"int4-g128\"\ncalibration = \"awq\"\ncalibration_tokens = 64");
    assert!(toml.contains(&gguf.display().to_string()) && toml.contains("calibration_tokens"), "models/smollm2-135m.toml: the GGUF's path and `weights = \"stored\"`");
    let p = d.path().join("model.toml");
    std::fs::write(&p, toml).unwrap();
    let prompt = [1, 504, 3458, 282, 4649, 314, 260];
    let shipped = prefill_logits(&load(&default_model()).unwrap(), &prompt);
    let c = dsc_compiler::compile(&p).unwrap();
    let note = c.model.precision.clone().unwrap();
    assert!(note.contains("awq: 60 matrix groups scaled on 64 calibration tokens") && note.contains("120 int4-g128"), "{note}");
    // one int4 layout a model: W_down's rows (1536) are whole i4g128 super-blocks but the
    // 576-wide ones are not, so every int4 matrix is in Q4_1 blocks (the fused one-token MLP
    // takes Q4_1)
    assert_eq!(dtype(&c.model, "blk.0.ffn_down.weight"), DType::Q4_1);
    assert_eq!(dtype(&c.model, "blk.0.ffn_gate.weight"), DType::Q4_1);
    let e = rel_err(&prefill_logits(&c.model, &prompt).data, &shipped.data);
    assert!(e > 1e-4 && e < 0.15, "int4-g128 awq vs the GGUF's Q4_1: relative error {e}");
    let out = d.path().join("q.plan");
    dsc_compiler::write(&c, &out).unwrap();
    let plan = dsc_runtime::plan::Plan::open(&out).unwrap();
    assert_eq!(plan.header.weights.precision.as_deref(), Some(note.as_str()));
}

/// i4g128 matrices run on the Q4_1 CPU kernels, laid out for them when the plan loads
/// (`dsc_ir::quant::cpu_layout`: the same d·q + m for every value): the prompt in one step (the
/// gemm) and token by token (the gemv) give the executor's logits on the stored i4g128.
#[test]
fn int4_g128_plans_run_on_the_q4_1_cpu_kernels() {
    use dsc_ir::Executor;
    use std::collections::BTreeMap;
    let d = tempfile::tempdir().unwrap();
    let toml = d.path().join("m.toml");
    std::fs::write(
        &toml,
        "[model]\nname = \"s\"\narchitecture = \"llama\"\n[weights]\nformat = \"seeded\"\nseed = 5\ndtype = \"i4g128\"\n[dims]\nhidden = 512\nlayers = 1\nheads = 8\nkv_heads = 2\nhead_dim = 64\nffn = 1024\nvocab = 128\nrope_theta = 10000.0\nnorm_eps = 1e-5\n[limits]\nkv_block_size = 4\n",
    )
    .unwrap();
    let c = dsc_compiler::compile(&toml).unwrap();
    assert_eq!(dtype(&c.model, "model.layers.0.mlp.down_proj.weight"), DType::I4G128);
    let cpu = c.cpu.as_ref().unwrap_or_else(|| panic!("no CPU kernels: {:?}", c.cpu_skipped));
    assert_eq!(cpu.matmul_dtypes, vec!["q4_1".to_string()], "i4g128 matmuls take the Q4_1 kernels");
    let want = prefill_logits(&c.model, &PROMPT);
    let out = d.path().join("m.plan");
    dsc_compiler::write(&c, &out).unwrap();
    let plan = dsc_runtime::plan::Plan::open(&out).unwrap();
    let graph = plan.graph().unwrap();
    let kernels = std::sync::Arc::new(dsc_runtime::cpu_kernels::CpuKernels::load(&plan, 2).expect("the CPU kernels load"));
    {
        // (the executor hands them the i4g128 matmuls: taken, in Q4_1's layout)
        use dsc_ir::exec::PackedMatMul;
        assert!(kernels.takes(DType::I4G128, 1024, 512));
        let e = plan.header.weights.tensors.iter().find(|e| e.name == "model.layers.0.mlp.down_proj.weight").unwrap();
        let laid = kernels.prepare(DType::I4G128, e.shape[0], e.shape[1], plan.weight_bytes(e)).unwrap();
        assert_eq!(Some(laid.len()), dsc_ir::quant::cpu_layout_bytes(DType::Q4_1, e.shape[0], e.shape[1]));
    }
    let n = PROMPT.len() as i32;
    let pos: Vec<i32> = (0..n).collect();
    let table = [0, 1];
    let mut ex = Executor::with_kernels(&graph, &plan, BTreeMap::from([("NB".into(), 8)]), kernels.clone()).unwrap();
    let got = ex.run(&inputs(&PROMPT, &pos, &vec![0; n as usize], &pos, (&table, 1, 2), &pos)).unwrap().remove("logits").unwrap();
    let e = rel_err(&got.data, &want.data);
    assert!(e < 1e-5, "prefill on the Q4_1 CPU kernels vs the executor: relative error {e}");
    let v = want.data.len() / PROMPT.len();
    let mut ex = Executor::with_kernels(&graph, &plan, BTreeMap::from([("NB".into(), 8)]), kernels).unwrap();
    for (p, &tok) in PROMPT.iter().enumerate() {
        let out = ex.run(&inputs(&[tok], &[p as i32], &[0], &[p as i32], (&table, 1, 2), &[0])).unwrap().remove("logits").unwrap();
        let e = rel_err(&out.data, &want.data[p * v..(p + 1) * v]);
        assert!(e < 1e-5, "decode step {p} on the Q4_1 CPU kernels vs the executor's prefill: relative error {e}");
    }
}
