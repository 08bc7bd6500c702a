//! The chaos kit the stress, nemesis, linearizability and etcd fault tests
//! share, one file per thing it holds: the seeded random source
//! (`random`), the binary run as a client that can be SIGKILLed mid-call
//! and is bounded in time (`client`), the witness of who wrote under which
//! fence and the counters (`witness`), a TCP proxy that passes, cuts,
//! hangs, slows or severs (`proxy`), and a 3-member etcd cluster on
//! loopback whose members can be killed, stopped and restarted (`cluster`).
//! Tests reach them all as `chaos::NAME`.
//!
//! Ports: the clusters of these tests live in 33000-33999, each test in a
//! hundred of its own; that range is inside Linux's ephemeral ports, so a
//! cluster takes the first block of its hundred that nothing holds now (a
//! client socket of another process, say). Proxies listen on free ports.

mod client;
mod cluster;
mod proxy;
mod random;
mod witness;

pub use client::*;
pub use cluster::*;
pub use proxy::*;
pub use random::*;
pub use witness::*;
