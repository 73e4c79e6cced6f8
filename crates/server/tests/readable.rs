//! An API that tools can read: the OpenAPI document (answer headers, enums from the core's
//! lists, the discriminated reconcile body), problem types that resolve to pages, the tool
//! listing, and the label under `outcome` in every answer. Effects are counted on the fake
//! downstreams' side.

mod common;

use std::sync::Arc;

use axum::Router;
use common::*;
use idemgate_conformance::downstream::Fault;
use idemgate_conformance::mem::MemStore;
use idemgate_core::outcome::ALL_CODES;
use idemgate_core::record::{EventKind, RecordStatus};
use idemgate_server::Gateway;
use idemgate_server::api::{
    ReconcileApplied, ReconcileBody, ReconcileLookup, ReconcileNotApplied, ReconcileRequest,
    ResolutionApplied, ResolutionLookup, ResolutionNotApplied,
};
use idemgate_server::problems::{self, ProblemBase};
use serde_json::{Value, json};

struct Env {
    app: Router,
    fakes: Fakes,
}

fn env() -> Env {
    let mut fakes = Fakes::new();
    let tools = fakes.tools();
    let state = Gateway::new(Arc::new(MemStore::new()), tools, tokens())
        .environment(ENV)
        .build();
    Env {
        app: served(state),
        fakes,
    }
}

fn ticket(workflow: &str, subject: &str) -> Value {
    json!({"workflow_id": workflow, "step_id": "s", "arguments": {"subject": subject, "body": "Order 42 arrived broken."}})
}

async fn document(app: &Router) -> Value {
    let doc = route(app, Call::get("/openapi.json", AGENT).anonymous()).await;
    assert_eq!(doc.status, 200, "{}", doc.text);
    doc.json
}

/// Follows a local `$ref` (`#/components/schemas/X`).
fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    match schema["$ref"].as_str() {
        Some(r) => doc
            .pointer(r.trim_start_matches('#'))
            .unwrap_or_else(|| panic!("{r} does not resolve")),
        None => schema,
    }
}

