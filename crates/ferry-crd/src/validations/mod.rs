//! `x-kubernetes-validations`: CEL rules on a structural schema, as kube-apiserver's
//! apiextensions-apiserver checks them when a CRD is written ([`check_schema`]) and enforces
//! them on custom objects ([`Validator`]).
//!
//! A rule sits on a schema node; `self` is the value at that node (typed by the schema, see
//! [`value`]), `oldSelf` the correlated old value on update (object fields by name, items of
//! `x-kubernetes-list-type: map` lists by their keys, of `set` lists by value). A rule that
//! uses `oldSelf` (a transition rule) runs only where an old value exists, unless it sets
//! `optionalOldSelf`, when `oldSelf` is an optional. Errors of a rule that does not use
//! `oldSelf`, on a value equal to its old value, are dropped (upstream's ratcheting turns them
//! into warnings). Costs: [`cost`].

pub mod cost;
pub mod library;
pub mod value;

use std::collections::HashMap;
use std::sync::Arc;

use cel::{Context, ExecutionError, Program, Value as Cel};
use serde_json::{Value, json};

use crate::{ErrorType, FieldError, child, index, render};

/// One `x-kubernetes-validations` entry.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rule {
    pub rule: String,
    pub message: Option<String>,
    pub message_expression: Option<String>,
    pub reason: Option<String>,
    pub field_path: Option<String>,
    pub optional_old_self: Option<bool>,
}

impl Rule {
    pub fn from_json(v: &Value) -> Rule {
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        Rule {
            rule: s("rule").unwrap_or_default(),
            message: s("message"),
            message_expression: s("messageExpression"),
            reason: s("reason"),
            field_path: s("fieldPath"),
            optional_old_self: v.get("optionalOldSelf").and_then(Value::as_bool),
        }
    }

    /// The rule as upstream's field errors print it (Go's `%#v` of the internal type).
    fn go_repr(&self) -> String {
        let q = |s: &str| serde_json::to_string(s).unwrap_or_default();
        let reason = match &self.reason {
            None => "(*apiextensions.FieldValueErrorReason)(nil)".to_string(),
            Some(r) => format!("(*apiextensions.FieldValueErrorReason)({})", q(r)),
        };
        let old = match self.optional_old_self {
            None => "(*bool)(nil)".to_string(),
            Some(b) => format!("(*bool)({b})"),
        };
        format!(
            "apiextensions.ValidationRule{{Rule:{}, Message:{}, MessageExpression:{}, Reason:{reason}, FieldPath:{}, OptionalOldSelf:{old}}}",
            q(&self.rule),
            q(self.message.as_deref().unwrap_or("")),
            q(self.message_expression.as_deref().unwrap_or("")),
            q(self.field_path.as_deref().unwrap_or("")),
        )
    }

    /// `ruleErrorString`: the message if set, else the rule.
    fn error_string(&self) -> String {
        match self.message.as_deref().map(str::trim) {
            Some(m) if !m.is_empty() => m.to_string(),
            _ => self.rule.trim().to_string(),
        }
    }

    /// `ruleMessageOrDefault`.
    fn message_or_default(&self) -> String {
        match self.message.as_deref() {
            Some(m) if !m.is_empty() => m.to_string(),
            _ => format!("failed rule: {}", self.error_string()),
        }
    }
}

const REASONS: [&str; 4] = [
    "FieldValueInvalid",
    "FieldValueForbidden",
    "FieldValueRequired",
    "FieldValueDuplicate",
];

/// Why a rule does not compile: cel-go's text (`ERROR: <input>:1:5: …`, the source line and
/// a caret).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CompileError(String);

/// Why a rule's `fieldPath` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FieldPathError {
    #[error("does not refer to a valid field")]
    NotAField,
    #[error("unexpected end of JSON path")]
    UnexpectedEnd,
    #[error("expected [ or . but got: {0}")]
    Unexpected(String),
}

/// A compiled expression: the program and whether it reads `oldSelf`.
struct Compiled {
    program: Program,
    uses_old_self: bool,
}

