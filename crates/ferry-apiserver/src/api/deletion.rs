//! The deletion decisions of the generic store (no IO): what a DELETE does to an object (remove
//! it now, mark it with a deletionTimestamp and grace period, or leave it as it is), which
//! garbage-collector finalizers a propagation policy adds, and when an object that is being
//! deleted has no finalizers left and goes (upstream's `BeforeDelete` and
//! `ShouldDeleteDuringUpdate`).

/// The garbage collector's finalizers.
pub const FOREGROUND: &str = "foregroundDeletion";
pub const ORPHAN: &str = "orphan";

/// What the delete is about, read from the stored object and the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteRequest<'a> {
    /// The object's `metadata.finalizers`.
    pub finalizers: &'a [String],
    /// Finalizers outside the metadata that also hold the deletion (a Namespace's spec).
    pub spec_finalizers: &'a [String],
    /// `propagationPolicy` (or `orphanDependents`) of the DeleteOptions.
    pub propagation: Option<&'a str>,
    /// The kind's graceful deletion of this object: `Some(grace)` when graceful.
    pub graceful: Option<i64>,
    /// The object has a deletionTimestamp already.
    pub deleting: bool,
    /// Its `deletionGracePeriodSeconds`, if any.
    pub current_grace: Option<i64>,
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeletePlan {
    /// Remove the object from the store now.
    Remove,
    /// Write nothing; answer with the object as stored, with this code.
    Unchanged { code: u16 },
    /// Mark the object: `deletionGracePeriodSeconds` = `grace`, the deletionTimestamp to now +
    /// `grace` when `set_timestamp` (a first delete, or a graceful one shortening the period),
    /// these `finalizers`; the generation is bumped. Answer with the written object and `code`.
    Mark {
        finalizers: Vec<String>,
        grace: i64,
        set_timestamp: bool,
        code: u16,
    },
}

/// The finalizers after applying a propagation policy: Foreground adds `foregroundDeletion`
/// (and drops `orphan`), Orphan adds `orphan` (and drops `foregroundDeletion`), Background
/// drops both; no policy keeps them.
pub fn with_propagation(finalizers: &[String], propagation: Option<&str>) -> Vec<String> {
    let mut f = finalizers.to_vec();
    let ensure = |f: &mut Vec<String>, add: &str, drop: &str| {
        f.retain(|x| x != drop);
        if !f.iter().any(|x| x == add) {
            f.push(add.to_string());
        }
    };
    match propagation {
        Some("Foreground") => ensure(&mut f, FOREGROUND, ORPHAN),
        Some("Orphan") => ensure(&mut f, ORPHAN, FOREGROUND),
        Some("Background") => f.retain(|x| x != FOREGROUND && x != ORPHAN),
        _ => {}
    }
    f
}

/// Decides a DELETE.
pub fn plan(r: &DeleteRequest) -> DeletePlan {
    let finalizers = with_propagation(r.finalizers, r.propagation);
    let grace = r.graceful.unwrap_or(0);
    let code = if r.propagation == Some("Foreground") {
        202
    } else {
        200
    };
    if finalizers.is_empty() && grace == 0 && r.spec_finalizers.is_empty() {
        return DeletePlan::Remove;
    }
    let unchanged_finalizers = finalizers.as_slice() == r.finalizers;
    if r.deleting && unchanged_finalizers {
        // A repeated delete may shorten the grace period, never lengthen it.
        if grace != 0 && r.current_grace.is_some_and(|c| grace >= c) {
            return DeletePlan::Unchanged { code: 200 };
        }
        if grace == 0 {
            // Shortening a pending grace period to 0 is recorded even while finalizers hold
            // the object (upstream's `BeforeDelete`): it then goes as soon as they are removed.
            // A node agent's final delete of a pod whose job-tracking finalizer is not released
            // yet would otherwise leave the pod behind for good.
            if r.current_grace.is_some_and(|c| c > 0) {
                return DeletePlan::Mark {
                    finalizers,
                    grace: 0,
                    set_timestamp: true,
                    code,
                };
            }
            return DeletePlan::Unchanged { code };
        }
    }
    DeletePlan::Mark {
        finalizers,
        grace,
        set_timestamp: !r.deleting || r.graceful.is_some(),
        code,
    }
}

