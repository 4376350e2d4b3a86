//! Kubernetes strategic merge patch (`application/strategic-merge-patch+json`), with the
//! semantics of upstream's `apimachinery/pkg/util/strategicpatch` (applying side):
//!
//! * maps merge recursively; `null` deletes a key;
//! * lists whose field has `patchStrategy: merge` are merged: lists of maps by the field's
//!   `patchMergeKey`, lists of scalars as sets; every other list is replaced wholesale;
//! * directives: `$patch: replace | delete` (and a no-op `merge`) in maps, `$patch: delete |
//!   replace` items in merged lists, `$setElementOrder/<field>`, `$deleteFromPrimitiveList/<field>`
//!   and `$retainKeys`;
//! * order of merged lists: items named by the patch come in the patch's (or
//!   `$setElementOrder`'s) order, server-only items keep their relative place, as upstream's
//!   `normalizeElementOrder` does.
//!
//! No `$` directive survives in the result, not even inside values that are added or replaced
//! wholesale (upstream leaves some there; we strip them, and keep `$patch: replace` maps that are
//! new instead of dropping them as upstream does).

use serde_json::{Map, Value};

use super::PatchError;
use super::json_patch::json_eq;
use super::schema::{FieldMeta, TypeRef};

const PATCH: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const SET_ORDER: &str = "$setElementOrder/";
const DELETE_PRIMITIVE: &str = "$deleteFromPrimitiveList/";

/// Applies the strategic merge patch `patch` to `original`, whose type is `schema` (use
/// [`TypeRef::UNTYPED`] for kinds without patch metadata: maps merge, lists are replaced).
pub fn apply(original: &Value, patch: &Value, schema: TypeRef) -> Result<Value, PatchError> {
    let Value::Object(p) = patch else {
        return Err(PatchError::bad(
            "invalid JSON document: a strategic merge patch must be a JSON object",
        ));
    };
    let o = match original {
        Value::Object(m) => m.clone(),
        _ => Map::new(),
    };
    merge_map(o, p, schema).map(Value::Object)
}

