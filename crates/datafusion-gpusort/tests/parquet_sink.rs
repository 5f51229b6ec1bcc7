//! `GpuParquetSink` through SQL (the CPU path): `COPY (SELECT ... ORDER BY ...) TO
//! 'out.parquet'` writes with gpusort's writer where DataFusion's sink would, the files read
//! back row for row as stock DataFusion's, with the statement's options honored; the options
//! gpusort's writer does not follow keep DataFusion's sink.

use std::path::Path;
use std::sync::Arc;

use arrow::array::{Array, Date32Array, Decimal128Array, Int32Array, Int64Array, RecordBatch, StringViewArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::util::pretty::pretty_format_batches;
use datafusion::datasource::MemTable;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::memory_pool::{FairSpillPool, MemoryPool};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use datafusion::parquet::basic::Compression;
use datafusion::parquet::file::metadata::ParquetMetaData;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpusort::SessionStateBuilderExt;

/// `rows` rows shaped like TPC-H lineitem's columns (int64 key, int32, decimal(15,2), date,
/// strings as views, short and long), with nulls, in `partitions` partitions.
fn lineitem_like(rows: usize, partitions: usize) -> MemTable {
    let schema = Arc::new(Schema::new(vec![
        Field::new("orderkey", DataType::Int64, false),
        Field::new("linenumber", DataType::Int32, false),
        Field::new("price", DataType::Decimal128(15, 2), true),
        Field::new("shipdate", DataType::Date32, true),
        Field::new("flag", DataType::Utf8View, true),
        Field::new("comment", DataType::Utf8View, true),
    ]));
    let per = rows.div_ceil(partitions);
    let parts = (0..partitions)
        .map(|p| {
            let range = (p * per).min(rows)..((p + 1) * per).min(rows);
            let key = |i: usize| (i * 7919 % rows) as i64;
            let columns: Vec<Arc<dyn Array>> = vec![
                Arc::new(Int64Array::from_iter_values(range.clone().map(|i| key(i) / 4))),
                Arc::new(Int32Array::from_iter_values(range.clone().map(|i| (key(i) % 4) as i32))),
                Arc::new(
                    range
                        .clone()
                        .map(|i| (i % 17 != 3).then_some((i * 104_729 % 1_000_000) as i128))
                        .collect::<Decimal128Array>()
                        .with_precision_and_scale(15, 2)
                        .unwrap(),
                ),
                Arc::new(Date32Array::from_iter(
                    range
                        .clone()
                        .map(|i| (i % 13 != 1).then_some(8000 + (i * 31 % 2500) as i32)),
                )),
                Arc::new(StringViewArray::from_iter(
                    range
                        .clone()
                        .map(|i| (i % 19 != 7).then(|| ["A", "N", "R"][i % 3].to_string())),
                )),
                Arc::new(StringViewArray::from_iter(range.map(|i| {
                    (i % 23 != 11).then(|| format!("comment {} of a longer text {}", i * 37 % 101, "x".repeat(i % 9)))
                }))),
            ];
            vec![RecordBatch::try_new(Arc::clone(&schema), columns).unwrap()]
        })
        .collect();
    MemTable::try_new(schema, parts).unwrap()
}

/// A session (gpusort on or off) with table `t`, and its memory pool.
fn session(gpusort: bool, pool: Option<Arc<dyn MemoryPool>>) -> SessionContext {
    let config = SessionConfig::new().with_target_partitions(3).with_batch_size(512);
    let mut builder = SessionStateBuilder::new().with_config(config).with_default_features();
    if let Some(pool) = pool {
        let runtime = RuntimeEnvBuilder::new().with_memory_pool(pool).build_arc().unwrap();
        builder = builder.with_runtime_env(runtime);
    }
    if gpusort {
        builder = builder.with_gpusort();
    }
    let ctx = SessionContext::new_with_state(builder.build());
    ctx.register_table("t", Arc::new(lineitem_like(6000, 3))).unwrap();
    ctx
}

async fn run(ctx: &SessionContext, sql: &str) -> Vec<RecordBatch> {
    ctx.sql(sql).await.unwrap().collect().await.unwrap()
}

async fn explain(ctx: &SessionContext, sql: &str) -> String {
    pretty_format_batches(&run(ctx, &format!("EXPLAIN {sql}")).await)
        .unwrap()
        .to_string()
}

/// The rows of the Parquet file at `path`, in file order, and its metadata.
fn read(path: &Path) -> (String, Arc<ParquetMetaData>) {
    let reader = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(path).unwrap()).unwrap();
    let meta = Arc::clone(reader.metadata());
    let batches: Vec<RecordBatch> = reader.build().unwrap().collect::<Result<_, _>>().unwrap();
    (pretty_format_batches(&batches).unwrap().to_string(), meta)
}

