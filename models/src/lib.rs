//! Model front ends: `model.toml` ([`config`]), checkpoint importers ([`gguf`], [`hf`]),
//! tokenizers ([`tokenizer`]) and architecture builders ([`llama`], [`deepseek`]). [`load`]
//! turns a model.toml into a verified graph, its weights and its tokenizer.

pub mod awq;
mod builder;
pub mod config;
pub mod deepseek;
pub mod deepseek_gguf;
mod error;
pub mod gguf;
pub mod hf;
pub mod int4_ckpt;
pub mod llama;
pub mod quantize;
pub mod sparsity;
pub mod tokenizer;
pub mod weights;

pub use config::{Dims, ModelConfig};
pub use error::{ModelError, Result};
pub use tokenizer::TokenizerInfo;
pub use weights::{WeightSet, WeightTensor};

pub use config::PrecisionOverride;
use config::{Architecture, WeightFormat};
use dsc_ir::{quant, DType, Graph};
use quantize::{Format, LayerKind, Policy};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use weights::Bytes;

/// A model ready for the compiler: verified graph, weights by checkpoint name, tokenizer.
pub struct LoadedModel {
    pub config: ModelConfig,
    /// the dims every architecture shares (for DeepSeek: hidden, layers, heads, vocab, the
    /// dense MLP width; `head_dim` = qk_nope + qk_rope)
    pub dims: Dims,
    /// the DeepSeek family's own configuration
    pub deepseek: Option<deepseek::DeepseekConfig>,
    pub graph: Graph,
    pub weights: WeightSet,
    pub tokenizer: Option<TokenizerInfo>,
    /// where the weights came from (for the plan's metadata)
    pub weights_path: Option<PathBuf>,
    /// what the precision policy did (None: every weight as stored)
    pub precision: Option<String>,
}

impl LoadedModel {
    /// The plan header's `dims`: the shared dims, and the DeepSeek config under `deepseek`.
    pub fn dims_json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(&self.dims).unwrap_or_default();
        if let (Some(d), Some(obj)) = (&self.deepseek, v.as_object_mut()) {
            obj.insert("deepseek".into(), serde_json::to_value(d).unwrap_or_default());
        }
        v
    }
}

fn check_dims(path: &Path, given: &Dims, found: &Dims) -> Result<()> {
    let mut diffs = vec![];
    macro_rules! cmp {
        ($($f:ident),*) => { $( if given.$f != found.$f { diffs.push(format!("dims.{} = {:?} but the checkpoint has {:?}", stringify!($f), given.$f, found.$f)); } )* };
    }
    cmp!(hidden, layers, heads, kv_heads, head_dim, ffn, vocab, tie_embeddings, attention_bias);
    if (given.rope_theta - found.rope_theta).abs() > 1e-3 * found.rope_theta.abs() {
        diffs.push(format!("dims.rope_theta = {} but the checkpoint has {}", given.rope_theta, found.rope_theta));
    }
    if (given.norm_eps - found.norm_eps).abs() > 1e-3 * found.norm_eps.abs() {
        diffs.push(format!("dims.norm_eps = {} but the checkpoint has {}", given.norm_eps, found.norm_eps));
    }
    if diffs.is_empty() {
        Ok(())
    } else {
        Err(ModelError::Config { path: path.into(), msg: diffs.join("; ") })
    }
}