fn merge_map(
    mut original: Map<String, Value>,
    patch: &Map<String, Value>,
    t: TypeRef,
) -> Result<Map<String, Value>, PatchError> {
    match patch.get(PATCH) {
        None => {}
        Some(Value::String(s)) if s == "replace" => {
            return merge_map(Map::new(), &without(patch, PATCH), t);
        }
        Some(Value::String(s)) if s == "delete" => return Ok(Map::new()),
        Some(Value::String(s)) if s == "merge" => {}
        Some(other) => {
            return Err(PatchError::bad(format!(
                "unknown patch type: {other} in map: {}",
                Value::Object(patch.clone())
            )));
        }
    }

    if let Some(rk) = patch.get(RETAIN_KEYS) {
        let Value::Array(keys) = rk else {
            return Err(PatchError::bad("invalid patch format of retainKeys"));
        };
        let keep = |k: &str| keys.iter().any(|v| v.as_str() == Some(k));
        for (k, v) in patch {
            if v.is_null() || k.starts_with('$') {
                continue;
            }
            if !keep(k) {
                return Err(PatchError::bad("invalid patch format of retainKeys"));
            }
        }
        original.retain(|k, _| keep(k));
    }

    // `$setElementOrder/<field>` together with `<field>`.
    // Merged lists wait for their own key in the main loop, so that new keys keep patch order.
    let mut done: Vec<(&str, Option<Value>)> = Vec::new();
    for (k, order) in patch {
        let Some(field) = k.strip_prefix(SET_ORDER) else {
            continue;
        };
        if field.is_empty() {
            return Err(PatchError::bad(
                "invalid patch format of setElementOrder list",
            ));
        }
        let Value::Array(order) = order else {
            return Err(PatchError::bad(
                "invalid patch format of setElementOrder list",
            ));
        };
        let meta = t.child_meta(field);
        let elem = t.child(field).elem();
        let key = meta.patch_merge_key;
        let patch_list = match patch.get(field) {
            Some(Value::Array(l)) => Some(l),
            Some(Value::Null) | None => None,
            Some(_) => {
                return Err(PatchError::bad(format!(
                    "invalid patch format of setElementOrder list: {field} is not a list"
                )));
            }
        };
        validate_order(patch_list.map(Vec::as_slice).unwrap_or(&[]), order, key)?;
        let original_list = match original.get(field) {
            Some(Value::Array(l)) => Some(l.clone()),
            _ => None,
        };
        let merged = match (&original_list, patch_list) {
            (None, None) => continue,
            (Some(o), None) => o.clone(),
            (None, Some(p)) => merge_field(None, &Value::Array(p.clone()), t.child(field), meta)?
                .and_then(|v| match v {
                    Value::Array(a) => Some(a),
                    _ => None,
                })
                .unwrap_or_default(),
            (Some(o), Some(p)) => {
                if meta.smp_merges() {
                    merge_list(o.clone(), p, elem, key)?
                } else {
                    clean_list(p, elem, meta)?
                }
            }
        };
        let (in_order, server_only) = partition(merged, order, key)?;
        let in_order = sort_by(in_order, order, key)?;
        let server_order = original_list.unwrap_or_default();
        let server_only = sort_by(server_only, &server_order, key)?;
        let merged = Value::Array(merge_sorted(server_only, in_order, &server_order, key));
        if patch_list.is_some() {
            done.push((field, Some(merged)));
        } else {
            original.insert(field.to_string(), merged);
        }
    }

    for (k, pv) in patch {
        if let Some((_, slot)) = done.iter_mut().find(|(f, _)| *f == k.as_str()) {
            if let Some(v) = slot.take() {
                original.insert(k.clone(), v);
            }
            continue;
        }
        if k.starts_with('$') {
            // `$patch`, `$retainKeys`, `$setElementOrder/...` (handled above) or an unknown
            // directive: never stored.
            continue;
        }
        let prior = original.get_mut(k).map(std::mem::take);
        match merge_field(prior, pv, t.child(k), t.child_meta(k))? {
            Some(v) => {
                // Replaces in place when the key exists (keeping the key order), else appends.
                original.insert(k.clone(), v);
            }
            None => {
                original.shift_remove(k);
            }
        }
    }
    // `$deleteFromPrimitiveList/<field>` last, after additions to the same list.
    for (k, pv) in patch {
        let Some(field) = k.strip_prefix(DELETE_PRIMITIVE) else {
            continue;
        };
        if field.is_empty() {
            return Err(PatchError::bad("invalid patch format of primitive list"));
        }
        let Value::Array(del) = pv else {
            return Err(PatchError::bad("invalid patch format of primitive list"));
        };
        if let Some(Value::Array(cur)) = original.get_mut(field) {
            cur.retain(|v| !del.iter().any(|d| json_eq(d, v)));
        }
    }
    Ok(original)
}

fn without(m: &Map<String, Value>, key: &str) -> Map<String, Value> {
    let mut out = m.clone();
    out.shift_remove(key);
    out
}

/// Merges one patch value into the original value of a field (`None` = absent). Returns the new
/// value, or `None` when the field must be absent.
fn merge_field(
    original: Option<Value>,
    pv: &Value,
    t: TypeRef,
    meta: FieldMeta,
) -> Result<Option<Value>, PatchError> {
    match pv {
        Value::Null => Ok(None),
        Value::Object(pm) => {
            let existed = matches!(original, Some(Value::Object(_)));
            if !existed && pm.get(PATCH).and_then(Value::as_str) == Some("delete") {
                return Ok(None);
            }
            let base = match original {
                Some(Value::Object(om)) if !meta.smp_replaces() => om,
                _ => Map::new(),
            };
            Ok(Some(Value::Object(merge_map(base, pm, t)?)))
        }
        Value::Array(pl) => {
            let elem = t.elem();
            match original {
                Some(Value::Array(ol)) if meta.smp_merges() => Ok(Some(Value::Array(merge_list(
                    ol,
                    pl,
                    elem,
                    meta.patch_merge_key,
                )?))),
                _ if meta.smp_merges() => Ok(Some(Value::Array(merge_list(
                    Vec::new(),
                    pl,
                    elem,
                    meta.patch_merge_key,
                )?))),
                _ => Ok(Some(Value::Array(clean_list(pl, elem, meta)?))),
            }
        }
        scalar => Ok(Some(scalar.clone())),
    }
}

/// A list that replaces the original wholesale: items are cleaned of directives (items that are
/// themselves directives are dropped, as upstream's `removeDirectives` does).
fn clean_list(pl: &[Value], elem: TypeRef, _meta: FieldMeta) -> Result<Vec<Value>, PatchError> {
    let mut out = Vec::with_capacity(pl.len());
    for item in pl {
        match item {
            Value::Object(m) if m.contains_key(PATCH) => {}
            Value::Object(m) => out.push(Value::Object(merge_map(Map::new(), m, elem)?)),
            Value::Array(a) => out.push(Value::Array(clean_list(
                a,
                TypeRef::UNTYPED,
                FieldMeta::NONE,
            )?)),
            v => out.push(v.clone()),
        }
    }
    Ok(out)
}

