//! What every architecture builder does: declare checkpoint weights (checked against the
//! shapes the model's dims imply), add nodes, and the checkpoint's `x @ W^T (+ b)` linear.

use crate::error::{ModelError, Result};
use crate::weights::WeightSet;
use dsc_ir::{DType, Dim, Graph, NodeId, Op, TensorType};
use std::path::Path;

pub(crate) struct Builder<'a> {
    pub g: Graph,
    pub w: &'a WeightSet,
    /// the weights' file, for errors
    pub path: &'a Path,
    pub activations: DType,
    /// the builder's name in "tensor not found (the <arch> builder needs it)"
    pub arch: &'static str,
    /// `precision.act_quant` and the weights whose matmuls take it
    pub act_quant: Option<(DType, usize)>,
    pub act_quant_weights: &'a std::collections::BTreeSet<String>,
}

impl Builder<'_> {
    pub fn terr(&self, tensor: &str, msg: String) -> ModelError {
        ModelError::Tensor { path: self.path.to_path_buf(), tensor: tensor.into(), msg }
    }

    /// Declare a weight, checking it exists with the expected shape and a usable dtype
    /// (`matrix`: a matmul operand, which may be packed; else a norm weight or bias).
    pub fn weight(&mut self, name: &str, shape: &[usize], matrix: bool) -> Result<NodeId> {
        if let Some(id) = self.g.by_name(name) {
            return Ok(id);
        }
        let t = self.w.get(name).ok_or_else(|| ModelError::MissingTensor { path: self.path.to_path_buf(), tensor: name.into(), arch: self.arch.into() })?;
        if t.shape != shape {
            return Err(self.terr(name, format!("shape {:?}, expected {shape:?} from the model's dims", t.shape)));
        }
        let ok = if matrix { !matches!(t.dtype, DType::I8 | DType::I32 | DType::I4) } else { matches!(t.dtype, DType::F32 | DType::F16 | DType::BF16) };
        if !ok {
            return Err(self.terr(name, format!("dtype {} cannot be used for a {}", t.dtype, if matrix { "weight matrix" } else { "norm weight or bias" })));
        }
        Ok(self.g.add(name, Op::Weight, &[], Some(TensorType::new(t.dtype, shape.iter().map(|&d| Dim::Const(d)))))?)
    }

    pub fn add(&mut self, name: impl Into<String>, op: Op, args: &[NodeId]) -> Result<NodeId> {
        Ok(self.g.add(name, op, args, None)?)
    }

    /// A node whose type is declared (reshape, and ops whose result type is not inferred).
    pub fn typed(&mut self, name: impl Into<String>, op: Op, args: &[NodeId], ty: TensorType) -> Result<NodeId> {
        Ok(self.g.add(name, op, args, Some(ty))?)
    }

    pub fn act(&self, shape: Vec<Dim>) -> TensorType {
        TensorType::new(self.activations, shape)
    }

    /// x @ W^T (+ bias): the checkpoint's [out, in] layout; x in 8 bits first where
    /// `precision.act_quant` names this weight's layer type.
    pub fn linear(&mut self, module: &str, x: NodeId, out: usize, inp: usize, bias: bool) -> Result<NodeId> {
        let wname = format!("{module}.weight");
        let w = self.weight(&wname, &[out, inp], true)?;
        let x = self.act_quant_input(x, &wname)?;
        let mut args = vec![x, w];
        if bias {
            args.push(self.weight(&format!("{module}.bias"), &[out], false)?);
        }
        self.add(module, Op::MatMul { transpose_b: true }, &args)
    }

    /// `x` as the matmul with weight `weight` reads it: rounded to 8 bits by an `act_quant`
    /// node (one per x, shared by every matmul reading it) where the policy says so.
    pub fn act_quant_input(&mut self, x: NodeId, weight: &str) -> Result<NodeId> {
        let Some((dtype, group)) = self.act_quant.filter(|_| self.act_quant_weights.contains(weight)) else { return Ok(x) };
        let name = format!("{}.act_quant", self.g.node(x).name);
        if let Some(id) = self.g.by_name(&name) {
            return Ok(id);
        }
        self.add(name, Op::ActQuant { dtype, group }, &[x])
    }

    /// The step inputs every builder's graph takes (see `llama`'s module docs).
    pub fn step_inputs(&mut self) -> Result<StepInputs> {
        let i32t = |s: Vec<Dim>| Some(TensorType::new(DType::I32, s));
        Ok(StepInputs {
            tokens: self.g.add("tokens", Op::Input, &[], i32t(dsc_ir::shape!["T"]))?,
            positions: self.g.add("positions", Op::Input, &[], i32t(dsc_ir::shape!["T"]))?,
            seq_ids: self.g.add("seq_ids", Op::Input, &[], i32t(dsc_ir::shape!["T"]))?,
            slots: self.g.add("slots", Op::Input, &[], i32t(dsc_ir::shape!["T"]))?,
            table: self.g.add("block_table", Op::Input, &[], i32t(dsc_ir::shape!["S", "MB"]))?,
            logit_rows: self.g.add("logit_rows", Op::Input, &[], i32t(dsc_ir::shape!["R"]))?,
        })
    }
}

pub(crate) struct StepInputs {
    pub tokens: NodeId,
    pub positions: NodeId,
    pub seq_ids: NodeId,
    pub slots: NodeId,
    pub table: NodeId,
    pub logit_rows: NodeId,
}