fn enum_of(doc: &Value, schema: &Value) -> Vec<String> {
    resolve(doc, schema)["enum"]
        .as_array()
        .unwrap_or_else(|| panic!("not an enum: {schema}"))
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

/// Every operation in the document: (path, method, operation).
fn operations(doc: &Value) -> Vec<(String, String, Value)> {
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            out.push((path.clone(), method.clone(), op.clone()));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The OpenAPI document.

#[tokio::test]
async fn the_document_declares_the_headers_of_each_answer() {
    let e = env();
    let doc = document(&e.app).await;
    let responses = |path: &str, method: &str| doc["paths"][path][method]["responses"].clone();
    let has = |responses: &Value, status: &str, header: &str| {
        responses[status]["headers"].get(header).is_some()
    };

    let invoke = responses("/v1/tools/{tool}/invoke", "post");
    for (status, response) in invoke.as_object().unwrap() {
        assert!(
            response["headers"].get("Idempotency-Outcome").is_some(),
            "invoke {status} lacks Idempotency-Outcome"
        );
    }
    assert!(has(&invoke, "200", "Idempotent-Replayed"));
    for status in ["202", "409", "503"] {
        assert!(has(&invoke, status, "Retry-After"), "invoke {status}");
    }
    assert!(has(&invoke, "401", "WWW-Authenticate"));
    assert!(!has(&invoke, "422", "Retry-After"));
    let label = &invoke["200"]["headers"]["Idempotency-Outcome"]["schema"];
    assert_eq!(
        enum_of(&doc, label),
        ["applied", "replayed", "in_flight", "rejected", "unknown"]
    );

    let read = responses("/v1/operations/{operation_key}", "get");
    for status in ["200", "401", "404"] {
        assert!(has(&read, status, "Idempotency-Outcome"), "read {status}");
    }
    for path in [
        "/v1/operations/{operation_key}/reconcile",
        "/v1/operations/{operation_key}/approve",
        "/v1/operations/{operation_key}/deny",
    ] {
        let r = responses(path, "post");
        for (status, response) in r.as_object().unwrap() {
            assert!(
                response["headers"].get("Idempotency-Outcome").is_some(),
                "{path} {status}"
            );
        }
    }

    // The rules hold over the whole document.
    for (path, method, op) in operations(&doc) {
        for (status, response) in op["responses"].as_object().unwrap() {
            let headers = &response["headers"];
            if status == "401" {
                assert!(
                    headers.get("WWW-Authenticate").is_some(),
                    "{method} {path} 401"
                );
            }
            if status == "409" || status == "503" {
                assert!(
                    headers.get("Retry-After").is_some(),
                    "{method} {path} {status}"
                );
            }
            if response["content"]
                .get("application/problem+json")
                .is_some()
            {
                assert!(
                    headers.get("Idempotency-Outcome").is_some(),
                    "{method} {path} {status}: a problem carries Idempotency-Outcome"
                );
            }
        }
    }
}

#[tokio::test]
async fn the_documents_enums_are_the_cores_lists() {
    let e = env();
    let doc = document(&e.app).await;
    let schemas = &doc["components"]["schemas"];
    let codes: Vec<&str> = ALL_CODES.iter().map(|c| c.as_str()).collect();
    assert_eq!(
        enum_of(&doc, &schemas["ErrorView"]["properties"]["code"]),
        codes
    );
    let statuses: Vec<&str> = RecordStatus::ALL.iter().map(|s| s.as_str()).collect();
    assert_eq!(
        enum_of(
            &doc,
            &schemas["OperationSummary"]["properties"]["record_status"]
        ),
        statuses
    );
    let kinds: Vec<&str> = EventKind::ALL.iter().map(|k| k.as_str()).collect();
    assert_eq!(
        enum_of(&doc, &schemas["EventView"]["properties"]["kind"]),
        kinds
    );
    let labels = ["applied", "replayed", "in_flight", "rejected", "unknown"];
    for schema in ["OutcomeView", "Problem"] {
        assert_eq!(
            enum_of(&doc, &schemas[schema]["properties"]["outcome"]),
            labels,
            "{schema}"
        );
    }
    // `outcome` is required in both bodies; `status` is the label in one, the HTTP number in
    // the other.
    for schema in ["OutcomeView", "Problem"] {
        let required = schemas[schema]["required"].as_array().unwrap();
        assert!(required.contains(&json!("outcome")), "{schema}");
    }
    assert_eq!(
        enum_of(&doc, &schemas["OutcomeView"]["properties"]["status"]),
        labels
    );
    assert_eq!(
        schemas["Problem"]["properties"]["status"]["type"],
        "integer"
    );
    // The list filter takes the same record statuses.
    let params = doc["paths"]["/v1/operations"]["get"]["parameters"]
        .as_array()
        .unwrap();
    let status = params.iter().find(|p| p["name"] == "status").unwrap();
    assert_eq!(enum_of(&doc, &status["schema"]), statuses);
}

#[tokio::test]
async fn the_reconcile_body_is_a_discriminated_one_of() {
    let e = env();
    let doc = document(&e.app).await;
    let body = &doc["paths"]["/v1/operations/{operation_key}/reconcile"]["post"]["requestBody"];
    assert_eq!(
        body["required"], false,
        "no body means: look the receipt up"
    );
    let schema = resolve(&doc, &body["content"]["application/json"]["schema"]);
    let discriminator = &schema["discriminator"];
    assert_eq!(discriminator["propertyName"], "resolution");
    let mapping = discriminator["mapping"].as_object().unwrap();
    assert_eq!(
        mapping.keys().collect::<Vec<_>>(),
        ["applied", "lookup", "not_applied"]
    );
    let one_of: Vec<&str> = schema["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["$ref"].as_str().expect("each variant is a named schema"))
        .collect();
    for (value, target) in mapping {
        let target = target.as_str().unwrap();
        assert!(one_of.contains(&target), "{target} is one of the variants");
        let variant = doc.pointer(target.trim_start_matches('#')).unwrap();
        assert!(
            variant["required"]
                .as_array()
                .unwrap()
                .contains(&json!("resolution"))
        );
        assert_eq!(
            enum_of(&doc, &variant["properties"]["resolution"]),
            [value.as_str()]
        );
    }
    // The documented shapes are the ones the gateway reads.
    let documented = [
        ReconcileBody::Applied(ReconcileApplied {
            resolution: ResolutionApplied::Applied,
            effect_reference: "ticket_1".into(),
            result: Some(json!({"status": "solved"})),
            reason: Some("the ticket shows it solved".into()),
        }),
        ReconcileBody::Applied(ReconcileApplied {
            resolution: ResolutionApplied::Applied,
            effect_reference: "ticket_1".into(),
            result: None,
            reason: None,
        }),
        ReconcileBody::NotApplied(ReconcileNotApplied {
            resolution: ResolutionNotApplied::NotApplied,
            reason: None,
        }),
        ReconcileBody::NotApplied(ReconcileNotApplied {
            resolution: ResolutionNotApplied::NotApplied,
            reason: Some("no ticket exists".into()),
        }),
        ReconcileBody::Lookup(ReconcileLookup {
            resolution: ResolutionLookup::Lookup,
            reason: Some("the provider was down".into()),
        }),
    ];
    for body in documented {
        let value = serde_json::to_value(&body).unwrap();
        let read: Result<ReconcileRequest, _> = serde_json::from_value(value.clone());
        assert!(read.is_ok(), "{value} is documented but refused: {read:?}");
    }
    // Operator bodies are absent or an object, never a JSON null.
    for action in ["approve", "deny"] {
        let body = &doc["paths"][format!("/v1/operations/{{operation_key}}/{action}")]["post"]["requestBody"];
        assert_eq!(body["required"], false, "{action}");
        assert!(
            body["content"]["application/json"]["schema"]["$ref"].is_string(),
            "{action}: {body}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Problem types.

/// Whether an HTML page loads nothing from anywhere and runs nothing.
fn self_contained(page: &str) {
    let lower = page.to_ascii_lowercase();
    for needle in [
        "<script",
        " src=",
        "href=\"http",
        "href=\"//",
        "@import",
        "url(",
    ] {
        assert!(!lower.contains(needle), "the page contains {needle:?}");
    }
}

#[tokio::test]
async fn every_problem_type_has_a_page_from_the_data() {
    let e = env();
    for code in ALL_CODES {
        let entry = problems::entry(*code).expect("an entry");
        let path = format!("/problems/{}", code.as_str());
        let page = route(&e.app, Call::get(path.clone(), AGENT).anonymous()).await;
        assert_eq!(page.status, 200, "{path}");
        assert_eq!(
            page.header("content-type"),
            Some("text/html; charset=utf-8")
        );
        self_contained(&page.text);
        assert!(
            page.text.contains(&format!("<h1>{}</h1>", entry.title())),
            "{path}"
        );
        assert!(page.text.contains(code.as_str()));
        for heading in ["What happened", "The effect", "What to do"] {
            assert!(page.text.contains(heading), "{path} lacks {heading}");
        }

        let data = route(
            &e.app,
            Call::get(path.clone(), AGENT)
                .anonymous()
                .header("accept", "application/json"),
        )
        .await;
        assert_eq!(data.status, 200, "{path}");
        let status = idemgate_server::wire::rejection_status(*code).as_u16();
        assert_eq!(data.json["code"], code.as_str());
        assert_eq!(data.json["title"], entry.title());
        assert_eq!(data.json["status"], status);
        assert_eq!(data.json["meaning"], entry.meaning);
        assert_eq!(data.json["effect"], entry.effect);
        assert_eq!(data.json["action"], entry.action);
        assert_eq!(data.json["retryable"], code.retryable());
    }
    let index = route(&e.app, Call::get("/problems", AGENT).anonymous()).await;
    assert_eq!(index.status, 200);
    self_contained(&index.text);
    for code in ALL_CODES {
        assert!(
            index
                .text
                .contains(&format!("href=\"problems/{}\"", code.as_str())),
            "{}",
            code.as_str()
        );
    }
    let listed = route(
        &e.app,
        Call::get("/problems", AGENT)
            .anonymous()
            .header("accept", "application/json"),
    )
    .await;
    assert_eq!(listed.json.as_array().unwrap().len(), ALL_CODES.len());

    let missing = route(
        &e.app,
        Call::get("/problems/no_such_code", AGENT).anonymous(),
    )
    .await;
    missing.assert_problem(404, "not_found");
    assert!(
        missing.json["detail"]
            .as_str()
            .unwrap()
            .contains("no_such_code")
    );
}

#[tokio::test]
async fn the_types_of_real_problems_resolve() {
    let e = env();
    let cases: Vec<(Call<'static>, u16, &str)> = vec![
        (
            Call::get("/v1/tools", AGENT).anonymous(),
            401,
            "unauthorized",
        ),
        (
            Call::get("/v1/tools/tickets.delete", AGENT),
            404,
            "unknown_tool",
        ),
        (Call::get("/v1/operations", AGENT), 403, "forbidden"),
        (
            Call::get("/v1/operations/acme:test:none:s", AGENT),
            404,
            "not_found",
        ),
        (
            Call::post("/v1/tools/tickets.create/invoke", AGENT, "[1]"),
            400,
            "invalid_arguments",
        ),
        (
            invoke(
                "tickets.create",
                AGENT,
                json!({"arguments": {"subject": "a", "body": "b"}}),
            ),
            400,
            "missing_operation_key",
        ),
        (Call::get("/v1/tools/%FF", AGENT), 400, "invalid_arguments"),
    ];
    for (call, status, code) in cases {
        let what = format!("{} {}", call.method, call.path);
        let r = route(&e.app, call).await;
        r.assert_problem(status, code);
        let problem_type = r.json["type"].as_str().unwrap();
        assert_eq!(problem_type, format!("/problems/{code}"), "{what}");
        let page = route(&e.app, Call::get(problem_type, AGENT).anonymous()).await;
        assert_eq!(page.status, 200, "{what}: {problem_type}");
    }
    assert_eq!(e.fakes.total_calls(), 0);
}

#[tokio::test]
async fn served_problem_types_are_absolute_and_resolve_over_the_socket() {
    let mut fakes = Fakes::new();
    let tools = fakes.tools();
    let state = Gateway::new(Arc::new(MemStore::new()), tools, tokens())
        .environment(ENV)
        .build();
    let gate = Gate::start(state).await;
    let refused = http(gate.addr, Call::get("/v1/tools", AGENT).anonymous()).await;
    refused.assert_problem(401, "unauthorized");
    let problem_type = refused.json["type"].as_str().unwrap().to_string();
    assert_eq!(
        problem_type,
        format!("http://{}/problems/unauthorized", gate.addr)
    );
    let path = problem_type.trim_start_matches(&format!("http://{}", gate.addr));
    let page = http(gate.addr, Call::get(path, AGENT).anonymous()).await;
    assert_eq!(page.status, 200, "{}", page.text);
    assert!(page.text.contains("<h1>Unauthorized</h1>"));
    gate.stop().await;

    // A configured public URL names the pages wherever the gateway listens.
    let mut fakes = Fakes::new();
    let tools = fakes.tools();
    let base = ProblemBase::parse("https://gateway.example/idemgate/").unwrap();
    let state = Gateway::new(Arc::new(MemStore::new()), tools, tokens())
        .environment(ENV)
        .public_url(Some(base))
        .build();
    let gate = Gate::start(state).await;
    let refused = http(gate.addr, Call::get("/v1/tools/nope", AGENT)).await;
    assert_eq!(
        refused.json["type"],
        "https://gateway.example/idemgate/problems/unknown_tool"
    );
    gate.stop().await;
}

// ---------------------------------------------------------------------------------------------
// The tool listing.

#[tokio::test]
async fn the_tools_are_listed_with_their_schemas_for_a_token_holder() {
    let e = env();
    let refused = route(&e.app, Call::get("/v1/tools", AGENT).anonymous()).await;
    refused.assert_problem(401, "unauthorized");
    assert_eq!(refused.header("www-authenticate"), Some("Bearer"));
    let refused = route(&e.app, Call::get("/v1/tools/tickets.create", "nope")).await;
    refused.assert_problem(401, "unauthorized");

    let listed = route(&e.app, Call::get("/v1/tools", AGENT)).await;
    assert_eq!(listed.status, 200, "{}", listed.text);
    let tools = listed.json["tools"].as_array().unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    // Every loaded tool (the examples and notes.append), ordered by name.
    let contracts = idemgate_app::contracts::examples().unwrap();
    let mut expected: Vec<&str> = contracts.iter().map(|c| c.name.as_str()).collect();
    expected.push("notes.append");
    expected.sort();
    assert_eq!(names, expected);

    let by_name = |name: &str| tools.iter().find(|t| t["name"] == name).unwrap().clone();
    for contract in &contracts {
        let tool = by_name(&contract.name);
        assert_eq!(tool["version"], contract.version.as_str());
        assert_eq!(
            tool["input_schema"], contract.input_schema,
            "{}",
            contract.name
        );
        assert!(
            !tool["description"].as_str().unwrap().trim().is_empty(),
            "{}",
            contract.name
        );
    }
    let create = by_name("tickets.create");
    assert_eq!(create["effect_class"], "key_based");
    assert_eq!(create["operation_identity"], "required");
    assert_eq!(create["approval"], "when_matches");
    let get = by_name("tickets.get");
    assert_eq!(get["effect_class"], "read");
    assert_eq!(get["operation_identity"], "ignored");
    assert_eq!(get["approval"], "never");

    let one = route(&e.app, Call::get("/v1/tools/tickets.create", AGENT)).await;
    assert_eq!(one.status, 200);
    assert_eq!(one.json, create);

    let unknown = route(&e.app, Call::get("/v1/tools/tickets.delete", AGENT)).await;
    unknown.assert_problem(404, "unknown_tool");
    assert!(
        unknown.json["detail"]
            .as_str()
            .unwrap()
            .contains("\"tickets.delete\""),
        "{}",
        unknown.text
    );
    // A hostile name is shown bounded and printable.
    let hostile = format!("/v1/tools/a%0A{}", "b".repeat(300));
    let unknown = route(&e.app, Call::get(hostile, AGENT)).await;
    unknown.assert_problem(404, "unknown_tool");
    let detail = unknown.json["detail"].as_str().unwrap();
    assert!(detail.contains("a?bbb") && detail.len() < 250, "{detail}");
    let invoked = route(&e.app, invoke("tickets.delete", AGENT, ticket("w", "a"))).await;
    invoked.assert_problem(404, "unknown_tool");
    assert!(
        invoked.json["detail"]
            .as_str()
            .unwrap()
            .contains("tickets.delete")
    );
    assert_eq!(e.fakes.total_calls(), 0);
}

// ---------------------------------------------------------------------------------------------
// The label under `outcome`.

/// The body's `outcome` is the label, and the header says the same.
fn labelled(r: &Reply, label: &str) {
    assert_eq!(r.json["outcome"], label, "{}", r.text);
    assert_eq!(r.outcome(), label, "{}", r.text);
    if r.header("content-type") == Some("application/problem+json") {
        assert_eq!(
            r.json["status"], r.status,
            "a problem's status is the HTTP status"
        );
    } else {
        assert_eq!(r.json["status"], label, "an outcome's status is the label");
    }
}

#[tokio::test]
async fn every_answer_names_its_label_as_outcome() {
    let e = env();
    let tickets = e.fakes.fake("tickets.create");
    let notes = e.fakes.fake("notes.append");

    // Invocations: every label.
    let applied = route(&e.app, invoke("tickets.create", AGENT, ticket("o1", "a"))).await;
    labelled(&applied, "applied");
    let replayed = route(&e.app, invoke("tickets.create", AGENT, ticket("o1", "a"))).await;
    labelled(&replayed, "replayed");
    let rejected = route(&e.app, invoke("tickets.create", AGENT, ticket("o1", "b"))).await;
    labelled(&rejected, "rejected");
    let legal = json!({"workflow_id": "o2", "step_id": "s", "arguments": {"queue_id": "legal", "subject": "a", "body": "x"}});
    let held = route(&e.app, invoke("tickets.create", AGENT, legal)).await;
    assert_eq!(held.status, 202);
    labelled(&held, "in_flight");
    notes.push_fault(Fault::CommitThenDrop);
    let note = json!({"workflow_id": "o3", "step_id": "s1", "arguments": {"text": "hello"}});
    let unknown = route(&e.app, invoke("notes.append", AGENT, note)).await;
    labelled(&unknown, "unknown");

    // The operation read: its `outcome` member is an outcome body, whose `outcome` is the label.
    let read = route(&e.app, Call::get("/v1/operations/acme:test:o1:s", AGENT)).await;
    assert_eq!(read.status, 200);
    assert_eq!(read.json["outcome"]["outcome"], "replayed");
    assert_eq!(read.json["outcome"]["status"], "replayed");
    assert_eq!(read.outcome(), "replayed");
    let read = route(&e.app, Call::get("/v1/operations/acme:test:o3:s1", AGENT)).await;
    assert_eq!(read.json["outcome"]["outcome"], "unknown");
    assert_eq!(read.outcome(), "unknown");

    // Operator actions.
    let approved = route(
        &e.app,
        Call::post("/v1/operations/acme:test:o2:s/approve", OPERATOR, ""),
    )
    .await;
    labelled(&approved, "applied");
    let again = route(
        &e.app,
        Call::post("/v1/operations/acme:test:o2:s/approve", OPERATOR, ""),
    )
    .await;
    labelled(&again, "rejected");
    let receipt = notes
        .receipt_for(&idemgate_core::key::OperationKey::new("acme", ENV, "o3", "s1").unwrap())
        .unwrap();
    let settled = route(
        &e.app,
        Call::post(
            "/v1/operations/acme:test:o3:s1/reconcile",
            OPERATOR,
            json!({"resolution": "applied", "effect_reference": receipt.reference}).to_string(),
        ),
    )
    .await;
    assert_eq!(settled.status, 200, "{}", settled.text);
    assert_eq!(settled.json["outcome"], settled.outcome());
    assert!(["applied", "replayed"].contains(&settled.outcome()));
    let legal = json!({"workflow_id": "o4", "step_id": "s", "arguments": {"queue_id": "legal", "subject": "a", "body": "x"}});
    route(&e.app, invoke("tickets.create", AGENT, legal)).await;
    let denied = route(
        &e.app,
        Call::post(
            "/v1/operations/acme:test:o4:s/deny",
            OPERATOR,
            r#"{"reason":"no"}"#,
        ),
    )
    .await;
    labelled(&denied, "rejected");

    // Refusals around the executor: authentication, roles, missing things, methods, sizes.
    let big = "x".repeat(300_000);
    let refusals: Vec<(Call<'static>, u16)> = vec![
        (Call::get("/v1/tools", AGENT).anonymous(), 401),
        (Call::get("/v1/operations/acme:test:o1:s", "nope"), 401),
        (
            Call::get("/v1/operations?status=unknown", AGENT).anonymous(),
            401,
        ),
        (Call::get("/v1/operations", AGENT), 403),
        (
            Call::post("/v1/operations/acme:test:o1:s/reconcile", AGENT, ""),
            403,
        ),
        (Call::get("/v1/operations/acme:test:nothing:s", AGENT), 404),
        (Call::get("/v1/operations/globex:test:o1:s", OTHER), 404),
        (Call::get("/no/such/path", AGENT), 404),
        (Call::post("/v1/tools", AGENT, "{}"), 405),
        (
            Call::post("/v1/tools/tickets.create/invoke", AGENT, big.clone()),
            413,
        ),
        (
            Call::post(
                "/v1/operations/acme:test:o1:s/reconcile",
                OPERATOR,
                big.clone(),
            ),
            413,
        ),
        (
            Call::post("/mcp", AGENT, big.clone()).header("content-length", big.len().to_string()),
            413,
        ),
    ];
    for (call, status) in refusals {
        let what = format!("{} {}", call.method, call.path);
        let r = route(&e.app, call).await;
        assert_eq!(r.status, status, "{what}: {}", r.text);
        assert_eq!(
            r.header("content-type"),
            Some("application/problem+json"),
            "{what}"
        );
        labelled(&r, "rejected");
    }

    // What reached the ticket service: o1 once, o2 once (approved), o4 never.
    let key = |w: &str| idemgate_core::key::OperationKey::new("acme", ENV, w, "s").unwrap();
    assert_eq!(tickets.effects_for(&key("o1")), 1);
    assert_eq!(tickets.effects_for(&key("o2")), 1);
    assert_eq!(tickets.effects_for(&key("o4")), 0);
    assert_eq!(tickets.effects(), 2);
    assert_eq!(notes.effects(), 1);
}

// ---------------------------------------------------------------------------------------------
// docs/errors.md

/// `docs/errors.md` holds `problems::markdown()` between its markers, so the reference a person
/// reads is the data the pages show. `IDEMGATE_UPDATE_DOCS=1` rewrites that part.
#[test]
fn docs_errors_md_is_the_data() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/errors.md");
    let text = std::fs::read_to_string(&path).expect("docs/errors.md exists");
    let start = text
        .find(problems::DOC_BEGIN)
        .expect("docs/errors.md has the generated part's first marker");
    let body_start = start + problems::DOC_BEGIN.len() + 1;
    let end = text[body_start..]
        .find(problems::DOC_END)
        .map(|i| body_start + i)
        .expect("docs/errors.md has the generated part's last marker");
    let generated = problems::markdown();
    if std::env::var("IDEMGATE_UPDATE_DOCS").as_deref() == Ok("1") {
        let updated = format!("{}{generated}{}", &text[..body_start], &text[end..]);
        std::fs::write(&path, updated).unwrap();
        return;
    }
    assert!(
        text[body_start..end] == generated,
        "docs/errors.md differs from crates/server/src/problems.rs; regenerate it with \
         IDEMGATE_UPDATE_DOCS=1 cargo test -p idemgate-server --test readable docs_errors_md"
    );
    for code in ALL_CODES {
        assert!(
            text.contains(&format!("\n### {}\n", code.as_str())),
            "docs/errors.md has no section for {}",
            code.as_str()
        );
    }
}
