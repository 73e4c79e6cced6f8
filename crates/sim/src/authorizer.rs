//! [`SimAuthorizer`]: the authorization oracle.
//!
//! The system of record's view of who may act: a set of revoked actors that scheduler actions
//! toggle ([`History::revoked`](crate::history::History::revoked)). Every decision is logged
//! with the task that asked, so the checker can tell whether a send had a fresh `Allowed` of its
//! own. Sometimes the hook cannot answer (`Unavailable`), and the executor must fail closed.

use std::sync::Arc;

use idemgate_core::effect::{AuthRequest, AuthStage, Authorization, Authorizer};
use idemgate_core::store::BoxFuture;

use crate::history::{Decision, Verdict};
use crate::runtime::{Point, Sim, current, yield_point};

pub struct SimAuthorizer {
    sim: Arc<Sim>,
}

impl SimAuthorizer {
    pub fn new(sim: Arc<Sim>) -> SimAuthorizer {
        SimAuthorizer { sim }
    }
}

impl Authorizer for SimAuthorizer {
    fn authorize<'a>(&'a self, request: AuthRequest<'a>) -> BoxFuture<'a, Authorization> {
        Box::pin(async move {
            yield_point(&self.sim, Point::BeforeAuthorize).await;
            let mut s = self.sim.lock();
            let verdict = if s.history.revoked.contains(request.actor) {
                Verdict::Denied
            } else if s.fault(30) == 29 {
                Verdict::Unavailable
            } else {
                Verdict::Allowed
            };
            let seq = s.history.next_seq();
            let step = s.step;
            s.history.decisions.push(Decision {
                seq,
                step,
                task: current().map_or(0, |c| c.task),
                key: request.key.cloned(),
                actor: request.actor.to_string(),
                stage: request.stage,
                verdict,
            });
            s.note(|| {
                format!(
                    "authorize {} {} {}: {verdict:?}",
                    request.actor,
                    request.key.map_or("(no key)", |k| k.as_str()),
                    match request.stage {
                        AuthStage::BeforeEffect => "before effect",
                        AuthStage::BeforeReplay => "before replay",
                    }
                )
            });
            match verdict {
                Verdict::Allowed => Authorization::Allowed,
                Verdict::Denied => Authorization::Denied("simulated: actor revoked".into()),
                Verdict::Unavailable => Authorization::Unavailable("simulated: hook down".into()),
            }
        })
    }
}
