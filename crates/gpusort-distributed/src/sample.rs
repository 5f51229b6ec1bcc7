//! [`SampleExec`]: a uniform sample of the sort keys, and the thinning that makes the
//! partitions' samples one uniform sample of the whole input.

use std::fmt;
use std::sync::Arc;

use arrow::array::{Array, BooleanArray, RecordBatch, UInt32Array, UInt64Array};
use arrow::compute::{concat_batches, filter_record_batch, take};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalSortExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning, PlanProperties,
    SendableRecordBatchStream,
};
use datafusion_distributed::DistributedTaskContext;
use futures::StreamExt;
use gpusort::partition::Reservoir;

use crate::exec::{POSITION_COLUMN, evaluate_keys, one_child_methods};

/// The column of [`SampleExec`]'s output that says how many rows the partition a sample row
/// comes from saw.
pub const SEEN_COLUMN: &str = "__gpusort_seen";

/// Keeps a uniform sample (a seeded reservoir of `capacity` rows per partition) of its
/// input's sort keys and positions: one batch per partition, columns `k0, k1, ...` (the values
/// of `keys`), [`POSITION_COLUMN`] and [`SEEN_COLUMN`]. Partitions of different sizes keep as
/// many rows each: [`thin_to_uniform`] makes their samples one sample of the whole input.
#[derive(Debug)]
pub struct SampleExec {
    input: Arc<dyn ExecutionPlan>,
    keys: Vec<PhysicalSortExpr>,
    position: usize,
    capacity: usize,
    properties: Arc<PlanProperties>,
}

impl SampleExec {
    /// Samples `capacity` rows of each partition of `input`: the values of `keys` and the
    /// position in column `position`.
    pub fn try_new(
        input: Arc<dyn ExecutionPlan>,
        keys: Vec<PhysicalSortExpr>,
        position: usize,
        capacity: usize,
    ) -> Result<Self> {
        let in_schema = input.schema();
        let mut fields = keys
            .iter()
            .enumerate()
            .map(|(i, k)| Ok(Field::new(format!("k{i}"), k.expr.data_type(&in_schema)?, true)))
            .collect::<Result<Vec<_>>>()?;
        fields.push(Field::new(POSITION_COLUMN, DataType::UInt64, false));
        fields.push(Field::new(SEEN_COLUMN, DataType::UInt64, false));
        let schema = Arc::new(Schema::new(fields));
        let partitions = input.output_partitioning().partition_count();
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Ok(Self {
            input,
            keys,
            position,
            capacity,
            properties,
        })
    }

    /// The sort keys sampled.
    pub fn keys(&self) -> &[PhysicalSortExpr] {
        &self.keys
    }
    /// The input column of the positions.
    pub fn position(&self) -> usize {
        self.position
    }
    /// Rows kept per partition.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

impl DisplayAs for SampleExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let keys: Vec<String> = self.keys.iter().map(|k| k.to_string()).collect();
        write!(
            f,
            "SampleExec: keys=[{}], rows_per_partition={}",
            keys.join(", "),
            self.capacity
        )
    }
}

/// The rows a reservoir keeps, in chunks of taken rows, with the slot table into them.
struct SampleRows {
    chunks: Vec<RecordBatch>,
    slots: Vec<(usize, usize)>,
    stored: usize,
}

impl SampleRows {
    fn live(&self, schema: &SchemaRef) -> Result<RecordBatch> {
        let all = concat_batches(schema, &self.chunks)?;
        let offsets: Vec<usize> = self
            .chunks
            .iter()
            .scan(0, |o, c| {
                let start = *o;
                *o += c.num_rows();
                Some(start)
            })
            .collect();
        let idx = UInt32Array::from_iter_values(self.slots.iter().map(|(c, r)| (offsets[*c] + r) as u32));
        let columns = all
            .columns()
            .iter()
            .map(|c| take(c.as_ref(), &idx, None))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
    }
}

