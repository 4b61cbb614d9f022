//! `exec.confine: strict`: Landlock on the agent, for hosts that want its files confined like
//! its network. The agent writes only to its working directory, the temporary directories and
//! what `exec.write` lists; it cannot read what `exec.secrets` lists (`~/.ssh`, `~/.aws`, …);
//! login files (`~/.profile`, `~/.bashrc`, …) stay readable and become unwritable; it cannot
//! reach an abstract Unix socket or signal a process made outside its Landlock domain.
//!
//! Landlock grants, it cannot subtract: "everything but `~/.ssh`" is granted as every entry
//! beside each secret's path, level by level ([`readable`]). Entries made later under those
//! levels are not granted: a secret created after the start stays unreadable.
//! `tests/tests/session_files.rs` shows each point against the same agent run without toolwall.

use std::{
    os::fd::OwnedFd,
    path::{Path, PathBuf},
};

use anyhow::Context;
use landlock::{
    ABI, Access, AccessFs, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreatedAttr, Scope,
};

/// The Landlock ABI strict needs (Linux 6.12): file system rights and the two scopes.
const ABI_NEEDED: ABI = ABI::V6;

/// Files a login shell or session reads and runs: code written there runs at the user's next
/// login, outside every session.
pub(crate) const LOGIN_FILES: [&str; 10] = [
    ".profile",
    ".bash_profile",
    ".bash_login",
    ".bashrc",
    ".bash_logout",
    ".zshenv",
    ".zprofile",
    ".zshrc",
    ".zlogin",
    ".pam_environment",
];

/// What the agent may write and may not read, as absolute paths.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Hierarchies it may write (and read): the working directory, the temporary directories,
    /// `exec.write`.
    pub write: Vec<PathBuf>,
    /// Paths it may not read (`exec.secrets`), those that exist.
    pub secrets: Vec<PathBuf>,
    /// The user's home, whose login files must stay unwritable.
    pub home: PathBuf,
}

/// `~/…` in the agent user's home, else the path as written.
pub(crate) fn expand(path: &str, home: &Path) -> PathBuf {
    match path.strip_prefix("~/") {
        Some(rest) => home.join(rest),
        None if path == "~" => home.to_path_buf(),
        None => PathBuf::from(path),
    }
}

impl Plan {
    /// The plan for an agent of `home` started in `cwd`; refuses a write hierarchy that holds a
    /// secret or a login file (Landlock could not keep them out of it).
    pub(crate) fn new(
        cwd: &Path,
        home: &Path,
        write: &[String],
        secrets: &[String],
    ) -> anyhow::Result<Plan> {
        let mut writable: Vec<PathBuf> = vec![cwd.to_path_buf()];
        writable.extend(
            ["/tmp", "/var/tmp", "/dev/shm", "/dev/pts"]
                .into_iter()
                .map(PathBuf::from),
        );
        writable.extend(write.iter().map(|w| expand(w, home)));
        let writable: Vec<PathBuf> = writable
            .into_iter()
            .filter_map(|p| p.canonicalize().ok())
            .collect();
        let secrets: Vec<PathBuf> = secrets
            .iter()
            .filter_map(|s| expand(s, home).canonicalize().ok())
            .collect();
        let home = home.canonicalize().unwrap_or_else(|_| home.to_path_buf());
        for dir in &writable {
            if let Some(secret) = secrets.iter().find(|s| s.starts_with(dir)) {
                anyhow::bail!(
                    "exec.confine strict: {} may be written and holds {}, which exec.secrets keeps unreadable; start the agent in a directory without secrets, or take it out of exec.write",
                    dir.display(),
                    secret.display()
                );
            }
            if let Some(login) = LOGIN_FILES
                .iter()
                .map(|f| home.join(f))
                .find(|f| f.starts_with(dir))
            {
                anyhow::bail!(
                    "exec.confine strict: {} may be written and holds the login file {}; start the agent in a project directory, not the home directory, and list no parent of it in exec.write",
                    dir.display(),
                    login.display()
                );
            }
        }
        Ok(Plan {
            write: writable,
            secrets,
            home,
        })
    }
}

/// What one rule grants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Grant {
    /// Read and run everything below.
    Read,
    /// List the directory only (its entries have rules of their own).
    List,
    /// Read and run this file.
    ReadFile,
    /// Everything below.
    Write,
}

/// Every entry under `dir` but the secrets: whole hierarchies where no secret lies below,
/// otherwise the directory's listing and each entry by itself. Symbolic links are skipped
/// (a rule on one would grant its target): what they point at is granted where it lies.
fn readable(dir: &Path, secrets: &[PathBuf], out: &mut Vec<(PathBuf, Grant)>) {
    if secrets.iter().any(|s| s == dir) {
        return;
    }
    if !secrets.iter().any(|s| s.starts_with(dir)) {
        out.push((dir.to_path_buf(), Grant::Read));
        return;
    }
    out.push((dir.to_path_buf(), Grant::List));
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_symlink() {
            continue;
        }
        if meta.is_dir() {
            readable(&path, secrets, out);
        } else if !secrets.iter().any(|s| s == &path) {
            out.push((path, Grant::ReadFile));
        }
    }
}

