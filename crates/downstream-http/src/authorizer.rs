//! [`HttpAuthorizer`]: the contract's authorization hook. The executor's one authorizer,
//! which asks each tool's own hook, is the tool registry (`idemgate_app::ToolSet`).

use std::fmt;
use std::sync::Arc;

use idemgate_core::contract::Contract;
use idemgate_core::effect::{AuthRequest, AuthStage, Authorization, Authorizer};
use idemgate_core::store::BoxFuture;
use reqwest::header::{ACCEPT, HeaderValue};
use serde_json::json;

use crate::classify;
use crate::config::{ConfigError, HookPlan};
use crate::downstream::exchange;

/// One contract's authorization hook over HTTP. Cheap to clone; `Send + Sync`.
///
/// The hook is POSTed `{tenant, actor, role, tool, operation_key, fingerprint, stage}` —
/// never the arguments: the fingerprint identifies the exact request without handing its
/// content to another system. `2xx {"allow": true}` allows; `{"allow": false, "reason"}` or a
/// `403` denies; anything else — another status, no boolean, unreachable, timed out — is
/// [`Authorization::Unavailable`], on which the executor fails closed.
#[derive(Clone)]
pub struct HttpAuthorizer {
    plan: Arc<HookPlan>,
    client: reqwest::Client,
}

impl fmt::Debug for HttpAuthorizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpAuthorizer")
            .field("tool", &self.plan.tool)
            .field("url", &self.plan.url.as_str())
            .finish_non_exhaustive()
    }
}

impl HttpAuthorizer {
    /// The contract's hook, or `None` when it names none.
    pub fn from_contract(contract: &Contract) -> Result<Option<HttpAuthorizer>, ConfigError> {
        let Some(plan) = HookPlan::from_contract(contract)? else {
            return Ok(None);
        };
        let client = crate::shared_client(crate::DEFAULT_CONNECT_TIMEOUT).map_err(|message| {
            ConfigError::Invalid {
                tool: plan.tool.clone(),
                field: "security.authorization_hook".into(),
                message,
            }
        })?;
        Ok(Some(HttpAuthorizer {
            plan: Arc::new(plan),
            client,
        }))
    }

    /// Uses `client` instead of the shared one.
    pub fn with_client(mut self, client: reqwest::Client) -> Self {
        self.client = client;
        self
    }
}

fn stage(stage: AuthStage) -> &'static str {
    match stage {
        AuthStage::BeforeEffect => "before_effect",
        AuthStage::BeforeReplay => "before_replay",
    }
}

impl Authorizer for HttpAuthorizer {
    fn authorize<'a>(&'a self, request: AuthRequest<'a>) -> BoxFuture<'a, Authorization> {
        Box::pin(async move {
            let body = json!({
                "tenant": request.tenant,
                "actor": request.actor,
                "role": request.role,
                "tool": request.tool,
                "operation_key": request.key.map(|k| k.as_str()),
                "fingerprint": request.fingerprint.as_str(),
                "stage": stage(request.stage),
            });
            let builder = self
                .client
                .post(self.plan.url.clone())
                .headers(self.plan.headers.clone())
                .header(ACCEPT, HeaderValue::from_static("application/json"))
                .timeout(self.plan.timeout)
                .json(&body);
            let answer = classify::authorization(&exchange(builder).await.reply());
            tracing::info!(
                tool = request.tool,
                tenant = request.tenant,
                operation_key = request.key.map(|k| k.as_str()),
                stage = stage(request.stage),
                answer = match &answer {
                    Authorization::Allowed => "allowed",
                    Authorization::Denied(_) => "denied",
                    Authorization::Unavailable(_) => "unavailable",
                },
                "authorization hook"
            );
            answer
        })
    }
}
