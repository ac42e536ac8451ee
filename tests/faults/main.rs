//! Limiting while the store fails: Redis outages, slow and dropped connections, and the layer's
//! failure policies on a store that is down.

#[path = "../support/mod.rs"]
mod support;

mod faults;
mod faults_layer;
