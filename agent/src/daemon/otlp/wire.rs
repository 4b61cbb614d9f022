//! The outbox's items as the OpenTelemetry SDK's log records and spans, and the project's own
//! OTLP exporters (`opentelemetry-otlp`, gRPC or HTTP/protobuf) that send them.
//!
//! The exporters are called directly, one batch at a time, instead of through the SDK's batch
//! processors: those drop a batch the collector refused, and the store's cursor must move
//! only once a collector took the events (`mod.rs`).

use std::{borrow::Cow, collections::HashMap, time::Duration, time::SystemTime};

use anyhow::Context as _;
use opentelemetry::{
    InstrumentationScope, KeyValue,
    logs::{AnyValue, LogRecord as _, Logger as _, LoggerProvider as _, Severity},
    trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState},
};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _, WithTonicConfig as _};
use opentelemetry_sdk::{
    Resource,
    error::OTelSdkResult,
    logs::{LogBatch, LogExporter as _, SdkLogRecord, SdkLogger, SdkLoggerProvider},
    trace::{SpanData, SpanEvents, SpanExporter as _, SpanLinks},
};

use super::outbox::{self, LogItem, SpanItem};
use crate::{
    config::{OtlpConfig, OtlpProtocol},
    decision::Action,
    events::Event,
};

/// Both signals' exporters, and what every record carries.
pub(crate) struct Exporters {
    logs: opentelemetry_otlp::LogExporter,
    spans: opentelemetry_otlp::SpanExporter,
    scope: InstrumentationScope,
    /// Makes log records (the SDK makes them only through a logger; this one has no
    /// processors and sends nothing itself).
    logger: SdkLogger,
    _provider: SdkLoggerProvider,
}

impl std::fmt::Debug for Exporters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporters").finish_non_exhaustive()
    }
}

impl Exporters {
    /// Builds the exporters for `config`; `instance` names this store in the resource.
    pub(crate) fn new(config: &OtlpConfig, instance: &str) -> anyhow::Result<Self> {
        let timeout = Duration::from_secs(config.timeout_secs);
        let (mut logs, mut spans) = match config.protocol {
            OtlpProtocol::Grpc => grpc(config, timeout)?,
            OtlpProtocol::HttpProtobuf => http(config, timeout)?,
        };
        let resource = Resource::builder_empty()
            .with_service_name("toolwall")
            .with_attributes([
                KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
                KeyValue::new("service.instance.id", instance.to_owned()),
                KeyValue::new("host.name", host_name()),
            ])
            .build();
        logs.set_resource(&resource);
        spans.set_resource(&resource);
        let provider = SdkLoggerProvider::builder().build();
        Ok(Exporters {
            logs,
            spans,
            scope: InstrumentationScope::builder("toolwall")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
            logger: provider.logger("toolwall"),
            _provider: provider,
        })
    }

    /// Sends log records; `Ok` once the collector took them.
    pub(crate) async fn send_logs(&self, items: &[LogItem]) -> OTelSdkResult {
        let records: Vec<SdkLogRecord> = items.iter().map(|i| self.log_record(i)).collect();
        let pairs: Vec<(&SdkLogRecord, &InstrumentationScope)> =
            records.iter().map(|r| (r, &self.scope)).collect();
        self.logs.export(LogBatch::new(&pairs)).await
    }

    /// Sends spans; `Ok` once the collector took them.
    pub(crate) async fn send_spans(&self, items: &[SpanItem]) -> OTelSdkResult {
        let spans = items.iter().map(|i| self.span(i)).collect();
        self.spans.export(spans).await
    }

