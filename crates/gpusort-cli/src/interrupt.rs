//! Ctrl-C: the temporary output files of running sorts are removed before the process exits
//! (with 130, as shells expect), so an interrupted sort leaves nothing behind. Errors need no
//! help: the temporary file removes itself when dropped.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use tempfile::NamedTempFile;

use crate::error::{CliError, Result};

/// Temporary files to remove on Ctrl-C.
static PENDING: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn pending() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    PENDING.lock().unwrap_or_else(|p| p.into_inner())
}

/// Installs the Ctrl-C handler (once per process; `main` calls it).
pub fn install() -> Result<()> {
    ctrlc::set_handler(|| {
        for path in pending().drain(..) {
            let _ = std::fs::remove_file(path);
        }
        eprintln!("\ngpusort: interrupted");
        std::process::exit(130);
    })
    .map_err(|e| CliError::Usage(format!("cannot install the Ctrl-C handler: {e}")))
}

/// Creates a temporary file with `create` and keeps it on the list of files Ctrl-C removes
/// until the guard is dropped. (A Ctrl-C while it is being created waits for it to be on the
/// list.)
pub fn create_removed_on_interrupt(
    create: impl FnOnce() -> Result<NamedTempFile>,
) -> Result<(NamedTempFile, PendingGuard)> {
    let mut list = pending();
    let temp = create()?;
    list.push(temp.path().to_path_buf());
    let guard = PendingGuard(temp.path().to_path_buf());
    Ok((temp, guard))
}

/// Takes a path off the Ctrl-C list when dropped.
#[derive(Debug)]
pub struct PendingGuard(PathBuf);

impl Drop for PendingGuard {
    fn drop(&mut self) {
        pending().retain(|p| p != &self.0);
    }
}

/// Renames the finished temporary file to `output` (replacing it only with `force`), taking
/// it off the Ctrl-C list in the same step.
pub fn persist(temp: NamedTempFile, output: &Path, force: bool) -> Result<()> {
    let mut list = pending();
    let temp_path = temp.path().to_path_buf();
    let persisted = if force {
        temp.persist(output).map(|_| ())
    } else {
        temp.persist_noclobber(output).map(|_| ())
    };
    list.retain(|p| p != &temp_path);
    drop(list);
    persisted.map_err(|e| {
        if e.error.kind() == std::io::ErrorKind::AlreadyExists {
            CliError::OutputExists(output.to_path_buf())
        } else {
            CliError::io(format!("renaming the finished file to {}", output.display()), e.error)
        }
    })
}
