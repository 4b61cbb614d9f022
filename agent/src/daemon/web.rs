//! The web view served at the API's `/`: one page, no build step, no external assets. The
//! page escapes the characters every view escapes (`hidden.rs`): their ranges are written into
//! its script here, from the one definition, so the page and the CLI cannot disagree
//! (`the_pages_escaper_escapes_exactly_what_the_cli_escapes` runs the page's own function).

use std::sync::LazyLock;

/// The page as written, with [`HIDDEN_MARK`] where the ranges go.
const TEMPLATE: &str = include_str!("web.html");
/// Where the page's script takes the ranges of hidden characters.
const HIDDEN_MARK: &str = "[/* hidden.rs RANGES */]";

/// The page: correlated calls, live, with filters and a detail pane, and the calls waiting
/// for a person.
pub(super) static PAGE: LazyLock<String> = LazyLock::new(|| {
    let ranges: Vec<String> = crate::hidden::RANGES
        .iter()
        .map(|(start, end)| format!("[{start},{end}]"))
        .collect();
    TEMPLATE.replacen(HIDDEN_MARK, &format!("[{}]", ranges.join(",")), 1)
});

#[cfg(test)]
mod tests;
