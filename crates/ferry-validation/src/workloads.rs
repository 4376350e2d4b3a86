//! Validation of StatefulSet, DaemonSet, ControllerRevision (`pkg/apis/apps/validation`), Job and
//! CronJob (`pkg/apis/batch/validation`) and PodDisruptionBudget (`pkg/apis/policy/validation`).

use k8s_openapi::api::apps::v1 as apps;
use k8s_openapi::api::batch::v1 as batch;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::policy::v1 as policy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::common::{
    go_int_or_string, go_label_selector, immutable, meta, nonneg, parse_selector, s,
    selector_is_empty, template_labels_match, validate_annotations, validate_label_selector,
    validate_labels, validate_object_meta_update,
};
use super::pod::validate_pod_template_spec;
use ferry_apimachinery::errors::{ErrorList, FieldError, Path};
use ferry_apimachinery::names;

/// The label a Job's pods carry with the Job's uid (the selector a Job gets by default).
pub const CONTROLLER_UID_LABEL: &str = "batch.kubernetes.io/controller-uid";
/// The other labels a Job's generated selector must select (upstream `batch.JobNameLabel`,
/// `batch.LegacyControllerUidLabel`, `batch.LegacyJobNameLabel`).
const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";
const LEGACY_CONTROLLER_UID_LABEL: &str = "controller-uid";
const LEGACY_JOB_NAME_LABEL: &str = "job-name";

fn int_or_percent(v: Option<&IntOrString>, path: &Path) -> ErrorList {
    match v {
        Some(IntOrString::String(p)) => names::is_valid_percent(p)
            .into_iter()
            .map(|m| FieldError::invalid(path, go_int_or_string(v), m))
            .collect(),
        Some(IntOrString::Int(i)) => nonneg(i64::from(*i), path),
        None => Vec::new(),
    }
}

fn percent_over_100(v: Option<&IntOrString>, path: &Path) -> ErrorList {
    if let Some(IntOrString::String(p)) = v
        && p.strip_suffix('%')
            .and_then(|d| d.parse::<i64>().ok())
            .is_some_and(|n| n > 100)
    {
        return vec![FieldError::invalid(
            path,
            go_int_or_string(v),
            "must not be greater than 100%",
        )];
    }
    Vec::new()
}

fn ios_value(v: Option<&IntOrString>) -> i64 {
    match v {
        Some(IntOrString::Int(i)) => i64::from(*i),
        Some(IntOrString::String(p)) => p
            .strip_suffix('%')
            .and_then(|d| d.parse().ok())
            .unwrap_or(0),
        None => 0,
    }
}

/// The selector's own checks: its field errors (`ValidateLabelSelector`) and the rule that it
/// may not be empty.
fn selector_checks(selector: &LabelSelector, sp: &Path, kind: &str) -> ErrorList {
    let mut errs = validate_label_selector(Some(selector), sp);
    if selector_is_empty(selector) {
        errs.push(FieldError::invalid(
            sp,
            go_label_selector(Some(selector)),
            format!("empty selector is invalid for {kind}"),
        ));
    }
    errs
}

/// StatefulSet's selector and template (upstream `ValidateStatefulSetSpec`): the selector's
/// own checks; then, when it does not parse, one `spec.selector: Invalid value: …` error with no
/// detail (upstream gives none) in place of the template's checks
/// (`ValidatePodTemplateSpecForStatefulSet`: labels match, the template's metadata — Ferry
/// checks the whole pod template there); the restart policy is checked either way.
fn stateful_set_selector_and_template(spec: &apps::StatefulSetSpec, path: &Path) -> ErrorList {
    let sp = path.child("selector");
    let tp = path.child("template");
    let mut errs = selector_checks(&spec.selector, &sp, "statefulset");
    match parse_selector(Some(&spec.selector)) {
        None => errs.push(FieldError::invalid(
            &sp,
            go_label_selector(Some(&spec.selector)),
            "",
        )),
        Some(parsed) => {
            errs.extend(template_labels_match(&parsed, &spec.template, &tp));
            // Upstream's ValidatePodTemplateSpecForStatefulSet checks only the template's labels
            // and annotations, not its pod spec: containers mount volumeClaimTemplates, which
            // become pod volumes only when the controller makes each pod (and the pod is
            // validated then).
            let meta = spec.template.metadata.as_ref();
            errs.extend(validate_labels(
                meta.and_then(|m| m.labels.as_ref()),
                &tp.child("labels"),
            ));
            errs.extend(validate_annotations(
                meta.and_then(|m| m.annotations.as_ref()),
                &tp.child("annotations"),
            ));
        }
    }
    errs.extend(restart_policy(&spec.template, &tp, &["Always"]));
    errs
}

/// DaemonSet's selector and template (upstream `ValidateDaemonSetSpec`): the selector's field
/// errors; the template-labels check only when the selector parses (a selector that does not
/// parse adds no error of its own); the empty-selector rule; the pod template and its restart
/// policy always.
fn daemon_set_selector_and_template(spec: &apps::DaemonSetSpec, path: &Path) -> ErrorList {
    let sp = path.child("selector");
    let tp = path.child("template");
    let mut errs = validate_label_selector(Some(&spec.selector), &sp);
    if let Some(parsed) = parse_selector(Some(&spec.selector)) {
        errs.extend(template_labels_match(&parsed, &spec.template, &tp));
    }
    if selector_is_empty(&spec.selector) {
        errs.push(FieldError::invalid(
            &sp,
            go_label_selector(Some(&spec.selector)),
            "empty selector is invalid for daemonset",
        ));
    }
    errs.extend(validate_pod_template_spec(&spec.template, &tp));
    errs.extend(restart_policy(&spec.template, &tp, &["Always"]));
    errs
}

