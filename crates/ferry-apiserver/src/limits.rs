//! The bounds on the work of one request, in one place (the README's "Limits" section says the
//! same for users).
//!
//! | what | bound | refusal |
//! | --- | --- | --- |
//! | request body | [`MAX_REQUEST_BODY_BYTES`] = 3 MiB (kube-apiserver's `MaxRequestBodyBytes`); a larger `Content-Length` is refused before reading | `413 RequestEntityTooLarge`, "Request entity too large: limit is 3145728" |
//! | stored object | [`MAX_OBJECT_BYTES`] = 1.5 MiB of JSON (etcd's default `--max-request-bytes`), checked on every patch result and by both store backends | `413`, "Request entity too large: limit is 1572864" |
//! | nesting of a decoded document or patch result | [`MAX_DEPTH`] = 100 levels (JSON, YAML, protobuf bodies; patch results) | `400` for bodies, `422 Invalid` for patch results |
//! | JSON patch operations | [`MAX_JSON_PATCH_OPERATIONS`] = 10,000 (upstream's `maxJSONPatchOperations`) | `413`, "Request entity too large: The allowed maximum operations in a JSON patch is 10000, got N" |
//! | bytes added by JSON patch `copy` | [`MAX_JSON_PATCH_COPY_BYTES`] = 3 MiB (upstream's `JSONPatchMaxCopyBytes`), counted before copying | `422 Invalid`, "Unable to complete the copy, the accumulated size increase of copy is N, exceeding the limit 3145728" |
//! | YAML aliases | [`MAX_YAML_REPLAYED_EVENTS`] = 100,000 replayed events, [`MAX_DEPTH`] levels, 1.6 M nodes | `400` |
//!
//! A refused request changes nothing: every check runs before the store is written.
//!
//! # Memory per request
//!
//! What one request can make the server hold at once is what its body decodes to, plus the
//! object it changes, plus the patch result, plus the typed copy validation makes of it:
//!
//! * the body: at most 3 MiB of bytes;
//! * its decoded JSON: at most about 40 bytes of tree per byte of body (the worst shape is an
//!   array of one-digit numbers, `[0,0,0,...]`: 2 bytes of text per 80-byte value) — 120 MiB
//!   for a 3 MiB body;
//! * a patch result: the stored object (≤ 1.5 MiB of JSON) plus what the patch adds (≤ 3 MiB
//!   from the body, ≤ 3 MiB from copies); the result is measured and refused above 1.5 MiB
//!   before anything else is done with it;
//! * YAML alias expansion: at most 100,000 replayed nodes.
//!
//! Every request shape that costs most per byte is measured by the `request_limits`
//! integration test (the process's peak resident set, reset before each request; debug build):
//! a 3 MiB body of small keys +140 MiB, a 3 MiB array of zeros +128 MiB, a 3 MiB merge patch +93
//! MiB, the self-doubling JSON patch of issue 14 (which needed 24 GB before these bounds) +17
//! MiB; the test holds every one under [`MAX_REQUEST_MEMORY_BYTES`]. Concurrent requests add up: the server's total is this bound times the requests in
//! flight.

pub use crate::body::{MAX_REQUEST_BODY_BYTES, MAX_YAML_REPLAYED_EVENTS};
pub use ferry_api::decode::MAX_DEPTH;
pub use ferry_api::patch::json_patch::{
    MAX_COPY_BYTES as MAX_JSON_PATCH_COPY_BYTES, MAX_OPERATIONS as MAX_JSON_PATCH_OPERATIONS,
};
pub use ferry_store::MAX_VALUE_BYTES as MAX_OBJECT_BYTES;

/// The documented bound on how much one request may raise the server's peak memory.
pub const MAX_REQUEST_MEMORY_BYTES: u64 = 256 * 1024 * 1024;
