use super::*;
use serde_json::json;

#[test]
fn smoke() {
    let schema = json!({"type": "object", "properties": {"spec": {"type": "object",
        "x-kubernetes-validations": [{"rule": "self.a < self.b", "message": "a must be less than b"}],
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}});
    let v = Validator::new(&schema);
    assert!(
        v.validate(&json!({"spec": {"a": 1, "b": 2}}), None)
            .is_empty()
    );
    let errs = v.validate(&json!({"spec": {"a": 3, "b": 2}}), None);
    assert_eq!(errs.len(), 1, "{errs:?}");
}

/// The Gateway API release's CRDs (shared beside the checkout).
fn gateway_dir() -> std::path::PathBuf {
    let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    here.ancestors()
        .map(|a| a.join("shared/gateway-api"))
        .find(|p| p.is_dir())
        .expect("shared/gateway-api beside the checkout")
}

fn gateway_crds() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(gateway_dir())
        .expect("read dir")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    for f in files {
        let text = std::fs::read_to_string(&f).expect("read");
        let v: Value = serde_saphyr::from_str(&text).expect("yaml");
        out.push((f.display().to_string(), v));
    }
    out
}

#[test]
fn gateway_api_crds_compile_within_cost_limits() {
    let crds = gateway_crds();
    assert_eq!(crds.len(), 10);
    for (name, crd) in &crds {
        let errs = check_crd(crd, |_| true);
        assert!(errs.is_empty(), "{name}: {errs:#?}");
    }
}

fn version_schema<'a>(crd: &'a Value, version: &str) -> &'a Value {
    crd.pointer("/spec/versions")
        .and_then(Value::as_array)
        .and_then(|vs| vs.iter().find(|v| v["name"] == version))
        .and_then(|v| v.pointer("/schema/openAPIV3Schema"))
        .expect("version schema")
}

fn httproute(rule: Value) -> Value {
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "r", "namespace": "default"},
        "spec": {"parentRefs": [{"name": "gw"}], "rules": [rule]}})
}

#[test]
fn httproute_redirect_with_replace_prefix_needs_a_path_prefix_match() {
    let crds = gateway_crds();
    let (_, crd) = crds
        .iter()
        .find(|(n, _)| n.ends_with("httproutes.yaml"))
        .expect("httproutes");
    let schema = version_schema(crd, "v1");
    let v = Validator::new(schema);
    // as the API server does: defaults first
    let validate = |mut obj: Value| {
        crate::schema::default(schema, &mut obj);
        assert_eq!(crate::schema::validate(schema, &obj, ""), vec![]);
        v.validate(&obj, None)
    };
    let redirect = json!({"type": "RequestRedirect", "requestRedirect": {
        "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/new"}}});
    let ok = httproute(json!({
        "matches": [{"path": {"type": "PathPrefix", "value": "/old"}}],
        "filters": [redirect]}));
    assert_eq!(validate(ok), vec![]);
    let bad = httproute(json!({
        "matches": [{"path": {"type": "Exact", "value": "/old"}}],
        "filters": [redirect]}));
    let errs = validate(bad);
    assert_eq!(
        errs,
        vec![FieldError::invalid(
            "spec.rules[0]",
            "\"object\"".into(),
            "When using RequestRedirect filter with path.replacePrefixMatch, exactly one PathPrefix match must be specified"
        )]
    );
    // timeouts: durations compared
    let timeouts = |request: &str, backend: &str| {
        httproute(json!({"timeouts": {"request": request, "backendRequest": backend}}))
    };
    assert_eq!(validate(timeouts("10s", "5s")), vec![]);
    assert_eq!(validate(timeouts("0s", "5s")), vec![]);
    assert_eq!(
        validate(timeouts("1s", "2m")),
        vec![FieldError::invalid(
            "spec.rules[0].timeouts",
            "\"object\"".into(),
            "backendRequest timeout cannot be longer than request timeout"
        )]
    );
    // both a redirect and a rewrite: the rule on the filters list
    let both = httproute(json!({
        "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
        "filters": [{"type": "RequestRedirect", "requestRedirect": {"statusCode": 302}},
                    {"type": "URLRewrite", "urlRewrite": {"hostname": "x.example"}}]}));
    let errs = validate(both);
    assert_eq!(
        errs,
        vec![FieldError::invalid(
            "spec.rules[0].filters",
            "\"array\"".into(),
            "May specify either httpRouteFilterRequestRedirect or httpRouteFilterRequestRewrite, but not both"
        )]
    );
}

/// A schema whose `spec` (free-form) carries `rules`.
fn spec_schema(rules: Value) -> Value {
    json!({"type": "object", "properties": {"spec": {"type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
        "x-kubernetes-validations": rules}}})
}

