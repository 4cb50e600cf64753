//! Bad inputs give clear errors naming the file, field or tensor at fault, and never panic.

use dsc_ir::DType;
use dsc_models::gguf::Value;
use dsc_tests::*;
use std::path::Path;

fn err_of(toml: &Path) -> String {
    match dsc_models::load(toml) {
        Ok(_) => panic!("{} loaded but should have failed", toml.display()),
        Err(e) => e.to_string(),
    }
}

fn assert_has(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "error `{msg}` should mention `{p}`");
    }
}

fn good_gguf(dir: &Path) -> Vec<(String, DType, Vec<usize>, Vec<u8>)> {
    let t = tiny_gguf_tensors(&tiny_llama_hf(1), DType::Q8_0);
    write_tiny_gguf(&dir.join("m.gguf"), &tiny_gguf_metadata(), &t);
    t
}

#[test]
fn the_tiny_gguf_itself_loads() {
    let d = tempfile::tempdir().unwrap();
    good_gguf(d.path());
    let m = dsc_models::load(&model_toml(d.path(), "gguf", "m.gguf")).unwrap();
    assert_eq!(m.dims.layers, 2);
    assert!(m.tokenizer.is_none());
}

#[test]
fn malformed_model_toml() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("bad.toml");
    std::fs::write(&p, "[model\nname = 1").unwrap();
    assert_has(&err_of(&p), &["bad.toml", "TOML parse error"]);
}

#[test]
fn incomplete_model_toml_names_the_missing_field() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("m.toml");
    std::fs::write(&p, "[model]\narchitecture = \"llama\"\n[weights]\nformat = \"gguf\"\npath = \"x.gguf\"\n").unwrap();
    assert_has(&err_of(&p), &["m.toml", "missing field `name`"]);
    std::fs::write(&p, "[model]\nname = \"x\"\narchitecture = \"llama\"\n[weights]\nformat = \"gguf\"\n").unwrap();
    assert_has(&err_of(&p), &["m.toml", "weights.path"]);
}

#[test]
fn unknown_fields_and_bad_values_are_named() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("m.toml");
    std::fs::write(&p, "[model]\nname = \"x\"\narchitecture = \"llama\"\ncolour = \"red\"\n[weights]\nformat = \"gguf\"\npath = \"x.gguf\"\n").unwrap();
    assert_has(&err_of(&p), &["unknown field `colour`"]);
    std::fs::write(&p, "[model]\nname = \"x\"\narchitecture = \"gpt9\"\n[weights]\nformat = \"gguf\"\npath = \"x.gguf\"\n").unwrap();
    assert_has(&err_of(&p), &["unknown variant `gpt9`"]);
    std::fs::write(&p, "[model]\nname = \"x\"\narchitecture = \"llama\"\n[weights]\nformat = \"gguf\"\npath = \"x.gguf\"\n[precision]\nactivations = \"f64\"\n").unwrap();
    assert_has(&err_of(&p), &["precision.activations", "f64"]);
    std::fs::write(&p, "[model]\nname = \"x\"\narchitecture = \"llama\"\n[weights]\nformat = \"gguf\"\npath = \"x.gguf\"\n[limits]\nkv_block_size = 12\n").unwrap();
    assert_has(&err_of(&p), &["limits.kv_block_size"]);
}

#[test]
fn missing_weight_file() {
    let d = tempfile::tempdir().unwrap();
    assert_has(&err_of(&model_toml(d.path(), "gguf", "nope.gguf")), &["nope.gguf", "not found"]);
    assert_has(&err_of(&model_toml(d.path(), "safetensors", "nope")), &["nope", "not found"]);
}

#[test]
fn missing_tensor() {
    let d = tempfile::tempdir().unwrap();
    let mut t = good_gguf(d.path());
    t.retain(|(n, ..)| n != "blk.1.ffn_up.weight");
    write_tiny_gguf(&d.path().join("m.gguf"), &tiny_gguf_metadata(), &t);
    assert_has(&err_of(&model_toml(d.path(), "gguf", "m.gguf")), &["m.gguf", "blk.1.ffn_up.weight", "not found"]);
}

