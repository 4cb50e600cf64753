//! The text format: one statement per line, in topological order.
//!
//! ```text
//! graph "tiny" {
//!   %tokens = input : i32[T]
//!   %emb.weight = weight : f32[100, 8]
//!   %x = gather(%emb.weight, %tokens) : f32[T, 8]
//!   %y = rms_norm(%x, %norm.weight) {eps = 1e-5} : f32[T, 8]
//!   output hidden = %y
//! }
//! ```
//! `print` and `parse` round-trip: `parse(print(g))` prints identically.

use crate::op::Attr;
use crate::{DType, Dim, Graph, IrError, Op, Result, TensorType};
use std::fmt::Write;

fn is_name_char(c: char) -> bool {
    !c.is_whitespace() && !"(),={}[]:\"%".contains(c)
}

fn fmt_attr(a: &Attr) -> String {
    match a {
        Attr::Int(i) => i.to_string(),
        Attr::Float(f) => {
            let s = format!("{f:?}");
            s
        }
        Attr::Bool(b) => b.to_string(),
        Attr::Ident(s) => s.clone(),
        Attr::Ints(v) => format!("[{}]", v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")),
    }
}

/// Print a graph in the text format (stable order: topological, oldest first).
pub fn print(g: &Graph) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "graph {:?} {{", g.name);
    let order = match g.topo_order() {
        Ok(o) => o,
        Err(_) => g.node_ids().collect(),
    };
    for id in order {
        let n = g.node(id);
        let _ = write!(s, "  %{} = {}", n.name, n.op.name());
        let ops = g.operands(id);
        if !n.op.is_leaf() {
            let args: Vec<String> = ops.iter().map(|&o| format!("%{}", g.node(o).name)).collect();
            let _ = write!(s, "({})", args.join(", "));
        }
        let attrs = n.op.attrs();
        if !attrs.is_empty() {
            let a: Vec<String> = attrs.iter().map(|(k, v)| format!("{k} = {}", fmt_attr(v))).collect();
            let _ = write!(s, " {{{}}}", a.join(", "));
        }
        let _ = writeln!(s, " : {}", n.ty);
    }
    for (name, id) in &g.outputs {
        let _ = writeln!(s, "  output {name} = %{}", g.node(*id).name);
    }
    s.push_str("}\n");
    s
}

struct Cursor<'a> {
    s: &'a str,
    pos: usize,
    line: usize,
}

impl<'a> Cursor<'a> {
    fn err<T>(&self, msg: impl Into<String>) -> Result<T> {
        Err(IrError::Parse { line: self.line, msg: format!("{} (at column {})", msg.into(), self.pos + 1) })
    }
    fn ws(&mut self) {
        while let Some(c) = self.s[self.pos..].chars().next() {
            if c.is_whitespace() {
                self.pos += c.len_utf8();
            } else {
                break;
            }
        }
    }
    fn peek(&mut self) -> Option<char> {
        self.ws();
        self.s[self.pos..].chars().next()
    }
    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.pos += c.len_utf8();
            true
        } else {
            false
        }
    }
    fn expect(&mut self, c: char) -> Result<()> {
        if self.eat(c) {
            Ok(())
        } else {
            let got = self.peek().map(|c| format!("`{c}`")).unwrap_or_else(|| "end of line".into());
            self.err(format!("expected `{c}`, found {got}"))
        }
    }
    fn word(&mut self) -> Result<&'a str> {
        self.ws();
        let start = self.pos;
        while let Some(c) = self.s[self.pos..].chars().next() {
            if is_name_char(c) {
                self.pos += c.len_utf8();
            } else {
                break;
            }
        }
        if self.pos == start {
            return self.err("expected a name");
        }
        Ok(&self.s[start..self.pos])
    }
    fn at_end(&mut self) -> bool {
        self.peek().is_none()
    }
}

fn parse_type(c: &mut Cursor) -> Result<TensorType> {
    let dt = c.word()?;
    let dtype: DType = dt.parse().or_else(|e: String| c.err(e))?;
    c.expect('[')?;
    let mut shape = vec![];
    if !c.eat(']') {
        loop {
            let w = c.word()?;
            shape.push(match w.parse::<usize>() {
                Ok(v) => Dim::Const(v),
                Err(_) if w.chars().next().is_some_and(|ch| ch.is_ascii_alphabetic() || ch == '_') => Dim::Sym(w.to_string()),
                Err(_) => return c.err(format!("bad dimension `{w}`")),
            });
            if c.eat(']') {
                break;
            }
            c.expect(',')?;
        }
    }
    Ok(TensorType::new(dtype, shape))
}

