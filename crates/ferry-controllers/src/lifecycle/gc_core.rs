//! The garbage collector's decisions for one object, given what is known of its owners. Pure.
//!
//! Follows upstream's `attemptToDeleteItem`: owners are classified as solid (present), dangling
//! (absent, confirmed against the API server), waiting (present and being deleted in the
//! foreground) or of an unknown kind; references to an owner in another namespace, or from a
//! cluster-scoped dependent to a namespaced owner, count as dangling.

/// What is known of one owner reference of an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerState {
    /// The owner exists with the referenced uid and is not deleting in the foreground.
    Solid,
    /// The owner exists and is being deleted with the `foregroundDeletion` finalizer.
    Waiting,
    /// The owner does not exist (confirmed), or the reference is invalid.
    Dangling,
    /// The owner's kind is not served, or its state could not be read: never acted upon.
    Unknown,
}

/// The deletion policy the collector uses on a dependent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Background,
    Foreground,
    Orphan,
}

/// What to do with an object that has owner references.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Leave it.
    Keep,
    /// Remove these owner references (by uid); the other owners keep it alive.
    RemoveRefs(Vec<String>),
    /// Delete it with this propagation policy.
    Delete(Policy),
}

/// One owner reference: its uid, whether it blocks the owner's deletion, and the owner's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ref {
    pub uid: String,
    pub block_owner_deletion: bool,
    pub state: OwnerState,
}

/// The decision for an object with owner references `refs` and finalizers `finalizers`.
/// `deleting`: the object already has a deletionTimestamp.
pub fn decide(refs: &[Ref], finalizers: &[String], deleting: bool) -> Verdict {
    if refs.is_empty() || deleting {
        return Verdict::Keep;
    }
    if refs.iter().any(|r| r.state == OwnerState::Unknown) {
        return Verdict::Keep;
    }
    let solid = refs.iter().any(|r| r.state == OwnerState::Solid);
    if solid {
        let dangling: Vec<String> = refs
            .iter()
            .filter(|r| r.state != OwnerState::Solid)
            .map(|r| r.uid.clone())
            .collect();
        // Waiting owners keep their references until they are gone: only dangling ones go.
        let dangling: Vec<String> = dangling
            .into_iter()
            .filter(|u| {
                refs.iter()
                    .any(|r| &r.uid == u && r.state == OwnerState::Dangling)
            })
            .collect();
        return if dangling.is_empty() {
            Verdict::Keep
        } else {
            Verdict::RemoveRefs(dangling)
        };
    }
    let policy = if finalizers.iter().any(|f| f == "orphan") {
        Policy::Orphan
    } else if finalizers.iter().any(|f| f == "foregroundDeletion")
        || refs
            .iter()
            .any(|r| r.state == OwnerState::Waiting && r.block_owner_deletion)
    {
        Policy::Foreground
    } else {
        Policy::Background
    };
    Verdict::Delete(policy)
}

/// One dependent of an owner that is being deleted in the foreground.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dependent {
    /// Its reference to the owner has `blockOwnerDeletion: true`.
    pub blocks: bool,
    pub deleting: bool,
}

/// What to do for an owner carrying the `foregroundDeletion` finalizer: which dependents (by
/// index) to delete and with which policy, and whether the finalizer can go.
pub fn foreground(deps: &[Dependent]) -> (Vec<(usize, Policy)>, bool) {
    let mut delete = Vec::new();
    for (i, d) in deps.iter().enumerate() {
        if !d.deleting {
            delete.push((
                i,
                if d.blocks {
                    Policy::Foreground
                } else {
                    Policy::Background
                },
            ));
        }
    }
    let done = !deps.iter().any(|d| d.blocks);
    (delete, done)
}

/// What to do for an owner that is being deleted, after its finalizers (upstream's
/// `attemptToOrphan` and the foreground branch of `attemptToDeleteItem`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OwnerPlan {
    /// Dependents (by index) whose reference to the owner is removed (orphan propagation).
    pub unlink: Vec<usize>,
    /// Dependents (by index) to delete, and how (foreground propagation).
    pub delete: Vec<(usize, Policy)>,
    /// The finalizer to remove once the writes above succeeded.
    pub remove_finalizer: Option<&'static str>,
}

/// The plan for an owner with `finalizers`, `deleting` or not, and its dependents. `orphan`
/// wins over `foregroundDeletion`, as upstream processes it first; background deletion needs
/// no owner work (dependents find their owner gone).
pub fn owner_plan(deleting: bool, finalizers: &[String], deps: &[Dependent]) -> OwnerPlan {
    if !deleting {
        return OwnerPlan::default();
    }
    if finalizers.iter().any(|f| f == "orphan") {
        return OwnerPlan {
            unlink: (0..deps.len()).collect(),
            delete: Vec::new(),
            remove_finalizer: Some("orphan"),
        };
    }
    if finalizers.iter().any(|f| f == "foregroundDeletion") {
        let (delete, done) = foreground(deps);
        return OwnerPlan {
            unlink: Vec::new(),
            delete,
            remove_finalizer: done.then_some("foregroundDeletion"),
        };
    }
    OwnerPlan::default()
}

#[allow(clippy::type_complexity)]
#[cfg(test)]
mod tests {
    use super::*;
    use OwnerState::*;

    fn r(uid: &str, block: bool, state: OwnerState) -> Ref {
        Ref {
            uid: uid.into(),
            block_owner_deletion: block,
            state,
        }
    }