/// Whether an object goes for good: it is being deleted, its grace period is over (0) and no
/// finalizer is left (upstream's `ShouldDeleteDuringUpdate`; a pod in graceful termination
/// stays until its agent deletes it with grace 0).
pub fn finalized(
    deleting: bool,
    grace: Option<i64>,
    finalizers: &[String],
    spec_finalizers: &[String],
) -> bool {
    deleting && grace.unwrap_or(0) == 0 && finalizers.is_empty() && spec_finalizers.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn propagation_finalizers() {
        let table: &[(&[&str], Option<&str>, &[&str])] = &[
            (&[], None, &[]),
            (&["a"], None, &["a"]),
            (&[ORPHAN], None, &[ORPHAN]),
            (&[], Some("Foreground"), &[FOREGROUND]),
            (&["a", ORPHAN], Some("Foreground"), &["a", FOREGROUND]),
            (&[FOREGROUND], Some("Foreground"), &[FOREGROUND]),
            (&[], Some("Orphan"), &[ORPHAN]),
            (&[FOREGROUND, "a"], Some("Orphan"), &["a", ORPHAN]),
            (&[ORPHAN], Some("Orphan"), &[ORPHAN]),
            (&[FOREGROUND, ORPHAN, "a"], Some("Background"), &["a"]),
            (&["a"], Some("Background"), &["a"]),
        ];
        for (before, policy, want) in table {
            assert_eq!(
                with_propagation(&s(before), *policy),
                s(want),
                "{before:?} {policy:?}"
            );
        }
    }

    #[test]
    fn plans() {
        let none: Vec<String> = Vec::new();
        let one = s(&["example.com/keep"]);
        let fg = s(&[FOREGROUND]);
        let ns = s(&["kubernetes"]);
        let req = |finalizers, spec_finalizers, propagation, graceful, deleting, current_grace| {
            DeleteRequest {
                finalizers,
                spec_finalizers,
                propagation,
                graceful,
                deleting,
                current_grace,
            }
        };
        let mark = |finalizers: &[String], grace, set_timestamp, code| DeletePlan::Mark {
            finalizers: finalizers.to_vec(),
            grace,
            set_timestamp,
            code,
        };
        let table = [
            // Nothing holds it: gone at once (whatever the policy).
            (
                req(&none, &none, None, None, false, None),
                DeletePlan::Remove,
            ),
            (
                req(&none, &none, Some("Background"), None, false, None),
                DeletePlan::Remove,
            ),
            (
                req(&fg, &none, Some("Background"), None, true, Some(0)),
                DeletePlan::Remove,
            ),
            // A graceful delete with grace 0 removes it too.
            (
                req(&none, &none, None, Some(0), false, None),
                DeletePlan::Remove,
            ),
            // Finalizers: marked with grace 0; GC policies add theirs.
            (
                req(&one, &none, None, None, false, None),
                mark(&one, 0, true, 200),
            ),
            (
                req(&none, &none, Some("Foreground"), None, false, None),
                mark(&fg, 0, true, 202),
            ),
            (
                req(&none, &none, Some("Orphan"), None, false, None),
                mark(&s(&[ORPHAN]), 0, true, 200),
            ),
            // A Namespace's spec finalizers hold it as well.
            (
                req(&none, &ns, None, None, false, None),
                mark(&none, 0, true, 200),
            ),
            // Deleting again changes nothing...
            (
                req(&one, &none, None, None, true, Some(0)),
                DeletePlan::Unchanged { code: 200 },
            ),
            (
                req(&fg, &none, Some("Foreground"), None, true, Some(0)),
                DeletePlan::Unchanged { code: 202 },
            ),
            // ...unless the policy changes the finalizers: the timestamp stays.
            (
                req(&one, &none, Some("Orphan"), None, true, Some(0)),
                mark(&s(&["example.com/keep", ORPHAN]), 0, false, 200),
            ),
            // Graceful (a bound pod): marked with its grace period.
            (
                req(&none, &none, None, Some(30), false, None),
                mark(&none, 30, true, 200),
            ),
            // Again with the same or a longer period: unchanged; shorter: marked anew.
            (
                req(&none, &none, None, Some(30), true, Some(30)),
                DeletePlan::Unchanged { code: 200 },
            ),
            (
                req(&none, &none, None, Some(60), true, Some(30)),
                DeletePlan::Unchanged { code: 200 },
            ),
            (
                req(&none, &none, None, Some(5), true, Some(30)),
                mark(&none, 5, true, 200),
            ),
            // A graceful pod deleted with grace 0 while terminating goes at once.
            (
                req(&none, &none, None, Some(0), true, Some(30)),
                DeletePlan::Remove,
            ),
            // With finalizers left it stays, its grace period cut to 0 (it goes when they
            // are removed); once at 0, deleting again changes nothing; a first such delete
            // marks it.
            (
                req(&one, &none, None, Some(0), true, Some(30)),
                mark(&one, 0, true, 200),
            ),
            (
                req(&one, &none, None, Some(0), true, Some(0)),
                DeletePlan::Unchanged { code: 200 },
            ),
            (
                req(&one, &none, None, Some(0), false, None),
                mark(&one, 0, true, 200),
            ),
        ];
        for (r, want) in table {
            assert_eq!(plan(&r), want, "{r:?}");
        }
    }

    #[test]
    fn finalized_when_nothing_holds_it() {
        let none: Vec<String> = Vec::new();
        let one = s(&["a"]);
        let table = [
            (true, None, &none, &none, true),
            (true, Some(0), &none, &none, true),
            (false, Some(0), &none, &none, false),
            (true, Some(30), &none, &none, false),
            (true, Some(0), &one, &none, false),
            (true, Some(0), &none, &one, false),
        ];
        for (deleting, grace, f, sf, want) in table {
            assert_eq!(
                finalized(deleting, grace, f, sf),
                want,
                "{deleting} {grace:?} {f:?} {sf:?}"
            );
        }
    }
}
