//! Every integration test in one binary (one link instead of one per file).
//! Each module keeps its old file name, so `cargo test --test integration cli::`
//! runs what `cargo test --test cli` ran. `harness` is the shared world:
//! temporary repos, the real binary, and a harness that speaks in verbs.

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

mod cli;
mod conformance;
mod corpus;
mod docs;
mod edges;
mod edges27;
mod etcd_faults;
mod etcd_leases;
mod etcd_nemesis;
mod etcd_proxy;
mod etcd_reads;
mod etcd_tls;
mod exact;
mod example;
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
// The server exists only with the `mcp` feature (on by default).
#[cfg(feature = "mcp")]
mod mcp;
mod races;
mod run_edges;
mod run_tree;
mod sandbox_pidns;
mod shape;
mod store_contract;
mod stress;
mod verbs;
mod wait_run;
mod write_block;