fn restart_policy(template: &core::PodTemplateSpec, tp: &Path, allowed: &[&str]) -> ErrorList {
    let mut errs = Vec::new();
    let spec = template.spec.clone().unwrap_or_default();
    let rp = s(&spec.restart_policy);
    if !allowed.contains(&rp) {
        errs.push(FieldError::not_supported(
            tp.child("spec").child("restartPolicy"),
            rp,
            allowed,
        ));
    }
    errs
}

/// A Job's restart policy (upstream `validateJobSpec`): `Always` (or none) is reported as a
/// missing value, anything but `OnFailure`/`Never` as unsupported, and with a pod failure policy
/// only `Never` is allowed.
fn job_restart_policy(spec: &batch::JobSpec, tp: &Path) -> ErrorList {
    let rp = spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("");
    let path = tp.child("spec").child("restartPolicy");
    match rp {
        "" | "Always" => vec![FieldError::required(
            path,
            "valid values: \"OnFailure\", \"Never\"",
        )],
        "OnFailure" | "Never" => {
            if spec.pod_failure_policy.is_some() && rp != "Never" {
                vec![FieldError::invalid_str(
                    path,
                    rp,
                    "only \"Never\" is supported when podFailurePolicy is specified",
                )]
            } else {
                Vec::new()
            }
        }
        other => vec![FieldError::not_supported(
            path,
            other,
            &["OnFailure", "Never"],
        )],
    }
}

fn no_active_deadline(template: &core::PodTemplateSpec, tp: &Path, what: &str) -> ErrorList {
    if template
        .spec
        .as_ref()
        .is_some_and(|s| s.active_deadline_seconds.is_some())
    {
        vec![FieldError::forbidden(
            tp.child("spec").child("activeDeadlineSeconds"),
            format!("activeDeadlineSeconds in {what} is not Supported"),
        )]
    } else {
        Vec::new()
    }
}

// ---- StatefulSet ----

fn stateful_set_spec(spec: &apps::StatefulSetSpec, path: &Path) -> ErrorList {
    let mut errs = Vec::new();
    let pmp = s(&spec.pod_management_policy);
    if !matches!(pmp, "OrderedReady" | "Parallel") {
        errs.push(if pmp.is_empty() {
            FieldError::required(path.child("podManagementPolicy"), "")
        } else {
            FieldError::invalid_str(
                path.child("podManagementPolicy"),
                pmp,
                "must be 'OrderedReady' or 'Parallel'",
            )
        });
    }
    let us = spec.update_strategy.clone().unwrap_or_default();
    let usp = path.child("updateStrategy");
    match s(&us.type_) {
        "" => errs.push(FieldError::required(usp.clone(), "")),
        "OnDelete" => {
            if us.rolling_update.is_some() {
                errs.push(FieldError::invalid(
                    usp.child("rollingUpdate"),
                    "{...}",
                    "only allowed for updateStrategy 'RollingUpdate'",
                ));
            }
        }
        "RollingUpdate" => {
            if let Some(ru) = &us.rolling_update {
                let rp = usp.child("rollingUpdate");
                errs.extend(nonneg(
                    i64::from(ru.partition.unwrap_or(0)),
                    &rp.child("partition"),
                ));
                if let Some(mu) = &ru.max_unavailable {
                    let mp = rp.child("maxUnavailable");
                    errs.extend(int_or_percent(Some(mu), &mp));
                    if ios_value(Some(mu)) == 0 {
                        errs.push(FieldError::invalid(
                            mp.clone(),
                            go_int_or_string(Some(mu)),
                            "must be greater than 0",
                        ));
                    }
                    errs.extend(percent_over_100(Some(mu), &mp));
                }
            }
        }
        other => errs.push(FieldError::invalid_str(
            usp.child("type"),
            other,
            "must be 'RollingUpdate' or 'OnDelete'",
        )),
    }
    if let Some(pol) = &spec.persistent_volume_claim_retention_policy {
        let pp = path.child("persistentVolumeClaimRetentionPolicy");
        for (f, v) in [
            ("whenDeleted", &pol.when_deleted),
            ("whenScaled", &pol.when_scaled),
        ] {
            let v = s(v);
            if !matches!(v, "Retain" | "Delete") {
                errs.push(FieldError::not_supported(
                    pp.child(f),
                    v,
                    &["Retain", "Delete"],
                ));
            }
        }
    }
    errs.extend(nonneg(
        i64::from(spec.replicas.unwrap_or(0)),
        &path.child("replicas"),
    ));
    if let Some(o) = &spec.ordinals {
        errs.extend(nonneg(
            i64::from(o.start.unwrap_or(0)),
            &path.child("ordinals").child("start"),
        ));
    }
    errs.extend(nonneg(
        i64::from(spec.min_ready_seconds.unwrap_or(0)),
        &path.child("minReadySeconds"),
    ));
    if let Some(rhl) = spec.revision_history_limit {
        errs.extend(nonneg(i64::from(rhl), &path.child("revisionHistoryLimit")));
    }
    if let Some(sn) = spec.service_name.as_deref().filter(|n| !n.is_empty()) {
        for m in names::is_dns1123_label(sn) {
            errs.push(FieldError::invalid_str(path.child("serviceName"), sn, m));
        }
    }
    errs.extend(stateful_set_selector_and_template(spec, path));
    errs.extend(no_active_deadline(
        &spec.template,
        &path.child("template"),
        "StatefulSet",
    ));
    for (i, pvc) in spec.volume_claim_templates.iter().flatten().enumerate() {
        let p = path.child("volumeClaimTemplates").index(i);
        let n = pvc.metadata.name.as_deref().unwrap_or("");
        if n.is_empty() {
            errs.push(FieldError::required(p.child("metadata").child("name"), ""));
        } else {
            for m in names::is_dns1123_subdomain(n) {
                errs.push(FieldError::invalid_str(
                    p.child("metadata").child("name"),
                    n,
                    m,
                ));
            }
        }
        let modes = pvc
            .spec
            .as_ref()
            .and_then(|s| s.access_modes.clone())
            .unwrap_or_default();
        if modes.is_empty() {
            errs.push(FieldError::required(
                p.child("spec").child("accessModes"),
                "at least 1 access mode is required",
            ));
        }
        for (j, m) in modes.iter().enumerate() {
            let allowed = [
                "ReadOnlyMany",
                "ReadWriteMany",
                "ReadWriteOnce",
                "ReadWriteOncePod",
            ];
            if !allowed.contains(&m.as_str()) {
                errs.push(FieldError::not_supported(
                    p.child("spec").child("accessModes").index(j),
                    m,
                    &allowed,
                ));
            }
        }
    }
    errs
}

