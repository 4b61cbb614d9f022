//! Which declared server a shim's request names.

use crate::config::declared_server;

fn declared(id: &str) -> crate::config::ServerDecl {
    serde_yaml_ng::from_str(&format!("{{id: {id}, type: stdio, command: /bin/true}}"))
        .expect("a server declaration")
}

#[test]
fn an_undeclared_look_alike_of_a_declared_server_is_refused() {
    let servers = [declared("everything"), declared("127.0.0.1:18101")];
    let found = declared_server(&servers, "everything").unwrap();
    assert_eq!(found.map(|s| s.id.as_str()), Some("everything"));
    assert!(
        declared_server(&servers, "127.0.0.1:18101")
            .unwrap()
            .is_some()
    );
    assert!(declared_server(&servers, "other").unwrap().is_none());
    for twin in [
        "Everything",
        "everything.",
        "./everything",
        "everyth1ng",
        "every-thing",
    ] {
        let why = declared_server(&servers, twin).unwrap_err().to_string();
        assert!(
            why.contains("looks like declared server \"everything\""),
            "{twin}: {why}"
        );
    }
    for bad in ["everything ", " everything", "every\u{7}thing", "", "a b"] {
        let why = declared_server(&servers, bad).unwrap_err().to_string();
        assert!(
            why.contains(&format!("{bad:?}")) && why.contains("no spaces"),
            "{why}"
        );
    }
}
