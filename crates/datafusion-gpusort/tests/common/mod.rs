//! Helpers shared by the integration test targets: each target that needs them declares
//! `mod common;`. Not every target uses every helper, hence the `dead_code` allowance.
#![allow(dead_code)]

pub mod slt;
