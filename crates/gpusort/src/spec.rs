//! What to sort by: the sort specification.

use arrow::array::RecordBatch;
use arrow::compute::SortColumn;
pub use arrow::compute::SortOptions;
use arrow::datatypes::Schema;

use crate::error::{GpusortError, Result};

/// One sort key: a column of the input and its direction and null placement.
///
/// `options` is Arrow's [`SortOptions`]: `descending` and `nulls_first`. Note that SQL's
/// default differs from Arrow's: `ORDER BY x` is `NULLS LAST` and `ORDER BY x DESC` is
/// `NULLS FIRST`; [`SortKey::sql`] builds keys with the SQL defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SortKey {
    /// Index of the column in the input.
    pub column: usize,
    /// Direction and null placement.
    pub options: SortOptions,
}

impl SortKey {
    /// A key with explicit options.
    pub fn new(column: usize, descending: bool, nulls_first: bool) -> Self {
        Self {
            column,
            options: SortOptions {
                descending,
                nulls_first,
            },
        }
    }

    /// A key with SQL's default null placement: NULLS LAST for ASC, NULLS FIRST for DESC.
    pub fn sql(column: usize, descending: bool) -> Self {
        Self::new(column, descending, descending)
    }
}

/// An ordered list of sort keys: `ORDER BY k0, k1, ...`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct SortSpec {
    keys: Vec<SortKey>,
}

impl SortSpec {
    /// A specification from its keys, most significant first.
    pub fn new(keys: impl IntoIterator<Item = SortKey>) -> Self {
        Self {
            keys: keys.into_iter().collect(),
        }
    }

    /// A specification from column names and options, resolved against `schema`.
    pub fn try_from_names<'a>(schema: &Schema, keys: impl IntoIterator<Item = (&'a str, SortOptions)>) -> Result<Self> {
        let keys = keys
            .into_iter()
            .enumerate()
            .map(|(key, (name, options))| {
                let column = schema.index_of(name).map_err(|_| GpusortError::NoSuchColumn {
                    key,
                    column: name.to_string(),
                    num_columns: schema.fields().len(),
                })?;
                Ok(SortKey { column, options })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { keys })
    }

    /// The keys, most significant first.
    pub fn keys(&self) -> &[SortKey] {
        &self.keys
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// True when there is no key (every order is sorted).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Arrow's sort columns for these keys over `batch` (what `lexsort_to_indices` and
    /// `LexicographicalComparator` take).
    pub fn to_sort_columns(&self, batch: &RecordBatch) -> Vec<SortColumn> {
        self.keys
            .iter()
            .map(|k| SortColumn {
                values: batch.column(k.column).clone(),
                options: Some(k.options),
            })
            .collect()
    }

    /// Checks that every key refers to one of `num_columns` columns.
    pub fn validate(&self, num_columns: usize) -> Result<()> {
        for (key, k) in self.keys.iter().enumerate() {
            if k.column >= num_columns {
                return Err(GpusortError::NoSuchColumn {
                    key,
                    column: format!("#{}", k.column),
                    num_columns,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::{DataType, Field};

    #[test]
    fn names_resolve_and_unknown_names_fail() {
        let schema = Schema::new(vec![
            Field::new("a", DataType::Int32, true),
            Field::new("b", DataType::Utf8, true),
        ]);
        let opts = SortOptions::default();
        let spec = SortSpec::try_from_names(&schema, [("b", opts), ("a", opts)]).unwrap();
        assert_eq!(spec.keys()[0].column, 1);
        assert_eq!(spec.keys()[1].column, 0);
        let err = SortSpec::try_from_names(&schema, [("a", opts), ("zz", opts)]).unwrap_err();
        assert!(err.to_string().contains("zz"), "{err}");
        assert!(SortSpec::new([SortKey::sql(2, false)]).validate(2).is_err());
        assert!(SortSpec::new([SortKey::sql(1, false)]).validate(2).is_ok());
    }

    #[test]
    fn sql_defaults() {
        assert!(!SortKey::sql(0, false).options.nulls_first);
        assert!(SortKey::sql(0, true).options.nulls_first);
    }
}
