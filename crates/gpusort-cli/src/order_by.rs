//! The `--order-by` list: SQL's `ORDER BY` syntax (`a DESC NULLS LAST, "Mixed Case", b`),
//! parsed by sqlparser and resolved against the inputs' columns.

use arrow::datatypes::Schema;
use datafusion::common::Column;
use datafusion::logical_expr::{Expr, SortExpr};
use datafusion::sql::sqlparser::ast::{Expr as SqlExpr, OrderByExpr};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::{Parser, ParserError};
use datafusion::sql::sqlparser::tokenizer::Token;

use gpusort_parquet::quote;

use crate::error::{CliError, Result};

/// One key of the list: a column of the inputs and its direction (nulls first or last as SQL
/// says: last for `ASC`, first for `DESC`, unless the list says otherwise).
pub use gpusort_parquet::SortKey;

/// A parsed, resolved ORDER BY list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderBy {
    keys: Vec<SortKey>,
}

impl OrderBy {
    /// Parses `list` and resolves its columns in `schema`. Only column names may be sort
    /// keys (they are what Parquet's `sorting_columns` can record); an unquoted name that is
    /// not a column matches one whose name differs only in case. A column named twice keeps
    /// its first place.
    pub fn try_new(list: &str, schema: &Schema) -> Result<Self> {
        let bad = |cause: String| CliError::BadOrderBy {
            list: list.to_string(),
            cause,
        };
        let items = parse(list).map_err(|e| bad(parser_message(&e)))?;
        let mut keys: Vec<SortKey> = Vec::with_capacity(items.len());
        for item in items {
            if item.with_fill.is_some() {
                return Err(bad("WITH FILL is not supported".into()));
            }
            let column = match &item.expr {
                SqlExpr::Identifier(ident) => resolve(&ident.value, ident.quote_style.is_some(), schema)?,
                SqlExpr::CompoundIdentifier(_) => {
                    return Err(bad(format!("{} is a qualified name; name the column alone", item.expr)));
                }
                SqlExpr::Value(_) => {
                    return Err(bad(format!(
                        "{} is not a column name (sorting by position is not supported)",
                        item.expr
                    )));
                }
                other => {
                    return Err(bad(format!("{other} is not a column name; gpusort sorts by columns")));
                }
            };
            let descending = item.options.asc == Some(false);
            let nulls_first = item.options.nulls_first.unwrap_or(descending);
            if keys.iter().all(|k| k.column != column) {
                keys.push(SortKey {
                    column,
                    descending,
                    nulls_first,
                });
            }
        }
        Ok(Self { keys })
    }

    /// The keys, most significant first.
    pub fn keys(&self) -> &[SortKey] {
        &self.keys
    }

    /// The keys as DataFusion sort expressions.
    pub fn sort_exprs(&self) -> Vec<SortExpr> {
        self.keys
            .iter()
            .map(|k| Expr::Column(Column::new_unqualified(&k.column)).sort(!k.descending, k.nulls_first))
            .collect()
    }

    /// The list in full SQL, every direction and null placement spelled out, names quoted
    /// where they need it: `amount DESC NULLS FIRST, "Order Id" ASC NULLS LAST`.
    pub fn to_sql(&self) -> String {
        gpusort_parquet::order_by_sql(&self.keys)
    }
}

/// The list's items, or why it does not parse. The whole text must be the list.
fn parse(list: &str) -> Result<Vec<OrderByExpr>, ParserError> {
    let dialect = GenericDialect {};
    let mut parser = Parser::new(&dialect).try_with_sql(list)?;
    if parser.peek_token().token == Token::EOF {
        return Err(ParserError::ParserError("the list is empty".into()));
    }
    let items = parser.parse_comma_separated(Parser::parse_order_by_expr)?;
    let next = parser.peek_token();
    if next.token != Token::EOF {
        return Err(ParserError::ParserError(format!(
            "expected a comma or the end of the list, found {} at column {}",
            next.token, next.span.start.column
        )));
    }
    Ok(items)
}

/// sqlparser's message without its `sql parser error: ` prefix.
fn parser_message(e: &ParserError) -> String {
    let text = e.to_string();
    text.strip_prefix("sql parser error: ").unwrap_or(&text).to_string()
}

/// The schema's name for `name`: the exact one, else (unquoted names only) the one column
/// whose name equals it ignoring case.
fn resolve(name: &str, quoted: bool, schema: &Schema) -> Result<String> {
    if schema.field_with_name(name).is_ok() {
        return Ok(name.to_string());
    }
    if !quoted {
        let mut matches = schema.fields().iter().filter(|f| f.name().eq_ignore_ascii_case(name));
        if let (Some(only), None) = (matches.next(), matches.next()) {
            return Ok(only.name().clone());
        }
    }
    Err(CliError::UnknownColumn {
        name: if quoted {
            format!("\"{name}\"")
        } else {
            name.to_string()
        },
        available: schema
            .fields()
            .iter()
            .map(|f| quote(f.name()))
            .collect::<Vec<_>>()
            .join(", "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::{DataType, Field};

    fn schema() -> Schema {
        Schema::new(vec![
            Field::new("a", DataType::Int64, true),
            Field::new("b", DataType::Utf8, true),
            Field::new("Mixed Case", DataType::Int32, true),
            Field::new("Total", DataType::Float64, true),
        ])
    }

    fn err(list: &str) -> String {
        OrderBy::try_new(list, &schema()).unwrap_err().one_line()
    }

    #[test]
    fn directions_and_null_placement_follow_sql() {
        let o = OrderBy::try_new(
            "a DESC NULLS LAST, b, \"Mixed Case\" desc, total NULLS FIRST",
            &schema(),
        )
        .unwrap();
        assert_eq!(
            o.to_sql(),
            "a DESC NULLS LAST, b ASC NULLS LAST, \"Mixed Case\" DESC NULLS FIRST, \"Total\" ASC NULLS FIRST"
        );
        let k = &o.keys()[1];
        assert!(!k.descending && !k.nulls_first);
        // A repeated column keeps its first place and direction.
        let o = OrderBy::try_new("b DESC, a, b", &schema()).unwrap();
        assert_eq!(o.to_sql(), "b DESC NULLS FIRST, a ASC NULLS LAST");
        assert_eq!(o.sort_exprs().len(), 2);
    }

    #[test]
    fn bad_lists_say_what_is_wrong() {
        assert_eq!(
            err("a, nope"),
            "--order-by: unknown column nope; the columns are: a, b, \"Mixed Case\", \"Total\""
        );
        assert!(err("\"total\"").starts_with("--order-by: unknown column \"total\";"));
        assert!(err("").contains("the list is empty"), "{}", err(""));
        assert!(err("a DESC DESC").contains("found DESC"), "{}", err("a DESC DESC"));
        assert!(err("a LIMIT 3").contains("found LIMIT"), "{}", err("a LIMIT 3"));
        assert!(err("a,").contains("--order-by \"a,\""), "{}", err("a,"));
        assert!(err("lower(b)").contains("not a column name"), "{}", err("lower(b)"));
        assert!(err("1").contains("by position"), "{}", err("1"));
        assert!(err("t.a").contains("qualified"), "{}", err("t.a"));
        assert!(err("a; DROP TABLE t").contains("found ;"), "{}", err("a; DROP TABLE t"));
    }
}
