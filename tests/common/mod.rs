//! Support shared by the black-box suites.

pub mod vectors;
