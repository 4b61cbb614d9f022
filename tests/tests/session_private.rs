//! An agent's temporary directories are its own: under `toolwall exec`, `/tmp`, `/var/tmp`,
//! `/dev/shm` and its user's `/run/user/<uid>` start empty, nothing of the host's there is
//! readable, and nothing the agent leaves there reaches the host. A working directory under
//! `/tmp` is kept, and the agent's writes there are the host's; so are the Unix sockets
//! `exec.allow_unix` lists there, alone in `/tmp` or with their directory. The same agent is run first
//! without toolwall, as the same user in the same directory, to show each route works there.

use std::{
    os::unix::{fs::PermissionsExt, net::UnixListener},
    path::PathBuf,
    process::Command,
};

use toolwall_tests::{
    Daemon, is_root,
    session::{exec, shared_dir, text, write_agent},
};

/// Reads the host's files, writes one file in each temporary directory and one in its working
/// directory; prints `NAME RESULT` (`ok` or the errno's name), its working directory and what
/// its `/tmp` holds.
const AGENT: &str = r##"
import errno, os, socket, sys
host_file, runtime_file, tag = sys.argv[1], sys.argv[2], sys.argv[3]
def outcome(name, f):
    try:
        f()
        print(name, "ok", flush=True)
    except OSError as e:
        print(name, errno.errorcode.get(e.errno, str(e.errno)), flush=True)
def read(path):
    with open(path) as f:
        f.read()
def write(path):
    with open(path, "a") as f:
        f.write("written by the agent\n")
outcome("host-tmp", lambda: read(host_file))
outcome("runtime", lambda: read(runtime_file))
for d in ["/tmp", "/var/tmp", "/dev/shm"]:
    outcome("write" + d, lambda: write(os.path.join(d, "agent-" + tag)))
outcome("project", lambda: write(os.path.join(os.getcwd(), "notes.txt")))
for i, path in enumerate(sys.argv[4:]):
    outcome("listed%d" % i, lambda: socket.socket(socket.AF_UNIX).connect(path))
print("cwd", os.getcwd())
print("tmp-holds", ",".join(sorted(os.listdir("/tmp"))))
"##;

fn outcome(stdout: &str, name: &str) -> String {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no {name:?} in:\n{stdout}"))
        .to_owned()
}

/// Paths the test made on the host, removed on drop.
struct Made(Vec<PathBuf>);

impl Drop for Made {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = std::fs::remove_dir_all(path).or_else(|_| std::fs::remove_file(path));
        }
    }
}

fn open_dir(path: &std::path::Path) {
    std::fs::create_dir_all(path).expect("mkdir");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).expect("chmod");
}

