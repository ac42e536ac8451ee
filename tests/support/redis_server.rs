//! Real Redis servers for the tests: `redis-server` on a free port (or a 3-node Cluster),
//! started on demand, ready when it answers `PING`, killed when dropped.
//!
//! The binaries come from `PATH`, or from `TOLLGATE_REDIS_SERVER` / `TOLLGATE_REDIS_CLI`.
//! A missing binary fails the test with a message saying how to install it: the Redis
//! suites never skip silently.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A store on the Redis at `url` (a server or a Cluster) with its keys under `prefix`.
pub async fn prefixed(url: &str, prefix: impl AsRef<[u8]>) -> tollgate::store::RedisStore {
    let options = tollgate::store::RedisOptions::new().prefix(prefix);
    tollgate::store::RedisStore::connect_with(url, options)
        .await
        .expect("connect to the test Redis")
}

fn binary(env: &str, name: &str) -> String {
    std::env::var(env).unwrap_or_else(|_| name.to_owned())
}

fn redis_server_bin() -> String {
    binary("TOLLGATE_REDIS_SERVER", "redis-server")
}

pub fn redis_cli_bin() -> String {
    binary("TOLLGATE_REDIS_CLI", "redis-cli")
}

/// A directory no other server or certificate set of this run uses: named by the process
/// and a counter, since a port number can come back from the kernel to a second caller
/// while the first still uses its directory.
pub fn scratch_dir(what: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("tollgate-{what}-{}-{n}", std::process::id()))
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local address").port()
}

/// One `redis-server` process (a server or a sentinel), killed on drop.
#[derive(Debug)]
pub struct RedisServer {
    child: Child,
    pub port: u16,
    dir: PathBuf,
    /// The arguments it was started with, to restart it the same way.
    extra: Vec<String>,
    /// Its TLS files, when it listens with TLS only.
    tls: Option<Arc<TlsFiles>>,
    /// A sentinel's configuration (written to its directory on every start).
    sentinel: Option<String>,
}

impl RedisServer {
    /// A standalone server on a free port, ready to answer.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// The server's process id (for its CPU time in `/proc`).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A standalone server with `module` loaded, if one is given (the benches' redis-cell).
    pub fn start_with_module(module: Option<&str>) -> Self {
        match module {
            Some(module) => Self::start_with(&["--loadmodule", module]),
            None => Self::start(),
        }
    }

    /// A standalone server started with `extra` arguments too (`--loadmodule …`).
    pub fn start_with(extra: &[&str]) -> Self {
        Self::launch(extra, None, None)
    }

    /// A server that speaks TLS only (`--port 0 --tls-port …`) with `tls`'s server
    /// certificate, asking clients for a certificate signed by its CA when
    /// `auth_clients`; replication to and from it is over TLS too.
    pub fn start_tls(tls: &Arc<TlsFiles>, auth_clients: bool, extra: &[&str]) -> Self {
        let mut args = vec![
            "--tls-auth-clients",
            if auth_clients { "yes" } else { "no" },
        ];
        args.extend_from_slice(extra);
        Self::launch(&args, Some(Arc::clone(tls)), None)
    }

    /// A sentinel watching the primary on `primary_port` as `service` (quorum `quorum`),
    /// which declares it down after 1 s without an answer; over TLS with `tls`.
    pub fn start_sentinel(
        service: &str,
        primary_port: u16,
        quorum: u32,
        tls: Option<&Arc<TlsFiles>>,
    ) -> Self {
        let conf = format!(
            "sentinel monitor {service} 127.0.0.1 {primary_port} {quorum}\n\
             sentinel down-after-milliseconds {service} 1000\n\
             sentinel failover-timeout {service} 2000\n\
             sentinel parallel-syncs {service} 1\n"
        );
        Self::launch(&[], tls.cloned(), Some(conf))
    }

    fn launch(extra: &[&str], tls: Option<Arc<TlsFiles>>, sentinel: Option<String>) -> Self {
        for _ in 0..5 {
            let port = free_port();
            let dir = scratch_dir("redis");
            let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
            let child = Self::spawn(port, &dir, &extra, tls.as_deref(), sentinel.as_deref());
            let mut server = RedisServer {
                child,
                port,
                dir,
                extra,
                tls: tls.clone(),
                sentinel: sentinel.clone(),
            };
            if server.wait_ready() {
                return server;
            }
            // Most likely another process took the port first: try another.
        }
        panic!("redis-server did not start on any of 5 free ports");
    }

