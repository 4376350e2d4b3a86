//! NetworkPolicy for Ferry: a slim model of policies, pods and namespaces; one pure verdict
//! function (used by the ruleset renderer, `ferry netpol explain` and `matrix`); the node's
//! nftables table rendered as data with a pure diff; an applier and one coalescing sync loop
//! per node; and, on the loopback pod network where nothing can be enforced, a Warning Event
//! on every NetworkPolicy.

pub mod agent;
pub mod apply;
pub mod cli;
pub mod fixtures;
pub mod log;
pub mod matrix;
pub mod metrics;
pub mod model;
pub mod render;
pub mod ruleset;
pub mod slim;
pub mod verdict;
pub mod warn;

pub use cli::{NetpolArgs, run};
pub use model::{Direction, Model, PodKey, Proto};
pub use verdict::{Conn, Endpoint, Verdict, evaluate};
