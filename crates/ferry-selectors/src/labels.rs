//! Label selectors: the string syntax `labels.Parse` accepts (`a=b,c in (x,y),!d`) and the
//! structured `metav1.LabelSelector`, both turned into one [`LabelSelector`] with upstream's
//! matching rules and error messages.

use crate::SelectorError;
use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;

/// How a requirement compares a label's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    /// `key=value`
    Equals,
    /// `key==value`
    DoubleEquals,
    /// `key!=value`: also true when the key is absent.
    NotEquals,
    /// `key in (a,b)`
    In,
    /// `key notin (a,b)`: also true when the key is absent.
    NotIn,
    /// `key`
    Exists,
    /// `!key`
    DoesNotExist,
    /// `key>3` (integers only).
    GreaterThan,
    /// `key<3` (integers only).
    LessThan,
}

impl Operator {
    /// The operator's name as upstream's `selection.Operator` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Operator::Equals => "=",
            Operator::DoubleEquals => "==",
            Operator::NotEquals => "!=",
            Operator::In => "in",
            Operator::NotIn => "notin",
            Operator::Exists => "exists",
            Operator::DoesNotExist => "!",
            Operator::GreaterThan => "gt",
            Operator::LessThan => "lt",
        }
    }
}

/// One clause of a selector: a key, an operator and (for most operators) values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    pub operator: Operator,
    /// Sorted and without duplicates when built by the parser.
    pub values: Vec<String>,
}

impl Requirement {
    /// Builds a requirement, validating it as upstream's `labels.NewRequirement` does.
    pub fn new(
        key: &str,
        operator: Operator,
        values: Vec<String>,
    ) -> Result<Requirement, SelectorError> {
        let mut errs: Vec<String> = Vec::new();
        let key_errs = qualified_name_errors(key);
        if !key_errs.is_empty() {
            errs.push(invalid("key", &go_quote(key), &key_errs.join("; ")));
        }
        match operator {
            Operator::In | Operator::NotIn => {
                if values.is_empty() {
                    errs.push(invalid(
                        "values",
                        &go_string_slice(&values),
                        "for 'in', 'notin' operators, values set can't be empty",
                    ));
                }
            }
            Operator::Equals | Operator::DoubleEquals | Operator::NotEquals => {
                if values.len() != 1 {
                    errs.push(invalid(
                        "values",
                        &go_string_slice(&values),
                        "exact-match compatibility requires one single value",
                    ));
                }
            }
            Operator::Exists | Operator::DoesNotExist => {
                if !values.is_empty() {
                    errs.push(invalid(
                        "values",
                        &go_string_slice(&values),
                        "values set must be empty for exists and does not exist",
                    ));
                }
            }
            Operator::GreaterThan | Operator::LessThan => {
                if values.len() != 1 {
                    errs.push(invalid(
                        "values",
                        &go_string_slice(&values),
                        "for 'Gt', 'Lt' operators, exactly one value is required",
                    ));
                }
                for (i, v) in values.iter().enumerate() {
                    if v.parse::<i64>().is_err() {
                        errs.push(invalid(
                            &format!("values[{i}]"),
                            &go_quote(v),
                            "for 'Gt', 'Lt' operators, the value must be an integer",
                        ));
                    }
                }
            }
        }
        for (i, v) in values.iter().enumerate() {
            let value_errs = label_value_errors(v);
            if !value_errs.is_empty() {
                errs.push(invalid(
                    &format!("values[{i}][{key}]"),
                    &go_quote(v),
                    &value_errs.join("; "),
                ));
            }
        }
        if errs.is_empty() {
            Ok(Requirement {
                key: key.to_string(),
                operator,
                values,
            })
        } else {
            Err(SelectorError::InvalidRequirement(aggregate(errs)))
        }
    }

