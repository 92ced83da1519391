//! Reading the benchmarks' `--json` rows: one flat JSON object per line.

/// The unsigned integer value of `key` in `row`.
pub(crate) fn number(row: &str, key: &str) -> u64 {
    let at = row.find(&format!("\"{key}\":")).unwrap_or_else(|| panic!("no {key} in {row}")) + key.len() + 3;
    row[at..].chars().take_while(char::is_ascii_digit).collect::<String>().parse().expect("a number")
}