/// Where in a source an offset falls, as `line:column` (both from 1).
fn line_col(source: &str, offset: usize) -> (usize, usize) {
    let mut line = 1;
    let mut col = 1;
    for (i, c) in source.chars().enumerate() {
        if i == offset {
            break;
        }
        if c == '\n' {
            line += 1;
            col = 1;
        } else {
            col += 1;
        }
    }
    (line, col)
}

/// cel-go's error layout: `ERROR: <input>:L:C: msg`, the source line and a caret.
fn cel_error(source: &str, offset: usize, msg: &str) -> String {
    let (line, col) = line_col(source, offset);
    let text = source.lines().nth(line - 1).unwrap_or("");
    format!(
        "ERROR: <input>:{line}:{col}: {msg}\n | {text}\n | {}^",
        ".".repeat(col - 1)
    )
}

/// Compiles `source` for a node of `schema`: parse errors as cel-go prints them, and
/// selections of fields the schema does not declare (`undefined field 'x'`).
fn compile(
    source: &str,
    schema: &Value,
    optional_old_self: bool,
) -> Result<Compiled, CompileError> {
    let program = library::env()
        .compile(source)
        .map_err(|e| CompileError(e.to_string().replace("\n| ", "\n | ")))?;
    let mut errs = Vec::new();
    let mut scope: Vec<(String, Option<&Value>)> = vec![
        ("self".into(), Some(schema)),
        (
            "oldSelf".into(),
            if optional_old_self {
                None
            } else {
                Some(schema)
            },
        ),
    ];
    check_fields(program.expression(), &mut scope, &mut errs);
    if let Some((id, msg)) = errs.first() {
        let offset = program
            .source_info()
            .offset_for(*id)
            .map(|(s, _)| s as usize)
            .unwrap_or(0);
        return Err(CompileError(cel_error(source, offset, msg)));
    }
    let uses_old_self = program.references().has_variable("oldSelf");
    Ok(Compiled {
        program,
        uses_old_self,
    })
}

fn is_dynamic(s: &Value) -> bool {
    let f = |k: &str| s.get(k).and_then(Value::as_bool) == Some(true);
    f("x-kubernetes-preserve-unknown-fields")
        || f("x-kubernetes-embedded-resource")
        || f("x-kubernetes-int-or-string")
}

/// The schema an expression's value has, where it is known; records selections of
/// undeclared fields.
fn check_fields<'a>(
    expr: &cel::IdedExpr,
    scope: &mut Vec<(String, Option<&'a Value>)>,
    errs: &mut Vec<(u64, String)>,
) -> Option<&'a Value> {
    use cel::common::ast::Expr;
    match &expr.expr {
        Expr::Ident(name) => scope
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .and_then(|(_, s)| *s),
        Expr::Select(sel) => {
            let operand = check_fields(&sel.operand, scope, errs)?;
            if is_dynamic(operand) {
                return None;
            }
            if let Some(Value::Object(props)) = operand.get("properties") {
                let found = props
                    .iter()
                    .find(|(k, _)| value::escape(k).as_deref() == Some(sel.field.as_str()));
                match found {
                    Some((_, child)) => return (!sel.test).then_some(child),
                    None if operand.get("additionalProperties").is_none() => {
                        errs.push((expr.id, format!("undefined field '{}'", sel.field)));
                        return None;
                    }
                    None => {}
                }
            }
            match operand.get("additionalProperties") {
                Some(a @ Value::Object(_)) if !sel.test => Some(a),
                _ => None,
            }
        }
        Expr::Call(call) => {
            if let Some(t) = &call.target {
                check_fields(t, scope, errs);
            }
            let args: Vec<Option<&Value>> = call
                .args
                .iter()
                .map(|a| check_fields(a, scope, errs))
                .collect();
            if call.func_name == "_[_]" && call.target.is_none() {
                let container = args.first().copied().flatten()?;
                return container
                    .get("items")
                    .or_else(|| container.get("additionalProperties"))
                    .filter(|s| s.is_object());
            }
            None
        }
        Expr::Comprehension(c) => {
            let range = check_fields(&c.iter_range, scope, errs);
            check_fields(&c.accu_init, scope, errs);
            let elem = range.and_then(|r| {
                (r.get("type").and_then(Value::as_str) == Some("array"))
                    .then(|| r.get("items"))
                    .flatten()
            });
            scope.push((c.iter_var.clone(), elem));
            if let Some(v2) = &c.iter_var2 {
                scope.push((v2.clone(), None));
            }
            scope.push((c.accu_var.clone(), None));
            check_fields(&c.loop_cond, scope, errs);
            check_fields(&c.loop_step, scope, errs);
            check_fields(&c.result, scope, errs);
            scope.pop();
            if c.iter_var2.is_some() {
                scope.pop();
            }
            scope.pop();
            None
        }
        Expr::List(l) => {
            for e in &l.elements {
                check_fields(e, scope, errs);
            }
            None
        }
        Expr::Map(m) => {
            for e in &m.entries {
                if let cel::common::ast::EntryExpr::MapEntry(me) = &e.expr {
                    check_fields(&me.key, scope, errs);
                    check_fields(&me.value, scope, errs);
                }
            }
            None
        }
        _ => None,
    }
}

