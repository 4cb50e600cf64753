//! `dsc-fuzz`: run the fuzz targets (see the library's docs).
//!
//! ```text
//! dsc-fuzz [--execs N] [--seed S] [--out DIR] [--mem-mb M] [TARGET ...]   # all targets by default
//! ```
//! Each target runs in a child process under an address-space limit (`ulimit -v`, M MiB,
//! default 4096), so an allocation abort or a crash is caught and counted; the input it died on
//! is read back from a shared file and kept in DIR (default `fuzz-out/`) with every panicking
//! input. Prints a line of counts per target and exits non-zero if any panicked or aborted.

use anyhow::Context;
use std::io::Write;
use std::path::{Path, PathBuf};

const SLOT: usize = (1 << 20) + 8;

fn worker(target: &str, execs: u64, seed: u64, slot: &Path, out: &Path) -> anyhow::Result<()> {
    let f = std::fs::OpenOptions::new().read(true).write(true).open(slot).context("slot file")?;
    // SAFETY: a file only this worker writes while it runs; the parent reads it after it exits.
    let mut map = unsafe { memmap2::MmapMut::map_mut(&f) }.context("map the slot file")?;
    let mut panics_kept = 0;
    let t0 = std::time::Instant::now();
    let c = dsc_fuzz::run(
        target,
        execs,
        seed,
        |input| {
            map[..8].copy_from_slice(&(input.len() as u64).to_le_bytes());
            map[8..8 + input.len()].copy_from_slice(input);
        },
        |input, msg| {
            if panics_kept < 20 {
                let p = out.join(format!("{target}-panic-{panics_kept}.bin"));
                let _ = std::fs::write(&p, input);
                eprintln!("{target}: panic ({msg}); input kept in {}", p.display());
                panics_kept += 1;
            }
        },
    );
    println!("{target}: {} execs, {} accepted, {} rejected, {} panics, 0 aborts, {:.1} s", c.execs, c.accepted, c.rejected, c.panics, t0.elapsed().as_secs_f64());
    std::io::stdout().flush()?;
    std::process::exit(if c.panics > 0 { 3 } else { 0 });
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut execs, mut seed, mut out, mut mem_mb, mut targets, mut work) = (1_000_000u64, 1u64, PathBuf::from("fuzz-out"), 4096u64, vec![], None);
    while let Some(a) = args.next() {
        let mut val = |what: &str| args.next().with_context(|| format!("{a} needs a {what}"));
        match a.as_str() {
            "--execs" => execs = val("count")?.parse()?,
            "--seed" => seed = val("number")?.parse()?,
            "--out" => out = PathBuf::from(val("folder")?),
            "--mem-mb" => mem_mb = val("size")?.parse()?,
            "--worker" => work = Some(PathBuf::from(val("slot file")?)),
            "-h" | "--help" => {
                println!("dsc-fuzz [--execs N] [--seed S] [--out DIR] [--mem-mb M] [TARGET ...]\ntargets: {}", dsc_fuzz::TARGETS.join(" "));
                return Ok(());
            }
            t if dsc_fuzz::TARGETS.contains(&t) => targets.push(t.to_string()),
            t => anyhow::bail!("unknown target or flag `{t}` (targets: {})", dsc_fuzz::TARGETS.join(" ")),
        }
    }
    std::fs::create_dir_all(&out)?;
    if let Some(slot) = work {
        anyhow::ensure!(targets.len() == 1, "--worker runs one target");
        return worker(&targets[0], execs, seed, &slot, &out);
    }
    if targets.is_empty() {
        targets = dsc_fuzz::TARGETS.iter().map(|s| s.to_string()).collect();
    }
    let me = std::env::current_exe()?;
    let mut bad = 0;
    for t in &targets {
        let slot = out.join(format!(".{t}.slot"));
        std::fs::File::create(&slot)?.set_len(SLOT as u64)?;
        let cmd = format!("ulimit -v {}; exec \"$0\" --worker \"$1\" --execs {execs} --seed {seed} --out \"$2\" {t}", mem_mb * 1024);
        let st = std::process::Command::new("sh").arg("-c").arg(cmd).arg(&me).arg(&slot).arg(&out).status()?;
        match st.code() {
            Some(0) => {}
            Some(3) => bad += 1,
            _ => {
                bad += 1;
                let m = std::fs::read(&slot)?;
                let n = (u64::from_le_bytes(m[..8].try_into()?) as usize).min(SLOT - 8);
                let p = out.join(format!("{t}-abort.bin"));
                std::fs::write(&p, &m[8..8 + n])?;
                println!("{t}: ABORT ({st}); the input it died on is in {}", p.display());
            }
        }
        let _ = std::fs::remove_file(&slot);
    }
    if bad > 0 {
        anyhow::bail!("{bad} target(s) panicked or aborted");
    }
    Ok(())
}
