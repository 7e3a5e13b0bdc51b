//! `payrecon bench …`: runs the `payrecon-bench` binary, which is built on its own
//! (`cargo build --release -p payrecon-bench`) so that the benchmarks and their fake nodes stay
//! out of this one.

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::Context;

/// The benchmark binary's name, looked for beside this executable and then on `PATH`.
const BENCH_BINARY: &str = "payrecon-bench";

/// Runs `payrecon-bench` with `args` (and `--json` when given) and exits with its status.
/// The benchmarks write only to a scratch database of their own (`--scratch-database`), so the
/// configured `--database-url` is refused rather than silently ignored.
pub(super) fn run(
    args: Vec<OsString>,
    database_url: Option<&str>,
    json: bool,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        database_url.is_none(),
        "the benchmarks write rows of their own: give an empty scratch database with `payrecon bench <workload> --scratch-database URL`, not --database-url"
    );
    let binary = beside_this_executable()
        .filter(|path| path.is_file())
        .unwrap_or_else(|| PathBuf::from(BENCH_BINARY));
    let mut command = std::process::Command::new(&binary);
    command.args(&args);
    if json {
        command.arg("--json");
    }
    let status = command.status().with_context(|| {
        format!(
            "cannot run {BENCH_BINARY}: the benchmarks are a binary of their own; build it with `cargo build --release -p payrecon-bench`"
        )
    })?;
    std::process::exit(status.code().unwrap_or(1));
}

fn beside_this_executable() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    Some(exe.with_file_name(format!("{BENCH_BINARY}{}", std::env::consts::EXE_SUFFIX)))
}
