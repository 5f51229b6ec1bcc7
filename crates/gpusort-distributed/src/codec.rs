//! [`GpuSortCodec`]: gpusort's plan nodes on the wire.

use std::io::Cursor;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, UInt64Array};
use arrow::compute::SortOptions;
use arrow::datatypes::{DataType, Field, Schema};
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use datafusion::common::config::ExtensionOptions;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{LexOrdering, PhysicalSortExpr};
use datafusion::physical_plan::ExecutionPlan;
use datafusion_gpusort::{GpuSortConfig, GpuSortExec};
use datafusion_proto::physical_plan::from_proto::parse_physical_sort_exprs;
use datafusion_proto::physical_plan::to_proto::serialize_physical_sort_exprs;
use datafusion_proto::physical_plan::{
    PhysicalExtensionCodec, PhysicalPlanDecodeContext, PhysicalProtoConverterExtension,
};
use datafusion_proto::protobuf::PhysicalSortExprNode;
use gpusort::partition::Splitters;
use prost::Message;

use crate::exec::{OrderedConcatExec, RangeRouteExec, RowPositionExec};
use crate::sample::SampleExec;

/// A `PhysicalExtensionCodec` for [`GpuSortExec`] (sort expressions, `fetch`,
/// `preserve_partitioning` and its `gpusort.*` options, so a worker sorts as the coordinator
/// planned) and for this crate's nodes ([`RowPositionExec`], [`SampleExec`],
/// [`RangeRouteExec`] with its splitters, [`OrderedConcatExec`]). Register it on the
/// coordinator and on every worker (`with_distributed_user_codec`).
#[derive(Debug, Default, Clone, Copy)]
pub struct GpuSortCodec;

const GPU_SORT: u32 = 1;
const ROW_POSITION: u32 = 2;
const SAMPLE: u32 = 3;
const RANGE_ROUTE: u32 = 4;
const ORDERED_CONCAT: u32 = 5;

/// One node: its kind and the fields that kind uses.
#[derive(Clone, PartialEq, Message)]
struct NodeProto {
    #[prost(uint32, tag = "1")]
    kind: u32,
    #[prost(message, repeated, tag = "2")]
    sort_exprs: Vec<PhysicalSortExprNode>,
    #[prost(uint64, optional, tag = "3")]
    fetch: Option<u64>,
    #[prost(bool, tag = "4")]
    preserve_partitioning: bool,
    /// `gpusort.*` options as `key=value`.
    #[prost(string, repeated, tag = "5")]
    options: Vec<String>,
    #[prost(uint64, tag = "6")]
    position: u64,
    #[prost(uint64, tag = "7")]
    capacity: u64,
    /// The splitters' keys and positions, as an Arrow IPC stream.
    #[prost(bytes = "vec", tag = "8")]
    splitters: Vec<u8>,
}

fn err(message: impl Into<String>) -> DataFusionError {
    DataFusionError::Internal(format!("GpuSortCodec: {}", message.into()))
}

fn encode_splitters(s: &Splitters) -> Result<Vec<u8>> {
    let mut fields: Vec<Field> = s
        .keys()
        .iter()
        .enumerate()
        .map(|(i, k)| Field::new(format!("k{i}"), k.data_type().clone(), true))
        .collect();
    // The keys' sort options travel in the schema's metadata: "k<i>" -> "<descending><nulls_first>".
    fields.push(Field::new("position", DataType::UInt64, false));
    let metadata = s
        .options()
        .iter()
        .enumerate()
        .map(|(i, o)| {
            (
                format!("k{i}"),
                format!("{}{}", o.descending as u8, o.nulls_first as u8),
            )
        })
        .collect();
    let schema = Arc::new(Schema::new_with_metadata(fields, metadata));
    let mut columns: Vec<ArrayRef> = s.keys().to_vec();
    columns.push(Arc::new(UInt64Array::from(s.positions().to_vec())));
    let batch = RecordBatch::try_new(Arc::clone(&schema), columns)?;
    let mut buf = vec![];
    let mut writer = StreamWriter::try_new(&mut buf, &schema)?;
    writer.write(&batch)?;
    writer.finish()?;
    drop(writer);
    Ok(buf)
}

