//! The CEL environment of `x-kubernetes-validations`: the standard library, the strings
//! extension (from the `cel` crate) and Kubernetes' own libraries, registered through the
//! crate's function registration API:
//!
//! * lists: `isSorted`, `sum`, `min`, `max`, `indexOf`, `lastIndexOf`;
//! * regex: `find`, `findAll` (`matches` is the standard library's, RE2 syntax via `regex`);
//! * URLs: `url`, `isURL`, `getScheme`, `getHost`, `getHostname`, `getPort`,
//!   `getEscapedPath`, `getQuery`;
//! * IPs and CIDRs: `ip`, `isIP`, `ip.isCanonical`, `cidr`, `isCIDR` and their methods;
//! * quantities: `quantity`, `isQuantity` and their methods;
//! * formats: `format.named(name)` and `<format>.validate(string)`.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, OnceLock};

use cel::common::types::{DYN_TYPE, LIST_TYPE, STRING_TYPE};
use cel::common::value::CowVal;
use cel::objects::{Key, Map, Opaque, OptionalValue};
use cel::{Context, Env, ExecutionError, FunctionContext, Value};

type R = Result<Value, ExecutionError>;

/// A function of a [`Context`]: its receiver and arguments are in the [`FunctionContext`].
type ContextFn = fn(&FunctionContext) -> R;

/// The shared environment (built once).
pub fn env() -> Arc<Env> {
    static ENV: OnceLock<Arc<Env>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Env::stdlib();
        // Each registration names a function no other library declares: a failure here is a
        // programming error caught by the tests, so it is ignored rather than unwrapped.
        let _ = env.add_extension(cel::extensions::strings);
        let _ = env.add_member_overload(
            "indexOf",
            "list.indexOf(dyn)",
            LIST_TYPE,
            vec![DYN_TYPE],
            list_index_of,
        );
        let _ = env.add_member_overload(
            "lastIndexOf",
            "list.lastIndexOf(dyn)",
            LIST_TYPE,
            vec![DYN_TYPE],
            list_last_index_of,
        );
        let _ = env.add_overload(
            "format.named",
            "format.named(string)",
            vec![STRING_TYPE],
            format_named,
        );
        Arc::new(env)
    })
    .clone()
}

/// The functions a [`Context`] adds on top of [`env`].
pub fn register(ctx: &mut Context<'_, '_>) {
    let fns: [(&str, ContextFn); 38] = [
        ("isSorted", is_sorted),
        ("sum", sum),
        ("min", min),
        ("max", max),
        ("find", find),
        ("findAll", find_all),
        ("url", url),
        ("isURL", is_url),
        ("getScheme", get_scheme),
        ("getHost", get_host),
        ("getHostname", get_hostname),
        ("getPort", get_port),
        ("getEscapedPath", get_escaped_path),
        ("getQuery", get_query),
        ("ip", ip),
        ("isIP", is_ip),
        ("ip.isCanonical", ip_is_canonical),
        ("family", family),
        ("isUnspecified", is_unspecified),
        ("isLoopback", is_loopback),
        ("isLinkLocalMulticast", is_link_local_multicast),
        ("isLinkLocalUnicast", is_link_local_unicast),
        ("isGlobalUnicast", is_global_unicast),
        ("cidr", cidr),
        ("isCIDR", is_cidr),
        ("containsIP", contains_ip),
        ("containsCIDR", contains_cidr),
        ("masked", masked),
        ("prefixLength", prefix_length),
        ("quantity", quantity),
        ("isQuantity", is_quantity),
        ("isInteger", q_is_integer),
        ("asInteger", q_as_integer),
        ("asApproximateFloat", q_as_float),
        ("sign", q_sign),
        ("isGreaterThan", q_greater),
        ("isLessThan", q_less),
        ("compareTo", q_compare),
    ];
    for (name, f) in fns {
        let _ = ctx.add_function(name, f);
    }
    let _ = ctx.add_function("add", q_add as ContextFn);
    let _ = ctx.add_function("sub", q_sub as ContextFn);
    let _ = ctx.add_function("validate", format_validate as ContextFn);
}

// ---- argument helpers ----

fn to_value(v: &CowVal<'_, '_>) -> R {
    Value::try_from(v.as_ref())
}

fn this(ftx: &FunctionContext) -> R {
    match &ftx.this {
        Some(t) => to_value(t),
        None => Err(ExecutionError::missing_argument_or_target()),
    }
}

fn args(ftx: &FunctionContext) -> Result<Vec<Value>, ExecutionError> {
    ftx.args.iter().map(to_value).collect()
}

