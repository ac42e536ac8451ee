//! The stores as a user drives them: `MemoryStore`, reservations and refunds, and features
//! that meet in one batch.

#[path = "../support/mod.rs"]
mod support;

mod bound;
mod interactions;
mod memory_store;
mod queues;
mod refunds;
mod reservations;
mod settled;
