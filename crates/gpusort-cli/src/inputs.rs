//! The input files: `INPUT...` arguments (files, directories, glob patterns) expanded into
//! Parquet files, each checked before anything runs — that it is Parquet, that its footer is
//! whole, and that all of them have the same columns.

use std::collections::HashSet;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::datatypes::{Schema, SchemaRef};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder};
use parquet::arrow::parquet_to_arrow_schema;
use parquet::basic::Type as PhysicalType;
use parquet::file::metadata::ParquetMetaDataReader;
use parquet::schema::types::SchemaDescriptor;

use crate::error::{CliError, Result};

/// Parquet's magic number, at the start and at the end of every file.
const MAGIC: &[u8; 4] = b"PAR1";

/// One input file, with what its footer says.
#[derive(Debug, Clone)]
pub struct InputFile {
    /// The path as found (relative paths stay relative).
    pub path: PathBuf,
    /// Size in bytes.
    pub bytes: u64,
    /// Rows.
    pub rows: u64,
    /// Row groups.
    pub row_groups: usize,
    /// Its columns as the Parquet reader gives them.
    pub schema: SchemaRef,
    /// Its top-level decimal columns of up to 18 digits stored as 8-byte integers (INT64),
    /// which the reader gives as 16-byte decimals (see `narrow.rs`).
    pub int64_decimals: Vec<String>,
}

/// The checked input files and their common schema.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// The files, in the order the arguments name them (each once).
    pub files: Vec<InputFile>,
    /// The schema of the first file, as the Parquet reader gives it (the others have the same
    /// columns and types).
    pub schema: SchemaRef,
}

impl Inputs {
    /// Expands `args` (files, directories, glob patterns) and checks every file found.
    pub fn try_new(args: &[String]) -> Result<Self> {
        let mut seen = HashSet::new();
        let mut paths = vec![];
        for arg in args {
            for path in expand(arg)? {
                let key = path.canonicalize().unwrap_or_else(|_| path.clone());
                if seen.insert(key) {
                    paths.push(path);
                }
            }
        }
        let mut files = Vec::with_capacity(paths.len());
        let mut first: Option<(PathBuf, SchemaRef)> = None;
        for path in paths {
            let (file, schema) = read_footer(&path)?;
            match &first {
                None => first = Some((path, schema)),
                Some((first_path, first_schema)) => {
                    if let Some(difference) = schema_difference(first_path, first_schema, &path, &schema) {
                        return Err(CliError::SchemaMismatch { difference });
                    }
                }
            }
            files.push(file);
        }
        let (_, schema) = first.ok_or_else(|| CliError::Usage("no input file".into()))?;
        Ok(Self { files, schema })
    }

    /// Rows in all files.
    pub fn rows(&self) -> u64 {
        self.files.iter().map(|f| f.rows).sum()
    }

    /// Bytes of all files.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }

    /// Reads the inputs again to find the first damaged one, after a scan failed with a
    /// Parquet or I/O error that does not say which file it was reading: each row group is
    /// decoded, and in the first that fails each column, so the error names the file, the
    /// row group and the column. `None` when every file reads well (the failure was
    /// something else).
    pub fn find_damage(&self) -> Option<CliError> {
        self.files.iter().find_map(|f| {
            damage_in(&f.path).map(|why| CliError::Damaged {
                path: f.path.clone(),
                why,
            })
        })
    }

    /// "1 file" or "3 files".
    pub fn describe_count(&self) -> String {
        match self.files.len() {
            1 => "1 file".into(),
            n => format!("{n} files"),
        }
    }
}

/// The files one argument names: itself if it is a file, the `.parquet` files under it if it
/// is a directory, the matches if it is a glob pattern.
fn expand(arg: &str) -> Result<Vec<PathBuf>> {
    let path = Path::new(arg);
    if path.is_dir() {
        return parquet_files_under(path);
    }
    if path.exists() {
        return Ok(vec![path.to_path_buf()]);
    }
    if !arg.contains(['*', '?', '[']) {
        return Err(CliError::NotFound(path.to_path_buf()));
    }
    let matches = glob::glob(arg).map_err(|e| CliError::BadPattern {
        pattern: arg.to_string(),
        cause: e.msg.to_string(),
    })?;
    let mut files = vec![];
    for m in matches {
        let m = m.map_err(|e| CliError::io(format!("listing {}", e.path().display()), e.into()))?;
        if m.is_dir() {
            files.extend(parquet_files_under(&m)?);
        } else {
            files.push(m);
        }
    }
    if files.is_empty() {
        return Err(CliError::NoMatch(arg.to_string()));
    }
    Ok(files)
}

