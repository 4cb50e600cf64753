//! GGUF v2/v3 reader (llama.cpp's model format): metadata key/values, tensor directory, and
//! memory-mapped tensor data. Every offset and size is checked against the file length, so a
//! truncated or corrupt file gives an error naming the file and the tensor, never a panic.

use crate::error::{io, ModelError, Result};
use dsc_ir::DType;
use memmap2::Mmap;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) if v >= 0 => Some(v as u64),
            Value::I16(v) if v >= 0 => Some(v as u64),
            Value::I32(v) if v >= 0 => Some(v as u64),
            Value::I64(v) if v >= 0 => Some(v as u64),
            _ => None,
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }
}

#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    /// PyTorch order (outermost first): GGUF's ne[] reversed.
    pub shape: Vec<usize>,
    pub dtype: DType,
    /// absolute byte offset in the file
    pub offset: usize,
    pub nbytes: usize,
}

pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: BTreeMap<String, TensorInfo>,
    /// tensor names in file order
    pub order: Vec<String>,
    pub(crate) map: Arc<Mmap>,
}

/// GGUF's ggml_type ids for the formats we read.
fn ggml_type(id: u32) -> std::result::Result<DType, String> {
    Ok(match id {
        0 => DType::F32,
        1 => DType::F16,
        2 => DType::Q4_0,
        3 => DType::Q4_1,
        6 => DType::Q5_0,
        7 => DType::Q5_1,
        8 => DType::Q8_0,
        12 => DType::Q4_K,
        13 => DType::Q5_K,
        14 => DType::Q6_K,
        24 => DType::I8,
        26 => DType::I32,
        30 => DType::BF16,
        other => {
            let name = match other {
                9 => "Q8_1",
                10 => "Q2_K",
                11 => "Q3_K",
                15 => "Q8_K",
                16..=23 | 29 => "IQ*",
                25 => "I16",
                27 => "I64",
                28 => "F64",
                _ => "unknown",
            };
            return Err(format!("unsupported GGUF tensor type {other} ({name}); supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, I8, I32"));
        }
    })
}

/// Metadata values a GGUF file may decode to in all (a real vocabulary's arrays hold well under
/// a million; each value costs ~32 bytes in memory however few bytes it takes in the file, so
/// this bounds the metadata's memory, ~0.5 GB, whatever the file claims).
pub const MAX_METADATA_VALUES: usize = 16 << 20;

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
    path: &'a Path,
    /// metadata values decoded so far
    values: usize,
}

impl<'a> Reader<'a> {
    fn err<T>(&self, msg: impl Into<String>) -> Result<T> {
        Err(ModelError::Format { path: self.path.to_path_buf(), msg: format!("{} (at byte {})", msg.into(), self.pos) })
    }
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        match self.pos.checked_add(n) {
            Some(end) if end <= self.b.len() => {
                let s = &self.b[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            _ => self.err(format!("file truncated while reading {what} ({n} bytes needed, {} left)", self.b.len().saturating_sub(self.pos))),
        }
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().expect("8 bytes")))
    }
    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.u64(what)?;
        if n > (self.b.len() - self.pos) as u64 {
            return self.err(format!("{what}: string length {n} runs past the end of the file"));
        }
        let s = self.take(n as usize, what)?;
        String::from_utf8(s.to_vec()).or_else(|_| self.err(format!("{what}: string is not UTF-8")))
    }
    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<Value> {
        self.values += 1;
        if self.values > MAX_METADATA_VALUES {
            return self.err(format!("metadata `{key}`: more than {MAX_METADATA_VALUES} metadata values in the file"));
        }
        let b = |r: &mut Self, n| r.take(n, key);
        Ok(match ty {
            0 => Value::U8(b(self, 1)?[0]),
            1 => Value::I8(b(self, 1)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(b(self, 2)?.try_into().expect("2"))),
            3 => Value::I16(i16::from_le_bytes(b(self, 2)?.try_into().expect("2"))),
            4 => Value::U32(u32::from_le_bytes(b(self, 4)?.try_into().expect("4"))),
            5 => Value::I32(i32::from_le_bytes(b(self, 4)?.try_into().expect("4"))),
            6 => Value::F32(f32::from_le_bytes(b(self, 4)?.try_into().expect("4"))),
            7 => Value::Bool(b(self, 1)?[0] != 0),
            8 => Value::Str(self.string(key)?),
            9 => {
                if depth > 2 {
                    return self.err(format!("metadata `{key}`: arrays nested too deep"));
                }
                let ety = self.u32(key)?;
                let n = self.u64(key)?;
                if n > (self.b.len() - self.pos) as u64 {
                    return self.err(format!("metadata `{key}`: array length {n} runs past the end of the file"));
                }
                // (each element takes at least a byte of the file; the values budget bounds the rest)
                let mut v = Vec::with_capacity((n as usize).min(4096));
                for _ in 0..n {
                    v.push(self.value(ety, key, depth + 1)?);
                }
                Value::Array(v)
            }
            10 => Value::U64(u64::from_le_bytes(b(self, 8)?.try_into().expect("8"))),
            11 => Value::I64(i64::from_le_bytes(b(self, 8)?.try_into().expect("8"))),
            12 => Value::F64(f64::from_le_bytes(b(self, 8)?.try_into().expect("8"))),
            other => return self.err(format!("metadata `{key}`: unknown value type {other}")),
        })
    }
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<Self> {
        let f = std::fs::File::open(path).map_err(io(path))?;
        // SAFETY: the file is opened read-only; we never hand out references that outlive the
        // map, and a concurrent writer would be a user error that at worst changes values.
        let map = unsafe { Mmap::map(&f) }.map_err(io(path))?;
        let len = map.len();
        Self::from_map(path, map, len)
    }

    /// The file whose first `len` bytes `map` holds.
    fn from_map(path: &Path, map: Mmap, len: usize) -> Result<Self> {
        let p = parse(path, &map[..len])?;
        Ok(GgufFile { path: path.to_path_buf(), version: p.version, metadata: p.metadata, tensors: p.tensors, order: p.order, map: Arc::new(map) })
    }
}