fn run(rule: &str, spec: Value) -> Vec<FieldError> {
    let v = Validator::new(&spec_schema(json!([{"rule": rule}])));
    v.validate(&json!({"spec": spec}), None)
}

#[test]
fn library_functions() {
    let spec = json!({"a": 1, "s": "Hello", "list": [3, 1, 2], "names": ["a", "b", "a"]});
    let cases = [
        // lists
        "[1, 2, 3].isSorted()",
        "!self.list.isSorted()",
        "['a', 'b'].isSorted()",
        "self.list.sum() == 6",
        "[1.5, 2.5].sum() == 4.0",
        "[].sum() == 0",
        "self.list.min() == 1",
        "self.list.max() == 3",
        "self.names.indexOf('a') == 0",
        "self.names.lastIndexOf('a') == 2",
        "self.names.indexOf('z') == -1",
        // strings extension
        "'a,b'.split(',') == ['a', 'b']",
        "self.s.lowerAscii() == 'hello'",
        "self.s.upperAscii() == 'HELLO'",
        "'aXa'.replace('a', 'b') == 'bXb'",
        "'  x '.trim() == 'x'",
        "self.s.substring(1, 3) == 'el'",
        "['a', 'b'].join('-') == 'a-b'",
        "self.s.indexOf('l') == 2",
        "self.s.lastIndexOf('l') == 3",
        "self.s.charAt(1) == 'e'",
        "self.s.startsWith('He') && self.s.endsWith('lo') && self.s.contains('ell')",
        // regex (RE2 syntax)
        "'abc123'.matches('^[a-z]+[0-9]+$')",
        "!'abc'.matches('^[0-9]+$')",
        "'abc123'.find('[0-9]+') == '123'",
        "'a1b22c3'.findAll('[0-9]+') == ['1', '22', '3']",
        "'a1b22c3'.findAll('[0-9]+', 2) == ['1', '22']",
        // URLs
        "isURL('https://example.com:80/p?q=1')",
        "!isURL('example')",
        "url('https://example.com:8080/a/b?x=1&x=2').getScheme() == 'https'",
        "url('https://example.com:8080/a/b?x=1&x=2').getHost() == 'example.com:8080'",
        "url('https://example.com:8080/a/b?x=1&x=2').getHostname() == 'example.com'",
        "url('https://example.com:8080/a/b?x=1&x=2').getPort() == '8080'",
        "url('https://example.com:8080/a/b?x=1&x=2').getEscapedPath() == '/a/b'",
        "url('https://example.com:8080/a/b?x=1&x=2').getQuery()['x'] == ['1', '2']",
        "url('https://[::1]:80/').getHostname() == '::1'",
        "url('/relative/path').getEscapedPath() == '/relative/path'",
        // IPs
        "isIP('10.0.0.1') && isIP('2001:db8::1')",
        "!isIP('10.0.0.01') && !isIP('::ffff:1.2.3.4') && !isIP('fe80::1%eth0')",
        "ip('10.0.0.1').family() == 4 && ip('::1').family() == 6",
        "ip('::1').isLoopback() && ip('127.0.0.1').isLoopback()",
        "ip('0.0.0.0').isUnspecified()",
        "ip('fe80::1').isLinkLocalUnicast() && ip('169.254.1.1').isLinkLocalUnicast()",
        "ip('ff02::1').isLinkLocalMulticast() && ip('224.0.0.1').isLinkLocalMulticast()",
        "ip('8.8.8.8').isGlobalUnicast() && !ip('127.0.0.1').isGlobalUnicast()",
        "ip.isCanonical('2001:db8::1') && !ip.isCanonical('2001:DB8::1')",
        "ip('1.2.3.4') == ip('1.2.3.4') && ip('1.2.3.4') != ip('1.2.3.5')",
        // CIDRs
        "isCIDR('10.0.0.0/8') && !isCIDR('10.0.0.0/33') && !isCIDR('10.0.0.0')",
        "cidr('10.0.0.0/8').containsIP('10.1.2.3')",
        "cidr('10.0.0.0/8').containsIP(ip('10.1.2.3'))",
        "!cidr('10.0.0.0/8').containsIP('11.0.0.1')",
        "cidr('10.0.0.0/8').containsCIDR('10.1.0.0/16')",
        "!cidr('10.1.0.0/16').containsCIDR('10.0.0.0/8')",
        "cidr('10.1.2.3/8').masked() == cidr('10.0.0.0/8')",
        "cidr('10.0.0.0/8').prefixLength() == 8",
        "cidr('10.1.2.3/8').ip() == ip('10.1.2.3')",
        // quantities
        "isQuantity('1Gi') && isQuantity('500m') && !isQuantity('1GB')",
        "quantity('1Gi').isGreaterThan(quantity('1G'))",
        "quantity('500m').isLessThan(quantity('1'))",
        "quantity('1k').compareTo(quantity('1000')) == 0",
        "quantity('2Ki').asInteger() == 2048",
        "!quantity('1.5').isInteger() && quantity('2').isInteger()",
        "quantity('1.5').asApproximateFloat() == 1.5",
        "quantity('-1').sign() == -1",
        "quantity('1').add(quantity('500m')) == quantity('1500m')",
        "quantity('1').sub(1).sign() == 0",
        // formats
        "!format.named('dns1123Label').value().validate('abc').hasValue()",
        "format.named('dns1123Label').value().validate('ABC').hasValue()",
        "!format.named('no-such-format').hasValue()",
        "format.named('qualifiedName').value().validate('example.com/Name') == optional.none()",
        // macros
        "self.list.all(x, x > 0)",
        "self.list.exists(x, x == 2)",
        "self.list.exists_one(x, x > 2)",
        "self.list.map(x, x * 2) == [6, 2, 4]",
        "self.list.filter(x, x > 1) == [3, 2]",
        "has(self.a) && !has(self.zzz)",
        "self.?zzz.orValue(5) == 5",
    ];
    for rule in cases {
        let errs = run(rule, spec.clone());
        assert!(errs.is_empty(), "{rule}: {errs:?}");
    }
    // and a false rule fails with the default message
    assert_eq!(
        run("self.a == 2", spec.clone()),
        vec![FieldError::invalid(
            "spec",
            "\"object\"".into(),
            "failed rule: self.a == 2"
        )]
    );
}

