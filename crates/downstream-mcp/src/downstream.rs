//! One tool of the child as the executor's [`Downstream`]: `perform` is one `tools/call`.

use std::sync::Arc;

use idemgate_core::effect::{Downstream, EffectOutcome, EffectRequest, JobStatus, Lookup};
use idemgate_core::key::OperationKey;
use idemgate_core::record::Receipt;
use idemgate_core::store::BoxFuture;
use serde_json::{Map, Value, json};

use crate::child::{CallAnswer, Child};

/// The `_meta` member under which the child receives the operation key of each call, for a
/// child that wants to deduplicate on it (a contract may then say `deduplicates_by_key`).
pub const OPERATION_KEY_META: &str = "io.idemgate/operation_key";

/// The default bound on one call's arguments, serialised.
pub const DEFAULT_MAX_ARGUMENT_BYTES: usize = 1 << 20;

/// One tool of one child MCP server.
#[derive(Debug, Clone)]
pub struct McpDownstream {
    child: Arc<Child>,
    tool: String,
    max_argument_bytes: usize,
    /// The argument filled with the operation key on every call, for a child that
    /// deduplicates on it (see [`crate::defaults::key_argument`]).
    key_argument: Option<String>,
}

impl McpDownstream {
    pub fn new(child: Arc<Child>, tool: impl Into<String>) -> McpDownstream {
        McpDownstream {
            child,
            tool: tool.into(),
            max_argument_bytes: DEFAULT_MAX_ARGUMENT_BYTES,
            key_argument: None,
        }
    }

    /// Fills `argument` with the operation key on every call (the same key on a resend), over
    /// whatever the caller put there.
    pub fn with_key_argument(mut self, argument: Option<String>) -> McpDownstream {
        self.key_argument = argument;
        self
    }

    pub fn with_max_argument_bytes(mut self, bytes: usize) -> McpDownstream {
        self.max_argument_bytes = bytes;
        self
    }
}

/// What the child's answer settles as. The child gives no reference of its own, so the
/// reference names the tool and the attempt; the result is the child's tool result as JSON
/// (`content`, `structuredContent`, `isError`), handed back unchanged on every replay.
///
/// A result with `isError: true` is recorded like any other answer, **not** as a refusal: a
/// refusal tells the executor that nothing happened (the caller may then repeat safely), and
/// a black box that reports an error may have acted before it failed. So the error answer is
/// stored and replayed, never resent; a new attempt is a new operation.
pub fn settle(tool: &str, attempt: u64, answer: CallAnswer) -> EffectOutcome {
    match answer {
        CallAnswer::Answered(result) => EffectOutcome::Committed(Receipt {
            reference: format!("{tool}#{attempt}"),
            result: Value::Object(result),
        }),
        CallAnswer::NotSent(reason) => EffectOutcome::NotSent {
            reason,
            retry_after: Some(1),
        },
        CallAnswer::Ambiguous(reason) => EffectOutcome::ambiguous(reason),
    }
}

impl Downstream for McpDownstream {
    fn check(&self, arguments: &Value) -> Result<(), String> {
        let child = self.child.spec().display();
        if !arguments.is_object() {
            return Err(format!(
                "the arguments of `{}` (child `{child}`) must be a JSON object",
                self.tool
            ));
        }
        let size = serde_json::to_vec(arguments).map(|b| b.len()).unwrap_or(0);
        if size > self.max_argument_bytes {
            return Err(format!(
                "the arguments of `{}` (child `{child}`) are {size} bytes, over the limit of {} bytes; nothing was sent",
                self.tool, self.max_argument_bytes
            ));
        }
        Ok(())
    }

    fn perform<'a>(&'a self, request: EffectRequest<'a>) -> BoxFuture<'a, EffectOutcome> {
        Box::pin(async move {
            let mut arguments = request.arguments.as_object().cloned().unwrap_or_default();
            if let Some(argument) = &self.key_argument {
                arguments.insert(argument.clone(), json!(request.key.as_str()));
            }
            let mut meta = Map::new();
            meta.insert(OPERATION_KEY_META.into(), json!(request.key.as_str()));
            let answer = self
                .child
                .call_tool(&self.tool, request.key.as_str(), arguments, meta)
                .await;
            settle(&self.tool, request.attempt, answer)
        })
    }

    fn lookup_receipt<'a>(&'a self, _key: &'a OperationKey) -> BoxFuture<'a, Lookup> {
        let message = format!(
            "the child MCP server `{}` offers no receipt lookup",
            self.child.spec().display()
        );
        Box::pin(std::future::ready(Lookup::Unavailable(message)))
    }

    fn poll_job<'a>(
        &'a self,
        _key: &'a OperationKey,
        _job_id: &'a str,
    ) -> BoxFuture<'a, JobStatus> {
        let message = format!(
            "the child MCP server `{}` has no jobs to poll",
            self.child.spec().display()
        );
        Box::pin(std::future::ready(JobStatus::Unavailable(message)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_result_is_stored_never_a_refusal() {
        let mut result = Map::new();
        result.insert("isError".into(), json!(true));
        result.insert("content".into(), json!([{"type": "text", "text": "boom"}]));
        match settle("t", 1, CallAnswer::Answered(result.clone())) {
            EffectOutcome::Committed(receipt) => {
                assert_eq!(receipt.result, Value::Object(result));
                assert_eq!(receipt.reference, "t#1");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_lost_answer_is_ambiguous_and_a_down_child_not_sent() {
        assert!(matches!(
            settle("t", 1, CallAnswer::Ambiguous("died".into())),
            EffectOutcome::Ambiguous { .. }
        ));
        assert!(matches!(
            settle("t", 1, CallAnswer::NotSent("down".into())),
            EffectOutcome::NotSent { .. }
        ));
    }
}
