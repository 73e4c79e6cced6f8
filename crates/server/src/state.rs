//! The gateway's shared state: the one application assembly ([`idemgate_app::App`]) with what
//! only the HTTP face needs beside it (tokens, sessions, limits, webhooks), and the services
//! other faces mount into its router ([`Mount`]: the MCP face at `/mcp`).

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Body;
use axum::http::Request;
use axum::response::Response;
use idemgate_app::{App, Assembly, Recovery, ToolSet};
use idemgate_core::clock::Clock;
use idemgate_core::store::Store;
use idemgate_engine::{Executor, Recoverer, Settings};
use tower::util::BoxCloneSyncService;

use crate::auth::{Sessions, TokenSet, Tokens};
use crate::config::Limits;
use crate::metrics::{MeteredStore, OutcomeCounter, TimedDownstream};
use crate::problems::ProblemBase;

/// Everything a handler needs. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub app: App,
    /// The current tokens: `serve` replaces them on SIGHUP.
    pub tokens: TokenSet,
    /// The console's signed-in operators.
    pub sessions: Sessions,
    /// Whether the console's cookie is `Secure` (the gateway is reached over https).
    pub secure_cookies: bool,
    pub limits: Limits,
    /// The start of problem type URIs, when configured (`public_url`).
    pub problem_base: Option<ProblemBase>,
    pub webhooks: crate::webhooks::Sources,
    /// The reconciliation queue's gauge, counted in the background (started by the first
    /// scrape of `/metrics`).
    pub queue_gauge: crate::metrics::QueueGauge,
}

/// A service another face serves inside the gateway's router, under `path`: behind the same
/// access log and request-body bound as API v1, and told when the server drains. This is how
/// `idemgate serve` carries the MCP face at `/mcp` without this crate knowing MCP.
#[derive(Clone)]
pub struct Mount {
    pub path: String,
    pub service: BoxCloneSyncService<Request<Body>, Response, Infallible>,
    /// What the start banner calls it (`MCP (streamable HTTP, the same tokens)`).
    pub title: String,
    /// Called when the server stops accepting, before it drains: a service holding open
    /// streams ends them here.
    pub on_drain: Option<Arc<dyn Fn() + Send + Sync>>,
}

/// Assembles an [`AppState`]: the application's [`Assembly`] (store, tools, environment,
/// clock, executor settings, recovery), the tokens, and the HTTP face's own settings.
pub struct Gateway {
    assembly: Assembly,
    tokens: Tokens,
    limits: Limits,
    problem_base: Option<ProblemBase>,
    webhooks: crate::webhooks::Sources,
    sessions: Sessions,
    secure_cookies: bool,
    queue_gauge_every: std::time::Duration,
}

impl Gateway {
    /// A gateway over `store` and `tools` in the environment `development`.
    pub fn new(store: Arc<dyn Store>, tools: ToolSet, tokens: Tokens) -> Gateway {
        Gateway::over(Assembly::new(store, tools, "development"), tokens)
    }

    /// A gateway over an application assembly (`idemgate serve`: the configuration file's).
    pub fn over(assembly: Assembly, tokens: Tokens) -> Gateway {
        Gateway {
            assembly,
            tokens,
            limits: Limits::default(),
            problem_base: None,
            webhooks: crate::webhooks::Sources::default(),
            sessions: Sessions::default(),
            secure_cookies: false,
            queue_gauge_every: crate::metrics::QUEUE_GAUGE_EVERY,
        }
    }

    /// The console's sessions (default: [`crate::auth::SESSION_TTL`] long).
    pub fn sessions(mut self, sessions: Sessions) -> Gateway {
        self.sessions = sessions;
        self
    }

    /// Marks the console's session cookie `Secure`: set when the gateway is reached over https
    /// (`serve` sets it when `public_url` is an https URL).
    pub fn secure_cookies(mut self, secure: bool) -> Gateway {
        self.secure_cookies = secure;
        self
    }

    /// How often the reconciliation queue's gauge is counted (default
    /// [`crate::metrics::QUEUE_GAUGE_EVERY`]).
    pub fn queue_gauge_every(mut self, every: std::time::Duration) -> Gateway {
        self.queue_gauge_every = every;
        self
    }

    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Gateway {
        self.assembly = self.assembly.clock(clock);
        self
    }

    pub fn environment(mut self, environment: impl Into<String>) -> Gateway {
        self.assembly = self.assembly.environment(environment);
        self
    }

    /// The bounds on what a caller may send; `key_part_bytes` bounds every face's calls.
    pub fn limits(mut self, limits: Limits) -> Gateway {
        self.limits = limits;
        self
    }

    pub fn settings(mut self, settings: Settings) -> Gateway {
        self.assembly = self.assembly.settings(settings);
        self
    }

    /// The recoverer's intervals (`[recovery]`).
    pub fn recovery(mut self, recovery: Recovery) -> Gateway {
        self.assembly = self.assembly.recovery(recovery);
        self
    }

    /// Where this gateway is reached (`public_url`): problem types are
    /// `<public_url>/problems/<code>`. Without it, a served gateway uses its listen address
    /// (relative when it listens on every address) and a bare router relative references.
    pub fn public_url(mut self, base: Option<ProblemBase>) -> Gateway {
        self.problem_base = base;
        self
    }

    /// The webhook sources served at `POST /v1/webhooks/{source}`.
    pub fn webhooks(mut self, sources: crate::webhooks::Sources) -> Gateway {
        self.webhooks = sources;
        self
    }

    /// Assembles the app with the store and every downstream wrapped for metrics.
    pub fn build(self) -> AppState {
        // Install the recorder before the first metric is touched.
        let _ = crate::metrics::handle();
        let app = self
            .assembly
            .key_part_bytes(self.limits.key_part_bytes)
            .observer(Arc::new(OutcomeCounter))
            .wrap_store(|store| Arc::new(MeteredStore::new(store)))
            .map_downstreams(TimedDownstream::wrap)
            .build();
        AppState {
            inner: Arc::new(Inner {
                app,
                tokens: TokenSet::new(self.tokens),
                sessions: self.sessions,
                secure_cookies: self.secure_cookies,
                limits: self.limits,
                problem_base: self.problem_base,
                webhooks: self.webhooks,
                queue_gauge: crate::metrics::QueueGauge::new(self.queue_gauge_every),
            }),
        }
    }
}

impl AppState {
    pub(crate) fn inner(&self) -> &Inner {
        &self.inner
    }

    /// The application assembly this gateway serves.
    pub fn app(&self) -> &App {
        &self.inner.app
    }

    pub fn executor(&self) -> &Executor {
        self.inner.app.executor()
    }

    pub fn tools(&self) -> &Arc<ToolSet> {
        self.inner.app.tools()
    }

    /// The gateway's current tokens, replaceable while it runs (SIGHUP in `serve`).
    pub fn tokens(&self) -> &TokenSet {
        &self.inner.tokens
    }

    /// The bounds on what a caller may send.
    pub fn limits(&self) -> Limits {
        self.inner.limits
    }

    /// The environment part of every operation key this gateway makes.
    pub fn environment(&self) -> &str {
        self.inner.app.environment()
    }

    /// The background recoverer over this gateway's executor and tools.
    pub fn recoverer(&self) -> Recoverer {
        self.inner.app.recoverer()
    }
}
