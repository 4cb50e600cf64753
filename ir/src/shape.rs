//! Symbolic shapes. A dimension is a constant or a named symbol such as `T` (tokens in a
//! step), `S` (sequences in a step), `MB` (KV blocks per sequence) or `NB` (KV blocks in the
//! pool); symbols are bound to numbers when a step runs.

use crate::DType;
use std::collections::BTreeMap;
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dim {
    Const(usize),
    Sym(String),
}

impl Dim {
    pub fn sym(s: &str) -> Dim {
        Dim::Sym(s.to_string())
    }
    pub fn as_const(&self) -> Option<usize> {
        match self {
            Dim::Const(c) => Some(*c),
            Dim::Sym(_) => None,
        }
    }
    /// The value of this dim under `binding`, if known.
    pub fn eval(&self, binding: &BTreeMap<String, usize>) -> Option<usize> {
        match self {
            Dim::Const(c) => Some(*c),
            Dim::Sym(s) => binding.get(s).copied(),
        }
    }
}

impl From<usize> for Dim {
    fn from(c: usize) -> Dim {
        Dim::Const(c)
    }
}
impl From<&str> for Dim {
    fn from(s: &str) -> Dim {
        Dim::sym(s)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Const(c) => write!(f, "{c}"),
            Dim::Sym(s) => f.write_str(s),
        }
    }
}

/// The type of a value: element type and (possibly symbolic) shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Vec<Dim>,
}

impl TensorType {
    pub fn new(dtype: DType, shape: impl IntoIterator<Item = Dim>) -> Self {
        TensorType { dtype, shape: shape.into_iter().collect() }
    }
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
    /// Element count when every dim is constant.
    pub fn const_numel(&self) -> Option<usize> {
        self.shape.iter().try_fold(1usize, |acc, d| acc.checked_mul(d.as_const()?))
    }
    /// Concrete shape under a symbol binding.
    pub fn eval_shape(&self, binding: &BTreeMap<String, usize>) -> Option<Vec<usize>> {
        self.shape.iter().map(|d| d.eval(binding)).collect()
    }
    pub fn with_dtype(&self, dtype: DType) -> Self {
        TensorType { dtype, shape: self.shape.clone() }
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// Shorthand for building shapes: `shape![Dim::sym("T"), 576]`.
#[macro_export]
macro_rules! shape {
    ($($d:expr),* $(,)?) => { vec![$($crate::Dim::from($d)),*] };
}
