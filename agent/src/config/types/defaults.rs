//! Default values several sections share, named for serde's `default = "..."`.

pub(super) fn yes() -> bool {
    true
}

pub(super) fn star() -> String {
    "*".to_string()
}
