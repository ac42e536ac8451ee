//! The layer in the frameworks and files users bring: axum, hyper, tonic, the rules file, and
//! the generated protobuf code of the tonic example, and what the layer
//! reports to operators.

#[path = "../support/mod.rs"]
mod support;

mod layer_axum;
mod layer_hyper;
#[cfg(feature = "tonic")]
mod layer_tonic;
mod proto;
mod reports;
mod rules_file;
