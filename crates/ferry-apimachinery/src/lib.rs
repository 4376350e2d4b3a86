//! The pieces every kind shares, as upstream's `apimachinery` holds them: field errors shaped
//! like `field.Error` ([`errors`]), the name and format rules of `pkg/util/validation`
//! ([`names`]) and the typed decoding with its size and depth measures ([`decode`]). No IO.

pub mod decode;
pub mod errors;
pub mod names;
pub mod quantity;
