//! The `gpusort` binary: parses the command line and runs it (see the `gpusort_cli` library).
//! Exit codes: 0 done, 1 failed (one line on stderr says why), 2 bad usage (one line too),
//! 128 + n on signal n (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP; nothing is left behind), 141 when
//! standard output is a closed pipe (quietly, as GNU tools stopped by SIGPIPE).

use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser;
use clap::error::ErrorKind;
use gpusort_cli::{Cli, CliError, error, interrupt, run};

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
    let result = interrupt::install().and_then(|()| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(|e| CliError::io("starting the async runtime", e))?;
        runtime.block_on(run(cli))
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if !e.is_broken_pipe() {
                // A closed stderr loses the line, nothing more.
                let _ = writeln!(std::io::stderr(), "gpusort: error: {}", e.one_line());
            }
            ExitCode::from(e.exit_code())
        }
    }
}
