//! The weight precision policy: what each weight matrix becomes at compile time
//! (model.toml's `[precision]`, `dsc compile --quant`), and the integer quantizers behind it.
//!
//! A policy has a default format for matrices (`precision.weights`) and per layer type
//! overrides (`[precision.layers]`: attn_qkv, attn_o, mlp, experts, router, lm_head,
//! embeddings). With a quantized default, the sensitive layer types — Q/K/V, the lm_head, the
//! router — and the embedding table keep their stored precision unless the policy names them
//! (the articles' advice; the embedding gather reads one row a token, so it has no speed to
//! win). Vectors (norms, biases) are never converted.
//!
//! Integer formats `int8[-gN]`, `int4[-sym|-asym][-gN]` (default: groups of 128, int4
//! asymmetric): weight-only, one f16 scale (and, asymmetric, one f16 minimum) per group of N
//! consecutive values of a row. They are stored in the GGUF block layouts the kernels read —
//! Q8_0 (int8, symmetric), Q4_0 (int4 symmetric), Q4_1 (int4 with a minimum) — every 32-value
//! block of a group carrying the group's scale: the numerics of an N-value group, the bytes of
//! 32-value blocks (5 bits a weight for int4, where a packed g128 layout would take 4.25).
//! `calibration = "awq"` adds the activation-aware scale search ([`crate::awq`]) before
//! rounding.

use dsc_ir::DType;
use half::f16;
use std::collections::BTreeMap;

/// The layer types a policy names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LayerKind {
    AttnQkv,
    AttnO,
    Mlp,
    Experts,
    Router,
    LmHead,
    Embeddings,
}

impl LayerKind {
    pub const ALL: [LayerKind; 7] = [LayerKind::AttnQkv, LayerKind::AttnO, LayerKind::Mlp, LayerKind::Experts, LayerKind::Router, LayerKind::LmHead, LayerKind::Embeddings];

    /// The key in `[precision.layers]`.
    pub fn key(self) -> &'static str {
        match self {
            LayerKind::AttnQkv => "attn_qkv",
            LayerKind::AttnO => "attn_o",
            LayerKind::Mlp => "mlp",
            LayerKind::Experts => "experts",
            LayerKind::Router => "router",
            LayerKind::LmHead => "lm_head",
            LayerKind::Embeddings => "embeddings",
        }
    }

    /// Kept at their stored precision under a quantized default unless named.
    pub fn sensitive(self) -> bool {
        matches!(self, LayerKind::AttnQkv | LayerKind::Router | LayerKind::LmHead | LayerKind::Embeddings)
    }

    /// The layer type of a checkpoint tensor, from its name (GGUF and HF names of the llama
    /// and DeepSeek families); `tied`: the embedding table is also the lm_head.
    pub fn of(name: &str, tied: bool) -> Option<LayerKind> {
        let has = |s: &[&str]| s.iter().any(|p| name.contains(p));
        if has(&["embed_tokens", "token_embd"]) {
            return Some(if tied { LayerKind::LmHead } else { LayerKind::Embeddings });
        }
        if name.starts_with("lm_head") || name == "output.weight" {
            return Some(LayerKind::LmHead);
        }
        if name.ends_with("mlp.gate.weight") || has(&["ffn_gate_inp", "e_score_correction"]) {
            return Some(LayerKind::Router);
        }
        if has(&["shared_expert", "_shexp"]) {
            return Some(LayerKind::Mlp);
        }
        if has(&[".experts.", "_exps", "experts."]) {
            return Some(LayerKind::Experts);
        }
        if has(&["o_proj", "attn_output"]) {
            return Some(LayerKind::AttnO);
        }
        if has(&["q_proj", "k_proj", "v_proj", "q_a_proj", "q_b_proj", "kv_a_proj", "kv_b_proj", "attn_q", "attn_k", "attn_v"]) {
            return Some(LayerKind::AttnQkv);
        }
        if has(&["mlp.", "ffn_"]) {
            return Some(LayerKind::Mlp);
        }
        None
    }
}

