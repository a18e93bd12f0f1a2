//! ngl-tune: find, by measurement, how many layers of a GGUF model belong on
//! the GPU. The binary is a thin shell over this library; tests use it directly.

pub mod app;
pub mod bench;
pub mod cli;
pub mod clock;
pub mod consumer;
pub mod curve;
pub mod emit;
pub mod engine;
pub mod error;
pub mod fsio;
pub mod gguf;
pub mod interrupt;
pub mod model;
pub mod ngl;
pub mod placement;
pub mod probe;
pub mod profile;
pub mod progress;
pub mod report;
pub mod reprofile;
pub mod request;
pub mod rpc;
pub mod stats;
pub mod synth;
pub mod table;
pub mod tune;
pub mod types;
