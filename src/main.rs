//! The `suffixd` binary; everything lives in the library's `cli` module.

fn main() -> std::process::ExitCode {
    suffixd::cli::main()
}
