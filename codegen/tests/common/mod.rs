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
