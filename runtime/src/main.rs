//! `dsc-runtime`: the runtime-only binary (no LLVM/MLIR). Runs and inspects compiled plans.

use clap::{Parser, Subcommand};
use dsc_runtime::cli;

#[derive(Parser)]
#[command(name = "dsc-runtime", version, about = "Run compiled dsc plans (runtime only; compile with `dsc compile`)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate text from a prompt
    Run(cli::RunArgs),
    /// Print what a plan holds
    Inspect(cli::InspectArgs),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).with_writer(std::io::stderr).init();
    match Cli::parse().cmd {
        Cmd::Run(a) => cli::run(&a),
        Cmd::Inspect(a) => cli::inspect(&a),
    }
}