pub fn stateful_set(o: &apps::StatefulSet, old: Option<&apps::StatefulSet>) -> ErrorList {
    let mut errs = meta(
        &o.metadata,
        old.map(|o| &o.metadata),
        true,
        names::name_is_dns_label,
    );
    let path = Path::new("spec");
    errs.extend(stateful_set_spec(&o.spec, &path));
    if let Some(old) = old {
        // Only replicas, ordinals, template, updateStrategy, revisionHistoryLimit,
        // persistentVolumeClaimRetentionPolicy and minReadySeconds may change.
        let mut a = o.spec.clone();
        let b = &old.spec;
        a.replicas = b.replicas;
        a.ordinals = b.ordinals.clone();
        a.template = b.template.clone();
        a.update_strategy = b.update_strategy.clone();
        a.revision_history_limit = b.revision_history_limit;
        a.persistent_volume_claim_retention_policy =
            b.persistent_volume_claim_retention_policy.clone();
        a.min_ready_seconds = b.min_ready_seconds;
        // volumeClaimTemplates compare without their (server-set) status.
        let strip = |v: &Option<Vec<core::PersistentVolumeClaim>>| {
            v.clone().map(|l| {
                l.into_iter()
                    .map(|mut p| {
                        p.status = None;
                        p
                    })
                    .collect::<Vec<_>>()
            })
        };
        if a.volume_claim_templates.is_some() && b.volume_claim_templates.is_some() {
            a.volume_claim_templates = strip(&a.volume_claim_templates);
        }
        let mut bb = b.clone();
        bb.volume_claim_templates = strip(&b.volume_claim_templates);
        a.volume_claim_templates = strip(&a.volume_claim_templates);
        if a != bb {
            errs.push(FieldError::forbidden(
                path,
                "updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'revisionHistoryLimit', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden",
            ));
        }
    }
    errs
}

fn status_counts(path: &Path, named: &[(&str, i64)]) -> ErrorList {
    named
        .iter()
        .flat_map(|(n, v)| nonneg(*v, &path.child(n)))
        .collect()
}

pub fn stateful_set_status(o: &apps::StatefulSet, old: &apps::StatefulSet) -> ErrorList {
    let mut errs = validate_object_meta_update(&o.metadata, &old.metadata, &Path::new("metadata"));
    let st = o.status.clone().unwrap_or_default();
    let p = Path::new("status");
    errs.extend(status_counts(
        &p,
        &[
            ("replicas", i64::from(st.replicas)),
            ("readyReplicas", i64::from(st.ready_replicas.unwrap_or(0))),
            (
                "currentReplicas",
                i64::from(st.current_replicas.unwrap_or(0)),
            ),
            (
                "updatedReplicas",
                i64::from(st.updated_replicas.unwrap_or(0)),
            ),
            (
                "availableReplicas",
                i64::from(st.available_replicas.unwrap_or(0)),
            ),
            ("observedGeneration", st.observed_generation.unwrap_or(0)),
            ("collisionCount", i64::from(st.collision_count.unwrap_or(0))),
        ],
    ));
    for (n, v) in [
        ("readyReplicas", st.ready_replicas),
        ("currentReplicas", st.current_replicas),
        ("updatedReplicas", st.updated_replicas),
    ] {
        if v.unwrap_or(0) > st.replicas {
            errs.push(FieldError::invalid(
                p.child(n),
                v.unwrap_or(0).to_string(),
                "cannot be greater than status.replicas",
            ));
        }
    }
    if st.available_replicas.unwrap_or(0) > st.ready_replicas.unwrap_or(0) {
        errs.push(FieldError::invalid(
            p.child("availableReplicas"),
            st.available_replicas.unwrap_or(0).to_string(),
            "cannot be greater than status.readyReplicas",
        ));
    }
    errs
}

// ---- DaemonSet ----

pub fn daemon_set(o: &apps::DaemonSet, old: Option<&apps::DaemonSet>) -> ErrorList {
    let mut errs = meta(
        &o.metadata,
        old.map(|o| &o.metadata),
        true,
        names::name_is_dns_subdomain,
    );
    let spec = &o.spec;
    let path = Path::new("spec");
    errs.extend(daemon_set_selector_and_template(spec, &path));
    errs.extend(no_active_deadline(
        &spec.template,
        &path.child("template"),
        "DaemonSet",
    ));
    errs.extend(nonneg(
        i64::from(spec.min_ready_seconds.unwrap_or(0)),
        &path.child("minReadySeconds"),
    ));
    if let Some(rhl) = spec.revision_history_limit {
        errs.extend(nonneg(i64::from(rhl), &path.child("revisionHistoryLimit")));
    }
    let us = spec.update_strategy.clone().unwrap_or_default();
    let usp = path.child("updateStrategy");
    match s(&us.type_) {
        "OnDelete" => {}
        "RollingUpdate" => match &us.rolling_update {
            None => errs.push(FieldError::required(usp.child("rollingUpdate"), "")),
            Some(ru) => {
                let rp = usp.child("rollingUpdate");
                let mu = ru.max_unavailable.as_ref();
                let ms = ru.max_surge.as_ref();
                errs.extend(int_or_percent(mu, &rp.child("maxUnavailable")));
                errs.extend(int_or_percent(ms, &rp.child("maxSurge")));
                errs.extend(percent_over_100(mu, &rp.child("maxUnavailable")));
                errs.extend(percent_over_100(ms, &rp.child("maxSurge")));
                let (u, sg) = (ios_value(mu), ios_value(ms));
                if u == 0 && sg == 0 {
                    errs.push(FieldError::invalid(
                        rp.child("maxUnavailable"),
                        go_int_or_string(mu),
                        "may not be 0 when `maxSurge` is 0",
                    ));
                }
                if u != 0 && sg != 0 {
                    errs.push(FieldError::invalid(
                        rp.child("maxSurge"),
                        go_int_or_string(ms),
                        "may not be set when maxUnavailable is non-zero",
                    ));
                }
            }
        },
        other => errs.push(FieldError::not_supported(
            usp.child("type"),
            other,
            &["OnDelete", "RollingUpdate"],
        )),
    }
    if let Some(old) = old {
        errs.extend(immutable(
            &spec.selector,
            &old.spec.selector,
            &path.child("selector"),
            || go_label_selector(Some(&spec.selector)),
        ));
    }
    errs
}

