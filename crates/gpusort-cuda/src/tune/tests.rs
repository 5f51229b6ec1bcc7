//! The search with fake measurers (no GPU), and one short tuning run on the GPU where there is
//! one (`GPUSORT_REQUIRE_GPU=1` makes its absence a failure).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::time::Duration;

use super::*;

/// The times of a candidate from its settings and how often they were measured before, or
/// `None` for a wrong output.
type TimesOf<'a> = Box<dyn Fn(&Settings, usize) -> Option<Vec<f64>> + 'a>;

/// A measurer whose times are a function of the settings and whose clock moves by a fixed
/// cost a measurement (more when the settings compile the kernels).
struct Fake<'a> {
    clock: &'a Cell<Duration>,
    cost: Duration,
    compile_cost: Duration,
    /// The times of a candidate, or `None` for a wrong output; the count of earlier
    /// measurements of the same settings is given too.
    times: TimesOf<'a>,
    calls: RefCell<BTreeMap<Settings, usize>>,
}

impl<'a> Fake<'a> {
    fn new(clock: &'a Cell<Duration>, times: impl Fn(&Settings, usize) -> Option<Vec<f64>> + 'a) -> Self {
        Self {
            clock,
            cost: Duration::from_secs(1),
            compile_cost: Duration::from_secs(3),
            times: Box::new(times),
            calls: RefCell::new(BTreeMap::new()),
        }
    }

    fn measured(&self) -> usize {
        self.calls.borrow().values().sum()
    }
}

impl Measurer for Fake<'_> {
    fn workloads(&self) -> Vec<String> {
        vec!["small".into(), "large".into()]
    }

    fn runs_msd(&self) -> bool {
        false
    }

    fn measure(&mut self, settings: &Settings) -> Result<Outcome> {
        let compiles = SEARCH_SPACE.iter().any(|p| p.compiles && settings.contains_key(p.var));
        let cost = self.cost + if compiles { self.compile_cost } else { Duration::ZERO };
        self.clock.set(self.clock.get() + cost);
        let mut calls = self.calls.borrow_mut();
        let seen = calls.entry(settings.clone()).or_default();
        let out = (self.times)(settings, *seen);
        *seen += 1;
        Ok(match out {
            Some(t) => Outcome::Timed(t),
            None => Outcome::Rejected("wrong output: column 0, sorted row 3".into()),
        })
    }
}

/// The default times [2, 8] ms, scaled by `factor` of the settings.
fn scaled(settings: &Settings, factor: impl Fn(&str, &str) -> f64) -> Vec<f64> {
    let f: f64 = settings.iter().map(|(k, v)| factor(k, v)).product();
    vec![2.0 * f, 8.0 * f]
}

fn run(search: &TuneSearch, fake: &mut Fake<'_>) -> (SearchResult, Vec<TuneEvent>) {
    let clock = fake.clock;
    let mut events = vec![];
    let r = search
        .run(fake, &|| clock.get(), &mut |e| events.push(e.clone()))
        .unwrap();
    (r, events)
}

/// The candidates one sweep tries: every value of every parameter but the MSD-only ones.
fn one_sweep() -> usize {
    SEARCH_SPACE
        .iter()
        .filter(|p| !p.msd_only)
        .map(|p| p.values.len())
        .sum()
}

#[test]
fn the_defaults_are_kept_when_nothing_is_faster() {
    let clock = Cell::new(Duration::ZERO);
    let mut fake = Fake::new(&clock, |_, _| Some(vec![2.0, 8.0]));
    let search = TuneSearch::new(SEARCH_SPACE).with_budget(Duration::from_secs(3600));
    let (r, events) = run(&search, &mut fake);
    assert!(r.chosen.is_empty(), "{:?}", r.chosen);
    assert_eq!(r.speedup(), 1.0);
    assert_eq!(
        (r.defaults_ms.clone(), r.chosen_ms.clone()),
        (vec![2.0, 8.0], vec![2.0, 8.0])
    );
    // The defaults, then every value of every parameter once; no confirmation (nothing chosen).
    assert_eq!(r.trials.len(), 1 + one_sweep());
    assert_eq!(fake.measured(), 1 + one_sweep());
    assert!(r.trials[0].settings.is_empty());
    assert_eq!(r.untried, 0);
    assert_eq!(r.skipped, vec![("GPUSORT_MSD_BITS", "no workload runs the MSD hybrid")]);
    assert!(matches!(events[0], TuneEvent::Prepared { .. }));
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, TuneEvent::OutOfBudget { .. } | TuneEvent::Confirming))
    );
}

