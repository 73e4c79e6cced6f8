//! What passes between the child and the host besides tool calls, as plain JSON: the child's
//! notifications (log messages, progress, resource updates, list changes) and its requests
//! to the host (sampling, elicitation, roots), and the progress routes that tie a progress
//! notification of the child to the host's request that is waiting for it.
//!
//! The host is whoever serves the MCP face ([`Upstream`]); it is attached once it is known
//! (the child starts before the host connects). Until then the child's notifications are
//! dropped and its requests answered with an error.
//!
//! **Progress.** The host asks for progress by giving its `tools/call` a progress token. The
//! call then passes through the executor, which knows nothing of MCP, before it reaches the
//! child, so the two ends are tied by what survives the trip: the operation key. The MCP face
//! announces each call before it enters the executor ([`Relay::expect`]: the operation key the
//! executor will give it, and the host's token if it gave one). The child's `tools/call` goes
//! out under a progress token of its own, one per request and never reused (the SDK's, paired
//! with the connection it went out on: a child started again counts its tokens from zero), and
//! takes the announcement of its operation key ([`Sending::claim`]). A progress notification is
//! passed on only under the host's token of a call that is still waiting for that very
//! request; one under an unmapped token, for a call announced without a token, or after the
//! host stopped waiting, is dropped: the host must not see progress for a request it did not
//! make.
//!
//! A call without an operation key (a read: the executor gives it a key of its own, unknown to
//! the MCP face) is announced by its tool and arguments instead, and its child request takes the
//! oldest such announcement not yet taken. Two identical reads running at once cannot be told
//! apart on the way; each receives the progress of one of the two child requests.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};

use idemgate_core::store::BoxFuture;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::child::ForwardError;

/// The host as the child sees it: where its notifications and requests go.
pub trait Upstream: Send + Sync + 'static {
    /// One notification for the host: `notifications/message`, `notifications/progress`
    /// (already under the host's token), `notifications/resources/updated`,
    /// `notifications/resources/list_changed`, `notifications/prompts/list_changed`.
    fn notify(&self, method: &str, params: Value);
    /// One request for the host — `sampling/createMessage`, `elicitation/create`,
    /// `roots/list` — and its answer for the child. A host that did not declare the
    /// capability answers with a JSON-RPC error, which goes back to the child.
    fn request<'a>(
        &'a self,
        method: &'a str,
        params: Value,
    ) -> BoxFuture<'a, Result<Value, ForwardError>>;
}

/// How an announced call is recognised when its request reaches the child.
#[derive(Debug, Clone, PartialEq)]
enum Awaited {
    /// By the operation key the executor hands the downstream.
    Operation(String),
    /// A call without a key of its own: by its tool and arguments.
    Unkeyed { tool: String, arguments: Value },
}

/// One progress token of a request to the child: the SDK's token, and the connection (the
/// child process) it was sent on.
#[derive(Debug, Clone, PartialEq)]
struct ChildToken {
    connection: u64,
    token: Value,
}

/// One announced call of the host.
struct Route {
    awaited: Awaited,
    /// `None`: the host asked for no progress, and gets none.
    host_token: Option<Value>,
    /// The child's requests serving this call (one, or none yet).
    child: Vec<ChildToken>,
}

#[derive(Default)]
struct Routes {
    next: u64,
    routes: BTreeMap<u64, Route>,
}

/// Shared by the child's connection (every restart) and the MCP face.
pub struct Relay {
    child: String,
    host: RwLock<Option<Arc<dyn Upstream>>>,
    routes: Mutex<Routes>,
    /// Held (shared) from before a `tools/call` is sent until its token is claimed, and
    /// (exclusively) by each progress notification before it is routed: progress for a request
    /// cannot overtake the claim of that request's token. A tokio lock because it is held
    /// across the send; progress notifications are handled on tasks of their own, so waiting
    /// here never stalls the connection.
    sending: tokio::sync::RwLock<()>,
    tools_changed: watch::Sender<u64>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("child", &self.child)
            .finish_non_exhaustive()
    }
}

/// While it lives, the host's request waits and progress for it is passed on; dropped when
/// the host's request ends (answered or cancelled).
#[must_use = "the route ends when this is dropped"]
pub struct RouteGuard {
    relay: Arc<Relay>,
    id: u64,
}

