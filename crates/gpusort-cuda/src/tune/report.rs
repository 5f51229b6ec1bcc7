//! The tables `gpusort tune` prints: the search's plan (`--dry-run`), and what it chose with the
//! speedup over the defaults.

use std::fmt::Write as _;

use super::crossover::CROSSOVER_VAR;
use super::search::{Outcome, SearchResult};
use super::space::{TuneParam, describe};
use super::workload::Workload;
use crate::options::{DIRECT_MAX_FIELDS, GpuOptions};

/// The plan of a search: its parameters and values, its workloads, its budget.
pub fn plan_table(params: &[TuneParam], workloads: &[Workload], budget_s: f64, reps: usize) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "coordinate search from the built-in defaults, one parameter at a time, within {budget_s:.0} s; \
         each candidate sorts every workload once (checked against the CPU) and {reps} times timed\n"
    );
    let _ = writeln!(s, "| setting | what | default | tried | compiles the kernels |");
    let _ = writeln!(s, "|---|---|---|---|---|");
    for p in params {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} |",
            p.var,
            p.what,
            p.default,
            p.values.join(", "),
            if p.compiles { "yes" } else { "no" }
        );
    }
    let _ = writeln!(s, "\n| workload | rows | strategy |");
    let _ = writeln!(s, "|---|---:|---|");
    for w in workloads {
        let _ = writeln!(
            s,
            "| {} | {} | {} |",
            w.name(),
            w.rows,
            w.strategy(&GpuOptions::default())
        );
    }
    s
}

/// The settings chosen (every parameter, default or not) and each workload's time with the
/// defaults and with them.
pub fn result_table(params: &[TuneParam], workloads: &[Workload], r: &SearchResult) -> String {
    let mut s = String::new();
    let measured = r
        .trials
        .iter()
        .filter(|t| matches!(t.outcome, Outcome::Timed(_)))
        .count();
    let rejected: Vec<_> = r
        .trials
        .iter()
        .filter_map(|t| match &t.outcome {
            Outcome::Rejected(why) => Some((describe(&t.settings), why)),
            Outcome::Timed(_) => None,
        })
        .collect();
    let _ = writeln!(
        s,
        "{measured} candidates measured, {} rejected, {} left untried by the budget, in {:.1} s\n",
        rejected.len(),
        r.untried,
        r.elapsed.as_secs_f64()
    );
    let _ = writeln!(s, "| setting | what | default | chosen |");
    let _ = writeln!(s, "|---|---|---|---|");
    for p in params {
        let chosen = r.chosen.get(p.var).map_or("default", String::as_str);
        let _ = writeln!(s, "| {} | {} | {} | {chosen} |", p.var, p.what, p.default);
    }
    let crossover = r.chosen.get(CROSSOVER_VAR).map_or("default", String::as_str);
    let _ = writeln!(
        s,
        "| {CROSSOVER_VAR} | most fields sorted directly | {DIRECT_MAX_FIELDS} | {} |",
        if r.crossover.is_empty() {
            "not measured"
        } else {
            crossover
        }
    );
    let tuned = GpuOptions::from_vars(|n| r.chosen.get(n).cloned()).unwrap_or_default();
    let _ = writeln!(s, "\n| workload | strategy | defaults (ms) | tuned (ms) | speedup |");
    let _ = writeln!(s, "|---|---|---:|---:|---:|");
    for (i, name) in r.workloads.iter().enumerate() {
        let (d, t) = (r.defaults_ms[i], r.chosen_ms[i]);
        let strategy = workloads.get(i).map_or(String::new(), |w| {
            let (d, t) = (w.strategy(&GpuOptions::default()), w.strategy(&tuned));
            if d == t { d.to_string() } else { format!("{d} -> {t}") }
        });
        let _ = writeln!(s, "| {name} | {strategy} | {d:.3} | {t:.3} | {:.3}x |", d / t);
    }
    let (d, t): (f64, f64) = (r.defaults_ms.iter().sum(), r.chosen_ms.iter().sum());
    let _ = writeln!(s, "| total | | {d:.3} | {t:.3} | {:.3}x |", r.speedup());
    for (what, why) in rejected {
        let _ = writeln!(s, "rejected: {what}: {why}");
    }
    if !r.crossover.is_empty() {
        let _ = writeln!(s, "\n| fields | SRTS-direct (ms) | SRTS-indirect (ms) |");
        let _ = writeln!(s, "|---:|---:|---:|");
        let ms = |t: Option<f64>| t.map_or("wrong".to_string(), |t| format!("{t:.3}"));
        for p in &r.crossover {
            let _ = writeln!(s, "| {} | {} | {} |", p.fields, ms(p.direct_ms), ms(p.indirect_ms));
        }
    }
    for (var, why) in &r.skipped {
        let _ = writeln!(s, "not searched: {var} ({why})");
    }
    s
}
