//! The empirical search itself, with no GPU in it: a coordinate search from the built-in
//! defaults over [`SEARCH_SPACE`](super::SEARCH_SPACE), one parameter at a time, each candidate
//! timed by a [`Measurer`] (the GPU's is [`GpuMeasurer`](super::GpuMeasurer); the tests use
//! fakes), within a time budget. A candidate whose output is wrong, or which does not compile,
//! is rejected and never chosen. The best is re-measured beside the defaults at the end, so the
//! speedup compares two measurements taken close together (runs minutes apart differ by up to
//! ~10% on the H100, `kernels/NOTES.md`).

use std::collections::BTreeSet;
use std::time::Duration;

use super::crossover::{CROSSOVER_FIELDS, CROSSOVER_VAR, CrossoverPoint, direct_max_fields};
use super::space::{Settings, TuneParam, describe};
use crate::error::{CudaSortError, Result};
use crate::options::{DIRECT_MAX_FIELDS, GpuOptions};

/// What measuring one candidate gave.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Its sorts were right: the time of each workload, in ms (the measurer's order).
    Timed(Vec<f64>),
    /// It cannot be chosen: a sort's output differed from the CPU's, or it did not compile or
    /// launch; the reason.
    Rejected(String),
}

/// Times candidates on the present GPU (or, in tests, pretends to).
pub trait Measurer {
    /// The workloads each candidate is timed on, by name.
    fn workloads(&self) -> Vec<String>;

    /// Whether a workload runs the MSD hybrid (else parameters of it alone are not searched).
    fn runs_msd(&self) -> bool;

    /// Anything before the first measurement (the inputs, their CPU reference); counted in
    /// the budget but not in any candidate's cost.
    fn prepare(&mut self) -> Result<()> {
        Ok(())
    }

    /// Times the workloads with `settings` over the defaults and checks their output. An
    /// `Err` ends the search (no GPU, say); a bad candidate is [`Outcome::Rejected`].
    fn measure(&mut self, settings: &Settings) -> Result<Outcome>;

    /// Times SRTS-direct and SRTS-indirect on records of a u32 key and each of `fields` u32
    /// fields, with `settings`, each output checked; `None` when it does not time crossovers.
    fn crossover(&mut self, settings: &Settings, fields: &[usize]) -> Result<Option<Vec<CrossoverPoint>>> {
        let _ = (settings, fields);
        Ok(None)
    }
}

/// One candidate the search looked at.
#[derive(Debug, Clone, PartialEq)]
pub struct Trial {
    /// Its settings (over the defaults).
    pub settings: Settings,
    /// What happened: measured, rejected, or refused before measuring.
    pub outcome: Outcome,
    /// The time it took, compiling included.
    pub cost: Duration,
}

impl Trial {
    /// Its total time when it was measured and right.
    pub fn total_ms(&self) -> Option<f64> {
        match &self.outcome {
            Outcome::Timed(t) => Some(t.iter().sum()),
            Outcome::Rejected(_) => None,
        }
    }
}

/// What the search reports while it runs.
#[derive(Debug, Clone, PartialEq)]
pub enum TuneEvent {
    /// The inputs and their CPU reference are ready.
    Prepared {
        /// Seconds it took.
        seconds: f64,
    },
    /// A candidate was measured (or rejected).
    Tried {
        /// The candidate.
        trial: Trial,
        /// The best total so far, in ms.
        best_ms: f64,
        /// Whether it is the new best.
        better: bool,
    },
    /// The budget leaves no room for another candidate.
    OutOfBudget {
        /// Candidates not tried.
        left: usize,
    },
    /// The direct/indirect crossover was measured.
    Crossover {
        /// Each fields count's times.
        points: Vec<CrossoverPoint>,
        /// The crossover found.
        direct_max_fields: Option<usize>,
    },
    /// The best and the defaults are measured once more, side by side.
    Confirming,
}

