//! Sorts of a Parquet file whose `GpuSortExec` reads the file itself ([`DeviceScan`]): table
//! `t` written to a snappy or zstd Parquet file, and the plan of `SELECT * FROM file ORDER BY ...`
//! with its sort told the file, as `gpusort sort` tells it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::physical_plan::{ExecutionPlan, collect};
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use datafusion_gpusort::{DeviceScan, GpuSortExec};

/// Table `t` of `ctx` written to `dir/t.parquet` with snappy pages (a codec the device decodes).
pub async fn t_as_parquet(ctx: &SessionContext, dir: &Path) -> PathBuf {
    t_as_row_groups(ctx, dir, 1 << 20, "snappy").await
}

/// [`t_as_parquet`] in row groups of `rows` rows, its pages compressed by `codec` (DataFusion's
/// name: `snappy`, `zstd(3)`).
pub async fn t_as_row_groups(ctx: &SessionContext, dir: &Path, rows: usize, codec: &str) -> PathBuf {
    let path = dir.join("t.parquet");
    let sql = format!(
        "COPY (SELECT * FROM t) TO '{}' STORED AS PARQUET OPTIONS ('format.compression' '{codec}', \
         'format.max_row_group_size' '{rows}')",
        path.display()
    );
    ctx.sql(&sql).await.unwrap().collect().await.unwrap();
    path
}

/// The rows of `file`'s columns `select` sorted by `order` on `ctx` (pretty-printed), and the
/// plan that ran them: its `GpuSortExec`s told the file when `scan`.
pub async fn sorted_columns(
    ctx: &SessionContext,
    file: &Path,
    select: &str,
    order: &str,
    scan: bool,
) -> (String, Arc<dyn ExecutionPlan>) {
    let df = ctx
        .read_parquet(file.display().to_string(), ParquetReadOptions::default())
        .await
        .unwrap();
    ctx.register_table("f", df.into_view()).unwrap();
    let df = ctx
        .sql(&format!("SELECT {select} FROM f ORDER BY {order}"))
        .await
        .unwrap();
    ctx.deregister_table("f").unwrap();
    let mut plan = df.create_physical_plan().await.unwrap();
    if scan {
        plan = plan
            .transform_down(|node| match node.downcast_ref::<GpuSortExec>() {
                Some(sort) => {
                    let told = sort
                        .clone()
                        .with_device_scan(Some(DeviceScan::new(vec![file.to_path_buf()])));
                    Ok(Transformed::yes(Arc::new(told) as Arc<dyn ExecutionPlan>))
                }
                None => Ok(Transformed::no(node)),
            })
            .unwrap()
            .data;
    }
    let batches = collect(Arc::clone(&plan), ctx.task_ctx()).await.unwrap();
    let text = arrow::util::pretty::pretty_format_batches(&batches)
        .unwrap()
        .to_string();
    (text, plan)
}

/// The value of metric `name` summed over the plan's `GpuSortExec`s (0 when none has it).
pub fn sort_metric(plan: &Arc<dyn ExecutionPlan>, name: &str) -> usize {
    let mut total = 0;
    plan.apply(|node| {
        if node.downcast_ref::<GpuSortExec>().is_some()
            && let Some(m) = node.metrics()
        {
            total += m.sum_by_name(name).map_or(0, |v| v.as_usize());
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    })
    .unwrap();
    total
}

/// Orders of `t` by its columns (rows tied on all of them are alike, so a stock sort prints the
/// same lines).
pub const DEVICE_SCAN_ORDERS: &[&str] = &["a DESC NULLS LAST, b, c", "b NULLS FIRST, c DESC, a", "c, a, b"];

/// `file` sorted by `order` on `ours` with its sort told the file equals stock DataFusion's
/// sort of it, and the sort read `files` files on the GPU and fell back `fallbacks` times; the
/// plan that ran.
pub async fn check_device_scan(
    stock: &SessionContext,
    ours: &SessionContext,
    file: &Path,
    order: &str,
    counts: (usize, usize),
) -> Arc<dyn ExecutionPlan> {
    check_device_scan_of(stock, ours, file, "*", order, counts).await
}

/// [`check_device_scan`] of the columns `select` lists.
pub async fn check_device_scan_of(
    stock: &SessionContext,
    ours: &SessionContext,
    file: &Path,
    select: &str,
    order: &str,
    (files, fallbacks): (usize, usize),
) -> Arc<dyn ExecutionPlan> {
    let (expected, _) = sorted_columns(stock, file, select, order, false).await;
    let (actual, plan) = sorted_columns(ours, file, select, order, true).await;
    assert!(
        actual == expected,
        "ORDER BY {order}: the rows differ from stock DataFusion's"
    );
    let shown = datafusion::physical_plan::displayable(plan.as_ref())
        .indent(false)
        .to_string();
    assert!(shown.contains("device_scan=1 files"), "{shown}");
    assert_eq!(sort_metric(&plan, "device_scan_files"), files, "ORDER BY {order}");
    assert_eq!(
        sort_metric(&plan, "device_scan_fallbacks"),
        fallbacks,
        "ORDER BY {order}"
    );
    plan
}
