//! Comparing secrets (bearer tokens) without leaking, through timing, how much of a guess was
//! right.
//!
//! Both sides are hashed with SHA-256 first and the digests compared with
//! [`subtle::ConstantTimeEq`]: the time taken depends neither on where the first differing byte
//! is nor on the secret's length.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Whether `given` equals `secret`, in time independent of their contents.
pub fn token_eq(given: &[u8], secret: &[u8]) -> bool {
    let a = Sha256::digest(given);
    let b = Sha256::digest(secret);
    a.as_slice().ct_eq(b.as_slice()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_only_when_equal() {
        let cases: &[(&[u8], &[u8], bool)] = &[
            (b"", b"", true),
            (b"abc", b"abc", true),
            (b"abc", b"abd", false),
            (b"abc", b"ab", false),
            (b"ab", b"abc", false),
            (b"", b"x", false),
            (b"token\n", b"token", false),
        ];
        for (a, b, want) in cases {
            assert_eq!(token_eq(a, b), *want, "{a:?} vs {b:?}");
        }
    }
}
