//! The impersonation stage, between authentication and authorization (upstream's
//! `WithImpersonation`): reads the `Impersonate-*` headers ([`ferry_auth::impersonation`]),
//! authorizes each target for the authenticated user with verb `impersonate`, and hands back the
//! user the request then acts as. The headers are removed from the request.

use ferry_auth::UserInfo;
use ferry_auth::impersonation;
use ferry_auth::rbac::Decision;

use crate::server::Server;

/// Why the request may not go on.
pub enum Refused {
    /// Headers that ask for groups, extras or a UID without a user: upstream's 500 text.
    Malformed(impersonation::WithoutUser),
    /// A target the user may not impersonate: its attributes and the authorizer's reason.
    Forbidden(Box<(ferry_auth::Attributes, Decision)>),
}

/// `Ok(None)` when the request impersonates nobody, `Ok(Some(user))` with the user it acts as.
pub fn impersonate<B>(
    server: &Server,
    requestor: &UserInfo,
    req: &mut http::Request<B>,
) -> Result<Option<UserInfo>, Refused> {
    let parsed = impersonation::parse(
        req.headers()
            .iter()
            .filter(|(n, _)| n.as_str().starts_with("impersonate-"))
            .filter_map(|(n, v)| v.to_str().ok().map(|v| (n.as_str(), v))),
    )
    .map_err(Refused::Malformed)?;
    let Some(parsed) = parsed else {
        return Ok(None);
    };
    for target in &parsed.targets {
        let attrs = target.attributes(requestor);
        let decision = server.auth.authorize(&server.api, &attrs);
        if !decision.allowed {
            return Err(Refused::Forbidden(Box::new((attrs, decision))));
        }
    }
    let names: Vec<http::HeaderName> = req
        .headers()
        .keys()
        .filter(|n| impersonation::is_header(n.as_str()))
        .cloned()
        .collect();
    for n in names {
        req.headers_mut().remove(n);
    }
    let user = impersonation::user(&parsed);
    tracing::debug!(
        "{} is impersonating {} (groups {:?})",
        requestor.name,
        user.name,
        user.groups
    );
    Ok(Some(user))
}

/// Upstream's `responsewriters.InternalError` text: `Internal Server Error: "<uri>": <err>`,
/// HTML-escaped, as `text/plain` with Go's `http.Error` headers.
pub fn internal_error(
    request_uri: &str,
    err: &dyn std::fmt::Display,
) -> http::Response<crate::server::Body> {
    use http_body_util::BodyExt;
    let text = format!(
        "Internal Server Error: {}: {err}",
        ferry_auth::message::go_quote(request_uri)
    )
    .replace('&', "&amp;")
    .replace('<', "&lt;")
    .replace('>', "&gt;");
    http::Response::builder()
        .status(500)
        .header(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .header("X-Content-Type-Options", "nosniff")
        .body(http_body_util::Full::new(bytes::Bytes::from(format!("{text}\n"))).boxed())
        .unwrap_or_else(|_| {
            http::Response::new(http_body_util::Full::new(bytes::Bytes::new()).boxed())
        })
}