    /// Whether the labels satisfy this requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        match self.operator {
            Operator::In | Operator::Equals | Operator::DoubleEquals => {
                value.is_some_and(|v| self.values.iter().any(|x| x == v))
            }
            Operator::NotIn | Operator::NotEquals => {
                value.is_none_or(|v| !self.values.iter().any(|x| x == v))
            }
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
            Operator::GreaterThan | Operator::LessThan => {
                let Some(Ok(have)) = value.map(|v| v.parse::<i64>()) else {
                    return false;
                };
                let [want] = self.values.as_slice() else {
                    return false;
                };
                let Ok(want) = want.parse::<i64>() else {
                    return false;
                };
                if self.operator == Operator::GreaterThan {
                    have > want
                } else {
                    have < want
                }
            }
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.operator == Operator::DoesNotExist {
            f.write_str("!")?;
        }
        f.write_str(&self.key)?;
        let op = match self.operator {
            Operator::Exists | Operator::DoesNotExist => return Ok(()),
            Operator::Equals => "=",
            Operator::DoubleEquals => "==",
            Operator::NotEquals => "!=",
            Operator::In => " in ",
            Operator::NotIn => " notin ",
            Operator::GreaterThan => ">",
            Operator::LessThan => "<",
        };
        f.write_str(op)?;
        let set = matches!(self.operator, Operator::In | Operator::NotIn);
        if set {
            f.write_str("(")?;
        }
        let mut values = self.values.clone();
        values.sort();
        f.write_str(&values.join(","))?;
        if set {
            f.write_str(")")?;
        }
        Ok(())
    }
}

/// A parsed label selector: the AND of its requirements, or the selector that matches nothing
/// (what a nil `metav1.LabelSelector` means).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
    nothing: bool,
}

impl LabelSelector {
    /// Matches every object (an empty selector string, an empty `LabelSelector`).
    pub fn everything() -> LabelSelector {
        LabelSelector::default()
    }
    /// Matches no object (a nil `LabelSelector`).
    pub fn nothing() -> LabelSelector {
        LabelSelector {
            requirements: Vec::new(),
            nothing: true,
        }
    }
    /// Builds a selector from requirements, sorted by key as upstream does.
    pub fn from_requirements(mut requirements: Vec<Requirement>) -> LabelSelector {
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        LabelSelector {
            requirements,
            nothing: false,
        }
    }
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        !self.nothing && self.requirements.iter().all(|r| r.matches(labels))
    }
    /// True when the selector does not restrict anything (it matches everything).
    pub fn is_empty(&self) -> bool {
        !self.nothing && self.requirements.is_empty()
    }
    /// True for the selector that matches nothing.
    pub fn is_nothing(&self) -> bool {
        self.nothing
    }
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }
    /// The single value a key must have (`k=v`, `k==v`, `k in (v)`), if the selector requires one.
    pub fn requires_exact_match(&self, key: &str) -> Option<&str> {
        let r = self.requirements.iter().find(|r| r.key == key)?;
        match (r.operator, r.values.as_slice()) {
            (Operator::Equals | Operator::DoubleEquals | Operator::In, [v]) => Some(v),
            _ => None,
        }
    }
}

