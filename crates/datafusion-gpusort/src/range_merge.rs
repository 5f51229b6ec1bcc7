//! [`RangeMerge`]: the final merge of an external sort by key ranges, which sorts on the GPU
//! or on every core instead of merging row by row on one.
//!
//! # Algorithm
//!
//! Each step reads about `step_rows / runs` more rows of every run, takes as **splitter** the
//! smallest of the runs' last loaded rows (runs read to the end do not count), and takes from
//! every run its loaded rows below the splitter: all rows of the whole input below it, since
//! each run is sorted and loaded at least that far. Where the runs' shares of the step do not
//! overlap (runs of disjoint key ranges: a presorted, reversed or clustered input cut into
//! runs), they are in order already and go out as they are, share after share, in the order
//! of their first rows (ties in run order, which keeps the sort stable). Else those rows,
//! concatenated in run order,
//! are sorted — stably, so ties keep their run order, which is input order — on the GPU when
//! the step's sort is for it: the rows go through a GPU session whole, told that they are
//! sorted runs (the device merges them, `merge.cu`, where that pays against its radix passes),
//! or, with `gpusort.merge_keys_only` and keys under half of the rows' bytes, only their key
//! columns go up and the permutation comes down. Else (on the CPU, or after the keys on the
//! GPU) the keys are sorted into a permutation that the rows are gathered through on every
//! core ([`gather_parts`]). When no loaded row is below the splitter, the rows equal to it
//! come first in the output: they leave run by run, unsorted (they are all equal).
//!
//! Steps run one ahead of the consumer, on their own task: step i + 1 reads and sorts while
//! step i's batches are consumed. A step sorted whole on the GPU sends its rows to the
//! consumer as they come down: whole, or in ranges of `gpusort.run_range_rows` (into the
//! pinned blocks that the runs' ranges it read past gave back), each as soon as it is down.
//! Spilled runs read their share of the next step ahead, on their own tasks. The memory of
//! a step (its rows, their sorted copy, the key sort, the previous step's output and the
//! read-ahead) is reserved once for the whole merge ([`step_rows`]); with too little memory
//! for the smallest step the heap merge ([`crate::merge::RunMergeStream`]) runs instead.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arrow::array::{ArrayRef, RecordBatch};
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::utils::memory::get_record_batch_memory_size;
use datafusion::error::Result;
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::physical_expr::LexOrdering;
use datafusion::physical_plan::SendableRecordBatchStream;
use datafusion::physical_plan::metrics::RecordOutput;
use datafusion::physical_plan::spill::SpillManager;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::{StreamExt, TryStreamExt};
use gpusort::cpu::gather_parts::gather_parts;

use crate::error::GpuSortExecError;
use crate::in_memory::{InMemorySorter, KEY_BYTES_PER_ROW_AND_KEY, RangeSink, Slicer, blocking};
use crate::metrics::GpuSortMetrics;
use crate::run::SortedRun;

/// Rows a range-merge step takes when sorts run on the CPU.
const CPU_STEP_ROWS: usize = 4 << 20;

/// Fewest rows a range-merge step takes; with less memory the heap merge runs.
const MIN_STEP_ROWS: usize = 1 << 16;

/// Fewest batches each spilled run reads ahead during the range merge.
const MIN_READ_AHEAD: usize = 8;

/// Rows of one step of the range merge of `runs`, with their memory reserved in
/// `reservation`: the run size (`run_rows`: what one GPU sort holds, or
/// `gpusort.max_run_rows`; 4M rows on the CPU), halved until the pool grants it (down to 64K
/// rows). `None` when it does not: the heap merge then runs, in less memory.
pub(crate) fn step_rows(
    runs: &[SortedRun],
    reservation: &mut MemoryReservation,
    run_rows: Option<usize>,
    keys: usize,
    batch_size: usize,
) -> Option<usize> {
    let bytes_per_row = runs
        .iter()
        .map(|r| match r {
            SortedRun::Memory { bytes, .. } => bytes.div_ceil(r.rows().max(1)),
            SortedRun::Spilled { max_batch_bytes, .. } => max_batch_bytes.div_ceil(batch_size),
        })
        .max()
        .unwrap_or(0)
        .max(1);
    // Each run reads whole batches: a step takes up to one batch per run more than asked.
    let slack = runs.len() * batch_size;
    let mut rows = match run_rows {
        Some(gpu) if slack < gpu / 2 => gpu - slack,
        Some(gpu) => gpu / 2,
        None => CPU_STEP_ROWS,
    };
    loop {
        let bytes = step_bytes(rows, bytes_per_row, keys, runs.len(), batch_size);
        if reservation.try_grow(bytes).is_ok() {
            return Some(rows);
        }
        if rows / 2 < MIN_STEP_ROWS {
            return None;
        }
        rows /= 2;
    }
}

