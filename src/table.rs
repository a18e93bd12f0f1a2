//! One markdown table renderer for the tuner's report, `emit --format md`
//! and `bench -o md`, and the one rule for a speed cell.

/// A markdown table: one renderer for the tuner's report, `emit --format
/// md` and `bench -o md`.
pub struct Table {
    /// Column names, and whether the column is right-aligned (numbers).
    pub columns: Vec<(String, bool)>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    #[must_use]
    pub fn new(columns: &[(&str, bool)]) -> Table {
        Table { columns: columns.iter().map(|(n, r)| ((*n).to_string(), *r)).collect(), rows: Vec::new() }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The header, a separator as wide as each name (`--:` where
    /// right-aligned), and one line a row; `|` in a cell is escaped as `\|` (GitHub markdown).
    #[must_use]
    pub fn render(&self) -> String {
        let line = |cells: Vec<String>| format!("| {} |\n", cells.join(" | "));
        let mut s = line(self.columns.iter().map(|(n, _)| n.clone()).collect());
        s += &line(
            self.columns
                .iter()
                .map(|(n, right)| {
                    if *right {
                        format!("{}:", "-".repeat(n.chars().count().max(2) - 1))
                    } else {
                        "-".repeat(n.chars().count())
                    }
                })
                .collect(),
        );
        for r in &self.rows {
            s += &line(r.iter().map(|c| c.replace('|', "\\|")).collect());
        }
        s
    }
}

/// A speed cell: mean ± sample standard deviation, or the mean alone when
/// there is one sample (no spread to show), or `-` when not measured.
#[must_use]
pub fn speed_cell(avg_ts: Option<f64>, stddev_ts: Option<f64>, samples: usize) -> String {
    match (avg_ts, stddev_ts) {
        (Some(a), _) if samples < 2 => format!("{a:.2}"),
        (Some(a), Some(sd)) => format!("{a:.2} ± {sd:.2}"),
        (Some(a), None) => format!("{a:.2}"),
        _ => "-".to_string(),
    }
}