fn decode_splitters(buf: &[u8]) -> Result<Splitters> {
    let reader = StreamReader::try_new(Cursor::new(buf), None)?;
    let schema = reader.schema();
    let batches = reader.collect::<std::result::Result<Vec<_>, _>>()?;
    let batch = arrow::compute::concat_batches(&schema, &batches)?;
    let n = batch.num_columns() - 1;
    let options = (0..n)
        .map(|i| {
            let flags = schema
                .metadata()
                .get(&format!("k{i}"))
                .ok_or_else(|| err("splitter options missing"))?;
            Ok(SortOptions {
                descending: flags.starts_with('1'),
                nulls_first: flags.ends_with('1'),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let positions = batch
        .column(n)
        .as_any()
        .downcast_ref::<UInt64Array>()
        .ok_or_else(|| err("splitter positions are not UInt64"))?
        .values()
        .to_vec();
    Splitters::try_new(batch.columns()[..n].to_vec(), positions, options)
        .map_err(|e| DataFusionError::External(Box::new(e)))
}

impl GpuSortCodec {
    fn sort_exprs(
        &self,
        exprs: &[PhysicalSortExpr],
        converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Vec<PhysicalSortExprNode>> {
        serialize_physical_sort_exprs(exprs.iter().cloned(), self, converter)
    }

    fn parse_sort_exprs(
        &self,
        nodes: &[PhysicalSortExprNode],
        input: &Arc<dyn ExecutionPlan>,
        ctx: &TaskContext,
        converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Vec<PhysicalSortExpr>> {
        let decode = PhysicalPlanDecodeContext::new(ctx, self);
        parse_physical_sort_exprs(nodes, &decode, input.schema().as_ref(), converter)
    }
}

impl PhysicalExtensionCodec for GpuSortCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let node = NodeProto::decode(buf).map_err(|e| err(e.to_string()))?;
        let [input] = inputs else {
            return Err(err(format!("one input expected, got {}", inputs.len())));
        };
        let input = Arc::clone(input);
        let plan: Arc<dyn ExecutionPlan> = match node.kind {
            GPU_SORT => {
                let exprs = self.parse_sort_exprs(&node.sort_exprs, &input, ctx, converter)?;
                let ordering = LexOrdering::new(exprs).ok_or_else(|| err("empty sort order"))?;
                let mut options = GpuSortConfig::default();
                for entry in &node.options {
                    let (key, value) = entry.split_once('=').ok_or_else(|| err("bad option"))?;
                    options.set(key, value)?;
                }
                Arc::new(
                    GpuSortExec::try_new(ordering, input)?
                        .with_preserve_partitioning(node.preserve_partitioning)?
                        .with_fetch(node.fetch.map(|f| f as usize))
                        .with_options(options),
                )
            }
            ROW_POSITION => Arc::new(RowPositionExec::new(input)),
            SAMPLE => {
                let keys = self.parse_sort_exprs(&node.sort_exprs, &input, ctx, converter)?;
                Arc::new(SampleExec::try_new(
                    input,
                    keys,
                    node.position as usize,
                    node.capacity as usize,
                )?)
            }
            RANGE_ROUTE => {
                let keys = self.parse_sort_exprs(&node.sort_exprs, &input, ctx, converter)?;
                let splitters = decode_splitters(&node.splitters)?;
                Arc::new(RangeRouteExec::new(
                    input,
                    keys,
                    node.position as usize,
                    Arc::new(splitters),
                ))
            }
            ORDERED_CONCAT => {
                let exprs = self.parse_sort_exprs(&node.sort_exprs, &input, ctx, converter)?;
                let ordering = LexOrdering::new(exprs).ok_or_else(|| err("empty sort order"))?;
                Arc::new(OrderedConcatExec::new(input, ordering))
            }
            other => return Err(err(format!("unknown node kind {other}"))),
        };
        Ok(plan)
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        let mut proto = NodeProto::default();
        if let Some(sort) = node.downcast_ref::<GpuSortExec>() {
            let exprs: Vec<PhysicalSortExpr> = sort.expr().iter().cloned().collect();
            proto.kind = GPU_SORT;
            proto.sort_exprs = self.sort_exprs(&exprs, converter)?;
            proto.fetch = sort.fetch().map(|f| f as u64);
            proto.preserve_partitioning = sort.preserve_partitioning();
            proto.options = sort
                .options()
                .entries()
                .into_iter()
                .filter_map(|e| e.value.map(|v| format!("{}={v}", e.key)))
                .collect();
        } else if node.downcast_ref::<RowPositionExec>().is_some() {
            proto.kind = ROW_POSITION;
        } else if let Some(sample) = node.downcast_ref::<SampleExec>() {
            proto.kind = SAMPLE;
            proto.sort_exprs = self.sort_exprs(sample.keys(), converter)?;
            proto.position = sample.position() as u64;
            proto.capacity = sample.capacity() as u64;
        } else if let Some(route) = node.downcast_ref::<RangeRouteExec>() {
            proto.kind = RANGE_ROUTE;
            proto.sort_exprs = self.sort_exprs(route.keys(), converter)?;
            proto.position = route.position() as u64;
            proto.splitters = encode_splitters(route.splitters())?;
        } else if let Some(concat) = node.downcast_ref::<OrderedConcatExec>() {
            let exprs: Vec<PhysicalSortExpr> = concat.ordering().iter().cloned().collect();
            proto.kind = ORDERED_CONCAT;
            proto.sort_exprs = self.sort_exprs(&exprs, converter)?;
        } else {
            return Err(err(format!("cannot encode {}", node.name())));
        }
        proto.encode(buf).map_err(|e| err(e.to_string()))
    }
}
