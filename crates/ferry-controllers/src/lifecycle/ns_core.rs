//! The namespace controller's account of a namespace being deleted, as status conditions
//! (upstream's `status_condition_utils.go` in `pkg/controller/namespace/deletion`): what is
//! left, which finalizers hold it, and which deletions failed — what `kubectl describe
//! namespace` shows for a namespace stuck in `Terminating`. Pure.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::NamespaceCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

pub const DISCOVERY_FAILURE: &str = "NamespaceDeletionDiscoveryFailure";
pub const GROUP_VERSION_PARSING_FAILURE: &str = "NamespaceDeletionGroupVersionParsingFailure";
pub const CONTENT_FAILURE: &str = "NamespaceDeletionContentFailure";
pub const CONTENT_REMAINING: &str = "NamespaceContentRemaining";
pub const FINALIZERS_REMAINING: &str = "NamespaceFinalizersRemaining";

/// The condition types the namespace controller maintains, in upstream's order.
pub const CONDITION_TYPES: [&str; 5] = [
    DISCOVERY_FAILURE,
    GROUP_VERSION_PARSING_FAILURE,
    CONTENT_FAILURE,
    CONTENT_REMAINING,
    FINALIZERS_REMAINING,
];

/// How soon a namespace whose content remains is looked at again even if no change of that
/// content arrives (upstream's `finalizerEstimateSeconds`; its deleter requeues a namespace
/// after such an estimate). Changes of the content requeue it sooner.
pub const RECHECK: Duration = Duration::from_secs(15);

/// What is left in a namespace: objects per resource (`<plural>.<group>`, as upstream names
/// them: `pods.`, `jobs.batch`) and objects per finalizer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Content {
    pub resources: BTreeMap<String, usize>,
    pub finalizers: BTreeMap<String, usize>,
}

impl Content {
    /// Counts one remaining object of resource `plural` in `group`, with its finalizers.
    pub fn add(&mut self, plural: &str, group: &str, finalizers: &[String]) {
        *self
            .resources
            .entry(format!("{plural}.{group}"))
            .or_default() += 1;
        for f in finalizers {
            *self.finalizers.entry(f.clone()).or_default() += 1;
        }
    }

    pub fn is_empty(&self) -> bool {
        self.resources.is_empty()
    }
}

/// The "all is well" reason and message of a condition type.
fn ok_variant(t: &str) -> (&'static str, &'static str) {
    match t {
        DISCOVERY_FAILURE => (
            "ResourcesDiscovered",
            "All resources successfully discovered",
        ),
        GROUP_VERSION_PARSING_FAILURE => (
            "ParsedGroupVersions",
            "All legacy kube types successfully parsed",
        ),
        CONTENT_FAILURE => (
            "ContentDeleted",
            "All content successfully deleted, may be waiting on finalization",
        ),
        _ => ("ContentRemoved", "All content successfully removed"),
    }
}

/// The failing conditions (status `True`) for `content` and the failed deletions `errors`;
/// each as (type, reason, message).
fn failing(content: &Content, errors: &[String]) -> Vec<(&'static str, &'static str, String)> {
    let mut out = Vec::new();
    if !errors.is_empty() {
        let mut msgs = errors.to_vec();
        msgs.sort();
        out.push((
            CONTENT_FAILURE,
            "ContentDeletionFailed",
            format!(
                "Failed to delete all resource types, {} remaining: {}",
                msgs.len(),
                msgs.join(", ")
            ),
        ));
    }
    let resources: Vec<String> = content
        .resources
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(r, n)| format!("{r} has {n} resource instances"))
        .collect();
    if !resources.is_empty() {
        out.push((
            CONTENT_REMAINING,
            "SomeResourcesRemain",
            format!("Some resources are remaining: {}", resources.join(", ")),
        ));
    }
    let finalizers: Vec<String> = content
        .finalizers
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(f, n)| format!("{f} in {n} resource instances"))
        .collect();
    if !finalizers.is_empty() {
        out.push((
            FINALIZERS_REMAINING,
            "SomeFinalizersRemain",
            format!(
                "Some content in the namespace has finalizers remaining: {}",
                finalizers.join(", ")
            ),
        ));
    }
    out
}