pub fn daemon_set_status(o: &apps::DaemonSet, old: &apps::DaemonSet) -> ErrorList {
    let mut errs = validate_object_meta_update(&o.metadata, &old.metadata, &Path::new("metadata"));
    let st = o.status.clone().unwrap_or_default();
    errs.extend(status_counts(
        &Path::new("status"),
        &[
            (
                "currentNumberScheduled",
                i64::from(st.current_number_scheduled),
            ),
            ("numberMisscheduled", i64::from(st.number_misscheduled)),
            (
                "desiredNumberScheduled",
                i64::from(st.desired_number_scheduled),
            ),
            ("numberReady", i64::from(st.number_ready)),
            ("observedGeneration", st.observed_generation.unwrap_or(0)),
            (
                "updatedNumberScheduled",
                i64::from(st.updated_number_scheduled.unwrap_or(0)),
            ),
            (
                "numberAvailable",
                i64::from(st.number_available.unwrap_or(0)),
            ),
            (
                "numberUnavailable",
                i64::from(st.number_unavailable.unwrap_or(0)),
            ),
            ("collisionCount", i64::from(st.collision_count.unwrap_or(0))),
        ],
    ));
    errs
}

// ---- ControllerRevision ----

pub fn controller_revision(
    o: &apps::ControllerRevision,
    old: Option<&apps::ControllerRevision>,
) -> ErrorList {
    let mut errs = meta(
        &o.metadata,
        old.map(|o| &o.metadata),
        true,
        names::name_is_dns_subdomain,
    );
    errs.extend(nonneg(o.revision.unwrap_or(0), &Path::new("revision")));
    if let Some(old) = old
        && o.data != old.data
    {
        errs.push(FieldError::invalid("data", "{...}", "field is immutable"));
    }
    errs
}

// ---- Job ----

fn pod_failure_policy(pfp: &batch::PodFailurePolicy, path: &Path) -> ErrorList {
    let mut errs = Vec::new();
    let rp = path.child("rules");
    for (i, r) in pfp.rules.iter().enumerate() {
        let p = rp.index(i);
        let actions = ["Count", "FailIndex", "FailJob", "Ignore"];
        if !actions.contains(&r.action.as_str()) {
            errs.push(FieldError::not_supported(
                p.child("action"),
                &r.action,
                &actions,
            ));
        }
        match (&r.on_exit_codes, &r.on_pod_conditions) {
            (Some(_), Some(c)) if !c.is_empty() => errs.push(FieldError::invalid(
                p.clone(),
                "specifying both OnExitCodes and OnPodConditions is not supported",
                "specifying both OnExitCodes and OnPodConditions is not supported",
            )),
            (None, None) => errs.push(FieldError::invalid(
                p.clone(),
                "specifying one of OnExitCodes and OnPodConditions is required",
                "specifying one of OnExitCodes and OnPodConditions is required",
            )),
            (None, Some(c)) if c.is_empty() => errs.push(FieldError::invalid(
                p.clone(),
                "specifying one of OnExitCodes and OnPodConditions is required",
                "specifying one of OnExitCodes and OnPodConditions is required",
            )),
            _ => {}
        }
        if let Some(ec) = &r.on_exit_codes {
            let ep = p.child("onExitCodes");
            if !matches!(ec.operator.as_str(), "In" | "NotIn") {
                errs.push(FieldError::not_supported(
                    ep.child("operator"),
                    &ec.operator,
                    &["In", "NotIn"],
                ));
            }
            if ec.values.is_empty() {
                errs.push(FieldError::required(
                    ep.child("values"),
                    "at least one value is required",
                ));
            }
            let mut prev: Option<i32> = None;
            for (j, v) in ec.values.iter().enumerate() {
                let vp = ep.child("values").index(j);
                if ec.operator == "In" && *v == 0 {
                    errs.push(FieldError::invalid(
                        vp.clone(),
                        "0",
                        "must not be 0 for the In operator",
                    ));
                }
                if let Some(pv) = prev {
                    if pv == *v {
                        errs.push(FieldError::duplicate(vp.clone(), v.to_string()));
                    } else if pv > *v {
                        errs.push(FieldError::invalid(vp, v.to_string(), "must be ordered"));
                    }
                }
                prev = Some(*v);
            }
        }
        for (j, c) in r.on_pod_conditions.iter().flatten().enumerate() {
            let cp = p.child("onPodConditions").index(j);
            let st = s(&c.status);
            if !matches!(st, "True" | "False" | "Unknown") {
                errs.push(FieldError::not_supported(
                    cp.child("status"),
                    st,
                    &["False", "True", "Unknown"],
                ));
            }
            for m in names::is_qualified_name(&c.type_) {
                errs.push(FieldError::invalid_str(cp.child("type"), &c.type_, m));
            }
        }
    }
    errs
}

