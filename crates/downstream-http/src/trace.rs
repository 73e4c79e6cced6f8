//! The W3C trace context on outgoing requests: with the `otel` feature, every request this
//! crate sends (the effect, lookups, job polls, the authorization hook) carries the current
//! span's `traceparent` (and `tracestate`), so the downstream's and the hook's spans join the
//! delivery's trace. Without the feature, or with no trace being recorded, nothing is added.

#[cfg(feature = "otel")]
pub(crate) fn propagate(builder: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    use opentelemetry::propagation::Injector;
    use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    struct Headers(HeaderMap);
    impl Injector for Headers {
        fn set(&mut self, key: &str, value: String) {
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(key.as_bytes()),
                HeaderValue::from_str(&value),
            ) {
                self.0.insert(name, value);
            }
        }
    }

    let context = tracing::Span::current().context();
    let mut headers = Headers(HeaderMap::new());
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&context, &mut headers));
    if headers.0.is_empty() {
        builder
    } else {
        builder.headers(headers.0)
    }
}

#[cfg(not(feature = "otel"))]
pub(crate) fn propagate(builder: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    builder
}
