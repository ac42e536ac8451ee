//! The rate-limit models on their own and on the stores: large quotas, a rule reconfigured
//! under a name that has state, and the sliding log.

#[path = "../support/mod.rs"]
mod support;

mod large_quotas;
mod reconfiguration;
mod rounding;
mod sliding_log;