    fn log_record(&self, item: &LogItem) -> SdkLogRecord {
        let event = &item.event.event;
        let keys = event.keys();
        let mut record = self.logger.create_log_record();
        record.set_event_name(event.kind());
        record.set_timestamp(SystemTime::from(keys.timestamp));
        record.set_observed_timestamp(SystemTime::now());
        let (severity, text) = match keys.action {
            Action::Block => (Severity::Warn, "WARN"),
            Action::Allow => (Severity::Info, "INFO"),
        };
        record.set_severity_number(severity);
        record.set_severity_text(text);
        // The record as the store keeps it: every field, for a pipeline that wants them all —
        // but for arguments too large for one record (`body`).
        let (body, cut) = body(event);
        record.set_body(AnyValue::String(body.into()));
        if cut {
            record.add_attribute("toolwall.body.truncated", true);
        }
        record.add_attribute("toolwall.event.id", item.event.id);
        record.add_attribute("toolwall.event.type", event.kind());
        record.add_attribute("toolwall.decision", keys.action.as_str());
        record.add_attribute("toolwall.session.id", cap(keys.session));
        if !keys.server.is_empty() {
            record.add_attribute("toolwall.server.id", cap(keys.server));
        }
        if let Some(revision) = event.policy_revision() {
            match i64::try_from(revision) {
                Ok(n) => record.add_attribute("toolwall.policy.revision", n),
                Err(_) => record.add_attribute("toolwall.policy.revision", revision.to_string()),
            }
        }
        let (layer, reason) = layer_and_reason(event);
        if !layer.is_empty() {
            record.add_attribute("toolwall.layer", cap(&layer));
        }
        if !reason.is_empty() {
            record.add_attribute("toolwall.reason", cap(reason));
        }
        match event {
            Event::McpNetworkConnection(e) => {
                if let Some((host, port)) = split_addr(&e.remote_addr) {
                    record.add_attribute("server.address", cap(&host));
                    record.add_attribute("server.port", i64::from(port));
                }
            }
            Event::KernelAlert(e) => record.add_attribute("toolwall.alert", cap(&e.alert)),
            // The tool's own name on its server, as the other layers name it; the model's
            // name beside it.
            Event::McpToolCallIntercepted(e) if !e.server_tool.is_empty() => {
                record.add_attribute("gen_ai.tool.name", cap(&e.server_tool));
                record.add_attribute("toolwall.model_tool_name", cap(&e.tool_name));
            }
            _ => record.add_attribute("gen_ai.tool.name", cap(keys.tool)),
        }
        if let Some(ids) = item.span {
            record.set_trace_context(
                TraceId::from_bytes(ids.trace),
                SpanId::from_bytes(ids.span),
                Some(TraceFlags::SAMPLED),
            );
        }
        record
    }

