//! `weir-bench`, the bundled load generator: OpenMessaging Benchmark
//! workloads against a Weir broker (running, or embedded in the process),
//! with latency measured from each record's intended send time.
#![warn(missing_docs)]

pub mod discard;
pub mod embedded;
pub mod kafka;
pub mod otlp;
pub mod plot;
pub mod report;
pub mod run;
pub mod stages;
pub mod workload;