    #[test]
    fn decide_table() {
        let fin = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let cases: Vec<(&str, Vec<Ref>, Vec<String>, bool, Verdict)> = vec![
            ("no owners", vec![], vec![], false, Verdict::Keep),
            (
                "one solid",
                vec![r("a", true, Solid)],
                vec![],
                false,
                Verdict::Keep,
            ),
            (
                "all dangling",
                vec![r("a", true, Dangling), r("b", false, Dangling)],
                vec![],
                false,
                Verdict::Delete(Policy::Background),
            ),
            (
                "solid and dangling",
                vec![r("a", true, Solid), r("b", false, Dangling)],
                vec![],
                false,
                Verdict::RemoveRefs(vec!["b".into()]),
            ),
            (
                "solid and waiting",
                vec![r("a", true, Solid), r("b", true, Waiting)],
                vec![],
                false,
                Verdict::Keep,
            ),
            (
                "waiting and blocking",
                vec![r("a", true, Waiting)],
                vec![],
                false,
                Verdict::Delete(Policy::Foreground),
            ),
            (
                "waiting, not blocking",
                vec![r("a", false, Waiting)],
                vec![],
                false,
                Verdict::Delete(Policy::Background),
            ),
            (
                "unknown owner kind is never collected",
                vec![r("a", true, Unknown), r("b", true, Dangling)],
                vec![],
                false,
                Verdict::Keep,
            ),
            (
                "already deleting",
                vec![r("a", true, Dangling)],
                vec![],
                true,
                Verdict::Keep,
            ),
            (
                "own orphan finalizer kept",
                vec![r("a", true, Dangling)],
                fin(&["orphan"]),
                false,
                Verdict::Delete(Policy::Orphan),
            ),
            (
                "own foreground finalizer kept",
                vec![r("a", false, Dangling)],
                fin(&["foregroundDeletion"]),
                false,
                Verdict::Delete(Policy::Foreground),
            ),
        ];
        for (name, refs, fins, deleting, want) in cases {
            assert_eq!(decide(&refs, &fins, deleting), want, "{name}");
        }
    }

    #[test]
    fn foreground_table() {
        let d = |blocks, deleting| Dependent { blocks, deleting };
        let cases: Vec<(Vec<Dependent>, Vec<(usize, Policy)>, bool)> = vec![
            (vec![], vec![], true),
            (
                vec![d(true, false), d(false, false)],
                vec![(0, Policy::Foreground), (1, Policy::Background)],
                false,
            ),
            (vec![d(true, true)], vec![], false),
            (vec![d(false, true)], vec![], true),
        ];
        for (deps, want_del, want_done) in cases {
            assert_eq!(foreground(&deps), (want_del, want_done), "{deps:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn never_deletes_with_a_solid_owner(states in proptest::collection::vec(0u8..4, 1..6)) {
            let refs: Vec<Ref> = states.iter().enumerate().map(|(i, s)| r(&i.to_string(), i % 2 == 0, match s {
                0 => Solid, 1 => Waiting, 2 => Dangling, _ => Unknown })).collect();
            let v = decide(&refs, &[], false);
            if refs.iter().any(|r| r.state == Solid || r.state == Unknown) {
                proptest::prop_assert!(!matches!(v, Verdict::Delete(_)));
            }
        }
    }

    #[test]
    fn owner_plan_table() {
        let fin = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let dep = |blocks, deleting| Dependent { blocks, deleting };
        let deps = vec![dep(true, false), dep(false, false), dep(true, true)];
        // Not deleting: nothing, whatever the finalizers.
        assert_eq!(
            owner_plan(false, &fin(&["orphan"]), &deps),
            OwnerPlan::default()
        );
        // Background: the owner goes at once; dependents are collected later.
        assert_eq!(owner_plan(true, &[], &deps), OwnerPlan::default());
        // Orphan: every dependent loses the reference, then the finalizer goes.
        let p = owner_plan(true, &fin(&["orphan"]), &deps);
        assert_eq!(p.unlink, vec![0, 1, 2]);
        assert!(p.delete.is_empty());
        assert_eq!(p.remove_finalizer, Some("orphan"));
        // Orphan wins over foreground.
        let p = owner_plan(true, &fin(&["foregroundDeletion", "orphan"]), &deps);
        assert_eq!(p.remove_finalizer, Some("orphan"));
        // Foreground: dependents not yet deleting are deleted (blocking ones in the
        // foreground too); the finalizer stays while a blocking dependent exists.
        let p = owner_plan(true, &fin(&["foregroundDeletion"]), &deps);
        assert!(p.unlink.is_empty());
        assert_eq!(
            p.delete,
            vec![(0, Policy::Foreground), (1, Policy::Background)]
        );
        assert_eq!(p.remove_finalizer, None);
        // Only non-blocking dependents left: the owner may go.
        let p = owner_plan(true, &fin(&["foregroundDeletion"]), &[dep(false, true)]);
        assert!(p.delete.is_empty());
        assert_eq!(p.remove_finalizer, Some("foregroundDeletion"));
        // No dependents at all.
        let p = owner_plan(true, &fin(&["foregroundDeletion"]), &[]);
        assert_eq!(p.remove_finalizer, Some("foregroundDeletion"));
        let p = owner_plan(true, &fin(&["orphan"]), &[]);
        assert_eq!((p.unlink.len(), p.remove_finalizer), (0, Some("orphan")));
    }
}