/// ORDER BY lists that order the rows totally (orderkey, linenumber is unique).
const ORDERS: &[&str] = &[
    "shipdate, orderkey, linenumber",
    "flag NULLS FIRST, price DESC, orderkey, linenumber",
    "comment DESC, orderkey, linenumber",
];

#[tokio::test]
async fn copy_writes_the_rows_stock_datafusion_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (stock, ours) = (session(false, None), session(true, None));
    for (i, order) in ORDERS.iter().enumerate() {
        let query = format!("SELECT * FROM t ORDER BY {order}");
        let path = |who: &str| dir.path().join(format!("{who}{i}.parquet"));
        let copy = |who: &str| format!("COPY ({query}) TO '{}' STORED AS PARQUET", path(who).display());
        let p = explain(&ours, &copy("ours")).await;
        assert!(
            p.contains("GpuParquetSink") && p.contains("GpuSortExec") && !p.contains("ParquetSink(file_groups"),
            "{p}"
        );
        let written = run(&ours, &copy("ours")).await;
        assert_eq!(
            arrow::util::display::array_value_to_string(written[0].column(0), 0).unwrap(),
            "6000"
        );
        run(&stock, &copy("stock")).await;
        let (expected, stock_meta) = read(&path("stock"));
        let (actual, meta) = read(&path("ours"));
        assert_eq!(actual, expected, "COPY ... ORDER BY {order}");
        // DataFusion's defaults: zstd(3) and its writer's name; the schema as DataFusion's.
        assert_eq!(
            meta.row_group(0).column(0).compression(),
            stock_meta.row_group(0).column(0).compression()
        );
        assert!(matches!(
            meta.row_group(0).column(0).compression(),
            Compression::ZSTD(_)
        ));
        assert_eq!(
            meta.file_metadata().created_by(),
            stock_meta.file_metadata().created_by()
        );
        assert_eq!(
            meta.file_metadata().schema_descr().root_schema(),
            stock_meta.file_metadata().schema_descr().root_schema()
        );
        // The sort is recorded: every key a column, in each row group.
        let sorting = meta.row_group(0).sorting_columns().expect("sorting_columns");
        assert_eq!(sorting.len(), order.split(',').count(), "{order}");
        let kv = meta.file_metadata().key_value_metadata().unwrap();
        assert!(kv.iter().any(|e| e.key == "gpusort.order_by"), "{kv:?}");
        assert!(kv.iter().any(|e| e.key == "ARROW:schema"), "{kv:?}");
    }
}

