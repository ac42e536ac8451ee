//! The shared conformance vectors against every model and the in-process store.

mod common;

use common::vectors::{load_all, run_on_model, run_on_store, runs_on_model};
use tollgate::MemoryStore;

#[test]
fn vectors_hold_for_the_pure_models() {
    let all = load_all();
    let mut ran = 0;
    for (file, scenario) in &all {
        if runs_on_model(scenario) {
            run_on_model(file, scenario);
            ran += 1;
        }
    }
    assert!(
        ran >= 40,
        "only {ran} single-rule scenarios ran on the models"
    );
}

#[tokio::test]
async fn vectors_hold_for_memory_store() {
    let all = load_all();
    for (file, scenario) in &all {
        run_on_store(file, scenario, MemoryStore::with_clock).await;
    }
    assert!(all.len() >= 60, "only {} scenarios", all.len());
}
