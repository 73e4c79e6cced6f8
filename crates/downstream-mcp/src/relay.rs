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
//! child. So the MCP face announces the call first ([`Relay::expect`]: tool, arguments and
//! the host's token); the child's `tools/call` for that tool and arguments takes the
//! announcement ([`Relay::claim`]) and its own progress token (the SDK's, one per request) is
//! mapped to the host's. A progress notification under an unmapped token, or after the host
//! stopped waiting, is dropped: the host must not see progress for a request it did not make.
//! Two identical calls running at once take one announcement each; which one a progress
//! notification reaches does not matter, they are the same call.

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

/// One announced call of the host.
struct Route {
    tool: String,
    arguments: Value,
    host_token: Value,
    /// The child's progress token, once a call to the child took this route.
    child_token: Option<Value>,
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

impl Relay {
    pub fn new(child: impl Into<String>) -> Arc<Relay> {
        Arc::new(Relay {
            child: child.into(),
            host: RwLock::new(None),
            routes: Mutex::new(Routes::default()),
            tools_changed: watch::Sender::new(0),
        })
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

    /// The host's call of `tool` with `arguments` waits, with progress under `host_token`.
    pub fn expect(
        self: &Arc<Self>,
        tool: &str,
        arguments: &Value,
        host_token: Value,
    ) -> RouteGuard {
        let mut routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
        routes.next += 1;
        let id = routes.next;
        routes.routes.insert(
            id,
            Route {
                tool: tool.to_string(),
                arguments: arguments.clone(),
                host_token,
                child_token: None,
            },
        );
        RouteGuard {
            relay: self.clone(),
            id,
        }
    }

    /// The child's call of `tool` with `arguments` goes out under `child_token`: it takes the
    /// oldest announcement of that call not yet taken, if any.
    pub fn claim(&self, tool: &str, arguments: &Value, child_token: Value) {
        let mut routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(route) = routes
            .routes
            .values_mut()
            .find(|r| r.child_token.is_none() && r.tool == tool && r.arguments == *arguments)
        {
            route.child_token = Some(child_token);
        }
    }

    /// A progress notification of the child: passed on under the host's token, or dropped.
    pub fn progress(&self, mut params: Value) {
        let host_token = {
            let routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
            let token = params.get("progressToken");
            routes
                .routes
                .values()
                .find(|r| r.child_token.is_some() && r.child_token.as_ref() == token)
                .map(|r| r.host_token.clone())
        };
        match host_token {
            Some(token) => {
                params["progressToken"] = token;
                self.notify("notifications/progress", params);
            }
            None => {
                tracing::debug!(child = %self.child, "progress for no waiting request; dropped")
            }
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

    #[test]
    fn progress_reaches_the_waiting_host_request_under_its_token_and_only_while_it_waits() {
        let relay = Relay::new("srv");
        let seen = Arc::new(Seen::default());
        relay.attach(seen.clone());
        let args = json!({"n": 1});
        let guard = relay.expect("slow", &args, json!("host-7"));
        // Another call's token is not this one's.
        relay.claim("slow", &json!({"n": 2}), json!(1));
        relay.progress(json!({"progressToken": 1, "progress": 0.5}));
        relay.claim("slow", &args, json!(2));
        relay.progress(json!({"progressToken": 2, "progress": 0.5}));
        drop(guard);
        relay.progress(json!({"progressToken": 2, "progress": 1.0}));
        let seen = seen.0.lock().unwrap();
        assert_eq!(
            *seen,
            [(
                "notifications/progress".to_string(),
                json!({"progressToken": "host-7", "progress": 0.5})
            )]
        );
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