#[test]
fn runtime_errors_as_upstream_prints_them() {
    assert_eq!(
        run("self.missing == 1", json!({})),
        vec![FieldError::invalid(
            "spec",
            "\"object\"".into(),
            "no such key: missing evaluating rule: self.missing == 1"
        )]
    );
    assert_eq!(
        run("self.a + 'x' == 'y'", json!({"a": 1})),
        vec![FieldError::invalid(
            "spec",
            "\"object\"".into(),
            "'no such overload': call arguments did not match a supported operator, function or macro signature for rule: self.a + 'x' == 'y'"
        )]
    );
}

fn schema_with(rule: Value, props: Value) -> Value {
    json!({"type": "object", "properties": {"spec": {"type": "object",
        "x-kubernetes-validations": [rule], "properties": props}}})
}

#[test]
fn message_expression_reason_and_field_path() {
    let props = json!({"replicas": {"type": "integer"}, "max": {"type": "integer"}});
    let obj = json!({"spec": {"replicas": 5, "max": 3}});
    let v = |rule: Value| Validator::new(&schema_with(rule, props.clone())).validate(&obj, None);
    assert_eq!(
        v(json!({"rule": "self.replicas <= self.max",
            "messageExpression": "'replicas ' + string(self.replicas) + ' above ' + string(self.max)"})),
        vec![FieldError::invalid(
            "spec",
            "\"object\"".into(),
            "replicas 5 above 3"
        )]
    );
    // a messageExpression that fails, or is empty, falls back to message
    assert_eq!(
        v(
            json!({"rule": "self.replicas <= self.max", "message": "too many",
            "messageExpression": "self.nope"})
        ),
        vec![FieldError::invalid("spec", "\"object\"".into(), "too many")]
    );
    assert_eq!(
        v(json!({"rule": "self.replicas <= self.max", "messageExpression": "'  '"})),
        vec![FieldError::invalid(
            "spec",
            "\"object\"".into(),
            "failed rule: self.replicas <= self.max"
        )]
    );
    assert_eq!(
        v(
            json!({"rule": "self.replicas <= self.max", "message": "too many",
            "reason": "FieldValueForbidden", "fieldPath": ".replicas"})
        ),
        vec![FieldError::forbidden("spec.replicas", "too many")]
    );
    assert_eq!(
        v(
            json!({"rule": "self.replicas <= self.max", "message": "m", "reason": "FieldValueRequired"})
        ),
        vec![FieldError::required("spec", "m")]
    );
}