#[tokio::test]
async fn the_statements_options_are_honored() {
    let dir = tempfile::tempdir().unwrap();
    let ours = session(true, None);
    let path = dir.path().join("snappy.parquet");
    let copy = format!(
        "COPY (SELECT orderkey, linenumber, comment FROM t ORDER BY comment, orderkey, linenumber) TO '{}' \
         STORED AS PARQUET OPTIONS ('format.compression' 'snappy', 'format.max_row_group_size' '1000', \
         'format.statistics_enabled' 'chunk')",
        path.display()
    );
    assert!(explain(&ours, &copy).await.contains("GpuParquetSink"));
    run(&ours, &copy).await;
    let (_, meta) = read(&path);
    let sizes: Vec<i64> = meta.row_groups().iter().map(|g| g.num_rows()).collect();
    assert_eq!(sizes, [1000; 6]);
    assert_eq!(meta.row_group(0).column(2).compression(), Compression::SNAPPY);
    // Statistics by chunk: the chunks have them, no page has a column index entry.
    assert!(meta.row_group(0).column(0).statistics().is_some());
    assert!(meta.row_group(0).column(0).column_index_offset().is_none());

    // Uncompressed, through a projection and a filter above the sort.
    let path = dir.path().join("plain.parquet");
    let copy = format!(
        "COPY (SELECT orderkey * 2 AS k2, comment FROM t WHERE linenumber > 0 ORDER BY comment DESC, k2) TO '{}' \
         STORED AS PARQUET OPTIONS ('format.compression' 'uncompressed')",
        path.display()
    );
    let p = explain(&ours, &copy).await;
    assert!(p.contains("GpuParquetSink"), "{p}");
    run(&ours, &copy).await;
    let (actual, meta) = read(&path);
    assert_eq!(meta.row_group(0).column(0).compression(), Compression::UNCOMPRESSED);
    let stock = session(false, None);
    let expected_path = dir.path().join("plain-stock.parquet");
    run(
        &stock,
        &copy.replace(path.to_str().unwrap(), expected_path.to_str().unwrap()),
    )
    .await;
    assert_eq!(actual, read(&expected_path).0);
}

#[tokio::test]
async fn other_outputs_keep_datafusions_sink() {
    let dir = tempfile::tempdir().unwrap();
    let ours = session(true, None);
    let out = dir.path().display().to_string();
    for (copy, why) in [
        (
            format!("COPY (SELECT * FROM t) TO '{out}/a.parquet' STORED AS PARQUET"),
            "no sort",
        ),
        (
            format!("COPY (SELECT * FROM t ORDER BY orderkey) TO '{out}/p/' STORED AS PARQUET PARTITIONED BY (flag)"),
            "partitioned",
        ),
        (
            format!(
                "COPY (SELECT * FROM t ORDER BY orderkey) TO '{out}/c.parquet' STORED AS PARQUET \
                 OPTIONS ('format.compression::comment' 'snappy')"
            ),
            "a column's codec",
        ),
        (
            format!("COPY (SELECT * FROM t ORDER BY orderkey) TO '{out}/d.csv' STORED AS CSV"),
            "csv",
        ),
    ] {
        let p = explain(&ours, &copy).await;
        assert!(!p.contains("GpuParquetSink"), "{why}: {p}");
    }
    ours.sql("SET gpusort.parquet_sink = false").await.unwrap();
    let copy = format!("COPY (SELECT * FROM t ORDER BY orderkey) TO '{out}/e.parquet' STORED AS PARQUET");
    let p = explain(&ours, &copy).await;
    assert!(p.contains("ParquetSink") && !p.contains("GpuParquetSink"), "{p}");
}

#[tokio::test]
async fn a_bounded_pool_is_respected_and_returned() {
    let dir = tempfile::tempdir().unwrap();
    let pool: Arc<dyn MemoryPool> = Arc::new(FairSpillPool::new(64 << 20));
    let ours = session(true, Some(Arc::clone(&pool)));
    let path = dir.path().join("bounded.parquet");
    let copy = format!(
        "COPY (SELECT * FROM t ORDER BY price, orderkey, linenumber) TO '{}' STORED AS PARQUET",
        path.display()
    );
    assert!(explain(&ours, &copy).await.contains("GpuParquetSink"));
    run(&ours, &copy).await;
    assert_eq!(pool.reserved(), 0);
    // EXPLAIN ANALYZE shows what the sink wrote.
    std::fs::remove_file(&path).unwrap();
    let analyzed = pretty_format_batches(&run(&ours, &format!("EXPLAIN ANALYZE {copy}")).await)
        .unwrap()
        .to_string();
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(
        analyzed.contains("rows_written=6.00 K") && analyzed.contains("bytes_written="),
        "{analyzed}"
    );
    assert!(size > 1000, "{size}");
    assert_eq!(pool.reserved(), 0);
    let stock = session(false, None);
    let expected = dir.path().join("bounded-stock.parquet");
    run(
        &stock,
        &copy.replace(path.to_str().unwrap(), expected.to_str().unwrap()),
    )
    .await;
    assert_eq!(read(&path).0, read(&expected).0);
}

