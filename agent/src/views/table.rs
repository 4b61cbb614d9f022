//! How the views print rows: JSON lines for tools, or an aligned table for people whose cells
//! are cut to a bounded width and escaped so a recorded name cannot drive the terminal.

use std::io::Write;

use serde::Serialize;

/// Rows as JSON lines, or as an aligned table (buffered until [`Output::flush`] so columns can
/// be sized; in `--follow` mode each later row is printed as it comes, in the same widths).
pub(crate) struct Output {
    json: bool,
    /// Columns never cut on a terminal.
    whole: Vec<usize>,
    header: Vec<String>,
    pending: Vec<Vec<String>>,
    widths: Option<Vec<usize>>,
}

impl Output {
    pub(crate) fn new(json: bool, header: &[&str]) -> Self {
        Output {
            json,
            whole: Vec::new(),
            header: header.iter().map(|h| h.to_string()).collect(),
            pending: Vec::new(),
            widths: None,
        }
    }

    pub(crate) fn row<T: Serialize>(
        &mut self,
        value: &T,
        cells: Vec<String>,
    ) -> anyhow::Result<()> {
        let mut stdout = std::io::stdout().lock();
        if self.json {
            serde_json::to_writer(&mut stdout, value)?;
            writeln!(stdout)?;
            return Ok(stdout.flush()?);
        }
        let cells = cells
            .into_iter()
            .enumerate()
            .map(|(i, c)| match self.whole.contains(&i) {
                true => printable(c),
                false => self.cut(printable(c)),
            })
            .collect();
        match &self.widths {
            None => self.pending.push(cells),
            Some(widths) => {
                writeln!(stdout, "{}", line(&cells, widths))?;
                stdout.flush()?;
            }
        }
        Ok(())
    }

    /// Column `i` is never cut (what a person must read whole).
    pub(crate) fn whole(mut self, i: usize) -> Self {
        self.whole.push(i);
        self
    }

    fn cut(&self, cell: String) -> String {
        cut(cell)
    }

    pub(crate) fn flush(&mut self) -> anyhow::Result<()> {
        if self.json || self.widths.is_some() {
            return Ok(());
        }
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.pending {
            // A whole column's long cell overruns its own row only, never pads the others.
            for (w, c) in widths.iter_mut().zip(row) {
                *w = (*w).max(c.chars().count().min(MAX_CELL));
            }
        }
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{}", line(&self.header, &widths))?;
        for row in self.pending.drain(..) {
            writeln!(stdout, "{}", line(&row, &widths))?;
        }
        stdout.flush()?;
        self.widths = Some(widths);
        Ok(())
    }
}

/// Longest cell shown before it is cut (with `…(+N chars)`), terminal or pipe: a server names
/// its tools, and one 3 MB name padded every row of a table to 3 MB (`--json` stays whole).
const MAX_CELL: usize = 64;

/// `cell` cut to at most [`MAX_CELL`] characters, saying how many were left out.
fn cut(cell: String) -> String {
    let n = cell.chars().count();
    if n <= MAX_CELL {
        return cell;
    }
    // The marker's length is bounded by that of `n`'s digits, so the cell stays within bounds.
    let marker_len = "…(+ chars)".chars().count() + n.to_string().len();
    let keep = MAX_CELL.saturating_sub(marker_len);
    let mut out: String = cell.chars().take(keep).collect();
    out.push_str(&format!("…(+{} chars)", n - keep));
    out
}

/// `cell` with what a terminal would act on or a person would not see written as `\u{..}`:
/// controls (escapes, bells, line ends: a tool name a server chose must not forge a row or
/// drive the terminal), and format, bidirectional and filler characters (`read\u{2060}_file`
/// must not read as `read_file`), the set every view escapes (`hidden.rs`).
pub(crate) fn printable(cell: String) -> String {
    match crate::hidden::escaped(&cell) {
        std::borrow::Cow::Borrowed(_) => cell,
        std::borrow::Cow::Owned(shown) => shown,
    }
}

fn line(cells: &[String], widths: &[usize]) -> String {
    let mut out = String::new();
    for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
        if i + 1 == cells.len() {
            out.push_str(cell);
        } else {
            out.push_str(cell);
            out.extend(std::iter::repeat_n(
                ' ',
                w.saturating_sub(cell.chars().count()) + 2,
            ));
        }
    }
    out.trim_end().to_owned()
}

#[cfg(test)]
mod tests;