#[test]
fn wrong_tensor_shape() {
    let d = tempfile::tempdir().unwrap();
    let mut t = good_gguf(d.path());
    let e = t.iter_mut().find(|(n, ..)| n == "blk.0.attn_k.weight").unwrap();
    e.2 = vec![64, 32]; // [32, 64] in the checkpoint's order is expected
    write_tiny_gguf(&d.path().join("m.gguf"), &tiny_gguf_metadata(), &t);
    assert_has(&err_of(&model_toml(d.path(), "gguf", "m.gguf")), &["blk.0.attn_k.weight", "shape [64, 32]", "expected [32, 64]"]);
}

#[test]
fn wrong_tensor_dtype() {
    let d = tempfile::tempdir().unwrap();
    let mut t = good_gguf(d.path());
    let e = t.iter_mut().find(|(n, ..)| n == "blk.0.attn_norm.weight").unwrap();
    e.1 = DType::Q8_0;
    e.3 = dsc_ir::quant::encode(DType::Q8_0, &[1.0; 64]).unwrap();
    write_tiny_gguf(&d.path().join("m.gguf"), &tiny_gguf_metadata(), &t);
    assert_has(&err_of(&model_toml(d.path(), "gguf", "m.gguf")), &["blk.0.attn_norm.weight", "dtype q8_0"]);
}

#[test]
fn truncated_gguf() {
    let d = tempfile::tempdir().unwrap();
    good_gguf(d.path());
    let p = d.path().join("m.gguf");
    let bytes = std::fs::read(&p).unwrap();
    // cut into the tensor data: the last tensor runs past the end
    std::fs::write(&p, &bytes[..bytes.len() - 100]).unwrap();
    assert_has(&err_of(&model_toml(d.path(), "gguf", "m.gguf")), &["m.gguf", "truncated"]);
    // cut inside the metadata
    std::fs::write(&p, &bytes[..60]).unwrap();
    assert_has(&err_of(&model_toml(d.path(), "gguf", "m.gguf")), &["m.gguf", "truncated"]);
    // not a GGUF at all
    std::fs::write(&p, b"hello world, this is not a model").unwrap();
    assert_has(&err_of(&model_toml(d.path(), "gguf", "m.gguf")), &["m.gguf", "not a GGUF file"]);
}

#[test]
fn unsupported_gguf_type() {
    let d = tempfile::tempdir().unwrap();
    let t = good_gguf(d.path());
    let p = d.path().join("m.gguf");
    let mut bytes = std::fs::read(&p).unwrap();
    // rewrite the type id of `blk.0.ffn_up.weight` in the tensor directory to 10 (Q2_K)
    let name = b"blk.0.ffn_up.weight";
    let at = bytes.windows(name.len()).position(|w| w == name).unwrap() + name.len();
    let nd = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let ty_at = at + 4 + 8 * nd;
    assert_eq!(u32::from_le_bytes(bytes[ty_at..ty_at + 4].try_into().unwrap()), 8, "Q8_0 before the edit");
    bytes[ty_at..ty_at + 4].copy_from_slice(&10u32.to_le_bytes());
    std::fs::write(&p, &bytes).unwrap();
    assert_has(&err_of(&model_toml(d.path(), "gguf", "m.gguf")), &["blk.0.ffn_up.weight", "unsupported GGUF tensor type 10 (Q2_K)"]);
    // (a K-quant is read, but its 96 x 64 matrix is no whole number of 256-value super-blocks)
    bytes[ty_at..ty_at + 4].copy_from_slice(&12u32.to_le_bytes());
    std::fs::write(&p, &bytes).unwrap();
    assert_has(&err_of(&model_toml(d.path(), "gguf", "m.gguf")), &["blk.0.ffn_up.weight", "rows of 64 values are not whole q4_k blocks of 256"]);
    let _ = t;
}

#[test]
fn truncated_safetensors() {
    let d = tempfile::tempdir().unwrap();
    let hf = d.path().join("hf");
    write_tiny_hf(&hf, &tiny_llama_hf(2));
    let p = hf.join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() - 64]).unwrap();
    assert_has(&err_of(&model_toml(d.path(), "safetensors", "hf")), &["model.safetensors", "not a valid safetensors file"]);
    std::fs::write(&p, &bytes[..5]).unwrap();
    assert_has(&err_of(&model_toml(d.path(), "safetensors", "hf")), &["model.safetensors", "not a valid safetensors file"]);
}