/// Parses a rule's `fieldPath` (`.spec.foo`, `.map['key']`) against the schema node, into
/// the dotted path upstream appends to the node's path.
fn field_path(path: &str, schema: &Value) -> Result<String, FieldPathError> {
    let mut out = String::new();
    let mut node = schema;
    let mut rest = path;
    while !rest.is_empty() {
        let (name, next) = if let Some(r) = rest.strip_prefix("['") {
            let end = r.find("']").ok_or(FieldPathError::UnexpectedEnd)?;
            (&r[..end], &r[end + 2..])
        } else if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            (&r[..end], &r[end..])
        } else {
            return Err(FieldPathError::Unexpected(rest.to_string()));
        };
        if name.is_empty() {
            return Err(FieldPathError::UnexpectedEnd);
        }
        if let Some(child_schema) = node.get("properties").and_then(|p| p.get(name)) {
            out = if out.is_empty() {
                name.to_string()
            } else {
                child(&out, name)
            };
            node = child_schema;
        } else if let Some(a) = node.get("additionalProperties").filter(|a| a.is_object()) {
            out = format!("{out}[{name}]");
            node = a;
        } else {
            return Err(FieldPathError::NotAField);
        }
        rest = next;
    }
    Ok(out)
}

/// Checks the rules of a schema as a CRD write does: `path` is the schema's own path
/// (`spec.validation.openAPIV3Schema`).
pub fn check_schema(schema: &Value, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut total = 0u64;
    check_node(schema, path, 1, &mut total, &mut errs);
    if total > cost::STATIC_CRD_LIMIT {
        errs.push(FieldError::forbidden(
            path,
            cost::exceeds_message(
                "x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema",
                total,
                cost::STATIC_CRD_LIMIT,
            ),
        ));
    }
    errs
}

fn check_node(
    schema: &Value,
    path: &str,
    cardinality: u64,
    total: &mut u64,
    errs: &mut Vec<FieldError>,
) {
    if let Some(Value::Array(rules)) = schema.get("x-kubernetes-validations") {
        for (i, r) in rules.iter().enumerate() {
            let rule = Rule::from_json(r);
            let rp = index(&child(path, "x-kubernetes-validations"), i);
            check_rule(&rule, schema, &rp, cardinality, total, errs);
        }
    }
    if let Some(Value::Object(props)) = schema.get("properties") {
        for (k, s) in props {
            check_node(
                s,
                &format!("{path}.properties[{k}]"),
                cardinality,
                total,
                errs,
            );
        }
    }
    let size = cost::schema_size(schema).max(1);
    if let Some(items @ Value::Object(_)) = schema.get("items") {
        check_node(
            items,
            &child(path, "items"),
            cardinality.saturating_mul(size),
            total,
            errs,
        );
    }
    if let Some(a @ Value::Object(_)) = schema.get("additionalProperties") {
        check_node(
            a,
            &child(path, "additionalProperties"),
            cardinality.saturating_mul(size),
            total,
            errs,
        );
    }
}

