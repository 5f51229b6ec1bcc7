//! [`RunMergeStream`]: the stable k-way merge of sorted runs.
//!
//! Each run's rows are compared on their **encoded keys**: the sort expressions of every batch
//! read are converted once into Arrow's row format (order-preserving bytes, direction and null
//! order included), so a comparison is one `memcmp`. A binary heap of the runs' current rows
//! picks the next output row; ties go to the run that came first in the input, which keeps the
//! merge — and so the whole external sort — **stable**: equal rows leave in input order, the
//! same order the in-memory sort gives.
//!
//! Output rows are collected as (batch, row) pairs and built with one `interleave` per output
//! batch of `batch_size` rows; batches no cursor needs any more are released then.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use arrow::array::{ArrayRef, RecordBatch};
use arrow::compute::interleave_record_batch;
use arrow::datatypes::SchemaRef;
use arrow::row::{RowConverter, Rows, SortField};
use datafusion::error::Result;
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream};
use datafusion::physical_expr::LexOrdering;
use datafusion::physical_plan::metrics::{BaselineMetrics, RecordOutput, Time};
use futures::{Stream, StreamExt};

/// One run's current batch and position in it.
struct Cursor {
    rows: Rows,
    pos: usize,
    /// Index of the batch in [`RunMergeStream::batches`].
    slot: usize,
}

/// Merges sorted streams (runs, in input order) into one sorted stream (see the module docs).
pub struct RunMergeStream {
    schema: SchemaRef,
    expr: LexOrdering,
    converter: RowConverter,
    inputs: Vec<SendableRecordBatchStream>,
    cursors: Vec<Option<Cursor>>,
    /// Runs whose next batch must be read before merging goes on.
    to_load: Vec<usize>,
    /// Runs with a current row, as a binary min-heap on (row, run).
    heap: Vec<usize>,
    batches: Vec<RecordBatch>,
    indices: Vec<(usize, usize)>,
    batch_size: usize,
    /// Rows still to produce (`usize::MAX`: all).
    remaining: usize,
    metrics: Option<BaselineMetrics>,
    /// Time spent merging (besides `elapsed_compute`).
    merge_time: Option<Time>,
    /// Memory the merge holds until it is dropped.
    _reservation: Option<MemoryReservation>,
    done: bool,
}

impl RunMergeStream {
    /// A merge of `inputs` (each sorted by `expr`; ties keep the order of `inputs`) emitting
    /// batches of `batch_size` rows and at most `fetch` rows in all.
    pub fn try_new(
        schema: SchemaRef,
        expr: LexOrdering,
        inputs: Vec<SendableRecordBatchStream>,
        batch_size: usize,
        fetch: Option<usize>,
    ) -> Result<Self> {
        let fields = expr
            .iter()
            .map(|e| Ok(SortField::new_with_options(e.expr.data_type(&schema)?, e.options)))
            .collect::<Result<Vec<_>>>()?;
        let converter = RowConverter::new(fields)?;
        let n = inputs.len();
        Ok(Self {
            schema,
            expr,
            converter,
            inputs,
            cursors: (0..n).map(|_| None).collect(),
            to_load: (0..n).rev().collect(),
            heap: Vec::with_capacity(n),
            batches: vec![],
            indices: Vec::with_capacity(batch_size),
            batch_size: batch_size.max(1),
            remaining: fetch.unwrap_or(usize::MAX),
            metrics: None,
            merge_time: None,
            _reservation: None,
            done: false,
        })
    }

    /// Records output rows and compute time in `metrics`.
    pub fn with_metrics(mut self, metrics: BaselineMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Also records the time spent merging in `time`.
    pub fn with_merge_time(mut self, time: Time) -> Self {
        self.merge_time = Some(time);
        self
    }

    /// Holds `reservation` (the memory of in-memory runs and read buffers) until the merge is
    /// dropped.
    pub fn with_reservation(mut self, reservation: MemoryReservation) -> Self {
        self._reservation = Some(reservation);
        self
    }

    /// Whether run `a`'s current row comes before run `b`'s.
    fn less(&self, a: usize, b: usize) -> bool {
        let (ca, cb) = (self.cursors[a].as_ref().unwrap(), self.cursors[b].as_ref().unwrap());
        match ca.rows.row(ca.pos).cmp(&cb.rows.row(cb.pos)) {
            std::cmp::Ordering::Equal => a < b,
            o => o.is_lt(),
        }
    }

    fn sift_up(&mut self, mut i: usize) {
        while i > 0 {
            let parent = (i - 1) / 2;
            if !self.less(self.heap[i], self.heap[parent]) {
                break;
            }
            self.heap.swap(i, parent);
            i = parent;
        }
    }

    fn sift_down(&mut self, mut i: usize) {
        let n = self.heap.len();
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut best = i;
            if l < n && self.less(self.heap[l], self.heap[best]) {
                best = l;
            }
            if r < n && self.less(self.heap[r], self.heap[best]) {
                best = r;
            }
            if best == i {
                return;
            }
            self.heap.swap(i, best);
            i = best;
        }
    }

