//! Timing control: a named pause point shared between a test and the code under test.
//!
//! The code under test calls [`Gate::pass`] at the point of interest (after a claim, after a
//! downstream commit). An unarmed gate lets every pass through at once, so production-shaped
//! code can carry gates at no cost. A test arms the gate, waits with [`Gate::reached`] until a
//! task is blocked there, does whatever the race needs (let a second worker arrive and observe),
//! and then lets the blocked task go with [`Gate::release`] or [`Gate::release_one`]:
//!
//! ```
//! # use idemgate_conformance::gate::{Gate, bounded};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let gate = Gate::new("after_commit");
//! gate.arm_nth(1);
//! let worker = tokio::spawn({
//!     let gate = gate.clone();
//!     async move { gate.pass().await }
//! });
//! gate.reached().await; // worker A is paused at the point
//! // ... worker B arrives and observes here ...
//! gate.release();
//! bounded("worker A", worker).await.unwrap();
//! assert_eq!(gate.passes(), 1);
//! # }
//! ```
//!
//! Waiting on the test side is bounded ([`REACH_LIMIT`]) and panics with the gate's name, so a
//! broken scenario fails loudly instead of hanging CI. Waiting inside [`Gate::pass`] is not
//! bounded: a limit there would fire under `tokio::time::pause()` whenever a test sleeps past it
//! while deliberately holding a worker.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{oneshot, watch};

/// How long [`Gate::reached`] waits for a task to block at the gate before it panics.
pub const REACH_LIMIT: Duration = Duration::from_secs(10);

/// Awaits `future` for at most [`REACH_LIMIT`], panicking with `what` if it does not finish: for
/// a test joining a worker it released, so a worker that never comes back fails the test
/// instead of hanging it.
pub async fn bounded<F: IntoFuture>(what: &str, future: F) -> F::Output {
    match tokio::time::timeout(REACH_LIMIT, future).await {
        Ok(output) => output,
        Err(_) => panic!("{what}: did not finish within {REACH_LIMIT:?}"),
    }
}

/// A named pause point. Cheap to clone; every clone is the same gate.
#[derive(Clone)]
pub struct Gate {
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    // A std mutex, not a tokio one: it is held only for a few field updates and never across an
    // await, so it cannot block the runtime, and `Drop` of a waiting pass can take it.
    state: Mutex<State>,
    // Publishes the number of tasks blocked at the gate, so `reached` can wait for a count
    // without polling.
    blocked: watch::Sender<usize>,
}

struct State {
    arm: Arm,
    /// Calls to `pass` so far, blocked or not.
    arrivals: u64,
    /// Calls to `pass` that have returned (or are returning).
    passes: u64,
    /// Blocked tasks, oldest first: their arrival number and the sender that lets them go.
    waiting: VecDeque<(u64, oneshot::Sender<()>)>,
}

/// Which passes block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arm {
    Off,
    /// Every pass blocks until released.
    Every,
    /// Only the pass with this arrival number blocks; the gate disarms itself once it has.
    Arrival(u64),
}

