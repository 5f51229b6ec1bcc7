//! Split sorts: one sort spread over several sorters of one host (the GPUs of a machine, or
//! CPU backends in tests) by key ranges, with no merge.
//!
//! # Algorithm
//!
//! This is the sample sort's outer level (the papers' "sample sort" splits a GPU's rows into
//! buckets the same way), with one bucket a sorter:
//!
//! 1. **Sample.** [`SplitOptions::sample_rows`] rows are drawn at random (a seeded generator,
//!    so the same input splits the same way) and their sort key columns taken.
//! 2. **Splitters.** [`Splitters::from_sample`] orders the sample by `(key, position)`, the
//!    position being the row's number in the input, and keeps the rows at the quantiles: `k`
//!    sorters get `k - 1` splitters. Rows with equal keys split by position, so one key value
//!    filling the input still spreads over every range.
//! 3. **Assign.** The input's rows are assigned to ranges in chunks of [`ASSIGN_CHUNK`] rows on
//!    all cores; each range keeps the input rows it holds, ascending ([`RangeRows::rows`]).
//! 4. **Gather.** Each range's columns are gathered through its rows (the core's parallel
//!    gathers: view columns keep their data buffers, shared, not copied).
//! 5. **Sort.** Each range sorts on its own sorter, all at once (a thread each): a sorter's
//!    stable sort of rows in input order is their `(key, position)` order.
//! 6. **Concatenate.** The ranges' sorted rows, in range order, are the stable sort of the
//!    whole input; each range's permutation is mapped back to input rows through its
//!    [`RangeRows::rows`]. With a `limit`, each range keeps its first `limit` rows and the
//!    concatenation its first `limit`.
//!
//! The rows move between sorters through host memory: each sorter reads its range from the
//! host as a one-sorter sort would. The split costs a pass over the keys and a copy of the
//! input (each range's gathered columns) before the sorts start.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch, RecordBatchOptions, UInt32Array};
use arrow::compute::SortOptions;
use rayon::prelude::*;

use crate::backend::{SortBackend, SortOutput, SortRequest, SortStats};
use crate::cpu::gather::{concat_batches, gather_column};
use crate::error::{GpusortError, Result};
use crate::partition::{Splitters, splitmix64};

/// Input rows assigned to ranges per parallel task.
pub const ASSIGN_CHUNK: usize = 1 << 20;

/// How a sort splits over sorters: one struct for its knobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitOptions {
    /// Rows drawn to choose the splitters (the ranges' sizes vary by about
    /// `1 / sqrt(sample_rows / ranges)` of their mean).
    pub sample_rows: usize,
    /// The fewest rows a range is worth: a sort of fewer than this many rows a sorter runs on
    /// fewer sorters (on one below twice this).
    pub min_rows_per_range: usize,
    /// The seed of the sample's generator.
    pub seed: u64,
    /// Each range's sort runs on a rayon pool of its own, with its share of the threads
    /// (else every range's host work shares rayon's global pool, where a thread waiting in one
    /// sort's parallel loop may run another sort's tasks on its stack).
    pub pool_per_range: bool,
}

impl Default for SplitOptions {
    fn default() -> Self {
        Self {
            sample_rows: 1 << 16,
            min_rows_per_range: 1 << 20,
            // Any constant: the sample must not depend on the run.
            seed: 0x5eed_5017,
            pool_per_range: true,
        }
    }
}

impl SplitOptions {
    /// Sorters worth using for `rows` rows, of `sorters` available: at least one, and none
    /// with fewer than `min_rows_per_range` rows.
    pub fn ranges_for(&self, rows: usize, sorters: usize) -> usize {
        let worth = rows / self.min_rows_per_range.max(1);
        worth.clamp(1, sorters.max(1))
    }
}

/// One range of a split input: its rows, gathered, and which input row each one is.
#[derive(Debug, Clone)]
pub struct RangeRows {
    /// The range's rows, in input order.
    pub batch: RecordBatch,
    /// The input row of each of `batch`'s rows, ascending.
    pub rows: Vec<u32>,
}

fn key_columns(batch: &RecordBatch, request: &SortRequest<'_>) -> (Vec<ArrayRef>, Vec<SortOptions>) {
    request
        .spec
        .keys()
        .iter()
        .map(|k| (Arc::clone(batch.column(k.column)), k.options))
        .unzip()
}