impl std::fmt::Display for TuneEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Prepared { seconds } => write!(f, "inputs and their CPU reference ready in {seconds:.1} s"),
            Self::Tried { trial, best_ms, better } => {
                let what = describe(&trial.settings);
                match (&trial.outcome, trial.total_ms()) {
                    (_, Some(ms)) => write!(
                        f,
                        "{what}: {ms:.3} ms{} ({:.1} s)",
                        if *better { ", the best so far" } else { "" },
                        trial.cost.as_secs_f64()
                    ),
                    (Outcome::Rejected(why), None) => write!(f, "{what}: rejected: {why} (best {best_ms:.3} ms)"),
                    _ => Ok(()),
                }
            }
            Self::OutOfBudget { left } => write!(f, "the budget is spent: {left} candidates not tried"),
            Self::Crossover {
                points,
                direct_max_fields,
            } => {
                let ms = |t: Option<f64>| t.map_or("wrong".to_string(), |t| format!("{t:.3}"));
                let each: Vec<String> = points
                    .iter()
                    .map(|p| format!("m = {}: {} / {}", p.fields, ms(p.direct_ms), ms(p.indirect_ms)))
                    .collect();
                write!(
                    f,
                    "direct / indirect (ms) {}; direct up to {}",
                    each.join(", "),
                    direct_max_fields.map_or("(none measured)".to_string(), |m| format!("m = {m}"))
                )
            }
            Self::Confirming => write!(f, "measuring the defaults and the best again, side by side"),
        }
    }
}

/// What the search found.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchResult {
    /// The workloads, by name.
    pub workloads: Vec<String>,
    /// Each workload's time with the defaults (ms; the minimum of their measurements).
    pub defaults_ms: Vec<f64>,
    /// The settings chosen (empty: the defaults).
    pub chosen: Settings,
    /// Each workload's time with them (ms).
    pub chosen_ms: Vec<f64>,
    /// Every candidate, in the order tried (the defaults first).
    pub trials: Vec<Trial>,
    /// Candidates the budget left untried.
    pub untried: usize,
    /// Parameters not searched, and why.
    pub skipped: Vec<(&'static str, &'static str)>,
    /// The direct/indirect crossover's measurements (empty: not measured).
    pub crossover: Vec<CrossoverPoint>,
    /// Time the whole search took.
    pub elapsed: Duration,
}

impl SearchResult {
    /// The defaults' total time over the chosen settings' (1.0: the defaults were kept).
    pub fn speedup(&self) -> f64 {
        let chosen: f64 = self.chosen_ms.iter().sum();
        if chosen > 0.0 {
            self.defaults_ms.iter().sum::<f64>() / chosen
        } else {
            1.0
        }
    }
}

/// A coordinate search over parameters of the space (Huang, Gao & Li, section 4: the range of
/// each parameter bounded first, then searched empirically), within a budget.
#[derive(Debug, Clone)]
pub struct TuneSearch {
    params: Vec<TuneParam>,
    budget: Duration,
    min_gain: f64,
    sweeps: usize,
}

/// The default budget of a search: two minutes.
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(120);

impl TuneSearch {
    /// A search over `params`, with a budget of [`DEFAULT_BUDGET`], candidates taken when 1%
    /// faster, one sweep over the parameters.
    pub fn new(params: &[TuneParam]) -> Self {
        Self {
            params: params.to_vec(),
            budget: DEFAULT_BUDGET,
            min_gain: 0.01,
            sweeps: 1,
        }
    }

    /// With `budget` for the whole search (inputs, compiles and measurements).
    pub fn with_budget(mut self, budget: Duration) -> Self {
        self.budget = budget;
        self
    }

    /// A candidate replaces the best only when its total time is at least `gain` (a fraction)
    /// lower: differences within the noise of a measurement are not taken.
    pub fn with_min_gain(mut self, gain: f64) -> Self {
        self.min_gain = gain.max(0.0);
        self
    }

    /// Sweeps over the parameters at most `sweeps` times (another sweep only when the last one
    /// changed something).
    pub fn with_sweeps(mut self, sweeps: usize) -> Self {
        self.sweeps = sweeps.max(1);
        self
    }

    /// The budget.
    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// The parameters.
    pub fn params(&self) -> &[TuneParam] {
        &self.params
    }