/// The `.parquet` files under `dir`, at any depth, in name order; hidden files (`.x`) and
/// Spark's and Hadoop's markers (`_x`) are skipped.
fn parquet_files_under(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = vec![];
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let entries = std::fs::read_dir(&d).map_err(|e| CliError::io(format!("listing {}", d.display()), e))?;
        for entry in entries {
            let entry = entry.map_err(|e| CliError::io(format!("listing {}", d.display()), e))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') || name.starts_with('_') {
                continue;
            }
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if Path::new(&*name)
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("parquet"))
            {
                files.push(path);
            }
        }
    }
    if files.is_empty() {
        return Err(CliError::EmptyDirectory(dir.to_path_buf()));
    }
    files.sort();
    Ok(files)
}

/// Reads and checks the footer of `path`: the magic numbers, the metadata, the schema.
fn read_footer(path: &Path) -> Result<(InputFile, SchemaRef)> {
    let reading = || format!("reading {}", path.display());
    let mut file = File::open(path).map_err(|e| CliError::io(reading(), e))?;
    let bytes = file.metadata().map_err(|e| CliError::io(reading(), e))?.len();
    let not_parquet = |why: &str| CliError::NotParquet {
        path: path.to_path_buf(),
        why: why.to_string(),
    };
    if bytes < 4 {
        return Err(not_parquet(&format!("{bytes} bytes long, too short")));
    }
    let mut head = [0u8; 4];
    file.read_exact(&mut head).map_err(|e| CliError::io(reading(), e))?;
    if &head != MAGIC {
        return Err(not_parquet("it does not start with PAR1"));
    }
    let damaged = |why: String| CliError::Damaged {
        path: path.to_path_buf(),
        why,
    };
    if bytes < 12 {
        return Err(damaged(format!("{bytes} bytes long, too short for a footer")));
    }
    let mut tail = [0u8; 4];
    file.seek(SeekFrom::End(-4)).map_err(|e| CliError::io(reading(), e))?;
    file.read_exact(&mut tail).map_err(|e| CliError::io(reading(), e))?;
    if &tail != MAGIC {
        return Err(damaged("it does not end with PAR1: the footer is missing".into()));
    }
    let metadata = ParquetMetaDataReader::new()
        .parse_and_finish(&file)
        .map_err(|e| damaged(e.to_string()))?;
    let meta = metadata.file_metadata();
    let schema = parquet_to_arrow_schema(meta.schema_descr(), meta.key_value_metadata())
        .map_err(|e| damaged(format!("its schema cannot be read: {e}")))?;
    let int64_decimals = int64_decimals(meta.schema_descr(), &schema);
    let schema = Arc::new(schema);
    let input = InputFile {
        path: path.to_path_buf(),
        bytes,
        rows: meta.num_rows().max(0) as u64,
        row_groups: metadata.num_row_groups(),
        schema: Arc::clone(&schema),
        int64_decimals,
    };
    Ok((input, schema))
}

/// The top-level columns of `schema` (read from `descr`) that are 16-byte decimals of up to 18
/// digits stored as INT64.
fn int64_decimals(descr: &SchemaDescriptor, schema: &Schema) -> Vec<String> {
    descr
        .columns()
        .iter()
        .filter(|c| c.path().parts().len() == 1 && c.physical_type() == PhysicalType::INT64)
        .filter_map(|c| {
            let name = c.path().parts()[0].as_str();
            let field = schema.field_with_name(name).ok()?;
            crate::narrow::narrows(field.data_type()).then(|| name.to_string())
        })
        .collect()
}

