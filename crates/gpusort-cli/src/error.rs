//! [`CliError`]: everything that stops `gpusort`, each with a one-line cause that names the
//! thing at fault (the file, the column, the directory).

use std::io;
use std::path::PathBuf;

use datafusion::error::DataFusionError;

/// A `gpusort` failure. `main` prints it as `gpusort: error: <one line>` and exits with 1.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// An input names nothing on disk.
    #[error("{0}: no such file or directory")]
    NotFound(PathBuf),
    /// A glob pattern matched no file.
    #[error("{0}: no file matches this pattern")]
    NoMatch(String),
    /// A glob pattern does not parse.
    #[error("{pattern}: not a valid glob pattern: {cause}")]
    BadPattern {
        /// The pattern.
        pattern: String,
        /// What the glob parser said.
        cause: String,
    },
    /// A directory given as input holds no `.parquet` file.
    #[error("{0}: the directory holds no .parquet file")]
    EmptyDirectory(PathBuf),
    /// An input is not a Parquet file at all.
    #[error("{path}: not a Parquet file ({why})")]
    NotParquet {
        /// The file.
        path: PathBuf,
        /// What gave it away.
        why: String,
    },
    /// An input starts like a Parquet file but its footer is missing or damaged.
    #[error("{path}: truncated or damaged Parquet file ({why})")]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// Two inputs have different columns or column types.
    #[error("inputs have different schemas: {difference}")]
    SchemaMismatch {
        /// The first difference, naming both files and the column.
        difference: String,
    },
    /// The ORDER BY list names a column the inputs do not have.
    #[error("--order-by: unknown column {name}; the columns are: {available}")]
    UnknownColumn {
        /// The name as written.
        name: String,
        /// The inputs' columns, comma-separated.
        available: String,
    },
    /// The ORDER BY list is not a list of columns with ASC/DESC and NULLS FIRST/LAST.
    #[error("--order-by {list:?}: {cause}")]
    BadOrderBy {
        /// The list as given.
        list: String,
        /// What is wrong.
        cause: String,
    },
    /// The output exists and `--force` was not given.
    #[error("{0}: the output exists; use --force to replace it")]
    OutputExists(PathBuf),
    /// The output's directory cannot be written.
    #[error("{dir}: cannot write the output here: {cause}")]
    OutputDirectory {
        /// The directory.
        dir: PathBuf,
        /// Why not.
        cause: String,
    },
    /// An I/O failure, with what was being done.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, e.g. `reading x.parquet`.
        context: String,
        /// The failure.
        source: io::Error,
    },
    /// Writing the output failed.
    #[error("writing {path}: {cause}")]
    Write {
        /// The output file.
        path: PathBuf,
        /// What failed.
        cause: String,
    },
    /// The sort needed more memory than `--memory-limit` allows.
    #[error("out of memory under --memory-limit {limit}: {cause}")]
    OutOfMemory {
        /// The limit as given.
        limit: String,
        /// DataFusion's account of it.
        cause: String,
    },
    /// Planning or running the sort failed in DataFusion or in gpusort.
    #[error("{0}")]
    Engine(String),
    /// An option value that does not fit (e.g. a row group size of 0).
    #[error("{0}")]
    Usage(String),
}

/// `Result` with [`CliError`].
pub type Result<T, E = CliError> = std::result::Result<T, E>;

impl CliError {
    /// The message on one line: inner line breaks (DataFusion's lists of memory consumers,
    /// backtraces) become `; `.
    pub fn one_line(&self) -> String {
        one_line(&self.to_string())
    }

    /// A DataFusion error, classified: a memory pool that ran out becomes
    /// [`CliError::OutOfMemory`] (naming `memory_limit` when one was set), the rest
    /// [`CliError::Engine`].
    pub fn from_datafusion(error: DataFusionError, memory_limit: Option<&str>) -> Self {
        let root = error.find_root();
        if let DataFusionError::ResourcesExhausted(cause) = root {
            return Self::OutOfMemory {
                limit: memory_limit.unwrap_or("(none)").to_string(),
                cause: one_line(cause),
            };
        }
        Self::Engine(one_line(&strip_prefixes(&root.to_string())))
    }

    /// An I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}

/// `text` on one line, its lines joined with `; `.
pub fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// DataFusion's error texts start with the kind of error (`External error: `, `Execution
/// error: `...), which says nothing to a user of the tool; drops them.
fn strip_prefixes(text: &str) -> String {
    const PREFIXES: &[&str] = &[
        "External error: ",
        "Execution error: ",
        "Arrow error: ",
        "Parquet error: ",
        "Object Store error: ",
        "IO error: ",
        "Error during planning: ",
    ];
    let mut t = text;
    while let Some(rest) = PREFIXES.iter().find_map(|p| t.strip_prefix(p)) {
        t = rest;
    }
    t.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_errors_name_the_limit_and_others_lose_their_prefixes() {
        let e = DataFusionError::ResourcesExhausted("Failed to allocate 10 MB\nconsumers: a, b".into());
        let e = CliError::from_datafusion(DataFusionError::Context("sorting".into(), Box::new(e)), Some("1m"));
        assert_eq!(
            e.one_line(),
            "out of memory under --memory-limit 1m: Failed to allocate 10 MB; consumers: a, b"
        );
        let e = CliError::from_datafusion(DataFusionError::Execution("the GPU fell over".into()), None);
        assert_eq!(e.one_line(), "the GPU fell over");
    }
}
