//! Checks shared by all kinds: object metadata, labels, annotations, label selectors, and the
//! rendering of values the way upstream's field errors print them (Go's `%#v` for composite
//! values).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use ferry_apimachinery::errors::{ErrorList, FieldError, Path, quote};
use ferry_apimachinery::names::{self, NameFn};

pub(crate) const IS_NEGATIVE_ERROR_MSG: &str = "must be greater than or equal to 0";
pub(crate) const FIELD_IMMUTABLE_ERROR_MSG: &str = "field is immutable";
pub(crate) const TOTAL_ANNOTATION_SIZE_LIMIT_B: usize = 256 * (1 << 10);
pub(crate) const SUPPORTED_PORT_PROTOCOLS: &[&str] = &["SCTP", "TCP", "UDP"];

/// The finalizers Kubernetes itself understands without a domain prefix.
const STANDARD_FINALIZERS: &[&str] = &["kubernetes", "orphan", "foregroundDeletion"];

pub(crate) fn s(v: &Option<String>) -> &str {
    v.as_deref().unwrap_or("")
}

pub(crate) fn slice<T>(v: &Option<Vec<T>>) -> &[T] {
    v.as_deref().unwrap_or(&[])
}

/// Go's `%#v` of a `[]string`.
pub(crate) fn go_strings(v: &[String]) -> String {
    if v.is_empty() {
        return "[]string(nil)".to_string();
    }
    format!(
        "[]string{{{}}}",
        v.iter().map(|x| quote(x)).collect::<Vec<_>>().join(", ")
    )
}

/// Go's `%#v` of a `map[string]string`.
pub(crate) fn go_map(m: Option<&BTreeMap<String, String>>) -> String {
    match m {
        Some(m) if !m.is_empty() => {
            let body = m
                .iter()
                .map(|(k, v)| format!("{}:{}", quote(k), quote(v)))
                .collect::<Vec<_>>()
                .join(", ");
            format!("map[string]string{{{body}}}")
        }
        _ => "map[string]string(nil)".to_string(),
    }
}

/// Go's `%#v` of an `intstr.IntOrString`.
pub(crate) fn go_int_or_string(v: Option<&IntOrString>) -> String {
    match v {
        Some(IntOrString::String(s)) => format!(
            "intstr.IntOrString{{Type:1, IntVal:0, StrVal:{}}}",
            quote(s)
        ),
        Some(IntOrString::Int(i)) => {
            format!("intstr.IntOrString{{Type:0, IntVal:{i}, StrVal:\"\"}}")
        }
        None => "intstr.IntOrString{Type:0, IntVal:0, StrVal:\"\"}".to_string(),
    }
}

/// Go's `%#v` of a `metav1.LabelSelector` (what upstream's field errors print for a selector).
/// A list or map that is absent prints as Go's nil (`[]string(nil)`); one that is present but
/// empty (`values: []` in the request) prints as Go's empty literal (`[]string{}`).
pub(crate) fn go_label_selector(sel: Option<&LabelSelector>) -> String {
    let Some(sel) = sel else {
        return "null".to_string();
    };
    let strings = |v: &Option<Vec<String>>| match v {
        Some(v) if v.is_empty() => "[]string{}".to_string(),
        other => go_strings(slice(other)),
    };
    let exprs = match sel.match_expressions.as_deref() {
        None => "[]v1.LabelSelectorRequirement(nil)".to_string(),
        Some(e) => {
            let items = e
                .iter()
                .map(|r| {
                    format!(
                        "v1.LabelSelectorRequirement{{Key:{}, Operator:{}, Values:{}}}",
                        quote(&r.key),
                        quote(&r.operator),
                        strings(&r.values)
                    )
                })
                .collect::<Vec<_>>()
                .join(", ");
            format!("[]v1.LabelSelectorRequirement{{{items}}}")
        }
    };
    let labels = match &sel.match_labels {
        Some(m) if m.is_empty() => "map[string]string{}".to_string(),
        other => go_map(other.as_ref()),
    };
    format!("v1.LabelSelector{{MatchLabels:{labels}, MatchExpressions:{exprs}}}")
}

/// ValidateNonnegativeField.
pub(crate) fn nonneg(value: i64, path: &Path) -> ErrorList {
    if value < 0 {
        vec![FieldError::invalid(
            path,
            value.to_string(),
            IS_NEGATIVE_ERROR_MSG,
        )]
    } else {
        Vec::new()
    }
}