#[derive(PartialEq, Eq, Clone, Copy)]
enum ElemKind {
    Map,
    Scalar,
}

fn elem_kind(lists: &[&[Value]]) -> Result<Option<ElemKind>, PatchError> {
    let mut kind = None;
    for l in lists {
        for v in l.iter() {
            let k = match v {
                Value::Object(_) => ElemKind::Map,
                Value::Array(_) => {
                    return Err(PatchError::invalid("lists of lists are not supported"));
                }
                Value::Null => continue,
                _ => ElemKind::Scalar,
            };
            match kind {
                None => kind = Some(k),
                Some(prev) if prev != k => {
                    return Err(PatchError::invalid("list element types are not identical"));
                }
                _ => {}
            }
        }
    }
    Ok(kind)
}

fn key_of<'a>(item: &'a Value, key: &str) -> Result<&'a Value, PatchError> {
    item.get(key).ok_or_else(|| {
        PatchError::invalid(format!(
            "map: {item} does not contain declared merge key: {key}"
        ))
    })
}

/// Merges a list with `patchStrategy: merge`.
fn merge_list(
    mut original: Vec<Value>,
    patch: &[Value],
    elem: TypeRef,
    key: Option<&str>,
) -> Result<Vec<Value>, PatchError> {
    if original.is_empty() && patch.is_empty() {
        return Ok(original);
    }
    match elem_kind(&[&original, patch])? {
        None => Ok(patch.to_vec()),
        Some(ElemKind::Scalar) => {
            let mut merged: Vec<Value> = Vec::with_capacity(original.len() + patch.len());
            for v in original.iter().chain(patch) {
                if !merged.iter().any(|m| json_eq(m, v)) {
                    merged.push(v.clone());
                }
            }
            let (in_patch, server_only) = partition(merged, patch, None)?;
            let in_patch = sort_by(in_patch, patch, None)?;
            let server_only = sort_by(server_only, &original, None)?;
            Ok(merge_sorted(server_only, in_patch, &original, None))
        }
        Some(ElemKind::Map) => {
            let Some(key) = key else {
                let name = elem.definition().unwrap_or("an untyped list");
                return Err(PatchError::invalid(format!(
                    "cannot merge lists without merge key for {name}"
                )));
            };
            // Special elements first.
            let mut plain: Vec<&Value> = Vec::new();
            let mut replace = false;
            for item in patch {
                match item.get(PATCH) {
                    None => plain.push(item),
                    Some(Value::String(s)) if s == "delete" => {
                        let kv = key_of(item, key)?;
                        original.retain(|o| !o.get(key).is_some_and(|ov| json_eq(ov, kv)));
                    }
                    Some(Value::String(s)) if s == "replace" => replace = true,
                    Some(Value::String(s)) if s == "merge" => {
                        return Err(PatchError::invalid(
                            "merging lists cannot yet be specified in the patch",
                        ));
                    }
                    Some(other) => {
                        return Err(PatchError::bad(format!(
                            "unknown patch type: {other} in map: {item}"
                        )));
                    }
                }
            }
            if replace {
                let mut out = Vec::with_capacity(plain.len());
                for item in plain {
                    if let Value::Object(m) = item {
                        out.push(Value::Object(merge_map(Map::new(), m, elem)?));
                    }
                }
                return Ok(out);
            }
            let server_order = original.clone();
            let mut merged = original;
            for item in &plain {
                let kv = key_of(item, key)?;
                let Value::Object(pm) = item else { continue };
                match merged
                    .iter()
                    .position(|o| o.get(key).is_some_and(|ov| json_eq(ov, kv)))
                {
                    Some(i) => {
                        let base = match std::mem::take(&mut merged[i]) {
                            Value::Object(m) => m,
                            _ => Map::new(),
                        };
                        merged[i] = Value::Object(merge_map(base, pm, elem)?);
                    }
                    None => merged.push(Value::Object(merge_map(Map::new(), pm, elem)?)),
                }
            }
            let plain: Vec<Value> = plain.into_iter().cloned().collect();
            let (in_patch, server_only) = partition(merged, &plain, Some(key))?;
            let in_patch = sort_by(in_patch, &plain, Some(key))?;
            let server_only = sort_by(server_only, &server_order, Some(key))?;
            Ok(merge_sorted(
                server_only,
                in_patch,
                &server_order,
                Some(key),
            ))
        }
    }
}

