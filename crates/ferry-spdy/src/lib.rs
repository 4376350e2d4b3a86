//! SPDY/3.1, as far as Kubernetes streaming needs it: the framing layer
//! (draft-mbelshe-httpbis-spdy-00 with SPDY/3.1's session semantics), header-block
//! compression with the specification's zlib dictionary, and an async session that
//! multiplexes streams over one upgraded connection. `kubectl exec`/`cp`/`attach`/
//! `port-forward` of kubectl up to 1.29 (and client-go's SPDY executor) speak this to the
//! API server and kubelet (Go's `moby/spdystream`).
//!
//! Layers: [`frame`] and [`headers`] are pure (bytes in, frames out); [`session`] is the IO
//! edge.

pub mod dictionary;
pub mod frame;
pub mod headers;
pub mod session;

pub use frame::{Frame, FrameError};
pub use headers::{HeaderError, Headers};
pub use session::{Aborted, Closed, Role, Session, Stream, StreamWriter};