fn check_rule(
    rule: &Rule,
    schema: &Value,
    rp: &str,
    cardinality: u64,
    total: &mut u64,
    errs: &mut Vec<FieldError>,
) {
    if rule.rule.trim().is_empty() {
        errs.push(FieldError::required(
            &child(rp, "rule"),
            "rule is not specified",
        ));
        return;
    }
    if let Some(m) = &rule.message {
        if m.trim().is_empty() {
            errs.push(FieldError::invalid(
                &child(rp, "message"),
                render(&json!(m)),
                "message must be non-empty if specified",
            ));
        } else if m.contains('\n') {
            errs.push(FieldError::invalid(
                &child(rp, "message"),
                render(&json!(m)),
                "message must not contain line breaks",
            ));
        }
    } else if rule.rule.contains('\n') && rule.message_expression.is_none() {
        errs.push(FieldError::required(
            &child(rp, "message"),
            "message must be specified if rule contains line breaks",
        ));
    }
    if let Some(r) = &rule.reason
        && !REASONS.contains(&r.as_str())
    {
        errs.push(FieldError::not_supported(
            &child(rp, "reason"),
            render(&json!(r)),
            REASONS.iter().map(|r| render(&json!(r))).collect(),
        ));
    }
    if let Some(fp) = &rule.field_path
        && let Err(e) = field_path(fp, schema)
    {
        errs.push(FieldError::invalid(
            &child(rp, "fieldPath"),
            render(&json!(fp)),
            format!("fieldPath must be a valid path: {e}"),
        ));
    }
    let optional = rule.optional_old_self == Some(true);
    match compile(&rule.rule, schema, optional) {
        Err(e) => errs.push(FieldError::invalid(
            &child(rp, "rule"),
            rule.go_repr(),
            format!("compilation failed: {e}"),
        )),
        Ok(c) => {
            if rule.optional_old_self.is_some() && !c.uses_old_self {
                errs.push(FieldError::invalid(
                    &child(rp, "optionalOldSelf"),
                    render(&json!(rule.optional_old_self)),
                    "may not be set if oldSelf is not used in rule",
                ));
            }
            let vars = HashMap::from([
                ("self".to_string(), cost::Shape::Schema(schema)),
                ("oldSelf".to_string(), cost::Shape::Schema(schema)),
            ]);
            let mut est = cost::estimate(c.program.expression(), &vars);
            if let Some(me) = &rule.message_expression
                && let Ok(m) = compile(me, schema, false)
            {
                est = est.saturating_add(cost::estimate(m.program.expression(), &vars));
            }
            let est = est.saturating_mul(cardinality);
            *total = total.saturating_add(est);
            if est > cost::STATIC_RULE_LIMIT {
                errs.push(FieldError::forbidden(
                    &child(rp, "rule"),
                    cost::exceeds_message("estimated rule cost", est, cost::STATIC_RULE_LIMIT),
                ));
            }
        }
    }
    if let Some(me) = &rule.message_expression {
        if me.trim().is_empty() {
            errs.push(FieldError::required(
                &child(rp, "messageExpression"),
                "messageExpression must be non-empty if specified",
            ));
        } else if let Err(e) = compile(me, schema, false) {
            errs.push(FieldError::invalid(
                &child(rp, "messageExpression"),
                rule.go_repr(),
                format!("messageExpression compilation failed: {e}"),
            ));
        }
    }
}

/// A rule ready to run.
struct NodeRule {
    rule: Rule,
    program: Result<Compiled, CompileError>,
    message: Option<Compiled>,
    /// `fieldPath`, normalized (`spec.foo`), empty when unset.
    field_path: String,
}

/// The rules of one schema node and of the nodes under it that have rules.
#[derive(Default)]
struct Node {
    /// JSON pointer of this node's schema in the validator's schema.
    pointer: String,
    rules: Vec<NodeRule>,
    properties: Vec<(String, Node)>,
    items: Option<Box<Node>>,
    additional: Option<Box<Node>>,
}

