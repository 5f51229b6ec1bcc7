//! The `gpusort` binary: parses the command line and runs it (see the `gpusort_cli` library).
//! Exit codes: 0 done, 1 failed (one line on stderr says why), 2 bad usage (one line too),
//! 128 + n on signal n (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP; nothing is left behind), 141 when
//! standard output is a closed pipe (quietly, as GNU tools stopped by SIGPIPE).

use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser;
use clap::error::ErrorKind;
use gpusort_cli::{Cli, CliError, error, interrupt, run};

/// A sort allocates and frees gigabytes of batches and buffers: mimalloc keeps freed memory
/// for the next allocation where glibc's malloc returns large blocks to the kernel, which
/// then zeroes fresh pages at the next touch.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            // Help and version on stdout; a closed pipe there is no error.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "gpusort: error: {}", error::clap_one_line(&e));
            return ExitCode::from(error::USAGE_EXIT);
        }
    };
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    if let gpusort_cli::Command::Sort(args) = &cli.command {
        match args.plan.memory_limit_bytes() {
            Some(_) => bound_allocator(),
            None => keep_freed_memory(),
        }
    }
    let result = interrupt::install().and_then(|()| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(|e| CliError::io("starting the async runtime", e))?;
        let result = runtime.block_on(run(cli));
        gpusort_cli::timeline::mark("main: the command returned");
        drop(runtime);
        gpusort_cli::timeline::mark("main: the async runtime is shut down");
        release_pinned();
        result
    });
    let code = match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if !e.is_broken_pipe() {
                // A closed stderr loses the line, nothing more.
                let _ = writeln!(std::io::stderr(), "gpusort: error: {}", e.one_line());
            }
            ExitCode::from(e.exit_code())
        }
    };
    // What follows (the drivers' exit handlers, the kernel freeing the process's memory) is
    // still the user's wait: a timeline's last mark, against the wall time, says how long.
    gpusort_cli::timeline::mark("main: exiting");
    code
}

/// With `GPUSORT_EXIT_RELEASE=1`, gives the pinned pool's blocks back before the process ends:
/// on threads of their own, where the driver and the kernel otherwise unpin and unmap them one
/// page after another on the exiting thread (~15 GB after a sort under a GPU budget; 0.5 s of
/// the user's wait after the last mark in stop 54's runs). Off by default until a GPU run
/// measures it against the exit (`scripts/exit_cost.py --ab`, `tpch.py`'s `*-release-pool`).
fn release_pinned() {
    if !matches!(std::env::var("GPUSORT_EXIT_RELEASE").as_deref(), Ok("1")) {
        return;
    }
    let start = std::time::Instant::now();
    let bytes = gpusort_cuda::PinnedPool::global().trim();
    gpusort_cli::timeline::mark(format_args!(
        "main: {bytes} pinned bytes given back in {:.1} ms",
        start.elapsed().as_secs_f64() * 1e3
    ));
}

/// Under `--memory-limit`, memory the sort frees goes back to the system at once: mimalloc
/// keeps freed pages for 10 ms (arenas 100 ms) and commits its arenas eagerly (then a purge
/// only marks pages free, and they stay resident), which took the peak resident size of a sort
/// of 1.6M rows at `--memory-limit 16m` to 415 MiB; with these two options, 181 MiB (the test
/// `peak_memory_follows_the_limit` measures it). Set before the first arena is made, so on
/// glibc from a constructor (below) that reads the arguments before `main`.
fn bound_allocator() {
    // SAFETY: sets two of mimalloc's options (the allocator above); both may change at any time.
    unsafe {
        mi_option_set(MI_OPTION_PURGE_DELAY, 0);
        mi_option_set(MI_OPTION_ARENA_EAGER_COMMIT, 0);
    }
}

/// Without `--memory-limit`, memory the sort frees stays with the process for its next
/// allocations: mimalloc's default returns it to the kernel after 10 ms, and the kernel zeroes
/// it again when it is touched next (a TPC-H SF10 sort faults in ~36 GB, 15-17 CPU-s of system
/// time on the H100 machine). Never purging took 0.21-0.62 s off list 1 in three of four
/// alternated pairs, the fourth equal, with 1-6 CPU-s less (`docs/results/h100-stop25-views-exit`,
/// run 7).
fn keep_freed_memory() {
    // SAFETY: sets one of mimalloc's options (the allocator above); it may change at any time.
    unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
}

// mimalloc's `mi_option_t` (the same numbers in its v2 and v3).
const MI_OPTION_ARENA_EAGER_COMMIT: libc::c_int = 4;
const MI_OPTION_PURGE_DELAY: libc::c_int = 15;
unsafe extern "C" {
    fn mi_option_set(option: libc::c_int, value: libc::c_long);
}

/// Calls [`bound_allocator`] before `main` (before Rust allocates anything) when the arguments
/// give `--memory-limit` a size that is not 0, [`keep_freed_memory`] for any other sort. glibc
/// passes `argc` and `argv` to the functions of `.init_array`; this one allocates nothing.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[used]
#[unsafe(link_section = ".init_array")]
static BOUND_ALLOCATOR_BEFORE_MAIN: extern "C" fn(libc::c_int, *const *const libc::c_char) = {
    extern "C" fn before_main(argc: libc::c_int, argv: *const *const libc::c_char) {
        if argv.is_null() {
            return;
        }
        // SAFETY: glibc's argv: `argc` pointers to NUL-terminated strings.
        let arg = |i: usize| unsafe { std::ffi::CStr::from_ptr(*argv.add(i)) }.to_bytes();
        let argc = argc.max(0) as usize;
        let sorting = (1..argc).any(|i| arg(i) == b"sort");
        let limit = (1..argc).find_map(|i| match arg(i) {
            b"--memory-limit" if i + 1 < argc => Some(arg(i + 1)),
            a => a.strip_prefix(b"--memory-limit="),
        });
        // A size with a digit other than 0 is a limit (0 and none are not).
        match (
            sorting,
            limit.is_some_and(|l| l.iter().any(|b| (b'1'..=b'9').contains(b))),
        ) {
            (true, true) => bound_allocator(),
            (true, false) => keep_freed_memory(),
            (false, _) => {}
        }
    }
    before_main
};