fn job_spec(spec: &batch::JobSpec, path: &Path) -> ErrorList {
    let mut errs = Vec::new();
    for (f, v) in [
        ("parallelism", spec.parallelism.map(i64::from)),
        ("completions", spec.completions.map(i64::from)),
        ("activeDeadlineSeconds", spec.active_deadline_seconds),
        ("backoffLimit", spec.backoff_limit.map(i64::from)),
        (
            "ttlSecondsAfterFinished",
            spec.ttl_seconds_after_finished.map(i64::from),
        ),
        (
            "backoffLimitPerIndex",
            spec.backoff_limit_per_index.map(i64::from),
        ),
        ("maxFailedIndexes", spec.max_failed_indexes.map(i64::from)),
    ] {
        if let Some(v) = v {
            errs.extend(nonneg(v, &path.child(f)));
        }
    }
    let mode = s(&spec.completion_mode);
    match mode {
        "" | "NonIndexed" => {
            if spec.backoff_limit_per_index.is_some() {
                errs.push(FieldError::forbidden(
                    path.child("backoffLimitPerIndex"),
                    "requires indexed completion mode",
                ));
            }
        }
        "Indexed" => {
            if spec.completions.is_none() {
                errs.push(FieldError::required(
                    path.child("completions"),
                    "when completion mode is Indexed",
                ));
            }
            if spec.parallelism.unwrap_or(0) > 100_000 {
                errs.push(FieldError::invalid(
                    path.child("parallelism"),
                    spec.parallelism.unwrap_or(0).to_string(),
                    "must be less than or equal to 100000 when completion mode is Indexed",
                ));
            }
        }
        other => errs.push(FieldError::not_supported(
            path.child("completionMode"),
            other,
            &["NonIndexed", "Indexed"],
        )),
    }
    if let Some(prp) = spec.pod_replacement_policy.as_deref() {
        if spec.pod_failure_policy.is_some() && prp != "Failed" {
            errs.push(FieldError::not_supported(
                path.child("podReplacementPolicy"),
                prp,
                &["Failed"],
            ));
        } else if !matches!(prp, "Failed" | "TerminatingOrFailed") {
            errs.push(FieldError::not_supported(
                path.child("podReplacementPolicy"),
                prp,
                &["Failed", "TerminatingOrFailed"],
            ));
        }
    }
    if let Some(pfp) = &spec.pod_failure_policy {
        errs.extend(pod_failure_policy(pfp, &path.child("podFailurePolicy")));
    }
    let tp = path.child("template");
    errs.extend(validate_pod_template_spec(&spec.template, &tp));
    errs.extend(job_restart_policy(spec, &tp));
    // Then the selector (upstream `ValidateJobSpec`): required, its own field errors, and the
    // template-labels check when it parses. A selector that does not parse adds no error of its
    // own; a missing one selects nothing, so the template never matches it.
    let sp = path.child("selector");
    match &spec.selector {
        None => errs.push(FieldError::required(&sp, "")),
        Some(sel) => errs.extend(validate_label_selector(Some(sel), &sp)),
    }
    if let Some(parsed) = parse_selector(spec.selector.as_ref()) {
        errs.extend(template_labels_match(&parsed, &spec.template, &tp));
    }
    errs
}