impl Node {
    fn build(schema: &Value, pointer: String) -> Option<Node> {
        let mut node = Node {
            pointer: pointer.clone(),
            ..Node::default()
        };
        if let Some(Value::Array(rules)) = schema.get("x-kubernetes-validations") {
            for r in rules {
                let rule = Rule::from_json(r);
                let optional = rule.optional_old_self == Some(true);
                let program = compile(&rule.rule, schema, optional);
                let message = rule
                    .message_expression
                    .as_deref()
                    .and_then(|m| compile(m, schema, false).ok());
                let field_path = rule
                    .field_path
                    .as_deref()
                    .and_then(|f| field_path(f, schema).ok())
                    .unwrap_or_default();
                node.rules.push(NodeRule {
                    rule,
                    program,
                    message,
                    field_path,
                });
            }
        }
        let esc = |k: &str| k.replace('~', "~0").replace('/', "~1");
        if let Some(Value::Object(props)) = schema.get("properties") {
            for (k, s) in props {
                if let Some(n) = Node::build(s, format!("{pointer}/properties/{}", esc(k))) {
                    node.properties.push((k.clone(), n));
                }
            }
        }
        if let Some(items @ Value::Object(_)) = schema.get("items") {
            node.items = Node::build(items, format!("{pointer}/items")).map(Box::new);
        }
        if let Some(a @ Value::Object(_)) = schema.get("additionalProperties") {
            node.additional =
                Node::build(a, format!("{pointer}/additionalProperties")).map(Box::new);
        }
        let empty = node.rules.is_empty()
            && node.properties.is_empty()
            && node.items.is_none()
            && node.additional.is_none();
        (!empty).then_some(node)
    }
}

/// The compiled rules of one structural schema, run on custom objects.
pub struct Validator {
    schema: Arc<Value>,
    root: Option<Node>,
}

impl std::fmt::Debug for Validator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Validator")
            .field("has_rules", &self.root.is_some())
            .finish()
    }
}

/// How a walk ends early: the request's cost budget is spent.
struct Stop;

impl Validator {
    pub fn new(schema: &Value) -> Validator {
        Validator {
            schema: Arc::new(schema.clone()),
            root: Node::build(schema, String::new()),
        }
    }

    /// Whether the schema has any rule.
    pub fn has_rules(&self) -> bool {
        self.root.is_some()
    }

    /// Runs every rule on `new` (and `old` on update); field errors as upstream reports them.
    pub fn validate(&self, new: &Value, old: Option<&Value>) -> Vec<FieldError> {
        let mut errs = Vec::new();
        if let Some(root) = &self.root {
            let mut budget = cost::RUNTIME_BUDGET;
            let _ = self.walk(root, "", new, old, false, true, &mut budget, &mut errs);
        }
        errs
    }

