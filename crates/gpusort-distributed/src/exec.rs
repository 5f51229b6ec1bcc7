//! The plan nodes of the range-partitioned sort: row positions, the range each row goes to,
//! and the in-order concatenation of the sorted ranges (the key sample is in `sample.rs`).

use std::fmt;
use std::sync::{Arc, OnceLock};

use arrow::array::{Array, ArrayRef, RecordBatch, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::physical_plan::FileScanConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, LexOrdering, PhysicalExpr, PhysicalSortExpr};
use datafusion::physical_plan::execution_plan::EmissionType;
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, Label, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning, PlanProperties,
    SendableRecordBatchStream,
};
use datafusion_distributed::DistributedTaskContext;
use futures::StreamExt;
use gpusort::partition::Splitters;

use crate::route::route_values;

/// The column [`RowPositionExec`] adds: each row's position in the input.
pub const POSITION_COLUMN: &str = "__gpusort_position";
/// The column [`RangeRouteExec`] adds: the hash-partition value of each row's range.
pub const ROUTE_COLUMN: &str = "__gpusort_route";
/// [`RangeRouteExec`]'s counter of the rows it sends to a range, one per range, labelled
/// [`RANGE_LABEL`] with the range's number.
pub const RANGE_ROWS_METRIC: &str = "range_rows";
/// The label of [`RANGE_ROWS_METRIC`]: the range's number.
pub const RANGE_LABEL: &str = "range";

/// Rows of one file range fit in this many bits of a position; the range's number is above.
const ROW_BITS: u32 = 40;

fn with_column(schema: &SchemaRef, name: &str) -> SchemaRef {
    let mut fields: Vec<Arc<Field>> = schema.fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new(name, DataType::UInt64, false)));
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

fn plain_properties(schema: SchemaRef, input: &Arc<dyn ExecutionPlan>, partitions: usize) -> Arc<PlanProperties> {
    Arc::new(PlanProperties::new(
        EquivalenceProperties::new(schema),
        Partitioning::UnknownPartitioning(partitions),
        input.pipeline_behavior(),
        input.boundedness(),
    ))
}

/// The [`ExecutionPlan`] methods this crate's nodes write alike, for a node with one child in
/// its field `input` and its properties in `properties`: `name`; `apply_expressions` over the
/// sort expressions in the field `exprs` names (none for `exprs = []`);
/// `maintains_input_order` (`keeps_order`); and `with_new_children` through `rebuild`, a
/// function from the node and its new child to the new node.
macro_rules! one_child_methods {
    ($name:literal, exprs = [$($exprs:ident)?], keeps_order = $keeps:literal, rebuild = $rebuild:expr) => {
        fn name(&self) -> &str {
            $name
        }
        fn properties(&self) -> &::std::sync::Arc<::datafusion::physical_plan::PlanProperties> {
            &self.properties
        }
        fn children(&self) -> Vec<&::std::sync::Arc<dyn ::datafusion::physical_plan::ExecutionPlan>> {
            vec![&self.input]
        }
        fn apply_expressions(
            &self,
            f: &mut dyn FnMut(
                &::std::sync::Arc<dyn ::datafusion::physical_expr::PhysicalExpr>,
            ) -> ::datafusion::error::Result<::datafusion::common::tree_node::TreeNodeRecursion>,
        ) -> ::datafusion::error::Result<::datafusion::common::tree_node::TreeNodeRecursion> {
            let exprs: &[::datafusion::physical_expr::PhysicalSortExpr] = one_child_methods!(@exprs self $($exprs)?);
            $crate::exec::apply_sort_exprs(exprs, f)
        }
        fn maintains_input_order(&self) -> Vec<bool> {
            vec![$keeps]
        }
        fn with_new_children(
            self: ::std::sync::Arc<Self>,
            children: Vec<::std::sync::Arc<dyn ::datafusion::physical_plan::ExecutionPlan>>,
        ) -> ::datafusion::error::Result<::std::sync::Arc<dyn ::datafusion::physical_plan::ExecutionPlan>> {
            let rebuild: fn(
                &Self,
                ::std::sync::Arc<dyn ::datafusion::physical_plan::ExecutionPlan>,
            ) -> ::datafusion::error::Result<Self> = $rebuild;
            let child = $crate::exec::one_child(self.name(), children)?;
            Ok(::std::sync::Arc::new(rebuild(&self, child)?))
        }
    };
    (@exprs $node:tt) => {
        &[]
    };
    (@exprs $node:tt $field:ident) => {
        &$node.$field
    };
}
pub(crate) use one_child_methods;

