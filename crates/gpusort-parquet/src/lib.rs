//! Writes sorted Arrow batches to one Parquet file, fast: this crate's one job is the Parquet
//! files of a sort, the output above all, and the input's pages decoded on the GPU. The `gpusort` tool writes its output with it, and
//! `datafusion-gpusort`'s `GpuParquetSink` writes SQL's `COPY (... ORDER BY ...) TO
//! 'file.parquet'` with it.
//!
//! - [`writer::SortedParquetWriter`]: row groups cut from the batches in order, their columns
//!   encoded in parallel on a thread pool of the writer's own, a few row groups at a time, and
//!   appended in order; the sort is recorded in each row group's `sorting_columns`.
//! - [`encoder`]: gpusort's own column chunk encoder for the column types a sorted table is
//!   mostly made of (the Parquet crate's encoder writes the others).
//! - [`pages`]: pages compressed apart from encoding, a row group at a time, by a
//!   [`pages::PageCompressor`]: zstd on the CPU, or ([`gpu_pages`]) on the GPU through nvCOMP.
//! - [`stored_pages`]: on the input side, a column chunk's pages as the file stores them, for
//!   a decoder other than the Parquet crate's: [`gpu_decode`], row groups decompressed and
//!   decoded on the GPU into Arrow columns in device memory.
//!
//! The output is standard Parquet: what the Parquet crate's writer makes with the same
//! properties, page for page (the tests compare the two).

pub mod encoder;
pub mod gpu_decode;
pub mod gpu_pages;
pub mod pages;
mod row_group;
pub mod stored_pages;
pub mod writer;

pub use gpu_pages::{CompressOn, DeferredZstd, NvcompZstd, PagePath};
pub use pages::PageCompressor;
pub use writer::{Codec, ColumnEncoder, SortedParquetWriter, WriteOptions, WriteProgress, WriteStats};

/// The `log` target of the timeline events (`gpusort sort --timeline` prints them).
pub const TIMELINE_TARGET: &str = "gpusort::timeline";

/// `value` of variable `name` as a count within `range` of `what` (e.g. "calls"), or the error
/// that names the variable and the range.
pub(crate) fn parse_count(
    name: &str,
    value: &str,
    range: std::ops::RangeInclusive<usize>,
    what: &str,
) -> Result<usize, String> {
    match value.trim().parse::<usize>() {
        Ok(n) if range.contains(&n) => Ok(n),
        _ => Err(format!(
            "{name}={value}: expected {} to {} {what}",
            range.start(),
            range.end()
        )),
    }
}

/// A mark of the writer's on the timeline.
pub(crate) fn mark(what: impl std::fmt::Display) {
    log::debug!(target: TIMELINE_TARGET, "{what}");
}

/// One key of the sort the output is in: a top-level column and its direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SortKey {
    /// The column's name in the output's schema.
    pub column: String,
    /// `DESC`.
    pub descending: bool,
    /// Nulls before the other values.
    pub nulls_first: bool,
}

impl SortKey {
    /// `column` ascending, nulls last (SQL's default for `ASC`).
    pub fn asc(column: impl Into<String>) -> Self {
        Self {
            column: column.into(),
            descending: false,
            nulls_first: false,
        }
    }

    /// `column` descending, nulls first (SQL's default for `DESC`).
    pub fn desc(column: impl Into<String>) -> Self {
        Self {
            column: column.into(),
            descending: true,
            nulls_first: true,
        }
    }
}

/// `keys` as an SQL ORDER BY list, every direction and null placement spelled out, names
/// quoted where they need it: `amount DESC NULLS FIRST, "Order Id" ASC NULLS LAST`.
pub fn order_by_sql(keys: &[SortKey]) -> String {
    keys.iter()
        .map(|k| {
            format!(
                "{} {} NULLS {}",
                quote(&k.column),
                if k.descending { "DESC" } else { "ASC" },
                if k.nulls_first { "FIRST" } else { "LAST" }
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `name`, in double quotes when it is not a plain lower-case SQL identifier.
pub fn quote(name: &str) -> String {
    let plain = name.chars().next().is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if plain {
        name.to_string()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_print_as_sql() {
        let keys = [
            SortKey::desc("amount"),
            SortKey::asc("Order Id"),
            SortKey {
                column: "a\"b".into(),
                descending: false,
                nulls_first: true,
            },
        ];
        assert_eq!(
            order_by_sql(&keys),
            "amount DESC NULLS FIRST, \"Order Id\" ASC NULLS LAST, \"a\"\"b\" ASC NULLS FIRST"
        );
        assert_eq!(quote("_x9"), "_x9");
        assert_eq!(quote("9x"), "\"9x\"");
    }
}