/// The single argument of a global function (`ip('1.2.3.4')`), or the receiver of a member
/// one.
fn one(ftx: &FunctionContext) -> R {
    if let Some(t) = &ftx.this {
        return to_value(t);
    }
    match ftx.args.as_slice() {
        [a] => to_value(a),
        other => Err(ExecutionError::invalid_argument_count(1, other.len())),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::List(_) => "list",
        Value::Map(_) => "map",
        Value::Int(_) => "int",
        Value::UInt(_) => "uint",
        Value::Float(_) => "double",
        Value::String(_) => "string",
        Value::Bytes(_) => "bytes",
        Value::Bool(_) => "bool",
        Value::Null => "null_type",
        Value::Duration(_) => "google.protobuf.Duration",
        Value::Timestamp(_) => "google.protobuf.Timestamp",
        Value::Opaque(o) => match o.runtime_type_name() {
            "net.IP" => "net.IP",
            "net.CIDR" => "net.CIDR",
            "net.URL" => "net.URL",
            "kubernetes.Quantity" => "kubernetes.Quantity",
            _ => "opaque",
        },
        _ => "dyn",
    }
}

fn overload(ftx: &FunctionContext, target: Option<&Value>, args: &[Value]) -> ExecutionError {
    let mut types: Vec<String> = target.iter().map(|t| type_name(t).to_string()).collect();
    types.extend(args.iter().map(|a| type_name(a).to_string()));
    if target.is_some() {
        ExecutionError::no_such_member_overload(ftx.name, types)
    } else {
        ExecutionError::no_such_overload(ftx.name, types)
    }
}

fn string_arg(ftx: &FunctionContext) -> Result<Arc<String>, ExecutionError> {
    match one(ftx)? {
        Value::String(s) => Ok(s),
        other => Err(overload(ftx, None, &[other])),
    }
}

fn list_this(ftx: &FunctionContext) -> Result<Arc<Vec<Value>>, ExecutionError> {
    match this(ftx)? {
        Value::List(l) => Ok(l),
        other => Err(overload(ftx, Some(&other), &[])),
    }
}

fn opaque<T: Opaque + 'static>(v: &Value) -> Option<&T> {
    match v {
        Value::Opaque(o) => o.downcast_ref::<T>(),
        _ => None,
    }
}

fn some(v: Value) -> Value {
    Value::Opaque(Arc::new(OptionalValue::of(v)))
}

fn none() -> Value {
    Value::Opaque(Arc::new(OptionalValue::none()))
}

// ---- lists ----

fn compare(ftx: &FunctionContext, a: &Value, b: &Value) -> Result<Ordering, ExecutionError> {
    let numeric = |v: &Value| match v {
        Value::Int(i) => Some(*i as f64),
        Value::UInt(u) => Some(*u as f64),
        Value::Float(f) => Some(*f),
        _ => None,
    };
    match (a, b) {
        (Value::Int(x), Value::Int(y)) => Ok(x.cmp(y)),
        (Value::UInt(x), Value::UInt(y)) => Ok(x.cmp(y)),
        (Value::String(x), Value::String(y)) => Ok(x.cmp(y)),
        (Value::Bytes(x), Value::Bytes(y)) => Ok(x.cmp(y)),
        (Value::Bool(x), Value::Bool(y)) => Ok(x.cmp(y)),
        (Value::Duration(x), Value::Duration(y)) => Ok(x.cmp(y)),
        (Value::Timestamp(x), Value::Timestamp(y)) => Ok(x.cmp(y)),
        _ => match (numeric(a), numeric(b)) {
            (Some(x), Some(y)) => x
                .partial_cmp(&y)
                .ok_or_else(|| ExecutionError::ValuesNotComparable(a.clone(), b.clone())),
            _ => Err(overload(ftx, Some(a), std::slice::from_ref(b))),
        },
    }
}

fn is_sorted(ftx: &FunctionContext) -> R {
    let l = list_this(ftx)?;
    for w in l.windows(2) {
        if compare(ftx, &w[0], &w[1])? == Ordering::Greater {
            return Ok(Value::Bool(false));
        }
    }
    Ok(Value::Bool(true))
}