pub(crate) fn one_child(name: &str, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
    let [child] = <[_; 1]>::try_from(children)
        .map_err(|c| DataFusionError::Internal(format!("{name} has one child, got {}", c.len())))?;
    Ok(child)
}

pub(crate) fn apply_sort_exprs(
    exprs: &[PhysicalSortExpr],
    f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
) -> Result<TreeNodeRecursion> {
    for e in exprs {
        if f(&e.expr)? == TreeNodeRecursion::Stop {
            return Ok(TreeNodeRecursion::Stop);
        }
    }
    Ok(TreeNodeRecursion::Continue)
}

pub(crate) fn evaluate_keys(exprs: &[PhysicalSortExpr], batch: &RecordBatch) -> Result<Vec<ArrayRef>> {
    exprs
        .iter()
        .map(|e| e.expr.evaluate(batch)?.into_array(batch.num_rows()))
        .collect()
}

fn positions_of(batch: &RecordBatch, index: usize) -> Result<&[u64]> {
    batch
        .column(index)
        .as_any()
        .downcast_ref::<UInt64Array>()
        .map(|a| a.values().as_ref())
        .ok_or_else(|| DataFusionError::Internal(format!("{POSITION_COLUMN} is not UInt64")))
}

/// Appends [`POSITION_COLUMN`] to its input's rows: the number of the file range the row was
/// read from, then the row's number within it. Put right above a file scan that
/// datafusion-distributed splits over `T` tasks, partition `p` of task `t` reads file range
/// `p × T + t` of the whole scan (its file-scan handler deals the ranges out round-robin,
/// ranges in file order), so positions follow the order a single-node scan reads the rows
/// in, whichever task reads them.
#[derive(Debug)]
pub struct RowPositionExec {
    input: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
}

impl RowPositionExec {
    /// Numbers the rows of `input` (a file scan).
    pub fn new(input: Arc<dyn ExecutionPlan>) -> Self {
        let schema = with_column(&input.schema(), POSITION_COLUMN);
        let partitions = input.output_partitioning().partition_count();
        let properties = plain_properties(schema, &input, partitions);
        Self { input, properties }
    }
}

impl DisplayAs for RowPositionExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "RowPositionExec: {POSITION_COLUMN}")
    }
}

