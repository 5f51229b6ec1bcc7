//! The `gpusort` binary: parses the command line and runs it (see the `gpusort_cli` library).
//! Exit codes: 0 done, 1 failed (one line on stderr says why), 2 bad usage, 130 Ctrl-C.

use std::process::ExitCode;

use clap::Parser;
use gpusort_cli::{Cli, interrupt, run};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = interrupt::install().and_then(|()| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(|e| gpusort_cli::CliError::io("starting the async runtime", e))?;
        runtime.block_on(run(cli))
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpusort: error: {}", e.one_line());
            ExitCode::FAILURE
        }
    }
}