fn sum(ftx: &FunctionContext) -> R {
    let l = list_this(ftx)?;
    let Some(first) = l.first() else {
        return Ok(Value::Int(0));
    };
    if !matches!(
        first,
        Value::Int(_) | Value::UInt(_) | Value::Float(_) | Value::Duration(_)
    ) {
        return Err(overload(ftx, Some(&Value::List(l.clone())), &[]));
    }
    let mut acc = first.clone();
    for v in l.iter().skip(1) {
        acc = match (&acc, v) {
            (Value::Int(a), Value::Int(b)) => Value::Int(
                a.checked_add(*b)
                    .ok_or_else(|| ExecutionError::function_error("sum", "integer overflow"))?,
            ),
            (Value::UInt(a), Value::UInt(b)) => {
                Value::UInt(a.checked_add(*b).ok_or_else(|| {
                    ExecutionError::function_error("sum", "unsigned integer overflow")
                })?)
            }
            (Value::Float(a), Value::Float(b)) => Value::Float(a + b),
            (Value::Duration(a), Value::Duration(b)) => Value::Duration(*a + *b),
            _ => return Err(overload(ftx, Some(&acc), std::slice::from_ref(v))),
        };
    }
    Ok(acc)
}

fn extreme(ftx: &FunctionContext, want: Ordering) -> R {
    let l = list_this(ftx)?;
    let Some(mut best) = l.first().cloned() else {
        return Err(ExecutionError::function_error(
            ftx.name,
            format!("{}(list) called on empty list", ftx.name),
        ));
    };
    for v in l.iter().skip(1) {
        if compare(ftx, v, &best)? == want {
            best = v.clone();
        }
    }
    Ok(best)
}

fn min(ftx: &FunctionContext) -> R {
    extreme(ftx, Ordering::Less)
}

fn max(ftx: &FunctionContext) -> R {
    extreme(ftx, Ordering::Greater)
}

fn list_position<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
    last: bool,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [list, item] = args.as_slice() else {
        return Err(ExecutionError::invalid_argument_count(2, args.len()));
    };
    let Value::List(l) = to_value(list)? else {
        return Err(ExecutionError::no_such_member_overload(
            "indexOf",
            vec!["dyn".into(), "dyn".into()],
        ));
    };
    let item = to_value(item)?;
    let found = if last {
        l.iter().rposition(|v| *v == item)
    } else {
        l.iter().position(|v| *v == item)
    };
    let n = found.map(|i| i as i64).unwrap_or(-1);
    Ok(CowVal::owned(cel::common::types::CelInt::from(n)))
}

fn list_index_of<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    list_position(args, false)
}

fn list_last_index_of<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    list_position(args, true)
}

// ---- regex ----

fn regex_args(
    ftx: &FunctionContext,
) -> Result<(Arc<String>, regex::Regex, Vec<Value>), ExecutionError> {
    let s = this(ftx)?;
    let a = args(ftx)?;
    match (&s, a.first()) {
        (Value::String(s), Some(Value::String(p))) => {
            let re = regex::Regex::new(p)
                .map_err(|e| ExecutionError::function_error(ftx.name, e.to_string()))?;
            Ok((s.clone(), re, a[1..].to_vec()))
        }
        _ => Err(overload(ftx, Some(&s), &a)),
    }
}

fn find(ftx: &FunctionContext) -> R {
    let (s, re, _) = regex_args(ftx)?;
    Ok(Value::from(
        re.find(&s).map(|m| m.as_str()).unwrap_or("").to_string(),
    ))
}

fn find_all(ftx: &FunctionContext) -> R {
    let (s, re, rest) = regex_args(ftx)?;
    let limit = match rest.first() {
        Some(Value::Int(n)) if *n >= 0 => Some(*n as usize),
        Some(Value::Int(_)) | None => None,
        Some(other) => return Err(overload(ftx, None, std::slice::from_ref(other))),
    };
    let found = re
        .find_iter(&s)
        .map(|m| Value::from(m.as_str().to_string()));
    let list: Vec<Value> = match limit {
        Some(0) => Vec::new(),
        Some(n) => found.take(n).collect(),
        None => found.collect(),
    };
    Ok(Value::List(Arc::new(list)))
}

// ---- URLs ----

/// A URL as Go's `url.ParseRequestURI` reads it: an absolute URI or an absolute path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    scheme: String,
    host: String,
    path: String,
    query: Option<String>,
}

impl Opaque for Url {
    fn runtime_type_name(&self) -> &str {
        "net.URL"
    }
}

