//! Traces over OTLP/HTTP (protobuf), with the `otel` feature (on by default).
//!
//! Exported only when the standard variables name an endpoint —
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT` — and
//! `OTEL_SDK_DISABLED` is not `true` nor `OTEL_TRACES_EXPORTER` `none`. The exporter reads the
//! rest of the standard variables itself (headers, timeout; `OTEL_BSP_*` for batching);
//! `OTEL_SERVICE_NAME` names the service, `idemgate` by default. The W3C trace-context
//! propagator is installed with it, so an incoming `traceparent` is honoured and an outgoing
//! one sent.

use tracing_subscriber::{Layer, Registry};

/// The exporter, kept to flush its last spans at exit.
pub struct Traces(opentelemetry_sdk::trace::SdkTracerProvider);

impl Traces {
    pub fn shutdown(self) {
        if let Err(e) = self.0.shutdown() {
            eprintln!("idemgate: traces: the last spans could not be exported: {e}");
        }
    }
}

fn configured() -> bool {
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
    let is = |name: &str, value: &str| {
        std::env::var(name).is_ok_and(|v| v.trim().eq_ignore_ascii_case(value))
    };
    (set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") || set("OTEL_EXPORTER_OTLP_ENDPOINT"))
        && !is("OTEL_SDK_DISABLED", "true")
        && !is("OTEL_TRACES_EXPORTER", "none")
}

/// The tracing layer that records spans for export, when export is configured.
pub fn layer() -> Option<(Box<dyn Layer<Registry> + Send + Sync>, Traces)> {
    use opentelemetry::trace::TracerProvider as _;
    if !configured() {
        return None;
    }
    // The exporter's HTTP client is the workspace's reqwest, whose TLS provider is chosen at
    // start.
    idemgate_downstream_http::install_crypto_provider();
    let exporter = match opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
    {
        Ok(exporter) => exporter,
        Err(e) => {
            eprintln!("idemgate: traces are not exported: {e}");
            return None;
        }
    };
    let mut resource = opentelemetry_sdk::Resource::builder();
    if std::env::var("OTEL_SERVICE_NAME").is_err() {
        resource = resource.with_service_name("idemgate");
    }
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    let tracer = provider.tracer("idemgate");
    let layer = tracing_opentelemetry::layer().with_tracer(tracer).boxed();
    Some((layer, Traces(provider)))
}