impl Gate {
    /// An unarmed gate. The name appears in panics and `Debug` output.
    pub fn new(name: impl Into<String>) -> Gate {
        let (blocked, _) = watch::channel(0);
        Gate {
            inner: Arc::new(Inner {
                name: name.into(),
                state: Mutex::new(State {
                    arm: Arm::Off,
                    arrivals: 0,
                    passes: 0,
                    waiting: VecDeque::new(),
                }),
                blocked,
            }),
        }
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Called by the code under test at the pause point. Returns at once unless the gate is
    /// armed for this pass; then it waits until the test releases it.
    pub async fn pass(&self) {
        let (arrival, released) = {
            let mut state = self.lock();
            state.arrivals += 1;
            let arrival = state.arrivals;
            let blocks = match state.arm {
                Arm::Off => false,
                Arm::Every => true,
                Arm::Arrival(n) => n == arrival,
            };
            if !blocks {
                state.passes += 1;
                return;
            }
            if state.arm == Arm::Arrival(arrival) {
                state.arm = Arm::Off;
            }
            let (tx, rx) = oneshot::channel();
            state.waiting.push_back((arrival, tx));
            self.publish(&state);
            (arrival, rx)
        };
        // If the waiting task is cancelled (a timeout around the call, an aborted worker), the
        // guard takes it out of the queue so that `reached` does not count a task that is gone.
        let guard = Waiting {
            gate: self,
            arrival,
        };
        // A dropped sender also lets the task through: that only happens when the test
        // releases, because the queue owns the senders.
        let _ = released.await;
        // Once released the entry is already out of the queue, so the guard's removal is a
        // no-op here.
        drop(guard);
        self.lock().passes += 1;
    }

    /// Blocks every pass from now on, until [`release`](Gate::release) or
    /// [`disarm`](Gate::disarm).
    pub fn arm(&self) {
        self.lock().arm = Arm::Every;
    }

    /// Blocks only the `n`th pass from now (`1` is the next one); the gate disarms itself once
    /// that pass has blocked, so other workers pass freely.
    pub fn arm_nth(&self, n: u64) {
        assert!(n >= 1, "gate `{}`: arm_nth counts from 1", self.name());
        let mut state = self.lock();
        state.arm = Arm::Arrival(state.arrivals + n);
    }

    /// Stops blocking new passes. Tasks already blocked stay blocked until released.
    pub fn disarm(&self) {
        self.lock().arm = Arm::Off;
    }

    /// Disarms the gate and lets every blocked task through.
    pub fn release(&self) {
        let mut state = self.lock();
        state.arm = Arm::Off;
        let waiting = std::mem::take(&mut state.waiting);
        self.publish(&state);
        drop(state);
        for (_, tx) in waiting {
            let _ = tx.send(());
        }
    }

    /// Lets the longest-blocked task through and keeps the gate armed, so a test can release
    /// several workers in a chosen order. Panics if no task is blocked.
    pub fn release_one(&self) {
        let mut state = self.lock();
        let Some((_, tx)) = state.waiting.pop_front() else {
            panic!("gate `{}`: release_one with no task blocked", self.name());
        };
        self.publish(&state);
        drop(state);
        let _ = tx.send(());
    }

    /// Waits until at least one task is blocked at the gate. Panics after [`REACH_LIMIT`].
    pub async fn reached(&self) {
        self.reached_n_within(1, REACH_LIMIT).await;
    }

    /// Waits until at least `n` tasks are blocked at the gate. Panics after [`REACH_LIMIT`].
    pub async fn reached_n(&self, n: usize) {
        self.reached_n_within(n, REACH_LIMIT).await;
    }

    /// Waits until at least `n` tasks are blocked at the gate. Panics after `limit`, naming the
    /// gate and what it saw, so a scenario whose worker never gets here fails instead of hanging.
    pub async fn reached_n_within(&self, n: usize, limit: Duration) {
        let mut blocked = self.inner.blocked.subscribe();
        let waited = tokio::time::timeout(limit, blocked.wait_for(|count| *count >= n)).await;
        match waited {
            Ok(Ok(_)) => {}
            // The sender lives in `Inner`, which this handle keeps alive.
            Ok(Err(_)) => unreachable!("gate `{}` lost its sender", self.name()),
            Err(_) => {
                let state = self.lock();
                panic!(
                    "gate `{}`: waited {limit:?} for {n} task(s) to block, but {} did \
                     ({} arrival(s), {} pass(es), armed: {:?})",
                    self.name(),
                    state.waiting.len(),
                    state.arrivals,
                    state.passes,
                    state.arm,
                );
            }
        }
    }

    /// Tasks blocked at the gate right now.
    pub fn blocked(&self) -> usize {
        self.lock().waiting.len()
    }

    /// Calls to [`pass`](Gate::pass) so far, including those still blocked.
    pub fn arrivals(&self) -> u64 {
        self.lock().arrivals
    }

    /// Calls to [`pass`](Gate::pass) that got through.
    pub fn passes(&self) -> u64 {
        self.lock().passes
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain counters behind, still meaningful; the
        // test that panicked reports itself.
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn publish(&self, state: &State) {
        self.inner.blocked.send_replace(state.waiting.len());
    }
}

/// Removes a cancelled pass from the queue.
struct Waiting<'a> {
    gate: &'a Gate,
    arrival: u64,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut state = self.gate.lock();
        state
            .waiting
            .retain(|(arrival, _)| *arrival != self.arrival);
        self.gate.publish(&state);
    }
}

