//! Deployment and ReplicaSet validation (upstream `pkg/apis/apps/validation`).

use k8s_openapi::api::apps::v1 as apps;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::common::{
    go_int_or_string, go_label_selector, immutable, meta, nonneg, parse_selector, s,
    selector_is_empty, template_labels_match, validate_label_selector, validate_object_meta_update,
};
use super::pod::validate_pod_template_spec;
use ferry_apimachinery::errors::{ErrorList, FieldError, Path};
use ferry_apimachinery::names;

/// ValidatePodTemplateSpecForReplicaSet: the template matches the (parsed) selector, restarts
/// Always.
fn template_for_replica_set(
    template: Option<&core::PodTemplateSpec>,
    selector: &ferry_selectors::labels::LabelSelector,
    path: &Path,
) -> ErrorList {
    let Some(t) = template else {
        return vec![FieldError::required(path, "")];
    };
    let mut errs = template_labels_match(selector, t, path);
    errs.extend(validate_pod_template_spec(t, path));
    let spec = t.spec.clone().unwrap_or_default();
    let rp = s(&spec.restart_policy);
    if rp != "Always" {
        errs.push(FieldError::not_supported(
            path.child("spec").child("restartPolicy"),
            rp,
            &["Always"],
        ));
    }
    if spec.active_deadline_seconds.is_some() {
        errs.push(FieldError::forbidden(
            path.child("spec").child("activeDeadlineSeconds"),
            "activeDeadlineSeconds in ReplicaSet is not Supported",
        ));
    }
    errs
}

/// The selector and template checks Deployments and ReplicaSets share (upstream
/// `ValidateDeploymentSpec` / `ValidateReplicaSetSpec`): the selector's own field errors (and
/// "empty selector is invalid for deployment", which upstream says for ReplicaSets too); then,
/// when the selector does not parse (`LabelSelectorAsSelector` fails), one "invalid label
/// selector" error and none of the template's checks; otherwise the template's checks with the
/// parsed selector.
fn selector_and_template(
    selector: &LabelSelector,
    template: Option<&core::PodTemplateSpec>,
    path: &Path,
) -> ErrorList {
    let sp = path.child("selector");
    let mut errs = validate_label_selector(Some(selector), &sp);
    if selector_is_empty(selector) {
        errs.push(FieldError::invalid(
            &sp,
            go_label_selector(Some(selector)),
            "empty selector is invalid for deployment",
        ));
    }
    match parse_selector(Some(selector)) {
        None => errs.push(FieldError::invalid(
            &sp,
            go_label_selector(Some(selector)),
            "invalid label selector",
        )),
        Some(parsed) => errs.extend(template_for_replica_set(
            template,
            &parsed,
            &path.child("template"),
        )),
    }
    errs
}

fn positive_int_or_percent(v: Option<&IntOrString>, path: &Path) -> ErrorList {
    match v {
        Some(IntOrString::String(p)) => names::is_valid_percent(p)
            .into_iter()
            .map(|m| FieldError::invalid(path, go_int_or_string(v), m))
            .collect(),
        Some(IntOrString::Int(i)) => nonneg(i64::from(*i), path),
        None => Vec::new(),
    }
}

fn int_or_percent_value(v: Option<&IntOrString>) -> i64 {
    match v {
        Some(IntOrString::Int(i)) => i64::from(*i),
        Some(IntOrString::String(p)) => p
            .strip_suffix('%')
            .and_then(|d| d.parse().ok())
            .unwrap_or(0),
        None => 0,
    }
}

fn validate_strategy(strategy: Option<&apps::DeploymentStrategy>, path: &Path) -> ErrorList {
    let mut errs = Vec::new();
    let default = apps::DeploymentStrategy::default();
    let strategy = strategy.unwrap_or(&default);
    match s(&strategy.type_) {
        "Recreate" => {
            if strategy.rolling_update.is_some() {
                errs.push(FieldError::forbidden(
                    path.child("rollingUpdate"),
                    "may not be specified when strategy `type` is 'Recreate'",
                ));
            }
        }
        "RollingUpdate" => match &strategy.rolling_update {
            None => errs.push(FieldError::required(
                path.child("rollingUpdate"),
                "this should be defaulted and never be nil",
            )),
            Some(ru) => {
                let rp = path.child("rollingUpdate");
                let mu = ru.max_unavailable.as_ref();
                let ms = ru.max_surge.as_ref();
                errs.extend(positive_int_or_percent(mu, &rp.child("maxUnavailable")));
                errs.extend(positive_int_or_percent(ms, &rp.child("maxSurge")));
                if int_or_percent_value(mu) == 0 && int_or_percent_value(ms) == 0 {
                    errs.push(FieldError::invalid(
                        rp.child("maxUnavailable"),
                        go_int_or_string(mu),
                        "may not be 0 when `maxSurge` is 0",
                    ));
                }
                if let Some(IntOrString::String(p)) = mu
                    && p.strip_suffix('%')
                        .and_then(|d| d.parse::<i64>().ok())
                        .is_some_and(|v| v > 100)
                {
                    errs.push(FieldError::invalid(
                        rp.child("maxUnavailable"),
                        go_int_or_string(mu),
                        "must not be greater than 100%",
                    ));
                }
            }
        },
        other => errs.push(FieldError::not_supported(
            path,
            other,
            &["Recreate", "RollingUpdate"],
        )),
    }
    errs
}