/// Integer weights with group scales.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IntSpec {
    pub bits: u8,
    /// values per scale (a multiple of 32)
    pub group: usize,
    pub symmetric: bool,
}

/// What a weight matrix becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// as in the checkpoint
    Stored,
    /// f32, bf16, f16, or a GGUF block format with llama.cpp's reference quantizer
    DType(DType),
    Int(IntSpec),
}

impl Format {
    /// `stored`, a dtype name (`bf16`, `q4_1`, ...), or `int8[-gN]` / `int4[-sym|-asym][-gN]`.
    pub fn parse(s: &str) -> Result<Format, String> {
        if s == "stored" {
            return Ok(Format::Stored);
        }
        if s == "fp8" {
            return Ok(Format::DType(DType::F8G128));
        }
        if let Some(rest) = s.strip_prefix("int") {
            let mut parts = rest.split('-');
            let bits: u8 = match parts.next() {
                Some("8") => 8,
                Some("4") => 4,
                _ => return Err(format!("`{s}`: integer formats are int8 and int4 (e.g. int4-g128, int4-sym-g64, int8)")),
            };
            let (mut group, mut symmetric) = (128, bits == 8);
            for p in parts {
                match p {
                    "sym" => symmetric = true,
                    "asym" => symmetric = false,
                    g if g.starts_with('g') => {
                        group = g[1..].parse().map_err(|_| format!("`{s}`: group `{g}` is not gN with N a number"))?;
                        if group == 0 || group % 32 != 0 {
                            return Err(format!("`{s}`: the group size must be a positive multiple of 32 (the kernels' block), not {group}"));
                        }
                    }
                    _ => return Err(format!("`{s}`: unknown part `{p}` (sym, asym, gN)")),
                }
            }
            if bits == 8 && !symmetric {
                return Err(format!("`{s}`: int8 is symmetric (its Q8_0 blocks hold no minimum)"));
            }
            return Ok(Format::Int(IntSpec { bits, group, symmetric }));
        }
        let d: DType = s.parse().map_err(|e: String| format!("{e}; or stored, int8[-gN], int4[-sym|-asym][-gN]"))?;
        if !matches!(d, DType::F32 | DType::BF16 | DType::F16 | DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::F8G128) {
            return Err(format!("`{s}` is not a weight format dsc converts to (stored, f32, bf16, f16, q8_0, q4_0, q4_1, fp8, int8[-gN], int4[-sym|-asym][-gN])"));
        }
        Ok(Format::DType(d))
    }

    pub fn name(&self) -> String {
        match self {
            Format::Stored => "stored".into(),
            Format::DType(DType::F8G128) => "fp8".into(),
            Format::DType(d) => d.name().into(),
            Format::Int(i) => format!("int{}{}-g{}", i.bits, if i.bits == 4 && i.symmetric { "-sym" } else { "" }, i.group),
        }
    }

    /// Anything below 16-bit floats.
    pub fn quantized(&self) -> bool {
        match self {
            Format::Stored => false,
            Format::DType(d) => !matches!(d, DType::F32 | DType::BF16 | DType::F16),
            Format::Int(_) => true,
        }
    }

    /// The stored dtype a tensor of `stored` dtype and rows of `row` values ends up with
    /// (`i4g128`: int4-g128 may take dsc's i4g128 layout — see [`IntSpec::dtype_in`]). fp8
    /// (groups of 128 a row) takes [`DType::F8G128`] for rows of whole 512-value super-blocks,
    /// [`DType::F8G32`] blocks carrying the groups' scales for other rows of whole 32-value
    /// blocks (SmolLM2's 576), and keeps the stored type of any other row (the compile summary
    /// counts those).
    pub fn dtype(&self, stored: DType, row: usize, i4g128: bool) -> DType {
        match self {
            Format::Stored => stored,
            Format::DType(DType::F8G128) if row == 0 || !row.is_multiple_of(32) => stored,
            Format::DType(DType::F8G128) if row % 512 != 0 => DType::F8G32,
            Format::DType(d) => *d,
            Format::Int(i) => i.dtype_in(row, i4g128),
        }
    }

