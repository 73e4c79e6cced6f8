//! The access log and the HTTP metrics: one line per request at `info`, and request counts and
//! latencies by route and status.
//!
//! Each request gets a request id — the caller's `X-Request-Id` when it is a short visible
//! ASCII value, else a new one — answered in `X-Request-Id` and carried by a `request` span, so
//! every log line the request causes names it. The line carries the method, the route (the
//! matched pattern, never the raw path: a path holds operation keys), the status, the latency
//! and, for an answer that is an outcome, the tenant, the operation key, the tool and the
//! label. **Never arguments, results or headers.**

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderName, HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
pub const HTTP_REQUESTS: &str = "idemgate_http_requests_total";
pub const HTTP_SECONDS: &str = "idemgate_http_request_duration_seconds";
pub const OPERATOR_ACTIONS: &str = "idemgate_operator_actions_total";

/// What an outcome answer tells the access log; put in the response's extensions by `wire`.
#[derive(Debug, Clone)]
pub struct Logged {
    pub operation_key: Option<String>,
    pub outcome: &'static str,
    pub code: Option<&'static str>,
}

/// A caller's request id is kept when it is 1–128 visible ASCII characters; otherwise the
/// gateway makes one.
fn request_id(request: &Request) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let given = request
        .headers()
        .get(&REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()));
    match given {
        Some(id) => id.to_string(),
        None => {
            // Unique within the process; the process start time keeps restarts apart.
            static START: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
            let start = *START.get_or_init(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_millis() as u64)
                    .unwrap_or(0)
            });
            format!("{start:x}-{:x}", NEXT.fetch_add(1, Ordering::Relaxed))
        }
    }
}

/// The middleware: span, timing, the access line and the metrics.
pub async fn layer(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let id = request_id(&request);
    let method = request.method().as_str().to_owned();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| {
            // Unmatched paths, and the MCP service nested at /mcp, share a bounded label.
            if request.uri().path().starts_with("/mcp") {
                "/mcp".to_owned()
            } else {
                "unmatched".to_owned()
            }
        });
    let tool = tool_of(&route, request.uri().path());
    let (request, body_read) = track_body(request);
    let span = tracing::info_span!(
        "request",
        request_id = %id,
        otel.name = %format_args!("{method} {route}"),
        otel.kind = "server",
    );
    adopt_parent(&span, request.headers());
    let mut response = next.run(request).instrument(span.clone()).await;
    let latency = started.elapsed();
    let status = response.status().as_u16();
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID, value);
    }
    if let Some(read) = body_read
        && !read.load(Ordering::Acquire)
    {
        // Refused before its body was read (unknown tool, bad token, too large): the rest of
        // the body is still on the connection, so the connection cannot carry another request.
        // Say so, rather than let the client find it closed under its next request.
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    let logged = response.extensions().get::<Logged>().cloned();
    let (tenant, key, outcome, code) = match &logged {
        Some(l) => (
            l.operation_key
                .as_deref()
                .and_then(|k| k.split(':').next())
                .map(str::to_owned),
            l.operation_key.clone(),
            Some(l.outcome),
            l.code,
        ),
        None => (None, None, None, None),
    };
    span.in_scope(|| {
        tracing::info!(
            target: "idemgate::access",
            method = %method,
            route = %route,
            status,
            latency_ms = latency.as_secs_f64() * 1000.0,
            tenant = tenant.as_deref(),
            operation_key = key.as_deref(),
            tool = tool.as_deref(),
            outcome,
            code,
            "request"
        );
    });
    metrics::counter!(
        HTTP_REQUESTS,
        "route" => route.clone(),
        "method" => method.clone(),
        "status" => status.to_string(),
    )
    .increment(1);
    if let Some(action) = operator_action(&route) {
        // Done when the answer is the action's outcome: any label but `rejected`, and for a
        // denial the refusal it records. A 409 `conflict` (the record moved) is refused.
        let done = match &logged {
            Some(l) if l.outcome != "rejected" => true,
            Some(l) => action == "deny" && l.code == Some("approval_denied"),
            None => false,
        };
        let result = if done { "done" } else { "refused" };
        metrics::counter!(OPERATOR_ACTIONS, "action" => action, "result" => result).increment(1);
    }
    metrics::histogram!(HTTP_SECONDS, "route" => route, "method" => method)
        .record(latency.as_secs_f64());
    response
}