/// Invalid errors for each message of a string check.
pub(crate) fn invalid_each(path: &Path, value: &str, msgs: Vec<String>) -> ErrorList {
    msgs.into_iter()
        .map(|m| FieldError::invalid_str(path, value, m))
        .collect()
}

pub(crate) fn dns1123_label(value: &str, path: &Path) -> ErrorList {
    invalid_each(path, value, names::is_dns1123_label(value))
}

pub(crate) fn dns1123_subdomain(value: &str, path: &Path) -> ErrorList {
    invalid_each(path, value, names::is_dns1123_subdomain(value))
}

pub(crate) fn qualified_name(value: &str, path: &Path) -> ErrorList {
    invalid_each(path, value, names::is_qualified_name(value))
}

/// ValidateImmutableField for values rendered by the caller.
pub(crate) fn immutable<T: PartialEq>(
    new: &T,
    old: &T,
    path: &Path,
    rendered: impl FnOnce() -> String,
) -> ErrorList {
    if new != old {
        vec![FieldError::invalid(
            path,
            rendered(),
            FIELD_IMMUTABLE_ERROR_MSG,
        )]
    } else {
        Vec::new()
    }
}

/// ValidateLabels: keys are qualified names, values label values.
pub fn validate_labels(labels: Option<&BTreeMap<String, String>>, path: &Path) -> ErrorList {
    let mut errs = Vec::new();
    for (k, v) in labels.into_iter().flatten() {
        errs.extend(qualified_name(k, path));
        errs.extend(invalid_each(path, v, names::is_valid_label_value(v)));
    }
    errs
}

/// ValidateAnnotations: keys are qualified names (case-insensitive), total size at most 256 KiB.
pub(crate) fn validate_annotations(
    annotations: Option<&BTreeMap<String, String>>,
    path: &Path,
) -> ErrorList {
    let mut errs = Vec::new();
    let mut total = 0usize;
    for (k, v) in annotations.into_iter().flatten() {
        for m in names::is_qualified_name(&k.to_lowercase()) {
            errs.push(FieldError::invalid_str(path, k, m));
        }
        total += k.len() + v.len();
    }
    if total > TOTAL_ANNOTATION_SIZE_LIMIT_B {
        errs.push(FieldError::too_long(path, TOTAL_ANNOTATION_SIZE_LIMIT_B));
    }
    errs
}

fn validate_owner_references(meta: &ObjectMeta, path: &Path) -> ErrorList {
    let mut errs = Vec::new();
    let mut first_controller: Option<String> = None;
    let refs = slice(&meta.owner_references);
    for r in refs {
        let (group, version) = match r.api_version.rsplit_once('/') {
            Some((g, v)) => (g, v),
            None => ("", r.api_version.as_str()),
        };
        if version.is_empty() {
            errs.push(FieldError::invalid_str(
                path.child("apiVersion"),
                &r.api_version,
                "version must not be empty",
            ));
        }
        if r.kind.is_empty() {
            errs.push(FieldError::invalid_str(
                path.child("kind"),
                &r.kind,
                "must not be empty",
            ));
        }
        if r.name.is_empty() {
            errs.push(FieldError::invalid_str(
                path.child("name"),
                &r.name,
                "must not be empty",
            ));
        }
        if r.uid.is_empty() {
            errs.push(FieldError::invalid_str(
                path.child("uid"),
                &r.uid,
                "must not be empty",
            ));
        }
        if group.is_empty() && version == "v1" && r.kind == "Event" {
            errs.push(FieldError::invalid(
                path,
                format!(
                    "v1.OwnerReference{{APIVersion:{}, Kind:{}, Name:{}, UID:{}}}",
                    quote(&r.api_version),
                    quote(&r.kind),
                    quote(&r.name),
                    quote(&r.uid)
                ),
                "/v1, Kind=Event is disallowed from being an owner",
            ));
        }
        if r.controller == Some(true) {
            let current = format!("{}/{}", r.kind, r.name);
            match &first_controller {
                Some(first) => errs.push(FieldError::invalid(
                    path,
                    "[]v1.OwnerReference{...}",
                    format!(
                        "Only one reference can have Controller set to true. Found \"true\" in references for {first} and {current}"
                    ),
                )),
                None => first_controller = Some(current),
            }
        }
    }
    errs
}

