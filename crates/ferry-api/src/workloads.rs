//! The workload kinds of issue 16: `apps/v1` StatefulSet, DaemonSet and ControllerRevision,
//! `batch/v1` Job and CronJob, `policy/v1` PodDisruptionBudget — defaulting
//! (`pkg/apis/{apps,batch,policy}/v1/defaults.go`), strategy hooks (Job selector generation),
//! Table printing (`pkg/printers/internalversion`). Validation is in `validation::workloads`.

use jiff::Timestamp;
use k8s_openapi::api::apps::v1 as apps;
use k8s_openapi::api::batch::v1 as batch;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::policy::v1 as policy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;

use crate::kinds::{Column, Hooks, KindInfo, StatusOnCreate, Typed};
use crate::printers::duration::{human_duration, since};
use crate::selectors::{format_label_selector, format_labels};
use crate::validation::workloads as v;
use ferry_printers::columns::{AGE, CONTAINERS, IMAGES, col};

/// Legacy and current Job labels (upstream `batch.LegacyJobNameLabel` ...).
pub const LEGACY_JOB_NAME_LABEL: &str = "job-name";
pub const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";
pub const LEGACY_CONTROLLER_UID_LABEL: &str = "controller-uid";
pub use ferry_validation::workloads::CONTROLLER_UID_LABEL;
pub const JOB_COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";
/// The finalizer the Job controller puts on its pods until it has counted them.
pub const JOB_TRACKING_FINALIZER: &str = "batch.kubernetes.io/job-tracking";

#[allow(clippy::too_many_arguments)]
const fn info(
    group: &'static str,
    kind: &'static str,
    plural: &'static str,
    singular: &'static str,
    short: &'static [&'static str],
    categories: &'static [&'static str],
    status: bool,
    scale: bool,
) -> KindInfo {
    KindInfo {
        group,
        version: "v1",
        kind,
        plural,
        singular,
        namespaced: true,
        short_names: short,
        categories,
        status_subresource: status,
        status_on_create: if status {
            StatusOnCreate::Reset
        } else {
            StatusOnCreate::Keep
        },
        generation: true,
        delete_returns_object: false,
        scale_subresource: scale,
    }
}

pub fn stateful_set_strategy() -> Typed<apps::StatefulSet> {
    Typed {
        info: info(
            "apps",
            "StatefulSet",
            "statefulsets",
            "statefulset",
            &["sts"],
            &["all"],
            true,
            true,
        ),
        hooks: Hooks {
            default: default_stateful_set,
            prepare_create: |_| {},
            prepare_update: |_, _| {},
            validate: v::stateful_set,
            validate_status: v::stateful_set_status,
            columns: stateful_set_columns,
            row: |o| stateful_set_row(o, Timestamp::now()),
            field: |_, _| None,
        },
    }
}

pub fn daemon_set_strategy() -> Typed<apps::DaemonSet> {
    Typed {
        info: info(
            "apps",
            "DaemonSet",
            "daemonsets",
            "daemonset",
            &["ds"],
            &["all"],
            true,
            false,
        ),
        hooks: Hooks {
            default: default_daemon_set,
            prepare_create: |_| {},
            prepare_update: |_, _| {},
            validate: v::daemon_set,
            validate_status: v::daemon_set_status,
            columns: daemon_set_columns,
            row: |o| daemon_set_row(o, Timestamp::now()),
            field: |_, _| None,
        },
    }
}

pub fn controller_revision_strategy() -> Typed<apps::ControllerRevision> {
    let mut i = info(
        "apps",
        "ControllerRevision",
        "controllerrevisions",
        "controllerrevision",
        &[],
        &[],
        false,
        false,
    );
    i.generation = false;
    Typed {
        info: i,
        hooks: Hooks {
            default: |_| {},
            prepare_create: |_| {},
            prepare_update: |_, _| {},
            validate: v::controller_revision,
            validate_status: |_, _| Vec::new(),
            columns: controller_revision_columns,
            row: |o| controller_revision_row(o, Timestamp::now()),
            field: |_, _| None,
        },
    }
}