/// Upstream `validateGeneratedSelector` (on create): unless `manualSelector` is set, the selector
/// must select the labels the Job's pods get (job-name and controller-uid, legacy and prefixed).
/// Skipped for a missing selector and for one that does not parse.
fn generated_selector(o: &batch::Job, spec: &batch::JobSpec) -> ErrorList {
    let uid = o.metadata.uid.as_deref().unwrap_or("");
    if spec.manual_selector == Some(true) || uid.is_empty() {
        return Vec::new();
    }
    let Some(sel) = spec.selector.as_ref() else {
        return Vec::new();
    };
    let Some(parsed) = parse_selector(Some(sel)) else {
        return Vec::new();
    };
    let name = o.metadata.name.as_deref().unwrap_or("");
    let expected: std::collections::BTreeMap<String, String> = [
        (CONTROLLER_UID_LABEL, uid),
        (JOB_NAME_LABEL, name),
        (LEGACY_CONTROLLER_UID_LABEL, uid),
        (LEGACY_JOB_NAME_LABEL, name),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    if parsed.matches(&expected) {
        return Vec::new();
    }
    vec![FieldError::invalid(
        Path::new("spec").child("selector"),
        go_label_selector(Some(sel)),
        "`selector` not auto-generated",
    )]
}

pub fn job(o: &batch::Job, old: Option<&batch::Job>) -> ErrorList {
    let mut errs = meta(
        &o.metadata,
        old.map(|o| &o.metadata),
        true,
        names::name_is_dns_subdomain,
    );
    let spec = o.spec.clone().unwrap_or_default();
    let path = Path::new("spec");
    if old.is_none() {
        errs.extend(generated_selector(o, &spec));
    }
    errs.extend(job_spec(&spec, &path));
    if let Some(old) = old {
        let os = old.spec.clone().unwrap_or_default();
        errs.extend(immutable(
            &spec.selector,
            &os.selector,
            &path.child("selector"),
            || go_label_selector(spec.selector.as_ref()),
        ));
        errs.extend(immutable(
            &spec.completion_mode,
            &os.completion_mode,
            &path.child("completionMode"),
            || ferry_apimachinery::errors::quote(s(&spec.completion_mode)),
        ));
        // The template may change only while the Job is suspended (and never started).
        let suspended = os.suspend == Some(true);
        if !suspended {
            errs.extend(immutable(
                &spec.template,
                &os.template,
                &path.child("template"),
                || "core.PodTemplateSpec{...}".to_string(),
            ));
        }
        if spec.completions != os.completions
            && !(s(&spec.completion_mode) == "Indexed" && spec.completions == spec.parallelism)
        {
            errs.push(FieldError::invalid(
                path.child("completions"),
                spec.completions.unwrap_or(0).to_string(),
                "field is immutable",
            ));
        }
    }
    errs
}

pub fn job_status(o: &batch::Job, old: &batch::Job) -> ErrorList {
    let mut errs = validate_object_meta_update(&o.metadata, &old.metadata, &Path::new("metadata"));
    let st = o.status.clone().unwrap_or_default();
    errs.extend(status_counts(
        &Path::new("status"),
        &[
            ("active", i64::from(st.active.unwrap_or(0))),
            ("succeeded", i64::from(st.succeeded.unwrap_or(0))),
            ("failed", i64::from(st.failed.unwrap_or(0))),
            ("ready", i64::from(st.ready.unwrap_or(0))),
            ("terminating", i64::from(st.terminating.unwrap_or(0))),
        ],
    ));
    errs
}

// ---- CronJob ----

pub fn cron_job(o: &batch::CronJob, old: Option<&batch::CronJob>) -> ErrorList {
    let mut errs = meta(
        &o.metadata,
        old.map(|o| &o.metadata),
        true,
        names::name_is_dns_subdomain,
    );
    let name = o.metadata.name.as_deref().unwrap_or("");
    if name.len() > 52 {
        errs.push(FieldError::invalid_str(
            Path::new("metadata").child("name"),
            name,
            "must be no more than 52 characters",
        ));
    }
    let spec = &o.spec;
    let path = Path::new("spec");
    if spec.schedule.is_empty() {
        errs.push(FieldError::required(path.child("schedule"), ""));
    } else if let Err(e) = ferry_cron::parse(&spec.schedule) {
        errs.push(FieldError::invalid_str(
            path.child("schedule"),
            &spec.schedule,
            e.to_string(),
        ));
    }
    if let Some(tz) = spec.time_zone.as_deref() {
        if ferry_cron::has_tz_prefix(&spec.schedule) {
            errs.push(FieldError::invalid_str(
                path.child("timeZone"),
                &spec.schedule,
                "cannot use both timeZone field and TZ or CRON_TZ in schedule",
            ));
        }
        if tz.is_empty() || tz.eq_ignore_ascii_case("local") || jiff::tz::TimeZone::get(tz).is_err()
        {
            errs.push(FieldError::invalid_str(
                path.child("timeZone"),
                tz,
                "unknown time zone",
            ));
        }
    }
    match s(&spec.concurrency_policy) {
        "Allow" | "Forbid" | "Replace" => {}
        "" => errs.push(FieldError::required(path.child("concurrencyPolicy"), "")),
        other => errs.push(FieldError::not_supported(
            path.child("concurrencyPolicy"),
            other,
            &["Allow", "Forbid", "Replace"],
        )),
    }
    for (f, v) in [
        ("startingDeadlineSeconds", spec.starting_deadline_seconds),
        (
            "successfulJobsHistoryLimit",
            spec.successful_jobs_history_limit.map(i64::from),
        ),
        (
            "failedJobsHistoryLimit",
            spec.failed_jobs_history_limit.map(i64::from),
        ),
    ] {
        if let Some(v) = v {
            errs.extend(nonneg(v, &path.child(f)));
        }
    }
    let jp = path.child("jobTemplate").child("spec");
    let js = spec.job_template.spec.clone().unwrap_or_default();
    let tp = jp.child("template");
    errs.extend(validate_pod_template_spec(&js.template, &tp));
    errs.extend(job_restart_policy(&js, &tp));
    // Upstream `ValidateJobTemplateSpec`: a Job made from the template always gets a generated
    // selector, so the template may carry none and may not ask for a manual one.
    if let Some(sel) = &js.selector {
        errs.push(FieldError::invalid(
            jp.child("selector"),
            go_label_selector(Some(sel)),
            "`selector` will be auto-generated",
        ));
    }
    if js.manual_selector == Some(true) {
        errs.push(FieldError {
            kind: ferry_apimachinery::errors::ErrorType::NotSupported,
            field: jp.child("manualSelector").to_string(),
            value: Some("true".to_string()),
            detail: "supported values: \"nil\", \"false\"".to_string(),
        });
    }
    for (f, v) in [
        ("parallelism", js.parallelism.map(i64::from)),
        ("completions", js.completions.map(i64::from)),
        ("activeDeadlineSeconds", js.active_deadline_seconds),
        ("backoffLimit", js.backoff_limit.map(i64::from)),
        (
            "ttlSecondsAfterFinished",
            js.ttl_seconds_after_finished.map(i64::from),
        ),
    ] {
        if let Some(v) = v {
            errs.extend(nonneg(v, &jp.child(f)));
        }
    }
    errs
}

// ---- PodDisruptionBudget ----

pub fn pod_disruption_budget(
    o: &policy::PodDisruptionBudget,
    old: Option<&policy::PodDisruptionBudget>,
) -> ErrorList {
    let mut errs = meta(
        &o.metadata,
        old.map(|o| &o.metadata),
        true,
        names::name_is_dns_subdomain,
    );
    let spec = o.spec.clone().unwrap_or_default();
    let path = Path::new("spec");
    if spec.min_available.is_some() && spec.max_unavailable.is_some() {
        errs.push(FieldError::invalid(
            path.clone(),
            "{...}",
            "minAvailable and maxUnavailable cannot be both set",
        ));
    }
    for (f, v) in [
        ("minAvailable", spec.min_available.as_ref()),
        ("maxUnavailable", spec.max_unavailable.as_ref()),
    ] {
        errs.extend(int_or_percent(v, &path.child(f)));
        errs.extend(percent_over_100(v, &path.child(f)));
    }
    if let Some(sel) = &spec.selector {
        errs.extend(validate_label_selector(Some(sel), &path.child("selector")));
    }
    if let Some(p) = spec.unhealthy_pod_eviction_policy.as_deref()
        && !matches!(p, "IfHealthyBudget" | "AlwaysAllow")
    {
        errs.push(FieldError::not_supported(
            path.child("unhealthyPodEvictionPolicy"),
            p,
            &["AlwaysAllow", "IfHealthyBudget"],
        ));
    }
    errs
}

pub fn pod_disruption_budget_status(
    o: &policy::PodDisruptionBudget,
    old: &policy::PodDisruptionBudget,
) -> ErrorList {
    let mut errs = validate_object_meta_update(&o.metadata, &old.metadata, &Path::new("metadata"));
    let st = o.status.clone().unwrap_or_default();
    errs.extend(status_counts(
        &Path::new("status"),
        &[
            (
                "disruptionsAllowed",
                i64::from(st.disruptions_allowed.unwrap_or(0)),
            ),
            ("currentHealthy", i64::from(st.current_healthy.unwrap_or(0))),
            ("desiredHealthy", i64::from(st.desired_healthy.unwrap_or(0))),
            ("expectedPods", i64::from(st.expected_pods.unwrap_or(0))),
        ],
    ));
    errs
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    fn fields(errs: &ErrorList) -> Vec<String> {
        errs.iter().map(|e| e.field.clone()).collect()
    }

    fn template(labels: Value, restart: &str) -> Value {
        json!({"metadata": {"labels": labels}, "spec": {"restartPolicy": restart, "dnsPolicy": "ClusterFirst",
            "terminationGracePeriodSeconds": 30,
            "containers": [{"name": "c", "image": "x", "imagePullPolicy": "Always", "terminationMessagePolicy": "File"}]}})
    }

    #[test]
    fn stateful_set_mounting_a_claim_template_is_valid() {
        // The canonical StatefulSet: a container mounts a volumeClaimTemplate, not a pod volume.
        let v = json!({"metadata": {"name": "web", "namespace": "d"},
            "spec": {"selector": {"matchLabels": {"app": "nginx"}}, "serviceName": "nginx", "replicas": 2,
              "podManagementPolicy": "OrderedReady", "updateStrategy": {"type": "RollingUpdate"},
              "template": {"metadata": {"labels": {"app": "nginx"}}, "spec": {"restartPolicy": "Always",
                "dnsPolicy": "ClusterFirst", "terminationGracePeriodSeconds": 30,
                "containers": [{"name": "nginx", "image": "nginx", "imagePullPolicy": "IfNotPresent",
                  "terminationMessagePolicy": "File",
                  "volumeMounts": [{"name": "www", "mountPath": "/usr/share/nginx/html"}]}]}},
              "volumeClaimTemplates": [{"metadata": {"name": "www"}, "spec": {"accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}}}}]}});
        let o: apps::StatefulSet = from(v);
        assert_eq!(stateful_set(&o, None), Vec::new());
    }

    #[test]
    fn stateful_set_errors() {
        let base = json!({"metadata": {"name": "web", "namespace": "d", "resourceVersion": "1"},
            "spec": {"selector": {"matchLabels": {"a": "b"}}, "podManagementPolicy": "OrderedReady", "serviceName": "nginx", "replicas": 3,
              "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}},
              "template": template(json!({"a": "b"}), "Always")}});
        let ok: apps::StatefulSet = from(base.clone());
        assert!(
            stateful_set(&ok, None).is_empty(),
            "{:?}",
            stateful_set(&ok, None)
        );
        let cases = [
            (
                "/spec/podManagementPolicy",
                json!("Sometimes"),
                "spec.podManagementPolicy",
            ),
            (
                "/spec/updateStrategy",
                json!({"type": "OnDelete", "rollingUpdate": {}}),
                "spec.updateStrategy.rollingUpdate",
            ),
            (
                "/spec/updateStrategy/rollingUpdate/partition",
                json!(-1),
                "spec.updateStrategy.rollingUpdate.partition",
            ),
            ("/spec/replicas", json!(-2), "spec.replicas"),
            (
                "/spec/selector",
                json!({"matchLabels": {"x": "y"}}),
                "spec.template.metadata.labels",
            ),
            (
                "/spec/template/spec/restartPolicy",
                json!("Never"),
                "spec.template.spec.restartPolicy",
            ),
            ("/spec/serviceName", json!("Bad_Name"), "spec.serviceName"),
        ];
        for (ptr, val, want) in cases {
            let mut v = base.clone();
            *v.pointer_mut(ptr).unwrap() = val;
            let o: apps::StatefulSet = from(v);
            let errs = stateful_set(&o, None);
            assert!(fields(&errs).contains(&want.to_string()), "{ptr}: {errs:?}");
        }
        // Update: replicas may change, serviceName may not.
        let mut v = base.clone();
        v["spec"]["replicas"] = json!(5);
        let n: apps::StatefulSet = from(v.clone());
        assert!(
            stateful_set(&n, Some(&ok)).is_empty(),
            "{:?}",
            stateful_set(&n, Some(&ok))
        );
        v["spec"]["serviceName"] = json!("other");
        let n: apps::StatefulSet = from(v);
        assert_eq!(
            fields(&stateful_set(&n, Some(&ok))),
            vec!["spec".to_string()]
        );
    }

    #[test]
    fn daemon_set_errors() {
        let base = json!({"metadata": {"name": "ds", "namespace": "d", "resourceVersion": "1"},
            "spec": {"selector": {"matchLabels": {"a": "b"}},
              "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}},
              "template": template(json!({"a": "b"}), "Always")}});
        let ok: apps::DaemonSet = from(base.clone());
        assert!(
            daemon_set(&ok, None).is_empty(),
            "{:?}",
            daemon_set(&ok, None)
        );
        let cases = [
            (
                "/spec/updateStrategy/rollingUpdate/maxUnavailable",
                json!(0),
                "spec.updateStrategy.rollingUpdate.maxUnavailable",
            ),
            (
                "/spec/updateStrategy/rollingUpdate/maxSurge",
                json!("10%"),
                "spec.updateStrategy.rollingUpdate.maxSurge",
            ),
            (
                "/spec/updateStrategy/type",
                json!("Fast"),
                "spec.updateStrategy.type",
            ),
            ("/spec/selector", json!({}), "spec.selector"),
        ];
        for (ptr, val, want) in cases {
            let mut v = base.clone();
            *v.pointer_mut(ptr).unwrap() = val;
            let o: apps::DaemonSet = from(v);
            let errs = daemon_set(&o, None);
            assert!(fields(&errs).contains(&want.to_string()), "{ptr}: {errs:?}");
        }
        let mut v = base.clone();
        v["spec"]["selector"] = json!({"matchLabels": {"a": "b", "c": "d"}});
        v["spec"]["template"]["metadata"]["labels"] = json!({"a": "b", "c": "d"});
        let n: apps::DaemonSet = from(v);
        assert!(fields(&daemon_set(&n, Some(&ok))).contains(&"spec.selector".to_string()));
    }

    #[test]
    fn job_errors() {
        let uid = "u-1";
        let base = json!({"metadata": {"name": "pi", "namespace": "d", "uid": uid, "resourceVersion": "1"},
            "spec": {"selector": {"matchLabels": {CONTROLLER_UID_LABEL: uid}}, "completionMode": "NonIndexed",
              "template": template(json!({CONTROLLER_UID_LABEL: uid}), "Never")}});
        let ok: batch::Job = from(base.clone());
        assert!(job(&ok, None).is_empty(), "{:?}", job(&ok, None));
        let cases = [
            (
                "/spec/template/spec/restartPolicy",
                json!("Always"),
                "spec.template.spec.restartPolicy",
            ),
            (
                "/spec/selector",
                json!({"matchLabels": {CONTROLLER_UID_LABEL: "other"}}),
                "spec.selector",
            ),
            ("/spec/completionMode", json!("Indexed"), "spec.completions"),
            (
                "/spec/completionMode",
                json!("Sometimes"),
                "spec.completionMode",
            ),
        ];
        for (ptr, val, want) in cases {
            let mut v = base.clone();
            *v.pointer_mut(ptr).unwrap() = val;
            let o: batch::Job = from(v);
            let errs = job(&o, None);
            assert!(fields(&errs).contains(&want.to_string()), "{ptr}: {errs:?}");
        }
        let mut v = base.clone();
        v["spec"]["backoffLimit"] = json!(-1);
        v["spec"]["podFailurePolicy"] = json!({"rules": [
            {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [0, 3]}},
            {"action": "Explode", "onExitCodes": {"operator": "In", "values": [1]}},
            {"action": "Ignore"}]});
        let o: batch::Job = from(v);
        let f = fields(&job(&o, None));
        for want in [
            "spec.backoffLimit",
            "spec.podFailurePolicy.rules[0].onExitCodes.values[0]",
            "spec.podFailurePolicy.rules[1].action",
            "spec.podFailurePolicy.rules[2]",
        ] {
            assert!(f.contains(&want.to_string()), "{want}: {f:?}");
        }
        // Template is immutable on a running Job.
        let mut v = base.clone();
        v["spec"]["template"]["spec"]["containers"][0]["image"] = json!("y");
        let n: batch::Job = from(v);
        assert!(fields(&job(&n, Some(&ok))).contains(&"spec.template".to_string()));
    }

    #[test]
    fn cron_job_and_pdb_errors() {
        let base = json!({"metadata": {"name": "cj", "namespace": "d"},
            "spec": {"schedule": "*/1 * * * *", "concurrencyPolicy": "Allow",
              "jobTemplate": {"spec": {"template": template(json!({}), "OnFailure")}}}});
        let ok: batch::CronJob = from(base.clone());
        assert!(cron_job(&ok, None).is_empty(), "{:?}", cron_job(&ok, None));
        let cases = [
            ("/spec/schedule", json!("61 * * * *"), "spec.schedule"),
            (
                "/spec/concurrencyPolicy",
                json!("Sometimes"),
                "spec.concurrencyPolicy",
            ),
            ("/metadata/name", json!("a".repeat(53)), "metadata.name"),
        ];
        for (ptr, val, want) in cases {
            let mut v = base.clone();
            *v.pointer_mut(ptr).unwrap() = val;
            let o: batch::CronJob = from(v);
            assert!(
                fields(&cron_job(&o, None)).contains(&want.to_string()),
                "{ptr}"
            );
        }
        let mut v = base.clone();
        v["spec"]["timeZone"] = json!("Mars/Base");
        let o: batch::CronJob = from(v.clone());
        assert!(fields(&cron_job(&o, None)).contains(&"spec.timeZone".to_string()));
        v["spec"]["timeZone"] = json!("Europe/Paris");
        v["spec"]["schedule"] = json!("CRON_TZ=UTC 0 * * * *");
        let o: batch::CronJob = from(v);
        assert!(fields(&cron_job(&o, None)).contains(&"spec.timeZone".to_string()));

        let p: policy::PodDisruptionBudget = from(
            json!({"metadata": {"name": "p", "namespace": "d"},
            "spec": {"minAvailable": 1, "maxUnavailable": "150%", "unhealthyPodEvictionPolicy": "Never"}}),
        );
        let f = fields(&pod_disruption_budget(&p, None));
        for want in [
            "spec",
            "spec.maxUnavailable",
            "spec.unhealthyPodEvictionPolicy",
        ] {
            assert!(f.contains(&want.to_string()), "{want}: {f:?}");
        }
    }
}
