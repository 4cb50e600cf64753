//! What the ptxas tests share: finding ptxas (the wheel scripts/setup.sh installs; DSC_PTXAS
//! overrides) and running it on a PTX file.

use std::path::Path;
use std::process::Command;

pub fn ptxas() -> String {
    let out = Command::new("python3").args(["-c", "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13', 'bin', 'ptxas'))"]).output().expect("python3 runs");
    std::env::var("DSC_PTXAS").unwrap_or_else(|_| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// ptxas -v on `ptx` for `arch`: whether it assembled, and its log
pub fn assemble(ptxas: &str, arch: &str, ptx: &Path) -> (bool, String) {
    let o = Command::new(ptxas).args([&format!("-arch={arch}"), "-v", ptx.to_str().unwrap(), "-o", "/dev/null"]).output().unwrap();
    (o.status.success(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// Assemble every target's PTX of `m` (written into `dir`) and require that ptxas accepts it
/// without spills; returns ptxas's log per target, in `m.ptx`'s order.
#[allow(dead_code)]
pub fn assemble_without_spills(ptxas: &str, m: &dsc_codegen::CompiledModule, dir: &Path) -> Vec<String> {
    let mut logs = vec![];
    for (t, ptx) in &m.ptx {
        let f = dir.join(format!("{}.ptx", t.name()));
        std::fs::write(&f, ptx).unwrap();
        let (ok, log) = assemble(ptxas, t.name(), &f);
        assert!(ok, "ptxas rejected the kernels for {}:\n{log}", t.name());
        assert!(log.lines().filter(|l| l.contains("spill stores")).all(|l| l.contains("0 bytes spill stores")), "spills: {log}");
        logs.push(log);
    }
    logs
}

/// The body of kernel `name` in `ptx` (from its parameter list to its closing brace).
#[allow(dead_code)]
pub fn body<'a>(ptx: &'a str, name: &str) -> &'a str {
    let body = ptx.split(&format!(".entry {name}(")).nth(1).expect("the kernel is in the PTX");
    &body[..body.find("\n}").unwrap()]
}

/// Registers ptxas -v reported for kernel `name` in `log`.
#[allow(dead_code)]
pub fn registers(log: &str, name: &str) -> Option<u32> {
    let after = log.split(&format!("entry function '{name}'")).nth(1)?;
    let used = after.split("Used ").nth(1)?;
    used.split_whitespace().next()?.parse().ok()
}