fn validate_finalizers(meta: &ObjectMeta, path: &Path) -> ErrorList {
    let mut errs = Vec::new();
    let finalizers = slice(&meta.finalizers);
    for f in finalizers {
        errs.extend(qualified_name(f, path));
    }
    if finalizers.iter().any(|f| f == "orphan")
        && finalizers.iter().any(|f| f == "foregroundDeletion")
    {
        errs.push(FieldError::invalid(
            path,
            go_strings(finalizers),
            "finalizer orphan and foregroundDeletion cannot be both set",
        ));
    }
    // Core's extra rule: a finalizer without a prefix must be one Kubernetes knows.
    for (i, f) in finalizers.iter().enumerate() {
        errs.extend(kube_finalizer_name(f, &path.index(i)));
    }
    errs
}

/// validateKubeFinalizerName.
pub(crate) fn kube_finalizer_name(f: &str, path: &Path) -> ErrorList {
    if !f.contains('/') && !STANDARD_FINALIZERS.contains(&f) {
        return vec![FieldError::invalid_str(
            path,
            f,
            "name is neither a standard finalizer name nor is it fully qualified",
        )];
    }
    Vec::new()
}

fn validate_meta_common(meta: &ObjectMeta, namespaced: bool, path: &Path) -> ErrorList {
    let mut errs = Vec::new();
    let ns = s(&meta.namespace);
    if namespaced {
        if ns.is_empty() {
            errs.push(FieldError::required(path.child("namespace"), ""));
        } else {
            errs.extend(invalid_each(
                &path.child("namespace"),
                ns,
                names::is_dns1123_label(ns),
            ));
        }
    } else if !ns.is_empty() {
        errs.push(FieldError::forbidden(
            path.child("namespace"),
            "not allowed on this type",
        ));
    }
    errs.extend(nonneg(
        meta.generation.unwrap_or(0),
        &path.child("generation"),
    ));
    errs.extend(validate_labels(meta.labels.as_ref(), &path.child("labels")));
    errs.extend(validate_annotations(
        meta.annotations.as_ref(),
        &path.child("annotations"),
    ));
    errs.extend(validate_owner_references(
        meta,
        &path.child("ownerReferences"),
    ));
    errs.extend(validate_finalizers(meta, &path.child("finalizers")));
    errs
}

/// ValidateObjectMeta (create): name (or generateName) by the kind's rule, namespace by scope,
/// labels, annotations, owner references and finalizers.
pub fn validate_object_meta(
    meta: &ObjectMeta,
    namespaced: bool,
    name_fn: NameFn,
    path: &Path,
) -> ErrorList {
    let mut errs = Vec::new();
    let generate_name = s(&meta.generate_name);
    if !generate_name.is_empty() {
        for m in name_fn(generate_name, true) {
            errs.push(FieldError::invalid_str(
                path.child("generateName"),
                generate_name,
                m,
            ));
        }
    }
    let name = s(&meta.name);
    if name.is_empty() {
        errs.push(FieldError::required(
            path.child("name"),
            "name or generateName is required",
        ));
    } else {
        for m in name_fn(name, false) {
            errs.push(FieldError::invalid_str(path.child("name"), name, m));
        }
    }
    errs.extend(validate_meta_common(meta, namespaced, path));
    errs
}