/// Llama-family dims from a GGUF file's metadata, every one bounded (`Dims::check`).
pub fn dims_from_gguf(g: &gguf::GgufFile) -> Result<Dims> {
    let arch = g.str("general.architecture")?;
    if arch != "llama" && arch != "qwen2" {
        return Err(ModelError::Format { path: g.path.clone(), msg: format!("GGUF architecture `{arch}` is not supported by the llama builder (llama, qwen2)") });
    }
    let k = |s: &str| format!("{arch}.{s}");
    let hidden = g.u64(&k("embedding_length"))? as usize;
    let heads = g.u64(&k("attention.head_count"))? as usize;
    if heads == 0 {
        return Err(ModelError::Format { path: g.path.clone(), msg: format!("{} is 0", k("attention.head_count")) });
    }
    let vocab = match g.u64(&k("vocab_size")) {
        Ok(v) => v as usize,
        Err(_) => g.tensors.get("token_embd.weight").map(|t| t.shape[0]).ok_or_else(|| ModelError::MissingTensor { path: g.path.clone(), tensor: "token_embd.weight".into(), arch: "llama".into() })?,
    };
    let d = Dims {
        hidden,
        layers: g.u64(&k("block_count"))? as usize,
        heads,
        kv_heads: g.u64(&k("attention.head_count_kv")).map(|v| v as usize).unwrap_or(heads),
        head_dim: g.u64(&k("attention.key_length")).map(|v| v as usize).unwrap_or(hidden / heads),
        ffn: g.u64(&k("feed_forward_length"))? as usize,
        vocab,
        rope_theta: g.f64(&k("rope.freq_base")).unwrap_or(10000.0) as f32,
        norm_eps: g.f64(&k("attention.layer_norm_rms_epsilon"))? as f32,
        tie_embeddings: !g.tensors.contains_key("output.weight"),
        attention_bias: g.tensors.contains_key("blk.0.attn_q.bias"),
        max_position: g.u64(&k("context_length")).ok().map(|v| v as usize),
    };
    let names = config::DimNames {
        hidden: "<arch>.embedding_length",
        layers: "<arch>.block_count",
        heads: "<arch>.attention.head_count",
        kv_heads: "<arch>.attention.head_count_kv",
        head_dim: "<arch>.attention.key_length",
        ffn: "<arch>.feed_forward_length",
        vocab: "<arch>.vocab_size",
        rope_theta: "<arch>.rope.freq_base",
        norm_eps: "<arch>.attention.layer_norm_rms_epsilon",
    };
    d.check(&names).map_err(|msg| ModelError::Format { path: g.path.clone(), msg: msg.replace("<arch>", arch) })?;
    Ok(d)
}

