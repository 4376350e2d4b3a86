//! Ferry's containerd foundation: a CRI v1 client ([`client`]), a supervised containerd with a
//! Ferry-generated configuration ([`containerd`]), and an offline OCI image writer ([`oci`]).
//! The node agent's CRI `PodRuntime` sits on these (see README.md).

pub mod client;
pub mod containerd;
pub mod error;
pub mod images;
pub mod oci;
pub mod pb;
pub mod streaming;

pub use client::CriClient;
pub use error::{CriError, ErrorKind, Op};
