//! Graphviz export: one box per node (name, op, type), edges labelled by operand position
//! when an op has more than one operand.

use crate::Graph;
use std::fmt::Write;

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

pub fn to_dot(g: &Graph) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "digraph \"{}\" {{\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\", fontsize=10];", esc(&g.name));
    let order = g.topo_order().unwrap_or_else(|_| g.node_ids().collect());
    for id in &order {
        let n = g.node(*id);
        let (shape, color) = match n.op {
            crate::Op::Input => ("ellipse", "lightblue"),
            crate::Op::Weight => ("note", "lightyellow"),
            crate::Op::State => ("cylinder", "lightpink"),
            _ => ("box", "white"),
        };
        let _ = writeln!(s, "  n{} [label=\"{}\\n{} : {}\", shape={shape}, style=filled, fillcolor={color}];", id.index(), esc(&n.name), n.op.name(), esc(&n.ty.to_string()));
    }
    for id in &order {
        let ops = g.operands(*id);
        for (i, o) in ops.iter().enumerate() {
            if ops.len() > 1 {
                let _ = writeln!(s, "  n{} -> n{} [label=\"{i}\"];", o.index(), id.index());
            } else {
                let _ = writeln!(s, "  n{} -> n{};", o.index(), id.index());
            }
        }
    }
    for (name, id) in &g.outputs {
        let _ = writeln!(s, "  \"out:{0}\" [label=\"{0}\", shape=doublecircle];\n  n{1} -> \"out:{0}\";", esc(name), id.index());
    }
    s.push_str("}\n");
    s
}
