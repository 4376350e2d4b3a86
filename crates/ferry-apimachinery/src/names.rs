//! Name and format rules, as upstream's `apimachinery/pkg/util/validation` and
//! `api/validate/content` define them. Each `is_*` function returns the list of messages that
//! describe what is wrong (empty when the value is valid); the messages are upstream's, word for
//! word, because kubectl and clients show them to users.

use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;

use crate::errors::{ErrorList, FieldError, Path};

pub const DNS1123_LABEL_MAX_LENGTH: usize = 63;
pub const DNS1123_SUBDOMAIN_MAX_LENGTH: usize = 253;
pub const DNS1035_LABEL_MAX_LENGTH: usize = 63;
pub const LABEL_VALUE_MAX_LENGTH: usize = 63;
pub const LABEL_KEY_MAX_LENGTH: usize = 63;

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_LABEL_ERR: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str =
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_ERR: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_US_FMT: &str =
    "_?[a-z0-9]([-_a-z0-9]*[a-z0-9])?(\\._?[a-z0-9]([-_a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_US_ERR: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '_', '-' or '.', and must start and end with an alphanumeric character";
const DNS1035_LABEL_FMT: &str = "[a-z]([-a-z0-9]*[a-z0-9])?";
const DNS1035_LABEL_ERR: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character";
const WILDCARD_FMT: &str = "\\*\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const WILDCARD_ERR: &str = "a wildcard DNS-1123 subdomain must start with '*.', followed by a valid DNS subdomain, which must consist of lower case alphanumeric characters, '-' or '.' and end with an alphanumeric character";
const LABEL_KEY_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const LABEL_KEY_ERR: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_ERR: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const C_IDENTIFIER_FMT: &str = "[A-Za-z_][A-Za-z0-9_]*";
const C_IDENTIFIER_ERR: &str = "a valid C identifier must start with alphabetic character or '_', followed by a string of alphanumeric characters or '_'";
const ENV_VAR_FMT: &str = "[-._a-zA-Z][-._a-zA-Z0-9]*";
const ENV_VAR_ERR: &str = "a valid environment variable name must consist of alphabetic characters, digits, '_', '-', or '.', and must not start with a digit";
const RELAXED_ENV_VAR_ERR: &str = "a valid environment variable name must consist only of printable ASCII characters other than '='";
const CONFIG_MAP_KEY_FMT: &str = "[-._a-zA-Z0-9]+";
const CONFIG_MAP_KEY_ERR: &str =
    "a valid config key must consist of alphanumeric characters, '-', '_' or '.'";
const PERCENT_FMT: &str = "[0-9]+%";
const PERCENT_ERR: &str =
    "a valid percent string must be a numeric string followed by an ending '%'";
const HTTP_PATH_FMT: &str = "[A-Za-z0-9/\\-._~%!$&'()*+,;=:]+";

/// `must be no more than N characters`.
pub fn max_len_error(n: usize) -> String {
    format!("must be no more than {n} characters")
}

/// Upstream's `RegexError`: the message, examples, and the regex.
pub fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    if examples.is_empty() {
        return format!("{msg} (regex used for validation is '{fmt}')");
    }
    let mut s = format!("{msg} (e.g. ");
    for (i, e) in examples.iter().enumerate() {
        if i > 0 {
            s.push_str(" or ");
        }
        s.push('\'');
        s.push_str(e);
        s.push_str("', ");
    }
    s.push_str("regex used for validation is '");
    s.push_str(fmt);
    s.push_str("')");
    s
}

/// `must be non-empty`.
pub fn empty_error() -> &'static str {
    "must be non-empty"
}

/// `must be between LO and HI, inclusive`.
pub fn inclusive_range_error(lo: i64, hi: i64) -> String {
    format!("must be between {lo} and {hi}, inclusive")
}

