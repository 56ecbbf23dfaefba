//! The planners: training memory per GPU (model states, activations, parallelism, recompute)
//! and its search, KV-cache pool sizing and sequence packing. Pure computations: callers hand
//! in text or lengths, nothing here opens a file.

pub mod activations;
pub mod builtin;
pub mod calibrate;
pub mod checkpoint;
pub mod compare;
pub mod cost;
pub mod deepspeed;
pub mod explain;
pub mod fit;
pub mod hf;
pub mod kv;
pub mod kv_sim;
pub mod layer_costs;
pub mod layout;
pub mod lines;
pub mod megatron;
pub mod model;
pub mod pack;
pub mod recipe;
pub mod search;
pub mod serve;
pub mod states;
pub mod train;
pub mod verdict;

#[cfg(test)]
mod props;
