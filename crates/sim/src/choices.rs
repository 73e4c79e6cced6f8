//! [`Choices`]: the one source of every decision a schedule makes.
//!
//! A schedule is a function of its choice stream. In generation the stream comes from a seeded
//! RNG and every draw is recorded; in shrinking a recorded list is replayed, and once it runs
//! out every draw is 0. Every caller orders its options so that 0 is the unremarkable one (no
//! fault, no crash, the shortest delay, the first runnable task), so deleting draws or lowering
//! them makes a schedule tamer, never stranger: that is what lets the shrinker work on the
//! stream without knowing what any draw meant.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

enum Source {
    Seeded(SmallRng),
    Replay { draws: Vec<u64>, at: usize },
}

/// A stream of bounded draws, recorded as taken.
pub struct Choices {
    source: Source,
    /// Every draw as it was answered (already reduced below its bound).
    taken: Vec<u64>,
    /// Whether the schedule plays keys' next lives (see [`Choices::with_lives`]).
    lives: bool,
}

impl Choices {
    pub fn seeded(seed: u64) -> Choices {
        Choices {
            source: Source::Seeded(SmallRng::seed_from_u64(seed)),
            taken: Vec::new(),
            lives: false,
        }
    }

    pub fn replay(draws: Vec<u64>) -> Choices {
        Choices {
            source: Source::Replay { draws, at: 0 },
            taken: Vec::new(),
            lives: false,
        }
    }

    /// Lets the schedule play a key's next life: a delivery now and then picks a key a sweep
    /// purged (a workflow resumed after the key's retention), a delivery's task may be held at
    /// a write or a send until its key has been purged and claimed again (a worker paused
    /// through the whole of its key's retention), and the downstreams forget a key when its
    /// record is purged (they remember keys no longer than idemgate does, as docs/lifecycle.md
    /// asks). A choice of the schedule, not of the stream, so that a stream recorded without it
    /// (the kept schedules of `found_schedules_stay_fixed`) replays as it was found;
    /// explorations turn it on.
    pub fn with_lives(mut self, on: bool) -> Choices {
        self.lives = on;
        self
    }

    pub fn lives(&self) -> bool {
        self.lives
    }

    /// A value below `n`. A bound of 0 or 1 leaves no choice and draws nothing, so such calls
    /// never shift the draws after them.
    pub fn choose(&mut self, n: u64) -> u64 {
        if n <= 1 {
            return 0;
        }
        let value = match &mut self.source {
            Source::Seeded(rng) => rng.random_range(0..n),
            Source::Replay { draws, at } => {
                let v = draws.get(*at).copied().unwrap_or(0) % n;
                *at += 1;
                v
            }
        };
        self.taken.push(value);
        value
    }

    /// An index below `len` (0 for an empty or one-element list).
    pub fn pick(&mut self, len: usize) -> usize {
        self.choose(len as u64) as usize
    }

    /// True with about `percent` in a hundred; a draw of 0 is always false.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.choose(100) >= 100 - percent.min(100)
    }

    /// Whether a replayed stream has run out (a seeded one never does).
    pub fn exhausted(&self) -> bool {
        match &self.source {
            Source::Seeded(_) => false,
            Source::Replay { draws, at } => *at >= draws.len(),
        }
    }

    /// The draws taken so far, as a replay would need them.
    pub fn taken(&self) -> &[u64] {
        &self.taken
    }

    pub fn into_taken(self) -> Vec<u64> {
        self.taken
    }
}

/// The printed form of a draw list: decimal values joined by `.`, with a run of zeros written
/// `0xN`, trailing zeros dropped (an exhausted stream answers 0 anyway).
pub fn encode(draws: &[u64]) -> String {
    let end = draws.iter().rposition(|&v| v != 0).map_or(0, |i| i + 1);
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < end {
        if draws[i] == 0 {
            let run = draws[i..end].iter().take_while(|&&v| v == 0).count();
            parts.push(if run == 1 {
                "0".into()
            } else {
                format!("0x{run}")
            });
            i += run;
        } else {
            parts.push(draws[i].to_string());
            i += 1;
        }
    }
    parts.join(".")
}

/// Reads what [`encode`] wrote.
pub fn decode(text: &str) -> Result<Vec<u64>, String> {
    let mut out = Vec::new();
    for part in text.trim().split('.').filter(|p| !p.is_empty()) {
        if let Some(run) = part.strip_prefix("0x") {
            let n: usize = run
                .parse()
                .map_err(|_| format!("`{part}` is not a run of zeros such as 0x12"))?;
            out.extend(std::iter::repeat_n(0, n));
        } else {
            out.push(
                part.parse()
                    .map_err(|_| format!("`{part}` is not a draw (a decimal number)"))?,
            );
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_the_same_draws_and_a_replay_repeats_them() {
        let draw = |c: &mut Choices| (0..50).map(|i| c.choose(i % 7 + 2)).collect::<Vec<_>>();
        let mut a = Choices::seeded(7);
        let mut b = Choices::seeded(7);
        let first = draw(&mut a);
        assert_eq!(first, draw(&mut b));
        let mut again = Choices::replay(a.taken().to_vec());
        assert_eq!(draw(&mut again), first);
        assert_eq!(again.taken(), a.taken());
    }

    #[test]
    fn an_exhausted_replay_answers_zero_and_bounds_reduce() {
        let mut c = Choices::replay(vec![9, 5]);
        assert_eq!(c.choose(4), 1);
        assert_eq!(c.choose(10), 5);
        assert!(c.exhausted());
        assert_eq!(c.choose(10), 0);
        assert_eq!(c.choose(1), 0);
        assert_eq!(c.taken(), [1, 5, 0]);
        assert!(!c.chance(50));
    }

    #[test]
    fn encoding_round_trips_and_drops_trailing_zeros() {
        let draws = vec![3, 0, 0, 0, 17, 0, 2, 0, 0];
        let text = encode(&draws);
        assert_eq!(text, "3.0x3.17.0.2");
        assert_eq!(decode(&text).unwrap(), draws[..7]);
        assert_eq!(encode(&[0, 0]), "");
        assert_eq!(decode("").unwrap(), Vec::<u64>::new());
        assert!(decode("1.x").is_err());
    }
}