fn parse_url(s: &str) -> Option<Url> {
    if s.is_empty() || s.chars().any(|c| c.is_control() || c == ' ') {
        return None;
    }
    let (rest, query) = match s.split_once('?') {
        Some((r, q)) => (r, Some(q.to_string())),
        None => (s, None),
    };
    if rest.starts_with('/') {
        return Some(Url {
            scheme: String::new(),
            host: String::new(),
            path: rest.to_string(),
            query,
        });
    }
    let colon = rest.find(':')?;
    let scheme = &rest[..colon];
    let mut chars = scheme.chars();
    if !chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        || !chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    {
        return None;
    }
    let after = &rest[colon + 1..];
    let (host, path) = if let Some(a) = after.strip_prefix("//") {
        match a.find('/') {
            Some(i) => (a[..i].to_string(), a[i..].to_string()),
            None => (a.to_string(), String::new()),
        }
    } else if after.starts_with('/') {
        (String::new(), after.to_string())
    } else {
        // an opaque URI (`mailto:x`): ParseRequestURI refuses it
        return None;
    };
    let host = host
        .rsplit_once('@')
        .map(|(_, h)| h.to_string())
        .unwrap_or(host);
    Some(Url {
        scheme: scheme.to_string(),
        host,
        path,
        query,
    })
}

fn url_this(ftx: &FunctionContext) -> Result<Url, ExecutionError> {
    let t = this(ftx)?;
    opaque::<Url>(&t)
        .cloned()
        .ok_or_else(|| overload(ftx, Some(&t), &[]))
}

fn url(ftx: &FunctionContext) -> R {
    let s = string_arg(ftx)?;
    parse_url(&s)
        .map(|u| Value::Opaque(Arc::new(u)))
        .ok_or_else(|| ExecutionError::function_error("url", format!("URL parse error during conversion from string: parse \"{s}\": invalid URI for request")))
}

fn is_url(ftx: &FunctionContext) -> R {
    Ok(Value::Bool(parse_url(&string_arg(ftx)?).is_some()))
}

fn get_scheme(ftx: &FunctionContext) -> R {
    Ok(Value::from(url_this(ftx)?.scheme))
}

fn get_host(ftx: &FunctionContext) -> R {
    Ok(Value::from(url_this(ftx)?.host))
}

fn split_host(host: &str) -> (String, String) {
    if let Some(rest) = host.strip_prefix('[')
        && let Some((h, p)) = rest.split_once(']')
    {
        return (h.to_string(), p.strip_prefix(':').unwrap_or("").to_string());
    }
    match host.rsplit_once(':') {
        Some((h, p)) => (h.to_string(), p.to_string()),
        None => (host.to_string(), String::new()),
    }
}

fn get_hostname(ftx: &FunctionContext) -> R {
    Ok(Value::from(split_host(&url_this(ftx)?.host).0))
}

fn get_port(ftx: &FunctionContext) -> R {
    Ok(Value::from(split_host(&url_this(ftx)?.host).1))
}

fn get_escaped_path(ftx: &FunctionContext) -> R {
    Ok(Value::from(url_this(ftx)?.path))
}

fn unescape(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn get_query(ftx: &FunctionContext) -> R {
    let u = url_this(ftx)?;
    let mut m: HashMap<Key, Vec<Value>> = HashMap::new();
    for pair in u
        .query
        .as_deref()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        m.entry(Key::String(Arc::new(unescape(k))))
            .or_default()
            .push(Value::from(unescape(v)));
    }
    let map: HashMap<Key, Value> = m
        .into_iter()
        .map(|(k, v)| (k, Value::List(Arc::new(v))))
        .collect();
    Ok(Value::Map(Map { map: Arc::new(map) }))
}

// ---- IPs and CIDRs ----

/// An IP address as Kubernetes' `ip()` accepts it: no zone, no IPv4-mapped IPv6 form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ip(IpAddr);

impl Opaque for Ip {
    fn runtime_type_name(&self) -> &str {
        "net.IP"
    }
}

/// A CIDR: the address as written and the prefix length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Opaque for Cidr {
    fn runtime_type_name(&self) -> &str {
        "net.CIDR"
    }
}

fn parse_ip(s: &str) -> Option<IpAddr> {
    if s.contains('%') {
        return None;
    }
    let ip: IpAddr = s.parse().ok()?;
    if let IpAddr::V6(v6) = ip
        && v6.to_ipv4_mapped().is_some()
    {
        return None;
    }
    Some(ip)
}

fn parse_cidr(s: &str) -> Option<Cidr> {
    let (a, p) = s.split_once('/')?;
    let addr = parse_ip(a)?;
    if p.is_empty()
        || p.len() > 3
        || !p.chars().all(|c| c.is_ascii_digit())
        || (p.len() > 1 && p.starts_with('0'))
    {
        return None;
    }
    let prefix: u8 = p.parse().ok()?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    (prefix <= max).then_some(Cidr { addr, prefix })
}

fn mask(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let bits = u32::from(a);
            let m = if prefix == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(prefix))
            };
            IpAddr::V4((bits & m).into())
        }
        IpAddr::V6(a) => {
            let bits = u128::from(a);
            let m = if prefix == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(prefix))
            };
            IpAddr::V6((bits & m).into())
        }
    }
}