impl Drop for RouteGuard {
    fn drop(&mut self) {
        if let Ok(mut routes) = self.relay.routes.lock() {
            routes.routes.remove(&self.id);
        }
    }
}

/// A `tools/call` on its way to the child: held from before it is sent until its progress
/// token is claimed ([`Relay::sending`]).
#[must_use = "claim the request's token once it is sent"]
pub struct Sending<'a> {
    relay: &'a Relay,
    _gate: tokio::sync::RwLockReadGuard<'a, ()>,
}

impl Sending<'_> {
    /// The child's request for `operation` (`tool` with `arguments`) went out on connection
    /// `connection` under `token`. It takes every announcement of `operation` (two host calls
    /// waiting for the same operation both hear of its one request); failing any, the oldest
    /// key-less announcement of the same tool and arguments not yet taken.
    pub fn claim(
        self,
        operation: &str,
        tool: &str,
        arguments: &Value,
        connection: u64,
        token: Value,
    ) {
        let token = ChildToken { connection, token };
        let mut routes = self.relay.routes();
        let mut keyed = routes
            .routes
            .values_mut()
            .filter(|r| matches!(&r.awaited, Awaited::Operation(k) if k == operation))
            .peekable();
        if keyed.peek().is_some() {
            keyed.for_each(|r| r.child.push(token.clone()));
            return;
        }
        let unkeyed = Awaited::Unkeyed {
            tool: tool.to_string(),
            arguments: arguments.clone(),
        };
        if let Some(route) = routes
            .routes
            .values_mut()
            .find(|r| r.child.is_empty() && r.awaited == unkeyed)
        {
            route.child.push(token);
        }
    }
}

impl Relay {
    pub fn new(child: impl Into<String>) -> Arc<Relay> {
        Arc::new(Relay {
            child: child.into(),
            host: RwLock::new(None),
            routes: Mutex::new(Routes::default()),
            sending: tokio::sync::RwLock::new(()),
            tools_changed: watch::Sender::new(0),
        })
    }

    fn routes(&self) -> std::sync::MutexGuard<'_, Routes> {
        self.routes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// From now on the child's notifications and requests go to `host`.
    pub fn attach(&self, host: Arc<dyn Upstream>) {
        if let Ok(mut slot) = self.host.write() {
            *slot = Some(host);
        }
    }

    fn host(&self) -> Option<Arc<dyn Upstream>> {
        self.host.read().ok().and_then(|h| h.clone())
    }

    /// A notification of the child for the host; dropped while no host is attached.
    pub fn notify(&self, method: &str, params: Value) {
        match self.host() {
            Some(host) => host.notify(method, params),
            None => {
                tracing::debug!(child = %self.child, method, "no host yet; notification dropped")
            }
        }
    }

    /// A request of the child for the host.
    pub async fn ask(&self, method: &str, params: Value) -> Result<Value, ForwardError> {
        let Some(host) = self.host() else {
            return Err(ForwardError {
                code: -32603,
                message: format!(
                    "`{method}` from the child `{}`: no host is connected to idemgate wrap yet",
                    self.child
                ),
                data: None,
            });
        };
        host.request(method, params).await
    }

    /// The host's call of `tool` with `arguments` waits, with progress under `host_token`
    /// (none without). `operation` is the key the executor hands the downstream for this call;
    /// `None` for a call that gets a key of its own there (a read).
    pub fn expect(
        self: &Arc<Self>,
        tool: &str,
        arguments: &Value,
        operation: Option<&str>,
        host_token: Option<Value>,
    ) -> RouteGuard {
        let awaited = match operation {
            Some(key) => Awaited::Operation(key.to_string()),
            None => Awaited::Unkeyed {
                tool: tool.to_string(),
                arguments: arguments.clone(),
            },
        };
        let mut routes = self.routes();
        routes.next += 1;
        let id = routes.next;
        routes.routes.insert(
            id,
            Route {
                awaited,
                host_token,
                child: Vec::new(),
            },
        );
        RouteGuard {
            relay: self.clone(),
            id,
        }
    }

