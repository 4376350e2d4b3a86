//! Kubernetes protobuf bodies (`application/vnd.kubernetes.protobuf`) <-> JSON objects.
//!
//! A body is the 4-byte magic `k8s\0` followed by a `runtime.Unknown` envelope: typeMeta
//! {apiVersion = 1, kind = 2} (field 1), raw = the object's own message (field 2),
//! contentEncoding (3), contentType (4). The object's message is translated by a generic wire
//! codec driven by a generated descriptor table (`descriptors.rs`, made by
//! `tools/gen_protobuf_descriptors.py` from the `k8s-pb` prost sources and the Kubernetes Go
//! types), so the JSON is what Go's `encoding/json` prints for the same object.
//!
//! Known differences from Go's JSON: nil slices/maps without `omitempty` are left out instead
//! of printed as `null`; non-pointer scalars *absent* from the wire are left out instead of
//! printed as zero (gogo-protobuf always writes them, so this only affects other encoders);
//! quantities are passed through as written, not re-canonicalised.

mod codec;
#[rustfmt::skip]
mod descriptors;
mod schema;
mod wire;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;

use serde_json::{Map, Value};

use schema::Msg;
use wire::{Reader, WireVal};

/// The 4 bytes every Kubernetes protobuf body starts with.
pub const MAGIC: &[u8; 4] = b"k8s\0";
/// The media type of Kubernetes protobuf bodies.
pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// Why a protobuf body could not be translated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtobufError {
    /// The body does not start with `k8s\0`.
    #[error("protobuf body does not start with the k8s\\0 magic")]
    MissingMagic,
    /// The bytes end in the middle of a field.
    #[error("protobuf body is truncated")]
    Truncated,
    /// The bytes are not a valid encoding of the expected message.
    #[error("malformed protobuf: {0}")]
    Malformed(String),
    /// The envelope names a kind this server has no protobuf schema for (answer 415).
    #[error("protobuf is not supported for kind {kind:?} in apiVersion {api_version:?}")]
    UnknownKind { api_version: String, kind: String },
    /// The envelope's raw bytes use an encoding or content type this server does not read.
    #[error("unsupported protobuf envelope: {0}")]
    UnsupportedEnvelope(String),
    /// The JSON given to [`encode_body`] does not fit the kind's schema.
    #[error("cannot encode as protobuf: {0}")]
    InvalidJson(String),
}

impl ProtobufError {
    /// Whether the request should be answered 415 Unsupported Media Type (rather than 400).
    pub fn is_unsupported(&self) -> bool {
        matches!(
            self,
            ProtobufError::UnknownKind { .. } | ProtobufError::UnsupportedEnvelope(_)
        )
    }
}

/// Returns the descriptor of a served kind. `DeleteOptions` is accepted under any apiVersion,
/// because clients send it with the apiVersion of the resource they delete.
fn lookup(api_version: &str, kind: &str) -> Result<&'static Msg, ProtobufError> {
    descriptors::KINDS
        .iter()
        .find(|(av, k, _)| *k == kind && (*av == api_version || kind == "DeleteOptions"))
        .map(|(_, _, msg)| *msg)
        .ok_or_else(|| ProtobufError::UnknownKind {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
        })
}

/// Whether `(api_version, kind)` can be decoded and encoded by this module.
pub fn supports(api_version: &str, kind: &str) -> bool {
    lookup(api_version, kind).is_ok()
}

/// Decodes a `k8s\0`-prefixed protobuf body into the object's JSON, as the JSON encoding of the
/// same object would be (field names, int-or-string, quantities, RFC 3339 `Z` timestamps, base64
/// bytes, sorted maps, omitted unset fields), with "apiVersion" and "kind" from the envelope.
pub fn decode_body(body: &[u8]) -> Result<Value, ProtobufError> {
    let envelope = body
        .strip_prefix(MAGIC)
        .ok_or(ProtobufError::MissingMagic)?;
    let unknown = Envelope::decode(envelope)?;
    if !unknown.content_encoding.is_empty() {
        return Err(ProtobufError::UnsupportedEnvelope(format!(
            "content encoding {:?}",
            unknown.content_encoding
        )));
    }
    match unknown.content_type.as_str() {
        "" | CONTENT_TYPE => decode_object(&unknown.api_version, &unknown.kind, unknown.raw),
        "application/json" => {
            let mut value: Value = serde_json::from_slice(unknown.raw)
                .map_err(|e| ProtobufError::Malformed(format!("raw JSON in envelope: {e}")))?;
            let obj = value.as_object_mut().ok_or_else(|| {
                ProtobufError::Malformed("raw JSON in envelope is not an object".into())
            })?;
            obj.insert("apiVersion".into(), Value::String(unknown.api_version));
            obj.insert("kind".into(), Value::String(unknown.kind));
            Ok(value)
        }
        other => Err(ProtobufError::UnsupportedEnvelope(format!(
            "content type {other:?}"
        ))),
    }
}

