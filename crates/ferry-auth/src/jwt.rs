//! ServiceAccount tokens: JWTs signed by the API server with upstream's claims (`iss`, `sub`,
//! `aud`, `exp`, `iat`, `nbf`, `jti` and the private `kubernetes.io` claim naming the namespace,
//! the ServiceAccount and the object the token is bound to). ES256 (ECDSA P-256 with SHA-256),
//! one of the algorithms kube-apiserver's service-account keys support.

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ring::rand::SystemRandom;
use ring::signature::{
    ECDSA_P256_SHA256_FIXED, ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair,
    UnparsedPublicKey,
};
use serde::{Deserialize, Serialize};

use crate::user::{
    EXTRA_CREDENTIAL_ID, EXTRA_NODE_NAME, EXTRA_NODE_UID, EXTRA_POD_NAME, EXTRA_POD_UID, UserInfo,
    service_account_username,
};

/// kube-apiserver's default issuer and API audience.
pub const DEFAULT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// go-jose's default clock leeway, which upstream's validator uses.
pub const LEEWAY_SECONDS: i64 = 60;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("invalid key: {0}")]
    Key(String),
    #[error("signing failed")]
    Sign,
    #[error("malformed token")]
    Malformed,
    #[error("unsupported signing algorithm {0:?}")]
    Algorithm(String),
    #[error("invalid signature")]
    Signature,
    #[error("token issuer {0:?} is not accepted")]
    Issuer(String),
    #[error("service account token has expired")]
    Expired,
    #[error("service account token is not valid yet")]
    NotYetValid,
    #[error("token audiences {0:?} is invalid for the target audiences")]
    Audience(Vec<String>),
}

/// A name and UID (`kubernetes.io` claim references).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRef {
    pub name: String,
    pub uid: String,
}

/// The private `kubernetes.io` claim.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubernetesClaims {
    pub namespace: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<ObjectRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<ObjectRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<ObjectRef>,
    pub serviceaccount: ObjectRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warnafter: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
enum Audience {
    One(String),
    Many(Vec<String>),
}

fn audiences<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(match Audience::deserialize(d)? {
        Audience::One(s) => vec![s],
        Audience::Many(v) => v,
    })
}

/// A ServiceAccount token's claims.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    #[serde(deserialize_with = "audiences")]
    pub aud: Vec<String>,
    pub exp: i64,
    pub iat: i64,
    pub iss: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub jti: String,
    #[serde(rename = "kubernetes.io")]
    pub kubernetes: KubernetesClaims,
    pub nbf: i64,
    pub sub: String,
}

impl Claims {
    /// Claims for a token of ServiceAccount `namespace/name` valid from `now` for
    /// `expiration_seconds`.
    pub fn new(
        issuer: &str,
        audiences: Vec<String>,
        now: i64,
        expiration_seconds: i64,
        namespace: &str,
        service_account: ObjectRef,
    ) -> Claims {
        Claims {
            aud: audiences,
            exp: now + expiration_seconds,
            iat: now,
            iss: issuer.into(),
            jti: String::new(),
            nbf: now,
            sub: service_account_username(namespace, &service_account.name),
            kubernetes: KubernetesClaims {
                namespace: namespace.into(),
                serviceaccount: service_account,
                ..Default::default()
            },
        }
    }

    /// The user this token authenticates, with upstream's extra fields.
    pub fn user(&self) -> UserInfo {
        let k = &self.kubernetes;
        let mut u =
            UserInfo::service_account(&k.namespace, &k.serviceaccount.name, &k.serviceaccount.uid);
        if let Some(p) = &k.pod {
            u.extra.insert(EXTRA_POD_NAME.into(), vec![p.name.clone()]);
            u.extra.insert(EXTRA_POD_UID.into(), vec![p.uid.clone()]);
        }
        if let Some(n) = &k.node {
            u.extra.insert(EXTRA_NODE_NAME.into(), vec![n.name.clone()]);
            if !n.uid.is_empty() {
                u.extra.insert(EXTRA_NODE_UID.into(), vec![n.uid.clone()]);
            }
        }
        if !self.jti.is_empty() {
            u.extra.insert(
                EXTRA_CREDENTIAL_ID.into(),
                vec![format!("JTI={}", self.jti)],
            );
        }
        u
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Header {
    alg: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    kid: String,
}

/// The DER SubjectPublicKeyInfo prefix of an uncompressed P-256 public key.
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

fn key_id(public: &[u8]) -> String {
    let mut spki = P256_SPKI_PREFIX.to_vec();
    spki.extend_from_slice(public);
    URL_SAFE_NO_PAD.encode(ring::digest::digest(&ring::digest::SHA256, &spki))
}

fn pem_body(pem: &str, label: &str) -> Result<Vec<u8>, Error> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let start = pem
        .find(&begin)
        .ok_or_else(|| Error::Key(format!("no {label} block")))?;
    let rest = &pem[start + begin.len()..];
    let stop = rest
        .find(&end)
        .ok_or_else(|| Error::Key(format!("unterminated {label} block")))?;
    let b64: String = rest[..stop]
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    STANDARD.decode(b64).map_err(|e| Error::Key(e.to_string()))
}

/// The API server's token signing key.
pub struct Signer {
    key: EcdsaKeyPair,
    rng: SystemRandom,
    kid: String,
}

impl Signer {
    /// A new key, as a PKCS#8 `PRIVATE KEY` PEM block.
    pub fn generate_pem() -> Result<String, Error> {
        let rng = SystemRandom::new();
        let doc = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .map_err(|e| Error::Key(e.to_string()))?;
        let b64 = STANDARD.encode(doc.as_ref());
        let mut pem = String::from("-----BEGIN PRIVATE KEY-----\n");
        for chunk in b64.as_bytes().chunks(64) {
            pem.push_str(&String::from_utf8_lossy(chunk));
            pem.push('\n');
        }
        pem.push_str("-----END PRIVATE KEY-----\n");
        Ok(pem)
    }

