//! A Redis that closes idle connections (`timeout` in its configuration, as managed services
//! set it) costs no request after a quiet period, standalone, through Sentinel or on a Cluster:
//! the store keeps its connections from going idle.

use std::time::Duration;

use tollgate::store::RedisStore;
use tollgate::{Limiter, Rule};

use crate::support::redis_ha::SentinelGroup;
use crate::support::redis_server::{RedisCluster, RedisServer};

/// Quiet periods, each longer than the server's `timeout 1` lets a connection idle (the
/// server checks idle clients about once a second).
const QUIET: Duration = Duration::from_millis(2500);

/// Every request after each of two quiet periods is decided by Redis: none fails.
async fn no_request_fails_after_quiet_periods(store: RedisStore, what: &str) {
    let limiter = Limiter::new(store);
    let rule = Rule::fixed_window("idle", 100, Duration::from_secs(60));
    limiter.check_one(&rule, b"k").await.expect("decided");
    let mut failed = Vec::new();
    for period in 1..=2 {
        tokio::time::sleep(QUIET).await;
        for _ in 0..3 {
            if let Err(e) = limiter.check_one(&rule, b"k").await {
                failed.push(format!("after quiet period {period}: {e}"));
            }
        }
    }
    assert!(failed.is_empty(), "{what}: {failed:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_closes_idle_connections_costs_no_request() {
    let server = RedisServer::start_with(&["--timeout", "1"]);
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    no_request_fails_after_quiet_periods(store, "standalone").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_that_closes_idle_connections_costs_no_request_through_sentinel() {
    let group = SentinelGroup::start(None);
    let primary = &group.servers[group.primary().expect("a primary")];
    primary.must(&["CONFIG", "SET", "timeout", "1"]);
    let store = RedisStore::connect(&group.url()).await.expect("connect");
    no_request_fails_after_quiet_periods(store, "sentinel").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_whose_nodes_close_idle_connections_costs_no_request() {
    let cluster = RedisCluster::start();
    for node in &cluster.nodes {
        node.must(&["CONFIG", "SET", "timeout", "1"]);
    }
    let store = RedisStore::connect(&cluster.url()).await.expect("connect");
    no_request_fails_after_quiet_periods(store, "cluster").await;
}
