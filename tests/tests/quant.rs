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
        // kernels built for another weight layout are refused, naming both
        let mut old = dsc_runtime::plan::Plan::open(&out).unwrap();
        old.header.cpu.as_mut().unwrap().layout = 1;
        let e = dsc_runtime::cpu_kernels::CpuKernels::load(&old, 1).err().expect("layout 1 refused").to_string();
        assert!(e.contains("weight layout 1") && e.contains(&format!("as {}", dsc_ir::quant::CPU_LAYOUT)), "{e}");
    }
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

/// An int4 linear [out, inp] (random quants, zero points, f16 scales in groups of 128) as an
/// AWQ or GPTQ checkpoint stores it — AutoAWQ's `pack` (column 8j + ORDER[i] into nibble i of
/// word j, [in, out/8]) or AutoGPTQ's (input 8r + i into nibble i of row r, [in/8, out]; zeros
/// [in/128, out/8] stored as z − 1) — and the f32 values it means, (q − z)·s.
fn int4_linear(awq: bool, out: usize, inp: usize, seed: u64) -> (Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)>, Vec<f32>) {
    let mut s = seed;
    let mut rnd = |m: u64| {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (s >> 33) % m
    };
    let q: Vec<u32> = (0..inp * out).map(|_| rnd(16) as u32).collect();
    let z: Vec<u32> = (0..inp / 128 * out).map(|_| 1 + rnd(15) as u32).collect();
    let sc: Vec<half::f16> = (0..inp / 128 * out).map(|_| half::f16::from_f32((rnd(100) as f32 + 1.0) * 4e-4)).collect();
    let f: Vec<f32> = (0..out * inp).map(|k| (k / inp, k % inp)).map(|(c, i)| (q[i * out + c] as f32 - z[i / 128 * out + c] as f32) * sc[i / 128 * out + c].to_f32()).collect();
    const ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];
    let le = |v: Vec<u32>| v.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>();
    let packed_cols = |rows: usize, v: &dyn Fn(usize, usize) -> u32, order: &[usize; 8]| -> Vec<u32> {
        (0..rows * out / 8).map(|k| (k / (out / 8), k % (out / 8))).map(|(r, j)| (0..8).fold(0u32, |w, i| w | (v(r, 8 * j + order[i]) & 0xF) << (4 * i))).collect()
    };
    let seq = [0, 1, 2, 3, 4, 5, 6, 7];
    let mut t = vec![];
    if awq {
        t.push(("qweight".to_string(), safetensors::Dtype::I32, vec![inp, out / 8], le(packed_cols(inp, &|r, c| q[r * out + c], &ORDER))));
        t.push(("qzeros".to_string(), safetensors::Dtype::I32, vec![inp / 128, out / 8], le(packed_cols(inp / 128, &|r, c| z[r * out + c], &ORDER))));
    } else {
        let qw: Vec<u32> = (0..inp / 8 * out).map(|k| (k / out, k % out)).map(|(r, c)| (0..8).fold(0u32, |w, i| w | q[(8 * r + i) * out + c] << (4 * i))).collect();
        t.push(("qweight".to_string(), safetensors::Dtype::I32, vec![inp / 8, out], le(qw)));
        t.push(("qzeros".to_string(), safetensors::Dtype::I32, vec![inp / 128, out / 8], le(packed_cols(inp / 128, &|r, c| z[r * out + c] - 1, &seq))));
        t.push(("g_idx".to_string(), safetensors::Dtype::I32, vec![inp], le((0..inp as u32).map(|i| i / 128).collect())));
    }
    t.push(("scales".to_string(), safetensors::Dtype::F16, vec![inp / 128, out], sc.iter().flat_map(|v| v.to_le_bytes()).collect()));
    (t, f)
}