    /// Encode `x` (a tensor's values, rows of `row` values) in this format (`i4g128` as for
    /// [`Format::dtype`]).
    pub fn encode(&self, stored: DType, x: &[f32], row: usize, i4g128: bool) -> Result<Vec<u8>, String> {
        match self {
            Format::DType(DType::F8G128) if self.dtype(stored, row, i4g128) == DType::F8G32 => Ok(dsc_ir::quant::f8g32_rows(x, row, 128)),
            Format::Stored | Format::DType(_) => {
                let d = self.dtype(stored, row, i4g128);
                dsc_ir::quant::encode(d, x).ok_or_else(|| format!("{} elements are not whole {d} blocks", x.len()))
            }
            Format::Int(i) => i.encode_in(x, row, i4g128),
        }
    }
}

impl IntSpec {
    /// The block layout values in rows of `row` are stored in: int4 in groups of 128 over rows
    /// of whole 512-value super-blocks in dsc's own [`DType::I4G128`] (4.25 bits a value, the
    /// tensor-core GEMV's layout; symmetric as m = −8d), else the GGUF block of 32 that
    /// carries the numbers (every block of a group its group's scale).
    pub fn dtype(&self, row: usize) -> DType {
        self.dtype_in(row, true)
    }

    /// [`IntSpec::dtype`], with i4g128 only where `i4g128` allows it: a model takes one int4
    /// layout (`lib.rs::apply_policy`: i4g128 where every int4-g128 matrix's rows are whole
    /// super-blocks, else Q4_1 blocks throughout — the one-token fusions of small models take
    /// Q4_1, and a layer mixing the two would lose them).
    pub fn dtype_in(&self, row: usize, i4g128: bool) -> DType {
        match (self.bits, self.symmetric) {
            (8, _) => DType::Q8_0,
            (4, _) if i4g128 && self.group == 128 && row > 0 && row % 512 == 0 => DType::I4G128,
            (_, true) => DType::Q4_0,
            _ => DType::Q4_1,
        }
    }

    /// Round to nearest with one f16 scale (and minimum) per group of a row; every 32-value
    /// block of a group stores the group's scale. Rows must be whole 32-value blocks; where a
    /// row is not whole groups (SmolLM2's 576 at 128), its last group is the rest (64).
    pub fn encode(&self, x: &[f32], row: usize) -> Result<Vec<u8>, String> {
        self.encode_in(x, row, true)
    }

