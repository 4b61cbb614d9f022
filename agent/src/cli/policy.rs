//! `toolwall policy keygen|sign|verify`: the publisher's side of signed policy bundles
//! (`config/bundle.rs`); hosts pull what these make (`policy.bundle`, `daemon/bundle.rs`).

use std::{io::Write as _, path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use clap::{Args, Subcommand};

use crate::config::bundle;

/// Arguments of `toolwall policy`.
#[derive(Debug, Args)]
pub struct PolicyArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: PolicyCommand,
}

/// `toolwall policy` subcommands.
#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Make a signing key pair: NAME.key (secret, mode 0600) and NAME.pub (the line hosts put
    /// in `policy.bundle.public_key`).
    Keygen {
        /// Path and name of the two files, without extension.
        name: PathBuf,
    },
    /// Sign a policy (a YAML file holding only `sandbox:`) as a bundle of this revision.
    Sign {
        /// The secret key file (`toolwall policy keygen`).
        #[arg(long)]
        key: PathBuf,
        /// The bundle's revision: a number greater than the last one published (hosts refuse
        /// an older one).
        #[arg(long)]
        revision: u64,
        /// Where to write the bundle (default: standard output).
        #[arg(long, short)]
        out: Option<PathBuf>,
        /// The policy file.
        file: PathBuf,
    },
    /// Check a bundle's signature and policy as a host would (exit 1 if it would be refused).
    Verify {
        /// The publisher's public key: the text `ed25519:…` or a file holding it.
        #[arg(long)]
        public_key: String,
        /// The bundle file.
        file: PathBuf,
    },
}

/// Runs `toolwall policy …`.
pub(crate) fn run(args: PolicyArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        PolicyCommand::Keygen { name } => {
            let (secret, public) = bundle::generate().context("read randomness")?;
            let key = name.with_extension("key");
            let pub_file = name.with_extension("pub");
            {
                use std::os::unix::fs::OpenOptionsExt as _;
                let mut file = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&key)
                    .with_context(|| {
                        format!(
                            "create {} (an existing key is never overwritten)",
                            key.display()
                        )
                    })?;
                file.write_all(secret.as_bytes())
                    .with_context(|| format!("write {}", key.display()))?;
            }
            std::fs::write(&pub_file, format!("{public}\n"))
                .with_context(|| format!("write {}", pub_file.display()))?;
            println!("secret key  {} (keep it off the hosts)", key.display());
            println!("public key  {} :", pub_file.display());
            println!("  policy:\n    bundle:\n      public_key: \"{public}\"");
            Ok(ExitCode::SUCCESS)
        }
        PolicyCommand::Sign {
            key,
            revision,
            out,
            file,
        } => {
            anyhow::ensure!(revision > 0, "--revision must be at least 1");
            let secret =
                std::fs::read_to_string(&key).with_context(|| format!("read {}", key.display()))?;
            let secret = bundle::secret_key(&secret)
                .map_err(|why| anyhow::anyhow!("{}: {why}", key.display()))?;
            let policy = std::fs::read_to_string(&file)
                .with_context(|| format!("read {}", file.display()))?;
            let signed = bundle::sign(&secret, revision, &policy)
                .with_context(|| format!("{} cannot be published", file.display()))?;
            let text = serde_json::to_string_pretty(&signed)? + "\n";
            match out {
                Some(out) => {
                    std::fs::write(&out, text)
                        .with_context(|| format!("write {}", out.display()))?;
                    eprintln!(
                        "{}: revision {revision}, signed by {}",
                        out.display(),
                        bundle::public_text(&secret.verifying_key())
                    );
                }
                None => print!("{text}"),
            }
            Ok(ExitCode::SUCCESS)
        }
        PolicyCommand::Verify { public_key, file } => {
            let text = if public_key.trim_start().starts_with("ed25519:") {
                public_key
            } else {
                std::fs::read_to_string(&public_key)
                    .with_context(|| format!("read the public key file {public_key}"))?
            };
            let key =
                bundle::public_key(&text).map_err(|why| anyhow::anyhow!("public key: {why}"))?;
            let bytes = std::fs::read(&file).with_context(|| format!("read {}", file.display()))?;
            match bundle::open(&bytes, &key) {
                Ok(verified) => {
                    print!("{}", crate::config::describe_policy(&verified.config));
                    println!(
                        "\n{}: revision {}, signature valid, policy valid",
                        file.display(),
                        verified.revision
                    );
                    Ok(ExitCode::SUCCESS)
                }
                Err(error) => {
                    eprintln!("{}: refused: {error}", file.display());
                    Ok(ExitCode::FAILURE)
                }
            }
        }
    }
}
