//! Server-side apply (`application/apply-patch+yaml`), after structured-merge-diff's
//! `Updater.Apply`:
//!
//! 1. the applied configuration is merged into the live object (applied values win; structs and
//!    granular maps merge; `x-kubernetes-list-type: map` lists merge items by their keys, `set`
//!    lists are unioned, atomic lists and maps are replaced);
//! 2. fields the manager applied last time but omits now are removed, unless another manager
//!    owns them (or something below them);
//! 3. fields another manager owns whose value the apply changes are conflicts: an error without
//!    `force`, taken over with `force`;
//! 4. the manager's `Apply` entry becomes exactly the set of the applied configuration; every
//!    other manager loses what was changed or removed.
//!
//! Approximations: associative-list items keep the live order with new items appended; a
//! `null` in the applied configuration removes the field without recording ownership; there is
//! no `before-first-apply` manager; the identity fields (`apiVersion`, `kind`, `metadata.name`,
//! ...) and, for kinds with a status subresource, `status` are never owned (as upstream).
//! The caller should reject an applied document that is not a JSON object (400) beforehand.

use serde_json::{Map, Value};

use super::fieldset::{self, FieldSet, Path, display, has_prefix, owned_by_config, remove_path};
use super::json_patch::json_eq;
use super::managed::{Entry, compare, entries, path_filter, set_entries};
use super::schema::{FieldMeta, TypeRef};

pub use ferry_patch::ApplyConflicts;

/// Applies `applied` (the configuration sent by `manager`) to `live` (`None` when the object does
/// not exist yet) and returns the new object with its `metadata.managedFields`.
pub fn apply(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    root: TypeRef,
    now: &str,
) -> Result<Value, ApplyConflicts> {
    let empty = Value::Object(Map::new());
    let live_v = live.unwrap_or(&empty);
    let mut cfg = match applied {
        Value::Object(_) => applied.clone(),
        _ => empty.clone(),
    };
    if let Some(Value::Object(m)) = cfg.get_mut("metadata") {
        m.shift_remove("managedFields");
    }
    let typed_for = if cfg.get("kind").is_some() {
        &cfg
    } else {
        live_v
    };
    let keep = path_filter(typed_for, None);

    let mut list = entries(live_v);
    let mine = |e: &Entry| e.same_manager(manager, "Apply", None, "");
    let last: FieldSet = list
        .iter()
        .find(|e| mine(e))
        .map(|e| e.set.clone())
        .unwrap_or_default();
    let new_set: FieldSet = owned_by_config(&cfg, root)
        .into_iter()
        .filter(|p| keep(p))
        .collect();

    let mut base = live_v.clone();
    if let Some(Value::Object(m)) = base.get_mut("metadata") {
        m.shift_remove("managedFields");
    }
    let mut merged = merge(Some(&base), &cfg, root, FieldMeta::NONE);

    // Prune what this manager no longer applies, unless someone else still owns it.
    let others: Vec<&FieldSet> = list.iter().filter(|e| !mine(e)).map(|e| &e.set).collect();
    for p in last.difference(&new_set) {
        let owned_elsewhere = others.iter().any(|s| s.iter().any(|q| has_prefix(q, p)));
        let still_applied = new_set.iter().any(|q| has_prefix(q, p));
        if !owned_elsewhere && !still_applied {
            remove_path(&mut merged, root, p);
        }
    }

    let (changed, removed) = compare(&base, &merged, root);
    let mut conflicts: Vec<(String, &Path)> = Vec::new();
    for e in list.iter().filter(|e| !mine(e)) {
        for p in e.set.intersection(&changed) {
            conflicts.push((e.manager.clone(), p));
        }
    }
    // kubectl's own server-side apply takes over, without conflicts, the fields that its
    // client-side apply last applied and that still hold those values (upstream's
    // lastAppliedManager): the migration from `kubectl apply` to `kubectl apply --server-side`.
    if !force
        && !conflicts.is_empty()
        && manager == KUBECTL
        && let Some(allowed) = allowed_from_last_applied(live_v, &cfg, root)
    {
        conflicts.retain(|(_, p)| !allowed.contains(*p));
    }
    if !force && !conflicts.is_empty() {
        let mut conflicts: Vec<(String, String)> = conflicts
            .into_iter()
            .map(|(m, p)| (m, display(p)))
            .collect();
        conflicts.sort();
        conflicts.dedup();
        return Err(ApplyConflicts { conflicts });
    }
    for e in list.iter_mut().filter(|e| !mine(e)) {
        e.set
            .retain(|p| !changed.contains(p) && !removed.contains(p));
    }
    let api_version = cfg
        .get("apiVersion")
        .or_else(|| live_v.get("apiVersion"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let entry = Entry {
        manager: manager.to_string(),
        operation: "Apply".into(),
        api_version,
        time: Some(now.to_string()),
        subresource: None,
        set: new_set,
    };
    match list.iter_mut().find(|e| mine(e)) {
        Some(e) => *e = entry,
        None => list.push(entry),
    }
    set_entries(&mut merged, &list);
    // ... and keeps the client-side annotation in step with what it applies (upstream's
    // lastAppliedUpdater), so a later client-side `kubectl apply` computes the right patch.
    if manager == KUBECTL && last_applied(&merged).is_some() {
        let text = build_last_applied(applied);
        if let Some(Value::Object(a)) = merged.pointer_mut("/metadata/annotations") {
            a.insert(LAST_APPLIED.to_string(), Value::String(text));
        }
    }
    Ok(merged)
}

/// The field manager whose applies migrate client-side apply state (upstream hard-codes it).
const KUBECTL: &str = "kubectl";
/// `kubectl apply`'s record of what it applied last.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

fn last_applied(obj: &Value) -> Option<&str> {
    obj.pointer("/metadata/annotations")
        .and_then(|a| a.get(LAST_APPLIED))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// The fields of the live object's last-applied configuration whose live values are still the
/// applied ones; `None` when there is no usable annotation (then nothing is allowed).
fn allowed_from_last_applied(live: &Value, cfg: &Value, root: TypeRef) -> Option<FieldSet> {
    let text = last_applied(live)?;
    let last: Value = serde_json::from_str(text).ok()?;
    if !last.is_object() {
        return None;
    }
    let version = |v: &Value| {
        v.get("apiVersion")
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let expected = version(cfg).or_else(|| version(live));
    if version(&last) != expected {
        return None;
    }
    let mut live_plain = live.clone();
    if let Some(Value::Object(m)) = live_plain.get_mut("metadata") {
        m.shift_remove("managedFields");
    }
    let (differ, missing) = compare(&last, &live_plain, root);
    let mut set = owned_by_config(&last, root);
    set.retain(|p| !differ.contains(p) && !missing.contains(p));
    Some(set)
}

/// The annotation's text for an applied configuration: the configuration without the annotation
/// itself, keys sorted, newline-terminated (as Go's encoder writes it).
fn build_last_applied(applied: &Value) -> String {
    let mut v = sorted(applied);
    if let Some(Value::Object(a)) = v.pointer_mut("/metadata/annotations") {
        a.shift_remove(LAST_APPLIED);
    }
    let mut s = serde_json::to_string(&v).unwrap_or_default();
    s.push('\n');
    s
}

fn sorted(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), sorted(&m[k])))
                    .collect(),
            )
        }
        Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
        _ => v.clone(),
    }
}

