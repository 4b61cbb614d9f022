//! An agent's temporary directories are its own: under `toolwall exec`, `/tmp`, `/var/tmp`,
//! `/dev/shm`, `/run/lock` and its user's `/run/user/<uid>` start empty and bounded, nothing of
//! the host's there is readable (nor its System V objects), and nothing the agent leaves there
//! reaches the host. A working directory under
//! `/tmp` is kept, and the agent's writes there are the host's; so are the Unix sockets
//! `exec.allow_unix` lists there, each by itself (not what lies beside it) and only by a path
//! without a symbolic link. The same agent is run first
//! without toolwall, as the same user in the same directory, to show each route works there.

use std::{
    os::unix::{fs::PermissionsExt, net::UnixListener},
    path::PathBuf,
    process::Command,
};

use toolwall_tests::{
    Daemon, is_root,
    session::{exec, outcome, shared_dir, text, without_toolwall_in, write_agent},
};

/// Reads the host's files, writes one file in each temporary directory and one in its working
/// directory; prints `NAME RESULT` (`ok` or the errno's name), its working directory and what
/// its `/tmp` holds.
const AGENT: &str = r##"
import errno, os, socket, subprocess, sys
host_file, runtime_file, tag, shm_id = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
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
for i, path in enumerate(sys.argv[5:]):
    outcome("listed%d" % i, lambda: socket.socket(socket.AF_UNIX).connect(path))
outcome("beside-listed", lambda: read(os.path.join(os.path.dirname(sys.argv[5]), "other")))
ipcs = subprocess.run(["ipcs", "-m"], capture_output=True, text=True).stdout.split()
print("host-shm", "visible" if shm_id in ipcs else "hidden")
st = os.statvfs("/tmp")
print("tmp-mib", st.f_blocks * st.f_frsize // (1024 * 1024))
print("cwd", os.getcwd())
print("tmp-holds", ",".join(sorted(os.listdir("/tmp"))))
"##;

/// Paths the test made on the host, removed on drop.
struct Made(Vec<PathBuf>);

impl Drop for Made {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = std::fs::remove_dir_all(path).or_else(|_| std::fs::remove_file(path));
        }
    }
}

/// Removes a System V shared memory segment on drop.
struct RemoveShm(String);

impl Drop for RemoveShm {
    fn drop(&mut self) {
        let _ = Command::new("ipcrm").args(["-m", &self.0]).output();
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
    std::fs::write(socket_dir.join("other"), "the service's\n").expect("other file");
    std::fs::set_permissions(
        socket_dir.join("other"),
        std::fs::Permissions::from_mode(0o644),
    )
    .expect("chmod");
    for path in &sockets {
        let listener = UnixListener::bind(path).expect("listen");
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                drop(stream);
            }
        });
    }
    // The listed socket's directory again, by a symbolic link: not kept (the link could be
    // turned to any directory of /tmp).
    let link = PathBuf::from(format!("/tmp/toolwall-link-{tag}"));
    std::os::unix::fs::symlink(&socket_dir, &link).expect("symlink");
    let linked = link.join("service.sock");
    let _link = Made(vec![link.clone()]);
    // A System V segment of the host's, any user's to attach.
    let ipcmk = Command::new("ipcmk")
        .args(["-M", "4096", "-p", "0666"])
        .output()
        .expect("ipcmk");
    let shm_id = String::from_utf8_lossy(&ipcmk.stdout)
        .split_whitespace()
        .last()
        .expect("shm id")
        .to_owned();
    let _shm = RemoveShm(shm_id.clone());
    let args: Vec<String> = [host_file.clone(), runtime_file.clone()]
        .iter()
        .map(|p| p.display().to_string())
        .chain([tag.clone(), shm_id.clone()])
        .chain(
            sockets
                .iter()
                .chain([&linked])
                .map(|p| p.display().to_string()),
        )
        .collect();

    let control = without_toolwall_in(&project, &agent, &args);
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
        "listed2",
        "beside-listed",
    ] {
        assert_eq!(
            outcome(&plain, name),
            "ok",
            "control: {name} works without toolwall\n{plain}{plain_err}"
        );
    }
    assert_eq!(outcome(&plain, "host-shm"), "visible", "control: {plain}");
    for path in &written {
        assert!(path.exists(), "control: {} written", path.display());
        std::fs::remove_file(path).expect("remove the control's file");
    }

    let daemon = Daemon::start(&format!(
        "exec:\n  tmp_size_mib: 64\n  allow_unix: [{:?}, {:?}, {:?}]\n",
        sockets[0], sockets[1], linked
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
        stderr.contains("private to the agent (empty, at most 64 MiB each, gone when it ends): /tmp, /var/tmp, /dev/shm, /run/lock, /run/user/65534"),
        "exec names the private directories: {stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "exec.allow_unix {} is not kept in the agent's private directory: its path holds a symbolic link",
            linked.display()
        )),
        "exec says what it did not keep: {stderr}"
    );
    for socket in &sockets {
        assert!(
            stderr.contains(&format!(
                "exec.allow_unix {} is kept in the agent's private directory as the socket it is now",
                socket.display()
            )),
            "exec says a kept socket is lost to the agent when its service makes it anew: {stderr}"
        );
    }
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
    assert_eq!(outcome(&stdout, "listed2"), "ENOENT", "{stdout}");
    assert_eq!(
        outcome(&stdout, "beside-listed"),
        "ENOENT",
        "a listed socket is kept by itself, not with its directory: {stdout}"
    );
    assert_eq!(outcome(&stdout, "host-shm"), "hidden", "{stdout}");
    assert_eq!(outcome(&stdout, "tmp-mib"), "64", "{stdout}");
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