/// ValidateObjectMetaUpdate: identity fields stay as they were, and the new metadata is valid.
pub fn validate_object_meta_update(new: &ObjectMeta, old: &ObjectMeta, path: &Path) -> ErrorList {
    let mut errs = Vec::new();
    if old.deletion_timestamp.is_some() {
        let old_set: BTreeSet<&String> = slice(&old.finalizers).iter().collect();
        let extra: BTreeSet<&String> = slice(&new.finalizers)
            .iter()
            .filter(|f| !old_set.contains(f))
            .collect();
        if !extra.is_empty() {
            let list = extra
                .iter()
                .map(|f| quote(f))
                .collect::<Vec<_>>()
                .join(", ");
            errs.push(FieldError::forbidden(
                path.child("finalizers"),
                format!("no new finalizers can be added if the object is being deleted, found new finalizers []string{{{list}}}"),
            ));
        }
    }
    if s(&new.resource_version).is_empty() {
        errs.push(FieldError::invalid_str(
            path.child("resourceVersion"),
            "",
            "must be specified for an update",
        ));
    }
    let (ng, og) = (new.generation.unwrap_or(0), old.generation.unwrap_or(0));
    if ng < og {
        errs.push(FieldError::invalid(
            path.child("generation"),
            ng.to_string(),
            "must not be decremented",
        ));
    }
    errs.extend(immutable(
        &s(&new.name),
        &s(&old.name),
        &path.child("name"),
        || quote(s(&new.name)),
    ));
    errs.extend(immutable(
        &s(&new.namespace),
        &s(&old.namespace),
        &path.child("namespace"),
        || quote(s(&new.namespace)),
    ));
    errs.extend(immutable(
        &s(&new.uid),
        &s(&old.uid),
        &path.child("uid"),
        || quote(s(&new.uid)),
    ));
    errs.extend(immutable(
        &new.creation_timestamp,
        &old.creation_timestamp,
        &path.child("creationTimestamp"),
        || {
            new.creation_timestamp
                .as_ref()
                .map(|t| format!("\"{}\"", t.0))
                .unwrap_or_else(|| "\"null\"".to_string())
        },
    ));
    errs.extend(immutable(
        &new.deletion_timestamp,
        &old.deletion_timestamp,
        &path.child("deletionTimestamp"),
        || {
            new.deletion_timestamp
                .as_ref()
                .map(|t| format!("\"{}\"", t.0))
                .unwrap_or_else(|| "null".to_string())
        },
    ));
    errs.extend(immutable(
        &new.deletion_grace_period_seconds,
        &old.deletion_grace_period_seconds,
        &path.child("deletionGracePeriodSeconds"),
        || {
            new.deletion_grace_period_seconds
                .map(|v| v.to_string())
                .unwrap_or_else(|| "null".to_string())
        },
    ));
    errs.extend(validate_labels(new.labels.as_ref(), &path.child("labels")));
    errs.extend(validate_annotations(
        new.annotations.as_ref(),
        &path.child("annotations"),
    ));
    errs.extend(validate_owner_references(
        new,
        &path.child("ownerReferences"),
    ));
    errs.extend(validate_finalizers(new, &path.child("finalizers")));
    errs
}

/// Metadata of a create, or of an update when `old` is given.
pub(crate) fn meta(
    new: &ObjectMeta,
    old: Option<&ObjectMeta>,
    namespaced: bool,
    name_fn: NameFn,
) -> ErrorList {
    let path = Path::new("metadata");
    match old {
        None => validate_object_meta(new, namespaced, name_fn, &path),
        Some(old) => {
            let mut errs = validate_object_meta_update(new, old, &path);
            // Upstream's update functions validate the whole new object again, name included,
            // but the name cannot change, so only the remaining create rules are repeated here.
            if s(&new.name).is_empty() {
                errs.push(FieldError::required(
                    path.child("name"),
                    "name or generateName is required",
                ));
            }
            let ns = s(&new.namespace);
            if namespaced && ns.is_empty() {
                errs.push(FieldError::required(path.child("namespace"), ""));
            }
            errs
        }
    }
}

