//! ferry-dns: cluster DNS per the Kubernetes DNS specification.
//!
//! Layers: [`wire`] (packet parsing/encoding), [`index`] (slim projections, answers precomputed
//! per name), [`answer`] (the pure answer function), and the IO edges.

pub mod answer;
pub mod index;
pub mod wire;
