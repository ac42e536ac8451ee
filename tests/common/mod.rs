//! Support shared by the black-box suites.

/// The crate under test, under the name the files shared with its unit tests use for it.
use tollgate as tg;

pub mod http;
pub mod redis_server;
pub mod specs;
pub mod vectors;