#[test]
fn transition_rules_and_correlation() {
    let schema = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "name": {"type": "string", "x-kubernetes-validations": [
            {"rule": "self == oldSelf", "message": "name is immutable"}]},
        "count": {"type": "integer", "x-kubernetes-validations": [
            {"rule": "!oldSelf.hasValue() || self >= oldSelf.value()", "message": "count may not go down",
             "optionalOldSelf": true},
            {"rule": "self < 100", "message": "count below 100"}]},
        "ports": {"type": "array", "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"], "items": {"type": "object",
            "properties": {"name": {"type": "string"}, "port": {"type": "integer",
                "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "port is immutable"}]}}}}}}}});
    let v = Validator::new(&schema);
    let obj = |name: &str, count: i64, ports: Value| json!({"spec": {"name": name, "count": count, "ports": ports}});
    // create: transition rules do not run, except optionalOldSelf ones (with no value)
    assert_eq!(
        v.validate(&obj("a", 1, json!([{"name": "http", "port": 80}])), None),
        vec![]
    );
    let old = obj(
        "a",
        5,
        json!([{"name": "http", "port": 80}, {"name": "dns", "port": 53}]),
    );
    // reordered map list: correlated by key, so unchanged ports pass
    let new = obj(
        "a",
        6,
        json!([{"name": "dns", "port": 53}, {"name": "http", "port": 80}]),
    );
    assert_eq!(v.validate(&new, Some(&old)), vec![]);
    let new = obj(
        "b",
        4,
        json!([{"name": "http", "port": 81}, {"name": "new", "port": 1}]),
    );
    assert_eq!(
        v.validate(&new, Some(&old)),
        vec![
            FieldError::invalid("spec.name", "\"string\"".into(), "name is immutable"),
            FieldError::invalid("spec.count", "\"integer\"".into(), "count may not go down"),
            FieldError::invalid(
                "spec.ports[0].port",
                "\"integer\"".into(),
                "port is immutable"
            ),
        ]
    );
    // ratcheting: an unchanged invalid value passes on update, not on create
    let high = obj("a", 150, json!([]));
    assert_eq!(v.validate(&high, None).len(), 1);
    assert_eq!(v.validate(&high, Some(&high)), vec![]);
}

#[test]
fn int_or_string_and_embedded_values() {
    let schema = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "port": {"x-kubernetes-int-or-string": true, "x-kubernetes-validations": [
            {"rule": "type(self) == int ? self > 0 : self.matches('^[a-z]+$')", "message": "bad port"}]},
        "template": {"type": "object", "x-kubernetes-embedded-resource": true,
            "x-kubernetes-preserve-unknown-fields": true,
            "x-kubernetes-validations": [{"rule": "self.kind == 'Pod' && self.spec.x == 1"}]}}}}});
    let v = Validator::new(&schema);
    let ok = json!({"spec": {"port": "http", "template": {"apiVersion": "v1", "kind": "Pod", "spec": {"x": 1}}}});
    assert_eq!(v.validate(&ok, None), vec![]);
    assert_eq!(v.validate(&json!({"spec": {"port": 8080}}), None), vec![]);
    assert_eq!(
        v.validate(&json!({"spec": {"port": "HTTP"}}), None),
        vec![FieldError::invalid("spec.port", "\"\"".into(), "bad port")]
    );
}

fn crd_with(rule: Value, props: Value) -> Value {
    json!({"spec": {"versions": [{"name": "v1", "schema": {"openAPIV3Schema":
        schema_with(rule, props)}}]}})
}

#[test]
fn compile_errors_when_the_crd_is_written() {
    let props = json!({"replicas": {"type": "integer"}});
    let errs = check_crd(
        &crd_with(json!({"rule": "self.replicas >"}), props.clone()),
        |_| true,
    );
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(
        errs[0].field,
        "spec.validation.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule"
    );
    assert!(
        errs[0]
            .value
            .as_deref()
            .unwrap_or("")
            .starts_with("apiextensions.ValidationRule{Rule:\"self.replicas >\""),
        "{errs:?}"
    );
    assert!(
        errs[0]
            .detail
            .starts_with("compilation failed: ERROR: <input>:1:"),
        "{errs:?}"
    );
    let errs = check_crd(
        &crd_with(json!({"rule": "self.replicas2 > 0"}), props.clone()),
        |_| true,
    );
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        errs[0]
            .detail
            .starts_with("compilation failed: ERROR: <input>:1:")
            && errs[0].detail.contains("undefined field 'replicas2'")
            && errs[0].detail.contains("\n | self.replicas2 > 0\n | "),
        "{errs:?}"
    );
    let errs = check_crd(
        &crd_with(
            json!({"rule": "self.replicas > 0", "reason": "Nope", "fieldPath": ".nope",
            "optionalOldSelf": true}),
            props.clone(),
        ),
        |_| true,
    );
    let fields: Vec<&str> = errs
        .iter()
        .map(|e| e.field.rsplit('.').next().unwrap_or(""))
        .collect();
    assert_eq!(
        fields,
        vec!["reason", "fieldPath", "optionalOldSelf"],
        "{errs:?}"
    );
    let errs = check_crd(
        &crd_with(
            json!({"rule": "self.replicas > 0", "messageExpression": "'a' +"}),
            props,
        ),
        |_| true,
    );
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        errs[0].field.ends_with("messageExpression")
            && errs[0]
                .detail
                .starts_with("messageExpression compilation failed: ")
    );
}