/// The identity of a list item: its merge key value, or the item itself for scalars.
fn ident<'a>(item: &'a Value, key: Option<&str>) -> Option<&'a Value> {
    match key {
        Some(k) => item.get(k),
        None => Some(item),
    }
}

fn position(list: &[Value], item: &Value, key: Option<&str>) -> Option<usize> {
    let id = ident(item, key)?;
    list.iter()
        .position(|v| ident(v, key).is_some_and(|w| json_eq(w, id)))
}

/// Splits `items` into those named in `by` and the rest.
fn partition(
    items: Vec<Value>,
    by: &[Value],
    key: Option<&str>,
) -> Result<(Vec<Value>, Vec<Value>), PatchError> {
    let mut yes = Vec::new();
    let mut no = Vec::new();
    for v in items {
        if let Some(k) = key {
            key_of(&v, k)?;
        }
        if position(by, &v, key).is_some() {
            yes.push(v)
        } else {
            no.push(v)
        }
    }
    Ok((yes, no))
}

/// Stable sort of `items` by their position in `order` (items not in `order` keep their place
/// relative to each other and go last among equals, as upstream's comparator does).
fn sort_by(
    mut items: Vec<Value>,
    order: &[Value],
    key: Option<&str>,
) -> Result<Vec<Value>, PatchError> {
    if let Some(k) = key {
        for v in items.iter().chain(order) {
            key_of(v, k)?;
        }
    }
    items.sort_by_key(|v| position(order, v, key).unwrap_or(usize::MAX));
    Ok(items)
}

/// Interleaves server-only items (`left`) into the patch items (`right`), both already sorted,
/// using their positions in the live list (upstream's `mergeSortedSlice`).
fn merge_sorted(
    left: Vec<Value>,
    right: Vec<Value>,
    server_order: &[Value],
    key: Option<&str>,
) -> Vec<Value> {
    let mut out = Vec::with_capacity(left.len() + right.len());
    let mut l = left.into_iter().peekable();
    let mut r = right.into_iter().peekable();
    loop {
        match (l.peek(), r.peek()) {
            (Some(a), Some(b)) => {
                let take_left = match (
                    position(server_order, a, key),
                    position(server_order, b, key),
                ) {
                    (Some(i), Some(j)) => i < j,
                    _ => false,
                };
                let next = if take_left { l.next() } else { r.next() };
                out.extend(next);
            }
            (Some(_), None) => out.extend(l.next()),
            (None, Some(_)) => out.extend(r.next()),
            (None, None) => break,
        }
    }
    out
}

/// Upstream's `validatePatchWithSetOrderList`: the patch list's items (deletions aside) must
/// appear in `$setElementOrder` in the same relative order.
fn validate_order(
    patch_list: &[Value],
    order: &[Value],
    key: Option<&str>,
) -> Result<(), PatchError> {
    if order.is_empty() || patch_list.is_empty() {
        return Ok(());
    }
    let items: Vec<&Value> = patch_list
        .iter()
        .filter(|v| key.is_none() || v.get(PATCH).and_then(Value::as_str) != Some("delete"))
        .filter(|v| v.get(PATCH).is_none())
        .collect();
    let (mut pi, mut oi) = (0, 0);
    while pi < items.len() && oi < order.len() {
        let same = match key {
            Some(k) => match (items[pi].get(k), order[oi].get(k)) {
                (Some(a), Some(b)) => json_eq(a, b),
                (None, _) => {
                    return Err(PatchError::invalid(format!(
                        "map: {} does not contain declared merge key: {k}",
                        items[pi]
                    )));
                }
                (_, None) => {
                    return Err(PatchError::invalid(format!(
                        "map: {} does not contain declared merge key: {k}",
                        order[oi]
                    )));
                }
            },
            None => json_eq(items[pi], &order[oi]),
        };
        if same {
            pi += 1;
        }
        oi += 1;
    }
    if pi < items.len() {
        return Err(PatchError::bad(format!(
            "The order in patch list:\n{}\n doesn't match $setElementOrder list:\n{}",
            Value::Array(patch_list.to_vec()),
            Value::Array(order.to_vec())
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