    fn span(&self, item: &SpanItem) -> SpanData {
        let r = &item.record;
        let sightings: Vec<_> = [&r.intercept, &r.execution, &r.connection]
            .into_iter()
            .flatten()
            .collect();
        let start = sightings.iter().map(|s| s.at).min().unwrap_or_default();
        let end = sightings.iter().map(|s| s.at).max().unwrap_or(start);
        let mut attributes = vec![
            KeyValue::new("toolwall.session.id", cap(&r.session_id)),
            KeyValue::new("toolwall.server.id", cap(&r.server_id)),
            KeyValue::new("toolwall.layer", cap(&outbox::layers(r))),
            KeyValue::new("toolwall.decision", r.action.as_str()),
            KeyValue::new("toolwall.record.kind", record_kind(r.kind)),
        ];
        if !r.reason.is_empty() {
            attributes.push(KeyValue::new("toolwall.reason", cap(&r.reason)));
        }
        if let Some(revision) = item.policy_revision {
            attributes.push(KeyValue::new(
                "toolwall.policy.revision",
                revision_value(revision),
            ));
        }
        if let Some(hash) = &r.args_hash {
            attributes.push(KeyValue::new("toolwall.arguments.hash", cap(hash)));
        }
        match r.kind {
            crate::correlate::RecordKind::Joined
            | crate::correlate::RecordKind::InterceptOnly
            | crate::correlate::RecordKind::ExecutionOnly => {
                attributes.push(KeyValue::new("mcp.method.name", "tools/call"));
                attributes.push(KeyValue::new("gen_ai.operation.name", "execute_tool"));
                attributes.push(KeyValue::new("gen_ai.tool.name", cap(&r.tool)));
            }
            crate::correlate::RecordKind::ConnectionOnly | crate::correlate::RecordKind::Alert => {}
        }
        if let Some(id) = &item.jsonrpc_id {
            let id = match id {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            attributes.push(KeyValue::new("jsonrpc.request.id", cap(&id)));
        }
        if let Some(call) = item.tool_call_id.as_ref().filter(|c| !c.is_empty()) {
            attributes.push(KeyValue::new("gen_ai.tool.call.id", cap(call)));
        }
        if let Some((host, port)) = item.remote_addr.as_deref().and_then(split_addr) {
            attributes.push(KeyValue::new("server.address", cap(&host)));
            attributes.push(KeyValue::new("server.port", i64::from(port)));
        }
        let events = sightings
            .iter()
            .map(|s| {
                opentelemetry::trace::Event::new(
                    format!("toolwall.{}", cap(&s.layer)),
                    SystemTime::from(s.at),
                    vec![
                        KeyValue::new("toolwall.event.id", s.event_id),
                        KeyValue::new("toolwall.decision", s.action.as_str()),
                        KeyValue::new("toolwall.reason", cap(&s.reason)),
                    ],
                    0,
                )
            })
            .collect();
        let mut span_events = SpanEvents::default();
        span_events.events = events;
        SpanData {
            span_context: SpanContext::new(
                TraceId::from_bytes(item.ids.trace),
                SpanId::from_bytes(item.ids.span),
                TraceFlags::SAMPLED,
                false,
                TraceState::NONE,
            ),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: Cow::Owned(cap(&outbox::span_name(item))),
            start_time: SystemTime::from(start),
            end_time: SystemTime::from(end),
            attributes,
            dropped_attributes_count: 0,
            events: span_events,
            links: SpanLinks::default(),
            status: if outbox::blocked(r) {
                Status::error(cap(&r.reason))
            } else {
                Status::Unset
            },
            instrumentation_scope: self.scope.clone(),
        }
    }
}

/// Largest log record body: collectors refuse requests past a few MiB (the OpenTelemetry
/// Collector's gRPC default is 4 MiB), and one call with large arguments must not make a batch
/// no collector takes (the export would stop for good behind it).
pub(crate) const MAX_BODY_BYTES: usize = 64 * 1024;

/// The event's JSON for a log record, and whether it was cut: past [`MAX_BODY_BYTES`] its
/// arguments are replaced by their size and SHA-256 (the store keeps them whole), and if that
/// is not enough, the body keeps only the type, the time and the decision.
pub(crate) fn body(event: &Event) -> (String, bool) {
    let whole = serde_json::to_string(event).unwrap_or_default();
    if whole.len() <= MAX_BODY_BYTES {
        return (whole, false);
    }
    let mut value = serde_json::to_value(event).unwrap_or_default();
    if let Some(fields) = value.as_object_mut()
        && let Some(input) = fields.get("input").filter(|v| !v.is_null())
    {
        let text = serde_json::to_string(input).unwrap_or_default();
        let digest = <sha2::Sha256 as sha2::Digest>::digest(text.as_bytes());
        fields.insert(
            "input".into(),
            serde_json::json!({
                "toolwall_omitted": format!("arguments of {} bytes, over the export's {MAX_BODY_BYTES} (the store keeps them)", text.len()),
                "sha256": hex::encode(digest),
            }),
        );
        let cut = serde_json::to_string(&value).unwrap_or_default();
        if cut.len() <= MAX_BODY_BYTES {
            return (cut, true);
        }
    }
    let keys = event.keys();
    let short = serde_json::json!({
        "type": event.kind(),
        "timestamp": keys.timestamp,
        "action": keys.action.as_str(),
        "toolwall_omitted": format!("an event of {} bytes, over the export's {MAX_BODY_BYTES} (the store keeps it)", whole.len()),
    });
    (short.to_string(), true)
}

/// Longest attribute value (and span name) sent: names and reasons come from servers and
/// agents, and one record must stay far under what a collector takes (a 5 MiB tool name would
/// make a span no collector takes).
pub(crate) const MAX_ATTRIBUTE: usize = 4096;

/// `text` as an attribute value: whole, or cut at [`MAX_ATTRIBUTE`] bytes (on a character
/// boundary) and marked with how long it was.
fn cap(text: &str) -> String {
    if text.len() <= MAX_ATTRIBUTE {
        return text.to_owned();
    }
    let mut end = MAX_ATTRIBUTE;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &text[..end], text.len())
}

