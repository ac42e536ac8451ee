//! The shared conformance vectors against the in-process store. (Against the bare models:
//! the crate's unit tests, `src/algorithm/vectors.rs`; against Lua: `tests/redis/store.rs`.)

#[path = "support/mod.rs"]
mod support;

use support::vectors::{load_all, run_on_store};
use tollgate::store::MemoryStore;

/// Every shared test vector holds for the memory store.
#[tokio::test]
async fn vectors_hold_for_memory_store() {
    let all = load_all();
    for (file, scenario) in &all {
        run_on_store(file, scenario, MemoryStore::with_clock).await;
    }
    assert!(all.len() >= 60, "only {} scenarios", all.len());
}
