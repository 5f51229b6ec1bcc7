//! Range ids as hash-partition values.
//!
//! datafusion-distributed shuffles rows between stages with DataFusion's hash repartitioning
//! (`RepartitionExec` with `Partitioning::Hash`): a row goes to partition
//! `hash(value) % partitions`, with DataFusion's fixed repartition seed. To send the rows of
//! range `r` to partition `r`, each row carries, instead of `r`, a value whose hash lands there:
//! the smallest `u64` with that property, found once per partition count.

use arrow::array::UInt64Array;
use datafusion::common::hash_utils::create_hashes;
use datafusion::error::{DataFusionError, Result};
use datafusion::physical_plan::repartition::REPARTITION_RANDOM_STATE;

/// For each partition `r` of `partitions`, a `u64` that DataFusion's hash repartitioning into
/// `partitions` partitions sends to partition `r`.
pub fn route_values(partitions: usize) -> Result<Vec<u64>> {
    let mut values = vec![None; partitions];
    let mut missing = partitions;
    let chunk = 4096u64;
    let mut start = 0u64;
    let mut hashes = vec![0u64; chunk as usize];
    while missing > 0 {
        if start > 1 << 32 {
            return Err(DataFusionError::Internal(format!(
                "no hash value found for some of {partitions} partitions"
            )));
        }
        let candidates = UInt64Array::from_iter_values(start..start + chunk);
        hashes.iter_mut().for_each(|h| *h = 0);
        create_hashes(
            [&candidates as &dyn arrow::array::Array],
            REPARTITION_RANDOM_STATE.random_state(),
            &mut hashes,
        )?;
        for (i, h) in hashes.iter().enumerate() {
            let p = (h % partitions as u64) as usize;
            if values[p].is_none() {
                values[p] = Some(start + i as u64);
                missing -= 1;
            }
        }
        start += chunk;
    }
    Ok(values.into_iter().map(|v| v.unwrap_or_default()).collect())
}
