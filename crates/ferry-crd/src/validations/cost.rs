//! Cost of a rule: upstream's limits with a simpler, sound estimate.
//!
//! Upstream (cel-go) estimates a rule's worst-case cost from the schema's `maxLength`,
//! `maxItems` and `maxProperties` when the CRD is written (refusing a rule above
//! [`STATIC_RULE_LIMIT`], or a schema whose rules add up past [`STATIC_CRD_LIMIT`]), and counts
//! the actual cost while evaluating (a rule above [`PER_CALL_LIMIT`] is cancelled; a request
//! whose rules together pass [`RUNTIME_BUDGET`] is refused).
//!
//! The approximation here walks the expression once with the same unit costs as cel-go for
//! the common cases (1 per call, select and identifier; string and list traversals at 0.1
//! per element or character; `matches` as string length × pattern length / 4; a
//! comprehension as its body cost times the range's size). Sizes come from a [`Shape`]:
//!
//! * when the CRD is written, from the schema (unbounded strings and lists are sized by
//!   the 3 MiB request limit, as upstream does; map keys as a qualified name, 317
//!   characters);
//! * when an object is validated, from the actual values the expression can reach (the
//!   largest of them where an iteration variable stands for every element).
//!
//! The runtime figure is thus an upper bound of the work evaluation does, computed before
//! evaluating, so a rule over the limit is never run. Both figures may be larger than
//! cel-go's: a rule upstream accepts close to a limit may be refused here.

use std::collections::HashMap;

use cel::common::ast::{Expr, IdedExpr};
use serde_json::Value;

/// Per-rule estimated cost limit when a CRD is written (`StaticEstimatedCostLimit`).
pub const STATIC_RULE_LIMIT: u64 = 10_000_000;
/// Estimated cost limit of all rules of one schema (`StaticEstimatedCRDCostLimit`).
pub const STATIC_CRD_LIMIT: u64 = 100_000_000;
/// Runtime cost limit of one rule evaluation (`PerCallLimit`).
pub const PER_CALL_LIMIT: u64 = 1_000_000;
/// Runtime cost budget of all rules of one request (`RuntimeCELCostBudget`).
pub const RUNTIME_BUDGET: i64 = 10_000_000;
/// Upstream's bound of an unbounded string or list: the request size limit.
const MAX_REQUEST: u64 = 3 * 1024 * 1024;
/// The length a map key is estimated at when the CRD is written: the longest qualified name
/// (a 253-character prefix, `/`, a 63-character name). Upstream's estimator does not size
/// keys by the request either; at runtime the actual keys are measured.
const MAP_KEY: u64 = 317;

/// What is known of the value an expression evaluates to.
#[derive(Clone, Debug)]
pub enum Shape<'a> {
    /// A value of this schema node (the CRD is being written).
    Schema(&'a Value),
    /// One of these values (an object is being validated).
    Values(Vec<&'a Value>),
    /// A computed value whose size is known only as a bound.
    Computed(u64),
}

fn schema_type(s: &Value) -> &str {
    s.get("type").and_then(Value::as_str).unwrap_or("")
}

fn bound(s: &Value, key: &str) -> Option<u64> {
    s.get(key).and_then(Value::as_u64)
}

/// The smallest serialized size of a value of this schema node: what an unbounded list of
/// them can hold at most within a request is `MAX_REQUEST / (min size + 1)`.
fn min_serialized(s: &Value) -> u64 {
    match schema_type(s) {
        "string" => 2 + bound(s, "minLength").unwrap_or(0),
        "array" | "object" => 2,
        _ => 1,
    }
}

/// The largest size (characters, items or entries) of a value of this schema node.
pub fn schema_size(s: &Value) -> u64 {
    match schema_type(s) {
        "string" => bound(s, "maxLength").unwrap_or(MAX_REQUEST),
        "array" => bound(s, "maxItems")
            .unwrap_or_else(|| MAX_REQUEST / (s.get("items").map(min_serialized).unwrap_or(1) + 1)),
        "object" => match (s.get("properties"), s.get("additionalProperties")) {
            (Some(Value::Object(p)), None) if !preserve(s) => p.len() as u64,
            _ => bound(s, "maxProperties").unwrap_or(MAX_REQUEST / 4),
        },
        "" => MAX_REQUEST,
        _ => 1,
    }
}

fn preserve(s: &Value) -> bool {
    s.get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        == Some(true)
        || s.get("x-kubernetes-embedded-resource")
            .and_then(Value::as_bool)
            == Some(true)
}

fn value_size(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.len() as u64,
        Value::Array(a) => a.len() as u64,
        Value::Object(o) => o.len() as u64,
        _ => 1,
    }
}

impl<'a> Shape<'a> {
    fn size(&self) -> u64 {
        match self {
            Shape::Schema(s) => schema_size(s),
            Shape::Values(vs) => vs.iter().map(|v| value_size(v)).max().unwrap_or(0),
            Shape::Computed(n) => *n,
        }
    }