pub fn job_strategy() -> Typed<batch::Job> {
    Typed {
        info: info("batch", "Job", "jobs", "job", &[], &["all"], true, false),
        hooks: Hooks {
            default: default_job,
            prepare_create: job_prepare_create,
            prepare_update: |_, _| {},
            validate: v::job,
            validate_status: v::job_status,
            columns: job_columns,
            row: |o| job_row(o, Timestamp::now()),
            field: job_field,
        },
    }
}

pub fn cron_job_strategy() -> Typed<batch::CronJob> {
    Typed {
        info: info(
            "batch",
            "CronJob",
            "cronjobs",
            "cronjob",
            &["cj"],
            &["all"],
            true,
            false,
        ),
        hooks: Hooks {
            default: default_cron_job,
            prepare_create: |_| {},
            prepare_update: |_, _| {},
            validate: v::cron_job,
            validate_status: |_, _| Vec::new(),
            columns: cron_job_columns,
            row: |o| cron_job_row(o, Timestamp::now()),
            field: |_, _| None,
        },
    }
}

pub fn pod_disruption_budget_strategy() -> Typed<policy::PodDisruptionBudget> {
    Typed {
        info: info(
            "policy",
            "PodDisruptionBudget",
            "poddisruptionbudgets",
            "poddisruptionbudget",
            &["pdb"],
            &[],
            true,
            false,
        ),
        hooks: Hooks {
            default: |_| {},
            prepare_create: |_| {},
            prepare_update: |_, _| {},
            validate: v::pod_disruption_budget,
            validate_status: v::pod_disruption_budget_status,
            columns: pdb_columns,
            row: |o| pdb_row(o, Timestamp::now()),
            field: |_, _| None,
        },
    }
}

// ---- defaulting ----

fn set<T>(field: &mut Option<T>, value: T) {
    if field.is_none() {
        *field = Some(value);
    }
}

fn pod_template(t: &mut core::PodTemplateSpec) {
    crate::defaults::pod_spec(t.spec.get_or_insert_with(Default::default));
}

/// SetDefaults_StatefulSet.
pub fn default_stateful_set(o: &mut apps::StatefulSet) {
    let spec = &mut o.spec;
    set(&mut spec.pod_management_policy, "OrderedReady".to_string());
    let us = spec.update_strategy.get_or_insert_with(Default::default);
    set(&mut us.type_, "RollingUpdate".to_string());
    if us.type_.as_deref() == Some("RollingUpdate") {
        let ru = us.rolling_update.get_or_insert_with(Default::default);
        set(&mut ru.partition, 0);
    }
    let pol = spec
        .persistent_volume_claim_retention_policy
        .get_or_insert_with(Default::default);
    set(&mut pol.when_deleted, "Retain".to_string());
    set(&mut pol.when_scaled, "Retain".to_string());
    set(&mut spec.replicas, 1);
    set(&mut spec.revision_history_limit, 10);
    pod_template(&mut spec.template);
    for pvc in spec.volume_claim_templates.iter_mut().flatten() {
        let s = pvc.spec.get_or_insert_with(Default::default);
        set(&mut s.volume_mode, "Filesystem".to_string());
        let st = pvc.status.get_or_insert_with(Default::default);
        set(&mut st.phase, "Pending".to_string());
    }
}

/// SetDefaults_DaemonSet.
pub fn default_daemon_set(o: &mut apps::DaemonSet) {
    let spec = &mut o.spec;
    let us = spec.update_strategy.get_or_insert_with(Default::default);
    set(&mut us.type_, "RollingUpdate".to_string());
    if us.type_.as_deref() == Some("RollingUpdate") {
        let ru = us.rolling_update.get_or_insert_with(Default::default);
        set(&mut ru.max_unavailable, IntOrString::Int(1));
        set(&mut ru.max_surge, IntOrString::Int(0));
    }
    set(&mut spec.revision_history_limit, 10);
    pod_template(&mut spec.template);
}

fn default_job_spec(spec: &mut batch::JobSpec) {
    if spec.completions.is_none() && spec.parallelism.is_none() {
        spec.completions = Some(1);
        spec.parallelism = Some(1);
    }
    set(&mut spec.parallelism, 1);
    if spec.backoff_limit.is_none() {
        spec.backoff_limit = Some(if spec.backoff_limit_per_index.is_some() {
            i32::MAX
        } else {
            6
        });
    }
    set(&mut spec.completion_mode, "NonIndexed".to_string());
    set(&mut spec.suspend, false);
    set(&mut spec.manual_selector, false);
    if let Some(pfp) = spec.pod_failure_policy.as_mut() {
        for r in pfp.rules.iter_mut() {
            for c in r.on_pod_conditions.iter_mut().flatten() {
                set(&mut c.status, "True".to_string());
            }
        }
    }
    if spec.pod_replacement_policy.is_none() {
        spec.pod_replacement_policy = Some(
            if spec.pod_failure_policy.is_some() {
                "Failed"
            } else {
                "TerminatingOrFailed"
            }
            .to_string(),
        );
    }
    pod_template(&mut spec.template);
}

