//! The `gpusort` command-line tool: sorts Parquet files by an ORDER BY list. Arguments and
//! progress only; the sorting is `datafusion-gpusort`'s.
//!
//! Not built yet: it only says so.

fn main() {
    eprintln!("gpusort: the command-line tool is not built yet; see `cargo run --release --example sort_parquet`");
    std::process::exit(2);
}