    /// The field a select names (`self.spec`, escaped names included).
    fn field(&self, name: &str) -> Shape<'a> {
        match self {
            Shape::Schema(s) => {
                if let Some(Value::Object(p)) = s.get("properties")
                    && let Some((_, child)) = p.iter().find(|(k, _)| {
                        crate::validations::value::escape(k).as_deref() == Some(name)
                    })
                {
                    return Shape::Schema(child);
                }
                match s.get("additionalProperties") {
                    Some(a @ Value::Object(_)) => Shape::Schema(a),
                    _ => Shape::Computed(MAX_REQUEST),
                }
            }
            Shape::Values(vs) => Shape::Values(
                vs.iter()
                    .filter_map(|v| v.as_object())
                    .filter_map(|o| {
                        o.iter()
                            .find(|(k, _)| {
                                k.as_str() == name
                                    || crate::validations::value::escape(k).as_deref() == Some(name)
                            })
                            .map(|(_, v)| v)
                    })
                    .collect(),
            ),
            Shape::Computed(n) => Shape::Computed(*n),
        }
    }

    /// What a comprehension variable ranges over: list items, or map keys.
    fn elements(&self) -> Shape<'a> {
        match self {
            Shape::Schema(s) => match schema_type(s) {
                "array" => s
                    .get("items")
                    .map(Shape::Schema)
                    .unwrap_or(Shape::Computed(MAX_REQUEST)),
                // map keys: see MAP_KEY
                _ => Shape::Computed(MAP_KEY),
            },
            Shape::Values(vs) => {
                let mut out = Vec::new();
                let mut key_len = 0;
                for v in vs {
                    match v {
                        Value::Array(a) => out.extend(a.iter()),
                        Value::Object(o) => {
                            key_len =
                                key_len.max(o.keys().map(|k| k.len() as u64).max().unwrap_or(0))
                        }
                        _ => {}
                    }
                }
                if out.is_empty() && key_len > 0 {
                    Shape::Computed(key_len)
                } else {
                    Shape::Values(out)
                }
            }
            Shape::Computed(n) => Shape::Computed(*n),
        }
    }
}

/// An expression's cost and what it evaluates to.
struct Est<'a> {
    cost: u64,
    shape: Shape<'a>,
}

fn tenth(n: u64) -> u64 {
    n.div_ceil(10)
}

/// Estimates `expr` with `vars` bound (`self`, `oldSelf`, …).
pub fn estimate<'a>(expr: &IdedExpr, vars: &HashMap<String, Shape<'a>>) -> u64 {
    let mut scope: Vec<(String, Shape<'a>)> =
        vars.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    walk(expr, &mut scope).cost
}

fn lookup<'a>(scope: &[(String, Shape<'a>)], name: &str) -> Option<Shape<'a>> {
    scope
        .iter()
        .rev()
        .find(|(n, _)| n == name)
        .map(|(_, s)| s.clone())
}

fn literal_size(expr: &IdedExpr) -> Option<u64> {
    use cel::common::ast::LiteralValue as L;
    match &expr.expr {
        Expr::Literal(L::String(s)) => Some(s.inner().len() as u64),
        Expr::Literal(L::Bytes(b)) => Some(b.inner().len() as u64),
        Expr::Literal(_) => Some(1),
        _ => None,
    }
}

