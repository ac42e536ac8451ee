//! Redis with replicas, as high-availability deployments run it: a primary with a replica
//! and three sentinels, and a Cluster of three primaries with a replica each. Short
//! failure detection (1 s) keeps the failover tests quick. Killed on drop.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::redis_server::{redis_cli_bin, RedisServer, TlsFiles};

/// The service name the sentinels watch.
pub const SERVICE: &str = "mymaster";

/// Waits until `ok`, failing the test with `what` after `secs` seconds.
pub fn wait_for(what: &str, secs: u64, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A primary, its replica, and three sentinels (quorum 2) watching them.
#[derive(Debug)]
pub struct SentinelGroup {
    /// `[first primary, first replica]`: which is the primary changes with a failover.
    pub servers: Vec<RedisServer>,
    pub sentinels: Vec<RedisServer>,
}

impl SentinelGroup {
    /// Started and ready: the replica in sync, every sentinel knowing the replica and the
    /// other two sentinels (so that a failover can be elected). Over TLS with `tls`.
    pub fn start(tls: Option<&Arc<TlsFiles>>) -> Self {
        let primary = match tls {
            Some(tls) => RedisServer::start_tls(tls, false, &[]),
            None => RedisServer::start(),
        };
        let port = primary.port.to_string();
        let replica_of = ["--replicaof", "127.0.0.1", port.as_str()];
        let replica = match tls {
            Some(tls) => RedisServer::start_tls(tls, false, &replica_of),
            None => RedisServer::start_with(&replica_of),
        };
        wait_for("the replica to sync", 20, || {
            replica
                .cli(&["INFO", "replication"])
                .is_some_and(|i| i.contains("master_link_status:up"))
        });
        let sentinels: Vec<RedisServer> = (0..3)
            .map(|_| RedisServer::start_sentinel(SERVICE, primary.port, 2, tls))
            .collect();
        for sentinel in &sentinels {
            wait_for("the sentinels to meet", 30, || {
                // redis-cli prints each instance's fields flat, starting with `name`.
                let count = |what: &str| {
                    sentinel
                        .cli(&["SENTINEL", what, SERVICE])
                        .map_or(0, |o| o.lines().filter(|l| l.trim() == "name").count())
                };
                count("replicas") >= 1 && count("sentinels") >= 2
            });
        }
        Self {
            servers: vec![primary, replica],
            sentinels,
        }
    }

    /// `redis+sentinel://…/mymaster` (`rediss+sentinel://` over TLS).
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        let scheme = if self.servers[0].url().starts_with("rediss") {
            "rediss+sentinel"
        } else {
            "redis+sentinel"
        };
        format!("{scheme}://{}/{SERVICE}", hosts.join(","))
    }

    /// The index in `servers` of the server that says it is the primary now.
    pub fn primary(&self) -> Option<usize> {
        self.servers
            .iter()
            .position(|s| s.cli(&["ROLE"]).is_some_and(|r| r.starts_with("master")))
    }

    /// The port the sentinels name as the primary now.
    pub fn named_primary_port(&self) -> Option<u16> {
        let out = self.sentinels[0].cli(&["SENTINEL", "get-master-addr-by-name", SERVICE])?;
        out.lines().nth(1)?.trim().parse().ok()
    }
}

/// A Cluster of three primaries with a replica each (`--cluster-replicas 1`), failing a
/// primary over after 1 s without an answer.
#[derive(Debug)]
pub struct ReplicatedCluster {
    pub nodes: Vec<RedisServer>,
}

impl ReplicatedCluster {
    pub fn start() -> Self {
        let nodes: Vec<RedisServer> = (0..6)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "1000",
                ])
            })
            .collect();
        let mut create = Command::new(redis_cli_bin());
        create.args(["--cluster", "create"]);
        for node in &nodes {
            create.arg(format!("127.0.0.1:{}", node.port));
        }
        let out = create
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = Self { nodes };
        wait_for(
            "the cluster to be ok with every replica in sync",
            30,
            || {
                cluster.nodes.iter().all(|n| {
                    n.cli(&["CLUSTER", "INFO"])
                        .is_some_and(|i| i.contains("cluster_state:ok"))
                        && n.cli(&["INFO", "replication"]).is_some_and(|i| {
                            i.contains("role:master") || i.contains("master_link_status:up")
                        })
                })
            },
        );
        cluster
    }

    /// Whether node `i` says it is a primary.
    pub fn is_primary(&self, i: usize) -> bool {
        self.nodes[i]
            .cli(&["ROLE"])
            .is_some_and(|r| r.starts_with("master"))
    }

    /// The index of the node that serves `key`'s slot as primary, as node `from` says.
    pub fn owner_of(&self, from: usize, key: &str) -> Option<usize> {
        let slot: u32 = self.nodes[from]
            .cli(&["CLUSTER", "KEYSLOT", key])?
            .trim()
            .parse()
            .ok()?;
        // `<id> <ip:port@cport> <flags> <primary> <ping> <pong> <epoch> <link> <slots>…`
        let nodes = self.nodes[from].cli(&["CLUSTER", "NODES"])?;
        let line = nodes.lines().find(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.len() > 8
                && fields[2].contains("master")
                && !fields[2].contains("fail")
                && fields[8..].iter().any(|range| {
                    let (a, b) = range.split_once('-').unwrap_or((range, range));
                    matches!((a.parse::<u32>(), b.parse::<u32>()), (Ok(a), Ok(b)) if (a..=b).contains(&slot))
                })
        })?;
        let addr = line.split_whitespace().nth(1)?;
        let port: u16 = addr.split(['@']).next()?.rsplit(':').next()?.parse().ok()?;
        self.nodes.iter().position(|n| n.port == port)
    }
}