    /// Runs the search with `measurer`; `elapsed` is the time since the search started (a
    /// clock the tests control); `progress` hears each step.
    pub fn run(
        &self,
        measurer: &mut dyn Measurer,
        elapsed: &dyn Fn() -> Duration,
        progress: &mut dyn FnMut(&TuneEvent),
    ) -> Result<SearchResult> {
        measurer.prepare()?;
        progress(&TuneEvent::Prepared {
            seconds: elapsed().as_secs_f64(),
        });
        let mut state = State::new(measurer.workloads(), elapsed);
        let (defaults, _) = state.try_candidate(measurer, Settings::new(), self.min_gain, progress)?;
        let defaults_ms = match &defaults.outcome {
            Outcome::Timed(t) => t.clone(),
            Outcome::Rejected(why) => {
                return Err(CudaSortError::Tuning(format!(
                    "the built-in defaults were rejected: {why}"
                )));
            }
        };
        state.defaults_ms = defaults_ms;
        // Room kept for the confirmation: the defaults and the best once more each.
        let reserve = defaults.cost * 2;
        let (params, skipped) = self.applicable(measurer.runs_msd());
        'sweeps: for _ in 0..self.sweeps {
            let mut changed = false;
            for (i, p) in params.iter().enumerate() {
                for value in candidate_values(p, &state.best.0) {
                    let mut settings = state.best.0.clone();
                    match value {
                        Some(v) => settings.insert(p.var.to_string(), v.to_string()),
                        None => settings.remove(p.var),
                    };
                    if !state.tried.insert(settings.clone())
                        || GpuOptions::from_vars(|n| settings.get(n).cloned()).is_err()
                    {
                        continue;
                    }
                    if elapsed() + state.max_cost + reserve > self.budget {
                        let left = params[i..].iter().map(|p| p.values.len()).sum();
                        state.untried = left;
                        progress(&TuneEvent::OutOfBudget { left });
                        break 'sweeps;
                    }
                    changed |= state.try_candidate(measurer, settings, self.min_gain, progress)?.1;
                }
            }
            if !changed {
                break;
            }
        }
        self.crossover(&mut state, measurer, progress)?;
        self.confirm(&mut state, measurer, reserve, progress)?;
        Ok(SearchResult {
            workloads: state.workloads,
            defaults_ms: state.defaults_ms,
            chosen: state.best.0,
            chosen_ms: state.best.1,
            trials: state.trials,
            untried: state.untried,
            skipped,
            crossover: state.crossover,
            elapsed: elapsed(),
        })
    }

    /// The parameters searched, and those skipped with why.
    fn applicable(&self, runs_msd: bool) -> (Vec<TuneParam>, Vec<(&'static str, &'static str)>) {
        let (on, off): (Vec<_>, Vec<_>) = self.params.iter().partition(|p| runs_msd || !p.msd_only);
        (
            on,
            off.iter().map(|p| (p.var, "no workload runs the MSD hybrid")).collect(),
        )
    }

    /// Measures the direct/indirect crossover with the best settings, when the budget leaves
    /// room for it (about two measurements) and the confirmation, and adds it to them where it
    /// is not the default.
    fn crossover(
        &self,
        state: &mut State<'_>,
        measurer: &mut dyn Measurer,
        progress: &mut dyn FnMut(&TuneEvent),
    ) -> Result<()> {
        let one = state.trials.first().map_or(Duration::ZERO, |t| t.cost);
        if (state.elapsed)() + one * 4 > self.budget {
            return Ok(());
        }
        let Some(points) = measurer.crossover(&state.best.0, CROSSOVER_FIELDS)? else {
            return Ok(());
        };
        let found = direct_max_fields(&points);
        progress(&TuneEvent::Crossover {
            points: points.clone(),
            direct_max_fields: found,
        });
        match found {
            Some(m) if m != DIRECT_MAX_FIELDS => {
                state.best.0.insert(CROSSOVER_VAR.to_string(), m.to_string());
            }
            _ => {
                state.best.0.remove(CROSSOVER_VAR);
            }
        }
        state.crossover = points;
        Ok(())
    }

    /// Measures the defaults and the best again, side by side (when the budget allows); the
    /// best is kept only if it is still faster in total.
    fn confirm(
        &self,
        state: &mut State<'_>,
        measurer: &mut dyn Measurer,
        reserve: Duration,
        progress: &mut dyn FnMut(&TuneEvent),
    ) -> Result<()> {
        if state.best.0.is_empty() {
            state.best.1 = state.defaults_ms.clone();
            return Ok(());
        }
        let best_cost = state
            .trials
            .iter()
            .find(|t| t.settings == state.best.0)
            .map_or(reserve, |t| t.cost);
        let defaults_cost = state.trials.first().map_or(reserve, |t| t.cost);
        if (state.elapsed)() + defaults_cost + best_cost <= self.budget {
            progress(&TuneEvent::Confirming);
            let again = state.measure(measurer, &Settings::new())?;
            let best_again = state.measure(measurer, &state.best.0.clone())?;
            if let (Outcome::Timed(d), Outcome::Timed(b)) = (again.outcome, best_again.outcome) {
                // The pair measured side by side replaces the search's numbers, which may lie
                // minutes apart.
                state.defaults_ms = d;
                state.best.1 = b;
            } else {
                // Rejected now although right before: not to be trusted.
                state.best = (Settings::new(), state.defaults_ms.clone());
            }
        }
        if state.best.1.iter().sum::<f64>() >= state.defaults_ms.iter().sum::<f64>() {
            state.best = (Settings::new(), state.defaults_ms.clone());
        }
        Ok(())
    }
}