/// Batches each of `runs` spilled runs reads ahead during a range merge of `rows`-row steps:
/// its share of a whole step, so that the next step's rows are read and decoded (on the
/// readers' own tasks) while this one sorts.
fn read_ahead(rows: usize, runs: usize, batch_size: usize) -> usize {
    rows.div_ceil(runs.max(1) * batch_size.max(1)).max(MIN_READ_AHEAD)
}

/// Memory the range merge holds with steps of `rows` rows over `runs` runs of batches of
/// `batch_size` rows: a step's rows read, their sorted copy and the sort of their keys; the
/// previous step's output, waiting for the consumer; and the batches each run reads ahead
/// (about the next step's rows, see [`read_ahead`]).
fn step_bytes(rows: usize, bytes_per_row: usize, keys: usize, runs: usize, batch_size: usize) -> usize {
    let ahead = read_ahead(rows, runs, batch_size);
    rows * (3 * bytes_per_row + KEY_BYTES_PER_ROW_AND_KEY * keys.max(1) + 16 + 4)
        + runs * (ahead + 1) * batch_size * bytes_per_row
}

/// The final merge by key ranges (see the module docs).
pub(crate) struct RangeMerge {
    /// Sorts each step's rows.
    sorter: InMemorySorter,
    readers: Vec<RunReader>,
    step_rows: usize,
    /// Rows still to produce (`usize::MAX`: all).
    remaining: usize,
    /// Holds the step memory ([`step_rows`]) until the merge ends.
    reservation: MemoryReservation,
    metrics: GpuSortMetrics,
    /// Steps taken (for the timeline).
    step: usize,
    /// Where a step sorted on the GPU sends its ranges as they come down (the stream's
    /// channel, which the steps sorted otherwise reach through [`Self::stream`]'s task).
    out: OutputSender,
}

/// The channel of a range merge's output: a step's batches, or one range of a step sorted on
/// the GPU. Its capacity is shared by every sender (a step's sink is a sender of its own).
type OutputSender = tokio::sync::mpsc::Sender<Result<Vec<RecordBatch>>>;

impl RangeMerge {
    /// The merged rows of `runs` (in input order), at most `fetch` of them, in steps of
    /// `step_rows` rows whose memory `reservation` holds ([`step_rows`]), sorted by `sorter`.
    pub(crate) fn stream(
        runs: Vec<SortedRun>,
        reservation: MemoryReservation,
        sorter: InMemorySorter,
        spill: &SpillManager,
        fetch: Option<usize>,
        step_rows: usize,
    ) -> Result<SendableRecordBatchStream> {
        // Spilled runs read a few batches ahead, on their own tasks, while a step sorts.
        let ahead = read_ahead(step_rows, runs.len(), sorter.batch_size);
        let readers = runs
            .into_iter()
            .map(|r| Ok(RunReader::new(r.into_stream(spill, ahead)?)))
            .collect::<Result<Vec<_>>>()?;
        let schema = Arc::clone(&sorter.schema);
        // Step i + 1 runs while step i's batches are consumed (its output is reserved, see
        // `step_bytes`): the channel holds one step's output, its ranges where a step sorted
        // on the GPU sends each as it comes down (the consumer starts on a step's first range
        // while the rest come down). Dropping the stream aborts the task, which frees
        // everything.
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<RecordBatch>>>(sorter.step_ranges(step_rows));
        let state = Self {
            metrics: sorter.metrics.clone(),
            sorter,
            readers,
            step_rows,
            remaining: fetch.unwrap_or(usize::MAX),
            reservation,
            step: 0,
            out: tx.clone(),
        };
        let task = SpawnedTask::spawn(async move {
            let mut state = state;
            loop {
                let step = match state.next_step().await {
                    // A step sorted on the GPU sent its rows itself.
                    Ok(Some(batches)) if batches.is_empty() => continue,
                    Ok(Some(batches)) => Ok(batches),
                    Ok(None) => break,
                    Err(e) => Err(e),
                };
                let failed = step.is_err();
                if tx.send(step).await.is_err() || failed {
                    break;
                }
            }
        });
        let stream = futures::stream::unfold((rx, task), |(mut rx, task)| async move {
            rx.recv().await.map(|step| (step, (rx, task)))
        })
        .map_ok(|batches| futures::stream::iter(batches.into_iter().map(Ok)))
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }

    /// The next step's output batches; `None` when the merge is done.
    async fn next_step(&mut self) -> Result<Option<Vec<RecordBatch>>> {
        if self.remaining == 0 {
            self.finish();
            return Ok(None);
        }
        let step = self.step;
        self.step += 1;
        let Some(splitter) = self.load(step).await? else {
            // Every run is loaded to its end: all that is left.
            let counts: Vec<usize> = self.readers.iter().map(|r| r.rows).collect();
            return self.take_step(counts, step).await;
        };
        let counts = {
            let _timer = self.metrics.merge_time.timer();
            let cmp = self.cmp();
            self.readers
                .iter()
                .map(|r| r.count(&cmp, &splitter, |o| o.is_lt()))
                .collect::<Result<Vec<_>>>()?
        };
        if counts.iter().all(|c| *c == 0) {
            // Nothing below the splitter: the rows equal to it are the smallest left.
            let equal = self.take_equal(&splitter).await?;
            self.metrics.range_merge_steps.add(1);
            self.metrics.in_order_steps.add(1);
            return Ok(Some(self.emit(equal)));
        }
        self.take_step(counts, step).await
    }

    /// Takes `counts[i]` rows of run `i` and emits them: as they are, share after share, where
    /// the shares do not overlap ([`Self::in_order`]), else sorted ([`Self::sort_step`]).
    async fn take_step(&mut self, counts: Vec<usize>, step: usize) -> Result<Option<Vec<RecordBatch>>> {
        let mut parts = vec![];
        let order = {
            let _timer = self.metrics.merge_time.timer();
            self.in_order(&counts)?
        };
        let Some(order) = order else {
            for (r, &n) in self.readers.iter_mut().zip(&counts) {
                r.take(n, &mut parts);
            }
            return self.sort_step(parts, counts, step).await;
        };
        if order.is_empty() {
            self.finish();
            return Ok(None);
        }
        for &i in &order {
            self.readers[i].take(counts[i], &mut parts);
        }
        self.metrics.range_merge_steps.add(1);
        self.metrics.in_order_steps.add(1);
        let rows: usize = counts.iter().sum();
        log::debug!(
            target: "gpusort::timeline",
            "merge step {step}: {rows} rows of {} run(s) in order, as they are",
            order.len()
        );
        Ok(Some(self.emit(parts)))
    }

    /// The runs with rows in the step (`counts[i]` rows of run `i`), in the order their shares
    /// go out as they are, when they do not overlap: ordered by their first rows (ties in run
    /// order), each share's last row is before the next share's first, or equal to it with the
    /// next share from a later run (ties keep input order). `None` when two shares overlap:
    /// the step's rows are sorted.
    fn in_order(&self, counts: &[usize]) -> Result<Option<Vec<usize>>> {
        let cmp = self.cmp();
        let shares: Vec<(usize, KeyRef, KeyRef)> = (counts.iter().enumerate())
            .filter(|(_, n)| **n > 0)
            .map(|(i, &n)| (i, self.readers[i].key_at(0), self.readers[i].key_at(n - 1)))
            .collect();
        let mut order: Vec<usize> = (0..shares.len()).collect();
        let mut failed = None;
        // A stable sort: shares whose first rows are equal stay in run order.
        order.sort_by(|&a, &b| {
            cmp.compare(&shares[a].1, &shares[b].1).unwrap_or_else(|e| {
                failed = Some(e);
                std::cmp::Ordering::Equal
            })
        });
        if let Some(e) = failed {
            return Err(e);
        }
        for pair in order.windows(2) {
            let (before, after) = (&shares[pair[0]], &shares[pair[1]]);
            match cmp.compare(&before.2, &after.1)? {
                std::cmp::Ordering::Less => {}
                std::cmp::Ordering::Equal if before.0 < after.0 => {}
                _ => return Ok(None),
            }
        }
        Ok(Some(order.into_iter().map(|k| shares[k].0).collect()))
    }

    /// Compares key columns in the sort's order.
    fn cmp(&self) -> KeyCmp {
        KeyCmp {
            options: self.sorter.expr.iter().map(|e| e.options).collect(),
        }
    }

