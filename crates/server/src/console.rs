//! `/console`: the reconciliation queue of the caller's tenant as a small HTML page (operator
//! token required). Askama escapes every value, so agent-supplied key parts cannot inject
//! markup.

use askama::Template;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use idemgate_core::outcome::ErrorCode;
use idemgate_core::record::RecordStatus;
use idemgate_core::store::Filter;

use crate::auth::Role;
use crate::state::AppState;
use crate::wire::ApiError;

struct Row {
    operation_key: String,
    tool: String,
    tool_version: String,
    attempt: u64,
    reference: String,
    updated_at: i64,
}

#[derive(Template)]
#[template(path = "console.html")]
struct Queue {
    tenant: String,
    environment: String,
    rows: Vec<Row>,
}

pub async fn page(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    let principal = state
        .inner()
        .tokens
        .authenticate(&headers)
        .map_err(ApiError::unauthenticated)?;
    if principal.role != Role::Operator {
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            "the console needs an operator token",
        ));
    }
    let records = state
        .executor()
        .store()
        .list(Filter {
            tenant: Some(principal.tenant.clone()),
            environment: Some(state.environment().to_string()),
            status: Some(RecordStatus::Unknown),
            tool: None,
            after: None,
            limit: 500,
        })
        .await
        .map_err(|e| ApiError::store(&e))?;
    let page = Queue {
        tenant: principal.tenant,
        environment: state.inner().environment.clone(),
        rows: records
            .iter()
            .map(|r| Row {
                operation_key: r.key.to_string(),
                tool: r.tool.clone(),
                tool_version: r.tool_version.clone(),
                attempt: r.fence,
                reference: r.effect_reference().unwrap_or("").to_string(),
                updated_at: r.updated_at,
            })
            .collect(),
    };
    let html = page
        .render()
        .map_err(|e| ApiError::internal("console page failed to render", &e))?;
    let mut r = html.into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    Ok(r)
}
