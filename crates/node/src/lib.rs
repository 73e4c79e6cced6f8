//! idemgate's engine inside a Node program: the native addon of the `idemgate` npm package
//! (clients/typescript), loaded by its `idemgate/local` entry point alone. The TypeScript
//! module `src/local.ts` is the public face — `Local`, `local.tool`, `workflow` / `step` — and
//! this addon is the thin layer under it: a face over `idemgate-app` that converts arguments
//! and maps errors, and decides nothing about claims, fences, recovery or labels.
//!
//! Reading order:
//!
//! - [`local::NativeLocal`] — one [`idemgate_app::App`] over one store (`sqlite://PATH` or
//!   `postgres://…`, in the gateway's schema): `register` a tool, `invoke` it, read and list
//!   operations, and the operator's actions; each answers a promise at once.
//! - [`effect`] — a tool's JavaScript functions as the engine's `Downstream`, called through
//!   Node-API thread-safe functions and their promises awaited by the calling future; a panic or a
//!   JavaScript exception never crosses into the engine as anything but an answer the engine
//!   classifies.
//! - [`spec`] — a tool's contract from `local.tool`'s options or a contract file.
//! - [`event_loop`] — a call's future polled on Node's event loop itself, woken by the store's
//!   writer thread and the runtime's timers.
//! - [`runtime`] — the process's one tokio runtime and the promises JavaScript awaits on it
//!   (the operator's methods and reads).

mod effect;
mod event_loop;
mod local;
mod runtime;
mod spec;
