//! The `toolwall` binary: parses the command line and hands over to the library.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = toolwall::Cli::parse();
    toolwall::main(cli)
}