    /// Reads the runs' share of the step (all runs at once: spilled runs decode on their own
    /// tasks, in parallel); the splitter, the smallest last loaded row of the runs that go on
    /// (`None` when every run is loaded to its end).
    async fn load(&mut self, step: usize) -> Result<Option<KeyRef>> {
        let expr = self.sorter.expr.clone();
        let open = self.readers.iter().filter(|r| !r.done).count().max(1);
        let per_run = (self.step_rows / open).max(1);
        futures::future::try_join_all(self.readers.iter_mut().map(|r| r.load(per_run, &expr))).await?;
        log::debug!(target: "gpusort::timeline", "merge step {step}: runs loaded");
        let _timer = self.metrics.merge_time.timer();
        let cmp = self.cmp();
        let mut splitter: Option<KeyRef> = None;
        for r in self.readers.iter().filter(|r| !r.done) {
            if let Some(last) = r.last()
                && match &splitter {
                    None => true,
                    Some(s) => cmp.compare(&last, s)?.is_lt(),
                }
            {
                splitter = Some(last);
            }
        }
        Ok(splitter)
    }

    /// Takes from each run, in run order, its rows equal to `splitter` (reading on while a
    /// run's loaded rows all are).
    async fn take_equal(&mut self, splitter: &KeyRef) -> Result<Vec<RecordBatch>> {
        let (cmp, expr, batch_size) = (self.cmp(), self.sorter.expr.clone(), self.sorter.batch_size);
        let mut equal = vec![];
        for r in self.readers.iter_mut() {
            loop {
                let n = r.count(&cmp, splitter, |o| o.is_le())?;
                let all = n == r.rows;
                r.take(n, &mut equal);
                if !all || r.done {
                    break;
                }
                r.load(r.rows + batch_size, &expr).await?;
            }
        }
        Ok(equal)
    }

    /// Sorts `parts` (a step's rows, in run order: `runs` rows of each run, each sorted) and
    /// emits them: whole on the GPU when the step is for it (where the device merges the runs
    /// instead of sorting them), else by their keys and a parallel gather.
    async fn sort_step(
        &mut self,
        parts: Vec<RecordBatch>,
        runs: Vec<usize>,
        step: usize,
    ) -> Result<Option<Vec<RecordBatch>>> {
        if parts.is_empty() {
            self.finish();
            return Ok(None);
        }
        self.metrics.range_merge_steps.add(1);
        let limit = (self.remaining != usize::MAX).then_some(self.remaining);
        let rows: usize = parts.iter().map(|p| p.num_rows()).sum();
        log::debug!(target: "gpusort::timeline", "merge step {step}: {rows} rows in {} slices", parts.len());
        let (permutation, parts) = if self.sorter.merges_keys_only(&parts) {
            (self.sorter.sort_keys_on_gpu(&parts, rows, runs, limit).await?, parts)
        } else {
            let (sink, delivered) = self.range_sink(step);
            match self.sorter.sort_whole_on_gpu(parts, rows, runs, limit, sink).await? {
                Ok(()) => {
                    log::debug!(target: "gpusort::timeline", "merge step {step}: sorted on the GPU");
                    // Its rows went out as they came down (at most the `LIMIT`'s rest).
                    let delivered = delivered.load(Ordering::Acquire);
                    self.remaining = self.remaining.saturating_sub(delivered);
                    return Ok(Some(vec![]));
                }
                Err(parts) => (None, parts),
            }
        };
        let permutation = match permutation {
            Some(p) => {
                self.metrics.gpu_key_steps.add(1);
                p
            }
            None => self.sorter.sort_keys(&parts, limit).await?,
        };
        log::debug!(target: "gpusort::timeline", "merge step {step}: keys sorted");
        let (schema, batch_size) = (Arc::clone(&self.sorter.schema), self.sorter.batch_size);
        let gathered = blocking(move || {
            let batches =
                gather_parts(&schema, &parts, permutation.values(), batch_size).map_err(GpuSortExecError::from)?;
            // The step's input (slices of the loaded run batches, often their last
            // references) is freed on another core.
            rayon::spawn(move || drop(parts));
            Ok(batches)
        })
        .await?;
        log::debug!(target: "gpusort::timeline", "merge step {step}: gathered");
        Ok(Some(self.emit(gathered)))
    }