/// Decodes the bare protobuf message of a known kind (no magic, no envelope) into JSON with
/// "apiVersion" and "kind" set.
pub fn decode_object(api_version: &str, kind: &str, raw: &[u8]) -> Result<Value, ProtobufError> {
    let msg = lookup(api_version, kind)?;
    let mut obj = Map::new();
    obj.insert("apiVersion".into(), Value::String(api_version.to_string()));
    obj.insert("kind".into(), Value::String(kind.to_string()));
    codec::decode_message(msg, raw, 0, &mut obj)?;
    Ok(Value::Object(obj))
}

/// Encodes a JSON object (with "apiVersion" and "kind") as a `k8s\0` protobuf body.
pub fn encode_body(value: &Value) -> Result<Vec<u8>, ProtobufError> {
    let obj = value
        .as_object()
        .ok_or_else(|| ProtobufError::InvalidJson("expected a JSON object".into()))?;
    let field = |name: &str| {
        obj.get(name)
            .and_then(Value::as_str)
            .ok_or_else(|| ProtobufError::InvalidJson(format!("missing string {name:?}")))
    };
    let (api_version, kind) = (field("apiVersion")?, field("kind")?);
    let raw = encode_object(api_version, kind, value)?;

    let mut type_meta = Vec::new();
    wire::put_bytes_field(&mut type_meta, 1, api_version.as_bytes());
    wire::put_bytes_field(&mut type_meta, 2, kind.as_bytes());
    let mut body = MAGIC.to_vec();
    wire::put_bytes_field(&mut body, 1, &type_meta);
    wire::put_bytes_field(&mut body, 2, &raw);
    wire::put_bytes_field(&mut body, 3, b"");
    wire::put_bytes_field(&mut body, 4, b"");
    Ok(body)
}

/// Encodes a JSON object as the bare protobuf message of `(api_version, kind)`.
pub fn encode_object(
    api_version: &str,
    kind: &str,
    value: &Value,
) -> Result<Vec<u8>, ProtobufError> {
    let msg = lookup(api_version, kind)?;
    let obj = value
        .as_object()
        .ok_or_else(|| ProtobufError::InvalidJson("expected a JSON object".into()))?;
    let mut raw = Vec::new();
    codec::encode_message(msg, obj, 0, &mut raw)?;
    Ok(raw)
}

/// The fields of a `runtime.Unknown`.
struct Envelope<'a> {
    api_version: String,
    kind: String,
    raw: &'a [u8],
    content_encoding: String,
    content_type: String,
}

impl<'a> Envelope<'a> {
    fn decode(bytes: &'a [u8]) -> Result<Self, ProtobufError> {
        let text = |v: WireVal<'_>, what: &str| match v {
            WireVal::Bytes(b) => Ok(String::from_utf8_lossy(b).into_owned()),
            _ => Err(ProtobufError::Malformed(format!(
                "runtime.Unknown {what} is not a string"
            ))),
        };
        let mut env = Envelope {
            api_version: String::new(),
            kind: String::new(),
            raw: &[],
            content_encoding: String::new(),
            content_type: String::new(),
        };
        let mut reader = Reader::new(bytes);
        while let Some((tag, value)) = reader.next_field()? {
            match tag {
                1 => {
                    let WireVal::Bytes(meta) = value else {
                        return Err(ProtobufError::Malformed(
                            "runtime.Unknown typeMeta is not a message".into(),
                        ));
                    };
                    let mut meta = Reader::new(meta);
                    while let Some((tag, value)) = meta.next_field()? {
                        match tag {
                            1 => env.api_version = text(value, "apiVersion")?,
                            2 => env.kind = text(value, "kind")?,
                            _ => {}
                        }
                    }
                }
                2 => match value {
                    WireVal::Bytes(raw) => env.raw = raw,
                    _ => {
                        return Err(ProtobufError::Malformed(
                            "runtime.Unknown raw is not bytes".into(),
                        ));
                    }
                },
                3 => env.content_encoding = text(value, "contentEncoding")?,
                4 => env.content_type = text(value, "contentType")?,
                _ => {}
            }
        }
        if env.kind.is_empty() {
            return Err(ProtobufError::Malformed(
                "runtime.Unknown has no kind".into(),
            ));
        }
        Ok(env)
    }
}
