//! Byte sizes as DuckDB and datafusion-cli write them: the one parser behind every size gpusort
//! reads (the `gpusort.gpu_memory_limit` option, the command line's `--memory-limit`,
//! `--gpu-memory-limit` and `--disk-limit`, and `GPUSORT_PINNED_LIMIT`).
//!
//! - a bare number is bytes: `1073741824`, or with `B`: `100B`;
//! - `k`, `m`, `g`, `t` and `KiB`, `MiB`, `GiB`, `TiB` are binary (2^10, 2^20, ...): `8g`, `8GiB`;
//! - `KB`, `MB`, `GB`, `TB` are decimal (10^3, 10^6, ...): `8GB`, `512MB`;
//! - fractions are allowed: `1.5g`; case and spaces do not matter;
//! - `0` and `none` are 0: no limit for the memory and disk limits (for `GPUSORT_PINNED_LIMIT`,
//!   no pinned memory).

/// Examples of the syntax, for messages: "expected a size like {SIZE_EXAMPLES}, got ...".
pub const SIZE_EXAMPLES: &str = "512m, 512MiB, 8g, 8GiB, 8GB or 1073741824 (0 or none: no limit)";

/// The message for a size that does not parse: "expected a size like ..., got '{s}'".
pub fn size_error(s: &str) -> String {
    format!("expected a size like {SIZE_EXAMPLES}, got '{s}'")
}

/// Parses a byte count (see the [module](self) for the syntax); `None` when `s` is not one or
/// does not fit a `usize`.
pub fn parse_byte_size(s: &str) -> Option<usize> {
    let t = s.trim().to_ascii_lowercase();
    if t == "none" {
        return Some(0);
    }
    let split = t
        .char_indices()
        .find(|(_, c)| c.is_ascii_alphabetic())
        .map_or(t.len(), |(i, _)| i);
    let (digits, unit) = t.split_at(split);
    let multiplier: f64 = match unit.trim() {
        "" | "b" | "byte" | "bytes" => 1.0,
        "k" | "kib" => (1u64 << 10) as f64,
        "m" | "mib" => (1u64 << 20) as f64,
        "g" | "gib" => (1u64 << 30) as f64,
        "t" | "tib" => (1u64 << 40) as f64,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return None,
    };
    let digits = digits.trim();
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return None;
    }
    if multiplier == 1.0 && !digits.contains('.') {
        return digits.parse::<usize>().ok();
    }
    let n: f64 = digits.parse().ok()?;
    let bytes = (n * multiplier).round();
    (bytes.is_finite() && bytes < usize::MAX as f64).then_some(bytes as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_as_duckdb_writes_them() {
        for (text, bytes) in [
            ("8GiB", 8usize << 30),
            ("8g", 8 << 30),
            ("8 G", 8 << 30),
            (" 8G ", 8 << 30),
            ("8GB", 8_000_000_000),
            ("512MiB", 512 << 20),
            ("512m", 512 << 20),
            ("512mb", 512_000_000),
            ("64k", 64 << 10),
            ("1.5k", 1536),
            ("1.5G", 3 << 29),
            ("1t", 1 << 40),
            ("1TB", 1_000_000_000_000),
            ("100B", 100),
            ("4096", 4096),
            ("0", 0),
            ("none", 0),
            ("NONE", 0),
            ("1073741824", 1 << 30),
        ] {
            assert_eq!(parse_byte_size(text), Some(bytes), "{text}");
        }
        for bad in ["", "g", "-1g", "8 gigs", "1e3", "8xb", "lots", "99999999999999999999t"] {
            assert_eq!(parse_byte_size(bad), None, "{bad}");
        }
        assert_eq!(
            size_error("lots"),
            format!("expected a size like {SIZE_EXAMPLES}, got 'lots'")
        );
    }
}