fn is_lower_alnum(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?` (or the 1035 / underscore variants).
fn matches_label(s: &[u8], first: fn(u8) -> bool, underscore: bool) -> bool {
    let s = if underscore && s.first() == Some(&b'_') {
        &s[1..]
    } else {
        s
    };
    let Some((&f, rest)) = s.split_first() else {
        return false;
    };
    if !first(f) {
        return false;
    }
    if rest.is_empty() {
        return true;
    }
    let (&last, middle) = match rest.split_last() {
        Some(x) => x,
        None => return true,
    };
    is_lower_alnum(last)
        && middle
            .iter()
            .all(|&c| is_lower_alnum(c) || c == b'-' || (underscore && c == b'_'))
}

fn matches_dns1123_label(s: &str) -> bool {
    matches_label(s.as_bytes(), is_lower_alnum, false)
}

fn matches_dns1123_subdomain(s: &str) -> bool {
    s.split('.').all(matches_dns1123_label)
}

/// IsDNS1123Label: a lowercase RFC 1123 label (at most 63 characters).
pub fn is_dns1123_label(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_LABEL_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_LABEL_MAX_LENGTH));
    }
    if !matches_dns1123_label(value) {
        if matches_dns1123_subdomain(value) {
            errs.push("must not contain dots".to_string());
        } else {
            errs.push(regex_error(
                DNS1123_LABEL_ERR,
                DNS1123_LABEL_FMT,
                &["my-name", "123-abc"],
            ));
        }
    }
    errs
}

/// IsDNS1123Subdomain: a lowercase RFC 1123 subdomain (at most 253 characters).
pub fn is_dns1123_subdomain(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_SUBDOMAIN_MAX_LENGTH));
    }
    if !matches_dns1123_subdomain(value) {
        errs.push(regex_error(
            DNS1123_SUBDOMAIN_ERR,
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    errs
}

/// IsDNS1123SubdomainWithUnderscore: like a subdomain, but each label may start with `_` and
/// contain `_`.
pub fn is_dns1123_subdomain_with_underscore(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_SUBDOMAIN_MAX_LENGTH));
    }
    if !value
        .split('.')
        .all(|l| matches_label(l.as_bytes(), is_lower_alnum, true))
    {
        errs.push(regex_error(
            DNS1123_SUBDOMAIN_US_ERR,
            DNS1123_SUBDOMAIN_US_FMT,
            &["example.com"],
        ));
    }
    errs
}

/// IsDNS1035Label: starts with a letter (Service names).
pub fn is_dns1035_label(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1035_LABEL_MAX_LENGTH {
        errs.push(max_len_error(DNS1035_LABEL_MAX_LENGTH));
    }
    if !matches_label(value.as_bytes(), |c| c.is_ascii_lowercase(), false) {
        errs.push(regex_error(
            DNS1035_LABEL_ERR,
            DNS1035_LABEL_FMT,
            &["my-name", "abc-123"],
        ));
    }
    errs
}

/// IsWildcardDNS1123Subdomain: `*.` followed by a subdomain.
pub fn is_wildcard_dns1123_subdomain(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_SUBDOMAIN_MAX_LENGTH));
    }
    let ok = value
        .strip_prefix("*.")
        .is_some_and(matches_dns1123_subdomain);
    if !ok {
        errs.push(regex_error(WILDCARD_ERR, WILDCARD_FMT, &["*.example.com"]));
    }
    errs
}

fn matches_label_key_name(s: &str) -> bool {
    let b = s.as_bytes();
    let Some((&first, rest)) = b.split_first() else {
        return false;
    };
    if !first.is_ascii_alphanumeric() {
        return false;
    }
    match rest.split_last() {
        None => true,
        Some((&last, middle)) => {
            last.is_ascii_alphanumeric()
                && middle
                    .iter()
                    .all(|&c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.')
        }
    }
}

/// IsQualifiedName / IsLabelKey: an optional DNS subdomain prefix and `/`, then a name of at
/// most 63 characters.
pub fn is_qualified_name(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push(format!("prefix part {}", empty_error()));
            } else {
                for m in is_dns1123_subdomain(prefix) {
                    errs.push(format!("prefix part {m}"));
                }
            }
            *name
        }
        _ => {
            errs.push(format!(
                "a valid label key {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(LABEL_KEY_ERR, LABEL_KEY_FMT, &["MyName", "my.name", "123-abc"])
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push(format!("name part {}", empty_error()));
    } else if name.len() > LABEL_KEY_MAX_LENGTH {
        errs.push(format!("name part {}", max_len_error(LABEL_KEY_MAX_LENGTH)));
    }
    if !matches_label_key_name(name) {
        errs.push(format!(
            "name part {}",
            regex_error(
                LABEL_KEY_ERR,
                LABEL_KEY_FMT,
                &["MyName", "my.name", "123-abc"]
            )
        ));
    }
    errs
}

/// IsValidLabelValue: empty, or a label-key-like name of at most 63 characters.
pub fn is_valid_label_value(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > LABEL_VALUE_MAX_LENGTH {
        errs.push(max_len_error(LABEL_VALUE_MAX_LENGTH));
    }
    if !value.is_empty() && !matches_label_key_name(value) {
        errs.push(regex_error(
            LABEL_VALUE_ERR,
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    errs
}

/// IsCIdentifier.
pub fn is_c_identifier(value: &str) -> Vec<String> {
    let b = value.as_bytes();
    let ok = match b.split_first() {
        Some((&f, rest)) => {
            (f.is_ascii_alphabetic() || f == b'_')
                && rest.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'_')
        }
        None => false,
    };
    if ok {
        Vec::new()
    } else {
        vec![regex_error(
            C_IDENTIFIER_ERR,
            C_IDENTIFIER_FMT,
            &["my_name", "MY_NAME", "MyName"],
        )]
    }
}

fn has_chdir_prefix(value: &str) -> Vec<String> {
    if value == "." {
        vec!["must not be '.'".to_string()]
    } else if value == ".." {
        vec!["must not be '..'".to_string()]
    } else if value.starts_with("..") {
        vec!["must not start with '..'".to_string()]
    } else {
        Vec::new()
    }
}

/// IsEnvVarName (the strict form).
pub fn is_env_var_name(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let b = value.as_bytes();
    let ok = match b.split_first() {
        Some((&f, rest)) => {
            (f.is_ascii_alphabetic() || matches!(f, b'-' | b'.' | b'_'))
                && rest
                    .iter()
                    .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_'))
        }
        None => false,
    };
    if !ok {
        errs.push(regex_error(
            ENV_VAR_ERR,
            ENV_VAR_FMT,
            &["my.env-name", "MY_ENV.NAME", "MyEnvName1"],
        ));
    }
    errs.extend(has_chdir_prefix(value));
    errs
}

/// IsRelaxedEnvVarName: what Pods accept since RelaxedEnvironmentVariableValidation went GA.
pub fn is_relaxed_env_var_name(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.is_empty() {
        errs.push(format!("environment variable name {}", empty_error()));
    }
    if value
        .chars()
        .any(|c| !c.is_ascii() || !(' '..='~').contains(&c) || c == '=')
    {
        errs.push(RELAXED_ENV_VAR_ERR.to_string());
    }
    errs
}

/// IsConfigMapKey: keys of ConfigMap and Secret data.
pub fn is_config_map_key(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_SUBDOMAIN_MAX_LENGTH));
    }
    if value.is_empty()
        || !value
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_'))
    {
        errs.push(regex_error(
            CONFIG_MAP_KEY_ERR,
            CONFIG_MAP_KEY_FMT,
            &["key.name", "KEY_NAME", "key-name"],
        ));
    }
    errs.extend(has_chdir_prefix(value));
    errs
}

/// IsValidPortNum: 1..=65535.
pub fn is_valid_port_num(port: i64) -> Vec<String> {
    if (1..=65535).contains(&port) {
        Vec::new()
    } else {
        vec![inclusive_range_error(1, 65535)]
    }
}

/// IsInRange.
pub fn is_in_range(value: i64, min: i64, max: i64) -> Vec<String> {
    if (min..=max).contains(&value) {
        Vec::new()
    } else {
        vec![inclusive_range_error(min, max)]
    }
}

/// IsValidPortName (IANA_SVC_NAME): at most 15 characters of `[-a-z0-9]`, at least one letter, no
/// `--`, no leading or trailing hyphen.
pub fn is_valid_port_name(port: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if port.len() > 15 {
        errs.push(max_len_error(15));
    }
    if port.is_empty() || !port.bytes().all(|c| is_lower_alnum(c) || c == b'-') {
        errs.push(
            "must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)".to_string(),
        );
    }
    if !port.bytes().any(|c| c.is_ascii_lowercase()) {
        errs.push("must contain at least one letter (a-z)".to_string());
    }
    if port.contains("--") {
        errs.push("must not contain consecutive hyphens".to_string());
    }
    if port.starts_with('-') || port.ends_with('-') {
        errs.push("must not begin or end with a hyphen".to_string());
    }
    errs
}

/// IsValidPercent: `[0-9]+%`.
pub fn is_valid_percent(percent: &str) -> Vec<String> {
    let ok = percent
        .strip_suffix('%')
        .is_some_and(|d| !d.is_empty() && d.bytes().all(|c| c.is_ascii_digit()));
    if ok {
        Vec::new()
    } else {
        vec![regex_error(PERCENT_ERR, PERCENT_FMT, &["1%", "93%"])]
    }
}

fn parse_ipv4_sloppy(s: &str) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    let mut n = 0;
    for part in s.split('.') {
        if n == 4 || part.is_empty() || part.len() > 3 || !part.bytes().all(|c| c.is_ascii_digit())
        {
            return None;
        }
        octets[n] = part.parse::<u8>().ok()?;
        n += 1;
    }
    (n == 4).then(|| Ipv4Addr::from(octets))
}

/// Parses an IP the way Go's `netutils.ParseIPSloppy` does: IPv4 octets may have leading zeros
/// (read as decimal). IPv4-mapped IPv6 addresses are returned as IPv4 (Go's `To4()` view).
pub fn parse_ip_sloppy(s: &str) -> Option<IpAddr> {
    if let Some(v4) = parse_ipv4_sloppy(s) {
        return Some(IpAddr::V4(v4));
    }
    if !s.contains(':') {
        return None;
    }
    let v6: std::net::Ipv6Addr = s.parse().ok()?;
    match v6.to_ipv4_mapped() {
        Some(v4) => Some(IpAddr::V4(v4)),
        None => Some(IpAddr::V6(v6)),
    }
}

/// Parses a CIDR the way Go's `netutils.ParseCIDRSloppy` does; returns the address as written
/// and the network (host bits cleared).
pub fn parse_cidr_sloppy(s: &str) -> Option<(IpAddr, IpNet)> {
    let (addr, len) = s.split_once('/')?;
    if len.is_empty() || len.len() > 3 || !len.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let len: u8 = len.parse().ok()?;
    let ip = if addr.contains(':') {
        let v6: std::net::Ipv6Addr = addr.parse().ok()?;
        IpAddr::V6(v6)
    } else {
        IpAddr::V4(parse_ipv4_sloppy(addr)?)
    };
    let net = IpNet::new(ip, len).ok()?.trunc();
    Some((ip, net))
}

/// True when the string parses as an IPv6 address (and not as IPv4).
pub fn is_ipv6_string(s: &str) -> bool {
    matches!(parse_ip_sloppy(s), Some(IpAddr::V6(_)))
}

/// IsValidIP as a field error list.
pub fn is_valid_ip(path: &Path, value: &str) -> ErrorList {
    if parse_ip_sloppy(value).is_none() {
        return vec![FieldError::invalid_str(
            path,
            value,
            "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
        )];
    }
    Vec::new()
}

/// IsValidIPv4Address.
pub fn is_valid_ipv4_address(path: &Path, value: &str) -> ErrorList {
    match parse_ip_sloppy(value) {
        Some(IpAddr::V4(_)) => Vec::new(),
        _ => vec![FieldError::invalid_str(
            path,
            value,
            "must be a valid IPv4 address",
        )],
    }
}

/// IsValidIPv6Address.
pub fn is_valid_ipv6_address(path: &Path, value: &str) -> ErrorList {
    match parse_ip_sloppy(value) {
        Some(IpAddr::V6(_)) => Vec::new(),
        _ => vec![FieldError::invalid_str(
            path,
            value,
            "must be a valid IPv6 address",
        )],
    }
}

/// IsValidCIDR.
pub fn is_valid_cidr(path: &Path, value: &str) -> ErrorList {
    if parse_cidr_sloppy(value).is_none() {
        return vec![FieldError::invalid_str(
            path,
            value,
            "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)",
        )];
    }
    Vec::new()
}

/// IsDomainPrefixedPath: `acme.io/foo` (IngressClass controller).
pub fn is_domain_prefixed_path(path: &Path, value: &str) -> ErrorList {
    if value.is_empty() {
        return vec![FieldError::required(path, "")];
    }
    let Some((host, rest)) = value
        .split_once('/')
        .filter(|(h, r)| !h.is_empty() && !r.is_empty())
    else {
        return vec![FieldError::invalid_str(
            path,
            value,
            "must be a domain-prefixed path (such as \"acme.io/foo\")",
        )];
    };
    let mut errs: ErrorList = is_dns1123_subdomain(host)
        .into_iter()
        .map(|m| FieldError::invalid_str(path, host, m))
        .collect();
    let ok = rest
        .bytes()
        .all(|c| c.is_ascii_alphanumeric() || b"/-._~%!$&'()*+,;=:".contains(&c));
    if !ok {
        errs.push(FieldError::invalid_str(
            path,
            rest,
            regex_error("Invalid path", HTTP_PATH_FMT, &[]),
        ));
    }
    errs
}

/// For generated names: a trailing `-` is fine because a suffix will follow.
fn mask_trailing_dash(name: &str) -> String {
    match name.strip_suffix('-') {
        Some(stem) if !stem.is_empty() => format!("{stem}a"),
        _ => name.to_string(),
    }
}

/// NameIsDNSSubdomain (most kinds).
pub fn name_is_dns_subdomain(name: &str, prefix: bool) -> Vec<String> {
    if prefix {
        is_dns1123_subdomain(&mask_trailing_dash(name))
    } else {
        is_dns1123_subdomain(name)
    }
}

/// NameIsDNSLabel (Namespaces).
pub fn name_is_dns_label(name: &str, prefix: bool) -> Vec<String> {
    if prefix {
        is_dns1123_label(&mask_trailing_dash(name))
    } else {
        is_dns1123_label(name)
    }
}

/// NameIsDNS1035Label (Services).
pub fn name_is_dns1035_label(name: &str, prefix: bool) -> Vec<String> {
    if prefix {
        is_dns1035_label(&mask_trailing_dash(name))
    } else {
        is_dns1035_label(name)
    }
}

/// The name rule of one kind: `(name, is_prefix) -> messages`.
pub type NameFn = fn(&str, bool) -> Vec<String>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels() {
        let cases: &[(&str, &[&str])] = &[
            ("my-name", &[]),
            ("123-abc", &[]),
            ("a", &[]),
            ("a.b", &["must not contain dots"]),
            (
                "Bad_Name",
                &[
                    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
                ],
            ),
            (
                "-a",
                &[
                    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
                ],
            ),
            (
                "",
                &[
                    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
                ],
            ),
        ];
        for (v, want) in cases {
            assert_eq!(
                is_dns1123_label(v),
                want.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                "{v}"
            );
        }
        assert_eq!(
            is_dns1123_label(&"a".repeat(64)),
            vec!["must be no more than 63 characters".to_string()]
        );
    }

    #[test]
    fn subdomains_and_1035() {
        assert!(is_dns1123_subdomain("example.com").is_empty());
        assert!(is_dns1123_subdomain("a-b.c-d.e").is_empty());
        assert_eq!(is_dns1123_subdomain("a..b").len(), 1);
        assert_eq!(is_dns1123_subdomain("a.").len(), 1);
        assert!(is_dns1035_label("my-service").is_empty());
        assert_eq!(
            is_dns1035_label("1abc"),
            vec!["a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')".to_string()]
        );
        assert!(is_wildcard_dns1123_subdomain("*.example.com").is_empty());
        assert_eq!(is_wildcard_dns1123_subdomain("*.*.example.com").len(), 1);
        assert_eq!(is_wildcard_dns1123_subdomain("f*.example.com").len(), 1);
        assert!(is_dns1123_subdomain_with_underscore("_sip._tcp.example.com").is_empty());
        assert_eq!(name_is_dns_subdomain("gen-", true), Vec::<String>::new());
        assert_eq!(name_is_dns_subdomain("gen-", false).len(), 1);
    }

    #[test]
    fn label_keys_and_values() {
        assert!(is_qualified_name("app").is_empty());
        assert!(is_qualified_name("example.com/My.Name_1").is_empty());
        assert_eq!(
            is_qualified_name("/a"),
            vec!["prefix part must be non-empty".to_string()]
        );
        assert_eq!(is_qualified_name("a/"), vec![
            "name part must be non-empty".to_string(),
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')".to_string(),
        ]);
        assert_eq!(is_qualified_name("a/b/c").len(), 1);
        assert_eq!(is_qualified_name("Bad.Prefix/x"), vec!["prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')".to_string()]);
        assert!(is_valid_label_value("").is_empty());
        assert!(is_valid_label_value("MyApp").is_empty());
        assert_eq!(is_valid_label_value("-x"), vec!["a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')".to_string()]);
    }

    #[test]
    fn ports_env_keys() {
        assert!(is_valid_port_name("http").is_empty());
        assert!(is_valid_port_name("h2c-8080").is_empty());
        assert_eq!(
            is_valid_port_name("8080"),
            vec!["must contain at least one letter (a-z)".to_string()]
        );
        assert_eq!(
            is_valid_port_name("a--b"),
            vec!["must not contain consecutive hyphens".to_string()]
        );
        assert_eq!(
            is_valid_port_name("-ab"),
            vec!["must not begin or end with a hyphen".to_string()]
        );
        assert_eq!(
            is_valid_port_name("abcdefghijklmnop"),
            vec!["must be no more than 15 characters".to_string()]
        );
        assert_eq!(is_valid_port_name("HTTP").len(), 2);
        assert_eq!(
            is_valid_port_num(0),
            vec!["must be between 1 and 65535, inclusive".to_string()]
        );
        assert!(is_valid_port_num(65535).is_empty());
        assert!(is_c_identifier("MY_VAR1").is_empty());
        assert_eq!(is_c_identifier("1abc").len(), 1);
        assert!(is_env_var_name("my.env-name").is_empty());
        assert_eq!(is_env_var_name("..x").len(), 1);
        assert!(is_relaxed_env_var_name("1 weird:name").is_empty());
        assert_eq!(is_relaxed_env_var_name("a=b").len(), 1);
        assert!(is_config_map_key("key.name").is_empty());
        assert_eq!(is_config_map_key("a/b").len(), 1);
        assert_eq!(
            is_config_map_key(".."),
            vec!["must not be '..'".to_string()]
        );
        assert!(is_valid_percent("25%").is_empty());
        assert_eq!(is_valid_percent("25").len(), 1);
    }

    #[test]
    fn ips_and_cidrs() {
        assert!(parse_ip_sloppy("10.0.0.1").is_some());
        assert!(parse_ip_sloppy("010.000.000.001").is_some());
        assert!(parse_ip_sloppy("2001:db8::1").is_some());
        assert_eq!(
            parse_ip_sloppy("::ffff:1.2.3.4"),
            Some(IpAddr::V4(Ipv4Addr::new(1, 2, 3, 4)))
        );
        assert!(parse_ip_sloppy("1.2.3").is_none());
        assert!(parse_ip_sloppy("1.2.3.256").is_none());
        assert!(parse_ip_sloppy("fe80::1%eth0").is_none());
        assert!(parse_cidr_sloppy("172.17.0.0/16").is_some());
        assert!(parse_cidr_sloppy("2001:db8::/64").is_some());
        assert!(parse_cidr_sloppy("10.0.0.0/33").is_none());
        assert!(parse_cidr_sloppy("10.0.0.0").is_none());
        let p = Path::new("spec").child("clusterIP");
        assert_eq!(
            is_valid_ip(&p, "x")[0].to_string(),
            "spec.clusterIP: Invalid value: \"x\": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"
        );
        assert_eq!(
            is_domain_prefixed_path(&p, "example.com/ingress-controller"),
            Vec::new()
        );
        assert_eq!(is_domain_prefixed_path(&p, "nginx").len(), 1);
    }

    proptest::proptest! {
        #[test]
        fn label_rule_matches_definition(s in "[a-z0-9.-]{0,70}") {
            let ok = s.len() <= 63
                && !s.is_empty()
                && s.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
                && !s.starts_with('-') && !s.ends_with('-');
            proptest::prop_assert_eq!(is_dns1123_label(&s).is_empty(), ok);
        }
    }
}
