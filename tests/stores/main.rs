//! The stores as a user drives them: `MemoryStore`, reservations and refunds, and features
//! that meet in one batch, each file a subject.

#[path = "../support/mod.rs"]
mod support;

mod bound;
mod exact_leases;
mod leases;
mod memory_store;
mod promise_findings;
mod promises;
mod queues;
mod reconfigured;
mod refunds;
mod reservations;
mod settled;
mod shaping;
mod stored_keys;
mod twins;