impl fmt::Display for LabelSelector {
    /// Upstream's `Selector.String()`: requirements joined by commas (empty for nothing).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

/// `spec.selector` of a Service (or ReplicationController): every pair must match; an empty map
/// matches everything. No validation, as upstream's `SelectorFromSet`.
pub fn selector_from_map(map: &BTreeMap<String, String>) -> LabelSelector {
    LabelSelector::from_requirements(
        map.iter()
            .map(|(k, v)| Requirement {
                key: k.clone(),
                operator: Operator::Equals,
                values: vec![v.clone()],
            })
            .collect(),
    )
}

/// A `metav1.LabelSelector` as upstream's `LabelSelectorAsSelector`: an empty one matches
/// everything. Use [`from_optional_label_selector`] where a missing selector is possible.
pub fn from_label_selector(selector: &meta::LabelSelector) -> Result<LabelSelector, SelectorError> {
    let mut reqs = Vec::new();
    for (k, v) in selector.match_labels.iter().flatten() {
        reqs.push(Requirement::new(k, Operator::Equals, vec![v.clone()])?);
    }
    for expr in selector.match_expressions.iter().flatten() {
        let op = match expr.operator.as_str() {
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            other => {
                return Err(SelectorError::InvalidOperator(other.to_string()));
            }
        };
        reqs.push(Requirement::new(
            &expr.key,
            op,
            expr.values.clone().unwrap_or_default(),
        )?);
    }
    Ok(LabelSelector::from_requirements(reqs))
}

/// Like [`from_label_selector`], but a missing (nil) selector matches nothing.
pub fn from_optional_label_selector(
    selector: Option<&meta::LabelSelector>,
) -> Result<LabelSelector, SelectorError> {
    match selector {
        None => Ok(LabelSelector::nothing()),
        Some(s) => from_label_selector(s),
    }
}

/// Upstream's `metav1.FormatLabelSelector`: `<none>` for an empty selector, `<error>` for an
/// invalid one.
pub fn format_label_selector(selector: Option<&meta::LabelSelector>) -> String {
    match from_optional_label_selector(selector) {
        Err(_) => "<error>".to_string(),
        Ok(s) => {
            let text = s.to_string();
            if text.is_empty() {
                "<none>".to_string()
            } else {
                text
            }
        }
    }
}

/// Upstream's `labels.FormatLabels`: `k=v` pairs sorted by key, `<none>` when empty.
pub fn format_labels(map: Option<&BTreeMap<String, String>>) -> String {
    let text = map
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    if text.is_empty() {
        "<none>".to_string()
    } else {
        text
    }
}

// ---------------------------------------------------------------------------------------------
// The string syntax.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tok {
    End,
    ClosePar,
    Comma,
    Not,
    DoubleEquals,
    Equals,
    Greater,
    Ident,
    In,
    Less,
    NotEquals,
    NotIn,
    OpenPar,
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

fn is_special(b: u8) -> bool {
    matches!(b, b'=' | b'!' | b'(' | b')' | b',' | b'>' | b'<')
}

fn symbol(s: &str) -> Option<Tok> {
    Some(match s {
        ")" => Tok::ClosePar,
        "," => Tok::Comma,
        "!" => Tok::Not,
        "==" => Tok::DoubleEquals,
        "=" => Tok::Equals,
        ">" => Tok::Greater,
        "in" => Tok::In,
        "<" => Tok::Less,
        "!=" => Tok::NotEquals,
        "notin" => Tok::NotIn,
        "(" => Tok::OpenPar,
        _ => return None,
    })
}

/// Splits the selector into tokens the way upstream's lexer does: runs of special characters
/// take the longest prefix that is an operator, everything else up to a special character or
/// whitespace is an identifier (or the keywords `in` / `notin`).
fn lex(s: &str) -> Vec<(Tok, String)> {
    let b = s.as_bytes();
    let mut pos = 0;
    let mut out = Vec::new();
    loop {
        while pos < b.len() && is_space(b[pos]) {
            pos += 1;
        }
        if pos >= b.len() {
            out.push((Tok::End, String::new()));
            return out;
        }
        if is_special(b[pos]) {
            let start = pos;
            let mut best: Option<(Tok, usize)> = None;
            while pos < b.len() && is_special(b[pos]) {
                match symbol(&s[start..=pos]) {
                    Some(t) => best = Some((t, pos + 1)),
                    None if best.is_some() => break,
                    None => {}
                }
                pos += 1;
            }
            match best {
                Some((t, end)) => {
                    out.push((t, s[start..end].to_string()));
                    pos = end;
                }
                // Every special character is an operator on its own, so this cannot happen;
                // keep a harmless fallback rather than a panic.
                None => out.push((Tok::Ident, s[start..pos].to_string())),
            }
        } else {
            let start = pos;
            while pos < b.len() && !is_special(b[pos]) && !is_space(b[pos]) {
                pos += 1;
            }
            let lit = &s[start..pos];
            out.push((symbol(lit).unwrap_or(Tok::Ident), lit.to_string()));
        }
    }
}

struct Parser {
    items: Vec<(Tok, String)>,
    pos: usize,
}

impl Parser {
    /// The current token; `values` turns the keywords `in`/`notin` into identifiers.
    fn peek(&self, values: bool) -> (Tok, &str) {
        let (t, l) = self
            .items
            .get(self.pos)
            .map(|(t, l)| (*t, l.as_str()))
            .unwrap_or((Tok::End, ""));
        (
            if values && matches!(t, Tok::In | Tok::NotIn) {
                Tok::Ident
            } else {
                t
            },
            l,
        )
    }
    fn next(&mut self, values: bool) -> (Tok, String) {
        let (t, l) = self.peek(values);
        let l = l.to_string();
        self.pos += 1;
        (t, l)
    }