    fn spawn(
        port: u16,
        dir: &Path,
        extra: &[String],
        tls: Option<&TlsFiles>,
        sentinel: Option<&str>,
    ) -> Child {
        std::fs::create_dir_all(dir).expect("create a directory for redis-server");
        let mut cmd = Command::new(redis_server_bin());
        if let Some(conf) = sentinel {
            // A sentinel needs a configuration file it may rewrite.
            let file = dir.join("sentinel.conf");
            std::fs::write(&file, conf).expect("write sentinel.conf");
            cmd.arg(&file).arg("--sentinel");
        }
        match tls {
            Some(tls) => {
                cmd.args(["--port", "0", "--tls-port", &port.to_string()])
                    .arg("--tls-cert-file")
                    .arg(&tls.server_cert)
                    .arg("--tls-key-file")
                    .arg(&tls.server_key)
                    .arg("--tls-ca-cert-file")
                    .arg(&tls.ca_cert)
                    .args(["--tls-replication", "yes"]);
            }
            None => {
                cmd.arg("--port").arg(port.to_string());
            }
        }
        cmd.arg("--bind").arg("127.0.0.1").arg("--dir").arg(dir);
        if sentinel.is_none() {
            cmd.args(["--save", "", "--appendonly", "no"]);
        }
        cmd.args(extra).stdout(Stdio::null()).stderr(Stdio::null());
        match cmd.spawn() {
            Ok(child) => child,
            Err(e) => panic!(
                "cannot start `{}`: {e}. The Redis tests need a real redis-server: install it \
                 (apt-get install redis-server) or point TOLLGATE_REDIS_SERVER at the binary",
                redis_server_bin()
            ),
        }
    }

    /// Sends `signal` (`STOP`, `CONT`, `KILL`) to the server process.
    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// Lets a paused server run again (SIGCONT).
    pub fn resume(&self) {
        self.signal("CONT");
    }

    /// Kills the server (SIGKILL): connections drop, connects are refused.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the server again on the same port (empty: nothing is persisted), ready to
    /// answer.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            self.child = Self::spawn(
                self.port,
                &self.dir,
                &self.extra,
                self.tls.as_deref(),
                self.sentinel.as_deref(),
            );
            if self.wait_ready() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not restart on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if self.cli(&["PING"]).is_some_and(|o| o.trim() == "PONG") {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// `redis://127.0.0.1:<port>/`, or `rediss://` for a TLS server.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}/", self.port)
    }

    /// Runs `redis-cli -p <port> <args>` (over TLS with the client certificate, for a TLS
    /// server); its output, if it ran.
    pub fn cli(&self, args: &[&str]) -> Option<String> {
        let mut cmd = Command::new(redis_cli_bin());
        if let Some(tls) = &self.tls {
            cmd.arg("--tls")
                .arg("--cacert")
                .arg(&tls.ca_cert)
                .arg("--cert")
                .arg(&tls.client_cert)
                .arg("--key")
                .arg(&tls.client_key);
        }
        let out = cmd
            .arg("-p")
            .arg(self.port.to_string())
            .args(args)
            .stderr(Stdio::null())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Like [`cli`](Self::cli), failing the test if the command cannot run.
    pub fn must(&self, args: &[&str]) -> String {
        self.cli(args)
            .unwrap_or_else(|| panic!("redis-cli {args:?} failed on port {}", self.port))
    }

    /// How many times `command` ran on this server (`INFO commandstats`), 0 if never.
    pub fn calls(&self, command: &str) -> u64 {
        // Retried: a failover's reconfiguration closes clients' connections (redis-cli's too).
        let stats = (0..20)
            .find_map(|_| {
                self.cli(&["INFO", "commandstats"]).or_else(|| {
                    std::thread::sleep(Duration::from_millis(50));
                    None
                })
            })
            .unwrap_or_else(|| panic!("INFO commandstats failed on port {}", self.port));
        let prefix = format!("cmdstat_{}:calls=", command.to_lowercase());
        stats
            .lines()
            .find_map(|l| l.trim().strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().expect("a call count"))
    }

    /// How many decision calls ran here: `FCALL` (the function library) and `EVALSHA`
    /// (the script) together.
    pub fn script_calls(&self) -> u64 {
        self.calls("fcall") + self.calls("evalsha")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // A paused server ignores nothing but SIGKILL, which is what `kill` sends.
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Three primaries (no replicas) joined with `redis-cli --cluster create`, all slots
/// assigned; killed on drop.
#[derive(Debug)]
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> Self {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "5000",
                ])
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"]);
        let out = Command::new(redis_cli_bin())
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run `{}`: {e}", redis_cli_bin()));
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = RedisCluster { nodes };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ok = cluster.nodes.iter().all(|n| {
                n.cli(&["CLUSTER", "INFO"])
                    .is_some_and(|i| i.contains("cluster_state:ok"))
            });
            if ok {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not reach state ok"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        cluster
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }

    /// Every node's URL in one, comma-separated, as `RedisStore::connect` takes a Cluster.
    pub fn url(&self) -> String {
        self.urls().join(",")
    }

    /// `command`'s calls summed over the nodes.
    pub fn calls(&self, command: &str) -> u64 {
        self.nodes.iter().map(|n| n.calls(command)).sum()
    }
}

/// PEM files of a CA and the certificates it signed (made by `support::tls`, which the
/// benchmarks that include this file do without).
#[derive(Debug)]
pub struct TlsFiles {
    /// Where the files are (removed on drop).
    pub dir: PathBuf,
    pub ca_cert: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl TlsFiles {
    /// The CA certificate's PEM.
    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(&self.ca_cert).expect("read the CA certificate")
    }

    /// The client certificate's and key's PEM.
    pub fn client_pem(&self) -> (Vec<u8>, Vec<u8>) {
        (
            std::fs::read(&self.client_cert).expect("read the client certificate"),
            std::fs::read(&self.client_key).expect("read the client key"),
        )
    }
}

impl Drop for TlsFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
