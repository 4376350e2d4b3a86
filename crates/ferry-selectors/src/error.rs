//! Why a label or field selector is refused. The texts are upstream's, word for word: the API
//! server returns them in `400 Bad Request` bodies and kubectl prints them.

use crate::labels::go_quote;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// A requirement fails upstream's `labels.NewRequirement` checks (one message, or several
    /// in brackets).
    #[error("{0}")]
    InvalidRequirement(String),
    /// A `LabelSelector` object's `matchExpressions` operator is not `In`, `NotIn`, `Exists` or
    /// `DoesNotExist`.
    #[error("{} is not a valid label selector operator", go_quote(.0))]
    InvalidOperator(String),
    /// The label selector text does not parse: what was found and what was expected.
    #[error("{0}")]
    Syntax(String),
    /// One requirement of a label selector text is refused.
    #[error("unable to parse requirement: {0}")]
    Requirement(Box<SelectorError>),
    /// A field selector names a field the kind does not support.
    #[error("field label not supported: {0}")]
    UnsupportedField(String),
    /// A field selector term is not `field=value`, `field==value` or `field!=value`.
    #[error("invalid selector: '{selector}'; can't understand '{term}'")]
    FieldTerm { selector: String, term: String },
    /// A field selector value has an unknown escape: `\` and this text (empty when the value
    /// ends in `\`).
    #[error("invalid field selector: invalid escape sequence: \\{0}")]
    InvalidEscape(String),
    /// A field selector value holds an unescaped `,` or `=` (Go prints the rune in decimal).
    #[error("invalid field selector: unescaped character in value: {}", u32::from(*.0))]
    UnescapedCharacter(char),
}

/// The message, as an API error body carries it (`400 Bad Request`).
impl From<SelectorError> for String {
    fn from(e: SelectorError) -> String {
        e.to_string()
    }
}