#[tokio::test]
async fn insert_into_a_parquet_table_writes_through_the_sink() {
    let dir = tempfile::tempdir().unwrap();
    let (stock, ours) = (session(false, None), session(true, None));
    for (ctx, who) in [(&stock, "stock"), (&ours, "ours")] {
        let location = dir.path().join(who);
        std::fs::create_dir_all(&location).unwrap();
        ctx.sql(&format!(
            "CREATE EXTERNAL TABLE out (orderkey BIGINT NOT NULL, linenumber INT NOT NULL, comment VARCHAR) \
             STORED AS PARQUET LOCATION '{}/'",
            location.display()
        ))
        .await
        .unwrap();
    }
    let insert =
        "INSERT INTO out SELECT orderkey, linenumber, comment FROM t ORDER BY comment DESC, orderkey, linenumber";
    let p = explain(&ours, insert).await;
    assert!(p.contains("GpuParquetSink") && p.contains("GpuSortExec"), "{p}");
    for ctx in [&stock, &ours] {
        run(ctx, insert).await;
    }
    // DataFusion's demuxer deals the sorted batches round robin into several files
    // (`minimum_parallel_output_files`): each file holds a sorted part of the rows.
    let order = "comment DESC NULLS FIRST, orderkey, linenumber";
    let mut rows_written = 0;
    for path in std::fs::read_dir(dir.path().join("ours")).unwrap() {
        let path = path.unwrap().path();
        let (in_file_order, meta) = read(&path);
        assert_eq!(
            meta.row_group(0).sorting_columns().map(|s| s.len()),
            Some(3),
            "{path:?}"
        );
        rows_written += meta.file_metadata().num_rows();
        let file = SessionContext::new().enable_url_table();
        let sorted = run(&file, &format!("SELECT * FROM '{}' ORDER BY {order}", path.display())).await;
        assert_eq!(
            in_file_order,
            pretty_format_batches(&sorted).unwrap().to_string(),
            "{path:?}"
        );
    }
    assert_eq!(rows_written, 6000);
    // The tables hold the same rows.
    let all = format!("SELECT * FROM out ORDER BY {order}");
    let (actual, expected) = (run(&ours, &all).await, run(&stock, &all).await);
    assert_eq!(
        pretty_format_batches(&actual).unwrap().to_string(),
        pretty_format_batches(&expected).unwrap().to_string()
    );
}

#[tokio::test]
async fn a_failed_copy_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let ours = session(true, None);
    // The division fails above the sort, as its output streams out.
    let path = dir.path().join("failed.parquet");
    let copy = format!(
        "COPY (SELECT orderkey, 10 / (linenumber - linenumber) AS boom FROM t ORDER BY orderkey, linenumber) \
         TO '{}' STORED AS PARQUET",
        path.display()
    );
    assert!(explain(&ours, &copy).await.contains("GpuParquetSink"));
    let err = ours.sql(&copy).await.unwrap().collect().await.unwrap_err().to_string();
    assert!(err.contains("Divide by zero"), "{err}");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test]
async fn an_empty_result_writes_a_file_of_no_rows() {
    let dir = tempfile::tempdir().unwrap();
    let (stock, ours) = (session(false, None), session(true, None));
    let copy = |who: &str| {
        format!(
            "COPY (SELECT * FROM t WHERE orderkey < 0 ORDER BY comment, orderkey) TO '{}' STORED AS PARQUET",
            dir.path().join(format!("{who}.parquet")).display()
        )
    };
    assert!(explain(&ours, &copy("ours")).await.contains("GpuParquetSink"));
    run(&ours, &copy("ours")).await;
    run(&stock, &copy("stock")).await;
    let (actual, meta) = read(&dir.path().join("ours.parquet"));
    let (expected, stock_meta) = read(&dir.path().join("stock.parquet"));
    assert_eq!(meta.file_metadata().num_rows(), 0);
    assert_eq!(actual, expected);
    assert_eq!(
        meta.file_metadata().schema_descr().root_schema(),
        stock_meta.file_metadata().schema_descr().root_schema()
    );
}
