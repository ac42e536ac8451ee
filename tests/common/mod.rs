//! What the vector and property suites share; the other binaries reach it through
//! `tests/support`.

pub mod specs;
pub mod vectors;