fn contains(c: &Cidr, ip: IpAddr) -> bool {
    c.addr.is_ipv4() == ip.is_ipv4() && mask(ip, c.prefix) == mask(c.addr, c.prefix)
}

fn ip(ftx: &FunctionContext) -> R {
    // `cidr.ip()`: the CIDR's address
    if ftx.this.is_some() {
        let t = this(ftx)?;
        return match opaque::<Cidr>(&t) {
            Some(c) => Ok(Value::Opaque(Arc::new(Ip(c.addr)))),
            None => Err(overload(ftx, Some(&t), &[])),
        };
    }
    let s = string_arg(ftx)?;
    parse_ip(&s)
        .map(|a| Value::Opaque(Arc::new(Ip(a))))
        .ok_or_else(|| ExecutionError::function_error("ip", format!("IP Address \"{s}\" parse error during conversion from string: ParseAddr(\"{s}\"): unable to parse IP")))
}

fn is_ip(ftx: &FunctionContext) -> R {
    Ok(Value::Bool(parse_ip(&string_arg(ftx)?).is_some()))
}

fn ip_is_canonical(ftx: &FunctionContext) -> R {
    let s = string_arg(ftx)?;
    let ip = parse_ip(&s).ok_or_else(|| {
        ExecutionError::function_error(
            "ip.isCanonical",
            format!("IP Address \"{s}\" parse error during conversion from string"),
        )
    })?;
    Ok(Value::Bool(ip.to_string() == *s))
}

fn ip_this(ftx: &FunctionContext) -> Result<IpAddr, ExecutionError> {
    let t = this(ftx)?;
    opaque::<Ip>(&t)
        .map(|i| i.0)
        .ok_or_else(|| overload(ftx, Some(&t), &[]))
}

fn family(ftx: &FunctionContext) -> R {
    Ok(Value::Int(if ip_this(ftx)?.is_ipv4() { 4 } else { 6 }))
}

fn is_unspecified(ftx: &FunctionContext) -> R {
    Ok(Value::Bool(ip_this(ftx)?.is_unspecified()))
}

fn is_loopback(ftx: &FunctionContext) -> R {
    Ok(Value::Bool(ip_this(ftx)?.is_loopback()))
}

fn is_link_local_multicast(ftx: &FunctionContext) -> R {
    Ok(Value::Bool(match ip_this(ftx)? {
        IpAddr::V4(a) => a.octets()[..3] == [224, 0, 0],
        IpAddr::V6(a) => a.segments()[0] & 0xff0f == 0xff02,
    }))
}

fn is_link_local_unicast(ftx: &FunctionContext) -> R {
    Ok(Value::Bool(match ip_this(ftx)? {
        IpAddr::V4(a) => a.is_link_local(),
        IpAddr::V6(a) => a.segments()[0] & 0xffc0 == 0xfe80,
    }))
}

fn is_global_unicast(ftx: &FunctionContext) -> R {
    let ip = ip_this(ftx)?;
    let link_local = match ip {
        IpAddr::V4(a) => a.is_link_local(),
        IpAddr::V6(a) => a.segments()[0] & 0xffc0 == 0xfe80,
    };
    let broadcast = matches!(ip, IpAddr::V4(a) if a.is_broadcast());
    Ok(Value::Bool(
        !ip.is_unspecified()
            && !ip.is_loopback()
            && !ip.is_multicast()
            && !link_local
            && !broadcast,
    ))
}

fn cidr(ftx: &FunctionContext) -> R {
    let s = string_arg(ftx)?;
    parse_cidr(&s)
        .map(|c| Value::Opaque(Arc::new(c)))
        .ok_or_else(|| ExecutionError::function_error("cidr", format!("network address parse error during conversion from string: network address parse error during conversion from string: netip.ParsePrefix(\"{s}\"): bad prefix")))
}

fn is_cidr(ftx: &FunctionContext) -> R {
    Ok(Value::Bool(parse_cidr(&string_arg(ftx)?).is_some()))
}

fn cidr_this(ftx: &FunctionContext) -> Result<Cidr, ExecutionError> {
    let t = this(ftx)?;
    opaque::<Cidr>(&t)
        .cloned()
        .ok_or_else(|| overload(ftx, Some(&t), &[]))
}

