//! Support shared by the black-box suites.

pub mod redis_server;
pub mod specs;
pub mod vectors;
