//! Support shared by the black-box suites.

pub mod http;
pub mod redis_server;
pub mod specs;
pub mod vectors;