/// A GGUF file's header, parsed from its bytes (what [`GgufFile::open`] maps): every count,
/// length and offset checked against the bytes there are. `path` names the file in errors.
pub struct GgufHeader {
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: BTreeMap<String, TensorInfo>,
    pub order: Vec<String>,
}

pub fn parse(path: &Path, map: &[u8]) -> Result<GgufHeader> {
    let mut r = Reader { b: map, pos: 0, path, values: 0 };
    let magic = r.take(4, "magic")?;
    if magic != b"GGUF" {
        return r.err(format!("not a GGUF file (magic {magic:02x?}, expected \"GGUF\")"));
    }
    let version = r.u32("version")?;
    if !(2..=3).contains(&version) {
        return r.err(format!("GGUF version {version} is not supported (2 or 3)"));
    }
    let n_tensors = r.u64("tensor count")?;
    let n_kv = r.u64("metadata count")?;
    if n_tensors > map.len() as u64 || n_kv > map.len() as u64 {
        return r.err(format!("implausible counts ({n_tensors} tensors, {n_kv} metadata entries) for a {}-byte file", map.len()));
    }
    let mut metadata = BTreeMap::new();
    for _ in 0..n_kv {
        let key = r.string("metadata key")?;
        let ty = r.u32(&key)?;
        let v = r.value(ty, &key, 0)?;
        metadata.insert(key, v);
    }
    let align = match metadata.get("general.alignment") {
        Some(v) => v.as_u64().filter(|a| a.is_power_of_two()).ok_or(ModelError::Format { path: path.into(), msg: "general.alignment must be a power of two".into() })? as usize,
        None => 32,
    };
    let mut infos = vec![];
    for _ in 0..n_tensors {
        let name = r.string("tensor name")?;
        let nd = r.u32(&name)?;
        if nd > 8 {
            return r.err(format!("tensor `{name}` has {nd} dims"));
        }
        let mut ne = vec![];
        for _ in 0..nd {
            ne.push(r.u64(&name)? as usize);
        }
        let ty = r.u32(&name)?;
        let off = r.u64(&name)? as usize;
        infos.push((name, ne, ty, off));
    }
    let data_start = r.pos.div_ceil(align) * align;
    let mut tensors = BTreeMap::new();
    let mut order = vec![];
    for (name, ne, ty, off) in infos {
        let terr = |msg: String| ModelError::Tensor { path: path.to_path_buf(), tensor: name.clone(), msg };
        let dtype = ggml_type(ty).map_err(terr)?;
        let numel = ne.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).ok_or_else(|| terr(format!("shape {ne:?} overflows")))?;
        let nbytes = dtype.bytes_for(numel).ok_or_else(|| terr(format!("{numel} elements are not whole {dtype} blocks")))?;
        // (ggml stores each row in whole blocks: a block never straddles two rows)
        let row = ne.first().copied().unwrap_or(1);
        if row % dtype.block().0 != 0 {
            return Err(terr(format!("rows of {row} values are not whole {dtype} blocks of {} values", dtype.block().0)));
        }
        let offset = data_start.checked_add(off).ok_or_else(|| terr("offset overflows".into()))?;
        if offset.checked_add(nbytes).is_none_or(|end| end > map.len()) {
            return Err(terr(format!("data at bytes {offset}..{} lies past the end of the file ({} bytes): the file is truncated", offset.saturating_add(nbytes), map.len())));
        }
        let shape: Vec<usize> = ne.iter().rev().copied().collect();
        order.push(name.clone());
        if tensors.insert(name.clone(), TensorInfo { name: name.clone(), shape, dtype, offset, nbytes }).is_some() {
            return Err(terr("appears twice".into()));
        }
    }
    Ok(GgufHeader { version, metadata, tensors, order })
}

impl GgufFile {
    /// A GGUF file from bytes in memory (copied into an anonymous map), as [`GgufFile::open`]
    /// reads a file; `path` names it in errors.
    pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Self> {
        let mut m = memmap2::MmapMut::map_anon(bytes.len().max(1)).map_err(io(path))?;
        m[..bytes.len()].copy_from_slice(bytes);
        Self::from_map(path, m.make_read_only().map_err(io(path))?, bytes.len())
    }

