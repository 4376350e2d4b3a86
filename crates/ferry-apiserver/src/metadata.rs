//! `meta.k8s.io` PartialObjectMetadata and PartialObjectMetadataList answers (what metadata-only
//! clients ask for: client-go's metadata informers, kube-rs' `metadata_watcher` and
//! `Api::list_metadata`), as upstream's `asPartialObjectMetadata(List)`: the object's whole
//! `metadata` under kind PartialObjectMetadata, nothing else.
//!
//! Cut from the served JSON bytes: the `metadata` member's bytes are copied as they are, so an
//! object is never decoded to answer for its metadata. Pure.

use bytes::Bytes;
use serde_json::{Value, json};

use crate::api::Reply;
use crate::compact::member_span;
use crate::request::Want;
use crate::status::ApiError;

/// `meta.k8s.io/v1` or `meta.k8s.io/v1beta1`.
pub fn api_version(v1beta1: bool) -> &'static str {
    if v1beta1 {
        "meta.k8s.io/v1beta1"
    } else {
        "meta.k8s.io/v1"
    }
}

/// Appends the PartialObjectMetadata of the JSON object `object` to `out`:
/// `{"kind":"PartialObjectMetadata","apiVersion":…,"metadata":<object's metadata>}` (an empty
/// metadata when the object has none).
pub fn write_partial(out: &mut Vec<u8>, object: &[u8], v1beta1: bool) {
    out.extend_from_slice(b"{\"kind\":\"PartialObjectMetadata\",\"apiVersion\":\"");
    out.extend_from_slice(api_version(v1beta1).as_bytes());
    out.extend_from_slice(b"\",\"metadata\":");
    match member_span(object, "metadata").filter(|&(s, _)| object[s] == b'{') {
        Some((s, e)) => out.extend_from_slice(&object[s..e]),
        None => out.extend_from_slice(b"{}"),
    }
    out.push(b'}');
}

/// The PartialObjectMetadata of the JSON object `object`.
pub fn partial(object: &[u8], v1beta1: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(object.len().min(1024) + 64);
    write_partial(&mut out, object, v1beta1);
    out
}

/// The PartialObjectMetadata of an object value (watch bookmarks, converted custom objects).
pub fn partial_value(v: &Value, v1beta1: bool) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": api_version(v1beta1),
        "metadata": v.get("metadata").filter(|m| m.is_object()).cloned().unwrap_or(json!({})),
    })
}

/// The Go type upstream names in its NotAcceptable messages (`*core.Pod`, `*apps.Deployment`):
/// the internal package of the group, then the kind.
fn go_type(group: &str, kind: &str) -> String {
    let pkg = match group.split('.').next() {
        None | Some("") => "core",
        Some(p) => p,
    };
    format!("*{pkg}.{kind}")
}

/// 406 for PartialObjectMetadata asked of a list (upstream's message).
pub fn list_not_acceptable(group: &str, kind: &str) -> ApiError {
    ApiError::new(
        406,
        "NotAcceptable",
        format!(
            "you requested PartialObjectMetadata, but the requested object is a list ({}List)",
            go_type(group, kind)
        ),
    )
}

/// 406 for PartialObjectMetadataList asked of one object (upstream's message).
pub fn object_not_acceptable(group: &str, kind: &str) -> ApiError {
    ApiError::new(
        406,
        "NotAcceptable",
        format!(
            "you requested PartialObjectMetadataList, but the requested object is not a list ({})",
            go_type(group, kind)
        ),
    )
}

