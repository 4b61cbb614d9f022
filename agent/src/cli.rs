//! Command line.
use clap::Parser;
#[derive(Parser)]
pub struct Cli {}
pub fn main(_c: Cli) -> std::process::ExitCode {
    std::process::ExitCode::SUCCESS
}