#[test]
fn cost_limits() {
    // unbounded nested lists with a regex per pair: refused when the CRD is written
    let props = json!({"items": {"type": "array", "items": {"type": "string"}}});
    let rule = json!({"rule": "self.items.all(a, self.items.all(b, a.matches(b)))"});
    let errs = check_crd(&crd_with(rule, props.clone()), |_| true);
    assert!(
        errs.iter().any(|e| e.kind == ErrorType::Forbidden
            && e.field.ends_with("x-kubernetes-validations[0].rule")
            && e.detail.starts_with("estimated rule cost exceeds budget by factor of more than 100x (try simplifying the rule")),
        "{errs:?}"
    );
    // bounded: accepted
    let bounded = json!({"items": {"type": "array", "maxItems": 10,
        "items": {"type": "string", "maxLength": 20}}});
    let rule = json!({"rule": "self.items.all(a, self.items.all(b, a.matches(b)))"});
    assert_eq!(
        check_crd(&crd_with(rule.clone(), bounded), |_| true),
        vec![]
    );
    // at runtime the actual sizes count: 2000 items squared is past the per-call limit
    let v = Validator::new(&schema_with(rule, props));
    let many: Vec<String> = (0..2000).map(|i| format!("item-{i}")).collect();
    let errs = v.validate(&json!({"spec": {"items": many}}), None);
    assert_eq!(
        errs,
        vec![FieldError::invalid(
            "spec",
            "\"object\"".into(),
            "'operation cancelled: actual cost limit exceeded': no further validation rules will be run due to call cost exceeds limit for rule: self.items.all(a, self.items.all(b, a.matches(b)))"
        )]
    );
    let few: Vec<String> = (0..3).map(|i| format!("x{i}")).collect();
    assert_eq!(
        v.validate(&json!({"spec": {"items": few}}), None).len(),
        1,
        "x0 does not match x1"
    );
}

#[test]
fn request_budget_spans_rules() {
    // 40 list items, each running a rule of ~360k: the 10M budget runs out part way
    let schema = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "items": {"type": "array", "items": {"type": "object",
            "x-kubernetes-preserve-unknown-fields": true,
            "x-kubernetes-validations": [{"rule": "self.xs.all(a, self.xs.all(b, a == b || a != b))"}]}}}}}});
    let v = Validator::new(&schema);
    let xs: Vec<i64> = (0..200).collect();
    let items: Vec<Value> = (0..40).map(|_| json!({"xs": xs})).collect();
    let errs = v.validate(&json!({"spec": {"items": items}}), None);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(
        errs[0].detail,
        "validation failed due to running out of cost budget, no further validation rules will be run"
    );
}

#[test]
fn gateway_listener_rules() {
    let crds = gateway_crds();
    let (_, crd) = crds
        .iter()
        .find(|(n, _)| n.ends_with("_gateways.yaml"))
        .expect("gateways");
    let schema = version_schema(crd, "v1");
    let v = Validator::new(schema);
    let validate = |mut obj: Value| {
        crate::schema::default(schema, &mut obj);
        assert_eq!(crate::schema::validate(schema, &obj, ""), vec![]);
        v.validate(&obj, None)
    };
    let gw = |listeners: Value| {
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "gw", "namespace": "default"},
            "spec": {"gatewayClassName": "example", "listeners": listeners}})
    };
    assert_eq!(
        validate(gw(
            json!([{"name": "http", "protocol": "HTTP", "port": 80}])
        )),
        vec![]
    );
    let errs = validate(gw(json!([
        {"name": "a", "protocol": "HTTP", "port": 80, "hostname": "x.example"},
        {"name": "b", "protocol": "HTTP", "port": 80, "hostname": "x.example"}])));
    assert_eq!(
        errs,
        vec![FieldError::invalid(
            "spec.listeners",
            "\"array\"".into(),
            "Combination of port, protocol and hostname must be unique for each listener"
        )]
    );
}

#[test]
fn validator_is_shareable() {
    // custom kinds keep their validator in a process-wide registry
    fn shareable<T: Send + Sync + 'static>() {}
    shareable::<Validator>();
}
