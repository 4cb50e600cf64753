//! Text filetests for the passes: each `filetests/*.ir` holds a `// RUN: <pass>` line, the
//! input graph, then `// EXPECT:` and the exact graph the pass must produce (and optional
//! `// CHECK-NOT: text` lines that must not appear in it). `DSC_BLESS=1 cargo test -p
//! dsc-passes --test filetests` rewrites every EXPECT section from the current output (review
//! the diff before committing).

use dsc_ir::text;
use dsc_passes::{Dce, Optimize, Pass, TensorParallel};
use std::path::Path;

fn pass(spec: &str) -> Box<dyn Pass> {
    let mut it = spec.split_whitespace();
    match (it.next(), it.next()) {
        (Some("dce"), _) => Box::new(Dce),
        // `optimize [rule=on|off ...]`
        (Some("optimize"), first) => {
            let mut o = Optimize::default();
            for r in first.into_iter().chain(it) {
                let (name, on) = r.split_once('=').expect("rule=on|off");
                o.set_rule(name, on == "on").expect("known rule");
            }
            Box::new(o)
        }
        (Some("tensor_parallel"), Some(w)) => Box::new(TensorParallel { world: w.parse().expect("world size") }),
        _ => panic!("unknown pass `{spec}`"),
    }
}

fn run_file(path: &Path, bless: bool) -> Result<(), String> {
    let src = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let (head, expect) = src.split_once("// EXPECT:\n").ok_or("no `// EXPECT:` line")?;
    let spec = head.lines().find_map(|l| l.strip_prefix("// RUN: ")).ok_or("no `// RUN:` line")?;
    let not: Vec<&str> = head.lines().filter_map(|l| l.strip_prefix("// CHECK-NOT: ")).collect();
    let input: String = head.lines().filter(|l| !l.starts_with("//")).map(|l| format!("{l}\n")).collect();
    let g = text::parse(&input).map_err(|e| format!("input: {e}"))?;
    let (out, note) = pass(spec).run(g).map_err(|e| e.to_string())?;
    out.verify().map_err(|e| format!("output does not verify: {e}"))?;
    let got = text::print(&out);
    for n in &not {
        if got.contains(n) {
            return Err(format!("output contains `{n}`:\n{got}"));
        }
    }
    if bless {
        std::fs::write(path, format!("{head}// EXPECT:\n{got}")).map_err(|e| e.to_string())?;
        return Ok(());
    }
    if got != expect {
        return Err(format!("output differs from EXPECT ({note}); DSC_BLESS=1 to accept\n--- got ---\n{got}--- expected ---\n{expect}"));
    }
    Ok(())
}

#[test]
fn filetests() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/filetests");
    let bless = std::env::var_os("DSC_BLESS").is_some();
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "ir")).collect();
    files.sort();
    assert!(files.len() >= 4, "filetests missing in {}", dir.display());
    let failures: Vec<String> = files.iter().filter_map(|f| run_file(f, bless).err().map(|e| format!("{}: {e}", f.display()))).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