impl ExecutionPlan for RowPositionExec {
    one_child_methods!(
        "RowPositionExec",
        exprs = [],
        keeps_order = true,
        rebuild = |_, input| Ok(Self::new(input))
    );
    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let task = DistributedTaskContext::from_ctx(&context);
        let range = (partition * task.task_count + task.task_index) as u64;
        let mut next = range << ROW_BITS;
        let schema = self.schema();
        let out = Arc::clone(&schema);
        let stream = self.input.execute(partition, context)?.map(move |batch| {
            let batch = batch?;
            let n = batch.num_rows() as u64;
            let positions = UInt64Array::from_iter_values(next..next + n);
            next += n;
            let mut columns = batch.columns().to_vec();
            columns.push(Arc::new(positions));
            Ok(RecordBatch::try_new(Arc::clone(&out), columns)?)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

/// `plan` with every file scan below a [`RowPositionExec`] reading its files in the order
/// of its file groups (`preserve_order`): DataFusion otherwise lets a scan partition steal
/// files from its siblings (`enable_file_stream_work_stealing`), and positions would follow
/// who read a file rather than where it lies. For the coordinator's plan and, through
/// [`crate::worker`]'s plan rewrite, for the plans workers decode (the flag does not travel
/// in DataFusion's plan serialization).
pub fn keep_file_order(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_down(|node| {
        if !node.is::<RowPositionExec>() {
            return Ok(Transformed::no(node));
        }
        let kept = Arc::clone(&node).transform_up(|n| {
            let Some(config) = n
                .downcast_ref::<DataSourceExec>()
                .and_then(|d| d.data_source().downcast_ref::<FileScanConfig>())
            else {
                return Ok(Transformed::no(n));
            };
            if config.preserve_order {
                return Ok(Transformed::no(n));
            }
            let mut config = config.clone();
            config.preserve_order = true;
            Ok(Transformed::yes(
                DataSourceExec::from_data_source(config) as Arc<dyn ExecutionPlan>
            ))
        })?;
        Ok(Transformed::new(kept.data, kept.transformed, TreeNodeRecursion::Jump))
    })
    .map(|t| t.data)
}

/// Appends [`ROUTE_COLUMN`] to its input's rows: for each row, the range of `ranges` that the
/// splitters put its `(keys, position)` in, written as the value DataFusion's hash
/// repartitioning into `ranges` partitions sends to that partition ([`route_values`]), so a
/// `RepartitionExec` hashing that column (under datafusion-distributed's shuffle) sends range
/// `r` to partition `r`. It counts the rows it sends to each range ([`RANGE_ROWS_METRIC`]), a
/// metric that datafusion-distributed sends back to the coordinator
/// ([`crate::RangeSortMetrics`]).
#[derive(Debug)]
pub struct RangeRouteExec {
    input: Arc<dyn ExecutionPlan>,
    keys: Vec<PhysicalSortExpr>,
    position: usize,
    splitters: Arc<Splitters>,
    routes: Arc<OnceLock<Vec<u64>>>,
    metrics: ExecutionPlanMetricsSet,
    range_rows: Arc<OnceLock<Vec<Count>>>,
    properties: Arc<PlanProperties>,
}

impl RangeRouteExec {
    /// Routes the rows of `input` by `keys` (the sort expressions, whose options the
    /// splitters have) and the position in column `position`.
    pub fn new(
        input: Arc<dyn ExecutionPlan>,
        keys: Vec<PhysicalSortExpr>,
        position: usize,
        splitters: Arc<Splitters>,
    ) -> Self {
        let schema = with_column(&input.schema(), ROUTE_COLUMN);
        let partitions = input.output_partitioning().partition_count();
        let properties = plain_properties(schema, &input, partitions);
        Self {
            input,
            keys,
            position,
            splitters,
            routes: Arc::new(OnceLock::new()),
            metrics: ExecutionPlanMetricsSet::new(),
            range_rows: Arc::new(OnceLock::new()),
            properties,
        }
    }

    /// The counters of rows sent to each range, shared by the partitions.
    fn range_counters(&self) -> Vec<Count> {
        self.range_rows
            .get_or_init(|| {
                (0..self.splitters.num_ranges())
                    .map(|r| {
                        MetricBuilder::new(&self.metrics)
                            .with_label(Label::new(RANGE_LABEL, r.to_string()))
                            .global_counter(RANGE_ROWS_METRIC)
                    })
                    .collect()
            })
            .clone()
    }

    /// The sort keys.
    pub fn keys(&self) -> &[PhysicalSortExpr] {
        &self.keys
    }
    /// The input column of the positions.
    pub fn position(&self) -> usize {
        self.position
    }
    /// The splitters.
    pub fn splitters(&self) -> &Splitters {
        &self.splitters
    }
}

impl DisplayAs for RangeRouteExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let keys: Vec<String> = self.keys.iter().map(|k| k.to_string()).collect();
        write!(
            f,
            "RangeRouteExec: keys=[{}], ranges={}",
            keys.join(", "),
            self.splitters.num_ranges()
        )
    }
}

impl ExecutionPlan for RangeRouteExec {
    one_child_methods!(
        "RangeRouteExec",
        exprs = [keys],
        keeps_order = true,
        rebuild = |s, input| Ok(Self::new(input, s.keys.clone(), s.position, Arc::clone(&s.splitters)))
    );
    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let ranges = self.splitters.num_ranges();
        if self.routes.get().is_none() {
            let _ = self.routes.set(route_values(ranges)?);
        }
        let routes = Arc::clone(&self.routes);
        let counters = self.range_counters();
        let splitters = Arc::clone(&self.splitters);
        let keys = self.keys.clone();
        let position = self.position;
        let schema = self.schema();
        let out = Arc::clone(&schema);
        let stream = self.input.execute(partition, context)?.map(move |batch| {
            let batch = batch?;
            let key_columns = evaluate_keys(&keys, &batch)?;
            let assigned = splitters
                .assign(&key_columns, positions_of(&batch, position)?)
                .map_err(|e| DataFusionError::External(Box::new(e)))?;
            let routes = routes.get().expect("set before the stream");
            let mut rows = vec![0usize; counters.len()];
            assigned.iter().for_each(|&r| rows[r as usize] += 1);
            counters.iter().zip(rows).for_each(|(c, n)| c.add(n));
            let values = UInt64Array::from_iter_values(assigned.iter().map(|&r| routes[r as usize]));
            let mut columns = batch.columns().to_vec();
            columns.push(Arc::new(values));
            Ok(RecordBatch::try_new(Arc::clone(&out), columns)?)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

/// Reads its input's partitions one after the other, in partition order, as one partition:
/// the sorted ranges of a range-partitioned sort, concatenated. Every partition starts at
/// once (each runs ahead by a couple of batches), so the ranges sort in parallel; the output
/// has `ordering`, which the caller vouches for.
#[derive(Debug)]
pub struct OrderedConcatExec {
    input: Arc<dyn ExecutionPlan>,
    ordering: LexOrdering,
    properties: Arc<PlanProperties>,
}

impl OrderedConcatExec {
    /// Concatenates the partitions of `input`, which together are in `ordering`.
    pub fn new(input: Arc<dyn ExecutionPlan>, ordering: LexOrdering) -> Self {
        let eq = EquivalenceProperties::new_with_orderings(input.schema(), [ordering.clone()]);
        let properties = Arc::new(PlanProperties::new(
            eq,
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            input.boundedness(),
        ));
        Self {
            input,
            ordering,
            properties,
        }
    }

    /// The order of the output.
    pub fn ordering(&self) -> &LexOrdering {
        &self.ordering
    }
}

impl DisplayAs for OrderedConcatExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "OrderedConcatExec: [{}]", self.ordering)
    }
}

impl ExecutionPlan for OrderedConcatExec {
    one_child_methods!(
        "OrderedConcatExec",
        exprs = [ordering],
        keeps_order = true,
        rebuild = |s, input| Ok(Self::new(input, s.ordering.clone()))
    );
    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "OrderedConcatExec has one partition, asked for {partition}"
            )));
        }
        let partitions = self.input.output_partitioning().partition_count();
        let mut receivers = Vec::with_capacity(partitions);
        let mut tasks = Vec::with_capacity(partitions);
        for p in 0..partitions {
            let mut stream = self.input.execute(p, Arc::clone(&context))?;
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<RecordBatch>>(2);
            tasks.push(SpawnedTask::spawn(async move {
                while let Some(batch) = stream.next().await {
                    let stop = batch.is_err();
                    if tx.send(batch).await.is_err() || stop {
                        break;
                    }
                }
            }));
            receivers.push(rx);
        }
        // The tasks live (and are aborted) with the stream.
        let chained = futures::stream::iter(receivers).flat_map(move |rx| {
            let _running = &tasks;
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|batch| (batch, rx)) })
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.schema(), chained)))
    }
}
