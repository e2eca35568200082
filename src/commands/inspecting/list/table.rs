//! The listing for people: the compact table (fits [`Style::columns`]
//! however many volumes there are) or the wide one (every column, as
//! long as it takes), then the rows of registry files that do not read,
//! then the footer.

use crate::commands::inspecting::list::cells::{self, labels, State};
use crate::commands::inspecting::list::footer;
use crate::commands::inspecting::list::terminal::{width, Paint, Style};
use crate::commands::inspecting::list::ListReport;
use crate::engine::inspect::{yes_no, UNKNOWN};
use crate::volume::size::format_size;

/// The name column never gets narrower than a short UUID.
const MIN_NAME: usize = 8;

pub fn render(report: &ListReport, style: &Style) -> String {
    if report.volumes.is_empty() && report.errors.is_empty() {
        return "no volumes are registered".to_string();
    }
    let mut lines = if report.volumes.is_empty() {
        Vec::new()
    } else if report.wide {
        wide(report)
    } else {
        compact(report, style)
    };
    for error in &report.errors {
        lines.push(format!(
            "error: {}{}: {}",
            error.file,
            error.line.map_or(String::new(), |l| format!(":{l}")),
            error.reason
        ));
    }
    if !report.volumes.is_empty() {
        let file_systems: Vec<_> = report
            .storage_roots
            .iter()
            .chain(&report.other_file_systems)
            .collect();
        let footer = footer::lines(&file_systems, style);
        if !footer.is_empty() {
            lines.push(String::new());
            lines.extend(footer);
        }
    }
    lines.join("\n")
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Align {
    Left,
    Right,
}

struct Cell {
    text: String,
    paint: Option<Paint>,
}

impl Cell {
    fn plain(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            paint: None,
        }
    }
}

/// NAME MODE SIZE ALLOC DEVICE STATE; the name is cut so that the row
/// fits `style.columns`.
fn compact(report: &ListReport, style: &Style) -> Vec<String> {
    const HEADER: [&str; 6] = ["NAME", "MODE", "SIZE", "ALLOC", "DEVICE", "STATE"];
    const ALIGN: [Align; 6] = [
        Align::Left,
        Align::Left,
        Align::Right,
        Align::Right,
        Align::Left,
        Align::Left,
    ];
    let any_short = report.volumes.iter().any(cells::short);
    let rest: Vec<[Cell; 5]> = report
        .volumes
        .iter()
        .map(|v| {
            let state = State::of(v);
            let mut alloc = cells::share(v.allocated, v.size);
            if any_short {
                alloc.push_str(if cells::short(v) { " !" } else { "  " });
            }
            [
                Cell::plain(cells::mode(v)),
                Cell::plain(cells::size(v.size)),
                Cell::plain(alloc),
                Cell::plain(cells::device(v)),
                Cell {
                    text: state.word().to_string(),
                    paint: Some(state.paint()),
                },
            ]
        })
        .collect();
    // Everything but the name has a bounded width; the name gets the rest.
    let fixed: usize = (0..5)
        .map(|c| {
            rest.iter()
                .map(|r| width(&r[c].text))
                .chain([width(HEADER[c + 1])])
                .max()
                .unwrap_or(0)
                + 2
        })
        .sum();
    let room = style.columns.saturating_sub(fixed).max(MIN_NAME);
    let mut rows: Vec<Vec<Cell>> = vec![HEADER.iter().map(|h| Cell::plain(*h)).collect()];
    for (label, rest) in labels(&report.volumes).iter().zip(rest) {
        let mut row = vec![Cell::plain(label.fit(room))];
        row.extend(rest);
        rows.push(row);
    }
    aligned(&rows, &ALIGN, style)
}

/// Every column, the compact table's included, one line per volume.
fn wide(report: &ListReport) -> Vec<String> {
    let header = [
        "UUID", "NAME", "MODE", "FS", "RO", "SIZE", "ALLOC", "ENABLED", "DEVICE", "I/O", "STATE",
        "UNIT", "ORIGIN", "PATH",
    ];
    let mut rows: Vec<Vec<Cell>> = vec![header.iter().map(|h| Cell::plain(*h)).collect()];
    for v in &report.volumes {
        rows.push(
            [
                v.uuid.clone(),
                v.name.clone().unwrap_or_else(|| "-".into()),
                v.mode.to_string(),
                v.fs_type.clone().unwrap_or_else(|| "-".into()),
                yes_no(v.is_read_only_now()),
                format_size(v.size),
                format!(
                    "{}{}",
                    v.allocated.map_or(UNKNOWN.to_string(), format_size),
                    if cells::short(v) { " !" } else { "" }
                ),
                yes_no(v.enabled),
                v.partition
                    .as_ref()
                    .or(v.device.as_ref())
                    .map_or("-".to_string(), |d| d.display().to_string()),
                cells::io(v),
                State::of(v).word().to_string(),
                v.unit_state(),
                cells::origin(v, &report.volumes),
                v.path.display().to_string(),
            ]
            .into_iter()
            .map(Cell::plain)
            .collect(),
        );
    }
    aligned(&rows, &[Align::Left; 14], &Style::plain())
}

/// Columns two spaces apart, sized on the columns the text takes on
/// screen (colour is added after padding); the last column is not padded.
fn aligned(rows: &[Vec<Cell>], align: &[Align], style: &Style) -> Vec<String> {
    let columns = align.len();
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().map(|r| width(&r[c].text)).max().unwrap_or(0))
        .collect();
    rows.iter()
        .map(|row| {
            let mut line = String::new();
            for (c, cell) in row.iter().enumerate() {
                let pad = " ".repeat(widths[c] - width(&cell.text));
                let text = match cell.paint {
                    Some(paint) => style.paint(&cell.text, paint),
                    None => cell.text.clone(),
                };
                let last = c + 1 == columns;
                match (align[c], last) {
                    (Align::Right, _) => line.push_str(&format!("{pad}{text}")),
                    (Align::Left, false) => line.push_str(&format!("{text}{pad}")),
                    (Align::Left, true) => line.push_str(&text),
                }
                if !last {
                    line.push_str("  ");
                }
            }
            line.trim_end().to_string()
        })
        .collect()
}

#[cfg(test)]
pub(super) mod tests;