impl Default for Gate {
    fn default() -> Gate {
        Gate::new("gate")
    }
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("Gate")
            .field("name", &self.inner.name)
            .field("arm", &state.arm)
            .field("arrivals", &state.arrivals)
            .field("passes", &state.passes)
            .field("blocked", &state.waiting.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex as StdMutex;

    use super::*;

    /// Spawns a worker that passes the gate and then writes its name into `log`.
    fn worker(
        gate: &Gate,
        log: &Arc<StdMutex<Vec<&'static str>>>,
        name: &'static str,
    ) -> tokio::task::JoinHandle<()> {
        let gate = gate.clone();
        let log = log.clone();
        tokio::spawn(async move {
            gate.pass().await;
            log.lock().unwrap().push(name);
        })
    }

    #[tokio::test]
    async fn unarmed_gate_lets_everyone_through() {
        let gate = Gate::new("open");
        gate.pass().await;
        gate.pass().await;
        assert_eq!((gate.arrivals(), gate.passes(), gate.blocked()), (2, 2, 0));
    }

    #[tokio::test]
    async fn armed_gate_blocks_until_released() {
        let gate = Gate::new("g");
        gate.arm();
        let log = Arc::new(StdMutex::new(Vec::new()));
        let a = worker(&gate, &log, "a");
        gate.reached().await;
        // Give the blocked task every chance to run: it must still be waiting.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(log.lock().unwrap().is_empty());
        assert_eq!(gate.passes(), 0);
        gate.release();
        bounded("worker a", a).await.unwrap();
        assert_eq!(*log.lock().unwrap(), ["a"]);
        assert_eq!(gate.passes(), 1);
        // Released means disarmed: the next pass goes straight through.
        gate.pass().await;
        assert_eq!(gate.passes(), 2);
    }

    #[tokio::test]
    async fn release_one_lets_workers_go_in_arrival_order() {
        let gate = Gate::new("g");
        gate.arm();
        let log = Arc::new(StdMutex::new(Vec::new()));
        let a = worker(&gate, &log, "a");
        gate.reached_n(1).await;
        let b = worker(&gate, &log, "b");
        gate.reached_n(2).await;
        gate.release_one();
        bounded("worker a", a).await.unwrap();
        assert_eq!(*log.lock().unwrap(), ["a"]);
        assert_eq!(gate.blocked(), 1);
        gate.release_one();
        bounded("worker b", b).await.unwrap();
        assert_eq!(*log.lock().unwrap(), ["a", "b"]);
    }

    #[tokio::test]
    async fn arm_nth_blocks_only_that_pass() {
        let gate = Gate::new("g");
        gate.pass().await; // before arming: not counted by arm_nth
        gate.arm_nth(2);
        gate.pass().await; // the first pass from now goes through
        let log = Arc::new(StdMutex::new(Vec::new()));
        let second = worker(&gate, &log, "second");
        gate.reached().await;
        // The gate disarmed itself: a third pass is not held behind the second.
        gate.pass().await;
        assert_eq!(gate.blocked(), 1);
        assert!(log.lock().unwrap().is_empty());
        gate.release();
        bounded("second", second).await.unwrap();
        assert_eq!((gate.arrivals(), gate.passes()), (4, 4));
    }

    #[tokio::test]
    async fn cancelled_pass_leaves_the_queue() {
        let gate = Gate::new("g");
        gate.arm();
        let held = tokio::spawn({
            let gate = gate.clone();
            async move { gate.pass().await }
        });
        gate.reached().await;
        held.abort();
        assert!(bounded("aborted", held).await.unwrap_err().is_cancelled());
        assert_eq!(gate.blocked(), 0);
        assert_eq!(gate.passes(), 0);
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "stuck worker: did not finish within 10s")]
    async fn bounded_join_times_out_loudly() {
        let gate = Gate::new("g");
        gate.arm();
        let stuck = tokio::spawn({
            let gate = gate.clone();
            async move { gate.pass().await }
        });
        let _ = bounded("stuck worker", stuck).await;
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "gate `never`: waited 10s for 1 task(s) to block, but 0 did")]
    async fn reached_times_out_loudly() {
        let gate = Gate::new("never");
        gate.arm();
        gate.reached().await;
    }
}
