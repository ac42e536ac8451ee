//! The checked-in `proto/helloworld.rs` is what tonic-prost-build generates from
//! `proto/helloworld.proto` today.

#[test]
fn the_generated_grpc_code_is_up_to_date_with_the_proto_file() {
    if let Err(e) = tollgate_bench::proto::check(tollgate_bench::repo_root()) {
        panic!("{e}");
    }
}