    /// A `tools/call` is about to be sent: progress notifications wait until its token is
    /// claimed with [`Sending::claim`] (or the send failed and this is dropped).
    pub async fn sending(&self) -> Sending<'_> {
        Sending {
            relay: self,
            _gate: self.sending.read().await,
        }
    }

    /// A progress notification of the child, received on connection `connection`: passed on
    /// under the host's token of each call waiting for that request, or dropped.
    pub async fn progress(&self, connection: u64, params: Value) {
        // Every claim begun before this notification arrived is finished first.
        drop(self.sending.write().await);
        let token = ChildToken {
            connection,
            token: params.get("progressToken").cloned().unwrap_or(Value::Null),
        };
        let host_tokens: Vec<Value> = self
            .routes()
            .routes
            .values()
            .filter(|r| r.child.contains(&token))
            .filter_map(|r| r.host_token.clone())
            .collect();
        if host_tokens.is_empty() {
            tracing::debug!(child = %self.child, "progress for no waiting request; dropped");
        }
        for host_token in host_tokens {
            let mut params = params.clone();
            params["progressToken"] = host_token;
            self.notify("notifications/progress", params);
        }
    }

    /// The child said its tool list changed (or a new child process was started).
    pub fn tools_changed(&self) {
        self.tools_changed.send_modify(|n| *n += 1);
    }

    /// Changes on every [`Relay::tools_changed`].
    pub fn watch_tools(&self) -> watch::Receiver<u64> {
        self.tools_changed.subscribe()
    }
}

