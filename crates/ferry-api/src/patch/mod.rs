//! Patches: JSON merge patch (RFC 7386), JSON patch (RFC 6902), strategic merge patch and
//! server-side apply. STUB: to be filled in.
