//! Request bodies: JSON, YAML and Kubernetes protobuf, read and decoded within bounds.
//!
//! * A body is kept in memory only up to [`MAX_REQUEST_BODY_BYTES`] (kube-apiserver's
//!   `MaxRequestBodyBytes`, 3 MiB); a longer one (or one that declares a longer
//!   `Content-Length`) is `413 RequestEntityTooLarge`, "Request entity too large: limit is
//!   3145728", before anything is decoded. The rest of it is read and dropped (up to
//!   [`MAX_DISCARD_BYTES`]) so that the client reads the 413.
//! * A decoded document may nest at most [`ferry_api::decode::MAX_DEPTH`] levels: JSON stops
//!   at 128 while parsing, YAML's parser stops at the limit, and every decoded document is
//!   measured (`400 BadRequest` beyond it).
//! * YAML anchors and aliases are bounded while parsing ([`yaml_options`]): an alias bomb
//!   (nested aliases that expand exponentially) is refused after at most
//!   [`MAX_YAML_REPLAYED_EVENTS`] replayed events instead of being expanded.

use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::Value;

use crate::status::ApiError;

/// The longest request body read (kube-apiserver's `MaxRequestBodyBytes`: twice etcd's 1.5 MiB
/// request limit, as a JSON body may be larger than the object it stores).
pub const MAX_REQUEST_BODY_BYTES: usize = 3 * 1024 * 1024;

/// The most events aliases may replay in one YAML document.
pub const MAX_YAML_REPLAYED_EVENTS: usize = 100_000;

/// The most YAML nodes (scalars, sequences, mappings) in one document: more than a 3 MiB body
/// can hold without aliases.
pub const MAX_YAML_NODES: usize = 1_600_000;

/// `413 RequestEntityTooLarge` with upstream's message.
pub fn too_large(limit: usize) -> ApiError {
    ApiError::new(
        413,
        "RequestEntityTooLarge",
        format!("Request entity too large: limit is {limit}"),
    )
}

/// Reads a whole request body, refusing one over [`MAX_REQUEST_BODY_BYTES`] (also when its
/// `Content-Length` says so: then nothing is read).
pub async fn read_limited<B>(body: B, content_length: Option<u64>) -> Result<Bytes, ApiError>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    read_limited_to(body, content_length, MAX_REQUEST_BODY_BYTES).await
}

/// How much of an over-long body is read and thrown away (never kept) so that the client,
/// still sending, gets to read its 413 rather than a reset connection or stream. A body longer
/// than the limit plus this is cut off.
pub const MAX_DISCARD_BYTES: u64 = 4 * MAX_REQUEST_BODY_BYTES as u64;

/// [`read_limited`] with an explicit limit.
pub async fn read_limited_to<B>(
    body: B,
    content_length: Option<u64>,
    limit: usize,
) -> Result<Bytes, ApiError>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let limit64 = limit as u64;
    if content_length.is_some_and(|n| n > limit64.saturating_add(MAX_DISCARD_BYTES)) {
        return Err(too_large(limit));
    }
    let mut over = content_length.is_some_and(|n| n > limit64);
    let mut kept = bytes::BytesMut::new();
    let mut seen: u64 = 0;
    let mut body = std::pin::pin!(body);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            ApiError::bad_request(format!("error reading the request body: {}", e.into()))
        })?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        seen = seen.saturating_add(data.len() as u64);
        if seen > limit64 && !over {
            over = true;
            kept = bytes::BytesMut::new();
        }
        if !over {
            kept.extend_from_slice(&data);
        }
        if seen > limit64.saturating_add(MAX_DISCARD_BYTES) {
            break;
        }
    }
    if over {
        return Err(too_large(limit));
    }
    Ok(kept.freeze())
}

/// The `Content-Length` a request declares, if any.
pub fn content_length(headers: &http::HeaderMap) -> Option<u64> {
    headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// Refuses a decoded document nested deeper than [`ferry_api::decode::MAX_DEPTH`].
pub fn check_depth(v: &Value, what: &str) -> Result<(), ApiError> {
    let d = ferry_api::decode::depth(v);
    if d > ferry_api::decode::MAX_DEPTH {
        return Err(ApiError::bad_request(format!(
            "error decoding {what}: exceeded max depth of {} (nested {d} levels deep)",
            ferry_api::decode::MAX_DEPTH
        )));
    }
    Ok(())
}

/// Parses a JSON body (serde_json stops at 128 levels; the result is held to
/// [`ferry_api::decode::MAX_DEPTH`]).
pub fn parse_json(body: &[u8], what: &str) -> Result<Value, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding {what}: {e}")))?;
    check_depth(&v, what)?;
    Ok(v)
}