/// SetDefaults_Job (the object's labels default to the template's).
pub fn default_job(o: &mut batch::Job) {
    let spec = o.spec.get_or_insert_with(Default::default);
    default_job_spec(spec);
    let tl = spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone());
    if let Some(tl) = tl
        && o.metadata.labels.as_ref().is_none_or(|l| l.is_empty())
    {
        o.metadata.labels = Some(tl);
    }
}

/// SetDefaults_CronJob (the Job template's pod template gets pod defaults).
pub fn default_cron_job(o: &mut batch::CronJob) {
    let spec = &mut o.spec;
    set(&mut spec.concurrency_policy, "Allow".to_string());
    set(&mut spec.suspend, false);
    set(&mut spec.successful_jobs_history_limit, 3);
    set(&mut spec.failed_jobs_history_limit, 1);
    if let Some(js) = spec.job_template.spec.as_mut() {
        pod_template(&mut js.template);
    }
}

/// The Job strategy's PrepareForCreate: a fresh status, and unless `manualSelector` is set, the
/// generated selector (`batch.kubernetes.io/controller-uid`) and the job-name/controller-uid
/// labels (legacy and prefixed) on the pod template.
pub fn job_prepare_create(o: &mut batch::Job) {
    let uid = o.metadata.uid.clone().unwrap_or_default();
    let name = o.metadata.name.clone().unwrap_or_default();
    let spec = o.spec.get_or_insert_with(Default::default);
    if spec.manual_selector == Some(true) {
        return;
    }
    let tm = spec.template.metadata.get_or_insert_with(Default::default);
    let labels = tm.labels.get_or_insert_with(Default::default);
    for k in [LEGACY_JOB_NAME_LABEL, JOB_NAME_LABEL] {
        labels.entry(k.to_string()).or_insert_with(|| name.clone());
    }
    for k in [LEGACY_CONTROLLER_UID_LABEL, CONTROLLER_UID_LABEL] {
        labels.entry(k.to_string()).or_insert_with(|| uid.clone());
    }
    let sel = spec.selector.get_or_insert_with(LabelSelector::default);
    sel.match_labels
        .get_or_insert_with(Default::default)
        .entry(CONTROLLER_UID_LABEL.to_string())
        .or_insert(uid);
}

fn job_field(o: &batch::Job, field: &str) -> Option<String> {
    match field {
        "status.successful" => Some(
            o.status
                .as_ref()
                .and_then(|s| s.succeeded)
                .unwrap_or(0)
                .to_string(),
        ),
        _ => None,
    }
}

// ---- printers ----

fn text(s: impl Into<String>) -> Value {
    Value::String(s.into())
}

fn int(n: impl Into<i64>) -> Value {
    Value::from(n.into())
}

fn name(meta: &ObjectMeta) -> Value {
    text(meta.name.clone().unwrap_or_default())
}

fn age(meta: &ObjectMeta, now: Timestamp) -> Value {
    text(since(meta.creation_timestamp.as_ref().map(|t| t.0), now))
}

fn container_cells(template: &core::PodTemplateSpec) -> (String, String) {
    let containers = template
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    let names = containers
        .iter()
        .map(|c| c.name.as_str())
        .collect::<Vec<_>>()
        .join(",");
    let images = containers
        .iter()
        .map(|c| c.image.as_deref().unwrap_or(""))
        .collect::<Vec<_>>()
        .join(",");
    (names, images)
}

pub fn stateful_set_columns() -> Vec<Column> {
    vec![
        Column::name_column(),
        col("Ready", "string", "Number of the pod with ready state", 0),
        col("Age", "string", AGE, 0),
        col("Containers", "string", CONTAINERS, 1),
        col("Images", "string", IMAGES, 1),
    ]
}