#[test]
fn gguf_metadata_errors_name_the_key() {
    let d = tempfile::tempdir().unwrap();
    let t = tiny_gguf_tensors(&tiny_llama_hf(1), DType::F16);
    let meta: Vec<(&str, Value)> = tiny_gguf_metadata().into_iter().filter(|(k, _)| *k != "llama.attention.layer_norm_rms_epsilon").collect();
    write_tiny_gguf(&d.path().join("m.gguf"), &meta, &t);
    assert_has(&err_of(&model_toml(d.path(), "gguf", "m.gguf")), &["m.gguf", "llama.attention.layer_norm_rms_epsilon"]);
}

#[test]
fn dims_in_toml_that_disagree_with_the_checkpoint() {
    let d = tempfile::tempdir().unwrap();
    good_gguf(d.path());
    let p = model_toml(d.path(), "gguf", "m.gguf");
    let mut s = std::fs::read_to_string(&p).unwrap();
    s.push_str("\n[dims]\nhidden = 64\nlayers = 3\nheads = 4\nkv_heads = 2\nhead_dim = 16\nffn = 96\nvocab = 80\nrope_theta = 10000.0\nnorm_eps = 1e-5\n");
    std::fs::write(&p, s).unwrap();
    assert_has(&err_of(&p), &["dims.layers = 3", "checkpoint has 2"]);
}

/// One dimension past its bound, in each front end, is an error naming the field (it used to
/// drive allocation aborts and wrapped products); a GGUF's metadata is bounded in values, not
/// in file bytes (an array of u8 costs ~32x its file size decoded).
#[test]
fn oversized_dimensions_are_named_in_every_front_end() {
    let d = tempfile::tempdir().unwrap();
    // model.toml: seeded, with a vocabulary of 2^40
    let p = d.path().join("big.toml");
    std::fs::write(
        &p,
        "[model]\nname = \"big\"\narchitecture = \"llama\"\n\n[weights]\nformat = \"seeded\"\n\n[dims]\nhidden = 64\nlayers = 2\nheads = 4\nkv_heads = 2\nhead_dim = 16\nffn = 96\nvocab = 1099511627776\nrope_theta = 10000.0\nnorm_eps = 1e-5\n",
    )
    .unwrap();
    assert_has(&err_of(&p), &["big.toml", "dims.vocab", "1099511627776"]);
    let s = std::fs::read_to_string(&p).unwrap().replace("vocab = 1099511627776", "vocab = 80") + "\n[limits]\nmax_seq_len = 1099511627776\n";
    std::fs::write(&p, s).unwrap();
    assert_has(&err_of(&p), &["big.toml", "limits.max_seq_len"]);
    // config.json beside safetensors
    write_tiny_hf(&d.path().join("hf"), &tiny_llama_hf(1));
    let cfg = d.path().join("hf/config.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    v["intermediate_size"] = serde_json::json!(1u64 << 40);
    std::fs::write(&cfg, v.to_string()).unwrap();
    assert_has(&err_of(&model_toml(d.path(), "safetensors", "hf")), &["config.json", "intermediate_size"]);
    // GGUF metadata
    let t = tiny_gguf_tensors(&tiny_llama_hf(1), DType::F16);
    let meta: Vec<(&str, Value)> = tiny_gguf_metadata().into_iter().map(|(k, v)| if k == "llama.embedding_length" { (k, Value::U64(1 << 40)) } else { (k, v) }).collect();
    write_tiny_gguf(&d.path().join("m.gguf"), &meta, &t);
    assert_has(&err_of(&model_toml(d.path(), "gguf", "m.gguf")), &["m.gguf", "llama.embedding_length"]);
    // 17 M one-byte values: refused by count (the file is 17 MB; decoded it would be ~540 MB)
    let mut meta = tiny_gguf_metadata();
    meta.push(("general.blob", Value::Array(vec![Value::U8(0); dsc_models::gguf::MAX_METADATA_VALUES + 1])));
    write_tiny_gguf(&d.path().join("m.gguf"), &meta, &t);
    assert_has(&err_of(&model_toml(d.path(), "gguf", "m.gguf")), &["m.gguf", "general.blob", "metadata values"]);
}