    pub fn from_pem(pem: &str) -> Result<Signer, Error> {
        let der = pem_body(pem, "PRIVATE KEY")?;
        let rng = SystemRandom::new();
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &der, &rng)
            .map_err(|e| Error::Key(e.to_string()))?;
        let kid = key_id(key.public_key().as_ref());
        Ok(Signer { key, rng, kid })
    }

    pub fn key_id(&self) -> &str {
        &self.kid
    }

    /// A signed compact JWS of `claims`.
    pub fn sign(&self, claims: &Claims) -> Result<String, Error> {
        let header = Header {
            alg: "ES256".into(),
            kid: self.kid.clone(),
        };
        let h = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&header).map_err(|_| Error::Sign)?);
        let c = URL_SAFE_NO_PAD.encode(serde_json::to_vec(claims).map_err(|_| Error::Sign)?);
        let input = format!("{h}.{c}");
        let sig = self
            .key
            .sign(&self.rng, input.as_bytes())
            .map_err(|_| Error::Sign)?;
        Ok(format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref())))
    }

    pub fn verifier(&self) -> Verifier {
        Verifier {
            public: self.key.public_key().as_ref().to_vec(),
        }
    }

    /// The public key as a JWK (for `/openid/v1/jwks`).
    pub fn jwk(&self) -> serde_json::Value {
        let p = self.key.public_key().as_ref();
        // Uncompressed point: 0x04 || x (32) || y (32).
        let (x, y) = if p.len() == 65 {
            (&p[1..33], &p[33..65])
        } else {
            (&p[0..0], &p[0..0])
        };
        serde_json::json!({
            "use": "sig", "kty": "EC", "kid": self.kid, "crv": "P-256", "alg": "ES256",
            "x": URL_SAFE_NO_PAD.encode(x), "y": URL_SAFE_NO_PAD.encode(y),
        })
    }
}

/// Reads the issuer of a token without checking anything (to tell whether a bearer token is a
/// ServiceAccount JWT of this issuer at all).
pub fn peek_issuer(token: &str) -> Option<String> {
    let mut parts = token.split('.');
    let (_, claims, _) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let raw = URL_SAFE_NO_PAD.decode(claims).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&raw).ok()?;
    v.get("iss")?.as_str().map(String::from)
}

/// Checks tokens signed by one key.
#[derive(Debug, Clone)]
pub struct Verifier {
    public: Vec<u8>,
}

