//! The shape of the generated descriptor table (`descriptors.rs`).

/// One protobuf message: its fields in Go struct order (which is also the JSON key order).
#[derive(Debug)]
pub(crate) struct Msg {
    /// Fully qualified OpenAPI-style name, e.g. `io.k8s.api.core.v1.Service` (for errors).
    pub name: &'static str,
    pub fields: &'static [Field],
}

/// One field of a message.
#[derive(Debug)]
pub(crate) struct Field {
    /// The protobuf field number.
    pub tag: u32,
    /// The JSON key (empty for inlined structs).
    pub json: &'static str,
    /// The element type (for maps: the value type; keys are always strings).
    pub ty: Ty,
    pub card: Card,
    /// A combination of [`PTR`], [`OMIT`] and [`INLINE`].
    pub flags: u8,
}

/// The Go field is a pointer: present on the wire means present in JSON, even with a zero value.
pub(crate) const PTR: u8 = 1;
/// The Go field has `omitempty`: a zero scalar of a non-pointer field is left out of the JSON.
pub(crate) const OMIT: u8 = 2;
/// The Go field is an embedded struct whose JSON fields are promoted into the parent object.
pub(crate) const INLINE: u8 = 4;

/// How many values a field holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Card {
    Single,
    Repeated,
    /// `map<string, ty>`: entries are messages with key = 1, value = 2.
    Map,
}

/// A field's element type. (`Double` and `Duration` are unused by the served kinds today but
/// supported, so that the generator's roots can grow without codec changes.)
#[allow(dead_code)]
#[derive(Debug, Clone, Copy)]
pub(crate) enum Ty {
    String,
    Int32,
    Int64,
    Bool,
    Double,
    /// `[]byte`: base64 in JSON.
    Bytes,
    /// `intstr.IntOrString`: {type = 1 (0 int, 1 string), intVal = 2, strVal = 3}.
    IntOrString,
    /// `resource.Quantity`: {string = 1}, a JSON string.
    Quantity,
    /// `metav1.Time`: {seconds = 1, nanos = 2}, RFC 3339 with second precision; empty = `null`.
    Time,
    /// `metav1.MicroTime`: like `Time` with 6 fraction digits.
    MicroTime,
    /// `metav1.Duration`: {duration = 1} nanoseconds, Go `time.Duration` string form.
    Duration,
    /// `runtime.RawExtension` / `metav1.FieldsV1`: {raw = 1} holding JSON text.
    RawJson,
    Message(&'static Msg),
}

impl Field {
    pub(crate) fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }
}

impl Ty {
    /// Whether the type travels as a length-delimited (sub-)message on the wire.
    pub(crate) fn is_message_like(self) -> bool {
        matches!(
            self,
            Ty::IntOrString
                | Ty::Quantity
                | Ty::Time
                | Ty::MicroTime
                | Ty::Duration
                | Ty::RawJson
                | Ty::Message(_)
        )
    }
}
