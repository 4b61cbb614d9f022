//! `toolwall config check FILE` and `toolwall config default`: let a person validate a file
//! before deploying it, and see the policy as toolwall will apply it (defaults filled in).

use std::{path::PathBuf, process::ExitCode};

use clap::{Args, Subcommand};

use crate::config::{Config, DEFAULT_YAML, describe};

/// Arguments of `toolwall config`.
#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: ConfigCommand,
}

/// `toolwall config` subcommands.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate a configuration file and print the effective policy (exit 1 if invalid).
    Check {
        /// The YAML file.
        file: PathBuf,
    },
    /// Print the embedded default configuration (a starting point for your own file).
    Default,
}

/// Runs `toolwall config …`.
pub(crate) fn run(args: ConfigArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        ConfigCommand::Default => {
            print!("{DEFAULT_YAML}");
            Ok(ExitCode::SUCCESS)
        }
        ConfigCommand::Check { file } => {
            let config = Config::load(Some(&file))?;
            // Compile the policy too (the deny patterns as one set, the name forms), so a
            // file that passes here also starts.
            let registry = crate::registry::Registry::in_memory()?;
            crate::policy::Policy::new(&config, std::sync::Arc::new(registry), &[])?;
            print!("{}", describe(&config));
            println!("\n{}: valid", file.display());
            Ok(ExitCode::SUCCESS)
        }
    }
}
