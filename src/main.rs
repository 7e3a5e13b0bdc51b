//! The `payrecon` command.

fn main() -> std::process::ExitCode {
    payrecon::cli::main()
}
