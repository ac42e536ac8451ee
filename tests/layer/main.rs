//! The layer as a tower service: routes, keys, modes, plans, headers, held requests, charging
//! by outcome, costs settled by the response, reloads, what operators see, hostile input, and
//! what a request allocates.

#[path = "../support/mod.rs"]
mod support;

mod allocations;
mod charge;
mod footguns;
mod headers;
mod held;
mod hostile;
mod keys;
mod lockout;
mod modes;
mod observe;
mod observer;
mod plans;
mod reload;
mod robustness;
mod settle;