/// The namespace's conditions after this pass (upstream's `updateConditions`): each maintained
/// type is set to its failing variant or its "all is well" one; a condition whose status,
/// reason or message changes is rewritten, its transition time moving only when the status
/// does; other conditions are kept. `None` when nothing changes (no status write).
pub fn update_conditions(
    current: &[NamespaceCondition],
    content: &Content,
    errors: &[String],
    now: &Time,
) -> Option<Vec<NamespaceCondition>> {
    let failing = failing(content, errors);
    let mut out = current.to_vec();
    let mut changed = false;
    for t in CONDITION_TYPES {
        let (status, reason, message) = match failing.iter().find(|(ft, _, _)| *ft == t) {
            Some((_, r, m)) => ("True", *r, m.clone()),
            None => {
                let (r, m) = ok_variant(t);
                ("False", r, m.to_string())
            }
        };
        match out.iter_mut().find(|c| c.type_ == t) {
            None => {
                out.push(NamespaceCondition {
                    type_: t.to_string(),
                    status: status.to_string(),
                    reason: Some(reason.to_string()),
                    message: Some(message),
                    last_transition_time: Some(now.clone()),
                });
                changed = true;
            }
            Some(c) => {
                let same = c.status == status
                    && c.reason.as_deref() == Some(reason)
                    && c.message.as_deref() == Some(message.as_str());
                if !same {
                    if c.status != status {
                        c.last_transition_time = Some(now.clone());
                    }
                    c.status = status.to_string();
                    c.reason = Some(reason.to_string());
                    c.message = Some(message);
                    changed = true;
                }
            }
        }
    }
    changed.then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> Time {
        Time(jiff::Timestamp::from_second(secs).unwrap_or(jiff::Timestamp::UNIX_EPOCH))
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    fn find<'a>(c: &'a [NamespaceCondition], ty: &str) -> &'a NamespaceCondition {
        c.iter()
            .find(|c| c.type_ == ty)
            .unwrap_or_else(|| panic!("no {ty} in {c:?}"))
    }

    #[test]
    fn content_counts_resources_and_finalizers() {
        let mut c = Content::default();
        assert!(c.is_empty());
        c.add("pods", "", &s(&["batch.kubernetes.io/job-tracking"]));
        c.add("pods", "", &[]);
        c.add("jobs", "batch", &s(&["foregroundDeletion"]));
        assert_eq!(
            c.resources,
            BTreeMap::from([("jobs.batch".to_string(), 1), ("pods.".to_string(), 2)])
        );
        assert_eq!(
            c.finalizers,
            BTreeMap::from([
                ("batch.kubernetes.io/job-tracking".to_string(), 1),
                ("foregroundDeletion".to_string(), 1)
            ])
        );
        assert!(!c.is_empty());
    }

    #[test]
    fn conditions_follow_the_content() {
        // A pod held by a finalizer, and a failed delete.
        let mut held = Content::default();
        held.add("pods", "", &s(&["batch.kubernetes.io/job-tracking"]));
        held.add("configmaps", "", &[]);
        let errs = s(&["secrets \"x\": timed out", "a: refused"]);
        let first = update_conditions(&[], &held, &errs, &t(100)).unwrap_or_default();
        assert_eq!(first.len(), 5, "{first:?}");
        let order: Vec<&str> = first.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(order, CONDITION_TYPES);
        let table: [(&str, &str, &str, &str); 5] = [
            (
                DISCOVERY_FAILURE,
                "False",
                "ResourcesDiscovered",
                "All resources successfully discovered",
            ),
            (
                GROUP_VERSION_PARSING_FAILURE,
                "False",
                "ParsedGroupVersions",
                "All legacy kube types successfully parsed",
            ),
            (
                CONTENT_FAILURE,
                "True",
                "ContentDeletionFailed",
                "Failed to delete all resource types, 2 remaining: a: refused, secrets \"x\": timed out",
            ),
            (
                CONTENT_REMAINING,
                "True",
                "SomeResourcesRemain",
                "Some resources are remaining: configmaps. has 1 resource instances, pods. has 1 resource instances",
            ),
            (
                FINALIZERS_REMAINING,
                "True",
                "SomeFinalizersRemain",
                "Some content in the namespace has finalizers remaining: batch.kubernetes.io/job-tracking in 1 resource instances",
            ),
        ];
        for (ty, status, reason, message) in table {
            let c = find(&first, ty);
            assert_eq!(
                (c.status.as_str(), c.reason.as_deref(), c.message.as_deref()),
                (status, Some(reason), Some(message)),
                "{ty}"
            );
            assert_eq!(c.last_transition_time, Some(t(100)));
        }
        // The same state again: no write.
        assert_eq!(update_conditions(&first, &held, &errs, &t(200)), None);
        // The deletes went through, the pod is still held: the failure clears (transition),
        // the remaining counts change without a transition.
        let mut pod_only = Content::default();
        pod_only.add("pods", "", &s(&["batch.kubernetes.io/job-tracking"]));
        let second = update_conditions(&first, &pod_only, &[], &t(300)).unwrap_or_default();
        let failure = find(&second, CONTENT_FAILURE);
        assert_eq!(failure.status, "False");
        assert_eq!(failure.reason.as_deref(), Some("ContentDeleted"));
        assert_eq!(failure.last_transition_time, Some(t(300)));
        let remaining = find(&second, CONTENT_REMAINING);
        assert_eq!(remaining.status, "True");
        assert_eq!(
            remaining.message.as_deref(),
            Some("Some resources are remaining: pods. has 1 resource instances")
        );
        assert_eq!(remaining.last_transition_time, Some(t(100)));
        // Everything gone: all five are "all is well".
        let done =
            update_conditions(&second, &Content::default(), &[], &t(400)).unwrap_or_default();
        assert!(done.iter().all(|c| c.status == "False"), "{done:?}");
        assert_eq!(
            find(&done, FINALIZERS_REMAINING).reason.as_deref(),
            Some("ContentRemoved")
        );
        assert_eq!(
            find(&done, CONTENT_REMAINING).message.as_deref(),
            Some("All content successfully removed")
        );
    }

    #[test]
    fn other_conditions_are_kept() {
        let other = NamespaceCondition {
            type_: "example.com/Custom".into(),
            status: "True".into(),
            ..Default::default()
        };
        let out = update_conditions(
            std::slice::from_ref(&other),
            &Content::default(),
            &[],
            &t(1),
        )
        .unwrap_or_default();
        assert_eq!(out.len(), 6);
        assert_eq!(out[0], other);
    }
}