pub fn stateful_set_row(o: &apps::StatefulSet, now: Timestamp) -> Vec<Value> {
    let ready = o
        .status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    let desired = o.spec.replicas.unwrap_or(0);
    let (names, images) = container_cells(&o.spec.template);
    vec![
        name(&o.metadata),
        text(format!("{ready}/{desired}")),
        age(&o.metadata, now),
        text(names),
        text(images),
    ]
}

pub fn daemon_set_columns() -> Vec<Column> {
    vec![
        Column::name_column(),
        col(
            "Desired",
            "integer",
            "The total number of nodes that should be running the daemon pod (including nodes correctly running the daemon pod).",
            0,
        ),
        col(
            "Current",
            "integer",
            "The number of nodes that are running at least 1 daemon pod and are supposed to run the daemon pod.",
            0,
        ),
        col(
            "Ready",
            "integer",
            "numberReady is the number of nodes that should be running the daemon pod and have one or more of the daemon pod running with a Ready Condition.",
            0,
        ),
        col(
            "Up-to-date",
            "integer",
            "The total number of nodes that are running updated daemon pod",
            0,
        ),
        col(
            "Available",
            "integer",
            "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and available (ready for at least spec.minReadySeconds)",
            0,
        ),
        col(
            "Node Selector",
            "string",
            "NodeSelector is a selector which must be true for the pod to fit on a node. Selector which must match a node's labels for the pod to be scheduled on that node. More info: https://kubernetes.io/docs/concepts/configuration/assign-pod-node/",
            0,
        ),
        col("Age", "string", AGE, 0),
        col("Containers", "string", CONTAINERS, 1),
        col("Images", "string", IMAGES, 1),
        col(
            "Selector",
            "string",
            "A label query over pods that are managed by the daemon set. Must match in order to be controlled. It must match the pod template's labels. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors",
            1,
        ),
    ]
}

pub fn daemon_set_row(o: &apps::DaemonSet, now: Timestamp) -> Vec<Value> {
    let st = o.status.clone().unwrap_or_default();
    let (names, images) = container_cells(&o.spec.template);
    let node_selector = o
        .spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.node_selector.as_ref());
    vec![
        name(&o.metadata),
        int(st.desired_number_scheduled),
        int(st.current_number_scheduled),
        int(st.number_ready),
        int(st.updated_number_scheduled.unwrap_or(0)),
        int(st.number_available.unwrap_or(0)),
        text(format_labels(node_selector)),
        age(&o.metadata, now),
        text(names),
        text(images),
        text(format_label_selector(Some(&o.spec.selector))),
    ]
}

pub fn controller_revision_columns() -> Vec<Column> {
    vec![
        Column::name_column(),
        col("Controller", "string", "Controller of the object", 0),
        col(
            "Revision",
            "string",
            "Revision indicates the revision of the state represented by Data.",
            0,
        ),
        col("Age", "string", AGE, 0),
    ]
}

pub fn controller_revision_row(o: &apps::ControllerRevision, now: Timestamp) -> Vec<Value> {
    let controller = o
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
        .map(|r| {
            let group = r.api_version.split_once('/').map(|(g, _)| g).unwrap_or("");
            let gk = if group.is_empty() {
                r.kind.clone()
            } else {
                format!("{}.{group}", r.kind)
            };
            format!("{}/{}", gk.to_lowercase(), r.name)
        })
        .unwrap_or_else(|| "<none>".to_string());
    vec![
        name(&o.metadata),
        text(controller),
        int(o.revision.unwrap_or(0)),
        age(&o.metadata, now),
    ]
}

pub fn job_columns() -> Vec<Column> {
    vec![
        Column::name_column(),
        col("Status", "string", "Status of the job.", 0),
        col(
            "Completions",
            "string",
            "The desired number of successfully finished pods the job should be run with.",
            0,
        ),
        col(
            "Duration",
            "string",
            "Time required to complete the job.",
            0,
        ),
        col("Age", "string", AGE, 0),
        col("Containers", "string", CONTAINERS, 1),
        col("Images", "string", IMAGES, 1),
        col(
            "Selector",
            "string",
            "A label query over pods that should match the pod count. Normally, the system sets this field for you. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors",
            1,
        ),
    ]
}

