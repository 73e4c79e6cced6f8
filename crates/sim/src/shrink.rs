//! Shrinking a failing schedule by its choice stream, in the manner of Hypothesis.
//!
//! A schedule is a function of its draws, and every draw's 0 is its tamest option, so a
//! smaller stream is a simpler schedule. The shrinker deletes spans of draws (large spans
//! first) and lowers single draws (to 0, then halves, then by one), keeping any variant that
//! still breaks the same invariant. A kept variant is replaced by the draws its replay actually
//! took, so every later step works on a real schedule. Variants are compared shortlex (fewer
//! draws, then smaller ones), which bounds the search; so does the attempt budget.

use std::cmp::Ordering;

/// Draws without the trailing zeros an exhausted stream would give anyway.
fn trimmed(draws: &[u64]) -> &[u64] {
    let end = draws.iter().rposition(|&v| v != 0).map_or(0, |i| i + 1);
    &draws[..end]
}

fn shortlex(a: &[u64], b: &[u64]) -> Ordering {
    let (a, b) = (trimmed(a), trimmed(b));
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

/// What shrinking found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shrunk {
    pub draws: Vec<u64>,
    /// Replays tried.
    pub attempts: usize,
}

/// Shrinks `failing`. `fails(candidate)` replays a candidate and answers the draws it took
/// when it still fails the same way, `None` otherwise.
pub fn shrink(
    failing: Vec<u64>,
    budget: usize,
    mut fails: impl FnMut(&[u64]) -> Option<Vec<u64>>,
) -> Shrunk {
    let mut best = trimmed(&failing).to_vec();
    let mut attempts = 0;
    let mut consider = |candidate: Vec<u64>, best: &mut Vec<u64>, attempts: &mut usize| -> bool {
        if *attempts >= budget || shortlex(&candidate, best) != Ordering::Less {
            return false;
        }
        *attempts += 1;
        match fails(&candidate) {
            Some(taken) if shortlex(&taken, best) == Ordering::Less => {
                *best = trimmed(&taken).to_vec();
                true
            }
            Some(_) | None => false,
        }
    };
    loop {
        let before = best.clone();
        // Delete spans, from half the stream down to single draws.
        let mut size = (best.len() / 2).max(1);
        loop {
            let mut i = 0;
            while i + size <= best.len() && attempts < budget {
                let mut candidate = best[..i].to_vec();
                candidate.extend_from_slice(&best[i + size..]);
                if !consider(candidate, &mut best, &mut attempts) {
                    i += size;
                }
            }
            if size == 1 {
                break;
            }
            size /= 2;
        }
        // Lower single draws.
        let mut i = 0;
        while i < best.len() && attempts < budget {
            let v = best[i];
            if v > 0 {
                for lower in [0, v / 2, v - 1] {
                    if lower < v {
                        let mut candidate = best.clone();
                        candidate[i] = lower;
                        if consider(candidate, &mut best, &mut attempts) {
                            break;
                        }
                    }
                }
            }
            i += 1;
        }
        if best == before || attempts >= budget {
            break;
        }
    }
    Shrunk {
        draws: best,
        attempts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::choices::Choices;

    /// A toy "schedule": it fails when it sees a draw of at least 5 followed, later, by a draw
    /// of at least 3 — like a fault that matters only if a crash comes after it.
    fn toy(draws: &[u64]) -> Option<Vec<u64>> {
        let mut c = Choices::replay(draws.to_vec());
        let n = 10 + c.choose(50);
        let mut armed = false;
        let mut failed = false;
        for _ in 0..n {
            let v = c.choose(10);
            if armed && v >= 3 {
                failed = true;
                break;
            }
            armed |= v >= 5;
        }
        failed.then(|| c.into_taken())
    }

    #[test]
    fn shrinks_to_the_two_draws_that_matter() {
        let mut seed = 0;
        let failing = loop {
            seed += 1;
            let mut c = Choices::seeded(seed);
            let draws: Vec<u64> = (0..61)
                .map(|i| c.choose(if i == 0 { 50 } else { 10 }))
                .collect();
            if toy(&draws).is_some() {
                break draws;
            }
        };
        let shrunk = shrink(failing, 10_000, toy);
        assert_eq!(shrunk.draws, [0, 5, 3]);
    }

    #[test]
    fn the_budget_bounds_the_attempts() {
        let failing = vec![9; 200];
        let shrunk = shrink(failing, 7, |d| (d.len() >= 100).then(|| d.to_vec()));
        assert_eq!(shrunk.attempts, 7);
    }
}