#[test]
#[ignore = "privileged: needs root (mount namespaces, BPF); `cargo xtask test` runs it as root"]
fn privileged_an_agent_gets_temporary_directories_of_its_own() {
    assert!(is_root());
    let tag = std::process::id().to_string();
    let scripts = shared_dir();
    let agent = write_agent(scripts.path(), "agent.py", AGENT);
    // The host's: a file in /tmp any user may read, and nobody's runtime directory with a key.
    let host_file = PathBuf::from(format!("/tmp/toolwall-host-{tag}"));
    let top = PathBuf::from(format!("/tmp/toolwall-project-{tag}"));
    let project = top.join("a/work");
    let runtime = PathBuf::from("/run/user/65534");
    assert!(
        !runtime.exists(),
        "{} exists: the test makes it",
        runtime.display()
    );
    let written: Vec<PathBuf> = ["/tmp", "/var/tmp", "/dev/shm"]
        .iter()
        .map(|d| PathBuf::from(format!("{d}/agent-{tag}")))
        .collect();
    let _made = Made(
        [host_file.clone(), top.clone(), runtime.clone()]
            .into_iter()
            .chain(written.iter().cloned())
            .collect(),
    );
    std::fs::write(&host_file, "the host's\n").expect("host file");
    std::fs::set_permissions(&host_file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    for dir in [&top, &top.join("a"), &project] {
        open_dir(dir);
    }
    std::fs::create_dir_all(&runtime).expect("runtime dir");
    let runtime_file = runtime.join("key");
    std::fs::write(&runtime_file, "a session key\n").expect("runtime key");
    let chown = Command::new("chown")
        .args(["-R", "nobody:nogroup"])
        .arg(&runtime)
        .output()
        .expect("chown");
    assert!(chown.status.success(), "chown: {chown:?}");
    std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    // Listed Unix sockets under /tmp: one in a directory of its own, one in /tmp itself.
    let socket_dir = PathBuf::from(format!("/tmp/toolwall-sockets-{tag}"));
    open_dir(&socket_dir);
    let sockets = [
        socket_dir.join("service.sock"),
        PathBuf::from(format!("/tmp/toolwall-service-{tag}.sock")),
    ];
    let _sockets = Made(
        sockets
            .iter()
            .cloned()
            .chain([socket_dir.clone()])
            .collect(),
    );
    for path in &sockets {
        let listener = UnixListener::bind(path).expect("listen");
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                drop(stream);
            }
        });
    }
    let args: Vec<String> = [host_file.clone(), runtime_file.clone()]
        .iter()
        .map(|p| p.display().to_string())
        .chain([tag.clone()])
        .chain(sockets.iter().map(|p| p.display().to_string()))
        .collect();

    let control = Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
        .arg("/usr/bin/python3")
        .arg(&agent)
        .args(&args)
        .current_dir(&project)
        .output()
        .expect("control");
    let (plain, plain_err) = text(&control);
    for name in [
        "host-tmp",
        "runtime",
        "write/tmp",
        "write/var/tmp",
        "write/dev/shm",
        "project",
        "listed0",
        "listed1",
    ] {
        assert_eq!(
            outcome(&plain, name),
            "ok",
            "control: {name} works without toolwall\n{plain}{plain_err}"
        );
    }
    for path in &written {
        assert!(path.exists(), "control: {} written", path.display());
        std::fs::remove_file(path).expect("remove the control's file");
    }

    let daemon = Daemon::start(&format!(
        "exec:\n  allow_unix: [{:?}, {:?}]\n",
        sockets[0], sockets[1]
    ));
    let out = exec(
        &daemon,
        &["--user", "nobody", "--session", "private"],
        &agent,
        &args,
    )
    .current_dir(&project)
    .output()
    .expect("exec");
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "exec failed: {stderr}\n{stdout}");
    assert!(
        stderr.contains("private to the agent (empty, gone when it ends): /tmp, /var/tmp, /dev/shm, /run/user/65534"),
        "exec names the private directories: {stderr}"
    );
    assert_eq!(outcome(&stdout, "host-tmp"), "ENOENT", "{stdout}");
    assert_eq!(outcome(&stdout, "runtime"), "ENOENT", "{stdout}");
    for name in [
        "write/tmp",
        "write/var/tmp",
        "write/dev/shm",
        "project",
        "listed0",
        "listed1",
    ] {
        assert_eq!(outcome(&stdout, name), "ok", "{name}: {stdout}");
    }
    assert_eq!(outcome(&stdout, "cwd"), project.display().to_string());
    assert_eq!(
        outcome(&stdout, "tmp-holds"),
        format!(
            "agent-{tag},toolwall-project-{tag},toolwall-service-{tag}.sock,toolwall-sockets-{tag}"
        ),
        "the agent's /tmp holds what it wrote and what it was given only"
    );
    for path in &written {
        assert!(
            !path.exists(),
            "{} reached the host from the agent's private directory",
            path.display()
        );
    }
    assert_eq!(
        std::fs::read_to_string(project.join("notes.txt")).expect("notes"),
        "written by the agent\n".repeat(2),
        "the agent's writes in its working directory are the host's"
    );
}