/// The splitters of `ranges` ranges for `request`'s rows, from a sample of them.
pub fn choose_splitters(request: &SortRequest<'_>, ranges: usize, options: &SplitOptions) -> Result<Splitters> {
    let n = request.batch.num_rows();
    let (keys, sort_options) = key_columns(request.batch, request);
    let mut picks: Vec<u32> = if n <= options.sample_rows {
        (0..n as u32).collect()
    } else {
        let mut state = options.seed;
        (0..options.sample_rows)
            .map(|_| (splitmix64(&mut state) % n as u64) as u32)
            .collect()
    };
    picks.sort_unstable();
    picks.dedup();
    let sample = keys
        .iter()
        .map(|k| gather_column(k, &picks))
        .collect::<Result<Vec<_>>>()?;
    let positions: Vec<u64> = picks.iter().map(|&r| r as u64).collect();
    Splitters::from_sample(&sample, &positions, &sort_options, ranges)
}

/// The input rows of each range: `request`'s rows assigned to `splitters`' ranges, in chunks
/// on all cores, each range's rows ascending.
pub fn assign_rows(request: &SortRequest<'_>, splitters: &Splitters) -> Result<Vec<Vec<u32>>> {
    let n = request.batch.num_rows();
    let ranges = splitters.num_ranges();
    let (keys, _) = key_columns(request.batch, request);
    // Per chunk, the input rows of each range.
    let chunks = (0..n.div_ceil(ASSIGN_CHUNK))
        .into_par_iter()
        .map(|c| {
            let start = c * ASSIGN_CHUNK;
            let len = ASSIGN_CHUNK.min(n - start);
            let slices: Vec<ArrayRef> = keys.iter().map(|k| k.slice(start, len)).collect();
            if let Some(bitmaps) = splitters.range_bitmaps(&slices, start as u64)? {
                return Ok(bitmaps
                    .iter()
                    .map(|b| b.set_indices().map(|i| (start + i) as u32).collect())
                    .collect());
            }
            let positions: Vec<u64> = (start as u64..(start + len) as u64).collect();
            let assigned = splitters.assign(&slices, &positions)?;
            let mut lists = vec![Vec::new(); ranges];
            for (i, r) in assigned.into_iter().enumerate() {
                lists[r as usize].push((start + i) as u32);
            }
            Ok(lists)
        })
        .collect::<Result<Vec<Vec<Vec<u32>>>>>()?;
    // Each range's lists, in chunk order, copied into place on all cores.
    let mut out = Vec::with_capacity(ranges);
    for r in 0..ranges {
        let total = chunks.iter().map(|c| c[r].len()).sum();
        let mut rows = vec![0u32; total];
        let mut rest = rows.as_mut_slice();
        let mut places = Vec::with_capacity(chunks.len());
        for c in &chunks {
            let (here, after) = rest.split_at_mut(c[r].len());
            places.push(here);
            rest = after;
        }
        places
            .into_par_iter()
            .zip(chunks.par_iter())
            .for_each(|(place, c)| place.copy_from_slice(&c[r]));
        out.push(rows);
    }
    Ok(out)
}

/// `request`'s rows split into `ranges` key ranges (see the module docs): each range's rows
/// gathered, in input order, with their input rows. One range (or no rows) is the input as
/// it is.
pub fn split_ranges(request: &SortRequest<'_>, ranges: usize, options: &SplitOptions) -> Result<Vec<RangeRows>> {
    let n = request.batch.num_rows();
    crate::backend::check_rows(n)?;
    if ranges <= 1 || n == 0 {
        return Ok(vec![RangeRows {
            batch: request.batch.clone(),
            rows: (0..n as u32).collect(),
        }]);
    }
    let splitters = choose_splitters(request, ranges, options)?;
    let lists = assign_rows(request, &splitters)?;
    gather_ranges(request, lists)
}

/// Each range's rows of `request.batch`, gathered through its input rows `lists` (ascending).
pub fn gather_ranges(request: &SortRequest<'_>, lists: Vec<Vec<u32>>) -> Result<Vec<RangeRows>> {
    lists
        .into_iter()
        .map(|rows| {
            let columns = request
                .batch
                .columns()
                .iter()
                .map(|c| gather_column(c, &rows))
                .collect::<Result<Vec<_>>>()?;
            let batch = RecordBatch::try_new_with_options(
                request.batch.schema(),
                columns,
                &RecordBatchOptions::new().with_row_count(Some(rows.len())),
            )?;
            Ok(RangeRows { batch, rows })
        })
        .collect()
}