    /// Reads the next batch of every run in `to_load`.
    fn poll_load(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        while let Some(&run) = self.to_load.last() {
            match ready!(self.inputs[run].poll_next_unpin(cx)) {
                Some(Ok(batch)) if batch.num_rows() == 0 => continue,
                Some(Ok(batch)) => {
                    let columns = self
                        .expr
                        .iter()
                        .map(|e| e.expr.evaluate(&batch)?.into_array(batch.num_rows()))
                        .collect::<Result<Vec<ArrayRef>>>()?;
                    let rows = self.converter.convert_columns(&columns)?;
                    self.batches.push(batch);
                    self.cursors[run] = Some(Cursor {
                        rows,
                        pos: 0,
                        slot: self.batches.len() - 1,
                    });
                    self.heap.push(run);
                    let last = self.heap.len() - 1;
                    self.sift_up(last);
                }
                Some(Err(e)) => return Poll::Ready(Err(e)),
                None => {}
            }
            self.to_load.pop();
        }
        Poll::Ready(Ok(()))
    }

    /// Builds the output batch from the collected indices and releases batches no cursor
    /// points into.
    fn emit(&mut self) -> Result<RecordBatch> {
        let refs: Vec<&RecordBatch> = self.batches.iter().collect();
        let out = interleave_record_batch(&refs, &self.indices)?;
        self.indices.clear();
        let mut kept = Vec::with_capacity(self.cursors.len());
        for cursor in self.cursors.iter_mut().flatten() {
            kept.push(self.batches[cursor.slot].clone());
            cursor.slot = kept.len() - 1;
        }
        // The batches no cursor needs are dropped here.
        self.batches = kept;
        Ok(out)
    }

    fn poll_merge(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<RecordBatch>>> {
        if self.done {
            return Poll::Ready(None);
        }
        loop {
            if let Err(e) = ready!(self.poll_load(cx)) {
                self.done = true;
                return Poll::Ready(Some(Err(e)));
            }
            let elapsed = self.metrics.as_ref().map(|m| m.elapsed_compute().clone());
            let _timer = elapsed.as_ref().map(|t| t.timer());
            let merge_time = self.merge_time.clone();
            let _merge_timer = merge_time.as_ref().map(|t| t.timer());
            while let Some(&run) = self.heap.first() {
                if self.indices.len() >= self.batch_size || self.remaining == 0 {
                    break;
                }
                let cursor = self.cursors[run].as_mut().unwrap();
                self.indices.push((cursor.slot, cursor.pos));
                self.remaining -= 1;
                cursor.pos += 1;
                if cursor.pos == cursor.rows.num_rows() {
                    // The run's batch is used up: its next batch decides where it goes.
                    self.cursors[run] = None;
                    let last = self.heap.pop().unwrap();
                    if !self.heap.is_empty() {
                        self.heap[0] = last;
                        self.sift_down(0);
                    }
                    self.to_load.push(run);
                    break;
                }
                self.sift_down(0);
            }
            let finished = self.remaining == 0 || (self.heap.is_empty() && self.to_load.is_empty());
            if self.indices.len() >= self.batch_size || (finished && !self.indices.is_empty()) {
                let batch = self.emit();
                if let (Ok(b), Some(m)) = (&batch, &self.metrics) {
                    b.record_output(m);
                }
                return Poll::Ready(Some(batch));
            }
            if finished {
                self.done = true;
                // Close the inputs now (spill files are deleted when their readers go).
                self.inputs.clear();
                self.batches.clear();
                return Poll::Ready(None);
            }
        }
    }
}

impl Stream for RunMergeStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.poll_merge(cx)
    }
}

impl RecordBatchStream for RunMergeStream {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}
