//! Field selectors (`fieldSelector=spec.nodeName=n1,status.phase!=Failed`) as upstream's
//! `fields.ParseSelector`: comma-separated terms, `=`/`==`/`!=`, backslash escapes in values.

use crate::SelectorError;
use std::fmt;

/// One `field=value` or `field!=value` term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldTerm {
    pub field: String,
    pub value: String,
    /// `!=` rather than `=` / `==`.
    pub negated: bool,
}

/// The AND of its terms; empty matches everything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FieldSelector {
    terms: Vec<FieldTerm>,
}

impl FieldSelector {
    pub fn everything() -> FieldSelector {
        FieldSelector::default()
    }
    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }
    pub fn terms(&self) -> &[FieldTerm] {
        &self.terms
    }
    /// The value a field must equal, when a `field=value` term says so.
    pub fn requires_exact_match(&self, field: &str) -> Option<&str> {
        self.terms
            .iter()
            .find(|t| t.field == field && !t.negated)
            .map(|t| t.value.as_str())
    }
    /// Checks the selector against an object whose fields `get` reads. `get` answers `None` for a
    /// field the kind does not support; that is an error (`field label not supported: <field>`)
    /// whatever the other terms say, as upstream checks every label before matching.
    pub fn matches(&self, get: impl Fn(&str) -> Option<String>) -> Result<bool, SelectorError> {
        let mut all = true;
        for t in &self.terms {
            let Some(have) = get(&t.field) else {
                return Err(SelectorError::UnsupportedField(t.field.clone()));
            };
            if (have == t.value) == t.negated {
                all = false;
            }
        }
        Ok(all)
    }
}

impl fmt::Display for FieldSelector {
    /// Upstream's `String()`: terms joined by commas, values escaped again.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, t) in self.terms.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            let op = if t.negated { "!=" } else { "=" };
            write!(f, "{}{}{}", t.field, op, escape_value(&t.value))?;
        }
        Ok(())
    }
}

/// Escapes `\`, `,` and `=` in a value with a backslash.
pub fn escape_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        if matches!(c, '\\' | ',' | '=') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Undoes [`escape_value`]; unescaped `,`/`=` and unknown escapes are errors, as upstream.
pub fn unescape_value(s: &str) -> Result<String, SelectorError> {
    if !s.contains(['\\', ',', '=']) {
        return Ok(s.to_string());
    }
    let mut out = String::with_capacity(s.len());
    let mut in_slash = false;
    for c in s.chars() {
        if in_slash {
            match c {
                '\\' | ',' | '=' => out.push(c),
                other => {
                    return Err(SelectorError::InvalidEscape(other.to_string()));
                }
            }
            in_slash = false;
            continue;
        }
        match c {
            '\\' => in_slash = true,
            // Go prints the rune with %v: its code point in decimal.
            ',' | '=' => {
                return Err(SelectorError::UnescapedCharacter(c));
            }
            other => out.push(other),
        }
    }
    if in_slash {
        return Err(SelectorError::InvalidEscape(String::new()));
    }
    Ok(out)
}

/// Splits on commas that are not escaped; escapes stay in the terms.
fn split_terms(s: &str) -> Vec<&str> {
    if s.is_empty() {
        return Vec::new();
    }
    let mut terms = Vec::new();
    let mut start = 0;
    let mut in_slash = false;
    for (i, c) in s.char_indices() {
        if in_slash {
            in_slash = false;
        } else if c == '\\' {
            in_slash = true;
        } else if c == ',' {
            terms.push(&s[start..i]);
            start = i + 1;
        }
    }
    terms.push(&s[start..]);
    terms
}

/// The first operator in the term splits it; `!=` and `==` win over `=` at the same place.
fn split_term(term: &str) -> Option<(&str, &str, &str)> {
    for (i, _) in term.char_indices() {
        let rest = &term[i..];
        for op in ["!=", "==", "="] {
            if let Some(rhs) = rest.strip_prefix(op) {
                return Some((&term[..i], op, rhs));
            }
        }
    }
    None
}

/// Parses a field selector string. Fields are not checked here: [`FieldSelector::matches`]
/// reports unsupported ones.
pub fn parse_field_selector(s: &str) -> Result<FieldSelector, SelectorError> {
    let mut parts = split_terms(s);
    parts.sort_unstable();
    let mut terms = Vec::new();
    for part in parts {
        if part.is_empty() {
            continue;
        }
        let Some((lhs, op, rhs)) = split_term(part) else {
            return Err(SelectorError::FieldTerm {
                selector: s.to_string(),
                term: part.to_string(),
            });
        };
        let value = unescape_value(rhs)?;
        terms.push(FieldTerm {
            field: lhs.to_string(),
            value,
            negated: op == "!=",
        });
    }
    Ok(FieldSelector { terms })
}
