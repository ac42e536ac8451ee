//! Regenerates `proto/helloworld.rs` from `proto/helloworld.proto` (see
//! `tollgate_bench::proto`):
//!
//! ```sh
//! cargo run -p tollgate-bench --bin proto             # writes proto/helloworld.rs
//! cargo run -p tollgate-bench --bin proto -- --check  # fails if it is out of date
//! ```

use std::process::ExitCode;

use tollgate_bench::{proto, repo_root};

fn main() -> ExitCode {
    let check = match std::env::args().nth(1).as_deref() {
        None => false,
        Some("--check") => true,
        Some(_) => {
            eprintln!("usage: proto [--check]");
            return ExitCode::FAILURE;
        }
    };
    let result = if check {
        proto::check(repo_root())
    } else {
        proto::write(repo_root())
    };
    match result {
        Ok(()) if check => {
            println!("{} is up to date", proto::GENERATED);
            ExitCode::SUCCESS
        }
        Ok(()) => {
            println!("wrote {}", proto::GENERATED);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