    #[allow(clippy::too_many_arguments)]
    fn walk(
        &self,
        node: &Node,
        path: &str,
        new: &Value,
        old: Option<&Value>,
        parent_equal: bool,
        root: bool,
        budget: &mut i64,
        errs: &mut Vec<FieldError>,
    ) -> Result<(), Stop> {
        if new.is_null() {
            return Ok(());
        }
        let old = old.filter(|o| !o.is_null());
        let equal = match old {
            Some(o) => o == new,
            None => parent_equal,
        };
        let schema = self.schema.pointer(&node.pointer).unwrap_or(&Value::Null);
        if !node.rules.is_empty() {
            self.run_rules(node, schema, path, new, old, equal, root, budget, errs)?;
        }
        match new {
            Value::Object(obj) => {
                for (k, n) in &node.properties {
                    if let Some(v) = obj.get(k) {
                        let o = old.and_then(|o| o.get(k));
                        let p = child(path, k);
                        self.walk(n, &p, v, o, equal, false, budget, errs)?;
                    }
                }
                if let Some(n) = &node.additional {
                    for (k, v) in obj {
                        let o = old.and_then(|o| o.get(k));
                        let p = crate::key(path, k);
                        self.walk(n, &p, v, o, equal, false, budget, errs)?;
                    }
                }
            }
            Value::Array(items) => {
                if let Some(n) = &node.items {
                    let old_items = old.and_then(Value::as_array);
                    for (i, v) in items.iter().enumerate() {
                        let o = old_items.and_then(|olds| correlate(schema, v, olds));
                        let p = index(path, i);
                        self.walk(n, &p, v, o, equal, false, budget, errs)?;
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn run_rules(
        &self,
        node: &Node,
        schema: &Value,
        path: &str,
        new: &Value,
        old: Option<&Value>,
        equal: bool,
        root: bool,
        budget: &mut i64,
        errs: &mut Vec<FieldError>,
    ) -> Result<(), Stop> {
        let ty = render(&json!(
            schema.get("type").and_then(Value::as_str).unwrap_or("")
        ));
        if *budget <= 0 {
            errs.push(FieldError::invalid(path, ty, "validation failed due to running out of cost budget, no further validation rules will be run"));
            return Err(Stop);
        }
        let self_val = value::to_cel(schema, new, root);
        let old_val = old.map(|o| value::to_cel(schema, o, root));
        for r in &node.rules {
            let compiled = match &r.program {
                Ok(c) => c,
                Err(e) => {
                    errs.push(FieldError::invalid(
                        path,
                        ty.clone(),
                        format!("rule compile error: {e}"),
                    ));
                    continue;
                }
            };
            let optional = r.rule.optional_old_self == Some(true);
            if compiled.uses_old_self && old.is_none() && !optional {
                continue;
            }
            let rule_text = r.rule.error_string();
            let vars = HashMap::from([
                ("self".to_string(), cost::Shape::Values(vec![new])),
                (
                    "oldSelf".to_string(),
                    cost::Shape::Values(old.into_iter().collect()),
                ),
            ]);
            let spent = cost::estimate(compiled.program.expression(), &vars);
            if spent > cost::PER_CALL_LIMIT {
                errs.push(FieldError::invalid(path, ty.clone(), format!("'operation cancelled: actual cost limit exceeded': no further validation rules will be run due to call cost exceeds limit for rule: {rule_text}")));
                return Err(Stop);
            }
            if spent as i64 > *budget {
                errs.push(FieldError::invalid(path, ty.clone(), "validation failed due to running out of cost budget, no further validation rules will be run"));
                return Err(Stop);
            }
            *budget -= spent as i64;
            let result = eval(&compiled.program, &self_val, old_val.as_ref(), optional);
            match result {
                Ok(Cel::Bool(true)) => continue,
                Ok(Cel::Bool(false)) => {}
                Ok(other) => {
                    errs.push(FieldError::invalid(path, ty.clone(), format!("'no such overload': call arguments did not match a supported operator, function or macro signature for rule: {rule_text} (it evaluated to {other:?}, not a bool)")));
                    continue;
                }
                Err(
                    ExecutionError::NoSuchOverload(_)
                    | ExecutionError::UnexpectedType { .. }
                    | ExecutionError::UnsupportedBinaryOperator(..)
                    | ExecutionError::ValuesNotComparable(..),
                ) => {
                    errs.push(FieldError::invalid(path, ty.clone(), format!("'no such overload': call arguments did not match a supported operator, function or macro signature for rule: {rule_text}")));
                    continue;
                }
                Err(e) => {
                    errs.push(FieldError::invalid(
                        path,
                        ty.clone(),
                        format!("{} evaluating rule: {rule_text}", go_error(&e)),
                    ));
                    continue;
                }
            }
            if equal && !compiled.uses_old_self {
                // ratcheting: an unchanged value keeps passing (upstream: a warning)
                continue;
            }
            let field = if r.field_path.is_empty() {
                path.to_string()
            } else {
                child(path, &r.field_path)
            };
            let mut detail = None;
            if let Some(m) = &r.message {
                let spent = cost::estimate(m.program.expression(), &vars);
                if spent as i64 <= *budget {
                    *budget -= spent as i64;
                    if let Ok(Cel::String(s)) = eval(&m.program, &self_val, old_val.as_ref(), false)
                    {
                        let t = s.trim();
                        if !t.is_empty() && !t.contains('\n') && t.len() <= 5 * 1024 {
                            detail = Some(t.to_string());
                        }
                    }
                }
            }
            let detail = detail.unwrap_or_else(|| r.rule.message_or_default());
            errs.push(match r.rule.reason.as_deref() {
                Some("FieldValueForbidden") => FieldError::forbidden(&field, detail),
                Some("FieldValueRequired") => {
                    FieldError::new(ErrorType::Required, &field, None, detail)
                }
                Some("FieldValueDuplicate") => FieldError::duplicate(&field, ty.clone()),
                _ => FieldError::invalid(&field, ty.clone(), detail),
            });
        }
        Ok(())
    }
}

/// cel-go's text of the common runtime errors.
fn go_error(e: &ExecutionError) -> String {
    match e {
        ExecutionError::NoSuchKey(k) => format!("no such key: {k}"),
        ExecutionError::IndexOutOfBounds(i) => format!("index out of bounds: {i:?}"),
        ExecutionError::DivisionByZero(_) => "division by zero".to_string(),
        ExecutionError::RemainderByZero(_) => "modulus by zero".to_string(),
        ExecutionError::Overflow(..) => "integer overflow".to_string(),
        ExecutionError::FunctionError { message, .. } => message.clone(),
        other => other.to_string(),
    }
}

/// Evaluates `program` with `self` and `oldSelf` bound.
fn eval(
    program: &Program,
    self_val: &Cel,
    old: Option<&Cel>,
    optional: bool,
) -> Result<Cel, ExecutionError> {
    let mut ctx = Context::with_env(library::env());
    library::register(&mut ctx);
    ctx.add_variable_from_value("self", self_val.clone());
    if optional {
        let opt = match old {
            Some(o) => cel::objects::OptionalValue::of(o.clone()),
            None => cel::objects::OptionalValue::none(),
        };
        ctx.add_variable_from_value("oldSelf", Cel::Opaque(Arc::new(opt)));
    } else if let Some(o) = old {
        ctx.add_variable_from_value("oldSelf", o.clone());
    }
    program.execute(&ctx)
}

/// The old item a new list item correlates with: by the key fields of a `map` list, by
/// value in a `set` list; none in an atomic list.
fn correlate<'a>(schema: &Value, item: &Value, olds: &'a [Value]) -> Option<&'a Value> {
    match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
        Some("map") => {
            let keys: Vec<&str> = schema
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .map(|k| k.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let key_of = |v: &Value| -> Vec<Value> {
                keys.iter()
                    .map(|k| v.get(*k).cloned().unwrap_or(Value::Null))
                    .collect()
            };
            let want = key_of(item);
            olds.iter().find(|o| key_of(o) == want)
        }
        Some("set") => olds.iter().find(|o| *o == item),
        _ => None,
    }
}

/// The CEL checks of a CRD's schemas: once at `spec.validation.openAPIV3Schema` when every
/// version has the same schema (as upstream's internal form hoists it), else per version.
pub fn check_crd(crd: &Value, structural_ok: impl Fn(usize) -> bool) -> Vec<FieldError> {
    let versions = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let schemas: Vec<Option<&Value>> = versions
        .iter()
        .map(|v| v.pointer("/schema/openAPIV3Schema"))
        .collect();
    let Some(Some(first)) = schemas.first() else {
        return Vec::new();
    };
    if schemas.iter().all(|s| *s == Some(*first)) {
        if !(0..schemas.len()).all(&structural_ok) {
            return Vec::new();
        }
        return check_schema(first, "spec.validation.openAPIV3Schema");
    }
    let mut errs = Vec::new();
    for (i, s) in schemas.iter().enumerate() {
        if let Some(s) = s
            && structural_ok(i)
        {
            errs.extend(check_schema(
                s,
                &format!("spec.versions[{i}].schema.openAPIV3Schema"),
            ));
        }
    }
    errs
}

#[cfg(test)]
mod tests;
