//! Services end to end with kubectl against `ferry up`: every Service type gets its addresses,
//! ports and status; bad or taken ClusterIPs / node ports are refused with 422 (kubectl shows
//! "is invalid"); selectorless Services with hand-written Endpoints are mirrored.

mod common;

use common::{Ferry, eventually, json, kubectls};

const SERVICES: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: cip}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 9376}]
---
apiVersion: v1
kind: Service
metadata: {name: np}
spec:
  type: NodePort
  selector: {app: web}
  ports:
  - {name: dns-tcp, port: 53, protocol: TCP}
  - {name: dns-udp, port: 53, protocol: UDP}
---
apiVersion: v1
kind: Service
metadata: {name: lb}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Local
  selector: {app: web}
  ports: [{port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: hl}
spec:
  clusterIP: None
  selector: {app: web}
  ports: [{port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: en}
spec:
  type: ExternalName
  externalName: my.database.example.com
---
apiVersion: v1
kind: Service
metadata: {name: ext}
spec:
  ports: [{name: http, port: 80, targetPort: 9376}]
---
apiVersion: v1
kind: Endpoints
metadata: {name: ext}
subsets:
- addresses: [{ip: 192.0.2.42}]
  ports: [{name: http, port: 9376}]
"#;

fn svc(f: &Ferry, bin: &str, name: &str) -> serde_json::Value {
    json(&f.k(bin, &["get", "svc", name, "-o", "json"]))
}

#[test]
fn every_service_type_with_kubectl() {
    for bin in kubectls() {
        let f = Ferry::start();
        let out = f.k_stdin(&bin, &["apply", "-f", "-"], SERVICES);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );

        // `ferry up` puts Services in a loopback range (this instance's own, in tests).
        let (range, _) = f.ranges();
        let base = range.split('/').next().unwrap_or_default().to_string();
        let prefix = base.trim_end_matches(".0.0").to_string();
        let k = svc(&f, &bin, "kubernetes");
        assert_eq!(k["spec"]["clusterIP"], format!("{prefix}.0.1"));

        let c = svc(&f, &bin, "cip");
        let ip = c["spec"]["clusterIP"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(ip.starts_with(&format!("{prefix}.")), "{c}");
        assert_eq!(c["spec"]["clusterIPs"], serde_json::json!([ip]));
        assert_eq!(c["spec"]["ipFamilies"], serde_json::json!(["IPv4"]));
        assert_eq!(c["spec"]["ipFamilyPolicy"], "SingleStack");

        let n = svc(&f, &bin, "np");
        let np = n["spec"]["ports"][0]["nodePort"].as_i64().unwrap_or(0);
        assert!((30000..=32767).contains(&np), "{n}");
        assert_eq!(n["spec"]["ports"][1]["nodePort"].as_i64(), Some(np));

        let l = svc(&f, &bin, "lb");
        assert!(l["spec"]["healthCheckNodePort"].as_i64().is_some(), "{l}");
        assert!(
            eventually(60, || {
                svc(&f, &bin, "lb")["status"]["loadBalancer"]["ingress"][0]["ip"]
                    .as_str()
                    .is_some_and(|ip| ip.starts_with("127.0.0."))
            }),
            "no load-balancer address: {}",
            f.log()
        );
        // kubectl's table shows the external IP.
        let table = f.k(&bin, &["get", "svc", "lb"]);
        assert!(table.contains("127.0.0.240"), "{table}");

        assert_eq!(svc(&f, &bin, "hl")["spec"]["clusterIP"], "None");
        assert!(svc(&f, &bin, "en")["spec"]["clusterIP"].is_null());

        // Mirrored EndpointSlice for the selectorless Service.
        assert!(eventually(60, || {
            let s = json(&f.k(
                &bin,
                &[
                    "get",
                    "endpointslices",
                    "-l",
                    "kubernetes.io/service-name=ext",
                    "-o",
                    "json",
                ],
            ));
            s["items"][0]["endpoints"][0]["addresses"][0] == "192.0.2.42"
        }));

        // Out of range and taken ClusterIP / nodePort: refused.
        let taken = format!("--clusterip={ip}");
        for args in [
            vec![
                "create",
                "service",
                "clusterip",
                "bad1",
                "--tcp=80",
                "--clusterip=10.200.0.1",
            ],
            vec![
                "create",
                "service",
                "clusterip",
                "bad2",
                "--tcp=80",
                taken.as_str(),
            ],
            vec![
                "create",
                "service",
                "nodeport",
                "bad3",
                "--tcp=80",
                "--node-port=40000",
            ],
        ] {
            let out = f.kubectl_with(&bin, &args, None);
            assert!(!out.status.success(), "{args:?} succeeded");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("is invalid"), "{args:?}: {err}");
        }
        let npf = format!("--node-port={np}");
        let out = f.kubectl_with(
            &bin,
            &["create", "service", "nodeport", "bad4", "--tcp=80", &npf],
            None,
        );
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("already allocated"));

        // Delete releases: the address can be chosen again.
        f.k(&bin, &["delete", "svc", "cip"]);
        f.k(
            &bin,
            &[
                "create",
                "service",
                "clusterip",
                "again",
                "--tcp=80",
                &taken,
            ],
        );
    }
}