/// A log record's size in a request, about (its body, then the attributes that come from
/// names and reasons, each bounded).
pub(crate) fn log_size(item: &LogItem) -> usize {
    let event = &item.event.event;
    let keys = event.keys();
    let (layer, reason) = layer_and_reason(event);
    // The store's estimate of the event's size, not its serialization: the body is made once,
    // when the record is (a second pass cost a fifth of the export's throughput).
    1024 + event.weight().min(MAX_BODY_BYTES)
        + [keys.session, keys.server, keys.tool, reason, &layer]
            .iter()
            .map(|t| t.len().min(MAX_ATTRIBUTE))
            .sum::<usize>()
        // An intercepted call's name as the model wrote it, besides the tool's.
        + MAX_ATTRIBUTE
}

/// A span's size in a request, at most: what [`Exporters::span`] writes is bounded by it.
pub(crate) fn span_size(item: &SpanItem) -> usize {
    let r = &item.record;
    let text = [&r.session_id, &r.server_id, &r.tool, &r.reason]
        .iter()
        .map(|t| t.len().min(MAX_ATTRIBUTE))
        .sum::<usize>();
    // The name repeats the tool; each of three sightings carries the reason again.
    2048 + text
        + r.tool.len().min(MAX_ATTRIBUTE)
        + 3 * r.reason.len().min(MAX_ATTRIBUTE)
        + item.jsonrpc_id.as_ref().map_or(0, |_| MAX_ATTRIBUTE)
        + item
            .tool_call_id
            .as_ref()
            .map_or(0, |c| c.len().min(MAX_ATTRIBUTE))
}

/// OTLP integers are signed 64-bit; a revision past that is sent as text.
fn revision_value(revision: u64) -> opentelemetry::Value {
    match i64::try_from(revision) {
        Ok(n) => opentelemetry::Value::I64(n),
        Err(_) => opentelemetry::Value::String(revision.to_string().into()),
    }
}

fn record_kind(kind: crate::correlate::RecordKind) -> &'static str {
    use crate::correlate::RecordKind;
    match kind {
        RecordKind::Joined => "joined",
        RecordKind::InterceptOnly => "intercept_only",
        RecordKind::ExecutionOnly => "execution_only",
        RecordKind::ConnectionOnly => "connection_only",
        RecordKind::Alert => "alert",
    }
}

/// The layer that recorded an event, and its reason.
fn layer_and_reason(event: &Event) -> (String, &str) {
    match event {
        Event::McpToolCallIntercepted(e) => (format!("llm/{}", e.dialect), &e.reason),
        Event::McpToolCalled(e) => (e.layer.clone(), &e.reason),
        Event::McpResultInspected(e) => (e.layer.clone(), &e.reason),
        Event::McpToolSeen(e) => (String::new(), &e.reason),
        Event::McpNetworkConnection(_) => ("kernel".into(), ""),
        Event::KernelAlert(e) => ("kernel".into(), &e.detail),
        Event::LlmRoute(e) => ("llm".into(), &e.reason),
        Event::McpToolChanged(_) => (String::new(), ""),
        Event::UnreadableRow(e) => ("store".into(), &e.error),
    }
}

/// `ip:port` or `[ipv6]:port`.
fn split_addr(addr: &str) -> Option<(String, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    Some((host.trim_matches(['[', ']']).to_owned(), port.parse().ok()?))
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default()
}

type Pair = (
    opentelemetry_otlp::LogExporter,
    opentelemetry_otlp::SpanExporter,
);

