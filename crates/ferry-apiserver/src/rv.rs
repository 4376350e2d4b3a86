//! `resourceVersion`, `resourceVersionMatch` and `continue` on lists and watches, with
//! upstream's validation and error texts (apimachinery's `ValidateListOptions`, the etcd3
//! store's continue tokens and the cacher's "too large resource version"). Pure.

use ferry_store::Revision;
use serde_json::{Value, json};

use crate::status::ApiError;

/// How long a request for a resourceVersion the cache has not reached waits before 504
/// (upstream's cacher blocks 3 s).
pub const TOO_LARGE_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Where a list is served from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListAt {
    /// The latest state after a consistent read (`resourceVersion` unset).
    Consistent,
    /// Whatever the cache holds (`resourceVersion=0`); `limit` is not applied, as upstream's
    /// watch cache does not page.
    Any,
    /// The latest state once the cache has reached this revision.
    NotOlderThan(Revision),
    /// Exactly this revision (`Exact`, the legacy `resourceVersion=N&limit=M`).
    Exact(Revision),
    /// The snapshot a continue token carries, after its key.
    Continue { revision: Revision, start: String },
}

fn list_options_invalid(field: &str, reason: &str, message: String) -> ApiError {
    ApiError::new(
        422,
        "Invalid",
        format!("ListOptions.meta.k8s.io \"\" is invalid: {field}: {message}"),
    )
    .with_details(json!({
        "group": "meta.k8s.io",
        "kind": "ListOptions",
        "causes": [{"reason": reason, "message": message, "field": field}],
    }))
}

/// A resourceVersion that is not a revision; `Display` is upstream's field error text
/// (callers wrap it: 400 on lists, 422 on watches, as upstream).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("resourceVersion: Invalid value: \"{rv}\": strconv.ParseUint: parsing \"{rv}\": {why}")]
pub struct InvalidResourceVersion {
    pub rv: String,
    pub why: String,
}

/// Parses a non-empty, non-"0" resourceVersion.
pub fn parse(rv: &str) -> Result<Revision, InvalidResourceVersion> {
    let invalid = |why: String| InvalidResourceVersion {
        rv: rv.to_string(),
        why,
    };
    match rv.parse::<u64>() {
        Ok(n) => Revision::try_from(n).map_err(|e| invalid(e.to_string())),
        Err(e) => {
            let why = match e.kind() {
                std::num::IntErrorKind::PosOverflow => "value out of range",
                _ => "invalid syntax",
            };
            Err(invalid(why.to_string()))
        }
    }
}

/// Decides where a list is served from, validating the options as upstream does.
pub fn list_at(
    rv: &str,
    rv_match: &str,
    continue_token: Option<&str>,
    limit: Option<i64>,
) -> Result<ListAt, ApiError> {
    if !rv_match.is_empty() {
        if rv.is_empty() {
            return Err(list_options_invalid(
                "resourceVersionMatch",
                "FieldValueForbidden",
                "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided"
                    .into(),
            ));
        }
        if continue_token.is_some() {
            return Err(list_options_invalid(
                "resourceVersionMatch",
                "FieldValueForbidden",
                "Forbidden: resourceVersionMatch is forbidden when continue is provided".into(),
            ));
        }
        if rv_match != "Exact" && rv_match != "NotOlderThan" {
            return Err(list_options_invalid(
                "resourceVersionMatch",
                "FieldValueNotSupported",
                format!(
                    "Unsupported value: \"{rv_match}\": supported values: \"Exact\", \"NotOlderThan\", \"\""
                ),
            ));
        }
        if rv_match == "Exact" && rv == "0" {
            return Err(list_options_invalid(
                "resourceVersionMatch",
                "FieldValueForbidden",
                "Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\""
                    .into(),
            ));
        }
    }
    let n = match rv {
        "" | "0" => None,
        _ => Some(
            parse(rv)
                .map_err(|m| ApiError::bad_request(format!("invalid resource version: {m}")))?,
        ),
    };
    if let Some(token) = continue_token {
        if n.is_some() {
            return Err(ApiError::bad_request(
                "specifying resource version is not allowed when using continue",
            ));
        }
        let (revision, start) = decode_continue(token)?;
        return Ok(ListAt::Continue { revision, start });
    }
    Ok(match (n, rv_match) {
        (None, _) if rv.is_empty() => ListAt::Consistent,
        (None, _) => ListAt::Any,
        (Some(n), "Exact") => ListAt::Exact(n),
        (Some(n), "") if limit.is_some_and(|l| l > 0) => ListAt::Exact(n),
        (Some(n), _) => ListAt::NotOlderThan(n),
    })
}