    /// Where a step sorted on the GPU sends each range as it comes down ([`range_sink`]).
    fn range_sink(&self, step: usize) -> (RangeSink, Arc<AtomicUsize>) {
        range_sink(self.out.clone(), self.sorter.slicer(), self.metrics.clone(), step)
    }

    /// Counts `batches` as output (cut to what the `LIMIT` has left).
    fn emit(&mut self, batches: Vec<RecordBatch>) -> Vec<RecordBatch> {
        let mut out = Vec::with_capacity(batches.len());
        for b in batches {
            if self.remaining == 0 {
                break;
            }
            let b = if b.num_rows() > self.remaining {
                b.slice(0, self.remaining)
            } else {
                b
            };
            self.remaining = self.remaining.saturating_sub(b.num_rows());
            (&b).record_output(&self.metrics.baseline);
            out.push(b);
        }
        out
    }

    /// Closes the runs (spill files are deleted when their readers go) and frees the memory.
    fn finish(&mut self) {
        self.readers.clear();
        self.reservation.free();
    }
}

/// Where step `step`, sorted on the GPU, sends each range as it comes down: cut into output
/// batches by `slicer`, counted as output in `metrics` and sent on `out` (the merge's channel;
/// the sink waits while it is full, on the blocking thread that brings the rows down); and the
/// rows sent so far (counted as output once sent). The sink answers `false` once nobody
/// receives.
fn range_sink(
    out: OutputSender,
    slicer: Slicer,
    metrics: GpuSortMetrics,
    step: usize,
) -> (RangeSink, Arc<AtomicUsize>) {
    let delivered = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&delivered);
    let sink = move |range: RecordBatch| -> Result<bool> {
        let (rows, bytes) = (range.num_rows(), get_record_batch_memory_size(&range));
        let slices = slicer.slices(&range)?;
        drop(range);
        let lens: Vec<usize> = slices.iter().map(|b| b.num_rows()).collect();
        if out.blocking_send(Ok(slices)).is_err() {
            return Ok(false);
        }
        for len in lens {
            metrics.record_output_slice(len, rows, bytes);
        }
        counted.fetch_add(rows, Ordering::AcqRel);
        log::debug!(target: "gpusort::timeline", "merge step {step}: a range of {rows} rows sent");
        Ok(true)
    };
    (Box::new(sink), delivered)
}

/// A run being read by the range merge: the batches read and not yet taken (with their sort
/// key columns), rows taken from the first one, and the rest of the run.
struct RunReader {
    stream: SendableRecordBatchStream,
    loaded: VecDeque<(RecordBatch, Vec<ArrayRef>)>,
    /// Rows of the first loaded batch already taken.
    offset: usize,
    /// Rows loaded and not taken.
    rows: usize,
    done: bool,
}

/// A row of a loaded batch: its sort key columns and its index.
#[derive(Clone)]
struct KeyRef {
    keys: Vec<ArrayRef>,
    row: usize,
}

impl RunReader {
    fn new(stream: SendableRecordBatchStream) -> Self {
        Self {
            stream,
            loaded: Default::default(),
            offset: 0,
            rows: 0,
            done: false,
        }
    }

    /// Reads batches until `rows` rows are loaded or the run ends.
    async fn load(&mut self, rows: usize, expr: &LexOrdering) -> Result<()> {
        while !self.done && self.rows < rows {
            match self.stream.next().await {
                Some(batch) => {
                    let batch = batch?;
                    if batch.num_rows() == 0 {
                        continue;
                    }
                    let keys = expr
                        .iter()
                        .map(|e| e.expr.evaluate(&batch)?.into_array(batch.num_rows()))
                        .collect::<Result<Vec<_>>>()?;
                    self.rows += batch.num_rows();
                    self.loaded.push_back((batch, keys));
                }
                None => self.done = true,
            }
        }
        Ok(())
    }

    /// Loaded row `k` not yet taken (`k < self.rows`).
    fn key_at(&self, mut k: usize) -> KeyRef {
        k += self.offset;
        for (batch, keys) in &self.loaded {
            if k < batch.num_rows() {
                return KeyRef {
                    keys: keys.clone(),
                    row: k,
                };
            }
            k -= batch.num_rows();
        }
        unreachable!("row {k} past the loaded rows")
    }

    /// The last loaded row.
    fn last(&self) -> Option<KeyRef> {
        self.loaded.back().map(|(b, keys)| KeyRef {
            keys: keys.clone(),
            row: b.num_rows() - 1,
        })
    }