    /// [`IntSpec::encode`] in the layout [`IntSpec::dtype_in`] picks.
    pub fn encode_in(&self, x: &[f32], row: usize, i4g128: bool) -> Result<Vec<u8>, String> {
        let g = self.group;
        if row == 0 || row % 32 != 0 || x.len() % row != 0 {
            return Err(format!("rows of {row} values are not whole blocks of 32"));
        }
        let mut out = Vec::with_capacity(self.dtype_in(row, i4g128).bytes_for(x.len()).unwrap_or(0));
        let i4g = self.dtype_in(row, i4g128) == DType::I4G128;
        let mut groups = vec![];
        for grp in x.chunks_exact(row).flat_map(|r| r.chunks(g)) {
            match (self.bits, self.symmetric) {
                (8, _) => {
                    let amax = grp.iter().fold(0f32, |a, v| a.max(v.abs()));
                    let d = f16::from_f32(amax / 127.0);
                    let id = inv(d.to_f32());
                    for blk in grp.chunks_exact(32) {
                        out.extend(d.to_le_bytes());
                        out.extend(blk.iter().map(|v| (v * id).round().clamp(-127.0, 127.0) as i8 as u8));
                    }
                }
                (_, true) => {
                    // llama.cpp's Q4_0 convention: the value of largest magnitude maps to -8
                    let max = grp.iter().fold(0f32, |a, &v| if v.abs() > a.abs() { v } else { a });
                    let d = f16::from_f32(max / -8.0);
                    let id = inv(d.to_f32());
                    let q = |v: f32| ((v * id).round() + 8.0).clamp(0.0, 15.0) as u8;
                    if i4g {
                        // (d · (q − 8) = d · q + m with m = −8d, exact in f16)
                        groups.push((d, f16::from_f32(-8.0 * d.to_f32()), std::array::from_fn(|j| q(grp[j]))));
                        continue;
                    }
                    for blk in grp.chunks_exact(32) {
                        out.extend(d.to_le_bytes());
                        out.extend((0..16).map(|j| q(blk[j]) | (q(blk[j + 16]) << 4)));
                    }
                }
                _ => {
                    let min = grp.iter().copied().fold(f32::INFINITY, f32::min);
                    let max = grp.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let (d, m) = (f16::from_f32((max - min) / 15.0), f16::from_f32(min));
                    let (id, mf) = (inv(d.to_f32()), m.to_f32());
                    let q = |v: f32| ((v - mf) * id).round().clamp(0.0, 15.0) as u8;
                    if i4g {
                        groups.push((d, m, std::array::from_fn(|j| q(grp[j]))));
                        continue;
                    }
                    for blk in grp.chunks_exact(32) {
                        out.extend(d.to_le_bytes());
                        out.extend(m.to_le_bytes());
                        out.extend((0..16).map(|j| q(blk[j]) | (q(blk[j + 16]) << 4)));
                    }
                }
            }
        }
        if i4g {
            out = dsc_ir::quant::pack_i4g128(groups);
        }
        Ok(out)
    }

    /// `x` after a round trip through this format (what the kernels will multiply by).
    pub fn round_trip(&self, x: &[f32], row: usize) -> Result<Vec<f32>, String> {
        let enc = self.encode(x, row)?;
        dsc_ir::quant::decode(self.dtype(row), &enc, x.len()).ok_or_else(|| "decode of what was encoded".into())
    }
}

fn inv(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// The parsed `[precision]` weight policy.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    /// `precision.weights`
    pub default: Format,
    /// `[precision.layers]`
    pub layers: BTreeMap<LayerKind, Format>,
    /// `precision.calibration = "awq"`
    pub awq: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Policy { default: Format::Stored, layers: BTreeMap::new(), awq: false }
    }
}

impl Policy {
    /// The format for a matrix of layer type `kind` (None: a matrix no type names).
    pub fn format_for(&self, kind: Option<LayerKind>) -> Format {
        if let Some(f) = kind.and_then(|k| self.layers.get(&k)) {
            return *f;
        }
        match kind {
            Some(k) if k.sensitive() && self.default.quantized() => Format::Stored,
            _ => self.default,
        }
    }

    /// Whether the policy changes anything.
    pub fn converts(&self) -> bool {
        self.default != Format::Stored || self.layers.values().any(|f| *f != Format::Stored)
    }