fn sha256_file(path: &Path) -> Result<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(error::io(path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(error::io(path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(format!("{:x}", h.finalize()))
}

/// Whether the embedding table is also the lm_head (no separate lm_head tensor).
pub(crate) fn tied(ws: &WeightSet) -> bool {
    !ws.tensors.keys().any(|n| LayerKind::of(n, false) == Some(LayerKind::LmHead))
}

/// Re-encode matrices (rank-2 weights, and stacked experts' rank-3) as the policy says, from
/// their values (`stored`: each tensor's dtype before any AWQ rewrite, what `stored` keeps);
/// vectors (norms, biases) stay as they are. Returns how many tensors each format took.
fn apply_policy(ws: &mut WeightSet, policy: &Policy, stored: &BTreeMap<String, DType>, path: &Path) -> Result<BTreeMap<String, usize>> {
    let tied = tied(ws);
    // one int4 layout a model: i4g128 where every matrix int4-g128 takes has rows of whole
    // 512-value super-blocks, else the Q4_1 / Q4_0 blocks throughout (quantize::IntSpec::dtype_in)
    let i4g128 = ws.tensors.iter().filter(|(_, t)| t.shape.len() >= 2).all(|(name, t)| {
        let fmt = policy.format_for(LayerKind::of(name, tied));
        let row = *t.shape.last().unwrap_or(&1);
        !matches!(fmt, Format::Int(i) if i.bits == 4 && i.group == 128) || row % 512 == 0
    });
    let mut counts = BTreeMap::new();
    for (name, t) in ws.tensors.iter_mut() {
        if t.shape.len() < 2 {
            continue;
        }
        let orig = stored.get(name).copied().unwrap_or(t.dtype);
        let fmt = policy.format_for(LayerKind::of(name, tied));
        let want = fmt.dtype(orig, *t.shape.last().unwrap_or(&1), i4g128);
        let requant = matches!(fmt, Format::Int(_));
        let kept = fmt == Format::Stored || (fmt == Format::DType(DType::F8G128) && !matches!(want, DType::F8G128 | DType::F8G32));
        *counts.entry(if kept { format!("stored {orig}") } else { fmt.name() }).or_insert(0) += 1;
        if want == t.dtype && !requant {
            continue;
        }
        if t.bytes.seeded().is_some() {
            return Err(ModelError::Config { path: path.into(), msg: format!("seeded weights are generated in weights.dtype; set that instead of precision.weights (tensor `{name}`)") });
        }
        let n: usize = t.shape.iter().product();
        let terr = |msg: String| ModelError::Tensor { path: path.into(), tensor: name.clone(), msg };
        let vals = quant::decode(t.dtype, t.bytes.as_slice(), n).ok_or_else(|| terr("stored bytes do not match its shape".into()))?;
        let enc = fmt.encode(orig, &vals, *t.shape.last().unwrap_or(&1), i4g128).map_err(|m| terr(format!("{}: {m}", fmt.name())))?;
        t.dtype = want;
        t.bytes = Bytes::Owned(Arc::new(enc));
    }
    Ok(counts)
}

/// `precision.sparsity` over the weights as the policy left them (Wanda calibrated on the
/// calibration text through `graph`); the compile summary's words on it.
fn prune_weights(config: &ModelConfig, spec: &sparsity::SparsitySpec, graph: &Graph, ws: &mut WeightSet, tok: Option<&TokenizerInfo>, tied: bool, path: &Path) -> Result<String> {
    let toks = match spec.method {
        sparsity::Method::Wanda => calibration_tokens(config, tok)?,
        sparsity::Method::Magnitude => vec![],
    };
    let r = sparsity::prune(config, spec, graph, ws, &toks, config.toml.limits.kv_block_size, tied, path)?;
    Ok(format!(
        "sparsity {}: {} matrices, {:.1}% of their values zeroed{}",
        spec.name(),
        r.matrices,
        100.0 * r.pruned_values as f64 / r.total_values.max(1) as f64,
        if r.calibration_tokens > 0 { format!(", scored on {} calibration tokens", r.calibration_tokens) } else { String::new() }
    ))
}

/// The compile summary's line on what the policy did.
fn precision_note(policy: &Policy, counts: &BTreeMap<String, usize>, awq: Option<&awq::AwqReport>) -> String {
    let c: Vec<String> = counts.iter().map(|(f, n)| format!("{n} {f}")).collect();
    let mut s = format!("weights: {} (matrices: {})", policy.summary(), c.join(", "));
    if let Some(a) = awq {
        s.push_str("; ");
        s.push_str(&a.summary());
    }
    s
}

/// The calibration tokens: `precision.calibration_text` (default: the text `dsc ppl` scores,
/// built in), its first `calibration_tokens` (default 512).
fn calibration_tokens(config: &ModelConfig, tok: Option<&TokenizerInfo>) -> Result<Vec<u32>> {
    let p = &config.toml.precision;
    let cerr = |msg: String| ModelError::Config { path: config.path.clone(), msg };
    let text = match &p.calibration_text {
        Some(f) => {
            let f = config.resolve(f);
            std::fs::read_to_string(&f).map_err(error::io(&f))?
        }
        None => include_str!("../../data/coriolanus-act1.txt").to_string(),
    };
    let tok = tok.ok_or_else(|| cerr("the calibration text (`precision.calibration = \"awq\"`, `precision.sparsity_method = \"wanda\"`) needs a tokenizer".into()))?;
    let t = tokenizers::Tokenizer::from_str(&tok.json).map_err(|e| cerr(format!("tokenizer: {e}")))?;
    let enc = t.encode(text.as_str(), false).map_err(|e| cerr(format!("calibration text: {e}")))?;
    let mut ids: Vec<u32> = tok.bos_id.filter(|_| tok.add_bos).into_iter().collect();
    ids.extend(enc.get_ids());
    ids.truncate(p.calibration_tokens.unwrap_or(512).min(config.toml.limits.max_seq_len));
    Ok(ids)
}

/// A seeded tensor: matrices in `dtype` scaled 1/sqrt(fan-in), vectors f32 (norm weights ones).
fn seeded_tensor(ws: &mut WeightSet, seed: u64, dtype: DType, name: String, shape: Vec<usize>) -> Result<()> {
    let n: usize = shape.iter().product();
    let vector = shape.len() == 1;
    let fan_in = *shape.last().unwrap_or(&1) as f32;
    // (f8g128 where rows are whole 512-value super-blocks, else bf16, as `--quant fp8` and
    // DeepSeek's FP8 import keep such rows high)
    let dt = if vector {
        DType::F32
    } else if dtype == DType::F8G128 && dtype.bytes_for(fan_in as usize).is_none() {
        DType::BF16
    } else {
        dtype
    };
    if dt.bytes_for(n).is_none() {
        return Err(ModelError::Tensor { path: "<seeded>".into(), tensor: name.clone(), msg: format!("{n} elements are not whole {dt} blocks") });
    }
    if dt == DType::I4G128 && !(fan_in as usize).is_multiple_of(512) {
        return Err(ModelError::Tensor { path: "<seeded>".into(), tensor: name.clone(), msg: format!("{dt} rows are whole 512-value super-blocks; this one has {fan_in} values") });
    }
    let spec = weights::SeededSpec { seed, scale: 1.0 / fan_in.sqrt(), ones: vector && name.contains("norm") };
    let bytes = Bytes::Seeded { spec, name: name.clone(), dtype: dt, numel: n, cache: Default::default() };
    ws.insert(name, WeightTensor { dtype: dt, shape, bytes });
    Ok(())
}

fn seeded_weights(dims: &Dims, seed: u64, dtype: DType, naming: llama::Naming) -> Result<WeightSet> {
    let mut ws = WeightSet::default();
    let mut add = |name: String, shape: Vec<usize>| seeded_tensor(&mut ws, seed, dtype, name, shape);
    let (h, kvh, hd, hid) = (dims.heads, dims.kv_heads, dims.head_dim, dims.hidden);
    add(naming.embed().into(), vec![dims.vocab, hid])?;
    for i in 0..dims.layers {
        let m = |w: &str| format!("{}.weight", naming.layer(i, w));
        add(m("attn_norm"), vec![hid])?;
        add(m("attn_q"), vec![h * hd, hid])?;
        add(m("attn_k"), vec![kvh * hd, hid])?;
        add(m("attn_v"), vec![kvh * hd, hid])?;
        if dims.attention_bias {
            for w in ["attn_q", "attn_k", "attn_v"] {
                let out = if w == "attn_q" { h * hd } else { kvh * hd };
                add(format!("{}.bias", naming.layer(i, w)), vec![out])?;
            }
        }
        add(m("attn_output"), vec![hid, h * hd])?;
        add(m("ffn_norm"), vec![hid])?;
        add(m("ffn_gate"), vec![dims.ffn, hid])?;
        add(m("ffn_up"), vec![dims.ffn, hid])?;
        add(m("ffn_down"), vec![hid, dims.ffn])?;
    }
    add(naming.final_norm().into(), vec![hid])?;
    if !dims.tie_embeddings {
        add(naming.lm_head().into(), vec![dims.vocab, hid])?;
    }
    Ok(ws)
}

/// Load a model.toml: read and check the config, import weights and tokenizer, build and
/// verify the graph.
pub fn load(model_toml: &Path) -> Result<LoadedModel> {
    load_with(model_toml, &PrecisionOverride::default())
}

/// As [`load`], with `dsc compile`'s precision flags over model.toml's `[precision]`.
pub fn load_with(model_toml: &Path, ov: &PrecisionOverride) -> Result<LoadedModel> {
    let config = ModelConfig::load_with(model_toml, ov)?;
    let t = &config.toml;
    if t.model.architecture == Architecture::Deepseek {
        return load_deepseek(config);
    }
    let (dims, mut weights, tokenizer, naming, weights_path) = match t.weights.format {
        WeightFormat::Gguf => {
            let g = open_gguf_weights(&config)?;
            let path = g.path.clone();
            let dims = dims_from_gguf(&g)?;
            let mut ws = WeightSet::default();
            let file = Arc::new(path.clone());
            for info in g.tensors.values() {
                ws.insert(
                    info.name.clone(),
                    WeightTensor { dtype: info.dtype, shape: info.shape.clone(), bytes: Bytes::Mapped { map: g.map.clone(), file: file.clone(), offset: info.offset, len: info.nbytes } },
                );
            }
            let tok = match t.tokenizer.as_ref().and_then(|s| s.path.as_ref()) {
                Some(p) => Some(tokenizer::from_json_file(&config.resolve(p))?),
                None if g.get("tokenizer.ggml.model").is_some() => Some(tokenizer::from_gguf(&g)?),
                None => {
                    tracing::warn!(target: "dsc::models", "{}: no tokenizer in the GGUF metadata; the plan will take token ids only", path.display());
                    None
                }
            };
            (dims, ws, tok, llama::Naming::Gguf, Some(path))
        }
        WeightFormat::Safetensors => {
            let path = config.resolve(t.weights.path.as_ref().expect("checked by ModelConfig"));
            let files = hf::safetensors_files(&path)?;
            let dir = if path.is_dir() { path.clone() } else { path.parent().unwrap_or(Path::new(".")).to_path_buf() };
            let cfg = dir.join("config.json");
            let dims = if cfg.exists() {
                hf::dims_from_config(&cfg)?
            } else {
                t.dims.clone().ok_or_else(|| ModelError::Config { path: config.path.clone(), msg: format!("no config.json beside the weights ({}) and no [dims] table", cfg.display()) })?
            };
            let mut ws = hf::load_safetensors(&files)?;
            // (AWQ / GPTQ int4 checkpoints: their packed linears as i4g128 `.weight`s)
            if cfg.exists() {
                let text = std::fs::read_to_string(&cfg).map_err(error::io(&cfg))?;
                if let Some(layout) = int4_ckpt::layout_from_config(&cfg, &text)? {
                    let n = int4_ckpt::import(&mut ws, layout, &path)?;
                    tracing::info!(target: "dsc::models", "{}: {n} {layout:?} int4 linears imported as i4g128", path.display());
                }
            }
            let tok_path = t.tokenizer.as_ref().and_then(|s| s.path.as_ref()).map(|p| config.resolve(p)).unwrap_or_else(|| dir.join("tokenizer.json"));
            let tok = if tok_path.exists() { Some(tokenizer::from_json_file(&tok_path)?) } else { None };
            (dims, ws, tok, llama::Naming::Hf, Some(path))
        }
        WeightFormat::Seeded => {
            let dims = t.dims.clone().expect("checked by ModelConfig");
            let dtype: DType = t.weights.dtype.as_deref().unwrap_or("bf16").parse().map_err(|e: String| ModelError::Config { path: config.path.clone(), msg: e })?;
            let tok = tokenizer_section(&config, None, dims.vocab)?;
            let ws = seeded_weights(&dims, t.weights.seed.unwrap_or(0), dtype, llama::Naming::Hf)?;
            (dims, ws, tok, llama::Naming::Hf, None)
        }
    };
    if let Some(given) = &t.dims {
        check_dims(&config.path, given, &dims)?;
    }
    let mut tokenizer = tokenizer;
    if let (Some(tok), Some(tpl)) = (tokenizer.as_mut(), t.tokenizer.as_ref().and_then(|s| s.chat_template.clone())) {
        tok.chat_template = Some(tpl);
    }
    let tied = tied(&weights);
    let opts = llama::BuildOptions {
        name: t.model.name.clone(),
        dims: dims.clone(),
        naming,
        activations: config.activations,
        act_quant: config.act_quant,
        act_quant_weights: config.act_quant_weights(&weights)?,
        kv_cache: config.kv_cache,
        kv_block_size: t.limits.kv_block_size,
        weights_path: weights_path.clone().unwrap_or_else(|| "<seeded>".into()),
    };
    let mut graph = llama::build(&opts, &weights)?;
    let mut precision = None;
    if config.policy.converts() {
        let wpath = weights_path.clone().unwrap_or_else(|| "<seeded>".into());
        let stored: BTreeMap<String, DType> = weights.tensors.iter().map(|(n, t)| (n.clone(), t.dtype)).collect();
        let report = match config.policy.awq {
            true => {
                let toks = calibration_tokens(&config, tokenizer.as_ref())?;
                Some(awq::search_and_scale(&graph, &mut weights, &toks, naming, &dims, t.limits.kv_block_size, &config.policy, &wpath)?)
            }
            false => None,
        };
        let counts = apply_policy(&mut weights, &config.policy, &stored, &wpath)?;
        precision = Some(precision_note(&config.policy, &counts, report.as_ref()));
        graph = llama::build(&opts, &weights)?;
    }
    if let Some(spec) = &config.sparsity {
        let wpath = weights_path.clone().unwrap_or_else(|| "<seeded>".into());
        let note = prune_weights(&config, spec, &graph, &mut weights, tokenizer.as_ref(), tied, &wpath)?;
        precision = Some(precision.map_or(note.clone(), |p| format!("{p}; {note}")));
        graph = llama::build(&opts, &weights)?;
    }
    Ok(LoadedModel { config, dims, deepseek: None, graph, weights, tokenizer, weights_path, precision })
}

/// Tokens in a tokenizer (0 when its JSON does not load).
fn vocab_size(t: &TokenizerInfo) -> usize {
    tokenizers::Tokenizer::from_str(&t.json).map(|x| x.get_vocab_size(true)).unwrap_or(0)
}

/// The tokenizer model.toml's `[tokenizer]` names (`path`: a tokenizer.json, `gguf`: a GGUF
/// file's metadata), else `default_json` where that file exists; one with more tokens than
/// the model's vocabulary (`vocab`) is an error naming model.toml.
fn tokenizer_section(config: &ModelConfig, default_json: Option<&Path>, vocab: usize) -> Result<Option<TokenizerInfo>> {
    let sec = config.toml.tokenizer.as_ref();
    let tok = match (sec.and_then(|s| s.path.as_ref()), sec.and_then(|s| s.gguf.as_ref())) {
        (Some(p), _) => Some(tokenizer::from_json_file(&config.resolve(p))?),
        (None, Some(g)) => Some(tokenizer::from_gguf(&gguf::GgufFile::open(&config.resolve(g))?)?),
        (None, None) => match default_json {
            Some(p) if p.exists() => Some(tokenizer::from_json_file(p)?),
            _ => None,
        },
    };
    if let Some(tk) = &tok {
        let n = vocab_size(tk);
        if n > vocab {
            return Err(ModelError::Config { path: config.path.clone(), msg: format!("the tokenizer has {n} tokens but the model's vocabulary is {vocab}") });
        }
    }
    Ok(tok)
}

/// model.toml's GGUF weight file, opened: it must exist and match `weights.sha256` when given.
fn open_gguf_weights(config: &ModelConfig) -> Result<gguf::GgufFile> {
    let t = &config.toml;
    let path = config.resolve(t.weights.path.as_ref().expect("checked by ModelConfig"));
    if !path.exists() {
        return Err(ModelError::Io { path, source: std::io::Error::new(std::io::ErrorKind::NotFound, "weight file not found (scripts/fetch-model.sh fetches the default model)") });
    }
    if let Some(want) = &t.weights.sha256 {
        let got = sha256_file(&path)?;
        if &got != want {
            return Err(ModelError::Format { path, msg: format!("sha256 is {got}, model.toml expects {want}") });
        }
    }
    gguf::GgufFile::open(&path)
}

/// The DeepSeek family: an HF checkpoint (safetensors + config.json beside them), or a GGUF
/// file of llama.cpp's architecture `deepseek2` ([`deepseek_gguf`]).
fn load_deepseek(config: ModelConfig) -> Result<LoadedModel> {
    let t = &config.toml;
    let cerr = |msg: String| ModelError::Config { path: config.path.clone(), msg };
    if t.dims.is_some() {
        return Err(cerr("field `dims`: architecture \"deepseek\" takes its dims from config.json".into()));
    }
    if t.parallel.as_ref().is_some_and(|p| p.tp > 1) {
        return Err(cerr("field `parallel.tp`: tensor parallelism is not supported for deepseek yet".into()));
    }
    let seeded = t.weights.format == WeightFormat::Seeded;
    let gguf_file = match t.weights.format {
        WeightFormat::Gguf => Some(open_gguf_weights(&config)?),
        _ => None,
    };
    let (ds, mut weights, path, dir, gguf_tok) = match &gguf_file {
        Some(g) => {
            let ds = deepseek_gguf::config_from_gguf(g)?;
            let ws = deepseek_gguf::weights_from_gguf(g, &ds)?;
            // (model.toml's [tokenizer] wins; the file's own is read only without one)
            let tok = if t.tokenizer.is_none() && g.get("tokenizer.ggml.model").is_some() { Some(tokenizer::from_gguf(g)?) } else { None };
            let dir = g.path.parent().unwrap_or(Path::new(".")).to_path_buf();
            (ds, ws, g.path.clone(), dir, tok)
        }
        None => {
            let (ds, ws, path, dir) = deepseek_checkpoint(&config, seeded)?;
            (ds, ws, path, dir, None)
        }
    };
    if config.policy.awq {
        return Err(cerr("field `precision.calibration`: awq is built for the llama family (deepseek: round-to-nearest only)".into()));
    }
    let mut precision = None;
    if config.policy.converts() {
        let stored: BTreeMap<String, DType> = weights.tensors.iter().map(|(n, t)| (n.clone(), t.dtype)).collect();
        let counts = apply_policy(&mut weights, &config.policy, &stored, &path)?;
        precision = Some(precision_note(&config.policy, &counts, None));
    }
    // ([tokenizer] path or gguf, else the GGUF file's own, else a tokenizer.json beside
    // config.json)
    let mut tokenizer = match (tokenizer_section(&config, gguf_file.is_none().then(|| dir.join("tokenizer.json")).as_deref(), ds.vocab)?, gguf_tok) {
        (Some(t), _) => Some(t),
        (None, Some(t)) => {
            let n = vocab_size(&t);
            if n > ds.vocab {
                return Err(ModelError::Format { path: path.clone(), msg: format!("the tokenizer has {n} tokens but the model's vocabulary is {}", ds.vocab) });
            }
            Some(t)
        }
        (None, None) => None,
    };
    if let (Some(tok), Some(tpl)) = (tokenizer.as_mut(), t.tokenizer.as_ref().and_then(|s| s.chat_template.clone())) {
        tok.chat_template = Some(tpl);
    }
    let tied = tied(&weights);
    let opts = deepseek::BuildOptions {
        name: t.model.name.clone(),
        activations: config.activations,
        act_quant: config.act_quant,
        act_quant_weights: config.act_quant_weights(&weights)?,
        kv_cache: config.kv_cache,
        kv_block_size: t.limits.kv_block_size,
        weights_path: path.clone(),
    };
    let mut graph = deepseek::build(&opts, &ds, &weights)?;
    if let Some(spec) = &config.sparsity {
        let note = prune_weights(&config, spec, &graph, &mut weights, tokenizer.as_ref(), tied, &path)?;
        precision = Some(precision.map_or(note.clone(), |p| format!("{p}; {note}")));
        graph = deepseek::build(&opts, &ds, &weights)?;
    }
    let dims = ds.common_dims();
    Ok(LoadedModel { config, dims, deepseek: Some(ds), graph, weights, tokenizer, weights_path: (!seeded).then_some(path), precision })
}

/// A DeepSeek HF checkpoint (safetensors + config.json beside them), or seeded weights of a
/// config.json's shapes: (config, weights, weights path, the config's folder).
fn deepseek_checkpoint(config: &ModelConfig, seeded: bool) -> Result<(deepseek::DeepseekConfig, WeightSet, PathBuf, PathBuf)> {
    let t = &config.toml;
    let cerr = |msg: String| ModelError::Config { path: config.path.clone(), msg };
    let (path, cfg_path) = if seeded {
        let c = config.resolve(t.weights.config.as_ref().expect("checked by ModelConfig"));
        (PathBuf::from("<seeded>"), c)
    } else {
        let path = config.resolve(t.weights.path.as_ref().expect("checked by ModelConfig"));
        let dir = if path.is_dir() { path.clone() } else { path.parent().unwrap_or(Path::new(".")).to_path_buf() };
        (path, dir.join("config.json"))
    };
    let dir = cfg_path.parent().unwrap_or(Path::new(".")).to_path_buf();
    let text = std::fs::read_to_string(&cfg_path).map_err(error::io(&cfg_path))?;
    let ds = deepseek::config_from_json(&cfg_path, &text)?;
    let weights = if seeded {
        let dtype: DType = t.weights.dtype.as_deref().unwrap_or("bf16").parse().map_err(|e: String| cerr(e))?;
        let mut ws = WeightSet::default();
        for (name, shape) in deepseek::weight_shapes(&ds) {
            let dtype = deepseek::derived_dtype(&name, dtype);
            seeded_tensor(&mut ws, t.weights.seed.unwrap_or(0), dtype, name, shape)?;
        }
        ws
    } else {
        let mut ws = hf::load_safetensors(&hf::safetensors_files(&path)?)?;
        deepseek::prepare(&mut ws, &ds, &path)?;
        ws
    };
    Ok((ds, weights, path, dir))
}