/// What is damaged in `path`: `row group R, column C: cause`, or `None`.
fn damage_in(path: &Path) -> Option<String> {
    let clean = |e: &dyn std::fmt::Display| crate::error::one_line(&crate::error::strip_prefixes(&e.to_string()));
    let builder = match File::open(path).map(ParquetRecordBatchReaderBuilder::try_new) {
        Ok(Ok(builder)) => builder,
        Ok(Err(e)) => return Some(clean(&e)),
        Err(e) => return Some(clean(&e)),
    };
    let metadata = Arc::clone(builder.metadata());
    drop(builder);
    let descr = metadata.file_metadata().schema_descr_ptr();
    let read = |row_group: usize, leaf: Option<usize>| -> Result<(), String> {
        let file = File::open(path).map_err(|e| clean(&e))?;
        let options = ArrowReaderOptions::new();
        let meta = ArrowReaderMetadata::try_new(Arc::clone(&metadata), options).map_err(|e| clean(&e))?;
        let mut builder = ParquetRecordBatchReaderBuilder::new_with_metadata(file, meta)
            .with_row_groups(vec![row_group])
            .with_batch_size(64 * 1024);
        if let Some(leaf) = leaf {
            builder = builder.with_projection(ProjectionMask::leaves(&descr, [leaf]));
        }
        for batch in builder.build().map_err(|e| clean(&e))? {
            batch.map_err(|e| clean(&e))?;
        }
        Ok(())
    };
    for row_group in 0..metadata.num_row_groups() {
        let Err(whole) = read(row_group, None) else { continue };
        for leaf in 0..descr.num_columns() {
            if let Err(why) = read(row_group, Some(leaf)) {
                return Some(format!(
                    "row group {row_group}, column {}: {why}",
                    descr.column(leaf).path().string()
                ));
            }
        }
        return Some(format!("row group {row_group}: {whole}"));
    }
    None
}

/// The first difference between two files' schemas (column names and types; nullability,
/// column order and metadata may differ), or `None` when DataFusion can read both as one table.
fn schema_difference(a_path: &Path, a: &Schema, b_path: &Path, b: &Schema) -> Option<String> {
    let (a_name, b_name) = (a_path.display(), b_path.display());
    for field in a.fields() {
        match b.field_with_name(field.name()) {
            Err(_) => return Some(format!("column {} is in {a_name} but not in {b_name}", field.name())),
            Ok(other) if other.data_type() != field.data_type() => {
                return Some(format!(
                    "column {} is {} in {a_name} but {} in {b_name}",
                    field.name(),
                    field.data_type(),
                    other.data_type()
                ));
            }
            Ok(_) => {}
        }
    }
    b.fields()
        .iter()
        .find(|f| a.field_with_name(f.name()).is_err())
        .map(|f| format!("column {} is in {b_name} but not in {a_name}", f.name()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::{DataType, Field};

    #[test]
    fn schema_differences_name_the_column_and_both_files() {
        let a = Schema::new(vec![
            Field::new("x", DataType::Int64, false),
            Field::new("y", DataType::Utf8, true),
        ]);
        let same_reordered = Schema::new(vec![
            Field::new("y", DataType::Utf8, false),
            Field::new("x", DataType::Int64, true),
        ]);
        let (pa, pb) = (Path::new("a.parquet"), Path::new("b.parquet"));
        assert_eq!(schema_difference(pa, &a, pb, &same_reordered), None);
        let retyped = Schema::new(vec![
            Field::new("x", DataType::Int32, false),
            Field::new("y", DataType::Utf8, true),
        ]);
        assert_eq!(
            schema_difference(pa, &a, pb, &retyped).unwrap(),
            "column x is Int64 in a.parquet but Int32 in b.parquet"
        );
        let wider = Schema::new(vec![
            Field::new("x", DataType::Int64, false),
            Field::new("y", DataType::Utf8, true),
            Field::new("z", DataType::Utf8, true),
        ]);
        assert_eq!(
            schema_difference(pa, &a, pb, &wider).unwrap(),
            "column z is in b.parquet but not in a.parquet"
        );
        assert_eq!(
            schema_difference(pb, &wider, pa, &a).unwrap(),
            "column z is in b.parquet but not in a.parquet"
        );
    }
}