    /// One line for the compile summary: each layer type's format (those that change).
    pub fn summary(&self) -> String {
        let mut parts: Vec<String> = LayerKind::ALL.iter().map(|k| format!("{} {}", k.key(), self.format_for(Some(*k)).name())).collect();
        parts.push(format!("other matrices {}", self.default.name()));
        format!("{}{}", parts.join(", "), if self.awq { "; activation-aware scales (awq)" } else { "" })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse_and_name_themselves() {
        assert_eq!(Format::parse("int4-g128").unwrap(), Format::Int(IntSpec { bits: 4, group: 128, symmetric: false }));
        assert_eq!(Format::parse("int4").unwrap().name(), "int4-g128");
        assert_eq!(Format::parse("int4-sym-g64").unwrap().name(), "int4-sym-g64");
        assert_eq!(Format::parse("int8").unwrap(), Format::Int(IntSpec { bits: 8, group: 128, symmetric: true }));
        assert_eq!(Format::parse("q4_1").unwrap(), Format::DType(DType::Q4_1));
        assert_eq!(Format::parse("fp8").unwrap(), Format::DType(DType::F8G128));
        assert_eq!(Format::parse("f8g128").unwrap().name(), "fp8");
        // fp8 takes rows of whole 512-value super-blocks; others keep their stored type
        let f = Format::parse("fp8").unwrap();
        assert_eq!((f.dtype(DType::BF16, 4096, true), f.dtype(DType::BF16, 576, true), f.dtype(DType::Q4_1, 100, true)), (DType::F8G128, DType::F8G32, DType::Q4_1));
        // (576-wide rows: groups of 128, 128, 128, 128, 64, each 32-value block its group's scale)
        let x: Vec<f32> = (0..1152).map(|i| ((i * 37 % 101) as f32 - 50.0) * if i % 576 < 512 { 0.01 } else { 3.0 }).collect();
        let enc = f.encode(DType::BF16, &x, 576, true).unwrap();
        assert_eq!(enc.len(), 1152 / 32 * 36);
        let scale = |blk: usize| f32::from_le_bytes(enc[36 * blk..36 * blk + 4].try_into().unwrap());
        assert_eq!((scale(0), scale(3)), (scale(0), scale(0)), "a group's four blocks share its scale");
        let tail = x[512..576].iter().fold(0f32, |a, v| a.max(v.abs())) / 448.0;
        assert!(scale(16) == tail && scale(17) == tail && scale(15) < tail / 100.0, "the row's last group (64 values) scales alone: {} vs {tail}", scale(16));
        let y = dsc_ir::quant::decode(DType::F8G32, &enc, 1152).unwrap();
        assert!(x.iter().zip(&y).all(|(a, b)| (a - b).abs() <= a.abs() / 16.0 + 1e-6), "e4m3 keeps 3 mantissa bits");
        for bad in ["int4-g100", "int3", "int8-asym", "int4-x", "f8e4m3", "q6_k", "int4-g0"] {
            assert!(Format::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn layer_kinds_from_names() {
        assert_eq!(LayerKind::of("blk.3.attn_q.weight", false), Some(LayerKind::AttnQkv));
        assert_eq!(LayerKind::of("blk.3.attn_output.weight", false), Some(LayerKind::AttnO));
        assert_eq!(LayerKind::of("blk.3.ffn_down.weight", false), Some(LayerKind::Mlp));
        assert_eq!(LayerKind::of("token_embd.weight", true), Some(LayerKind::LmHead));
        assert_eq!(LayerKind::of("model.embed_tokens.weight", false), Some(LayerKind::Embeddings));
        assert_eq!(LayerKind::of("model.layers.1.mlp.gate.weight", false), Some(LayerKind::Router));
        assert_eq!(LayerKind::of("model.layers.1.mlp.experts.3.up_proj.weight", false), Some(LayerKind::Experts));
        assert_eq!(LayerKind::of("model.layers.1.mlp.shared_experts.up_proj.weight", false), Some(LayerKind::Mlp));
        assert_eq!(LayerKind::of("model.layers.1.self_attn.kv_b_proj.weight", false), Some(LayerKind::AttnQkv));
        assert_eq!(LayerKind::of("lm_head.weight", false), Some(LayerKind::LmHead));
    }

    #[test]
    fn sensitive_layers_stay_unless_named() {
        let mut p = Policy { default: Format::parse("int4-g128").unwrap(), ..Default::default() };
        assert_eq!(p.format_for(Some(LayerKind::AttnQkv)), Format::Stored);
        assert_eq!(p.format_for(Some(LayerKind::Mlp)), p.default);
        p.layers.insert(LayerKind::AttnQkv, Format::parse("int8").unwrap());
        assert_eq!(p.format_for(Some(LayerKind::AttnQkv)).name(), "int8-g128");
        let bf = Policy { default: Format::DType(DType::BF16), ..Default::default() };
        assert_eq!(bf.format_for(Some(LayerKind::LmHead)), Format::DType(DType::BF16));
    }

    #[test]
    fn group_scales_are_shared_and_errors_bounded() {
        let x: Vec<f32> = (0..512).map(|i| ((i * 37 % 101) as f32 / 50.0 - 1.0) * if i < 256 { 1.0 } else { 0.01 }).collect();
        for s in ["int4-g128", "int4-sym-g64", "int8-g256", "int4-g32"] {
            let Format::Int(spec) = Format::parse(s).unwrap() else { unreachable!() };
            let enc = spec.encode(&x, 256).unwrap();
            assert_eq!(enc.len(), spec.dtype(256).bytes_for(512).unwrap(), "{s}");
            let bs = spec.dtype(256).block().1;
            // every 32-block of a group carries the group's scale
            for g in 0..512 / spec.group {
                let blocks = spec.group / 32;
                let first = &enc[g * blocks * bs..g * blocks * bs + 2];
                for b in 1..blocks {
                    assert_eq!(&enc[(g * blocks + b) * bs..(g * blocks + b) * bs + 2], first, "{s} group {g}");
                }
            }
            let y = spec.round_trip(&x, 256).unwrap();
            for (g, (xs, ys)) in x.chunks(spec.group).zip(y.chunks(spec.group)).enumerate() {
                let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
                let lo = xs.iter().copied().fold(f32::INFINITY, f32::min);
                let hi = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                // half a step; symmetric int4 (llama.cpp's Q4_0: the largest magnitude maps to
                // -8, the other sign stops at +7) a whole step at the far end
                let bound = match (spec.bits, spec.symmetric) {
                    (8, _) => amax / 127.0 * 0.51,
                    (_, true) => amax / 8.0 * 1.01,
                    _ => (hi - lo) / 15.0 * 0.51,
                };
                let worst = xs.iter().zip(ys).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                assert!(worst <= bound + 1e-3 * amax, "{s} group {g}: error {worst} over {bound}");
            }
        }
        // rows of 192 at g128: groups of 128 and 64, each block carrying its group's scale
        let Format::Int(spec) = Format::parse("int4-g128").unwrap() else { unreachable!() };
        let enc = spec.encode(&x[..384], 192).unwrap();
        let d = |b: usize| &enc[b * 20..b * 20 + 4];
        assert!(d(0) == d(3) && d(4) == d(5) && d(0) != d(4) && d(6) == d(9) && d(10) == d(11), "groups [0..4) [4..6) per row");
        assert!(spec.encode(&x, 100).is_err(), "rows of 100 are not whole 32-blocks");
        // rows of whole 512-value super-blocks at g128: dsc's I4G128 (4.25 bits), the same numbers
        for s in ["int4-g128", "int4-sym-g128"] {
            let Format::Int(spec) = Format::parse(s).unwrap() else { unreachable!() };
            assert_eq!((spec.dtype(512), spec.dtype(256), spec.dtype(0)), (DType::I4G128, if spec.symmetric { DType::Q4_0 } else { DType::Q4_1 }, spec.dtype(256)));
            // (a model whose other int4 rows are not whole super-blocks keeps the blocks throughout)
            assert_eq!(spec.dtype_in(512, false), spec.dtype(256));
            assert_eq!(spec.encode_in(&x, 512, false).unwrap(), spec.encode(&x, 256).unwrap());
            let enc = spec.encode(&x, 512).unwrap();
            assert_eq!(enc.len(), 272, "{s}");
            assert_eq!(spec.round_trip(&x, 512).unwrap(), spec.round_trip(&x, 256).unwrap(), "{s}: the groups' values as the 32-blocks carry them");
        }
    }
}
