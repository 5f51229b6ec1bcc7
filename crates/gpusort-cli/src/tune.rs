//! `gpusort tune`: the arguments of the empirical per-GPU tuning, its progress on stderr and its
//! table on stdout. The search is the library's ([`gpusort_cuda::Tuner`]).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use gpusort_cuda::{KernelCache, Tuner};

use crate::error::{CliError, Result};

/// `gpusort tune`'s arguments.
#[derive(Debug, Clone, Args)]
pub struct TuneArgs {
    /// Time for the whole search: seconds, or with a unit (90s, 2m, 1m30s)
    #[arg(long, value_name = "DURATION", default_value = "2m", value_parser = parse_duration)]
    pub budget: Duration,

    /// The GPU to tune
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub device: usize,

    /// Print the parameters, values and workloads the search would try, and measure nothing
    #[arg(long)]
    pub dry_run: bool,

    /// Write the profile into DIR instead of the kernel cache directory (where sorts look
    /// for it; GPUSORT_TUNING=FILE makes them read another)
    #[arg(long, value_name = "DIR")]
    pub output: Option<PathBuf>,

    /// Size of the workloads, a fraction of 100M keys and 10M records (default: from the
    /// budget, full size from 90 s on)
    #[arg(long, value_name = "FRACTION", value_parser = parse_scale)]
    pub scale: Option<f64>,

    /// Timed sorts of each workload a candidate
    #[arg(long, value_name = "N", default_value_t = gpusort_cuda::tune::DEFAULT_REPS)]
    pub reps: usize,

    /// Print no progress, only the table
    #[arg(short, long)]
    pub quiet: bool,
}

impl TuneArgs {
    /// The library's tuning run of these arguments.
    pub fn tuner(&self) -> Tuner {
        let t = Tuner::new(self.device)
            .with_budget(self.budget)
            .with_reps(self.reps)
            .with_output_dir(self.output.clone());
        match self.scale {
            Some(s) => t.with_scale(s),
            None => t,
        }
    }
}

/// Runs `gpusort tune`: the plan (`--dry-run`), or the search with its progress on stderr;
/// returns the table for stdout.
pub fn tune(args: &TuneArgs) -> Result<String> {
    let tuner = args.tuner();
    let cache = KernelCache::from_env();
    let engine = |e: gpusort_cuda::CudaSortError| CliError::Engine(e.to_string());
    if args.dry_run {
        let dir = match tuner.profile_dir(&cache) {
            Ok(dir) => dir.display().to_string(),
            Err(e) => e.to_string(),
        };
        return Ok(format!(
            "{}\nprofile directory: {dir} (nothing measured or written: --dry-run)\n",
            tuner.plan()
        ));
    }
    let outcome = tuner
        .run(&cache, &mut |event| {
            if !args.quiet {
                crate::progress::to_stderr(format_args!("tune: {event}\n"));
            }
        })
        .map_err(engine)?;
    Ok(format!(
        "tuned {}\n\n{}\nprofile written to {}\n",
        outcome.device,
        outcome.table(),
        outcome.written.display()
    ))
}

/// A duration: seconds, or numbers each with a unit `s`, `m` or `h` (`90s`, `2m`, `1m30s`).
pub fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    let t = s.trim().to_ascii_lowercase();
    let bad = || format!("expected a duration like 120, 90s, 2m or 1m30s, got '{s}'");
    if let Ok(secs) = t.parse::<f64>() {
        return (secs.is_finite() && secs > 0.0)
            .then(|| Duration::from_secs_f64(secs))
            .ok_or_else(bad);
    }
    let (mut total, mut number) = (0.0, String::new());
    for c in t.chars() {
        match c {
            '0'..='9' | '.' => number.push(c),
            's' | 'm' | 'h' if !number.is_empty() => {
                let n: f64 = number.parse().map_err(|_| bad())?;
                total += n * match c {
                    's' => 1.0,
                    'm' => 60.0,
                    _ => 3600.0,
                };
                number.clear();
            }
            _ => return Err(bad()),
        }
    }
    if !number.is_empty() || total <= 0.0 {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(total))
}

/// A fraction in (0, 1].
fn parse_scale(s: &str) -> std::result::Result<f64, String> {
    s.trim()
        .parse::<f64>()
        .ok()
        .filter(|f| *f > 0.0 && *f <= 1.0)
        .ok_or_else(|| format!("expected a fraction above 0 and at most 1, got '{s}'"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Cli, Command};
    use clap::Parser;

    #[test]
    fn durations_parse() {
        for (s, secs) in [
            ("120", 120.0),
            ("90s", 90.0),
            ("2m", 120.0),
            ("1m30s", 90.0),
            ("1h", 3600.0),
            ("0.5", 0.5),
        ] {
            assert_eq!(parse_duration(s).unwrap(), Duration::from_secs_f64(secs), "{s}");
        }
        for bad in ["", "0", "-3", "2x", "m", "2m3", "soon"] {
            let err = parse_duration(bad).unwrap_err();
            assert!(err.contains(&format!("'{bad}'")), "{err}");
        }
    }

    #[test]
    fn tune_arguments_parse() {
        let parse = |args: &[&str]| match Cli::try_parse_from(args) {
            Ok(Cli {
                command: Command::Tune(t),
            }) => Ok(t),
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e.to_string()),
        };
        let t = parse(&["gpusort", "tune"]).unwrap();
        assert_eq!(
            (t.budget, t.device, t.dry_run, t.scale),
            (Duration::from_secs(120), 0, false, None)
        );
        let t = parse(&[
            "gpusort",
            "tune",
            "--budget",
            "45s",
            "--device",
            "1",
            "--dry-run",
            "--scale",
            "0.1",
        ])
        .unwrap();
        assert_eq!(
            (t.budget, t.device, t.dry_run, t.scale),
            (Duration::from_secs(45), 1, true, Some(0.1))
        );
        assert!(
            parse(&["gpusort", "tune", "--budget", "soon"])
                .unwrap_err()
                .contains("soon")
        );
        assert!(parse(&["gpusort", "tune", "--scale", "2"]).is_err());
    }

    /// `--dry-run` needs no GPU: it prints the plan and where the profile would go.
    #[test]
    fn a_dry_run_prints_the_plan_and_measures_nothing() {
        let dir = std::env::temp_dir().join(format!("gpusort-cli-tune-{}", std::process::id()));
        let args = TuneArgs {
            budget: Duration::from_secs(30),
            device: 0,
            dry_run: true,
            output: Some(dir.clone()),
            scale: None,
            reps: 3,
            quiet: true,
        };
        let text = tune(&args).unwrap();
        assert!(text.contains("| GPUSORT_ONESWEEP_IPT | "), "{text}");
        assert!(text.contains("within 30 s"), "{text}");
        assert!(
            text.contains(&format!("profile directory: {}", dir.display())),
            "{text}"
        );
        assert!(!dir.exists(), "a dry run wrote {}", dir.display());
    }
}