fn parse_attr(c: &mut Cursor) -> Result<Attr> {
    if c.eat('[') {
        let mut v = vec![];
        if !c.eat(']') {
            loop {
                let w = c.word()?;
                v.push(w.parse::<i64>().or_else(|_| c.err(format!("expected an integer, found `{w}`")))?);
                if c.eat(']') {
                    break;
                }
                c.expect(',')?;
            }
        }
        return Ok(Attr::Ints(v));
    }
    let w = c.word()?;
    Ok(match w {
        "true" => Attr::Bool(true),
        "false" => Attr::Bool(false),
        _ => {
            if let Ok(i) = w.parse::<i64>() {
                Attr::Int(i)
            } else if let Ok(f) = w.parse::<f32>() {
                Attr::Float(f)
            } else {
                Attr::Ident(w.to_string())
            }
        }
    })
}

/// Parse the text format. The result is verified.
pub fn parse(text: &str) -> Result<Graph> {
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l)).filter(|(_, l)| {
        let t = l.trim();
        !t.is_empty() && !t.starts_with(';')
    });
    let (hl, header) = lines.next().ok_or(IrError::Parse { line: 1, msg: "empty input: expected `graph \"name\" {`".into() })?;
    let header = header.trim();
    let name = header
        .strip_prefix("graph ")
        .and_then(|r| r.strip_suffix('{'))
        .map(str::trim)
        .and_then(|q| q.strip_prefix('"').and_then(|q| q.strip_suffix('"')))
        .ok_or(IrError::Parse { line: hl, msg: format!("expected `graph \"name\" {{`, found `{header}`") })?;
    let mut g = Graph::new(name.replace("\\\"", "\""));
    let mut closed = false;
    for (ln, line) in lines {
        if closed {
            return Err(IrError::Parse { line: ln, msg: "text after the closing `}`".into() });
        }
        let mut c = Cursor { s: line, pos: 0, line: ln };
        if c.eat('}') {
            if !c.at_end() {
                return c.err("unexpected text after `}`");
            }
            closed = true;
            continue;
        }
        if c.peek() == Some('o') {
            let kw = c.word()?;
            if kw != "output" {
                return c.err(format!("expected `%name = ...` or `output`, found `{kw}`"));
            }
            let oname = c.word()?.to_string();
            c.expect('=')?;
            c.expect('%')?;
            let v = c.word()?;
            let id = g.by_name(v).ok_or(IrError::Parse { line: ln, msg: format!("output refers to unknown value `%{v}`") })?;
            g.set_output(oname, id);
            if !c.at_end() {
                return c.err("unexpected text after output");
            }
            continue;
        }
        c.expect('%')?;
        let nname = c.word()?.to_string();
        c.expect('=')?;
        let opname = c.word()?.to_string();
        let mut args = vec![];
        if c.eat('(') {
            if !c.eat(')') {
                loop {
                    c.expect('%')?;
                    let a = c.word()?;
                    args.push(g.by_name(a).ok_or(IrError::Parse { line: ln, msg: format!("use of undefined value `%{a}`") })?);
                    if c.eat(')') {
                        break;
                    }
                    c.expect(',')?;
                }
            }
        }
        let mut attrs = vec![];
        if c.eat('{') {
            if !c.eat('}') {
                loop {
                    let k = c.word()?.to_string();
                    c.expect('=')?;
                    attrs.push((k, parse_attr(&mut c)?));
                    if c.eat('}') {
                        break;
                    }
                    c.expect(',')?;
                }
            }
        }
        c.expect(':')?;
        let ty = parse_type(&mut c)?;
        if !c.at_end() {
            return c.err("unexpected text after the type");
        }
        let op = Op::from_parts(&opname, &attrs).map_err(|msg| IrError::Parse { line: ln, msg })?;
        let id = g.add(nname, op, &args, Some(ty.clone())).map_err(|e| IrError::Parse { line: ln, msg: e.to_string() })?;
        if g.node(id).ty != ty {
            return Err(IrError::Parse { line: ln, msg: format!("declared type {ty} but operands give {}", g.node(id).ty) });
        }
    }
    if !closed {
        return Err(IrError::Parse { line: text.lines().count(), msg: "missing closing `}`".into() });
    }
    g.verify()?;
    Ok(g)
}
