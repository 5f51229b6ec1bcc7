//! SQL over a Parquet file through a DataFusion `SessionContext`, with gpusort
//! (`SessionStateBuilder::with_gpusort`) or stock: the two ways a DataFusion user sorts a file.
//!
//! ```text
//! sql_parquet-<hash> INPUT "ORDER BY LIST" collect|copy [OUTPUT] [--stock]
//! ```
//!
//! `collect` runs `SELECT * FROM 'INPUT' ORDER BY ...` and collects the batches (their rows
//! are counted); `copy` runs `COPY (SELECT * FROM 'INPUT' ORDER BY ...) TO 'OUTPUT'` with
//! DataFusion's Parquet writer (zstd(3)). It prints one line: `sql_parquet <mode> <engine>
//! seconds=S rows=N plan=<the sort operator>[+<the Parquet sink>] writers=W`, for
//! `crates/gpusort-cli/benches/tpch.py`.
//!
//! With `SQL_PARQUET_DEVICE_SCAN=1`, gpusort's session sets `gpusort.device_scan` (the sort
//! reads the file on the GPU where it can; the plan then reads `GpuSortExec(device_scan)`);
//! with `=0` it turns it off. `SQL_PARQUET_TIMELINE=1` prints the timeline to stderr, as
//! `gpusort sort --timeline` does.
//!
//! Both engines' `COPY` encode up to W row groups at once (`datafusion.execution.parquet.
//! maximum_parallel_row_group_writers`, DataFusion's default 1; here the number of cores, or
//! `SQL_PARQUET_WRITERS`), as DataFusion's documentation advises for data already in memory,
//! which a sort's output is: with one, the longest column of each row group sets the pace.

use std::time::Instant;

use datafusion::execution::SessionStateBuilder;
use datafusion::physical_plan::displayable;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpusort::SessionStateBuilderExt;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let stock = args.iter().any(|a| a == "--stock");
    let args: Vec<&String> = args.iter().filter(|a| *a != "--stock").collect();
    let [input, order_by, mode, rest @ ..] = &args[..] else {
        eprintln!("usage: sql_parquet INPUT \"ORDER BY LIST\" collect|copy [OUTPUT] [--stock]");
        std::process::exit(2);
    };
    let writers: usize = match std::env::var("SQL_PARQUET_WRITERS") {
        Ok(v) => v.parse()?,
        Err(_) => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let config = SessionConfig::new()
        .set_str("datafusion.execution.parquet.compression", "zstd(3)")
        .set_usize(
            "datafusion.execution.parquet.maximum_parallel_row_group_writers",
            writers,
        )
        .set_usize(
            "datafusion.execution.parquet.maximum_buffered_record_batches_per_stream",
            (2 * writers).max(2),
        );
    let builder = SessionStateBuilder::new().with_default_features().with_config(config);
    let state = if stock {
        builder.build()
    } else {
        builder.with_gpusort().build()
    };
    // `FROM 'file.parquet'`: tables named by a path or URL, as in datafusion-cli.
    let ctx = SessionContext::new_with_state(state).enable_url_table();
    if std::env::var("SQL_PARQUET_TIMELINE").is_ok_and(|v| v == "1") {
        gpusort_cli::timeline::enable();
    }
    match std::env::var("SQL_PARQUET_DEVICE_SCAN").as_deref() {
        Ok("1") if !stock => ctx.sql("SET gpusort.device_scan = true").await?.collect().await?,
        Ok("0") if !stock => ctx.sql("SET gpusort.device_scan = false").await?.collect().await?,
        _ => vec![],
    };
    let select = format!("SELECT * FROM '{input}' ORDER BY {order_by}");
    let start = Instant::now();
    let (sql, rows) = match mode.as_str() {
        "collect" => (select.clone(), None),
        "copy" => {
            let out = rest.first().ok_or("copy needs an OUTPUT")?;
            (format!("COPY ({select}) TO '{out}' STORED AS PARQUET"), Some(()))
        }
        m => return Err(format!("unknown mode {m}").into()),
    };
    let df = ctx.sql(&sql).await?;
    let plan = df.clone().create_physical_plan().await?;
    let plan_text = displayable(plan.as_ref()).indent(false).to_string();
    let sort = plan_text
        .lines()
        .find(|l| l.contains("SortExec") || l.contains("GpuSortExec"))
        .map(|l| {
            let name = l.trim().split(':').next().unwrap_or("");
            let scan = if l.contains("device_scan=") {
                "(device_scan)"
            } else {
                ""
            };
            format!("{name}{scan}")
        })
        .unwrap_or_default();
    // The sink of a COPY: DataFusion's ParquetSink or gpusort's GpuParquetSink.
    let sink = plan_text
        .lines()
        .find_map(|l| {
            l.contains("ParquetSink")
                .then(|| l.split("sink=").nth(1).unwrap_or(l).trim())
        })
        .map(|s| s.split('(').next().unwrap_or("").to_string());
    let sort = match sink {
        Some(sink) => format!("{sort}+{sink}"),
        None => sort,
    };
    let batches = df.collect().await?;
    let seconds = start.elapsed().as_secs_f64();
    let n: usize = match rows {
        None => batches.iter().map(|b| b.num_rows()).sum(),
        // COPY returns one row: the count written.
        Some(()) => arrow::util::display::array_value_to_string(batches[0].column(0), 0)?.parse()?,
    };
    let engine = if stock { "datafusion" } else { "gpusort" };
    println!("sql_parquet {mode} {engine} seconds={seconds:.3} rows={n} plan={sort} writers={writers}");
    Ok(())
}
