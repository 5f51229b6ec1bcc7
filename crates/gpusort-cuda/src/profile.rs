//! Per-kernel device times of a sort, for every family's launches (`GPUSORT_PROFILE=1`).

use cudarc::driver::CudaEvent;

use crate::error::Result;
use crate::gpu::Gpu;

/// Per-kernel device times, when `GPUSORT_PROFILE=1`: an event after every launch, summed by
/// kernel name at the end of a sort and printed to stderr.
pub(crate) struct Profile {
    marks: Option<std::cell::RefCell<Vec<(&'static str, CudaEvent)>>>,
    notes: std::cell::RefCell<Vec<String>>,
}

impl Profile {
    pub(crate) fn new(gpu: &Gpu) -> Result<Self> {
        let on = gpu.options().profile;
        let marks = if on {
            let e = gpu.event()?;
            e.record(&gpu.stream)?;
            Some(std::cell::RefCell::new(vec![("start", e)]))
        } else {
            None
        };
        Ok(Self {
            marks,
            notes: Default::default(),
        })
    }

    pub(crate) fn mark(&self, gpu: &Gpu, name: &'static str) -> Result<()> {
        if let Some(m) = &self.marks {
            let e = gpu.event()?;
            e.record(&gpu.stream)?;
            m.borrow_mut().push((name, e));
        }
        Ok(())
    }

    /// A line printed with the report, made only when profiling.
    pub(crate) fn note(&self, line: impl FnOnce() -> String) {
        if self.marks.is_some() {
            self.notes.borrow_mut().push(line());
        }
    }

    pub(crate) fn report(&self) -> Result<()> {
        if let Some(m) = &self.marks {
            let m = m.borrow();
            if let Some((_, last)) = m.last() {
                last.synchronize()?;
            }
            let mut sums: Vec<(&str, f32, usize)> = vec![];
            for w in m.windows(2) {
                let t = w[0].1.elapsed_ms(&w[1].1)?;
                match sums.iter_mut().find(|s| s.0 == w[1].0) {
                    Some(s) => {
                        s.1 += t;
                        s.2 += 1;
                    }
                    None => sums.push((w[1].0, t, 1)),
                }
            }
            let line: Vec<String> = sums.iter().map(|(n, t, c)| format!("{n} {t:.3} ms/{c}")).collect();
            let notes = self.notes.borrow();
            let notes = if notes.is_empty() {
                String::new()
            } else {
                format!(" ({})", notes.join("; "))
            };
            eprintln!("profile: {}{notes}", line.join(", "));
        }
        Ok(())
    }
}