/// The continue token: upstream's shape (`{"v":"meta.k8s.io/v1","rv":N,"start":"<key>\u0000"}`,
/// base64), so the snapshot revision travels with the cursor.
pub fn encode_continue(revision: Revision, last_key: &str) -> String {
    encode_start(revision, &format!("{last_key}\u{0}"))
}

/// The `rv` of a continue token that continues at the latest revision (upstream: -1), handed
/// out with the 410 of an expired token.
pub const CONTINUE_LATEST: Revision = -1;

fn encode_start(revision: Revision, start: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(json!({"v": "meta.k8s.io/v1", "rv": revision, "start": start}).to_string())
}

/// Decodes a continue token into its revision and the key to start from (inclusive).
pub fn decode_continue(token: &str) -> Result<(Revision, String), ApiError> {
    use base64::Engine;
    let bad = |why: &str| {
        ApiError::bad_request(format!(
            "invalid continue token: continue key is not valid: {why}"
        ))
    };
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token.trim_end_matches('='))
        .map_err(|_| bad("illegal base64 data"))?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad("incorrect encoding"))?;
    if v.get("v").and_then(Value::as_str) != Some("meta.k8s.io/v1") {
        return Err(bad("server does not recognize this encoded key"));
    }
    let revision = v
        .get("rv")
        .and_then(Value::as_i64)
        .filter(|r| *r > 0 || *r == CONTINUE_LATEST)
        .ok_or_else(|| bad("incorrect encoded start resourceVersion (version meta.k8s.io/v1)"))?;
    let start = v
        .get("start")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| bad("encoded key is empty"))?;
    Ok((revision, start.to_string()))
}

/// 410 for a list at a revision the cache no longer reaches back to.
pub fn too_old(at: &ListAt) -> ApiError {
    match at {
        // Upstream (etcd3 store): a fresh token at rv -1 continues from the same key at the
        // latest revision.
        ListAt::Continue { start, .. } => {
            let mut e = ApiError::expired(
                "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
            );
            e.continue_token = Some(encode_start(CONTINUE_LATEST, start));
            e
        }
        _ => ApiError::expired("The resourceVersion for the provided list is too old."),
    }
}

/// Where a watch starts (after upstream's `validateWatchOptions` and the cacher's rules).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchAt {
    /// ADDED events for every matching object of a snapshot, then the changes after it.
    /// `end_bookmark`: a watch-list (`sendInitialEvents=true`) — the initial events end with a
    /// BOOKMARK annotated `k8s.io/initial-events-end: "true"` (when bookmarks are allowed).
    Initial { fresh: Fresh, end_bookmark: bool },
    /// The changes after this revision.
    After(Revision),
    /// The changes from now on, without initial events (`sendInitialEvents=false` without a
    /// resourceVersion); `consistent`: "now" is the store's latest revision.
    Now { consistent: bool },
}

/// How fresh the snapshot of a watch's initial events must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fresh {
    /// The store's latest revision (a consistent read): `resourceVersion` unset.
    Consistent,
    /// Whatever the cache holds: `resourceVersion=0`.
    Any,
    /// At least this revision.
    NotOlderThan(Revision),
}

