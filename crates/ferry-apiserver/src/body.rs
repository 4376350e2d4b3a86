//! Request bodies: JSON, YAML and Kubernetes protobuf.

use serde_json::Value;

use crate::status::ApiError;

pub fn parse_yaml_or_json(body: &[u8]) -> Result<Value, ApiError> {
    let trimmed = body
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .map(|i| &body[i..])
        .unwrap_or(b"");
    if trimmed.first() == Some(&b'{') {
        return serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding JSON: {e}")));
    }
    let text = std::str::from_utf8(body).map_err(|_| ApiError::bad_request("body is not UTF-8"))?;
    serde_saphyr::from_str::<Value>(text)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))
}

/// Decodes a create/update body by its content type.
pub fn decode(content_type: &str, body: &[u8]) -> Result<Value, ApiError> {
    let ct = content_type.split(';').next().unwrap_or("").trim();
    match ct {
        "" | "application/json" | "*/*" => serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding JSON: {e}"))),
        "application/yaml" | "application/x-yaml" | "text/yaml" => parse_yaml_or_json(body),
        "application/vnd.kubernetes.protobuf" => crate::patching::decode_protobuf(body),
        other => Err(ApiError::unsupported_media(other)),
    }
}