/// The capabilities wrap declares to the child: everything a host may answer, since the host
/// is not known when the child starts. A request the host cannot answer gets an error.
pub fn child_capabilities() -> Value {
    json!({
        "sampling": {},
        "elicitation": {"form": {}, "url": {}},
        "roots": {"listChanged": true},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Seen(Mutex<Vec<(String, Value)>>);

    impl Upstream for Seen {
        fn notify(&self, method: &str, params: Value) {
            self.0.lock().unwrap().push((method.into(), params));
        }
        fn request<'a>(
            &'a self,
            _method: &'a str,
            params: Value,
        ) -> BoxFuture<'a, Result<Value, ForwardError>> {
            Box::pin(std::future::ready(Ok(params)))
        }
    }

    fn progress(token: i64, value: f64) -> Value {
        json!({"progressToken": token, "progress": value})
    }

    /// What the host was sent: each notification's token and progress.
    fn heard(seen: &Seen) -> Vec<(Value, Value)> {
        let seen = seen.0.lock().unwrap();
        seen.iter()
            .map(|(method, p)| {
                assert_eq!(method, "notifications/progress");
                (p["progressToken"].clone(), p["progress"].clone())
            })
            .collect()
    }

    fn attached() -> (Arc<Relay>, Arc<Seen>) {
        let relay = Relay::new("srv");
        let seen = Arc::new(Seen::default());
        relay.attach(seen.clone());
        (relay, seen)
    }

    /// A request to the child for `operation`, sent on `connection` and claimed under `token`.
    async fn sent(
        relay: &Relay,
        operation: &str,
        tool: &str,
        arguments: &Value,
        connection: u64,
        token: i64,
    ) {
        let sending = relay.sending().await;
        sending.claim(operation, tool, arguments, connection, json!(token));
    }

    #[tokio::test]
    async fn identical_calls_of_two_operations_each_hear_only_their_own_request() {
        let (relay, seen) = attached();
        let args = json!({"subject": "printer"});
        let _a = relay.expect("slow", &args, Some("t:e:w:a"), Some(json!("host-a")));
        let _b = relay.expect("slow", &args, Some("t:e:w:b"), Some(json!("host-b")));
        // The second call reaches the child first: the order of arrival decides nothing.
        sent(&relay, "t:e:w:b", "slow", &args, 0, 0).await;
        sent(&relay, "t:e:w:a", "slow", &args, 0, 1).await;
        relay.progress(0, progress(1, 0.1)).await;
        relay.progress(0, progress(0, 0.2)).await;
        relay.progress(0, progress(1, 0.3)).await;
        assert_eq!(
            heard(&seen),
            [
                (json!("host-a"), json!(0.1)),
                (json!("host-b"), json!(0.2)),
                (json!("host-a"), json!(0.3)),
            ]
        );
    }

    #[tokio::test]
    async fn progress_reaches_a_host_call_only_while_it_waits_and_only_if_it_asked() {
        let (relay, seen) = attached();
        let args = json!({"n": 1});
        let waiting = relay.expect("slow", &args, Some("t:e:w:s"), Some(json!("host-7")));
        let silent = relay.expect("slow", &args, Some("t:e:w:quiet"), None);
        // A request of no announced operation, and one whose host asked for no progress.
        sent(&relay, "t:e:w:other", "slow", &args, 0, 1).await;
        sent(&relay, "t:e:w:quiet", "slow", &args, 0, 2).await;
        sent(&relay, "t:e:w:s", "slow", &args, 0, 3).await;
        for token in [1, 2, 3] {
            relay.progress(0, progress(token, 0.5)).await;
        }
        drop(waiting);
        drop(silent);
        relay.progress(0, progress(3, 1.0)).await;
        assert_eq!(heard(&seen), [(json!("host-7"), json!(0.5))]);
    }

    #[tokio::test]
    async fn a_token_of_a_dead_child_is_not_the_same_token_of_the_child_started_again() {
        let (relay, seen) = attached();
        let args = json!({});
        let _old = relay.expect("slow", &args, Some("t:e:w:old"), Some(json!("host-old")));
        let _new = relay.expect("slow", &args, Some("t:e:w:new"), Some(json!("host-new")));
        sent(&relay, "t:e:w:old", "slow", &args, 1, 0).await;
        // The new process's SDK counts from zero again.
        sent(&relay, "t:e:w:new", "slow", &args, 2, 0).await;
        relay.progress(2, progress(0, 0.5)).await;
        assert_eq!(heard(&seen), [(json!("host-new"), json!(0.5))]);
    }

    #[tokio::test]
    async fn host_calls_waiting_for_one_operation_all_hear_its_one_request() {
        let (relay, seen) = attached();
        let args = json!({});
        let _first = relay.expect("slow", &args, Some("t:e:w:s"), Some(json!("first")));
        let _again = relay.expect("slow", &args, Some("t:e:w:s"), Some(json!("again")));
        sent(&relay, "t:e:w:s", "slow", &args, 0, 4).await;
        relay.progress(0, progress(4, 0.5)).await;
        assert_eq!(
            heard(&seen),
            [(json!("first"), json!(0.5)), (json!("again"), json!(0.5))]
        );
    }

    #[tokio::test]
    async fn a_read_without_a_key_is_matched_by_tool_and_arguments_and_never_takes_a_keyed_call() {
        let (relay, seen) = attached();
        let args = json!({"number": 7});
        let _keyed = relay.expect("get", &args, Some("t:e:w:s"), Some(json!("keyed")));
        let _read = relay.expect("get", &args, None, Some(json!("read")));
        let _other = relay.expect("get", &json!({"number": 8}), None, Some(json!("other")));
        // The executor's own key for a read is unknown to the face.
        sent(&relay, "t:e:unkeyed:w.1", "get", &args, 0, 5).await;
        sent(&relay, "t:e:unkeyed:w.2", "get", &args, 0, 6).await;
        relay.progress(0, progress(5, 0.5)).await;
        relay.progress(0, progress(6, 0.5)).await;
        assert_eq!(heard(&seen), [(json!("read"), json!(0.5))]);
    }

    #[tokio::test]
    async fn progress_that_overtakes_the_claim_of_its_request_waits_for_it() {
        let (relay, seen) = attached();
        let args = json!({});
        let _route = relay.expect("fast", &args, Some("t:e:w:s"), Some(json!("host")));
        let sending = relay.sending().await;
        // The child answers with progress before the sender has claimed the token.
        let early = tokio::spawn({
            let relay = relay.clone();
            async move { relay.progress(0, progress(9, 0.5)).await }
        });
        tokio::task::yield_now().await;
        assert!(!early.is_finished());
        sending.claim("t:e:w:s", "fast", &args, 0, json!(9));
        early.await.unwrap();
        assert_eq!(heard(&seen), [(json!("host"), json!(0.5))]);
    }

    #[tokio::test]
    async fn a_request_before_any_host_is_an_error_naming_the_child() {
        let relay = Relay::new("python srv.py");
        let err = relay
            .ask("sampling/createMessage", json!({}))
            .await
            .unwrap_err();
        assert!(err.message.contains("python srv.py"), "{}", err.message);
        relay.attach(Arc::new(Seen::default()));
        assert_eq!(
            relay.ask("roots/list", json!({"a": 1})).await.unwrap(),
            json!({"a": 1})
        );
    }
}
