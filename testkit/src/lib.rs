//! What Weir's tests share, whatever crate they test (a dev-dependency
//! only). Today: ports for nodes of a test cluster. The broker's process
//! harness (`broker/tests/common`) and the quorum tests' are to move here.
#![warn(missing_docs)]

pub mod ports;
