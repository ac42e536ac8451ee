//! `proto/helloworld.rs` (the gRPC code of `examples/tonic.rs`) is generated from
//! `proto/helloworld.proto` by `cargo run -p tollgate-bench --bin proto` and checked in, so
//! that neither users of the crate nor its examples compile a protobuf compiler.
//!
//! The generated file's header records the SHA-256 of the `.proto` it came from; this test
//! compares it with the `.proto` as it is, so an edit not followed by a regeneration fails
//! here without a protobuf compiler. `cargo test -p tollgate-bench --test proto` generates
//! the code again and compares all of it.

use std::path::Path;

use sha2::{Digest, Sha256};

/// The header line of `proto/helloworld.rs` that holds the `.proto`'s SHA-256.
const HASH_PREFIX: &str = "// proto-sha256: ";

/// The checked-in gRPC code records the SHA-256 of the `.proto` file as it is now.
#[test]
fn the_generated_grpc_code_comes_from_the_proto_file_as_it_is() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let proto = std::fs::read_to_string(root.join("proto/helloworld.proto")).unwrap();
    let generated = std::fs::read_to_string(root.join("proto/helloworld.rs")).unwrap();
    // Line endings as a Windows checkout may have them hash the same.
    let digest = Sha256::digest(proto.replace("\r\n", "\n").as_bytes());
    let hash: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let recorded = generated
        .lines()
        .take_while(|line| line.starts_with("//"))
        .find_map(|line| line.strip_prefix(HASH_PREFIX));
    assert_eq!(
        recorded,
        Some(hash.as_str()),
        "proto/helloworld.rs was not generated from proto/helloworld.proto as it is: run \
         `cargo run -p tollgate-bench --bin proto` and commit the result"
    );
}
