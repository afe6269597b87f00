fn main() -> std::process::ExitCode {
    arfsnic::cli::main()
}
