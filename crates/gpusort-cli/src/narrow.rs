//! Decimals read at the width they are stored in.
//!
//! Parquet stores a decimal of up to 18 digits as 8-byte integers (INT64, as the Parquet crate,
//! DuckDB and Spark write them), and DataFusion reads it as Arrow's 16-byte `Decimal128`: the
//! Parquet reader widens every value in a pass of its own into fresh memory. The tool reads
//! those columns as `Decimal64` instead, which the Parquet reader takes as the integers are.
//! Each such column then carries 8 bytes less a row through the reading, the sort (staging,
//! PCIe both ways, the device's gathers) and the writer, which writes them back as the same
//! Parquet integers under the inputs' `Decimal128` type (`gpusort-parquet`'s encoder takes
//! both; the Parquet crate's encoder gets them widened). On TPC-H lineitem that is 4 columns of
//! 16, 32 bytes of the 184 a row that the GPU sort stages.
//!
//! How: the listing table's schema names `Decimal64` for the columns that every input stores
//! as INT64, and each file of the scan carries its own Arrow schema with those columns
//! narrowed (DataFusion gives a file's schema to the Parquet reader as its hint). A file that
//! carries none would be read wide and cast by DataFusion: slower, the same values.
//! `GPUSORT_DECIMAL64=0` reads them as `Decimal128`.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::datasource::physical_plan::FileScanConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::physical_plan::ExecutionPlan;

use crate::error::{CliError, Result};
use crate::inputs::Inputs;

/// The environment variable that turns the narrowing off (`0`) or on (`1`, the default).
pub const DECIMAL64_VAR: &str = "GPUSORT_DECIMAL64";

/// The decimal columns a sort reads as `Decimal64`, and each input file's schema with them
/// narrowed, by the path a scan names the file by.
#[derive(Debug, Clone, Default)]
pub struct NarrowDecimals {
    columns: Vec<String>,
    files: HashMap<String, SchemaRef>,
}

impl NarrowDecimals {
    /// The columns of `inputs` that every file stores as INT64 decimals (none when
    /// [`DECIMAL64_VAR`] is `0`); `location` gives the path a scan names a file by.
    pub fn try_new(inputs: &Inputs, location: impl Fn(&std::path::Path) -> Result<String>) -> Result<Self> {
        if !enabled(std::env::var(DECIMAL64_VAR).ok().as_deref())? {
            return Ok(Self::default());
        }
        let columns: Vec<String> = match inputs.files.split_first() {
            None => vec![],
            Some((first, rest)) => (first.int64_decimals.iter())
                .filter(|c| rest.iter().all(|f| f.int64_decimals.contains(c)))
                .cloned()
                .collect(),
        };
        if columns.is_empty() {
            return Ok(Self::default());
        }
        let files = (inputs.files.iter())
            .map(|f| Ok((location(&f.path)?, Arc::new(narrowed(&f.schema, &columns)))))
            .collect::<Result<_>>()?;
        Ok(Self { columns, files })
    }

    /// Whether any column is narrowed.
    pub fn is_empty(&self) -> bool {
        self.columns.is_empty()
    }

    /// `schema` with the narrowed columns as `Decimal64`.
    pub fn table_schema(&self, schema: &Schema) -> SchemaRef {
        Arc::new(narrowed(schema, &self.columns))
    }

    /// `plan` with every file of its Parquet scans carrying its narrowed schema.
    pub fn with_file_schemas(&self, plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
        if self.is_empty() {
            return Ok(plan);
        }
        let hinted = plan.transform_up(|node| {
            let Some(scan) = node.downcast_ref::<DataSourceExec>() else {
                return Ok(Transformed::no(node));
            };
            let Some(config) = scan.data_source().downcast_ref::<FileScanConfig>() else {
                return Ok(Transformed::no(node));
            };
            let mut config = config.clone();
            for group in &mut config.file_groups {
                for i in 0..group.len() {
                    let file = &mut group[i];
                    file.arrow_schema = self.files.get(file.object_meta.location.as_ref()).cloned();
                }
            }
            let scan = scan.clone().with_data_source(Arc::new(config));
            Ok(Transformed::yes(Arc::new(scan) as Arc<dyn ExecutionPlan>))
        });
        hinted
            .map(|t| t.data)
            .map_err(|e| CliError::Engine(format!("reading decimals as Decimal64: {e}")))
    }
}

/// [`DECIMAL64_VAR`]'s value: on unless it is `0`.
fn enabled(value: Option<&str>) -> Result<bool> {
    match value.map(str::trim) {
        None | Some("1") => Ok(true),
        Some("0") => Ok(false),
        Some(other) => Err(CliError::Usage(format!("{DECIMAL64_VAR}={other}: expected 0 or 1"))),
    }
}

/// Whether a column of `data_type` is read narrow where it is stored as INT64: 16-byte
/// decimals of up to 18 digits.
pub fn narrows(data_type: &DataType) -> bool {
    matches!(data_type, DataType::Decimal128(p, _) if *p <= 18)
}

/// `schema` with the 16-byte decimal columns named in `columns` as 8-byte ones.
fn narrowed(schema: &Schema, columns: &[String]) -> Schema {
    let fields: Vec<Field> = (schema.fields().iter())
        .map(|f| match f.data_type() {
            &DataType::Decimal128(p, s) if narrows(f.data_type()) && columns.contains(f.name()) => {
                f.as_ref().clone().with_data_type(DataType::Decimal64(p, s))
            }
            _ => f.as_ref().clone(),
        })
        .collect();
    Schema::new_with_metadata(fields, schema.metadata().clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_named_decimals_of_up_to_18_digits_narrow() {
        let schema = Schema::new(vec![
            Field::new("a", DataType::Decimal128(15, 2), true),
            Field::new("b", DataType::Decimal128(15, 2), false),
            Field::new("c", DataType::Decimal128(20, 2), false),
            Field::new("d", DataType::Int64, false),
        ]);
        let names = ["a", "c", "d"].map(String::from);
        let n = narrowed(&schema, &names);
        let types: Vec<&DataType> = n.fields().iter().map(|f| f.data_type()).collect();
        assert_eq!(
            types,
            [
                &DataType::Decimal64(15, 2),
                &DataType::Decimal128(15, 2),
                &DataType::Decimal128(20, 2),
                &DataType::Int64
            ]
        );
        assert!(n.field(0).is_nullable() && !n.field(1).is_nullable());
    }

    #[test]
    fn the_variable_takes_0_or_1() {
        assert!(enabled(None).unwrap());
        assert!(enabled(Some(" 1")).unwrap());
        assert!(!enabled(Some("0")).unwrap());
        assert!(enabled(Some("no")).unwrap_err().to_string().contains("expected 0 or 1"));
    }
}