/// Sorts each range with `sort_range(range, request)`, all at once (a thread each, on a rayon
/// pool of its own with [`SplitOptions::pool_per_range`]), and maps each range's permutation
/// back to input rows: the outputs, in range order, are the stable sort of the input.
/// `request` gives the spec, strategy, limit and encoding of every range. The first range's
/// error (in range order) is the sort's.
pub fn sort_ranges<F, E>(
    request: &SortRequest<'_>,
    ranges: &[RangeRows],
    options: &SplitOptions,
    sort_range: F,
) -> Result<Vec<SortOutput>, E>
where
    F: Fn(usize, &SortRequest<'_>) -> Result<SortOutput, E> + Sync,
    E: From<GpusortError> + Send,
{
    let pools = range_pools(ranges.len(), options)?;
    let sort_range = &sort_range;
    let outputs: Vec<Result<SortOutput, E>> = std::thread::scope(|scope| {
        let handles: Vec<_> = ranges
            .iter()
            .enumerate()
            .map(|(i, range)| {
                let mut own = request.clone();
                own.batch = &range.batch;
                let pool = pools.get(i);
                scope.spawn(move || {
                    let sort = || -> Result<SortOutput, E> {
                        let mut output = sort_range(i, &own)?;
                        let rows = &range.rows;
                        let mapped: Vec<u32> = output
                            .indices
                            .values()
                            .par_iter()
                            .map(|&local| rows[local as usize])
                            .collect();
                        output.indices = UInt32Array::from(mapped);
                        Ok(output)
                    };
                    match pool {
                        Some(pool) => pool.install(sort),
                        None => sort(),
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(GpusortError::Backend("a range's sort panicked".into()).into()))
            })
            .collect()
    });
    outputs.into_iter().collect()
}

/// A rayon pool for each of `ranges` ranges, each with its share of rayon's threads, where
/// [`SplitOptions::pool_per_range`] asks for them and there are two ranges or more; else none.
fn range_pools(ranges: usize, options: &SplitOptions) -> Result<Vec<rayon::ThreadPool>> {
    if !options.pool_per_range || ranges < 2 {
        return Ok(vec![]);
    }
    let threads = (rayon::current_num_threads() / ranges).max(1);
    (0..ranges)
        .map(|i| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(move |t| format!("gpusort-range{i}-{t}"))
                .build()
                .map_err(|e| GpusortError::Backend(format!("a rayon pool for range {i}: {e}")))
        })
        .collect()
}

/// What the ranges' sorts did, as one sort: rows, passes and bytes added; times the longest
/// range's (they ran at once); `split_ranges` the number of ranges.
pub fn combine_stats(stats: &[SortStats]) -> SortStats {
    let mut out = stats.first().cloned().unwrap_or_default();
    for s in stats.iter().skip(1) {
        out.rows += s.rows;
        out.key_bits = out.key_bits.max(s.key_bits);
        out.passes = out.passes.max(s.passes);
        out.input_order = if out.input_order == s.input_order {
            out.input_order
        } else {
            None
        };
        out.merged_runs += s.merged_runs;
        out.tie_groups += s.tie_groups;
        out.device_tie_groups += s.device_tie_groups;
        out.concat_time = out.concat_time.max(s.concat_time);
        out.encode_time = out.encode_time.max(s.encode_time);
        out.keys_on_device &= s.keys_on_device;
        out.stage_time = out.stage_time.max(s.stage_time);
        out.upload_time = out.upload_time.max(s.upload_time);
        out.sort_time = out.sort_time.max(s.sort_time);
        out.download_time = out.download_time.max(s.download_time);
        out.gather_time = out.gather_time.max(s.gather_time);
        out.device_wait = out.device_wait.max(s.device_wait);
        out.device_time = match (out.device_time, s.device_time) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        out.bytes_to_device += s.bytes_to_device;
        out.bytes_in_place += s.bytes_in_place;
        out.bytes_from_device += s.bytes_from_device;
    }
    out.split_ranges = stats.len();
    out
}

/// The ranges' sorted outputs (in range order) as one output of at most `limit` rows.
pub fn concat_outputs(request: &SortRequest<'_>, outputs: Vec<SortOutput>) -> Result<SortOutput> {
    let limit = request.limit.unwrap_or(usize::MAX);
    let mut batches = Vec::with_capacity(outputs.len());
    let mut indices: Vec<u32> = Vec::new();
    let mut stats = Vec::with_capacity(outputs.len());
    for output in outputs {
        let take = output.batch.num_rows().min(limit - indices.len());
        batches.push(output.batch.slice(0, take));
        indices.extend_from_slice(&output.indices.values()[..take]);
        stats.push(output.stats);
    }
    let batch = concat_batches(&request.batch.schema(), &batches)?;
    Ok(SortOutput {
        batch,
        indices: UInt32Array::from(indices),
        stats: combine_stats(&stats),
    })
}

/// Sorts `request` over `sorters` ranges, each sorted by `sort_range`: the split
/// ([`split_ranges`]), the sorts ([`sort_ranges`]) and the outputs in range order. The number
/// of ranges is what [`SplitOptions::ranges_for`] allows; one range sorts the input as it is.
pub fn sort_split<F, E>(
    request: &SortRequest<'_>,
    sorters: usize,
    options: &SplitOptions,
    sort_range: F,
) -> Result<Vec<SortOutput>, E>
where
    F: Fn(usize, &SortRequest<'_>) -> Result<SortOutput, E> + Sync,
    E: From<GpusortError> + Send,
{
    let ranges = options.ranges_for(request.batch.num_rows(), sorters);
    if ranges <= 1 {
        return Ok(vec![sort_range(0, request)?]);
    }
    let split = split_ranges(request, ranges, options)?;
    sort_ranges(request, &split, options, sort_range)
}

/// A [`SortBackend`] over several backends: each sort splits by key ranges over them (see the
/// module docs) and its ranges sort at once, one a backend.
#[derive(Debug, Clone)]
pub struct SplitBackend {
    sorters: Vec<Arc<dyn SortBackend>>,
    options: SplitOptions,
}

impl SplitBackend {
    /// A backend that splits each sort over `sorters` (one or more).
    pub fn try_new(sorters: Vec<Arc<dyn SortBackend>>) -> Result<Self> {
        if sorters.is_empty() {
            return Err(GpusortError::InvalidOption(
                "a split sort needs one or more sorters".into(),
            ));
        }
        Ok(Self {
            sorters,
            options: SplitOptions::default(),
        })
    }

    /// Splits with these options.
    pub fn with_options(mut self, options: SplitOptions) -> Self {
        self.options = options;
        self
    }

    /// The split's options.
    pub fn options(&self) -> &SplitOptions {
        &self.options
    }
}

impl SortBackend for SplitBackend {
    fn name(&self) -> String {
        let names: Vec<String> = self.sorters.iter().map(|s| s.name()).collect();
        format!("split({})", names.join(","))
    }

    fn sort(&self, request: &SortRequest<'_>) -> Result<SortOutput> {
        let outputs = sort_split(request, self.sorters.len(), &self.options, |i, r| {
            self.sorters[i].sort(r)
        })?;
        if outputs.len() == 1 {
            return Ok(outputs.into_iter().next().expect("one output"));
        }
        concat_outputs(request, outputs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CpuBackend;
    use crate::spec::{SortKey, SortSpec};
    use arrow::array::{Int64Array, StringArray, StringViewArray};
    use arrow::datatypes::{DataType, Field, Schema};

    fn small_options() -> SplitOptions {
        SplitOptions {
            sample_rows: 64,
            min_rows_per_range: 1,
            seed: 7,
            pool_per_range: true,
        }
    }

    fn table(n: usize, distinct: i64) -> RecordBatch {
        let keys =
            Int64Array::from_iter((0..n as i64).map(|i| if i % 13 == 0 { None } else { Some((i * 7919) % distinct) }));
        let names = StringArray::from_iter_values((0..n).map(|i| format!("row{:05}", (n - i) % 37)));
        let views = StringViewArray::from_iter_values((0..n).map(|i| format!("a longer string value {i}")));
        let schema = Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("s", DataType::Utf8, false),
            Field::new("v", DataType::Utf8View, false),
        ]);
        RecordBatch::try_new(Arc::new(schema), vec![Arc::new(keys), Arc::new(names), Arc::new(views)]).unwrap()
    }

    fn spec(descending: bool) -> SortSpec {
        SortSpec::new([
            SortKey {
                column: 0,
                options: SortOptions {
                    descending,
                    nulls_first: !descending,
                },
            },
            SortKey {
                column: 1,
                options: SortOptions::default(),
            },
        ])
    }

    fn split_backend(k: usize) -> SplitBackend {
        let sorters: Vec<Arc<dyn SortBackend>> = (0..k).map(|_| Arc::new(CpuBackend::new()) as _).collect();
        SplitBackend::try_new(sorters).unwrap().with_options(small_options())
    }

    #[test]
    fn split_sort_equals_one_sort() {
        for (n, distinct, k) in [(5000, 1000, 2), (5000, 3, 3), (4097, 1, 4), (10, 5, 4), (1, 1, 2)] {
            for (descending, pool_per_range) in [(false, true), (true, true), (false, false)] {
                let batch = table(n, distinct);
                let spec = spec(descending);
                let request = SortRequest::new(&batch, &spec);
                let one = CpuBackend::new().sort(&request).unwrap();
                let options = SplitOptions {
                    pool_per_range,
                    ..small_options()
                };
                let split = split_backend(k).with_options(options).sort(&request).unwrap();
                let what = format!("n {n}, distinct {distinct}, k {k}, pool per range {pool_per_range}");
                assert_eq!(split.indices, one.indices, "{what}");
                assert_eq!(split.batch, one.batch, "{what}");
                assert_eq!(split.stats.rows, n);
            }
        }
    }

    #[test]
    fn each_range_sorts_on_a_pool_of_its_own() {
        let batch = table(6000, 6000);
        let spec = spec(false);
        let request = SortRequest::new(&batch, &spec);
        let ranges = split_ranges(&request, 3, &small_options()).unwrap();
        let seen = std::sync::Mutex::new(vec![]);
        let cpu = CpuBackend::new();
        let sort = |i: usize, r: &SortRequest<'_>| {
            seen.lock().unwrap().push((
                i,
                std::thread::current().name().map(str::to_string),
                rayon::current_num_threads(),
            ));
            cpu.sort(r)
        };
        for pool_per_range in [true, false] {
            let options = SplitOptions {
                pool_per_range,
                ..small_options()
            };
            seen.lock().unwrap().clear();
            sort_ranges(&request, &ranges, &options, sort).unwrap();
            let mut seen = seen.lock().unwrap().clone();
            seen.sort();
            assert_eq!(seen.len(), 3);
            for (i, name, threads) in &seen {
                let expected = match pool_per_range {
                    true => (rayon::current_num_threads() / 3).max(1),
                    false => rayon::current_num_threads(),
                };
                assert_eq!(*threads, expected, "range {i}, pool per range {pool_per_range}");
                let on_its_pool = name
                    .as_deref()
                    .is_some_and(|n| n.starts_with(&format!("gpusort-range{i}-")));
                assert_eq!(on_its_pool, pool_per_range, "range {i} ran on {name:?}");
            }
        }
    }

    #[test]
    fn ranges_cover_every_row_once_and_are_balanced() {
        // One key value for every row: ties split by position.
        let batch = table(20_000, 1);
        let spec = spec(false);
        let request = SortRequest::new(&batch, &spec);
        let options = SplitOptions {
            sample_rows: 4096,
            ..small_options()
        };
        let ranges = split_ranges(&request, 4, &options).unwrap();
        assert_eq!(ranges.len(), 4);
        let mut all: Vec<u32> = ranges.iter().flat_map(|r| r.rows.iter().copied()).collect();
        all.sort_unstable();
        assert_eq!(all, (0..20_000).collect::<Vec<u32>>());
        let sizes: Vec<usize> = ranges.iter().map(|r| r.rows.len()).collect();
        assert!(crate::partition::imbalance(&sizes) < 1.25, "{sizes:?}");
        for r in &ranges {
            assert!(r.rows.windows(2).all(|w| w[0] < w[1]));
            assert_eq!(r.batch.num_rows(), r.rows.len());
        }
    }

    #[test]
    fn limit_keeps_the_first_rows_of_the_whole_sort() {
        let batch = table(3000, 500);
        let spec = spec(true);
        for limit in [0, 1, 700, 2999, 5000] {
            let request = SortRequest::new(&batch, &spec).with_limit(Some(limit));
            let one = CpuBackend::new().sort(&request).unwrap();
            let split = split_backend(3).sort(&request).unwrap();
            assert_eq!(split.indices, one.indices, "limit {limit}");
            assert_eq!(split.batch, one.batch);
        }
    }

    #[test]
    fn few_rows_sort_on_one_sorter_and_empty_input_sorts() {
        let options = SplitOptions::default();
        assert_eq!(options.ranges_for(0, 4), 1);
        assert_eq!(options.ranges_for(options.min_rows_per_range * 2 - 1, 4), 1);
        assert_eq!(options.ranges_for(options.min_rows_per_range * 3, 2), 2);
        let batch = table(0, 1);
        let spec = spec(false);
        let out = split_backend(2).sort(&SortRequest::new(&batch, &spec)).unwrap();
        assert_eq!(out.batch.num_rows(), 0);
        assert!(SplitBackend::try_new(vec![]).is_err());
    }

    #[test]
    fn a_failing_range_fails_the_sort() {
        let batch = table(2000, 100);
        let spec = spec(false);
        let request = SortRequest::new(&batch, &spec);
        let err = sort_split(&request, 2, &small_options(), |i, r| -> Result<SortOutput> {
            if i == 1 {
                Err(GpusortError::Backend("device 1 failed".into()))
            } else {
                CpuBackend::new().sort(r)
            }
        })
        .unwrap_err();
        assert!(err.to_string().contains("device 1 failed"), "{err}");
    }
}
