//! Three workers on loopback sort a Parquet file with the range-partitioned `ORDER BY`
//! (CPU path): the result equals the single-node result row for row, ties in file order.

use std::sync::Arc;

use arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow::compute::concat_batches;
use arrow::datatypes::{DataType, Field, Schema};
use datafusion::physical_plan::displayable;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use gpusort_distributed::{LoopbackCluster, collect_with_metrics};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const ROWS: usize = 24_000;

/// `id` numbers the rows in file order; `same` is one value; `zipf` is skewed (value k about
/// ROWS / (k + 1) times); `s` strings with nulls and a long common prefix; `f` floats.
fn write_table(path: &std::path::Path) {
    let mut rng = SmallRng::seed_from_u64(25);
    let weights: Vec<f64> = (0..50).map(|k| 1.0 / (k as f64 + 1.0)).collect();
    let total: f64 = weights.iter().sum();
    let zipf: Vec<i64> = (0..ROWS)
        .map(|_| {
            let mut u = rng.random::<f64>() * total;
            for (k, w) in weights.iter().enumerate() {
                if u < *w {
                    return k as i64;
                }
                u -= w;
            }
            49
        })
        .collect();
    let s: Vec<Option<String>> = (0..ROWS)
        .map(|_| (rng.random::<f64>() > 0.1).then(|| format!("a-shared-prefix-{:03}", rng.random_range(0..40))))
        .collect();
    let f: Vec<f64> = (0..ROWS).map(|_| (rng.random::<f64>() * 100.0).round()).collect();
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("same", DataType::Int64, false),
        Field::new("zipf", DataType::Int64, false),
        Field::new("s", DataType::Utf8, true),
        Field::new("f", DataType::Float64, false),
    ]));
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(0..ROWS as i64)),
        Arc::new(Int64Array::from(vec![7i64; ROWS])),
        Arc::new(Int64Array::from(zipf)),
        Arc::new(StringArray::from(s)),
        Arc::new(Float64Array::from(f)),
    ];
    let batch = RecordBatch::try_new(Arc::clone(&schema), columns).unwrap();
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(1500))
        .build();
    let mut writer = ArrowWriter::try_new(std::fs::File::create(path).unwrap(), schema, Some(props)).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
}