/// The YAML parser's budget: depth, node count and alias expansion bounded.
pub fn yaml_options() -> serde_saphyr::Options {
    let mut o = serde_saphyr::Options::default();
    let mut budget = o.budget.take().unwrap_or_default();
    budget.max_depth = ferry_api::decode::MAX_DEPTH;
    budget.max_nodes = MAX_YAML_NODES;
    budget.max_documents = 1;
    budget.max_reader_input_bytes = Some(MAX_REQUEST_BODY_BYTES);
    o.budget = Some(budget);
    o.alias_limits.max_total_replayed_events = MAX_YAML_REPLAYED_EVENTS;
    o
}

pub fn parse_yaml_or_json(body: &[u8]) -> Result<Value, ApiError> {
    let trimmed = body
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .map(|i| &body[i..])
        .unwrap_or(b"");
    if trimmed.first() == Some(&b'{') {
        return parse_json(body, "JSON");
    }
    let text = std::str::from_utf8(body).map_err(|_| ApiError::bad_request("body is not UTF-8"))?;
    let v: Value = serde_saphyr::from_str_with_options(text, yaml_options())
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
    check_depth(&v, "YAML")?;
    Ok(v)
}

/// Decodes a create/update body by its content type.
pub fn decode(content_type: &str, body: &[u8]) -> Result<Value, ApiError> {
    let ct = content_type.split(';').next().unwrap_or("").trim();
    match ct {
        "" | "application/json" | "*/*" => parse_json(body, "JSON"),
        "application/yaml" | "application/x-yaml" | "text/yaml" => parse_yaml_or_json(body),
        "application/vnd.kubernetes.protobuf" => {
            let v = crate::patching::decode_protobuf(body)?;
            check_depth(&v, "protobuf")?;
            Ok(v)
        }
        other => Err(ApiError::unsupported_media(other)),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use http_body_util::Full;

    #[tokio::test]
    async fn bodies_over_the_limit_are_413() {
        let ok = read_limited_to(Full::new(Bytes::from(vec![b' '; 10])), None, 10).await;
        assert_eq!(ok.unwrap().len(), 10);
        for declared in [None, Some(11), Some(5)] {
            let e = read_limited_to(Full::new(Bytes::from(vec![b' '; 11])), declared, 10)
                .await
                .unwrap_err();
            assert_eq!((e.code, e.reason), (413, "RequestEntityTooLarge"));
            assert_eq!(e.message, "Request entity too large: limit is 10");
        }
        // A declared length over the limit is refused before the body is read.
        let e = read_limited(Full::new(Bytes::new()), Some(3 * 1024 * 1024 + 1))
            .await
            .unwrap_err();
        assert_eq!(e.message, "Request entity too large: limit is 3145728");
    }

    fn nested_json(levels: usize) -> String {
        format!("{}1{}", "[".repeat(levels - 1), "]".repeat(levels - 1))
    }

    /// Mappings nested so that the document is `levels` deep (the innermost value a scalar).
    fn nested_yaml(levels: usize) -> String {
        let mut s = String::new();
        for i in 0..levels - 2 {
            s.push_str(&"  ".repeat(i));
            s.push_str("a:\n");
        }
        s.push_str(&"  ".repeat(levels - 2));
        s.push_str("b: 1\n");
        s
    }

    #[test]
    fn depth_is_bounded_in_every_format() {
        let max = ferry_api::decode::MAX_DEPTH;
        assert!(decode("application/json", nested_json(max).as_bytes()).is_ok());
        for levels in [max + 1, 127, 128, 5000] {
            let e = decode("application/json", nested_json(levels).as_bytes()).unwrap_err();
            assert_eq!(e.code, 400, "{levels}: {}", e.message);
        }
        // YAML: `a:` mappings, one level each.
        assert!(decode("application/yaml", nested_yaml(max).as_bytes()).is_ok());
        for levels in [max + 1, 5000] {
            let e = decode("application/yaml", nested_yaml(levels).as_bytes()).unwrap_err();
            assert_eq!(e.code, 400, "{levels}: {}", e.message);
        }
        let flow = format!("{}1{}", "[".repeat(5000), "]".repeat(5000));
        assert_eq!(
            decode("application/yaml", flow.as_bytes())
                .unwrap_err()
                .code,
            400
        );
    }

    #[test]
    fn yaml_alias_bombs_are_refused() {
        // Nine levels of ten aliases each: 10^9 scalars if expanded.
        let mut y = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..10 {
            let p = i - 1;
            y.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        let e = decode("application/yaml", y.as_bytes()).unwrap_err();
        assert_eq!(e.code, 400, "{}", e.message);
        // Plain anchors and aliases still work.
        let v = decode("application/yaml", b"a: &x {b: 1}\nc: *x\n").unwrap();
        assert_eq!(v, serde_json::json!({"a": {"b": 1}, "c": {"b": 1}}));
    }
}