fn deployment_spec(spec: &apps::DeploymentSpec, path: &Path) -> ErrorList {
    let mut errs = nonneg(
        i64::from(spec.replicas.unwrap_or(0)),
        &path.child("replicas"),
    );
    errs.extend(selector_and_template(
        &spec.selector,
        Some(&spec.template),
        path,
    ));
    errs.extend(validate_strategy(
        spec.strategy.as_ref(),
        &path.child("strategy"),
    ));
    let mrs = spec.min_ready_seconds.unwrap_or(0);
    errs.extend(nonneg(i64::from(mrs), &path.child("minReadySeconds")));
    if let Some(rhl) = spec.revision_history_limit {
        errs.extend(nonneg(i64::from(rhl), &path.child("revisionHistoryLimit")));
    }
    if let Some(pds) = spec.progress_deadline_seconds {
        errs.extend(nonneg(
            i64::from(pds),
            &path.child("progressDeadlineSeconds"),
        ));
        if pds <= mrs {
            errs.push(FieldError::invalid(
                path.child("progressDeadlineSeconds"),
                pds.to_string(),
                "must be greater than minReadySeconds",
            ));
        }
    }
    errs
}

pub(crate) fn deployment(d: &apps::Deployment, old: Option<&apps::Deployment>) -> ErrorList {
    let mut errs = meta(
        &d.metadata,
        old.map(|o| &o.metadata),
        true,
        names::name_is_dns_subdomain,
    );
    let spec = d.spec.clone();
    errs.extend(deployment_spec(&spec, &Path::new("spec")));
    if let Some(old) = old {
        let old_spec = old.spec.clone();
        errs.extend(immutable(
            &spec.selector,
            &old_spec.selector,
            &Path::new("spec").child("selector"),
            || go_label_selector(Some(&spec.selector)),
        ));
    }
    errs
}

pub(crate) fn replica_set(rs: &apps::ReplicaSet, old: Option<&apps::ReplicaSet>) -> ErrorList {
    let mut errs = meta(
        &rs.metadata,
        old.map(|o| &o.metadata),
        true,
        names::name_is_dns_subdomain,
    );
    let spec = rs.spec.clone();
    let path = Path::new("spec");
    errs.extend(nonneg(
        i64::from(spec.replicas.unwrap_or(0)),
        &path.child("replicas"),
    ));
    errs.extend(nonneg(
        i64::from(spec.min_ready_seconds.unwrap_or(0)),
        &path.child("minReadySeconds"),
    ));
    errs.extend(selector_and_template(
        &spec.selector,
        spec.template.as_ref(),
        &path,
    ));
    if let Some(old) = old {
        let old_spec = old.spec.clone();
        errs.extend(immutable(
            &spec.selector,
            &old_spec.selector,
            &path.child("selector"),
            || go_label_selector(Some(&spec.selector)),
        ));
    }
    errs
}

/// Status counts: non-negative and consistent with `replicas`.
fn counts(
    path: &Path,
    replicas: i32,
    named: &[(&str, Option<i32>)],
    ready: i32,
    available: i32,
    observed_generation: i64,
) -> ErrorList {
    let mut errs = nonneg(i64::from(replicas), &path.child("replicas"));
    for (name, v) in named {
        errs.extend(nonneg(i64::from(v.unwrap_or(0)), &path.child(name)));
    }
    errs.extend(nonneg(
        observed_generation,
        &path.child("observedGeneration"),
    ));
    let msg = "cannot be greater than status.replicas";
    for (name, v) in named {
        if matches!(
            *name,
            "updatedReplicas" | "readyReplicas" | "availableReplicas" | "fullyLabeledReplicas"
        ) && v.unwrap_or(0) > replicas
        {
            errs.push(FieldError::invalid(
                path.child(name),
                v.unwrap_or(0).to_string(),
                msg,
            ));
        }
    }
    if available > ready {
        errs.push(FieldError::invalid(
            path.child("availableReplicas"),
            available.to_string(),
            "cannot be greater than readyReplicas",
        ));
    }
    errs
}

pub(crate) fn deployment_status(d: &apps::Deployment, old: &apps::Deployment) -> ErrorList {
    let mut errs = validate_object_meta_update(&d.metadata, &old.metadata, &Path::new("metadata"));
    let st = d.status.clone().unwrap_or_default();
    errs.extend(counts(
        &Path::new("status"),
        st.replicas.unwrap_or(0),
        &[
            ("updatedReplicas", st.updated_replicas),
            ("readyReplicas", st.ready_replicas),
            ("availableReplicas", st.available_replicas),
            ("unavailableReplicas", st.unavailable_replicas),
            ("terminatingReplicas", st.terminating_replicas),
            ("collisionCount", st.collision_count),
        ],
        st.ready_replicas.unwrap_or(0),
        st.available_replicas.unwrap_or(0),
        st.observed_generation.unwrap_or(0),
    ));
    errs
}

pub(crate) fn replica_set_status(rs: &apps::ReplicaSet, old: &apps::ReplicaSet) -> ErrorList {
    let mut errs = validate_object_meta_update(&rs.metadata, &old.metadata, &Path::new("metadata"));
    let st = rs.status.clone().unwrap_or_default();
    errs.extend(counts(
        &Path::new("status"),
        st.replicas,
        &[
            ("fullyLabeledReplicas", st.fully_labeled_replicas),
            ("readyReplicas", st.ready_replicas),
            ("availableReplicas", st.available_replicas),
            ("terminatingReplicas", st.terminating_replicas),
        ],
        st.ready_replicas.unwrap_or(0),
        st.available_replicas.unwrap_or(0),
        st.observed_generation.unwrap_or(0),
    ));
    errs
}