#[test]
fn faster_candidates_are_kept_one_parameter_at_a_time() {
    let clock = Cell::new(Duration::ZERO);
    let mut fake = Fake::new(&clock, |s, _| {
        Some(scaled(s, |k, v| match (k, v) {
            ("GPUSORT_ONESWEEP_IPT", "24") => 0.9,
            ("GPUSORT_ONESWEEP_IPT", "16") => 0.95,
            ("GPUSORT_PAIR_LANES", "0") => 0.96,
            ("GPUSORT_IPT", "12") => 1.2,
            _ => 1.0,
        }))
    });
    let search = TuneSearch::new(SEARCH_SPACE).with_budget(Duration::from_secs(3600));
    let (r, events) = run(&search, &mut fake);
    let want: Settings = [
        ("GPUSORT_ONESWEEP_IPT".to_string(), "24".to_string()),
        ("GPUSORT_PAIR_LANES".to_string(), "0".to_string()),
    ]
    .into();
    assert_eq!(r.chosen, want);
    assert!((r.speedup() - 1.0 / (0.9 * 0.96)).abs() < 1e-9, "{}", r.speedup());
    // The pair-lanes candidate was tried on top of the best one-sweep tile, not alone.
    let pair = r
        .trials
        .iter()
        .find(|t| t.settings.contains_key("GPUSORT_PAIR_LANES"))
        .unwrap();
    assert_eq!(pair.settings, want);
    // A second sweep (the first changed something) tries the other values around the new best.
    let twice = TuneSearch::new(SEARCH_SPACE)
        .with_budget(Duration::from_secs(3600))
        .with_sweeps(2);
    let clock2 = Cell::new(Duration::ZERO);
    let mut fake2 = Fake::new(&clock2, |s, _| {
        Some(scaled(s, |k, v| {
            if (k, v) == ("GPUSORT_ONESWEEP_IPT", "24") {
                0.9
            } else {
                1.0
            }
        }))
    });
    let (r2, _) = run(&twice, &mut fake2);
    assert_eq!(r2.chosen.len(), 1);
    assert!(r2.trials.len() > r.trials.len() - 1, "{}", r2.trials.len());
    // The defaults and the best were measured again at the end.
    assert!(events.contains(&TuneEvent::Confirming));
    assert_eq!(fake.calls.borrow()[&Settings::new()], 2);
    assert_eq!(fake.calls.borrow()[&want], 2);
}

#[test]
fn a_candidate_with_a_wrong_output_is_never_chosen() {
    let clock = Cell::new(Duration::ZERO);
    // GPUSORT_IPT=12 would be by far the fastest, but its output is wrong.
    let mut fake = Fake::new(&clock, |s, _| {
        if s.get("GPUSORT_IPT").map(String::as_str) == Some("12") {
            return None;
        }
        Some(scaled(s, |k, v| {
            if (k, v) == ("GPUSORT_RANK_FOLD", "0") {
                0.97
            } else {
                1.0
            }
        }))
    });
    let search = TuneSearch::new(SEARCH_SPACE).with_budget(Duration::from_secs(3600));
    let (r, events) = run(&search, &mut fake);
    assert_eq!(r.chosen.get("GPUSORT_IPT"), None);
    assert_eq!(r.chosen.get("GPUSORT_RANK_FOLD").map(String::as_str), Some("0"));
    let rejected: Vec<&Trial> = r
        .trials
        .iter()
        .filter(|t| matches!(t.outcome, Outcome::Rejected(_)))
        .collect();
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].settings.get("GPUSORT_IPT").map(String::as_str), Some("12"));
    assert!(
        events
            .iter()
            .any(|e| e.to_string().contains("GPUSORT_IPT=12: rejected: wrong output"))
    );
    let table = report::result_table(SEARCH_SPACE, &Workload::defaults(1.0)[..2], &r);
    assert!(table.contains("rejected: GPUSORT_IPT=12: wrong output"), "{table}");
    assert!(table.contains("| GPUSORT_RANK_FOLD | "), "{table}");
    // The defaults themselves wrong: no search at all.
    let clock = Cell::new(Duration::ZERO);
    let mut broken = Fake::new(&clock, |_, _| None);
    let err = search.run(&mut broken, &|| clock.get(), &mut |_| {}).unwrap_err();
    assert!(err.to_string().contains("defaults were rejected"), "{err}");
}