async fn collect(ctx: &SessionContext, sql: &str) -> RecordBatch {
    let df = ctx.sql(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    let schema = Arc::new(df.schema().as_arrow().clone());
    let batches = df.collect().await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    concat_batches(&schema, &batches).unwrap()
}

/// `got` and `want` hold the same rows in the same order; else the first row that differs.
fn assert_same(sql: &str, got: &RecordBatch, want: &RecordBatch) {
    assert_eq!(got.num_rows(), want.num_rows(), "{sql}");
    for (i, (g, w)) in got.columns().iter().zip(want.columns()).enumerate() {
        if g.to_data() != w.to_data() {
            let row = (0..g.len())
                .find(|&r| g.slice(r, 1).to_data() != w.slice(r, 1).to_data())
                .unwrap_or_default();
            let show = |b: &RecordBatch| {
                let from = row.saturating_sub(2);
                arrow::util::pretty::pretty_format_batches(&[b.slice(from, 5.min(b.num_rows() - from))]).unwrap()
            };
            panic!(
                "{sql}: column {i} differs first at row {row}\ngot:\n{}\nwant:\n{}",
                show(got),
                show(want)
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_workers_sort_like_one_node() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.parquet");
    write_table(&path);
    let path = path.to_str().unwrap();

    let cluster = LoopbackCluster::try_new(3).await.unwrap();
    let distributed = cluster.context(SessionConfig::new().with_target_partitions(4), 2);
    distributed
        .register_parquet("t", path, ParquetReadOptions::default())
        .await
        .unwrap();

    // One node, one partition, stock DataFusion; ties broken by file order (id) explicitly.
    let single = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(1));
    single
        .register_parquet("t", path, ParquetReadOptions::default())
        .await
        .unwrap();

    let queries = [
        // (distributed ORDER BY, the same with the file order as the last key)
        ("SELECT * FROM t ORDER BY same", "SELECT * FROM t ORDER BY same, id"),
        ("SELECT * FROM t ORDER BY zipf", "SELECT * FROM t ORDER BY zipf, id"),
        (
            "SELECT * FROM t ORDER BY zipf DESC, f",
            "SELECT * FROM t ORDER BY zipf DESC, f, id",
        ),
        (
            "SELECT * FROM t ORDER BY s NULLS FIRST, f DESC",
            "SELECT * FROM t ORDER BY s NULLS FIRST, f DESC, id",
        ),
        (
            "SELECT id, s FROM t WHERE f > 20 ORDER BY f DESC, s",
            "SELECT id, s FROM t WHERE f > 20 ORDER BY f DESC, s, id",
        ),
        (
            "SELECT id + 1 AS x, zipf FROM t ORDER BY zipf % 7, s",
            "SELECT id + 1 AS x, zipf FROM t ORDER BY zipf % 7, s, id",
        ),
    ];
    for (sql, reference) in queries {
        let plan = distributed
            .sql(sql)
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap();
        let shown = displayable(plan.as_ref()).indent(true).to_string();
        for node in [
            "OrderedConcatExec",
            "GpuSortExec",
            "RangeRouteExec",
            "NetworkShuffleExec",
        ] {
            assert!(shown.contains(node), "{sql}: no {node} in\n{shown}");
        }
        // Three tasks scan a third of the file each, three sort two ranges each.
        let stages = datafusion_distributed::display_plan_ascii(plan.as_ref(), false);
        assert!(stages.contains("Stage 1 ── tasks=3"), "{stages}");
        assert!(stages.contains("Stage 2 ── tasks=3, partitions=2"), "{stages}");
        assert!(!stages.contains("reverse_row_groups"), "{stages}");
        let got = collect(&distributed, sql).await;
        let want = collect(&single, reference).await;
        assert_eq!(got.num_rows(), want.num_rows(), "{sql}");
        assert!(got.num_rows() > 1000, "{sql}");
        assert_same(sql, &got, &want);
    }

    // `gpusort.merge_partitions = false` (on one node: a sort per partition, merged by a
    // GpuSortPreservingMergeExec) distributes the sort all the same: the distributed planner
    // finds DataFusion's sort before gpusort's rule rewrites it.
    distributed.sql("SET gpusort.merge_partitions = false").await.unwrap();
    let (sql, reference) = queries[1];
    let plan = distributed
        .sql(sql)
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap();
    let shown = displayable(plan.as_ref()).indent(true).to_string();
    assert!(
        shown.contains("OrderedConcatExec"),
        "{sql}, merge_partitions off:\n{shown}"
    );
    assert_same(
        sql,
        &collect(&distributed, sql).await,
        &collect(&single, reference).await,
    );
    distributed.sql("SET gpusort.merge_partitions = true").await.unwrap();

    // A table of a few rows (one row group, fewer byte ranges than tasks) and an empty result.
    let tiny = dir.path().join("tiny.parquet");
    let batch = collect(&single, "SELECT * FROM t WHERE id < 10").await;
    let mut writer = ArrowWriter::try_new(std::fs::File::create(&tiny).unwrap(), batch.schema(), None).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    let tiny = tiny.to_str().unwrap();
    distributed
        .register_parquet("tiny", tiny, ParquetReadOptions::default())
        .await
        .unwrap();
    single
        .register_parquet("tiny", tiny, ParquetReadOptions::default())
        .await
        .unwrap();
    // Two files in a directory: positions follow the files in the order the scan lists them.
    let parts = dir.path().join("parts");
    std::fs::create_dir(&parts).unwrap();
    for (name, filter) in [("a.parquet", "id < 9000"), ("b.parquet", "id >= 9000")] {
        let batch = collect(&single, &format!("SELECT * FROM t WHERE {filter}")).await;
        let file = std::fs::File::create(parts.join(name)).unwrap();
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(1000))
            .build();
        let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(props)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
    }
    let parts = format!("{}/", parts.to_str().unwrap());
    distributed
        .register_parquet("parts", &parts, ParquetReadOptions::default())
        .await
        .unwrap();
    single
        .register_parquet("parts", &parts, ParquetReadOptions::default())
        .await
        .unwrap();
    for (sql, reference) in [
        (
            "SELECT * FROM parts ORDER BY same",
            "SELECT * FROM parts ORDER BY same, id",
        ),
        (
            "SELECT * FROM parts ORDER BY zipf",
            "SELECT * FROM parts ORDER BY zipf, id",
        ),
        (
            "SELECT * FROM tiny ORDER BY zipf DESC",
            "SELECT * FROM tiny ORDER BY zipf DESC, id",
        ),
        (
            "SELECT * FROM t WHERE f < 0 ORDER BY s",
            "SELECT * FROM t WHERE f < 0 ORDER BY s, id",
        ),
    ] {
        let got = collect(&distributed, sql).await;
        let want = collect(&single, reference).await;
        assert_same(sql, &got, &want);
    }

    // A LIMIT is not a full sort: datafusion-distributed plans it, with the same rows.
    let got = collect(&distributed, "SELECT id FROM t ORDER BY f, id LIMIT 5").await;
    let want = collect(&single, "SELECT id FROM t ORDER BY f, id LIMIT 5").await;
    assert_eq!(got.column(0).to_data(), want.column(0).to_data());
}

/// The rows each range got travel back from the workers, counted as they were routed: for a
/// key of distinct values (`id`, in file order) each range holds exactly the ids from its
/// splitter to the next; for skewed keys (`zipf`: its heaviest value alone holds more than a
/// range's share; `same`: one value) the counts agree with the sorted result at every
/// splitter, and the ranges are even because ties split by position.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rows_per_range_reach_the_coordinator() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.parquet");
    write_table(&path);
    let cluster = LoopbackCluster::try_new(3).await.unwrap();
    let ctx = cluster.context(SessionConfig::new().with_target_partitions(4), 2);
    ctx.register_parquet("t", path.to_str().unwrap(), ParquetReadOptions::default())
        .await
        .unwrap();
    for key in ["id", "zipf", "same"] {
        let sql = format!("SELECT * FROM t ORDER BY {key}");
        let (batches, metrics) = collect_with_metrics(ctx.sql(&sql).await.unwrap()).await.unwrap();
        let m = metrics.unwrap_or_else(|| panic!("{sql}: no range sort"));
        let got = concat_batches(&batches[0].schema(), &batches).unwrap();
        let sorted = got
            .column_by_name(key)
            .unwrap()
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        println!(
            "{sql}: rows per range {:?}, largest / mean {:.3}",
            m.range_rows,
            m.imbalance()
        );
        assert_eq!(m.range_rows.len(), 6, "{sql}");
        assert_eq!(m.rows(), ROWS, "{sql}: {:?}", m.range_rows);
        let bounds = m.splitters.keys()[0].as_any().downcast_ref::<Int64Array>().unwrap();
        let mut before = 0;
        for (r, rows) in m.range_rows.iter().enumerate().take(5) {
            before += rows;
            // Rows before splitter r: all keys below its key, some keys equal to it.
            let k = bounds.value(r);
            let below = sorted.values().iter().filter(|&&v| v < k).count();
            let up_to = sorted.values().iter().filter(|&&v| v <= k).count();
            if key == "id" {
                assert_eq!(before, below, "{sql}: range {r} of {:?}", m.range_rows);
            }
            assert!(
                (below..=up_to).contains(&before),
                "{sql}: range {r} of {:?}",
                m.range_rows
            );
        }
        let largest = *m.range_rows.iter().max().unwrap() as f64;
        assert!((m.imbalance() - largest / (ROWS as f64 / 6.0)).abs() < 1e-9);
        assert!(m.imbalance() < 1.3, "{sql}: {:?}", m.range_rows);
        let sorting = m.range_rows.iter().filter(|&&n| n > 0).count();
        assert!(m.gpu_sorts + m.cpu_sorts >= sorting, "{sql}: {m:?}");
    }
    // The heaviest zipf value holds more than 1.3 ranges' share: ranges of whole key values
    // would be uneven past the bound above.
    let heaviest = collect(
        &ctx,
        "SELECT count(*) AS n FROM t GROUP BY zipf ORDER BY n DESC LIMIT 1",
    )
    .await;
    let heaviest = heaviest
        .column(0)
        .as_any()
        .downcast_ref::<Int64Array>()
        .unwrap()
        .value(0);
    assert!(heaviest as f64 > 1.3 * ROWS as f64 / 6.0, "{heaviest}");
}

/// The nodes one by one: the codec's round trips and the route values (here rather than in
/// the library's own test binary: each test binary links DataFusion).
mod nodes {
    use std::sync::Arc;

    use arrow::array::{Array, Int64Array, RecordBatch, StringArray, UInt64Array};
    use arrow::compute::SortOptions;
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::common::config::ExtensionOptions;
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::datasource::source::DataSourceExec;
    use datafusion::physical_expr::expressions::col;
    use datafusion::physical_expr::{LexOrdering, Partitioning, PhysicalSortExpr};
    use datafusion::physical_plan::metrics::Time;
    use datafusion::physical_plan::repartition::BatchPartitioner;
    use datafusion::physical_plan::{ExecutionPlan, displayable};
    use datafusion::prelude::SessionContext;
    use datafusion_gpusort::{GpuSortConfig, GpuSortExec};
    use datafusion_proto::bytes::{
        physical_plan_from_bytes_with_extension_codec, physical_plan_to_bytes_with_extension_codec,
    };
    use gpusort::partition::Splitters;
    use gpusort_distributed::{
        GpuSortCodec, OrderedConcatExec, RangeRouteExec, RowPositionExec, SampleExec, route_values, thin_to_uniform,
    };

    fn roundtrip(plan: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
        let bytes = physical_plan_to_bytes_with_extension_codec(Arc::clone(&plan), &GpuSortCodec).unwrap();
        let ctx = SessionContext::new();
        let back = physical_plan_from_bytes_with_extension_codec(&bytes, &ctx.task_ctx(), &GpuSortCodec).unwrap();
        assert_eq!(
            displayable(plan.as_ref()).indent(true).to_string(),
            displayable(back.as_ref()).indent(true).to_string()
        );
        back
    }

    fn source() -> Arc<dyn ExecutionPlan> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, true),
            Field::new("s", DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from(vec![Some(3), None, Some(1)])),
                Arc::new(StringArray::from(vec!["x", "y", "z"])),
            ],
        )
        .unwrap();
        let config = MemorySourceConfig::try_new(&[vec![batch]], schema, None).unwrap();
        DataSourceExec::from_data_source(config)
    }

    fn sort_exprs(input: &Arc<dyn ExecutionPlan>) -> Vec<PhysicalSortExpr> {
        let schema = input.schema();
        vec![
            PhysicalSortExpr::new(
                col("a", &schema).unwrap(),
                SortOptions {
                    descending: true,
                    nulls_first: false,
                },
            ),
            PhysicalSortExpr::new_default(col("s", &schema).unwrap()),
        ]
    }

    #[test]
    fn gpu_sort_exec_travels_with_its_options() {
        let input = source();
        let mut options = GpuSortConfig::default();
        options.set("device", "cpu").unwrap();
        options.set("strategy", "grs-direct").unwrap();
        options.set("min_rows", "7").unwrap();
        options.set("gpu_memory_limit", "64MiB").unwrap();
        let sort = GpuSortExec::try_new(LexOrdering::new(sort_exprs(&input)).unwrap(), input)
            .unwrap()
            .with_preserve_partitioning(true)
            .unwrap()
            .with_fetch(Some(5))
            .with_options(options.clone());
        let back = roundtrip(Arc::new(sort));
        let back = back.downcast_ref::<GpuSortExec>().unwrap();
        assert_eq!(back.fetch(), Some(5));
        assert!(back.preserve_partitioning());
        let entries = |c: &GpuSortConfig| -> Vec<(String, Option<String>)> {
            c.entries().into_iter().map(|e| (e.key, e.value)).collect()
        };
        assert_eq!(entries(back.options()), entries(&options));
    }

    #[test]
    fn range_sort_nodes_travel() {
        let input: Arc<dyn ExecutionPlan> = Arc::new(RowPositionExec::new(source()));
        let keys = sort_exprs(&input);
        let sample = Arc::new(SampleExec::try_new(Arc::clone(&input), keys.clone(), 2, 50).unwrap());
        let back = roundtrip(sample);
        assert_eq!(back.downcast_ref::<SampleExec>().unwrap().capacity(), 50);

        let splitters = Splitters::try_new(
            vec![
                Arc::new(Int64Array::from(vec![Some(5), Some(2)])),
                Arc::new(StringArray::from(vec![Some("b"), None])),
            ],
            vec![9, 4],
            keys.iter().map(|k| k.options).collect(),
        )
        .unwrap();
        let route = Arc::new(RangeRouteExec::new(
            Arc::clone(&input),
            keys.clone(),
            2,
            Arc::new(splitters),
        ));
        let back = roundtrip(route);
        let back = back.downcast_ref::<RangeRouteExec>().unwrap();
        assert_eq!(back.splitters().positions(), &[9, 4]);
        assert!(back.splitters().options()[0].descending);
        assert_eq!(back.splitters().keys()[1].null_count(), 1);

        let concat = Arc::new(OrderedConcatExec::new(input, LexOrdering::new(keys).unwrap()));
        roundtrip(concat);
    }

    #[test]
    fn values_land_in_their_partitions() {
        for partitions in [1usize, 2, 3, 7, 12, 64] {
            let values = route_values(partitions).unwrap();
            let schema = Arc::new(Schema::new(vec![Field::new("r", DataType::UInt64, false)]));
            let batch =
                RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(UInt64Array::from(values.clone()))]).unwrap();
            let mut partitioner = BatchPartitioner::try_new(
                Partitioning::Hash(vec![col("r", &schema).unwrap()], partitions),
                Time::new(),
                0,
                1,
            )
            .unwrap();
            partitioner
                .partition(batch, |p, b| {
                    let got = b.column(0).as_any().downcast_ref::<UInt64Array>().unwrap();
                    assert!(got.values().iter().all(|v| *v == values[p]), "{partitions}: {p}");
                    Ok(())
                })
                .unwrap();
        }
    }

    #[test]
    fn samples_weigh_by_the_rows_their_partition_saw() {
        // Partition A saw 10,000 rows and kept 200 (each stands for 50 rows); B saw 200 and kept
        // them all (each stands for 1): all of A's stay, about 1 in 50 of B's.
        let n = 400u64;
        let schema = Arc::new(Schema::new(vec![
            Field::new("k0", DataType::Int64, true),
            Field::new("position", DataType::UInt64, false),
            Field::new("seen", DataType::UInt64, false),
        ]));
        let seen = (0..n).map(|i| if i < 200 { 10_000 } else { 200 });
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values((0..n).map(|i| i as i64))),
                Arc::new(UInt64Array::from_iter_values(0..n)),
                Arc::new(UInt64Array::from_iter_values(seen)),
            ],
        )
        .unwrap();
        let thinned = thin_to_uniform(&batch, 200).unwrap();
        assert_eq!(thinned.num_columns(), 2);
        let positions = thinned.column(1).as_any().downcast_ref::<UInt64Array>().unwrap();
        let from_a = positions.values().iter().filter(|&&p| p < 200).count();
        let from_b = positions.len() - from_a;
        assert_eq!(from_a, 200);
        assert!(from_b <= 12, "{from_b} of B's 200 rows kept, about 4 expected");
        // Partitions that kept all they saw, or as much as they saw: nothing to thin.
        let even = batch.slice(200, 200);
        assert_eq!(thin_to_uniform(&even, 200).unwrap().num_rows(), 200);
    }
}