    pub fn bytes(&self, t: &TensorInfo) -> &[u8] {
        &self.map[t.offset..t.offset + t.nbytes]
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    fn missing(&self, key: &str) -> ModelError {
        ModelError::Format { path: self.path.clone(), msg: format!("metadata key `{key}` is missing or has the wrong type") }
    }

    pub fn u64(&self, key: &str) -> Result<u64> {
        self.get(key).and_then(Value::as_u64).ok_or_else(|| self.missing(key))
    }
    pub fn f64(&self, key: &str) -> Result<f64> {
        self.get(key).and_then(Value::as_f64).ok_or_else(|| self.missing(key))
    }
    pub fn str(&self, key: &str) -> Result<&str> {
        self.get(key).and_then(Value::as_str).ok_or_else(|| self.missing(key))
    }
    pub fn str_array(&self, key: &str) -> Result<Vec<&str>> {
        match self.get(key) {
            Some(Value::Array(v)) => v.iter().map(|x| x.as_str().ok_or_else(|| self.missing(key))).collect(),
            _ => Err(self.missing(key)),
        }
    }
    pub fn u64_array(&self, key: &str) -> Result<Vec<u64>> {
        match self.get(key) {
            Some(Value::Array(v)) => v.iter().map(|x| x.as_u64().ok_or_else(|| self.missing(key))).collect(),
            _ => Err(self.missing(key)),
        }
    }
}

/// Write a minimal GGUF v3 file (used by tests to make small and broken models).
pub fn write_gguf(path: &Path, metadata: &[(&str, Value)], tensors: &[(&str, DType, Vec<usize>, Vec<u8>)]) -> std::io::Result<()> {
    fn wstr(o: &mut Vec<u8>, s: &str) {
        o.extend((s.len() as u64).to_le_bytes());
        o.extend(s.as_bytes());
    }
    fn wval(o: &mut Vec<u8>, v: &Value) {
        match v {
            Value::U8(x) => o.push(*x),
            Value::I8(x) => o.push(*x as u8),
            Value::U16(x) => o.extend(x.to_le_bytes()),
            Value::I16(x) => o.extend(x.to_le_bytes()),
            Value::U32(x) => o.extend(x.to_le_bytes()),
            Value::I32(x) => o.extend(x.to_le_bytes()),
            Value::F32(x) => o.extend(x.to_le_bytes()),
            Value::Bool(x) => o.push(*x as u8),
            Value::Str(s) => wstr(o, s),
            Value::Array(a) => {
                o.extend(a.first().map(vtype).unwrap_or(4).to_le_bytes());
                o.extend((a.len() as u64).to_le_bytes());
                a.iter().for_each(|x| wval(o, x));
            }
            Value::U64(x) => o.extend(x.to_le_bytes()),
            Value::I64(x) => o.extend(x.to_le_bytes()),
            Value::F64(x) => o.extend(x.to_le_bytes()),
        }
    }
    fn vtype(v: &Value) -> u32 {
        match v {
            Value::U8(_) => 0,
            Value::I8(_) => 1,
            Value::U16(_) => 2,
            Value::I16(_) => 3,
            Value::U32(_) => 4,
            Value::I32(_) => 5,
            Value::F32(_) => 6,
            Value::Bool(_) => 7,
            Value::Str(_) => 8,
            Value::Array(_) => 9,
            Value::U64(_) => 10,
            Value::I64(_) => 11,
            Value::F64(_) => 12,
        }
    }
    let type_id = |d: DType| match d {
        DType::F32 => 0u32,
        DType::F16 => 1,
        DType::Q4_0 => 2,
        DType::Q4_1 => 3,
        DType::Q5_0 => 6,
        DType::Q5_1 => 7,
        DType::Q8_0 => 8,
        DType::Q4_K => 12,
        DType::Q5_K => 13,
        DType::Q6_K => 14,
        DType::I8 => 24,
        DType::I32 => 26,
        DType::BF16 => 30,
        _ => 99,
    };
    let mut o = b"GGUF".to_vec();
    o.extend(3u32.to_le_bytes());
    o.extend((tensors.len() as u64).to_le_bytes());
    o.extend((metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata {
        wstr(&mut o, k);
        o.extend(vtype(v).to_le_bytes());
        wval(&mut o, v);
    }
    let mut off = 0u64;
    let mut offs = vec![];
    for (name, dt, shape, data) in tensors {
        wstr(&mut o, name);
        o.extend((shape.len() as u32).to_le_bytes());
        for d in shape.iter().rev() {
            o.extend((*d as u64).to_le_bytes());
        }
        o.extend(type_id(*dt).to_le_bytes());
        o.extend(off.to_le_bytes());
        offs.push(off);
        off = (off + data.len() as u64).div_ceil(32) * 32;
    }
    while o.len() % 32 != 0 {
        o.push(0);
    }
    let base = o.len();
    for ((_, _, _, data), off) in tensors.iter().zip(offs) {
        o.resize(base + off as usize, 0);
        o.extend(data);
    }
    std::fs::write(path, o)
}
