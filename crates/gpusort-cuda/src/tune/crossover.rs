//! The planner's direct/indirect crossover, measured: records of a u32 key and m u32 fields
//! (ByField) sorted by SRTS-direct and by SRTS-indirect for a few m, with the settings the
//! kernel search chose; the largest m up to which direct is the faster becomes
//! `GPUSORT_DIRECT_MAX_FIELDS` ([`GpuOptions::direct_max_fields`](crate::GpuOptions::direct_max_fields)),
//! the crossover Bandyopadhyay & Sahni's cost rule places at 12 fields on the C1060 and the
//! H100's calibration at 2.

/// The variable of the crossover.
pub const CROSSOVER_VAR: &str = "GPUSORT_DIRECT_MAX_FIELDS";

/// The fields counts measured.
pub const CROSSOVER_FIELDS: &[usize] = &[1, 2, 3, 4, 6, 8, 12];

/// One fields count: each strategy's time (ms), `None` where its output was wrong.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CrossoverPoint {
    /// Fields besides the key.
    pub fields: usize,
    /// SRTS-direct's time.
    pub direct_ms: Option<f64>,
    /// SRTS-indirect's time.
    pub indirect_ms: Option<f64>,
}

/// The largest fields count up to which SRTS-direct was right and no slower than SRTS-indirect
/// at every count measured (0: indirect from the first field on); `None` when no count was
/// measured right both ways.
pub fn direct_max_fields(points: &[CrossoverPoint]) -> Option<usize> {
    let mut sorted: Vec<&CrossoverPoint> = points.iter().collect();
    sorted.sort_by_key(|p| p.fields);
    let mut max = None;
    for p in sorted {
        match (p.direct_ms, p.indirect_ms) {
            (Some(d), Some(i)) if d <= i => max = Some(p.fields),
            (Some(_), Some(_)) | (None, Some(_)) => return Some(max.unwrap_or(0)),
            // Indirect wrong here: direct stays up to this count if it was right.
            (Some(_), None) => max = Some(p.fields),
            (None, None) => return max,
        }
    }
    max
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(fields: usize, direct: f64, indirect: f64) -> CrossoverPoint {
        CrossoverPoint {
            fields,
            direct_ms: Some(direct),
            indirect_ms: Some(indirect),
        }
    }

    #[test]
    fn the_crossover_is_where_indirect_first_wins() {
        // The H100's shape: direct up to m = 2.
        let h100 = [
            point(1, 0.7, 0.75),
            point(2, 0.85, 0.87),
            point(3, 1.0, 0.95),
            point(4, 1.2, 1.0),
        ];
        assert_eq!(direct_max_fields(&h100), Some(2));
        // Given in any order.
        let mut shuffled = h100;
        shuffled.reverse();
        assert_eq!(direct_max_fields(&shuffled), Some(2));
        // Indirect from the first field; direct everywhere measured.
        assert_eq!(direct_max_fields(&[point(1, 1.0, 0.9), point(2, 1.0, 0.5)]), Some(0));
        assert_eq!(direct_max_fields(&[point(4, 1.0, 2.0), point(12, 1.0, 2.0)]), Some(12));
        // A direct win beyond the first indirect win does not count: the rule is one threshold.
        assert_eq!(
            direct_max_fields(&[point(1, 1.0, 2.0), point(2, 3.0, 2.0), point(3, 1.0, 2.0)]),
            Some(1)
        );
        // A wrong direct output ends direct there; nothing right: no crossover.
        let wrong_direct = CrossoverPoint {
            direct_ms: None,
            ..point(3, 0.0, 1.0)
        };
        assert_eq!(direct_max_fields(&[point(2, 1.0, 2.0), wrong_direct]), Some(2));
        let neither = CrossoverPoint {
            fields: 1,
            direct_ms: None,
            indirect_ms: None,
        };
        assert_eq!(direct_max_fields(&[neither]), None);
        assert_eq!(direct_max_fields(&[]), None);
    }
}