#[test]
fn awq_and_gptq_int4_checkpoints_load_as_i4g128_and_compute_what_they_store() {
    // a one-layer llama of hidden 512 (a whole i4g128 super-block a row) whose seven linears
    // are int4 in AutoAWQ's / AutoGPTQ's layout beside the same model with them as the f32
    // values they mean: the int4 one loads them as i4g128 and its logits follow the f32 one's
    // (the only difference: each group's minimum −z·s rounded once to f16)
    let (hid, ffn, vocab) = (512usize, 512usize, 80usize);
    let config = |q: &str| {
        format!(
            r#"{{"model_type": "llama", "hidden_size": {hid}, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": {ffn}, "vocab_size": {vocab}, "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": false, "max_position_embeddings": 256{q}}}"#
        )
    };
    for (awq, q) in [
        (true, r#", "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": true}"#),
        (false, r#", "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": false, "sym": false}"#),
    ] {
        let d = tempfile::tempdir().unwrap();
        let mut plain: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = vec![];
        let mut packed = vec![];
        let f32b = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let other = |name: &str, shape: Vec<usize>, plain: &mut Vec<_>, packed: &mut Vec<_>| {
            let n = shape.iter().product();
            let norm = shape.len() == 1;
            let mut v = dsc_models::weights::seeded_values(9, name, n, if norm { 0.2 } else { 0.05 }, false);
            if norm {
                v.iter_mut().for_each(|x| *x += 1.0);
            }
            plain.push((name.to_string(), safetensors::Dtype::F32, shape.clone(), f32b(&v)));
            packed.push((name.to_string(), safetensors::Dtype::F32, shape, f32b(&v)));
        };
        other("model.embed_tokens.weight", vec![vocab, hid], &mut plain, &mut packed);
        other("model.layers.0.input_layernorm.weight", vec![hid], &mut plain, &mut packed);
        other("model.layers.0.post_attention_layernorm.weight", vec![hid], &mut plain, &mut packed);
        other("model.norm.weight", vec![hid], &mut plain, &mut packed);
        other("lm_head.weight", vec![vocab, hid], &mut plain, &mut packed);
        for (i, (name, out, inp)) in [
            ("self_attn.q_proj", 512, hid),
            ("self_attn.k_proj", 256, hid),
            ("self_attn.v_proj", 256, hid),
            ("self_attn.o_proj", hid, 512),
            ("mlp.gate_proj", ffn, hid),
            ("mlp.up_proj", ffn, hid),
            ("mlp.down_proj", hid, ffn),
        ]
        .into_iter()
        .enumerate()
        {
            let (t, f) = int4_linear(awq, out, inp, 100 + i as u64);
            let p = format!("model.layers.0.{name}");
            plain.push((format!("{p}.weight"), safetensors::Dtype::F32, vec![out, inp], f32b(&f)));
            packed.extend(t.into_iter().map(|(s, dt, sh, b)| (format!("{p}.{s}"), dt, sh, b)));
        }
        let mut models = vec![];
        for (sub, tensors, cfg) in [("f32", &plain, config("")), ("int4", &packed, config(q))] {
            let dir = d.path().join(sub);
            std::fs::create_dir_all(dir.join("hf")).unwrap();
            std::fs::write(dir.join("hf/config.json"), cfg).unwrap();
            let views: Vec<(String, safetensors::tensor::TensorView)> = tensors.iter().map(|(n, dt, s, b)| (n.clone(), safetensors::tensor::TensorView::new(*dt, s.clone(), b).unwrap())).collect();
            safetensors::serialize_to_file(views, None, &dir.join("hf/model.safetensors")).unwrap();
            models.push(load(&model_toml(&dir, "safetensors", "hf")).unwrap());
        }
        for name in ["self_attn.q_proj", "self_attn.k_proj", "mlp.down_proj"] {
            let w = format!("model.layers.0.{name}.weight");
            assert_eq!(dtype(&models[1], &w), DType::I4G128, "{w}");
            assert_eq!(models[1].weights.get(&w).unwrap().shape, models[0].weights.get(&w).unwrap().shape, "{w}");
        }
        assert!(models[1].weights.tensors.keys().all(|n| !n.ends_with(".qweight") && !n.ends_with(".qzeros") && !n.ends_with(".scales")), "the packed tensors replaced");
        let (a, b) = (prefill_logits(&models[1], &PROMPT), prefill_logits(&models[0], &PROMPT));
        let e = rel_err(&a.data, &b.data);
        assert!(e < 2e-3, "awq {awq}: int4 checkpoint's logits {e} from the f32 values it stores");
    }
}