fn has_condition(st: &batch::JobStatus, type_: &str) -> bool {
    st.conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == type_ && c.status == "True")
}

/// The STATUS column of `kubectl get jobs` (upstream printJob).
pub fn job_status_word(o: &batch::Job) -> &'static str {
    let st = o.status.clone().unwrap_or_default();
    if has_condition(&st, "Complete") {
        "Complete"
    } else if has_condition(&st, "Failed") {
        "Failed"
    } else if o.metadata.deletion_timestamp.is_some() {
        "Terminating"
    } else if has_condition(&st, "Suspended") {
        "Suspended"
    } else if has_condition(&st, "FailureTarget") {
        "FailureTarget"
    } else if has_condition(&st, "SuccessCriteriaMet") {
        "SuccessCriteriaMet"
    } else {
        "Running"
    }
}

pub fn job_row(o: &batch::Job, now: Timestamp) -> Vec<Value> {
    let spec = o.spec.clone().unwrap_or_default();
    let st = o.status.clone().unwrap_or_default();
    let succeeded = st.succeeded.unwrap_or(0);
    let completions = match spec.completions {
        Some(c) => format!("{succeeded}/{c}"),
        None => {
            let p = spec.parallelism.unwrap_or(0);
            if p > 1 {
                format!("{succeeded}/1 of {p}")
            } else {
                format!("{succeeded}/1")
            }
        }
    };
    let duration = match (&st.start_time, &st.completion_time) {
        (None, _) => String::new(),
        (Some(s), None) => since(Some(s.0), now),
        (Some(s), Some(c)) => human_duration(c.0.duration_since(s.0)),
    };
    let (names, images) = container_cells(&spec.template);
    vec![
        name(&o.metadata),
        text(job_status_word(o)),
        text(completions),
        text(duration),
        age(&o.metadata, now),
        text(names),
        text(images),
        text(format_label_selector(spec.selector.as_ref())),
    ]
}

pub fn cron_job_columns() -> Vec<Column> {
    vec![
        Column::name_column(),
        col(
            "Schedule",
            "string",
            "The schedule in Cron format, see https://en.wikipedia.org/wiki/Cron.",
            0,
        ),
        col(
            "Timezone",
            "string",
            "The time zone name for the given schedule, see https://en.wikipedia.org/wiki/List_of_tz_database_time_zones. If not specified, this will default to the time zone of the kube-controller-manager process. The set of valid time zone names and the time zone offset is loaded from the system-wide time zone database by the API server during CronJob validation and the controller manager during execution. If no system-wide time zone database can be found a bundled version of the database is used instead. If the time zone name becomes invalid during the lifetime of a CronJob or due to a change in host configuration, the controller will stop creating new new Jobs and will create a system event with the reason UnknownTimeZone. More information can be found in https://kubernetes.io/docs/concepts/workloads/controllers/cron-jobs/#time-zones",
            0,
        ),
        col(
            "Suspend",
            "boolean",
            "This flag tells the controller to suspend subsequent executions, it does not apply to already started executions.  Defaults to false.",
            0,
        ),
        col(
            "Active",
            "integer",
            "A list of pointers to currently running jobs.",
            0,
        ),
        col(
            "Last Schedule",
            "string",
            "Information when was the last time the job was successfully scheduled.",
            0,
        ),
        col("Age", "string", AGE, 0),
        col("Containers", "string", CONTAINERS, 1),
        col("Images", "string", IMAGES, 1),
        col(
            "Selector",
            "string",
            "A label query over pods that should match the pod count. Normally, the system sets this field for you. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors",
            1,
        ),
    ]
}

pub fn cron_job_row(o: &batch::CronJob, now: Timestamp) -> Vec<Value> {
    let st = o.status.clone().unwrap_or_default();
    let last = match &st.last_schedule_time {
        Some(t) => since(Some(t.0), now),
        None => "<none>".to_string(),
    };
    let js = o.spec.job_template.spec.clone().unwrap_or_default();
    let (names, images) = container_cells(&js.template);
    vec![
        name(&o.metadata),
        text(o.spec.schedule.clone()),
        text(
            o.spec
                .time_zone
                .clone()
                .unwrap_or_else(|| "<none>".to_string()),
        ),
        Value::Bool(o.spec.suspend.unwrap_or(false)),
        int(st.active.map(|a| a.len() as i64).unwrap_or(0)),
        text(last),
        age(&o.metadata, now),
        text(names),
        text(images),
        text(format_label_selector(js.selector.as_ref())),
    ]
}