impl Verifier {
    /// Verifies signature, issuer, time window (with upstream's leeway) and that the token names
    /// at least one of `accepted` audiences; returns the claims. Whether the ServiceAccount and
    /// the bound object still exist is for the caller to check.
    pub fn verify(
        &self,
        token: &str,
        now: i64,
        issuer: &str,
        accepted: &[String],
    ) -> Result<Claims, Error> {
        let mut parts = token.split('.');
        let (Some(h), Some(c), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(Error::Malformed);
        };
        let header: Header = URL_SAFE_NO_PAD
            .decode(h)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or(Error::Malformed)?;
        if header.alg != "ES256" {
            return Err(Error::Algorithm(header.alg));
        }
        let sig = URL_SAFE_NO_PAD.decode(s).map_err(|_| Error::Malformed)?;
        let input_len = h.len() + 1 + c.len();
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, &self.public)
            .verify(&token.as_bytes()[..input_len], &sig)
            .map_err(|_| Error::Signature)?;
        let claims: Claims = URL_SAFE_NO_PAD
            .decode(c)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or(Error::Malformed)?;
        if claims.iss != issuer {
            return Err(Error::Issuer(claims.iss));
        }
        if now > claims.exp + LEEWAY_SECONDS {
            return Err(Error::Expired);
        }
        if now + LEEWAY_SECONDS < claims.nbf || now + LEEWAY_SECONDS < claims.iat {
            return Err(Error::NotYetValid);
        }
        if !claims.aud.iter().any(|a| accepted.contains(a)) {
            return Err(Error::Audience(claims.aud));
        }
        Ok(claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer() -> Signer {
        Signer::from_pem(&Signer::generate_pem().expect("key")).expect("load")
    }

    fn claims(now: i64) -> Claims {
        let mut c = Claims::new(
            DEFAULT_ISSUER,
            vec![DEFAULT_ISSUER.into()],
            now,
            3600,
            "team-a",
            ObjectRef {
                name: "reader".into(),
                uid: "sa-uid".into(),
            },
        );
        c.jti = "j-1".into();
        c.kubernetes.pod = Some(ObjectRef {
            name: "p".into(),
            uid: "pod-uid".into(),
        });
        c
    }

    #[test]
    fn round_trip_and_user() {
        let s = signer();
        let now = 1_700_000_000;
        let t = s.sign(&claims(now)).expect("sign");
        assert_eq!(peek_issuer(&t).as_deref(), Some(DEFAULT_ISSUER));
        let got = s
            .verifier()
            .verify(&t, now + 10, DEFAULT_ISSUER, &[DEFAULT_ISSUER.into()])
            .expect("valid");
        assert_eq!(got, claims(now));
        let u = got.user();
        assert_eq!(u.name, "system:serviceaccount:team-a:reader");
        assert_eq!(u.uid, "sa-uid");
        assert_eq!(u.extra[EXTRA_POD_NAME], ["p"]);
        assert_eq!(u.extra[EXTRA_CREDENTIAL_ID], ["JTI=j-1"]);
        // The wire form carries upstream's claim names.
        let raw = URL_SAFE_NO_PAD
            .decode(t.split('.').nth(1).expect("claims"))
            .expect("b64");
        let v: serde_json::Value = serde_json::from_slice(&raw).expect("json");
        assert_eq!(v["kubernetes.io"]["serviceaccount"]["name"], "reader");
        assert_eq!(v["sub"], "system:serviceaccount:team-a:reader");
        assert_eq!(v["aud"][0], DEFAULT_ISSUER);
    }

    #[test]
    fn refusals() {
        let s = signer();
        let v = s.verifier();
        let now = 1_700_000_000;
        let aud = [DEFAULT_ISSUER.to_string()];
        let t = s.sign(&claims(now)).expect("sign");
        assert_eq!(
            v.verify(&t, now + 3600 + LEEWAY_SECONDS + 1, DEFAULT_ISSUER, &aud),
            Err(Error::Expired)
        );
        assert!(
            v.verify(&t, now + 3600 + LEEWAY_SECONDS, DEFAULT_ISSUER, &aud)
                .is_ok()
        );
        assert_eq!(
            v.verify(&t, now - LEEWAY_SECONDS - 1, DEFAULT_ISSUER, &aud),
            Err(Error::NotYetValid)
        );
        assert!(matches!(
            v.verify(&t, now, DEFAULT_ISSUER, &["vault".into()]),
            Err(Error::Audience(_))
        ));
        assert!(matches!(
            v.verify(&t, now, "https://other", &aud),
            Err(Error::Issuer(_))
        ));
        // Another key's signature, a changed payload, alg none, garbage.
        let other = signer().sign(&claims(now)).expect("sign");
        assert_eq!(
            v.verify(&other, now, DEFAULT_ISSUER, &aud),
            Err(Error::Signature)
        );
        let mut parts: Vec<String> = t.split('.').map(String::from).collect();
        let mut c = claims(now);
        c.kubernetes.serviceaccount.name = "admin".into();
        parts[1] = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&c).expect("json"));
        assert_eq!(
            v.verify(&parts.join("."), now, DEFAULT_ISSUER, &aud),
            Err(Error::Signature)
        );
        parts[0] = URL_SAFE_NO_PAD.encode(br#"{"alg":"none"}"#);
        assert_eq!(
            v.verify(&parts.join("."), now, DEFAULT_ISSUER, &aud),
            Err(Error::Algorithm("none".into()))
        );
        for bad in ["", "a.b", "a.b.c.d", "!!.??.**"] {
            assert!(v.verify(bad, now, DEFAULT_ISSUER, &aud).is_err(), "{bad}");
        }
    }

    #[test]
    fn jwk_names_the_key() {
        let s = signer();
        let j = s.jwk();
        assert_eq!(j["kid"], s.key_id());
        assert_eq!(j["crv"], "P-256");
    }
}
