//! Every integration test in one binary (one link instead of one per file).
//! Each module is named after what it checks (docs/tests.md lists them);
//! `cargo test --test integration cli::` runs one. `harness` is the shared
//! world: temporary repos, the real binary, and a harness that speaks in verbs.

// The suite drives POSIX shells, signals and /proc: Unix only (Windows runs
// the unit tests and the release workflow's smoke sequence).
#![cfg(unix)]
// Test code may unwrap, read the environment and the clock, and skip pedantry;
// its `pub` items are the harness's, shared between modules of this binary.
#![allow(
    unreachable_pub,
    clippy::pedantic,
    clippy::unwrap_used,
    clippy::disallowed_methods,
    clippy::print_stdout
)]

#[macro_use]
mod harness;

mod bad_input;
mod cli;
mod conformance;
mod corpus;
mod docs;
mod etcd_faults;
mod etcd_leases;
mod etcd_nemesis;
mod etcd_proxy;
mod etcd_reads;
mod etcd_tls;
mod exact_under_faults;
mod fs_store;
mod generated;
mod git_scale;
mod git_store;
mod history;
mod hostile;
mod hostile_clone;
mod hostile_trees;
mod interleavings;
mod linearizable;
mod lock_lifecycle;
// The server exists only with the `mcp` feature (on by default).
#[cfg(feature = "mcp")]
mod mcp;
mod no_second_writer;
mod races;
mod run_edges;
mod run_tree;
mod sandbox_pidns;
mod shape;
mod store_contract;
mod stress;
mod wait_run;
mod write_block;
mod write_phase_example;
