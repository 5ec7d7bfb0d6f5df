fn main() -> std::process::ExitCode {
    kvbench::cli::main()
}
