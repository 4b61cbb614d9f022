//! Table output: cut and whole columns, widths, and cells that cannot drive the terminal.

use super::*;

#[test]
fn a_whole_column_is_never_cut() {
    let mut out = Output::new(false, &["A", "B"]).whole(1);
    let long = "y".repeat(MAX_CELL * 2);
    assert!(out.cut(long.clone()).chars().count() <= MAX_CELL);
    out.row(&(), vec![long.clone(), long.clone()]).unwrap();
    assert!(
        out.pending[0][0].ends_with("…(+77 chars)"),
        "{:?}",
        out.pending[0][0]
    );
    assert_eq!(out.pending[0][1], long, "the whole column is kept");
}

#[test]
fn one_long_cell_does_not_widen_the_other_rows() {
    let mut out = Output::new(false, &["ID", "TOOL", "ACTION"]);
    out.row(&(), vec!["1".into(), "y".repeat(5_000), "block".into()])
        .unwrap();
    out.row(&(), vec!["2".into(), "read_file".into(), "allow".into()])
        .unwrap();
    let cut = &out.pending[0][1];
    assert!(cut.chars().count() <= MAX_CELL, "{cut}");
    let kept = cut.chars().take_while(|&c| c == 'y').count();
    assert!(
        cut.ends_with(&format!("…(+{} chars)", 5_000 - kept)),
        "the cut is said, with how much: {cut}"
    );
    let rows = out.pending.clone();
    out.flush().unwrap();
    let widths = out.widths.clone().unwrap();
    assert_eq!(widths[1], MAX_CELL);
    let short = line(&rows[1], &widths);
    assert!(short.chars().count() < MAX_CELL + 20, "{short}");
    // The widths flush computes, for the long row, the short row and a whole column.
    let mut whole = Output::new(false, &["A", "B", "C"]).whole(1);
    whole
        .row(&(), vec!["x".into(), "z".repeat(5_000), "end".into()])
        .unwrap();
    whole
        .row(&(), vec!["x".into(), "z".into(), "end".into()])
        .unwrap();
    assert_eq!(whole.pending[0][1].len(), 5_000, "a whole column is kept");
    let rows = whole.pending.clone();
    whole.flush().unwrap();
    let widths = whole.widths.clone().unwrap();
    assert_eq!(widths[1], MAX_CELL, "the whole cell does not pad others");
    assert!(line(&rows[1], &widths).chars().count() < MAX_CELL + 20);
}

#[test]
fn cells_cannot_drive_the_terminal_or_forge_rows() {
    let shown = printable("evil\u{1b}]0;owned\u{7}\nfake row\u{202E}".to_owned());
    assert!(
        !shown.chars().any(|c| c.is_control() || c == '\u{202E}'),
        "{shown}"
    );
    assert!(
        shown.contains("\\u{1b}") && shown.contains("\\u{a}"),
        "{shown}"
    );
    assert_eq!(printable("plain échoué".to_owned()), "plain échoué");
}

/// Every character the set names, in a tool name: each is shown as its escape, so the name
/// never reads as another (`read\u{2060}_file` as `read_file`).
#[test]
fn invisible_format_and_filler_characters_are_shown_escaped() {
    let every: Vec<char> = crate::hidden::RANGES
        .iter()
        .flat_map(|&(start, end)| start..=end)
        .filter_map(char::from_u32)
        .collect();
    assert!(every.len() > 400, "{}", every.len());
    for c in every {
        let shown = printable(format!("read{c}_file"));
        assert_eq!(shown, format!("read\\u{{{:x}}}_file", u32::from(c)));
    }
    assert_eq!(
        printable("read\u{2060}_file".to_owned()),
        "read\\u{2060}_file"
    );
}

#[test]
fn table_lines_are_aligned() {
    let widths = [5, 3];
    assert_eq!(line(&["ab".into(), "c".into()], &widths), "ab     c");
    assert_eq!(line(&["abcde".into(), "".into()], &widths), "abcde");
}
