//! weir-bench's integration tests, as one test binary (one link of the
//! crate, the broker and their dependencies instead of one per file). Each
//! file is a module; a test is named `file::test`.

mod report;
mod run;
mod workload;
