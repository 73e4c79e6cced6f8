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