fn grpc(config: &OtlpConfig, timeout: Duration) -> anyhow::Result<Pair> {
    use opentelemetry_otlp::tonic_types::{
        metadata::MetadataMap,
        transport::{Certificate, ClientTlsConfig},
    };
    let mut headers = http::HeaderMap::new();
    for (name, value) in &config.headers {
        let name = http::HeaderName::from_bytes(name.as_bytes())
            .with_context(|| format!("telemetry.otlp.headers: {name:?} is not a header name"))?;
        let value = http::HeaderValue::from_str(value)
            .with_context(|| format!("telemetry.otlp.headers.{name}: not a header value"))?;
        headers.insert(name, value);
    }
    let metadata = MetadataMap::from_headers(headers);
    let tls = if config.endpoint.starts_with("https://") {
        let tls = ClientTlsConfig::new();
        Some(match &config.tls {
            Some(tls_config) => {
                let pem = std::fs::read(&tls_config.ca_file).with_context(|| {
                    format!(
                        "telemetry.otlp.tls.ca_file: read {}",
                        tls_config.ca_file.display()
                    )
                })?;
                tls.ca_certificate(Certificate::from_pem(pem))
            }
            None => tls.with_native_roots(),
        })
    } else {
        None
    };
    let mut logs = opentelemetry_otlp::LogExporter::builder()
        .with_tonic()
        .with_endpoint(config.endpoint.clone())
        .with_timeout(timeout)
        .with_metadata(metadata.clone())
        .with_retry_policy(opentelemetry_otlp::RetryPolicy::disabled());
    let mut spans = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(config.endpoint.clone())
        .with_timeout(timeout)
        .with_metadata(metadata)
        .with_retry_policy(opentelemetry_otlp::RetryPolicy::disabled());
    if let Some(tls) = tls {
        logs = logs.with_tls_config(tls.clone());
        spans = spans.with_tls_config(tls);
    }
    Ok((
        logs.build().context("the OTLP/gRPC log exporter")?,
        spans.build().context("the OTLP/gRPC span exporter")?,
    ))
}

fn http(config: &OtlpConfig, timeout: Duration) -> anyhow::Result<Pair> {
    let tls = match &config.tls {
        Some(tls) => crate::edge::tls_client_config_with_ca(&tls.ca_file)
            .context("telemetry.otlp.tls.ca_file")?,
        None => crate::edge::tls_client_config()?,
    };
    let connector = crate::edge::https_connector(tls, timeout);
    let client = opentelemetry_http::hyper::HyperClient::new(connector, timeout, None);
    let headers: HashMap<String, String> = config.headers.clone().into_iter().collect();
    let base = config.endpoint.trim_end_matches('/');
    let logs = opentelemetry_otlp::LogExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(format!("{base}/v1/logs"))
        .with_timeout(timeout)
        .with_headers(headers.clone())
        .with_http_client(client.clone())
        .with_retry_policy(opentelemetry_otlp::RetryPolicy::disabled())
        .build()
        .context("the OTLP/HTTP log exporter")?;
    let spans = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(format!("{base}/v1/traces"))
        .with_timeout(timeout)
        .with_headers(headers)
        .with_http_client(client)
        .with_retry_policy(opentelemetry_otlp::RetryPolicy::disabled())
        .build()
        .context("the OTLP/HTTP span exporter")?;
    Ok((logs, spans))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn called(input: serde_json::Value, reason: String) -> Event {
        crate::events::test_call("t", Some(input), Action::Allow, reason)
    }

    #[test]
    fn attributes_are_cut_on_a_character_boundary() {
        assert_eq!(cap("short"), "short");
        let long = "é".repeat(MAX_ATTRIBUTE);
        let cut = cap(&long);
        assert!(cut.len() < MAX_ATTRIBUTE + 32, "{}", cut.len());
        assert!(cut.ends_with(&format!("… ({} bytes)", long.len())));
    }

    #[test]
    fn a_body_is_whole_or_cut_under_its_bound() {
        let small = called(serde_json::json!({"a": 1}), String::new());
        let (text, cut) = body(&small);
        assert!(!cut);
        assert_eq!(text, serde_json::to_string(&small).unwrap());

        let large = called(
            serde_json::json!({"pad": "x".repeat(100_000)}),
            String::new(),
        );
        let (text, cut) = body(&large);
        assert!(cut && text.len() <= MAX_BODY_BYTES);
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["tool_name"], "t");
        assert_eq!(value["input"]["sha256"].as_str().map(str::len), Some(64));

        let wordy = called(serde_json::json!({}), "r".repeat(100_000));
        let (text, cut) = body(&wordy);
        assert!(cut && text.len() < 1000, "{text}");
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["type"], "mcp_tool_called");
    }
}