fn parse_bool(v: &str) -> Option<bool> {
    // Go's strconv.ParseBool.
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

fn list_options_invalid_all(errs: Vec<(&str, &str, String)>) -> ApiError {
    let text = |(f, _, m): &(&str, &str, String)| format!("{f}: {m}");
    let message = if errs.len() == 1 {
        text(&errs[0])
    } else {
        format!("[{}]", errs.iter().map(text).collect::<Vec<_>>().join(", "))
    };
    ApiError::new(
        422,
        "Invalid",
        format!("ListOptions.meta.k8s.io \"\" is invalid: {message}"),
    )
    .with_details(json!({
        "group": "meta.k8s.io",
        "kind": "ListOptions",
        "causes": errs.iter().map(|(f, r, m)| json!({"reason": r, "message": m, "field": f})).collect::<Vec<_>>(),
    }))
}

/// `sendInitialEvents` on a plain list: 422, as upstream.
pub fn check_list_send_initial(send_initial: Option<&str>) -> Result<(), ApiError> {
    match send_initial {
        None => Ok(()),
        Some(_) => Err(list_options_invalid_all(vec![(
            "sendInitialEvents",
            "FieldValueForbidden",
            "Forbidden: sendInitialEvents is forbidden for list".into(),
        )])),
    }
}

/// Decides where a watch starts, validating the options as upstream does (the WatchList
/// feature on). A resourceVersion that does not parse is `Err(Ok(error))` for the caller to
/// report on its resource; option errors are `Err(Err(422))`.
pub fn watch_at(
    rv: &str,
    rv_match: &str,
    send_initial: Option<&str>,
    continue_token: Option<&str>,
) -> Result<WatchAt, Result<InvalidResourceVersion, ApiError>> {
    let send_initial = match send_initial {
        None => None,
        Some(v) => Some(parse_bool(v).ok_or_else(|| {
            Err(ApiError::bad_request(format!(
                "sendInitialEvents: invalid value {v:?}: strconv.ParseBool: parsing {v:?}: invalid syntax"
            )))
        })?),
    };
    let mut errs = Vec::new();
    if send_initial.is_some() && rv_match != "NotOlderThan" {
        errs.push((
            "resourceVersionMatch",
            "FieldValueForbidden",
            "Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"
                .to_string(),
        ));
    }
    if !rv_match.is_empty() {
        if send_initial.is_none() {
            errs.push((
                "resourceVersionMatch",
                "FieldValueForbidden",
                "Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided".into(),
            ));
        }
        if rv_match != "NotOlderThan" {
            errs.push((
                "resourceVersionMatch",
                "FieldValueNotSupported",
                format!("Unsupported value: \"{rv_match}\": supported values: \"NotOlderThan\""),
            ));
        }
        if continue_token.is_some_and(|c| !c.is_empty()) {
            errs.push((
                "resourceVersionMatch",
                "FieldValueForbidden",
                "Forbidden: resourceVersionMatch is forbidden when continue is provided".into(),
            ));
        }
    }
    if !errs.is_empty() {
        return Err(Err(list_options_invalid_all(errs)));
    }
    let at = match rv {
        "" => None,
        "0" => Some(0),
        _ => Some(parse(rv).map_err(Ok)?),
    };
    Ok(match (send_initial, at) {
        // Legacy: a watch without a resourceVersion (or at 0) starts with the current state.
        (None, None) => WatchAt::Initial {
            fresh: Fresh::Consistent,
            end_bookmark: false,
        },
        (None, Some(0)) => WatchAt::Initial {
            fresh: Fresh::Any,
            end_bookmark: false,
        },
        (None | Some(false), Some(n)) if n > 0 => WatchAt::After(n),
        (Some(true), None) => WatchAt::Initial {
            fresh: Fresh::Consistent,
            end_bookmark: true,
        },
        (Some(true), Some(0)) => WatchAt::Initial {
            fresh: Fresh::Any,
            end_bookmark: true,
        },
        (Some(true), Some(n)) => WatchAt::Initial {
            fresh: Fresh::NotOlderThan(n),
            end_bookmark: true,
        },
        (Some(false), None) => WatchAt::Now { consistent: true },
        (Some(false), Some(_)) | (None, Some(_)) => WatchAt::Now { consistent: false },
    })
}

/// 504 for a resourceVersion the cache did not reach in [`TOO_LARGE_WAIT`].
pub fn too_large(wanted: Revision, current: Revision) -> ApiError {
    ApiError::new(
        504,
        "Timeout",
        format!("Too large resource version: {wanted}, current: {current}"),
    )
    .with_details(json!({
        "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
        "retryAfterSeconds": 1,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(rv: &str, m: &str, c: Option<&str>, l: Option<i64>) -> (u16, String) {
        let e = list_at(rv, m, c, l).expect_err("should fail");
        (e.code, e.message)
    }

    type Case<'a> = (
        &'a str,
        &'a str,
        Option<&'a str>,
        Option<i64>,
        Result<ListAt, (u16, &'a str)>,
    );

    #[test]
    fn list_options_as_upstream() {
        let tok = encode_continue(7, "ns/b");
        let cases: Vec<Case> = vec![
            ("", "", None, None, Ok(ListAt::Consistent)),
            ("", "", None, Some(5), Ok(ListAt::Consistent)),
            ("0", "", None, Some(5), Ok(ListAt::Any)),
            ("0", "NotOlderThan", None, None, Ok(ListAt::Any)),
            ("12", "", None, None, Ok(ListAt::NotOlderThan(12))),
            ("12", "", None, Some(3), Ok(ListAt::Exact(12))),
            (
                "12",
                "NotOlderThan",
                None,
                Some(3),
                Ok(ListAt::NotOlderThan(12)),
            ),
            ("12", "Exact", None, None, Ok(ListAt::Exact(12))),
            (
                "",
                "",
                Some(&tok),
                Some(3),
                Ok(ListAt::Continue {
                    revision: 7,
                    start: "ns/b\u{0}".into(),
                }),
            ),
            (
                "0",
                "",
                Some(&tok),
                None,
                Ok(ListAt::Continue {
                    revision: 7,
                    start: "ns/b\u{0}".into(),
                }),
            ),
            (
                "",
                "Exact",
                None,
                None,
                Err((
                    422,
                    "resourceVersionMatch is forbidden unless resourceVersion is provided",
                )),
            ),
            (
                "0",
                "Exact",
                Some(&tok),
                None,
                Err((
                    422,
                    "resourceVersionMatch is forbidden when continue is provided",
                )),
            ),
            (
                "5",
                "InvalidMatch",
                None,
                None,
                Err((422, "supported values")),
            ),
            (
                "0",
                "Exact",
                None,
                None,
                Err((
                    422,
                    "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                )),
            ),
            ("invalid", "", None, None, Err((400, "Invalid value"))),
            (
                "99999999999999999999",
                "",
                None,
                None,
                Err((400, "value out of range")),
            ),
            ("-1", "", None, None, Err((400, "Invalid value"))),
            (
                "",
                "",
                Some("invalidContinueToken"),
                None,
                Err((400, "continue key is not valid")),
            ),
            (
                "5",
                "",
                Some(&tok),
                None,
                Err((
                    400,
                    "specifying resource version is not allowed when using continue",
                )),
            ),
        ];
        for (rv, m, c, l, want) in cases {
            match want {
                Ok(at) => assert_eq!(list_at(rv, m, c, l).expect("ok"), at, "rv={rv} m={m}"),
                Err((code, text)) => {
                    let (got_code, msg) = err(rv, m, c, l);
                    assert_eq!(got_code, code, "rv={rv} m={m}: {msg}");
                    assert!(msg.contains(text), "rv={rv} m={m}: {msg}");
                }
            }
        }
    }

    #[test]
    fn continue_tokens_round_trip() {
        let t = encode_continue(42, "default/web");
        assert_eq!(
            decode_continue(&t).expect("ok"),
            (42, "default/web\u{0}".into())
        );
        assert!(decode_continue("e30").is_err()); // {}
    }

    #[test]
    fn watch_options_as_upstream() {
        let ok = |rv: &str, m: &str, si: Option<&str>| watch_at(rv, m, si, None).expect("valid");
        let fresh = |f, end| WatchAt::Initial {
            fresh: f,
            end_bookmark: end,
        };
        assert_eq!(ok("", "", None), fresh(Fresh::Consistent, false));
        assert_eq!(ok("0", "", None), fresh(Fresh::Any, false));
        assert_eq!(ok("12", "", None), WatchAt::After(12));
        assert_eq!(
            ok("", "NotOlderThan", Some("true")),
            fresh(Fresh::Consistent, true)
        );
        assert_eq!(
            ok("0", "NotOlderThan", Some("true")),
            fresh(Fresh::Any, true)
        );
        assert_eq!(
            ok("12", "NotOlderThan", Some("true")),
            fresh(Fresh::NotOlderThan(12), true)
        );
        assert_eq!(
            ok("", "NotOlderThan", Some("false")),
            WatchAt::Now { consistent: true }
        );
        assert_eq!(
            ok("0", "NotOlderThan", Some("false")),
            WatchAt::Now { consistent: false }
        );
        assert_eq!(ok("12", "NotOlderThan", Some("0")), WatchAt::After(12));

        let invalid =
            |rv: &str, m: &str, si: Option<&str>, c: Option<&str>| match watch_at(rv, m, si, c) {
                Err(Err(e)) => (e.code, e.message),
                other => panic!("{rv} {m} {si:?}: {other:?}"),
            };
        assert_eq!(
            invalid("", "", Some("true"), None),
            (422, "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan".into())
        );
        assert_eq!(
            invalid("5", "NotOlderThan", None, None),
            (422, "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided".into())
        );
        assert_eq!(
            invalid("5", "Exact", Some("true"), None),
            (422, "ListOptions.meta.k8s.io \"\" is invalid: [resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan, resourceVersionMatch: Unsupported value: \"Exact\": supported values: \"NotOlderThan\"]".into())
        );
        assert_eq!(
            invalid("5", "NotOlderThan", Some("true"), Some("tok")).1,
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue is provided"
        );
        assert_eq!(invalid("", "NotOlderThan", Some("maybe"), None).0, 400);
        assert!(
            matches!(watch_at("x1", "", None, None), Err(Ok(m)) if m.to_string().contains("invalid syntax"))
        );
        assert_eq!(
            check_list_send_initial(Some("true")).map_err(|e| e.message),
            Err("ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list".into())
        );
        assert!(check_list_send_initial(None).is_ok());
    }

    #[test]
    fn expired_continue_hands_out_a_latest_token() {
        let at = ListAt::Continue {
            revision: 5,
            start: "ns/b\u{0}".into(),
        };
        let e = too_old(&at);
        assert_eq!(e.code, 410);
        let token = e.continue_token.clone().expect("a fresh token");
        assert_eq!(e.to_status()["metadata"]["continue"], token.as_str());
        let (rev, start) = decode_continue(&token).expect("decodes");
        assert_eq!((rev, start.as_str()), (CONTINUE_LATEST, "ns/b\u{0}"));
        assert_eq!(
            list_at("", "", Some(&token), Some(10)).expect("valid"),
            ListAt::Continue {
                revision: CONTINUE_LATEST,
                start: "ns/b\u{0}".into()
            }
        );
        // Other non-positive revisions stay invalid.
        assert!(decode_continue(&encode_start(0, "a\u{0}")).is_err());
        assert!(decode_continue(&encode_start(-2, "a\u{0}")).is_err());
    }
}