#[test]
fn the_search_stops_within_its_budget() {
    let clock = Cell::new(Duration::ZERO);
    let mut fake = Fake::new(&clock, |s, _| {
        Some(scaled(s, |k, _| if k == "GPUSORT_ONESWEEP_IPT" { 0.9 } else { 1.0 }))
    });
    // 1 s a measurement, 3 s more a compile: the defaults, then compiling candidates of 4 s each,
    // with 2 s kept for the confirmation.
    let budget = Duration::from_secs(30);
    let search = TuneSearch::new(SEARCH_SPACE).with_budget(budget);
    let (r, events) = run(&search, &mut fake);
    assert!(clock.get() <= budget, "{:?}", clock.get());
    assert!(r.elapsed <= budget);
    assert!(r.untried > 0);
    assert!(r.trials.len() < 1 + one_sweep(), "{}", r.trials.len());
    assert!(r.trials.len() >= 4, "{}", r.trials.len());
    assert!(events.iter().any(|e| matches!(e, TuneEvent::OutOfBudget { .. })));
    // What was found before the budget ran out is kept and confirmed.
    assert_eq!(r.chosen.get("GPUSORT_ONESWEEP_IPT").map(String::as_str), Some("16"));
    assert!(events.contains(&TuneEvent::Confirming));
    // A budget that leaves room for nothing but the defaults measures only them.
    let clock = Cell::new(Duration::ZERO);
    let mut fake = Fake::new(&clock, |_, _| Some(vec![1.0, 1.0]));
    let (r, _) = run(
        &TuneSearch::new(SEARCH_SPACE).with_budget(Duration::from_secs(2)),
        &mut fake,
    );
    assert_eq!((r.trials.len(), r.chosen.len()), (1, 0));
}

#[test]
fn gains_within_the_noise_are_not_taken_and_unconfirmed_ones_are_dropped() {
    let clock = Cell::new(Duration::ZERO);
    // 0.5% faster: under the 1% a candidate must gain.
    let mut fake = Fake::new(&clock, |s, _| {
        Some(scaled(
            s,
            |k, _| if k == "GPUSORT_ONESWEEP_BLOCK" { 0.995 } else { 1.0 },
        ))
    });
    let search = TuneSearch::new(SEARCH_SPACE).with_budget(Duration::from_secs(3600));
    assert!(run(&search, &mut fake).0.chosen.is_empty());
    let (r, _) = run(&search.clone().with_min_gain(0.001), &mut fake);
    assert_eq!(r.chosen.len(), 1);
    // Faster the first time only: measured again beside the defaults it is not, so the
    // defaults stay.
    let clock = Cell::new(Duration::ZERO);
    let mut fluke = Fake::new(&clock, |s, seen| {
        Some(scaled(s, |k, _| match (k, seen) {
            ("GPUSORT_ONESWEEP_KEEP_WORDS", 0) => 0.8,
            ("GPUSORT_ONESWEEP_KEEP_WORDS", _) => 1.05,
            _ => 1.0,
        }))
    });
    let (r, _) = run(&search, &mut fluke);
    assert!(r.chosen.is_empty(), "{:?}", r.chosen);
    assert_eq!(r.speedup(), 1.0);
}

/// A measurer that times crossovers: direct wins up to `direct_up_to` fields.
struct WithCrossover<'a> {
    inner: Fake<'a>,
    direct_up_to: usize,
    asked: Vec<Settings>,
}

impl Measurer for WithCrossover<'_> {
    fn workloads(&self) -> Vec<String> {
        self.inner.workloads()
    }
    fn runs_msd(&self) -> bool {
        false
    }
    fn measure(&mut self, settings: &Settings) -> Result<Outcome> {
        self.inner.measure(settings)
    }
    fn crossover(&mut self, settings: &Settings, fields: &[usize]) -> Result<Option<Vec<CrossoverPoint>>> {
        self.asked.push(settings.clone());
        self.inner.clock.set(self.inner.clock.get() + Duration::from_secs(1));
        Ok(Some(
            fields
                .iter()
                .map(|&m| CrossoverPoint {
                    fields: m,
                    direct_ms: Some(m as f64),
                    indirect_ms: Some(self.direct_up_to as f64 + 0.5),
                })
                .collect(),
        ))
    }
}

#[test]
fn the_crossover_is_measured_with_the_best_settings_and_kept_where_it_moved() {
    for (direct_up_to, want) in [(4, Some("4")), (2, None), (0, Some("0"))] {
        let clock = Cell::new(Duration::ZERO);
        let fake = Fake::new(&clock, |s, _| {
            Some(scaled(s, |k, _| if k == "GPUSORT_ONESWEEP_IPT" { 0.9 } else { 1.0 }))
        });
        let mut m = WithCrossover {
            inner: fake,
            direct_up_to,
            asked: vec![],
        };
        let search = TuneSearch::new(SEARCH_SPACE).with_budget(Duration::from_secs(3600));
        let r = search.run(&mut m, &|| clock.get(), &mut |_| {}).unwrap();
        // Measured once, with the kernel settings chosen.
        assert_eq!(m.asked.len(), 1);
        assert_eq!(m.asked[0].get("GPUSORT_ONESWEEP_IPT").map(String::as_str), Some("16"));
        assert_eq!(r.chosen.get(CROSSOVER_VAR).map(String::as_str), want, "{direct_up_to}");
        assert_eq!(r.crossover.len(), CROSSOVER_FIELDS.len());
        let table = report::result_table(SEARCH_SPACE, &Workload::defaults(1.0)[..2], &r);
        assert!(
            table.contains("| fields | SRTS-direct (ms) | SRTS-indirect (ms) |"),
            "{table}"
        );
        assert!(
            table.contains(&format!(
                "| GPUSORT_DIRECT_MAX_FIELDS | most fields sorted directly | 2 | {} |",
                want.unwrap_or("default")
            )),
            "{table}"
        );
    }
    // Without room in the budget, no crossover.
    let clock = Cell::new(Duration::ZERO);
    let mut m = WithCrossover {
        inner: Fake::new(&clock, |_, _| Some(vec![1.0, 1.0])),
        direct_up_to: 4,
        asked: vec![],
    };
    let r = TuneSearch::new(SEARCH_SPACE)
        .with_budget(Duration::from_secs(2))
        .run(&mut m, &|| clock.get(), &mut |_| {})
        .unwrap();
    assert!(m.asked.is_empty() && r.crossover.is_empty() && r.chosen.is_empty());
}