/// A caller's W3C `traceparent` (and `tracestate`) becomes the parent of the request's span,
/// with the `otel` feature; without it, or without a valid header, the request starts a trace.
#[cfg(feature = "otel")]
fn adopt_parent(span: &tracing::Span, headers: &axum::http::HeaderMap) {
    use opentelemetry::propagation::Extractor;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    struct Headers<'a>(&'a axum::http::HeaderMap);
    impl Extractor for Headers<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.get(key).and_then(|v| v.to_str().ok())
        }
        fn keys(&self) -> Vec<&str> {
            self.0.keys().map(|k| k.as_str()).collect()
        }
    }

    if !headers.contains_key("traceparent") {
        return;
    }
    let parent = opentelemetry::global::get_text_map_propagator(|p| p.extract(&Headers(headers)));
    let _ = span.set_parent(parent);
}

#[cfg(not(feature = "otel"))]
fn adopt_parent(_span: &tracing::Span, _headers: &axum::http::HeaderMap) {}

/// Approvals, denials and reconciliations, by route.
fn operator_action(route: &str) -> Option<&'static str> {
    match route {
        "/v1/operations/{operation_key}/approve" => Some("approve"),
        "/v1/operations/{operation_key}/deny" => Some("deny"),
        "/v1/operations/{operation_key}/reconcile" => Some("reconcile"),
        _ => None,
    }
}

/// A request body that says when it has been read to its end; `None` for a request without
/// one.
fn track_body(request: Request) -> (Request, Option<Arc<AtomicBool>>) {
    use http_body::Body as _;
    if request.body().is_end_stream() {
        return (request, None);
    }
    let read = Arc::new(AtomicBool::new(false));
    let (parts, body) = request.into_parts();
    let tracked = Tracked {
        inner: body,
        read: read.clone(),
    };
    (
        Request::from_parts(parts, axum::body::Body::new(tracked)),
        Some(read),
    )
}

struct Tracked {
    inner: axum::body::Body,
    read: Arc<AtomicBool>,
}

impl http_body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let frame = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(frame, std::task::Poll::Ready(None)) || self.inner.is_end_stream() {
            self.read.store(true, Ordering::Release);
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The tool named by an invoke or tool route's path, when the route has one.
fn tool_of(route: &str, path: &str) -> Option<String> {
    if !route.starts_with("/v1/tools/{tool}") {
        return None;
    }
    let rest = path.strip_prefix("/v1/tools/")?;
    let name = rest.split('/').next()?;
    (!name.is_empty() && name.len() <= 128).then(|| name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tool_comes_from_tool_routes_only() {
        assert_eq!(
            tool_of("/v1/tools/{tool}/invoke", "/v1/tools/tickets.create/invoke").as_deref(),
            Some("tickets.create")
        );
        assert_eq!(
            tool_of("/v1/tools/{tool}", "/v1/tools/tickets.get").as_deref(),
            Some("tickets.get")
        );
        assert_eq!(tool_of("/v1/operations/{key}", "/v1/operations/a:b"), None);
    }

    #[test]
    fn a_callers_request_id_is_kept_only_when_it_is_plain() {
        let with = |v: &str| {
            let mut r = Request::new(axum::body::Body::empty());
            r.headers_mut()
                .insert(REQUEST_ID, HeaderValue::from_str(v).unwrap());
            request_id(&r)
        };
        assert_eq!(with("req-42"), "req-42");
        assert_ne!(with("has space"), "has space");
        let long = "x".repeat(129);
        assert_ne!(with(&long), long);
        let a = request_id(&Request::new(axum::body::Body::empty()));
        let b = request_id(&Request::new(axum::body::Body::empty()));
        assert_ne!(a, b);
    }
}