fn contains_ip(ftx: &FunctionContext) -> R {
    let c = cidr_this(ftx)?;
    let a = args(ftx)?;
    let ip = match a.first() {
        Some(Value::String(s)) => parse_ip(s).ok_or_else(|| {
            ExecutionError::function_error("containsIP", format!("IP Address \"{s}\" parse error"))
        })?,
        Some(v) => match opaque::<Ip>(v) {
            Some(i) => i.0,
            None => return Err(overload(ftx, None, &a)),
        },
        None => return Err(ExecutionError::invalid_argument_count(1, 0)),
    };
    Ok(Value::Bool(contains(&c, ip)))
}

fn contains_cidr(ftx: &FunctionContext) -> R {
    let c = cidr_this(ftx)?;
    let a = args(ftx)?;
    let other = match a.first() {
        Some(Value::String(s)) => parse_cidr(s).ok_or_else(|| {
            ExecutionError::function_error(
                "containsCIDR",
                format!("network address \"{s}\" parse error"),
            )
        })?,
        Some(v) => match opaque::<Cidr>(v) {
            Some(o) => o.clone(),
            None => return Err(overload(ftx, None, &a)),
        },
        None => return Err(ExecutionError::invalid_argument_count(1, 0)),
    };
    Ok(Value::Bool(
        other.prefix >= c.prefix && contains(&c, other.addr),
    ))
}

fn masked(ftx: &FunctionContext) -> R {
    let c = cidr_this(ftx)?;
    Ok(Value::Opaque(Arc::new(Cidr {
        addr: mask(c.addr, c.prefix),
        prefix: c.prefix,
    })))
}

fn prefix_length(ftx: &FunctionContext) -> R {
    Ok(Value::Int(i64::from(cidr_this(ftx)?.prefix)))
}

// ---- quantities ----

/// A resource quantity as an exact decimal: `mantissa × 10^exp` (equal when the numbers are).
#[derive(Debug, Clone)]
pub struct Quantity {
    mantissa: i128,
    exp: i32,
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Quantity) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Quantity {}

impl Opaque for Quantity {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Quantity"
    }
}

/// Parses a quantity as `resource.ParseQuantity` does (sign, digits, optional fraction,
/// optional binary SI / decimal SI / decimal exponent suffix).
pub fn parse_quantity(s: &str) -> Option<Quantity> {
    let (neg, rest) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let num_end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (num, suffix) = rest.split_at(num_end);
    if num.is_empty() || num == "." || num.matches('.').count() > 1 {
        return None;
    }
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    let digits = format!("{int}{frac}");
    if digits.len() > 30 {
        return None;
    }
    let mut mantissa: i128 = digits.parse().ok()?;
    let mut exp = -(frac.len() as i32);
    let binary = |n: u32| 1024i128.checked_pow(n);
    match suffix {
        "" => {}
        "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" => {
            let n = match suffix {
                "Ki" => 1,
                "Mi" => 2,
                "Gi" => 3,
                "Ti" => 4,
                "Pi" => 5,
                _ => 6,
            };
            mantissa = mantissa.checked_mul(binary(n)?)?;
        }
        "n" => exp -= 9,
        "u" => exp -= 6,
        "m" => exp -= 3,
        "k" => exp += 3,
        "M" => exp += 6,
        "G" => exp += 9,
        "T" => exp += 12,
        "P" => exp += 15,
        "E" => exp += 18,
        _ => {
            let e = suffix
                .strip_prefix('e')
                .or_else(|| suffix.strip_prefix('E'))?;
            let v: i32 = e.parse().ok()?;
            if e.is_empty() || e.starts_with('+') || v.abs() > 300 {
                return None;
            }
            exp += v;
        }
    }
    if neg {
        mantissa = -mantissa;
    }
    Some(Quantity { mantissa, exp })
}

impl Quantity {
    fn cmp(&self, other: &Quantity) -> Ordering {
        // compare a×10^x with b×10^y by scaling the one with the larger exponent down
        let (a, b) = (self.mantissa, other.mantissa);
        if a.signum() != b.signum() {
            return a.signum().cmp(&b.signum());
        }
        let e = self.exp.min(other.exp);
        let scale = |m: i128, x: i32| -> Option<i128> {
            10i128
                .checked_pow(u32::try_from(x - e).ok()?)
                .and_then(|p| m.checked_mul(p))
        };
        match (scale(a, self.exp), scale(b, other.exp)) {
            (Some(x), Some(y)) => x.cmp(&y),
            _ => self
                .approx()
                .partial_cmp(&other.approx())
                .unwrap_or(Ordering::Equal),
        }
    }
    fn approx(&self) -> f64 {
        self.mantissa as f64 * 10f64.powi(self.exp)
    }
    fn integer(&self) -> Option<i64> {
        if self.exp >= 0 {
            let p = 10i128.checked_pow(self.exp as u32)?;
            i64::try_from(self.mantissa.checked_mul(p)?).ok()
        } else {
            let p = 10i128.checked_pow((-self.exp) as u32)?;
            (self.mantissa % p == 0)
                .then(|| i64::try_from(self.mantissa / p).ok())
                .flatten()
        }
    }
    fn add(&self, other: &Quantity, negate: bool) -> Option<Quantity> {
        let e = self.exp.min(other.exp);
        let scale = |m: i128, x: i32| -> Option<i128> {
            10i128
                .checked_pow(u32::try_from(x - e).ok()?)
                .and_then(|p| m.checked_mul(p))
        };
        let b = scale(other.mantissa, other.exp)?;
        let b = if negate { b.checked_neg()? } else { b };
        Some(Quantity {
            mantissa: scale(self.mantissa, self.exp)?.checked_add(b)?,
            exp: e,
        })
    }
}

