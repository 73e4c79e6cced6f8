//! The gateway's shared state: the one application assembly ([`idemgate_app::App`]) with what
//! only the HTTP face needs beside it (tokens, sessions, limits, `/mcp`'s settings, webhooks).

use std::sync::Arc;

use idemgate_app::{App, Assembly, Recovery, ToolSet};
use idemgate_core::clock::{Clock, SystemClock};
use idemgate_core::store::Store;
use idemgate_engine::{Executor, Recoverer, Settings};

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
    /// Accepted `Host` values at `/mcp`.
    pub mcp_hosts: Vec<String>,
    /// How `/mcp` names a call without `_meta` (`[mcp] identity`).
    pub mcp_identity: idemgate_core::contract::Identity,
    /// The start of problem type URIs, when configured (`public_url`).
    pub problem_base: Option<ProblemBase>,
    pub webhooks: crate::webhooks::Sources,
}

/// Assembles an [`AppState`]: the store, the tools, the tokens, and optionally a clock, an
/// environment name, limits and executor settings.
pub struct Gateway {
    store: Arc<dyn Store>,
    tools: ToolSet,
    tokens: Tokens,
    clock: Arc<dyn Clock>,
    environment: String,
    limits: Limits,
    settings: Settings,
    recovery: Recovery,
    mcp_hosts: Vec<String>,
    mcp_identity: idemgate_core::contract::Identity,
    problem_base: Option<ProblemBase>,
    webhooks: crate::webhooks::Sources,
    sessions: Sessions,
    secure_cookies: bool,
}

impl Gateway {
    pub fn new(store: Arc<dyn Store>, tools: ToolSet, tokens: Tokens) -> Gateway {
        Gateway {
            store,
            tools,
            tokens,
            clock: Arc::new(SystemClock),
            environment: "development".into(),
            limits: Limits::default(),
            settings: Settings::default(),
            recovery: Recovery::default(),
            mcp_hosts: crate::config::McpConfig::default().hosts(
                crate::config::DEFAULT_LISTEN
                    .parse()
                    .expect("the default address parses"),
            ),
            mcp_identity: Default::default(),
            problem_base: None,
            webhooks: crate::webhooks::Sources::default(),
            sessions: Sessions::default(),
            secure_cookies: false,
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

    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Gateway {
        self.clock = clock;
        self
    }

    pub fn environment(mut self, environment: impl Into<String>) -> Gateway {
        self.environment = environment.into();
        self
    }

    pub fn limits(mut self, limits: Limits) -> Gateway {
        self.limits = limits;
        self
    }

    pub fn settings(mut self, settings: Settings) -> Gateway {
        self.settings = settings;
        self
    }

    /// The recoverer's intervals (`[recovery]`).
    pub fn recovery(mut self, recovery: Recovery) -> Gateway {
        self.recovery = recovery;
        self
    }

    /// The `Host` header values `/mcp` accepts (default: the loopback names). An empty list
    /// accepts any host.
    pub fn mcp_allowed_hosts(mut self, hosts: Vec<String>) -> Gateway {
        self.mcp_hosts = hosts;
        self
    }

    /// How `/mcp` names a call without `_meta` (default `meta`: such a key-based call is
    /// rejected); a contract's own `identity` wins.
    pub fn mcp_identity(mut self, identity: idemgate_core::contract::Identity) -> Gateway {
        self.mcp_identity = identity;
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
        let app = Assembly::new(self.store, self.tools, self.environment)
            .clock(self.clock)
            .settings(self.settings)
            .recovery(self.recovery)
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
                mcp_hosts: self.mcp_hosts,
                mcp_identity: self.mcp_identity,
                problem_base: self.problem_base,
                webhooks: self.webhooks,
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

    /// The environment part of every operation key this gateway makes.
    pub fn environment(&self) -> &str {
        self.inner.app.environment()
    }

    /// The background recoverer over this gateway's executor and tools.
    pub fn recoverer(&self) -> Recoverer {
        self.inner.app.recoverer()
    }
}