pub fn pdb_columns() -> Vec<Column> {
    vec![
        Column::name_column(),
        col(
            "Min Available",
            "string",
            "The minimum number of pods that must be available simultaneously.  This can be either an integer or a string specifying a percentage, e.g. \"28%\".",
            0,
        ),
        col(
            "Max Unavailable",
            "string",
            "The maximum number of pods that may be unavailable simultaneously.  This can be either an integer or a string specifying a percentage, e.g. \"28%\".",
            0,
        ),
        col(
            "Allowed Disruptions",
            "integer",
            "Number of pod disruptions that are currently allowed.",
            0,
        ),
        col("Age", "string", AGE, 0),
    ]
}

fn ios(v: Option<&IntOrString>) -> String {
    match v {
        Some(IntOrString::Int(i)) => i.to_string(),
        Some(IntOrString::String(s)) => s.clone(),
        None => "N/A".to_string(),
    }
}

pub fn pdb_row(o: &policy::PodDisruptionBudget, now: Timestamp) -> Vec<Value> {
    let spec = o.spec.clone().unwrap_or_default();
    let allowed = o
        .status
        .as_ref()
        .and_then(|s| s.disruptions_allowed)
        .unwrap_or(0);
    vec![
        name(&o.metadata),
        text(ios(spec.min_available.as_ref())),
        text(ios(spec.max_unavailable.as_ref())),
        int(allowed),
        age(&o.metadata, now),
    ]
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn job_defaults_and_generated_selector() {
        let mut j: batch::Job = from(json!({
            "metadata": {"name": "pi", "namespace": "d", "uid": "u-1"},
            "spec": {"template": {"metadata": {"labels": {"app": "pi"}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}
        }));
        default_job(&mut j);
        job_prepare_create(&mut j);
        let spec = j.spec.clone().unwrap();
        assert_eq!(spec.completions, Some(1));
        assert_eq!(spec.parallelism, Some(1));
        assert_eq!(spec.backoff_limit, Some(6));
        assert_eq!(spec.completion_mode.as_deref(), Some("NonIndexed"));
        assert_eq!(
            spec.pod_replacement_policy.as_deref(),
            Some("TerminatingOrFailed")
        );
        assert_eq!(j.metadata.labels.clone().unwrap()["app"], "pi");
        let tl = spec.template.metadata.unwrap().labels.unwrap();
        assert_eq!(tl["job-name"], "pi");
        assert_eq!(tl[JOB_NAME_LABEL], "pi");
        assert_eq!(tl["controller-uid"], "u-1");
        assert_eq!(tl[CONTROLLER_UID_LABEL], "u-1");
        let ml = spec.selector.unwrap().match_labels.unwrap();
        assert_eq!(ml.len(), 1);
        assert_eq!(ml[CONTROLLER_UID_LABEL], "u-1");
        assert!(v::job(&j, None).is_empty(), "{:?}", v::job(&j, None));

        // Only parallelism given: completions stay unset.
        let mut j: batch::Job = from(json!({"metadata": {"name": "w"},
            "spec": {"parallelism": 3, "template": {}}}));
        default_job(&mut j);
        assert_eq!(j.spec.as_ref().unwrap().completions, None);
        // manualSelector: nothing generated.
        let mut j: batch::Job = from(json!({"metadata": {"name": "m", "uid": "u"},
            "spec": {"manualSelector": true, "selector": {"matchLabels": {"a": "b"}},
                     "template": {"metadata": {"labels": {"a": "b"}}}}}));
        job_prepare_create(&mut j);
        assert_eq!(
            j.spec
                .unwrap()
                .template
                .metadata
                .unwrap()
                .labels
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn workload_defaults() {
        let mut s: apps::StatefulSet = from(json!({"metadata": {"name": "web", "namespace": "d"},
            "spec": {"selector": {"matchLabels": {"a": "b"}}, "serviceName": "nginx",
              "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}},
              "volumeClaimTemplates": [{"metadata": {"name": "www"}, "spec": {"accessModes": ["ReadWriteOnce"]}}]}}));
        default_stateful_set(&mut s);
        assert_eq!(s.spec.replicas, Some(1));
        assert_eq!(
            s.spec.pod_management_policy.as_deref(),
            Some("OrderedReady")
        );
        let us = s.spec.update_strategy.clone().unwrap();
        assert_eq!(us.type_.as_deref(), Some("RollingUpdate"));
        assert_eq!(us.rolling_update.unwrap().partition, Some(0));
        let vct = &s.spec.volume_claim_templates.as_ref().unwrap()[0];
        assert_eq!(
            vct.spec.as_ref().unwrap().volume_mode.as_deref(),
            Some("Filesystem")
        );
        assert!(
            v::stateful_set(&s, None).is_empty(),
            "{:?}",
            v::stateful_set(&s, None)
        );

        let mut d: apps::DaemonSet = from(json!({"metadata": {"name": "ds", "namespace": "d"},
            "spec": {"selector": {"matchLabels": {"a": "b"}},
              "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}}));
        default_daemon_set(&mut d);
        let ru = d
            .spec
            .update_strategy
            .clone()
            .unwrap()
            .rolling_update
            .unwrap();
        assert_eq!(ru.max_unavailable, Some(IntOrString::Int(1)));
        assert_eq!(ru.max_surge, Some(IntOrString::Int(0)));
        assert!(v::daemon_set(&d, None).is_empty());

        let mut c: batch::CronJob = from(json!({"metadata": {"name": "cj", "namespace": "d"},
            "spec": {"schedule": "*/1 * * * *", "jobTemplate": {"spec": {"template": {"spec": {
                "restartPolicy": "OnFailure", "containers": [{"name": "c", "image": "x"}]}}}}}}));
        default_cron_job(&mut c);
        assert_eq!(c.spec.concurrency_policy.as_deref(), Some("Allow"));
        assert_eq!(c.spec.successful_jobs_history_limit, Some(3));
        assert_eq!(c.spec.failed_jobs_history_limit, Some(1));
        assert!(
            v::cron_job(&c, None).is_empty(),
            "{:?}",
            v::cron_job(&c, None)
        );
    }

    #[test]
    fn rows() {
        let now: Timestamp = "2026-01-01T00:10:00Z".parse().unwrap();
        let j: batch::Job = from(
            json!({"metadata": {"name": "pi", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"completions": 3, "template": {"spec": {"containers": [{"name": "c", "image": "perl"}]}}},
            "status": {"succeeded": 3, "startTime": "2026-01-01T00:00:00Z", "completionTime": "2026-01-01T00:00:42Z",
                "conditions": [{"type": "Complete", "status": "True"}]}}),
        );
        let r = job_row(&j, now);
        assert_eq!(r[1], json!("Complete"));
        assert_eq!(r[2], json!("3/3"));
        assert_eq!(r[3], json!("42s"));
        assert_eq!(r[4], json!("10m"));
        let j: batch::Job = from(json!({"metadata": {"name": "w"},
            "spec": {"parallelism": 2, "template": {}}, "status": {"succeeded": 0}}));
        assert_eq!(job_row(&j, now)[2], json!("0/1 of 2"));
        assert_eq!(job_row(&j, now)[1], json!("Running"));

        let p: policy::PodDisruptionBudget = from(json!({"metadata": {"name": "p"},
            "spec": {"minAvailable": "50%"}, "status": {"disruptionsAllowed": 1, "currentHealthy": 2, "desiredHealthy": 1, "expectedPods": 2}}));
        let r = pdb_row(&p, now);
        assert_eq!(r[1], json!("50%"));
        assert_eq!(r[2], json!("N/A"));
        assert_eq!(r[3], json!(1));

        let cr: apps::ControllerRevision = from(
            json!({"metadata": {"name": "web-5d7f", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "u", "controller": true}]}, "revision": 2}),
        );
        let r = controller_revision_row(&cr, now);
        assert_eq!(r[1], json!("statefulset.apps/web"));
        assert_eq!(r[2], json!(2));

        let c: batch::CronJob = from(json!({"metadata": {"name": "cj"},
            "spec": {"schedule": "@hourly", "jobTemplate": {}}}));
        let r = cron_job_row(&c, now);
        assert_eq!(r[2], json!("<none>"));
        assert_eq!(r[3], json!(false));
        assert_eq!(r[5], json!("<none>"));
    }
}