fn walk<'a>(expr: &IdedExpr, scope: &mut Vec<(String, Shape<'a>)>) -> Est<'a> {
    match &expr.expr {
        Expr::Unspecified | Expr::Literal(_) => Est {
            cost: 0,
            shape: Shape::Computed(literal_size(expr).unwrap_or(1)),
        },
        Expr::Ident(name) => Est {
            cost: 1,
            shape: lookup(scope, name).unwrap_or(Shape::Computed(1)),
        },
        Expr::Select(sel) => {
            let operand = walk(&sel.operand, scope);
            Est {
                cost: operand.cost.saturating_add(1),
                shape: if sel.test {
                    Shape::Computed(1)
                } else {
                    operand.shape.field(&sel.field)
                },
            }
        }
        Expr::List(l) => {
            let mut cost = 10u64;
            let mut size = 0u64;
            for e in &l.elements {
                let est = walk(e, scope);
                cost = cost.saturating_add(est.cost);
                size = size.max(est.shape.size());
            }
            Est {
                cost,
                shape: Shape::Computed((l.elements.len() as u64).max(size)),
            }
        }
        Expr::Map(m) => {
            let mut cost = 30u64;
            for e in &m.entries {
                if let cel::common::ast::EntryExpr::MapEntry(me) = &e.expr {
                    cost = cost
                        .saturating_add(walk(&me.key, scope).cost)
                        .saturating_add(walk(&me.value, scope).cost);
                }
            }
            Est {
                cost,
                shape: Shape::Computed(m.entries.len() as u64),
            }
        }
        Expr::Struct(_) => Est {
            cost: 40,
            shape: Shape::Computed(1),
        },
        Expr::Comprehension(c) => {
            let range = walk(&c.iter_range, scope);
            let n = range.shape.size();
            let init = walk(&c.accu_init, scope);
            scope.push((c.iter_var.clone(), range.shape.elements()));
            if let Some(v2) = &c.iter_var2 {
                scope.push((v2.clone(), range.shape.elements()));
            }
            scope.push((c.accu_var.clone(), Shape::Computed(n)));
            let cond = walk(&c.loop_cond, scope);
            let step = walk(&c.loop_step, scope);
            let result = walk(&c.result, scope);
            scope.pop();
            if c.iter_var2.is_some() {
                scope.pop();
            }
            scope.pop();
            let per_item = cond.cost.saturating_add(step.cost).saturating_add(1);
            Est {
                cost: range
                    .cost
                    .saturating_add(init.cost)
                    .saturating_add(n.saturating_mul(per_item))
                    .saturating_add(result.cost),
                shape: result.shape,
            }
        }
        Expr::Call(call) => {
            let target = call.target.as_ref().map(|t| walk(t, scope));
            let args: Vec<Est<'a>> = call.args.iter().map(|a| walk(a, scope)).collect();
            let mut cost = 1u64;
            if let Some(t) = &target {
                cost = cost.saturating_add(t.cost);
            }
            for a in &args {
                cost = cost.saturating_add(a.cost);
            }
            // the receiver, or the first argument of a global call
            let subject = target.as_ref().or(args.first());
            let subject_size = subject.map(|s| s.shape.size()).unwrap_or(1);
            let arg_size = |i: usize| {
                let off = usize::from(target.is_none());
                args.get(i + off).map(|a| a.shape.size()).unwrap_or(1)
            };
            let (extra, size) = match call.func_name.as_str() {
                "matches" | "find" | "findAll" => (
                    tenth(subject_size).saturating_mul(arg_size(0).div_ceil(4).max(1)),
                    subject_size,
                ),
                "contains" | "startsWith" | "endsWith" | "lowerAscii" | "upperAscii" | "trim"
                | "replace" | "substring" | "charAt" | "reverse" | "url" | "isURL" | "ip"
                | "isIP" | "cidr" | "isCIDR" | "quantity" | "isQuantity" | "ip.isCanonical"
                | "validate" | "format" | "string" | "bytes" | "int" | "double" => (
                    tenth(subject_size.saturating_add(arg_size(0))),
                    subject_size,
                ),
                "split" => (tenth(subject_size), subject_size),
                "indexOf" | "lastIndexOf" | "join" | "isSorted" | "sum" | "min" | "max" => {
                    (tenth(subject_size).max(subject_size / 10), subject_size)
                }
                "_==_" | "_!=_" | "_<_" | "_<=_" | "_>_" | "_>=_" => {
                    (tenth(subject_size.min(arg_size(0))), 1)
                }
                "@in" => (args.get(1).map(|a| a.shape.size()).unwrap_or(1), 1),
                "_+_" => (
                    tenth(subject_size.saturating_add(arg_size(0))),
                    subject_size.saturating_add(arg_size(0)),
                ),
                "_?_:_" => (
                    0,
                    args.iter()
                        .skip(1)
                        .map(|a| a.shape.size())
                        .max()
                        .unwrap_or(1),
                ),
                "_[_]" | "_[?_]" => {
                    let shape = args
                        .first()
                        .map(|a| a.shape.elements_or_values())
                        .unwrap_or(Shape::Computed(1));
                    return Est { cost, shape };
                }
                "size" => (0, 1),
                _ => (0, subject_size),
            };
            Est {
                cost: cost.saturating_add(extra),
                shape: Shape::Computed(size),
            }
        }
    }
}

impl<'a> Shape<'a> {
    /// What indexing a list or map yields.
    fn elements_or_values(&self) -> Shape<'a> {
        match self {
            Shape::Schema(s) => match (schema_type(s), s.get("additionalProperties")) {
                ("object", Some(a @ Value::Object(_))) => Shape::Schema(a),
                ("array", _) => s
                    .get("items")
                    .map(Shape::Schema)
                    .unwrap_or(Shape::Computed(MAX_REQUEST)),
                _ => Shape::Computed(MAX_REQUEST),
            },
            Shape::Values(vs) => Shape::Values(
                vs.iter()
                    .flat_map(|v| match v {
                        Value::Array(a) => a.iter().collect::<Vec<_>>(),
                        Value::Object(o) => o.values().collect(),
                        _ => Vec::new(),
                    })
                    .collect(),
            ),
            Shape::Computed(n) => Shape::Computed(*n),
        }
    }
}

/// The factor by which `cost` exceeds `limit`, as upstream words it.
pub fn exceeds_message(what: &str, cost: u64, limit: u64) -> String {
    let factor = cost as f64 / limit as f64;
    let factor = if factor > 100.0 {
        "more than 100x".to_string()
    } else {
        format!("{factor:.1}x")
    };
    format!(
        "{what} exceeds budget by factor of {factor} (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)"
    )
}