/// ValidateLabelSelector (strict: label values in expressions are checked too): the
/// `matchLabels` first, then each expression.
pub fn validate_label_selector(sel: Option<&LabelSelector>, path: &Path) -> ErrorList {
    let mut errs = Vec::new();
    let Some(sel) = sel else { return errs };
    errs.extend(validate_labels(
        sel.match_labels.as_ref(),
        &path.child("matchLabels"),
    ));
    for (i, r) in slice(&sel.match_expressions).iter().enumerate() {
        let p = path.child("matchExpressions").index(i);
        let values = slice(&r.values);
        match r.operator.as_str() {
            "In" | "NotIn" => {
                if values.is_empty() {
                    errs.push(FieldError::required(
                        p.child("values"),
                        "must be specified when `operator` is 'In' or 'NotIn'",
                    ));
                }
            }
            "Exists" | "DoesNotExist" => {
                if !values.is_empty() {
                    errs.push(FieldError::forbidden(
                        p.child("values"),
                        "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                    ));
                }
            }
            other => errs.push(FieldError::invalid_str(
                p.child("operator"),
                other,
                "not a valid selector operator",
            )),
        }
        errs.extend(qualified_name(&r.key, &p.child("key")));
        for (j, v) in values.iter().enumerate() {
            errs.extend(invalid_each(
                &p.child("values").index(j),
                v,
                names::is_valid_label_value(v),
            ));
        }
    }
    errs
}

/// True when the selector selects nothing in particular (no labels and no expressions).
pub(crate) fn selector_is_empty(sel: &LabelSelector) -> bool {
    slice(&sel.match_expressions).is_empty()
        && sel.match_labels.as_ref().is_none_or(|m| m.is_empty())
}

/// Upstream's `metav1.LabelSelectorAsSelector`: the selector as a matcher, or `None` when it
/// does not parse (an unknown operator, a bad key or value, values where the operator takes none
/// or none where it needs some). A missing selector selects nothing.
pub(crate) fn parse_selector(
    sel: Option<&LabelSelector>,
) -> Option<ferry_selectors::labels::LabelSelector> {
    ferry_selectors::labels::from_optional_label_selector(sel).ok()
}

/// The check the workload kinds make with a selector that parsed: a non-empty selector must
/// select the pod template's labels.
pub(crate) fn template_labels_match(
    selector: &ferry_selectors::labels::LabelSelector,
    template: &k8s_openapi::api::core::v1::PodTemplateSpec,
    template_path: &Path,
) -> ErrorList {
    let empty = BTreeMap::new();
    let labels = template.metadata.as_ref().and_then(|m| m.labels.as_ref());
    if selector.is_empty() || selector.matches(labels.unwrap_or(&empty)) {
        return Vec::new();
    }
    vec![FieldError::invalid(
        template_path.child("metadata").child("labels"),
        go_map(labels),
        "`selector` does not match template `labels`",
    )]
}

/// ValidatePortNumOrName (targetPort, probe ports).
pub(crate) fn port_num_or_name(port: Option<&IntOrString>, path: &Path) -> ErrorList {
    match port {
        Some(IntOrString::Int(n)) => names::is_valid_port_num(i64::from(*n))
            .into_iter()
            .map(|m| FieldError::invalid(path, n.to_string(), m))
            .collect(),
        Some(IntOrString::String(name)) if name.is_empty() => vec![FieldError::required(path, "")],
        Some(IntOrString::String(name)) => {
            invalid_each(path, name, names::is_valid_port_name(name))
        }
        None => names::is_valid_port_num(0)
            .into_iter()
            .map(|m| FieldError::invalid(path, "0", m))
            .collect(),
    }
}

static ALLOW_LOOPBACK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Ferry's loopback pod network (`ferry up` on one machine) puts pod and service addresses in
/// 127.0.0.0/8, so endpoint and external IPs there must be accepted. Upstream rejects them; this
/// switch is process-wide and off by default.
pub fn allow_loopback_addresses(allow: bool) {
    ALLOW_LOOPBACK.store(allow, std::sync::atomic::Ordering::Relaxed);
}

/// Whether [`allow_loopback_addresses`] is on.
pub fn loopback_addresses_allowed() -> bool {
    ALLOW_LOOPBACK.load(std::sync::atomic::Ordering::Relaxed)
}

/// ValidateNonSpecialIP: not unspecified, loopback, link-local or link-local multicast.
pub(crate) fn non_special_ip(ip: &str, path: &Path) -> ErrorList {
    use std::net::IpAddr;
    let Some(addr) = names::parse_ip_sloppy(ip) else {
        return vec![FieldError::invalid_str(
            path,
            ip,
            "must be a valid IP address",
        )];
    };
    let mut errs = Vec::new();
    let (unspecified, loopback, link_local, ll_multicast) = match addr {
        IpAddr::V4(a) => {
            let o = a.octets();
            (
                a.is_unspecified(),
                a.is_loopback(),
                a.is_link_local(),
                o[0] == 224 && o[1] == 0 && o[2] == 0,
            )
        }
        IpAddr::V6(a) => {
            let seg = a.segments();
            (
                a.is_unspecified(),
                a.is_loopback(),
                (seg[0] & 0xffc0) == 0xfe80,
                (seg[0] & 0xff0f) == 0xff02,
            )
        }
    };
    if unspecified {
        errs.push(FieldError::invalid_str(
            path,
            ip,
            format!("may not be unspecified ({ip})"),
        ));
    }
    if loopback && !ALLOW_LOOPBACK.load(std::sync::atomic::Ordering::Relaxed) {
        errs.push(FieldError::invalid_str(
            path,
            ip,
            "may not be in the loopback range (127.0.0.0/8, ::1/128)",
        ));
    }
    if link_local {
        errs.push(FieldError::invalid_str(
            path,
            ip,
            "may not be in the link-local range (169.254.0.0/16, fe80::/10)",
        ));
    }
    if ll_multicast {
        errs.push(FieldError::invalid_str(
            path,
            ip,
            "may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)",
        ));
    }
    errs
}

/// Protocol of a port: required, TCP / UDP / SCTP.
pub(crate) fn port_protocol(protocol: Option<&str>, path: &Path) -> ErrorList {
    match protocol.unwrap_or("") {
        "" => vec![FieldError::required(path, "")],
        p if SUPPORTED_PORT_PROTOCOLS.contains(&p) => Vec::new(),
        p => vec![FieldError::not_supported(path, p, SUPPORTED_PORT_PROTOCOLS)],
    }
}
