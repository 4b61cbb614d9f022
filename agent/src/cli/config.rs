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
            check_schemas(&config, &file)?;
            print!("{}", describe(&config));
            println!("\n{}: valid", file.display());
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Refuses an argument rule whose condition can never hold for any tool it selects whose
/// definition the registry (the configured database, if there is one) knows: a rule that
/// names a property no such tool has, or tests a value of the wrong type, is a mistake.
fn check_schemas(config: &Config, file: &std::path::Path) -> anyhow::Result<()> {
    let rules = &config.sandbox.mcp.argument_rules;
    let db = crate::config::default_store_path(config.store.path.as_deref());
    if rules.is_empty() || !db.exists() {
        return Ok(());
    }
    let registry = match crate::registry::Registry::open(&db) {
        Ok(r) => r,
        Err(error) => {
            eprintln!(
                "note: argument rules not checked against known tools ({}: {error})",
                db.display()
            );
            return Ok(());
        }
    };
    let tools = registry.tools();
    let source = std::fs::read_to_string(file).unwrap_or_default();
    for (i, rule) in rules.iter().enumerate() {
        let (server, tool) = (
            crate::policy::glob(&rule.server),
            crate::policy::glob(&rule.tool),
        );
        let selected: Vec<(String, String, serde_json::Value)> = tools
            .iter()
            .filter(|t| server.matches(&t.server_id) && tool.matches(&t.tool))
            .filter_map(|t| {
                let def = registry.definition(&t.server_id, &t.tool).ok()??;
                let schema = def.get("inputSchema")?.clone();
                Some((t.server_id.clone(), t.tool.clone(), schema))
            })
            .collect();
        if selected.is_empty() {
            continue;
        }
        for (j, condition) in rule.when.iter().enumerate() {
            let why: Vec<String> = selected
                .iter()
                .map_while(|(s, t, schema)| {
                    crate::policy::schema_mismatch(condition, schema)
                        .map(|why| format!("{s}/{t}: {why}"))
                })
                .collect();
            if why.len() == selected.len() {
                let line = source
                    .lines()
                    .position(|l| {
                        l.trim_start().trim_start_matches("- ").trim_start()
                            == format!("pointer: {}", condition.pointer)
                    })
                    .map(|n| format!(":{}", n + 1))
                    .unwrap_or_default();
                anyhow::bail!(
                    "{}{line}: sandbox.mcp.argument_rules[{i}].when[{j}] can never hold for the tools it selects ({}). Fix the pointer or the test, or narrow `server:`/`tool:`",
                    file.display(),
                    why.join("; ")
                );
            }
        }
    }
    Ok(())
}
