//! [`CliError`]: everything that stops `gpusort`, each with a one-line cause that names the
//! thing at fault (the file, the column, the directory).

use std::io;
use std::path::PathBuf;

use datafusion::error::DataFusionError;

/// A `gpusort` failure. `main` prints it as `gpusort: error: <one line>` and exits with
/// [`CliError::exit_code`]: 2 for bad usage, 1 for the rest.
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
    /// The spill directory is full: its disk, or `--disk-limit`.
    #[error(
        "the spill directory {dir} is full ({cause}); free space there, point --temp-dir elsewhere or raise --memory-limit"
    )]
    SpillFull {
        /// The directory.
        dir: PathBuf,
        /// What said so.
        cause: String,
    },
    /// Standard output could not be written (a full disk; a closed pipe is no error, see
    /// [`CliError::is_broken_pipe`]).
    #[error("writing to standard output: {0}")]
    Stdout(io::Error),
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
    /// An option value that does not fit (e.g. a row group size of 0, a GPU that is not
    /// there). Exit code 2.
    #[error("{0}")]
    Usage(String),
}

/// The exit code of bad usage.
pub const USAGE_EXIT: u8 = 2;

/// The exit code after a closed standard output pipe: 128 + SIGPIPE, what a shell reports
/// for a tool that a closed pipe stopped (GNU tools die of SIGPIPE; Rust ignores it).
pub const BROKEN_PIPE_EXIT: u8 = 141;

/// `Result` with [`CliError`].
pub type Result<T, E = CliError> = std::result::Result<T, E>;

impl CliError {
    /// The message on one line: inner line breaks (DataFusion's lists of memory consumers,
    /// backtraces) become `; `.
    pub fn one_line(&self) -> String {
        one_line(&self.to_string())
    }

    /// The process's exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(_) => USAGE_EXIT,
            _ if self.is_broken_pipe() => BROKEN_PIPE_EXIT,
            _ => 1,
        }
    }

    /// Whether standard output is a pipe whose reader went away (`gpusort explain ... | head
    /// -1`): the process ends quietly then.
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, Self::Stdout(e) if e.kind() == io::ErrorKind::BrokenPipe)
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

/// DataFusion's, arrow's and parquet's error texts say the kind of error at every layer
/// (`External error: `, `Parquet argument error: External: `, `Io error: IO error: `...),
/// which says nothing to a user of the tool; drops them wherever they start a `: `-separated
/// part.
pub fn strip_prefixes(text: &str) -> String {
    const KINDS: &[&str] = &[
        "External error",
        "External",
        "Execution error",
        "Arrow error",
        "Parquet error",
        "Parquet argument error",
        "Object Store error",
        "IO error",
        "Io error",
        "Io",
        "Error during planning",
        "Internal error",
        "General error",
        "Invalid argument error",
        "Resources exhausted",
    ];
    text.split(": ")
        .filter(|part| !KINDS.contains(part))
        .collect::<Vec<_>>()
        .join(": ")
}

/// Whether `text` (an error's, all its layers) says a disk is full, or a spill went past the
/// disk manager's limit (`--disk-limit`).
pub fn says_disk_full(text: &str) -> bool {
    const FULL: &[&str] = &[
        "No space left on device",
        "Disk quota exceeded",
        "File too large",
        "used disk space during the spilling process has exceeded",
    ];
    FULL.iter().any(|f| text.contains(f))
}

/// A clap error (bad usage) as one line: its first paragraph with the lines joined, its tips
/// after it; the usage and `--help` lines dropped.
pub fn clap_one_line(error: &clap::Error) -> String {
    use clap::error::ErrorKind;
    if error.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        return "no command given: sort, explain or info; try --help".into();
    }
    let text = error.render().to_string();
    let mut paragraphs = text.split("\n\n").map(str::trim).filter(|p| !p.is_empty());
    let first = paragraphs.next().unwrap_or_default();
    let mut lines = first.lines().map(str::trim);
    let mut line = lines
        .next()
        .unwrap_or_default()
        .trim_start_matches("error: ")
        .to_string();
    let rest: Vec<&str> = lines.filter(|l| !l.is_empty()).collect();
    if !rest.is_empty() {
        if !line.ends_with(':') {
            line.push(':');
        }
        line.push(' ');
        line.push_str(&rest.join(", "));
    }
    for tip in paragraphs.filter(|p| p.starts_with("tip:")) {
        line.push_str("; ");
        line.push_str(&one_line(tip));
    }
    line.push_str("; try --help");
    line
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
        assert_eq!(
            strip_prefixes("Parquet argument error: External: snappy: corrupt input (x: 2)"),
            "snappy: corrupt input (x: 2)"
        );
        assert_eq!(
            strip_prefixes("Io error: IO error: unexpected end of file"),
            "unexpected end of file"
        );
        assert!(says_disk_full(
            "could not spill: IO error: No space left on device (os error 28)"
        ));
    }

    #[test]
    fn exit_codes() {
        assert_eq!(CliError::Usage("x".into()).exit_code(), 2);
        assert_eq!(CliError::Engine("x".into()).exit_code(), 1);
        let pipe = CliError::Stdout(io::Error::from(io::ErrorKind::BrokenPipe));
        assert!(pipe.is_broken_pipe());
        assert_eq!(pipe.exit_code(), 141);
        assert_eq!(
            CliError::Stdout(io::Error::from(io::ErrorKind::StorageFull)).exit_code(),
            1
        );
    }
}