/// A measurer error (no GPU, say) ends the search with it.
#[test]
fn a_measurer_error_ends_the_search() {
    struct NoGpu;
    impl Measurer for NoGpu {
        fn workloads(&self) -> Vec<String> {
            vec!["w".into()]
        }
        fn runs_msd(&self) -> bool {
            true
        }
        fn measure(&mut self, _: &Settings) -> Result<Outcome> {
            Err(crate::device::GpuUnavailable::NoDevice.into())
        }
    }
    let err = TuneSearch::new(SEARCH_SPACE)
        .run(&mut NoGpu, &|| Duration::ZERO, &mut |_| {})
        .unwrap_err();
    assert!(matches!(err, CudaSortError::Unavailable(_)), "{err}");
}

#[test]
fn the_plan_lists_every_parameter_and_workload() {
    let tuner = Tuner::new(0).with_budget(Duration::from_secs(120));
    let plan = tuner.plan();
    for p in SEARCH_SPACE {
        assert!(plan.contains(&format!("| {} | ", p.var)), "{}", p.var);
    }
    assert!(plan.contains("| keys-u32-100M | 100000000 | srts-direct |"), "{plan}");
    // A short budget sorts smaller inputs.
    let short = Tuner::new(0).with_budget(Duration::from_secs(9));
    assert_eq!(short.workloads()[0].name(), "keys-u32-10M");
    assert_eq!(Tuner::new(0).with_scale(0.5).workloads()[3].name(), "byfield-m20-5M");
    let off = KernelCache::new(None);
    assert!(Tuner::new(0).profile_dir(&off).is_err());
    let dir = std::env::temp_dir();
    assert_eq!(
        Tuner::new(0)
            .with_output_dir(Some(dir.clone()))
            .profile_dir(&off)
            .unwrap(),
        dir
    );
}

/// On the GPU: a short run writes a profile of this device, which the device's options then
/// apply; every candidate was measured right or rejected with a reason.
#[test]
fn a_short_tuning_run_on_the_gpu() {
    let info = match crate::device::probe(0) {
        Ok(info) => info,
        Err(reason) => {
            return crate::test_support::not_run(
                "GPU TUNING TEST",
                format!("the GPU backend is unavailable: {reason}"),
            );
        }
    };
    let dir = std::env::temp_dir().join(format!("gpusort-tune-gpu-test-{}", std::process::id()));
    let tuner = Tuner::new(0)
        .with_budget(Duration::from_secs(40))
        .with_scale(0.02)
        .with_reps(1)
        .with_output_dir(Some(dir.clone()));
    let mut events = vec![];
    let out = tuner
        .run(&KernelCache::from_env(), &mut |e| events.push(e.to_string()))
        .unwrap();
    assert!(
        matches!(out.result.trials[0].outcome, Outcome::Timed(_)),
        "{:?}",
        out.result.trials[0]
    );
    for t in &out.result.trials {
        if let Outcome::Rejected(why) = &t.outcome {
            assert!(!why.contains("wrong output"), "{}: {why}", describe(&t.settings));
        }
    }
    assert!(out.result.speedup() >= 1.0);
    assert_eq!(out.written, dir.join(ProfileKey::of(&info).file_name()));
    // The file holds the profile as its text does (times to 4 decimals).
    let as_written = TuningProfile::parse(&out.profile.to_text()).unwrap();
    assert_eq!(TuningProfile::read(&out.written).unwrap(), as_written);
    assert_eq!(as_written.settings, out.profile.settings);
    let options = crate::GpuOptions::for_device_with_vars(&info, Some(&dir), |_| None).unwrap();
    assert_eq!(options.tuning_profile.as_ref(), Some(&out.written));
    eprintln!("{}\n{}", events.join("\n"), out.table());
    let _ = std::fs::remove_dir_all(dir);
}
