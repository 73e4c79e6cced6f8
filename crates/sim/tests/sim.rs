//! The simulation as tests: `sim` explores (or replays one schedule), and
//! `same_seed_same_trace` holds the simulator to its determinism.

use idemgate_sim::explore;

#[test]
fn sim() {
    idemgate_sim::main_from_env();
}

#[test]
fn same_seed_same_trace() {
    let catalog = idemgate_sim::workload::Catalog::new();
    for seed in [1, 2, 3, 0xfeed] {
        let seed = explore::mix(seed);
        for kind in idemgate_sim::explore::stores() {
            let a = explore::run(
                &catalog,
                kind,
                idemgate_sim::choices::Choices::seeded(seed),
                true,
            );
            let b = explore::run(
                &catalog,
                kind,
                idemgate_sim::choices::Choices::seeded(seed),
                true,
            );
            assert!(a.trace.len() > 10, "a schedule has a trace");
            assert_eq!(a.trace, b.trace, "seed {seed} on {kind:?}");
            assert_eq!(a.draws, b.draws);
            // The recorded draws replay the same schedule.
            let c = explore::run(
                &catalog,
                kind,
                idemgate_sim::choices::Choices::replay(a.draws.clone()),
                true,
            );
            assert_eq!(a.trace, c.trace, "replay of seed {seed}");
        }
    }
}

/// Schedules the exploration once failed on, kept as they were found (seed and store), so the
/// fix stays. Each names the defect it found.
#[test]
fn found_schedules_stay_fixed() {
    use idemgate_sim::world::StoreKind;
    let catalog = idemgate_sim::workload::Catalog::new();
    let found: [(u64, StoreKind, &str); 3] = [
        (
            2851466356289463936,
            StoreKind::Mem,
            "an operator's receipt lookup settled a record under a live claim, whose owner then \
             sent a second effect",
        ),
        (
            7799159888323430342,
            StoreKind::Mem,
            "a release after a 429 whose write failed answered safe_to_repeat, while a takeover \
             of the expired lease had sent the effect",
        ),
        (
            7111195616907717410,
            StoreKind::Mem,
            "a worker paused through the purge of its key's tombstone wrote, then sent, under the \
             key's next claim, which had the same fence and status: two effects in one life",
        ),
    ];
    for (seed, kind, defect) in found {
        let run = explore::run(
            &catalog,
            kind,
            idemgate_sim::choices::Choices::seeded(seed),
            false,
        );
        assert!(
            run.violation.is_none(),
            "seed {seed} on {kind:?} ({defect}): {:?}",
            run.violation
        );
    }
}
