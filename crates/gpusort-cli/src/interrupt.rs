//! Signals: on SIGINT (Ctrl-C), SIGTERM (`kill`, `timeout`, systemd, Kubernetes) or SIGHUP (the
//! terminal went away), the hidden temporary output and the spill directory are removed before
//! the process exits with 128 + the signal's number (130, 143, 129), as GNU sort does; a
//! signal that was ignored when `gpusort` started (`nohup`) stays ignored. So a stopped sort
//! leaves nothing behind. Errors need no help: the temporary file and directory remove
//! themselves when dropped.
//!
//! The handler itself only writes the signal's number into a pipe (all a signal handler may
//! safely do); a thread of its own reads it, removes what is on the list and ends the process.
//! The list stays locked from then on, so nothing can be added after it was emptied.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicI32, Ordering};

use tempfile::{NamedTempFile, TempDir};

use crate::error::{CliError, Result};

/// The signals that stop `gpusort` after cleaning up.
pub const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// What to remove on a signal.
#[derive(Debug, PartialEq, Eq)]
enum Pending {
    File(PathBuf),
    Dir(PathBuf),
}

/// Files and directories to remove on a signal.
static PENDING: Mutex<Vec<Pending>> = Mutex::new(Vec::new());

/// The writing end of the pipe the signal handler writes to (-1 before [`install`]).
static PIPE: AtomicI32 = AtomicI32::new(-1);

fn pending() -> std::sync::MutexGuard<'static, Vec<Pending>> {
    PENDING.lock().unwrap_or_else(|p| p.into_inner())
}

extern "C" fn on_signal(signal: libc::c_int) {
    let fd = PIPE.load(Ordering::Relaxed);
    let byte = signal as u8;
    // SAFETY: write(2) is async-signal-safe; `byte` lives through the call.
    unsafe {
        libc::write(fd, (&raw const byte).cast(), 1);
    }
}

/// Installs the handlers of [`SIGNALS`] (once per process; `main` calls it).
pub fn install() -> Result<()> {
    let failed = |what: &str| {
        CliError::Usage(format!(
            "cannot install the signal handlers: {what}: {}",
            std::io::Error::last_os_error()
        ))
    };
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe(2) writes.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(failed("pipe"));
    }
    for fd in fds {
        // SAFETY: fcntl on descriptors we own; the child processes we never start need not
        // inherit them.
        unsafe {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
    }
    PIPE.store(fds[1], Ordering::Relaxed);
    let read_end = fds[0];
    std::thread::Builder::new()
        .name("gpusort-signals".into())
        .spawn(move || {
            let mut byte = 0u8;
            loop {
                // SAFETY: reads one byte into `byte`.
                let n = unsafe { libc::read(read_end, (&raw mut byte).cast(), 1) };
                if n == 1 {
                    stop(byte as libc::c_int);
                }
                if n == 0 || (n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted) {
                    return;
                }
            }
        })
        .map_err(|e| CliError::io("starting the signal thread", e))?;
    for signal in SIGNALS {
        // SAFETY: sigaction with a zeroed struct (an empty mask) and a handler that only
        // calls write(2); the old disposition is read first so that an ignored signal stays so.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, std::ptr::null(), &mut old) != 0 {
                return Err(failed("sigaction"));
            }
            if old.sa_sigaction == libc::SIG_IGN {
                continue;
            }
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(signal, &action, std::ptr::null_mut()) != 0 {
                return Err(failed("sigaction"));
            }
        }
    }
    Ok(())
}

/// The signal thread's work: removes everything on the list, says why the sort stopped, and
/// exits with 128 + `signal`. Holds the list's lock until the end.
fn stop(signal: libc::c_int) -> ! {
    let list = pending();
    for item in list.iter() {
        match item {
            Pending::File(path) => {
                let _ = std::fs::remove_file(path);
            }
            Pending::Dir(path) => {
                // A spill file being created as the directory goes could leave it not empty:
                // a few tries.
                for _ in 0..5 {
                    if std::fs::remove_dir_all(path).is_ok() || !path.exists() {
                        break;
                    }
                }
            }
        }
    }
    let name = match signal {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        _ => "a signal",
    };
    let newline = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        "\n"
    } else {
        ""
    };
    let _ = writeln!(std::io::stderr(), "{newline}gpusort: error: interrupted by {name}");
    // Other threads may be in the middle of anything (the GPU driver included): no exit
    // handlers, no destructors.
    // SAFETY: ends the process.
    unsafe { libc::_exit(128 + signal) }
}

/// Creates a temporary file with `create` and keeps it on the list of files a signal removes
/// until the guard is dropped. (A signal while it is being created waits for it to be on the
/// list.)
pub fn create_removed_on_interrupt(
    create: impl FnOnce() -> Result<NamedTempFile>,
) -> Result<(NamedTempFile, PendingGuard)> {
    let mut list = pending();
    let temp = create()?;
    let item = Pending::File(temp.path().to_path_buf());
    let guard = PendingGuard(Some(temp.path().to_path_buf()), false);
    list.push(item);
    Ok((temp, guard))
}

/// A temporary directory for spill files, in `base`, removed with everything in it when
/// dropped or on a signal.
#[derive(Debug)]
pub struct SpillDir {
    // Declared first: dropped (taken off the list) before the directory goes.
    _guard: PendingGuard,
    dir: TempDir,
}

impl SpillDir {
    /// Creates `base/gpusort-XXXXXX`.
    pub fn create(base: &Path) -> Result<Self> {
        let mut list = pending();
        let dir = tempfile::Builder::new()
            .prefix("gpusort-")
            .tempdir_in(base)
            .map_err(|e| CliError::io(format!("creating a spill directory in {}", base.display()), e))?;
        list.push(Pending::Dir(dir.path().to_path_buf()));
        let guard = PendingGuard(Some(dir.path().to_path_buf()), true);
        Ok(Self { _guard: guard, dir })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Where DataFusion's disk manager makes its own directory: `spill` inside this one, not
    /// made here. The disk manager creates the directory it is given when it is missing, but
    /// not its parents: given this directory itself, a signal that removed it while the plan
    /// was being made had it made again, and left behind (`sighup_while_reading_leaves_nothing`
    /// failed once so); given a child, it fails to make that child once this one is gone.
    pub fn datafusion_root(&self) -> PathBuf {
        self.dir.path().join("spill")
    }
}

/// Takes a path off the signal list when dropped.
#[derive(Debug)]
pub struct PendingGuard(Option<PathBuf>, bool);

impl Drop for PendingGuard {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let item = if self.1 {
                Pending::Dir(path)
            } else {
                Pending::File(path)
            };
            pending().retain(|p| p != &item);
        }
    }
}

/// Renames the finished temporary file to `output` (replacing it only with `force`), taking
/// it off the signal list in the same step.
pub fn persist(temp: NamedTempFile, output: &Path, force: bool) -> Result<()> {
    let mut list = pending();
    let item = Pending::File(temp.path().to_path_buf());
    let persisted = if force {
        temp.persist(output).map(|_| ())
    } else {
        temp.persist_noclobber(output).map(|_| ())
    };
    if persisted.is_ok() {
        list.retain(|p| p != &item);
    }
    drop(list);
    persisted.map_err(|e| {
        if e.error.kind() == std::io::ErrorKind::AlreadyExists {
            CliError::OutputExists(output.to_path_buf())
        } else {
            CliError::io(format!("renaming the finished file to {}", output.display()), e.error)
        }
    })
}
