//! `exec.confine: strict`: an agent run as a real login user cannot write its login files, read
//! its keys, or reach an abstract Unix socket made outside its session, and still writes its
//! project and the temporary directories. The same agent is run first without toolwall, as the
//! same user in the same directory, to show each route works there.

use std::{
    os::unix::{fs::PermissionsExt, net::UnixListener},
    process::Command,
};

use toolwall_tests::{
    Daemon, is_root,
    session::{LoginUser, outcome, text, write_agent},
    toolwall_bin,
};

/// Tries each route and prints `NAME RESULT` (`ok` or the errno's name).
const AGENT: &str = r##"
import errno, os, socket, sys
home, abstract = sys.argv[1], sys.argv[2]
def outcome(name, f):
    try:
        f()
        print(name, "ok", flush=True)
    except OSError as e:
        print(name, errno.errorcode.get(e.errno, str(e.errno)), flush=True)
def append(path):
    with open(path, "a") as f:
        f.write("# written by the agent\n")
def read(path):
    with open(path) as f:
        f.read()
def abstract_connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect("\0" + abstract)
    finally:
        s.close()
outcome("profile", lambda: append(os.path.join(home, ".profile")))
outcome("bashrc-read", lambda: read(os.path.join(home, ".bashrc")))
outcome("key", lambda: read(os.path.join(home, ".ssh", "id_ed25519")))
outcome("project", lambda: append(os.path.join(os.getcwd(), "notes.txt")))
outcome("tmp", lambda: append("/tmp/%s-%d" % (os.path.basename(home), os.getpid())))
outcome("abstract", abstract_connect)
"##;

#[test]
#[ignore = "privileged: needs root (a login user, Landlock, BPF); `cargo xtask test` runs it as root"]
fn privileged_strict_keeps_login_files_and_keys_from_the_agent() {
    assert!(is_root());
    let user = LoginUser::create();
    let home = &user.home;
    std::fs::write(home.join(".bashrc"), "# the user's\n").expect("bashrc");
    std::fs::write(home.join(".profile"), "# the user's\n").expect("profile");
    std::fs::create_dir_all(home.join(".ssh")).expect("ssh dir");
    std::fs::write(home.join(".ssh/id_ed25519"), "PRIVATE KEY\n").expect("key");
    std::fs::set_permissions(home.join(".ssh"), std::fs::Permissions::from_mode(0o700))
        .expect("chmod");
    let project = home.join("project");
    std::fs::create_dir_all(&project).expect("project");
    let agent = write_agent(&project, "agent.py", AGENT);
    user.own(home);
    // An abstract socket of a service outside any session (a user's forwarder, say).
    let abstract_name = format!("toolwall-test-{}", std::process::id());
    let address =
        <std::os::unix::net::SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(
            abstract_name.as_bytes(),
        )
        .expect("abstract name");
    let listener = UnixListener::bind_addr(&address).expect("abstract listener");
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            drop(stream);
        }
    });
    let args = [home.display().to_string(), abstract_name.clone()];

    let control = user
        .command("/usr/bin/python3")
        .arg(&agent)
        .args(&args)
        .current_dir(&project)
        .output()
        .expect("control");
    let (plain, plain_err) = text(&control);
    for name in [
        "profile",
        "bashrc-read",
        "key",
        "project",
        "tmp",
        "abstract",
    ] {
        assert_eq!(
            outcome(&plain, name),
            "ok",
            "control: {name} works without toolwall\n{plain}{plain_err}"
        );
    }
    let profile_before = std::fs::read_to_string(home.join(".profile")).expect("profile");

    let daemon = Daemon::start("exec:\n  confine: strict\n");
    let out = Command::new(toolwall_bin())
        .args(["exec", "--config"])
        .arg(&daemon.config)
        .args(["--user", &user.name, "--session", "strict", "--"])
        .arg("/usr/bin/python3")
        .arg(&agent)
        .args(&args)
        .current_dir(&project)
        .env_remove("SUDO_USER")
        .output()
        .expect("exec");
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "exec failed: {stderr}\n{stdout}");
    assert!(
        stderr.contains("exec.confine: strict"),
        "exec says the files are confined: {stderr}"
    );
    assert_eq!(outcome(&stdout, "profile"), "EACCES", "{stdout}");
    assert_eq!(outcome(&stdout, "key"), "EACCES", "{stdout}");
    assert_eq!(outcome(&stdout, "abstract"), "EPERM", "{stdout}");
    assert_eq!(outcome(&stdout, "bashrc-read"), "ok", "{stdout}");
    assert_eq!(outcome(&stdout, "project"), "ok", "{stdout}");
    assert_eq!(outcome(&stdout, "tmp"), "ok", "{stdout}");
    assert_eq!(
        std::fs::read_to_string(home.join(".profile")).expect("profile"),
        profile_before,
        "the login file is as the control left it"
    );

    // Started in the home directory, strict refuses: the keys and login files there would be
    // writable.
    let refused = Command::new(toolwall_bin())
        .args(["exec", "--config"])
        .arg(&daemon.config)
        .args(["--user", &user.name, "--"])
        .arg("/usr/bin/true")
        .current_dir(home)
        .env_remove("SUDO_USER")
        .output()
        .expect("exec");
    let (_, why) = text(&refused);
    assert!(!refused.status.success(), "{why}");
    assert!(
        why.contains(&format!("{} may be written", home.display())),
        "{why}"
    );
}