fn quantity(ftx: &FunctionContext) -> R {
    let s = string_arg(ftx)?;
    parse_quantity(&s)
        .map(|q| Value::Opaque(Arc::new(q)))
        .ok_or_else(|| ExecutionError::function_error("quantity", "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"))
}

fn is_quantity(ftx: &FunctionContext) -> R {
    Ok(Value::Bool(parse_quantity(&string_arg(ftx)?).is_some()))
}

fn q_this(ftx: &FunctionContext) -> Result<Quantity, ExecutionError> {
    let t = this(ftx)?;
    opaque::<Quantity>(&t)
        .cloned()
        .ok_or_else(|| overload(ftx, Some(&t), &[]))
}

fn q_arg(ftx: &FunctionContext) -> Result<Quantity, ExecutionError> {
    let a = args(ftx)?;
    match a.first() {
        Some(Value::Int(i)) => Ok(Quantity {
            mantissa: i128::from(*i),
            exp: 0,
        }),
        Some(v) => opaque::<Quantity>(v)
            .cloned()
            .ok_or_else(|| overload(ftx, None, &a)),
        None => Err(ExecutionError::invalid_argument_count(1, 0)),
    }
}

fn q_is_integer(ftx: &FunctionContext) -> R {
    Ok(Value::Bool(q_this(ftx)?.integer().is_some()))
}

fn q_as_integer(ftx: &FunctionContext) -> R {
    q_this(ftx)?.integer().map(Value::Int).ok_or_else(|| {
        ExecutionError::function_error("asInteger", "cannot convert value to integer")
    })
}

fn q_as_float(ftx: &FunctionContext) -> R {
    Ok(Value::Float(q_this(ftx)?.approx()))
}

fn q_sign(ftx: &FunctionContext) -> R {
    Ok(Value::Int(q_this(ftx)?.mantissa.signum() as i64))
}

fn q_greater(ftx: &FunctionContext) -> R {
    Ok(Value::Bool(
        q_this(ftx)?.cmp(&q_arg(ftx)?) == Ordering::Greater,
    ))
}

fn q_less(ftx: &FunctionContext) -> R {
    Ok(Value::Bool(
        q_this(ftx)?.cmp(&q_arg(ftx)?) == Ordering::Less,
    ))
}

fn q_compare(ftx: &FunctionContext) -> R {
    Ok(Value::Int(match q_this(ftx)?.cmp(&q_arg(ftx)?) {
        Ordering::Less => -1,
        Ordering::Equal => 0,
        Ordering::Greater => 1,
    }))
}

fn q_add_sub(ftx: &FunctionContext, negate: bool) -> R {
    let q = q_this(ftx)?;
    q.add(&q_arg(ftx)?, negate)
        .map(|r| Value::Opaque(Arc::new(r)))
        .ok_or_else(|| ExecutionError::function_error(ftx.name, "quantity overflow"))
}

fn q_add(ftx: &FunctionContext) -> R {
    q_add_sub(ftx, false)
}

fn q_sub(ftx: &FunctionContext) -> R {
    q_add_sub(ftx, true)
}

// ---- formats ----

const FORMAT_NAMES: [&str; 12] = [
    "dns1123Label",
    "dns1123Subdomain",
    "dns1035Label",
    "qualifiedName",
    "dns1123LabelPrefix",
    "dns1123SubdomainPrefix",
    "dns1035LabelPrefix",
    "labelValue",
    "uri",
    "uuid",
    "byte",
    "date",
];

/// A named format of `format.named`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Format(&'static str);

impl Opaque for Format {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.NamedFormat"
    }
}

