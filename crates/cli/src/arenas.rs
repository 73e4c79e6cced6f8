//! How many malloc arenas the process may use.
//!
//! glibc's allocator gives a thread that finds the arenas in use by others a new one, up to
//! eight per core, and memory freed into one arena is not reused by the others. The gateway's
//! threads come and go (the runtime's workers hand their place to a fresh thread whenever one
//! commits a SQLite write itself, see `block_in_place` in the SQLite store; the writer, the log
//! and the metrics threads run beside them), so under load the same allocations spread over a
//! dozen arenas, each holding its own free pages. Two arenas hold the same work: measured with
//! `../shared/bench-peers/idemgate_memory.sh 60 32` (default configuration, 32-way unique load),
//! 81 MB RSS with glibc's default against 66 MB with two arenas after ~190k effects
//! (docs/benchmarks/history.md, "The default gateway's memory").
//!
//! Since then the Rust side allocates with mimalloc (the binary's global allocator, `main.rs`);
//! glibc's malloc still serves the C code linked in — SQLite's page caches and statements
//! above all — from the same threads, so the bound still applies to it.
//!
//! An operator's own `MALLOC_ARENA_MAX` wins: glibc has read it before `main`, and it is left
//! alone. Other allocators and other C libraries are not touched.

/// The arenas the process keeps: one per core of the machine the benchmarks ran on.
const ARENAS: i32 = 2;

/// Limits glibc's malloc to [`ARENAS`] arenas unless `MALLOC_ARENA_MAX` is set. Called first in
/// `main`, before any other thread exists.
pub fn limit() {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only sets an allocator parameter; it is called before any other thread
    // runs, and a refused value (a return of 0) leaves glibc's default in place.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, ARENAS);
    }
}