/// A single-object reply (get, create, update, patch, delete, a subresource) as the client
/// asked: for [`Want::Metadata`], the object's PartialObjectMetadata; a `Status` (e.g. of a
/// delete) and other wants pass unchanged, as upstream's `doTransformObject`.
pub fn object_reply(reply: Reply, want: Want, group: &str, kind: &str) -> Result<Reply, ApiError> {
    let Want::Metadata { v1beta1, list } = want else {
        return Ok(reply);
    };
    let Reply::Json {
        code,
        body,
        warnings,
        content_type,
    } = reply
    else {
        return Ok(reply);
    };
    let is_status = member_span(&body, "kind").is_some_and(|(s, e)| &body[s..e] == b"\"Status\"");
    if is_status {
        return Ok(Reply::Json {
            code,
            body,
            content_type,
            warnings,
        });
    }
    if list {
        return Err(object_not_acceptable(group, kind));
    }
    Ok(Reply::Json {
        code,
        body: Bytes::from(partial(&body, v1beta1)),
        content_type: "application/json",
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(r: Reply) -> Value {
        match r {
            Reply::Json { body, .. } => serde_json::from_slice(&body).expect("json"),
            Reply::Stream { .. } => panic!("stream"),
        }
    }

    #[test]
    fn cuts_metadata_without_decoding() {
        let pod = br#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"d","labels":{"a":"b"},"ownerReferences":[{"kind":"X","name":"o","uid":"u","apiVersion":"v1"}],"resourceVersion":"5"},"spec":{"containers":[{"name":"c","image":"i"}]},"status":{"phase":"Running"}}"#;
        let got: Value = serde_json::from_slice(&partial(pod, false)).expect("json");
        let whole: Value = serde_json::from_slice(pod).expect("json");
        assert_eq!(
            got,
            json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": whole["metadata"]})
        );
        let got: Value = serde_json::from_slice(&partial(pod, true)).expect("json");
        assert_eq!(got["apiVersion"], "meta.k8s.io/v1beta1");
        // No metadata, or metadata that is not an object: an empty one.
        for raw in [&br#"{"kind":"X"}"#[..], br#"{"metadata":null}"#] {
            let got: Value = serde_json::from_slice(&partial(raw, false)).expect("json");
            assert_eq!(got["metadata"], json!({}));
        }
        assert_eq!(
            partial_value(&whole, false),
            serde_json::from_slice::<Value>(&partial(pod, false)).expect("json")
        );
    }

    #[test]
    fn single_object_replies() {
        let obj = || {
            Reply::Json {
            code: 201,
            body: Bytes::from_static(br#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"c"},"data":{"k":"v"}}"#),
            content_type: "application/json",
            warnings: vec!["w".into()],
        }
        };
        let meta = Want::Metadata {
            v1beta1: false,
            list: false,
        };
        let r = object_reply(obj(), meta, "", "ConfigMap").expect("transformed");
        let Reply::Json { code, warnings, .. } = &r else {
            panic!("json")
        };
        assert_eq!((*code, warnings.clone()), (201, vec!["w".to_string()]));
        assert_eq!(
            body(r),
            json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": {"name": "c"}})
        );
        // Other wants: unchanged.
        assert_eq!(
            body(object_reply(obj(), Want::Json, "", "ConfigMap").expect("json"))["data"],
            json!({"k": "v"})
        );
        // A Status passes through.
        let status = Reply::Json {
            code: 200,
            body: Bytes::from_static(
                br#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Success"}"#,
            ),
            content_type: "application/json",
            warnings: Vec::new(),
        };
        assert_eq!(
            body(object_reply(status, meta, "", "ConfigMap").expect("status"))["kind"],
            "Status"
        );
        // The list kind asked of one object: 406 with upstream's message.
        let e = object_reply(
            obj(),
            Want::Metadata {
                v1beta1: false,
                list: true,
            },
            "apps",
            "Deployment",
        )
        .err()
        .expect("406");
        assert_eq!(e.to_status()["code"], 406);
        assert_eq!(e.to_status()["reason"], "NotAcceptable");
        assert_eq!(
            e.to_status()["message"],
            "you requested PartialObjectMetadataList, but the requested object is not a list (*apps.Deployment)"
        );
        assert_eq!(
            list_not_acceptable("", "Pod").to_status()["message"],
            "you requested PartialObjectMetadata, but the requested object is a list (*core.PodList)"
        );
    }
}