fn format_named<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let name = match args.first().map(to_value) {
        Some(Ok(Value::String(s))) => s,
        _ => {
            return Err(ExecutionError::no_such_overload(
                "format.named",
                vec!["dyn".into()],
            ));
        }
    };
    let v = match FORMAT_NAMES
        .iter()
        .find(|n| **n == name.as_str())
        .copied()
        .or((name.as_str() == "datetime").then_some("datetime"))
    {
        Some(n) => some(Value::Opaque(Arc::new(Format(n)))),
        None => none(),
    };
    to_cow(v)
}

fn to_cow<'b, 'v>(v: Value) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let boxed: Box<dyn cel::common::value::Val> = Box::try_from(v)?;
    Ok(CowVal::from(boxed))
}

fn dns_label(s: &str, max: usize, first_alpha: bool) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > max {
        errs.push(format!("must be no more than {max} characters"));
    }
    let re = if first_alpha {
        "^[a-z]([-a-z0-9]*[a-z0-9])?$"
    } else {
        "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
    };
    if !regex::Regex::new(re).is_ok_and(|r| r.is_match(s)) {
        errs.push(if first_alpha {
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character".to_string()
        } else {
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character".to_string()
        });
    }
    errs
}

fn check_format(name: &str, s: &str) -> Vec<String> {
    let re_ok = |re: &str| regex::Regex::new(re).is_ok_and(|r| r.is_match(s));
    match name {
        "dns1123Label" => dns_label(s, 63, false),
        "dns1035Label" => dns_label(s, 63, true),
        "dns1123LabelPrefix" => dns_label(s.trim_end_matches('-'), 63, false),
        "dns1035LabelPrefix" => dns_label(s.trim_end_matches('-'), 63, true),
        "dns1123Subdomain" | "dns1123SubdomainPrefix" => {
            let s = if name.ends_with("Prefix") {
                s.trim_end_matches('-')
            } else {
                s
            };
            let mut errs = Vec::new();
            if s.len() > 253 {
                errs.push("must be no more than 253 characters".to_string());
            }
            if !regex::Regex::new(
                r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
            )
            .is_ok_and(|r| r.is_match(s))
            {
                errs.push("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character".to_string());
            }
            errs
        }
        "qualifiedName" => {
            let (prefix, n) = s.rsplit_once('/').unwrap_or(("", s));
            let mut errs = Vec::new();
            if s.matches('/').count() > 1 || (s.contains('/') && prefix.is_empty()) {
                errs.push("a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')".to_string());
                return errs;
            }
            if !prefix.is_empty() {
                errs.extend(
                    check_format("dns1123Subdomain", prefix)
                        .into_iter()
                        .map(|e| format!("prefix part {e}")),
                );
            }
            if n.is_empty() {
                errs.push("name part must be non-empty".to_string());
            } else {
                if n.len() > 63 {
                    errs.push("name part must be no more than 63 characters".to_string());
                }
                if !regex::Regex::new("^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
                    .is_ok_and(|r| r.is_match(n))
                {
                    errs.push("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')".to_string());
                }
            }
            errs
        }
        "labelValue" => {
            let mut errs = Vec::new();
            if s.len() > 63 {
                errs.push("must be no more than 63 characters".to_string());
            }
            if !s.is_empty() && !re_ok("^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$") {
                errs.push("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')".to_string());
            }
            errs
        }
        "uri" => match parse_url(s) {
            Some(_) => Vec::new(),
            None => vec!["invalid URI".to_string()],
        },
        "uuid" => {
            if re_ok(
                "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
            ) {
                Vec::new()
            } else {
                vec!["does not match the UUID format".to_string()]
            }
        }
        "byte" => {
            if crate::validations::value::base64_decode(s).is_some() {
                Vec::new()
            } else {
                vec!["invalid base64".to_string()]
            }
        }
        "date" => {
            if crate::schema::format_ok("date", s) {
                Vec::new()
            } else {
                vec!["invalid date".to_string()]
            }
        }
        "datetime" => {
            if crate::schema::format_ok("date-time", s) {
                Vec::new()
            } else {
                vec!["invalid datetime".to_string()]
            }
        }
        _ => Vec::new(),
    }
}

fn format_validate(ftx: &FunctionContext) -> R {
    let t = this(ftx)?;
    let Some(Format(name)) = opaque::<Format>(&t) else {
        return Err(overload(ftx, Some(&t), &args(ftx)?));
    };
    let a = args(ftx)?;
    let Some(Value::String(s)) = a.first() else {
        return Err(overload(ftx, Some(&t), &a));
    };
    let errs = check_format(name, s);
    Ok(if errs.is_empty() {
        none()
    } else {
        some(Value::List(Arc::new(
            errs.into_iter().map(Value::from).collect(),
        )))
    })
}