/// `COPY (SELECT ... ORDER BY ...) TO 'x.parquet'` through the cluster's context: written by
/// `GpuParquetSink`, the file holds the rows of the single-node sort in its order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn copy_to_parquet_through_the_cluster_writes_the_sorted_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.parquet");
    write_table(&path);
    let cluster = LoopbackCluster::try_new(2).await.unwrap();
    let distributed = cluster.context(SessionConfig::new().with_target_partitions(4), 2);
    let input = path.to_str().unwrap();
    distributed
        .register_parquet("t", input, ParquetReadOptions::default())
        .await
        .unwrap();
    let out = dir.path().join("out.parquet");
    let copy = format!(
        "COPY (SELECT * FROM t ORDER BY zipf DESC, f, id) TO '{}' STORED AS PARQUET",
        out.display()
    );
    // The sink stays in the coordinator's plan (this planner leaves a COPY's sort there too,
    // with DataFusion's sink as with gpusort's).
    let plan = distributed
        .sql(&copy)
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap();
    let plan = displayable(plan.as_ref()).indent(true).to_string();
    assert!(
        plan.contains("GpuParquetSink") && plan.contains("GpuSortExec"),
        "{plan}"
    );
    let written = collect(&distributed, &copy).await;
    assert_eq!(
        arrow::util::display::array_value_to_string(written.column(0), 0).unwrap(),
        ROWS.to_string()
    );
    let single = SessionContext::new();
    single
        .register_parquet("t", input, ParquetReadOptions::default())
        .await
        .unwrap();
    single
        .register_parquet("out", out.to_str().unwrap(), ParquetReadOptions::default())
        .await
        .unwrap();
    let want = collect(&single, "SELECT * FROM t ORDER BY zipf DESC, f, id").await;
    let got = collect(&single, "SELECT * FROM out").await;
    assert_same(&copy, &got, &want);
}