    fn parse(&mut self) -> Result<Vec<Requirement>, SelectorError> {
        let mut reqs = Vec::new();
        loop {
            let (tok, lit) = self.peek(true);
            match tok {
                Tok::Ident | Tok::Not => {
                    let r = self
                        .requirement()
                        .map_err(|e| SelectorError::Requirement(Box::new(e)))?;
                    reqs.push(r);
                    let (t, l) = self.next(true);
                    match t {
                        Tok::End => return Ok(reqs),
                        Tok::Comma => {
                            let (t2, l2) = self.peek(true);
                            if t2 != Tok::Ident && t2 != Tok::Not {
                                return Err(SelectorError::Syntax(format!(
                                    "found '{l2}', expected: identifier after ','"
                                )));
                            }
                        }
                        _ => {
                            return Err(SelectorError::Syntax(format!(
                                "found '{l}', expected: ',' or 'end of string'"
                            )));
                        }
                    }
                }
                Tok::End => return Ok(reqs),
                _ => {
                    return Err(SelectorError::Syntax(format!(
                        "found '{lit}', expected: !, identifier, or 'end of string'"
                    )));
                }
            }
        }
    }

    fn requirement(&mut self) -> Result<Requirement, SelectorError> {
        let (mut tok, mut key) = self.next(true);
        let mut op = None;
        if tok == Tok::Not {
            op = Some(Operator::DoesNotExist);
            (tok, key) = self.next(true);
        }
        if tok != Tok::Ident {
            return Err(SelectorError::Syntax(format!(
                "found '{key}', expected: identifier"
            )));
        }
        let key_errs = qualified_name_errors(&key);
        if !key_errs.is_empty() {
            return Err(SelectorError::InvalidRequirement(invalid(
                "<nil>",
                &go_quote(&key),
                &key_errs.join("; "),
            )));
        }
        // `!key` takes no operator; whatever follows is the caller's to judge (`!a=b` fails there).
        if op == Some(Operator::DoesNotExist) {
            return Requirement::new(&key, Operator::DoesNotExist, Vec::new());
        }
        let (t, _) = self.peek(true);
        if matches!(t, Tok::End | Tok::Comma) {
            return Requirement::new(&key, Operator::Exists, Vec::new());
        }
        let (t, lit) = self.next(false);
        let op = match t {
            Tok::In => Operator::In,
            Tok::Equals => Operator::Equals,
            Tok::DoubleEquals => Operator::DoubleEquals,
            Tok::Greater => Operator::GreaterThan,
            Tok::Less => Operator::LessThan,
            Tok::NotIn => Operator::NotIn,
            Tok::NotEquals => Operator::NotEquals,
            _ => {
                return Err(SelectorError::Syntax(format!(
                    "found '{lit}', expected: in, notin, =, ==, !=, gt, lt"
                )));
            }
        };
        let mut values = match op {
            Operator::In | Operator::NotIn => self.set_values()?,
            _ => self.exact_value()?,
        };
        values.sort();
        values.dedup();
        Requirement::new(&key, op, values)
    }

    fn set_values(&mut self) -> Result<Vec<String>, SelectorError> {
        let (t, lit) = self.next(true);
        if t != Tok::OpenPar {
            return Err(SelectorError::Syntax(format!(
                "found '{lit}' expected: '('"
            )));
        }
        let (t, lit) = self.peek(true);
        let lit = lit.to_string();
        match t {
            Tok::Ident | Tok::Comma => {
                let values = self.identifiers()?;
                let (t, _) = self.next(true);
                if t != Tok::ClosePar {
                    return Err(SelectorError::Syntax(format!(
                        "found '{lit}', expected: ')'"
                    )));
                }
                Ok(values)
            }
            Tok::ClosePar => {
                self.next(true);
                Ok(vec![String::new()])
            }
            _ => Err(SelectorError::Syntax(format!(
                "found '{lit}', expected: ',', ')' or identifier"
            ))),
        }
    }

    fn identifiers(&mut self) -> Result<Vec<String>, SelectorError> {
        let mut values: Vec<String> = Vec::new();
        loop {
            let (t, lit) = self.next(true);
            match t {
                Tok::Ident => {
                    values.push(lit);
                    let (t2, l2) = self.peek(true);
                    match t2 {
                        Tok::Comma => continue,
                        Tok::ClosePar => return Ok(values),
                        _ => {
                            return Err(SelectorError::Syntax(format!(
                                "found '{l2}', expected: ',' or ')'"
                            )));
                        }
                    }
                }
                Tok::Comma => {
                    if values.is_empty() {
                        values.push(String::new());
                    }
                    let (t2, _) = self.peek(true);
                    if t2 == Tok::ClosePar {
                        values.push(String::new());
                        return Ok(values);
                    }
                    if t2 == Tok::Comma {
                        self.next(true);
                        values.push(String::new());
                    }
                }
                _ => {
                    return Err(SelectorError::Syntax(format!(
                        "found '{lit}', expected: ',', or identifier"
                    )));
                }
            }
        }
    }