/// Merges the applied value `cfg` into `live` (structured-merge-diff's `Merge`).
fn merge(live: Option<&Value>, cfg: &Value, t: TypeRef, meta: FieldMeta) -> Value {
    match cfg {
        Value::Object(cm) => {
            let atomic = t.is_atomic_struct() || meta.map_type == Some("atomic");
            let mut out = match live {
                Some(Value::Object(lm)) if !atomic => lm.clone(),
                _ => Map::new(),
            };
            for (k, cv) in cm {
                if cv.is_null() {
                    out.shift_remove(k);
                    continue;
                }
                let nv = merge(out.get(k), cv, t.child(k), t.child_meta(k));
                out.insert(k.clone(), nv);
            }
            Value::Object(out)
        }
        Value::Array(items) => {
            let Some(Value::Array(live_items)) = live else {
                return strip_nulls(cfg);
            };
            match meta.list_type {
                Some("map") if !meta.list_map_keys.is_empty() => {
                    let elem = t.elem();
                    let mut out = live_items.clone();
                    for item in items {
                        let key = fieldset::item_key(item, elem, meta.list_map_keys);
                        let at = out
                            .iter()
                            .position(|l| fieldset::item_key(l, elem, meta.list_map_keys) == key);
                        match at {
                            Some(i) => {
                                let m = merge(Some(&out[i]), item, elem, FieldMeta::NONE);
                                out[i] = m;
                            }
                            None => out.push(strip_nulls(item)),
                        }
                    }
                    Value::Array(out)
                }
                Some("set") => {
                    let mut out = live_items.clone();
                    for item in items {
                        if !out.iter().any(|l| json_eq(l, item)) {
                            out.push(item.clone());
                        }
                    }
                    Value::Array(out)
                }
                _ => strip_nulls(cfg),
            }
        }
        _ => cfg.clone(),
    }
}

fn strip_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, x)| !x.is_null())
                .map(|(k, x)| (k.clone(), strip_nulls(x)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_nulls).collect()),
        _ => v.clone(),
    }
}

#[cfg(test)]
mod tests;
