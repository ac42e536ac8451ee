//! What the vector and property suites share; the other binaries reach it through
//! `tests/support`.

/// The crate under test, under the name the files shared with its unit tests use for it.
#[allow(unused_imports)]
use tollgate as tg;

#[path = "../support/redis_server.rs"]
pub mod redis_server;
pub mod specs;
pub mod vectors;
