//! Dead-code elimination: keep what the outputs need, plus every cache write (a write into
//! persistent state is an effect even when no output reads it in this step).

use crate::{Pass, PassError};
use dsc_ir::{Graph, Op};
use std::collections::HashSet;

pub struct Dce;

impl Pass for Dce {
    fn name(&self) -> &'static str {
        "dce"
    }

    fn run(&self, mut g: Graph) -> Result<(Graph, String), PassError> {
        let mut live = HashSet::new();
        let mut stack: Vec<_> = g.outputs.iter().map(|(_, id)| *id).collect();
        stack.extend(g.node_ids().filter(|&n| g.node(n).op.writes_state()));
        while let Some(n) = stack.pop() {
            if live.insert(n) {
                stack.extend(g.operands(n));
            }
        }
        // graph inputs stay: they are the step's calling convention
        let dead: Vec<_> = g.node_ids().filter(|n| !live.contains(n) && !matches!(g.node(*n).op, Op::Input)).collect();
        for &n in &dead {
            g.remove(n);
        }
        Ok((g, format!("removed {} dead nodes", dead.len())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsc_ir::{text, DType, Executor, Tensor};
    use std::collections::{BTreeMap, HashMap};

    #[test]
    fn removes_unused_nodes_and_keeps_semantics() {
        let src = r#"graph "t" {
  %x = input : f32[T, 4]
  %w = weight : f32[4, 4]
  %unused = exp(%x) : f32[T, 4]
  %unused2 = neg(%unused) : f32[T, 4]
  %y = matmul(%x, %w) {transpose_b = false} : f32[T, 4]
  %z = add(%y, %x) : f32[T, 4]
  output z = %z
}
"#;
        let g = text::parse(src).unwrap();
        let (g2, note) = Dce.run(g.clone()).unwrap();
        assert_eq!(note, "removed 2 dead nodes");
        assert!(g2.by_name("unused").is_none() && g2.by_name("unused2").is_none());
        g2.verify().unwrap();
        let w: HashMap<String, (DType, Vec<usize>, Vec<u8>)> = HashMap::from([("w".to_string(), (DType::F32, vec![4, 4], (0..16).flat_map(|i| ((i as f32) * 0.1 - 0.7).to_le_bytes()).collect()))]);
        let x = Tensor::new(vec![3, 4], (0..12).map(|i| (i as f32).sin()).collect());
        let inputs = BTreeMap::from([("x".to_string(), x)]);
        let a = Executor::new(&g, &w, BTreeMap::new()).unwrap().run(&inputs).unwrap();
        let b = Executor::new(&g2, &w, BTreeMap::new()).unwrap().run(&inputs).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn keeps_cache_writes() {
        let src = r#"graph "t" {
  %k = input : f32[T, 1, 2]
  %slot = input : i32[T]
  %cache = state : f32[NB, 4, 1, 2]
  %w = cache_write(%cache, %k, %slot) : f32[NB, 4, 1, 2]
  %o = neg(%k) : f32[T, 1, 2]
  output o = %o
}
"#;
        let (g2, _) = Dce.run(text::parse(src).unwrap()).unwrap();
        assert!(g2.by_name("w").is_some() && g2.by_name("cache").is_some());
    }
}
