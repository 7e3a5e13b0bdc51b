//! The `payrecon` command: a thin shell over the library's public API.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
