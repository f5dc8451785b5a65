//! Plain-text tables: columns separated by two spaces, the first `padded` columns padded to
//! their widest cell (the last ones, long sentences, are not), trailing spaces trimmed. Cells
//! hold text from the API and logs: each is printed with its control characters escaped
//! ([`flock::text::visible`]), so that a cell cannot repaint, forge or reorder a line.

use std::fmt::Write as _;

use flock::text::visible;

/// `header` then `rows`, one line each.
pub fn columns<const N: usize>(header: [&str; N], rows: &[[String; N]], padded: usize) -> String {
    let header = header.map(String::from);
    let rows: Vec<[String; N]> = rows.iter().map(|r| r.clone().map(|c| visible(&c).into_owned())).collect();
    let rows = rows.as_slice();
    let widths: Vec<usize> =
        (0..padded.min(N)).map(|i| rows.iter().chain([&header]).map(|r| r[i].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for row in [&header].into_iter().chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            let _ = match widths.get(i) {
                Some(w) => write!(line, "{cell:<w$}  "),
                None => write!(line, "{cell}  "),
            };
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    out
}