/// The rules of a plan, in the order they are added.
fn rules(plan: &Plan) -> Vec<(PathBuf, Grant)> {
    let mut out = Vec::new();
    readable(Path::new("/"), &plan.secrets, &mut out);
    out.extend(plan.write.iter().map(|w| (w.clone(), Grant::Write)));
    // Device files every program writes to.
    out.extend(
        [
            "/dev/null",
            "/dev/zero",
            "/dev/full",
            "/dev/tty",
            "/dev/ptmx",
        ]
        .into_iter()
        .map(|d| (PathBuf::from(d), Grant::Write)),
    );
    out
}

/// Builds the Landlock ruleset for `plan` (before the fork: it allocates); the child applies it
/// with `landlock_restrict_self` ([`super::confine_on_spawn`]). `private`: the roots of the
/// agent's private temporary directories ([`super::private`]), writable like the host's ones
/// they cover. Errors when this kernel lacks Landlock ABI 6.
pub(crate) fn ruleset<'a>(
    plan: &Plan,
    private: impl Iterator<Item = std::os::fd::BorrowedFd<'a>>,
) -> anyhow::Result<OwnedFd> {
    let all = AccessFs::from_all(ABI_NEEDED);
    let mut created = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(all)
        .and_then(|r| r.scope(Scope::AbstractUnixSocket | Scope::Signal))
        .and_then(|r| r.create())
        .context(
            "exec.confine strict needs Landlock ABI 6 (Linux 6.12 with landlock among the LSMs)",
        )?;
    for (path, grant) in rules(plan) {
        let Ok(fd) = PathFd::new(&path) else {
            continue; // gone since it was listed, or never there (/dev/tty without a terminal)
        };
        let is_dir = std::fs::metadata(&path)
            .map(|m| m.is_dir())
            .unwrap_or(false);
        let file_rights = AccessFs::from_file(ABI_NEEDED);
        let rights: BitFlags<AccessFs> = match grant {
            Grant::Read if is_dir => AccessFs::from_read(ABI_NEEDED),
            Grant::Read | Grant::ReadFile => AccessFs::from_read(ABI_NEEDED) & file_rights,
            Grant::List => AccessFs::ReadDir.into(),
            Grant::Write if is_dir => all,
            Grant::Write => all & file_rights,
        };
        created = created
            .add_rule(PathBeneath::new(fd, rights))
            .with_context(|| format!("exec.confine strict: a rule on {}", path.display()))?;
    }
    for root in private {
        created = created
            .add_rule(PathBeneath::new(root, all))
            .context("exec.confine strict: a rule on a private temporary directory")?;
    }
    let fd: Option<OwnedFd> = created.into();
    fd.context("exec.confine strict: Landlock gave no ruleset")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn everything_is_readable_but_the_secrets_and_their_levels_only_list() {
        let home = tempfile::tempdir().unwrap();
        let h = home.path();
        std::fs::create_dir_all(h.join(".ssh")).unwrap();
        std::fs::write(h.join(".ssh/id_ed25519"), "key").unwrap();
        std::fs::create_dir_all(h.join(".config/gh")).unwrap();
        std::fs::create_dir_all(h.join(".config/other")).unwrap();
        std::fs::write(h.join(".profile"), "").unwrap();
        std::os::unix::fs::symlink(h.join(".ssh"), h.join("keys")).unwrap();
        let secrets = vec![h.join(".ssh"), h.join(".config/gh")];
        let mut out = Vec::new();
        readable(h, &secrets, &mut out);
        let grant = |p: &Path| out.iter().find(|(q, _)| q == p).map(|(_, g)| *g);
        assert_eq!(grant(h), Some(Grant::List));
        assert_eq!(grant(&h.join(".config")), Some(Grant::List));
        assert_eq!(grant(&h.join(".config/other")), Some(Grant::Read));
        assert_eq!(grant(&h.join(".profile")), Some(Grant::ReadFile));
        for hidden in [".ssh", ".ssh/id_ed25519", ".config/gh", "keys"] {
            assert_eq!(grant(&h.join(hidden)), None, "{hidden}");
        }
    }

    #[test]
    fn a_writable_directory_holding_a_secret_or_a_login_file_is_refused() {
        // Not under /tmp, which is writable under strict and would hold the home.
        let home = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let h = home.path();
        std::fs::create_dir_all(h.join(".ssh")).unwrap();
        std::fs::create_dir_all(h.join("project")).unwrap();
        std::fs::write(h.join(".profile"), "").unwrap();
        let secrets = ["~/.ssh".to_owned()];
        let error = Plan::new(h, h, &[], &secrets).unwrap_err().to_string();
        assert!(error.contains(".ssh"), "{error}");
        let no_secrets: [String; 0] = [];
        let error = Plan::new(h, h, &[], &no_secrets).unwrap_err().to_string();
        assert!(error.contains(".profile"), "{error}");
        let plan = Plan::new(&h.join("project"), h, &[], &secrets).unwrap();
        assert!(
            plan.write
                .contains(&h.join("project").canonicalize().unwrap())
        );
        assert_eq!(plan.secrets, vec![h.join(".ssh").canonicalize().unwrap()]);
    }
}
