//! The web view served at the API's `/`: one page, no build step, no external assets.

/// The page: correlated calls, live, with filters and a detail pane.
pub(super) const PAGE: &str = include_str!("web.html");