    fn exact_value(&mut self) -> Result<Vec<String>, SelectorError> {
        let (t, _) = self.peek(true);
        if matches!(t, Tok::End | Tok::Comma) {
            return Ok(vec![String::new()]);
        }
        let (t, lit) = self.next(true);
        if t == Tok::Ident {
            Ok(vec![lit])
        } else {
            Err(SelectorError::Syntax(format!(
                "found '{lit}', expected: identifier"
            )))
        }
    }
}

/// Parses a label selector string as upstream's `labels.Parse`. The empty string (or only
/// whitespace) matches everything.
pub fn parse_label_selector(s: &str) -> Result<LabelSelector, SelectorError> {
    let mut p = Parser {
        items: lex(s),
        pos: 0,
    };
    let reqs = p.parse()?;
    Ok(LabelSelector::from_requirements(reqs))
}

// ---------------------------------------------------------------------------------------------
// Validation of keys and values, with upstream's messages.

const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str =
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";

/// Upstream's `validation.RegexError` text.
fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    let mut out = format!("{msg} (e.g. ");
    for (i, e) in examples.iter().enumerate() {
        if i > 0 {
            out.push_str(" or ");
        }
        out.push_str(&format!("'{e}', "));
    }
    out.push_str(&format!("regex used for validation is '{fmt}')"));
    out
}

fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    let edge = |c: u8| c.is_ascii_alphanumeric();
    let inner = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.');
    match b {
        [] => false,
        [c] => edge(*c),
        [first, mid @ .., last] => edge(*first) && edge(*last) && mid.iter().all(|c| inner(*c)),
    }
}

fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    let edge = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    match b {
        [] => false,
        [c] => edge(*c),
        [first, mid @ .., last] => {
            edge(*first) && edge(*last) && mid.iter().all(|c| edge(*c) || *c == b'-')
        }
    }
}

fn dns1123_subdomain_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 253 {
        errs.push("must be no more than 253 characters".to_string());
    }
    if !s.split('.').all(is_dns1123_label) {
        errs.push(regex_error(
            DNS1123_SUBDOMAIN_MSG,
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    errs
}

/// Upstream's `validation.IsQualifiedName`.
pub fn qualified_name_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                errs.extend(
                    dns1123_subdomain_errors(prefix)
                        .into_iter()
                        .map(|m| format!("prefix part {m}")),
                );
            }
            *name
        }
        _ => {
            errs.push(format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(QUALIFIED_NAME_MSG, QUALIFIED_NAME_FMT, &["MyName", "my.name", "123-abc"])
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > 63 {
        errs.push("name part must be no more than 63 characters".to_string());
    }
    if !is_qualified_name_part(name) {
        errs.push(format!(
            "name part {}",
            regex_error(
                QUALIFIED_NAME_MSG,
                QUALIFIED_NAME_FMT,
                &["MyName", "my.name", "123-abc"]
            )
        ));
    }
    errs
}

/// Upstream's `validation.IsValidLabelValue`.
pub fn label_value_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > 63 {
        errs.push("must be no more than 63 characters".to_string());
    }
    if !value.is_empty() && !is_qualified_name_part(value) {
        errs.push(regex_error(
            LABEL_VALUE_MSG,
            &format!("({QUALIFIED_NAME_FMT})?"),
            &["MyValue", "my_value", "12345"],
        ));
    }
    errs
}

/// A `field.Invalid` error's text: `path: Invalid value: <value>: detail`.
fn invalid(path: &str, value: &str, detail: &str) -> String {
    format!("{path}: Invalid value: {value}: {detail}")
}

/// An aggregate of errors as upstream prints it: one error alone, several in brackets.
fn aggregate(mut errs: Vec<String>) -> String {
    let mut seen = std::collections::HashSet::new();
    errs.retain(|e| seen.insert(e.clone()));
    if errs.len() == 1 {
        errs.remove(0)
    } else {
        format!("[{}]", errs.join(", "))
    }
}

/// Go's `%q` for ordinary strings.
pub(crate) fn go_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Go's `%#v` of a `[]string`.
fn go_string_slice(v: &[String]) -> String {
    if v.is_empty() {
        return "[]string(nil)".to_string();
    }
    format!(
        "[]string{{{}}}",
        v.iter().map(|s| go_quote(s)).collect::<Vec<_>>().join(", ")
    )
}