/// The values of `p` to try from `best`: each of its values and its default, but the current.
fn candidate_values(p: &TuneParam, best: &Settings) -> Vec<Option<&'static str>> {
    let current = best.get(p.var).map(String::as_str);
    std::iter::once(None)
        .chain(p.values.iter().map(|v| Some(*v)))
        .filter(|v| *v != current)
        .collect()
}

/// The search's running state.
struct State<'a> {
    workloads: Vec<String>,
    elapsed: &'a dyn Fn() -> Duration,
    best: (Settings, Vec<f64>),
    defaults_ms: Vec<f64>,
    trials: Vec<Trial>,
    tried: BTreeSet<Settings>,
    max_cost: Duration,
    untried: usize,
    crossover: Vec<CrossoverPoint>,
}

impl<'a> State<'a> {
    fn new(workloads: Vec<String>, elapsed: &'a dyn Fn() -> Duration) -> Self {
        Self {
            workloads,
            elapsed,
            best: (Settings::new(), vec![]),
            defaults_ms: vec![],
            trials: vec![],
            tried: BTreeSet::from([Settings::new()]),
            max_cost: Duration::ZERO,
            untried: 0,
            crossover: vec![],
        }
    }

    /// Measures `settings` (a trial of its own, reported), checking the workload count.
    fn measure(&mut self, measurer: &mut dyn Measurer, settings: &Settings) -> Result<Trial> {
        let start = (self.elapsed)();
        let mut outcome = measurer.measure(settings)?;
        if let Outcome::Timed(t) = &outcome
            && t.len() != self.workloads.len()
        {
            outcome = Outcome::Rejected(format!("{} times for {} workloads", t.len(), self.workloads.len()));
        }
        let cost = (self.elapsed)().saturating_sub(start);
        self.max_cost = self.max_cost.max(cost);
        Ok(Trial {
            settings: settings.clone(),
            outcome,
            cost,
        })
    }

    /// Measures a candidate, takes it as the best when it was right and at least `min_gain`
    /// faster (the first, the defaults, always), records it and reports it.
    fn try_candidate(
        &mut self,
        measurer: &mut dyn Measurer,
        settings: Settings,
        min_gain: f64,
        progress: &mut dyn FnMut(&TuneEvent),
    ) -> Result<(Trial, bool)> {
        let trial = self.measure(measurer, &settings)?;
        let best_ms: f64 = self.best.1.iter().sum();
        let better = match (&trial.outcome, trial.total_ms()) {
            (Outcome::Timed(times), Some(ms)) if self.best.1.is_empty() || ms < best_ms * (1.0 - min_gain) => {
                self.best = (trial.settings.clone(), times.clone());
                true
            }
            _ => false,
        };
        progress(&TuneEvent::Tried {
            trial: trial.clone(),
            best_ms: self.best.1.iter().sum(),
            better,
        });
        self.trials.push(trial.clone());
        Ok((trial, better))
    }
}
