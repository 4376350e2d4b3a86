//! Typed error context for Ferry's libraries: anyhow's `context`/`with_context`, but returning a
//! [`ContextError`] that each crate's error type wraps (`#[error(transparent)]
//! Context(#[from] ferry_errors::ContextError)`), so `?` names the failed step without anyhow.
//!
//! The message is the step that failed; the cause stays the error's `source`, so `{:#}` in anyhow
//! (or any walk of the source chain) reads "step: cause".

use std::error::Error as StdError;

/// A failed step: what was being done, with the error that stopped it as the source.
#[derive(Debug, thiserror::Error)]
#[error("{what}")]
pub struct ContextError {
    what: String,
    #[source]
    source: Box<dyn StdError + Send + Sync>,
}

impl ContextError {
    /// Names `source` as the cause of the failed step `what`.
    pub fn new(what: impl Into<String>, source: impl StdError + Send + Sync + 'static) -> Self {
        ContextError {
            what: what.into(),
            source: Box::new(source),
        }
    }

    /// The step that failed.
    pub fn what(&self) -> &str {
        &self.what
    }
}

/// Names the step that failed (anyhow's `context`/`with_context`, typed). `?` converts the
/// [`ContextError`] into the calling crate's error through its `From<ContextError>`.
pub trait Context<T> {
    /// Wraps the error with the step `what()` describes (evaluated only on error).
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T, ContextError>;
    /// Wraps the error with the step `what`.
    fn context(self, what: &str) -> Result<T, ContextError>;
}

impl<T, E: StdError + Send + Sync + 'static> Context<T> for Result<T, E> {
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T, ContextError> {
        self.map_err(|e| ContextError::new(what(), e))
    }

    fn context(self, what: &str) -> Result<T, ContextError> {
        self.with_context(|| what.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A crate's error type as the callers declare it.
    #[derive(Debug, thiserror::Error)]
    enum CrateError {
        #[error(transparent)]
        Context(#[from] ContextError),
        #[error("something else")]
        Other,
    }

    fn in_use() -> Result<(), std::io::Error> {
        Err(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            "address in use",
        ))
    }

    /// The messages of `e` and its sources, outermost first.
    fn chain(e: &(dyn StdError + 'static)) -> Vec<String> {
        let mut out = vec![e.to_string()];
        let mut cur = e.source();
        while let Some(s) = cur {
            out.push(s.to_string());
            cur = s.source();
        }
        out
    }

    #[test]
    fn context_keeps_the_cause_as_source() {
        let e = in_use()
            .with_context(|| "binding 127.0.0.1:6443".into())
            .expect_err("an error");
        assert_eq!(e.to_string(), "binding 127.0.0.1:6443");
        assert_eq!(e.what(), "binding 127.0.0.1:6443");
        assert_eq!(chain(&e), ["binding 127.0.0.1:6443", "address in use"]);
    }

    #[test]
    fn question_mark_converts_into_the_crate_error_and_keeps_the_chain() {
        fn step() -> Result<(), CrateError> {
            in_use().context("agent endpoint on 127.0.0.1:10250")?;
            Err(CrateError::Other)
        }
        let e = step().expect_err("an error");
        assert!(matches!(e, CrateError::Context(_)));
        assert_eq!(
            chain(&e),
            ["agent endpoint on 127.0.0.1:10250", "address in use"]
        );
    }

    #[test]
    fn the_message_is_built_only_on_error() {
        let ok: Result<u8, std::io::Error> = Ok(7);
        let v = ok
            .with_context(|| panic!("not called on success"))
            .expect("ok");
        assert_eq!(v, 7);
    }
}
