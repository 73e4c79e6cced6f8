//! Defects put back on purpose into a recorded history: one mutation per check, each the
//! trace a real defect of that class leaves. The self-test runs the checker on every mutated
//! copy and requires each to be caught by its own check.

use crate::check::Check;
use crate::history::Entry;

/// The mutated copy of `entries` that should fire `check`, or `None` when the history has
/// nothing to mutate for it (no effect, no success answer, no final read).
pub fn mutate(entries: &[Entry], check: Check) -> Option<Vec<Entry>> {
    let mut out = entries.to_vec();
    let has_finals = entries.iter().any(|e| matches!(e, Entry::Final { .. }));
    // A key with an effect and an `applied`/`replayed` answer naming it.
    let success = entries.iter().find_map(|e| match e {
        Entry::Answer {
            key,
            outcome: Some(o),
            reference: Some(_),
            ..
        } if o == "applied" || o == "replayed" => Some(key.clone()),
        _ => None,
    });
    match check {
        // A downstream (or a gateway resending to one that does not deduplicate) performed
        // the operation a second time.
        Check::DuplicateEffect => {
            let (i, e) = entries
                .iter()
                .enumerate()
                .find(|(_, e)| matches!(e, Entry::Effect { .. }))?;
            let Entry::Effect {
                at,
                tool,
                key,
                reference,
            } = e.clone()
            else {
                return None;
            };
            out.insert(
                i + 1,
                Entry::Effect {
                    at,
                    tool,
                    key,
                    reference: format!("{reference}-again"),
                },
            );
        }
        // An event of another tool's job (item 1 of issue 31) finished the operation with a
        // reference that is not its effect's.
        Check::WrongReference => {
            let answer = out.iter_mut().find(|e| {
                matches!(e, Entry::Answer { outcome: Some(o), reference: Some(_), .. }
                    if o == "applied" || o == "replayed")
            })?;
            if let Entry::Answer { reference, .. } = answer {
                *reference = Some("another-tools-job".into());
            }
        }
        // A refusal built by hand (item 2 of issue 31) said `safe_to_repeat` for a key that
        // had its effect.
        Check::UnsafeRepeat => {
            let key = success?;
            out.push(Entry::Answer {
                at: u64::MAX,
                call: u64::MAX,
                key,
                outcome: Some("rejected".into()),
                reference: None,
                safe_to_repeat: Some(true),
                code: Some("invalid_arguments".into()),
                error: None,
            });
        }
        // A delivery stopped at `unknown` although nothing of it reached the downstream.
        Check::NeedlessUnknown => {
            let key = "h:hist:mutant-never-sent:step".to_string();
            out.push(Entry::Invoke {
                at: u64::MAX,
                call: u64::MAX,
                client: 0,
                face: "http".into(),
                gateway: 0,
                tool: "h.lookup".into(),
                key: key.clone(),
            });
            out.push(Entry::Answer {
                at: u64::MAX,
                call: u64::MAX,
                key: key.clone(),
                outcome: Some("unknown".into()),
                reference: None,
                safe_to_repeat: Some(false),
                code: Some("outcome_unknown".into()),
                error: None,
            });
            if has_finals {
                out.push(Entry::Final {
                    at: u64::MAX,
                    key,
                    outcome: Some("rejected".into()),
                    reference: None,
                    error: None,
                });
            }
        }
        // A claim whose owner died and that no recoverer took over.
        Check::Unsettled => {
            let last = out
                .iter_mut()
                .rev()
                .find(|e| matches!(e, Entry::Final { .. }))?;
            if let Entry::Final {
                outcome,
                reference,
                error,
                ..
            } = last
            {
                *outcome = Some("in_flight".into());
                *reference = None;
                *error = None;
            }
        }
        // The store lost a committed receipt (an asynchronous standby promoted).
        Check::RecordLost => {
            let key = success?;
            let last = out
                .iter_mut()
                .rev()
                .find(|e| matches!(e, Entry::Final { key: k, .. } if *k == key))?;
            if let Entry::Final {
                outcome,
                reference,
                error,
                ..
            } = last
            {
                *outcome = None;
                *reference = None;
                *error = Some("no record".into());
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::check;

    fn clean() -> Vec<Entry> {
        let key = "h:hist:w:s".to_string();
        vec![
            Entry::Invoke {
                at: 0,
                call: 0,
                client: 0,
                face: "mcp".into(),
                gateway: 1,
                tool: "h.dedup".into(),
                key: key.clone(),
            },
            Entry::Arrival {
                at: 1,
                tool: "h.dedup".into(),
                key: key.clone(),
                fault: "lost".into(),
            },
            Entry::Effect {
                at: 1,
                tool: "h.dedup".into(),
                key: key.clone(),
                reference: "dedup-1".into(),
            },
            Entry::Answer {
                at: 2,
                call: 0,
                key: key.clone(),
                outcome: Some("applied".into()),
                reference: Some("dedup-1".into()),
                safe_to_repeat: Some(false),
                code: None,
                error: None,
            },
            Entry::Final {
                at: 3,
                key,
                outcome: Some("replayed".into()),
                reference: Some("dedup-1".into()),
                error: None,
            },
        ]
    }

    #[test]
    fn each_mutation_is_caught_by_its_own_check_only() {
        let h = clean();
        assert!(check(&h).ok());
        for c in Check::ALL {
            let mutated = mutate(&h, c).unwrap_or_else(|| panic!("no mutation for {c:?}"));
            let fired: Vec<Check> = check(&mutated).fired().into_iter().collect();
            assert_eq!(fired, [c], "mutation for {}", c.name());
        }
    }
}
