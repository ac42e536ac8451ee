//! Support shared by the test binaries: each binary's `main.rs` declares it once as
//! `mod support;`, and its modules use it as `crate::support`.

#![allow(dead_code)]

pub mod down;
pub mod redis_server;
pub mod server;
pub mod service;
#[path = "../common/specs.rs"]
pub mod specs;
#[path = "../common/vectors.rs"]
pub mod vectors;

/// The harness's name for test `name` in module `module` (a `module_path!()`): the path
/// without the binary's own name, which a child process given `--exact` must match.
pub fn test_name(module: &str, name: &str) -> String {
    let path = module.split_once("::").map_or("", |(_, rest)| rest);
    format!("{path}::{name}")
}