    /// Loaded rows before the first that `before` does not place ahead of `bound` (binary
    /// search: the loaded rows are sorted).
    fn count(&self, cmp: &KeyCmp, bound: &KeyRef, before: impl Fn(std::cmp::Ordering) -> bool) -> Result<usize> {
        let mut n = 0;
        for (i, (batch, keys)) in self.loaded.iter().enumerate() {
            let start = if i == 0 { self.offset } else { 0 };
            let c = cmp.comparator(keys, &bound.keys)?;
            let len = batch.num_rows();
            if before(c(len - 1, bound.row)) {
                n += len - start;
                continue;
            }
            let (mut lo, mut hi) = (start, len - 1);
            while lo < hi {
                let mid = (lo + hi) / 2;
                if before(c(mid, bound.row)) {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            return Ok(n + lo - start);
        }
        Ok(n)
    }

    /// Takes the next `n` loaded rows, as slices.
    fn take(&mut self, mut n: usize, out: &mut Vec<RecordBatch>) {
        self.rows -= n;
        while n > 0 {
            let (batch, _) = self.loaded.front().expect("rows loaded");
            let len = batch.num_rows() - self.offset;
            if n < len {
                out.push(batch.slice(self.offset, n));
                self.offset += n;
                return;
            }
            out.push(batch.slice(self.offset, len));
            self.loaded.pop_front();
            self.offset = 0;
            n -= len;
        }
    }
}

/// Compares rows of two batches' sort key columns in the sort's order.
struct KeyCmp {
    options: Vec<arrow::compute::SortOptions>,
}

impl KeyCmp {
    fn comparator(
        &self,
        left: &[ArrayRef],
        right: &[ArrayRef],
    ) -> Result<impl Fn(usize, usize) -> std::cmp::Ordering + use<>> {
        let cmps = left
            .iter()
            .zip(right)
            .zip(&self.options)
            .map(|((l, r), o)| arrow::array::make_comparator(l.as_ref(), r.as_ref(), *o))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(move |i: usize, j: usize| {
            for c in &cmps {
                match c(i, j) {
                    std::cmp::Ordering::Equal => continue,
                    o => return o,
                }
            }
            std::cmp::Ordering::Equal
        })
    }

    fn compare(&self, a: &KeyRef, b: &KeyRef) -> Result<std::cmp::Ordering> {
        Ok(self.comparator(&a.keys, &b.keys)?(a.row, b.row))
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::Int32Array;
    use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;

    use super::*;

    /// A step sorted on the GPU hands each range to the sink on the blocking thread that brings
    /// it down: the consumer receives it cut into output batches at once, the rows count as
    /// output, and the sink says when nobody receives any more.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_gpu_step_sends_each_range_as_it_comes_down() {
        let (tx, mut rx) = tokio::sync::mpsc::channel(2);
        let metrics = GpuSortMetrics::new(&ExecutionPlanMetricsSet::new(), 0);
        let (mut sink, delivered) = range_sink(tx, Slicer::new(4, false), metrics.clone(), 0);
        let values: ArrayRef = Arc::new(Int32Array::from_iter_values(0..10));
        let batch = RecordBatch::try_from_iter([("a", values)]).unwrap();
        let ranges = [batch.slice(0, 6), batch.slice(6, 4)];
        let (sent, mut sink) = tokio::task::spawn_blocking(move || {
            let sent: Vec<bool> = ranges.into_iter().map(|r| sink(r).unwrap()).collect();
            (sent, sink)
        })
        .await
        .unwrap();
        assert_eq!(sent, [true, true]);
        let rows = |batches: Vec<RecordBatch>| batches.iter().map(|b| b.num_rows()).collect::<Vec<_>>();
        assert_eq!(rows(rx.recv().await.unwrap().unwrap()), [4, 2]);
        assert_eq!(rows(rx.recv().await.unwrap().unwrap()), [4]);
        assert_eq!(delivered.load(Ordering::Acquire), 10);
        assert_eq!(metrics.baseline.output_rows().value(), 10);
        drop(rx);
        let more = tokio::task::spawn_blocking(move || sink(batch).unwrap()).await.unwrap();
        assert!(!more, "the sink goes on with nobody receiving");
        assert_eq!(
            delivered.load(Ordering::Acquire),
            10,
            "rows nobody received counted as sent"
        );
        assert_eq!(metrics.baseline.output_rows().value(), 10);
    }
}