impl ExecutionPlan for SampleExec {
    one_child_methods!(
        "SampleExec",
        exprs = [keys],
        keeps_order = false,
        rebuild = |s, input| Self::try_new(input, s.keys.clone(), s.position, s.capacity)
    );
    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let task = DistributedTaskContext::from_ctx(&context);
        let seed = ((task.task_index as u64) << 32) ^ partition as u64;
        let mut input = self.input.execute(partition, context)?;
        let schema = self.schema();
        let keys = self.keys.clone();
        let (position, capacity) = (self.position, self.capacity);
        // The rows kept, without the count of rows seen (appended at the end).
        let out = Arc::new(schema.project(&(0..keys.len() + 1).collect::<Vec<_>>())?);
        let with_seen = Arc::clone(&schema);
        let stream = futures::stream::once(async move {
            let mut reservoir = Reservoir::new(capacity, seed);
            let mut rows = SampleRows {
                chunks: vec![],
                slots: vec![],
                stored: 0,
            };
            while let Some(batch) = input.next().await {
                let batch = batch?;
                let kept = reservoir.offer(batch.num_rows());
                if kept.is_empty() {
                    continue;
                }
                // The last pick of a slot wins; take each picked row once.
                let mut take_rows: Vec<u32> = vec![];
                let chunk = rows.chunks.len();
                for (row, slot) in kept {
                    let at = take_rows.len();
                    take_rows.push(row as u32);
                    if slot == rows.slots.len() {
                        rows.slots.push((chunk, at));
                    } else {
                        rows.slots[slot] = (chunk, at);
                    }
                }
                let idx = UInt32Array::from(take_rows);
                let mut columns = evaluate_keys(&keys, &batch)?
                    .iter()
                    .map(|c| take(c.as_ref(), &idx, None))
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                columns.push(take(batch.column(position).as_ref(), &idx, None)?);
                rows.stored += idx.len();
                rows.chunks.push(RecordBatch::try_new(Arc::clone(&out), columns)?);
                if rows.stored > 4 * capacity + 1024 {
                    let live = rows.live(&out)?;
                    rows.slots = (0..live.num_rows()).map(|r| (0, r)).collect();
                    rows.stored = live.num_rows();
                    rows.chunks = vec![live];
                }
            }
            let live = rows.live(&out)?;
            let mut columns = live.columns().to_vec();
            columns.push(Arc::new(UInt64Array::from(vec![reservoir.seen(); live.num_rows()])));
            Ok(RecordBatch::try_new(with_seen, columns)?)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

/// A uniform number in `[0, 1)` from a row's position (splitmix64's finalizer).
fn unit(position: u64) -> f64 {
    let mut z = position.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
}

/// The rows of `sample` (all partitions' [`SampleExec`] output, `capacity` rows a partition)
/// that make one uniform sample of the input. A partition that saw `n` rows kept
/// `k = min(n, capacity)`, each standing for `n / k` input rows; a row is kept with
/// probability `(n / k) / w`, `w` the largest such weight, so that every kept row stands for
/// `w` input rows: without this, a small partition's rows would weigh as much as a large
/// one's and its keys would pull the splitters. Which rows stay is decided by a hash of their
/// position (the same input gives the same sample). Returns the key and position columns.
pub fn thin_to_uniform(sample: &RecordBatch, capacity: usize) -> Result<RecordBatch> {
    let n = sample.num_columns();
    let column = |i: usize| {
        sample
            .column(i)
            .as_any()
            .downcast_ref::<UInt64Array>()
            .ok_or_else(|| DataFusionError::Internal(format!("sample column {i} is not UInt64")))
    };
    let (positions, seen) = (column(n - 2)?, column(n - 1)?);
    let capacity = capacity.max(1) as f64;
    let weight = |seen: u64| (seen as f64 / capacity).max(1.0);
    let heaviest = seen.values().iter().map(|&s| weight(s)).fold(1.0, f64::max);
    let keep = BooleanArray::from_iter(
        positions
            .values()
            .iter()
            .zip(seen.values())
            .map(|(&p, &s)| Some(unit(p) < weight(s) / heaviest)),
    );
    let kept = filter_record_batch(sample, &keep)?;
    Ok(kept.project(&(0..n - 1).collect::<Vec<_>>())?)
}
