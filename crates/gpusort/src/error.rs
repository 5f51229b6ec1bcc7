//! The one error type of the core crate.

use arrow::datatypes::DataType;
use arrow::error::ArrowError;

/// Errors of key encoding, planning and the CPU backend.
#[derive(Debug, thiserror::Error)]
pub enum GpusortError {
    /// A sort column has a type no encoding exists for.
    #[error("cannot sort by column {column} of type {data_type}: {reason}")]
    UnsupportedType {
        /// The column's name (or `#index` when no name is known).
        column: String,
        /// Its Arrow type.
        data_type: DataType,
        /// Why it is not sortable.
        reason: String,
    },
    /// A sort key names a column that does not exist.
    #[error("sort key {key} refers to column {column}, but the input has {num_columns} columns")]
    NoSuchColumn {
        /// Position of the key in the sort specification.
        key: usize,
        /// The column it refers to.
        column: String,
        /// How many columns the input has.
        num_columns: usize,
    },
    /// Columns of one input have different lengths.
    #[error("column {column} has {len} rows, expected {expected}")]
    LengthMismatch {
        /// The offending column.
        column: usize,
        /// Its length.
        len: usize,
        /// The length of the first column.
        expected: usize,
    },
    /// More rows than one in-memory sort can index (row indices are 32-bit).
    #[error("{rows} rows exceed the {max} rows one in-memory sort can hold; sort in runs")]
    TooManyRows {
        /// Rows asked for.
        rows: usize,
        /// The limit.
        max: usize,
    },
    /// An invalid option value.
    #[error("invalid option: {0}")]
    InvalidOption(String),
    /// A backend (the GPU) failed; the message says how.
    #[error("sort backend failed: {0}")]
    Backend(String),
    /// An Arrow kernel failed.
    #[error(transparent)]
    Arrow(#[from] ArrowError),
}

/// Result with [`GpusortError`].
pub type Result<T, E = GpusortError> = std::result::Result<T, E>;
