//! Distributed accuracy: four OS processes, each an HTTP server deciding with a `RedisStore`
//! (deny cache on) against one shared Redis, and 200 concurrent clients spread over them.
//! For a fixed window and a sliding log: no window admits more than the limit, and each
//! window the clients kept busy admits at least the limit less one.
//!
//! The servers are this test binary started again in a child mode
//! (`TOLLGATE_DISTRIBUTED_REDIS` set, running only [`child_server`]): cargo builds no
//! example for an integration test, but it always has this binary.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::support::redis_server::RedisServer;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tollgate::{
    store::{RedisOptions, RedisStore},
    Limiter, Rule,
};

const CHILD_ENV: &str = "TOLLGATE_DISTRIBUTED_REDIS";
const LIMIT: u64 = 20;
const WINDOW_US: u64 = 1_000_000;
const SERVERS: usize = 4;
const CLIENTS: usize = 200;

fn rules() -> [Rule; 2] {
    let window = Duration::from_micros(WINDOW_US);
    [
        Rule::fixed_window("fixed", LIMIT, window),
        Rule::sliding_log("log", LIMIT, window),
    ]
}

fn wall_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// The server of the child mode: `GET /fixed` or `GET /log` checks that rule for one shared
/// key; 200 with the rule's reset in µs, or 429. Prints its port, serves until its stdin
/// closes. Outside the child mode (a normal test run) it has nothing to do.
#[test]
fn child_server() {
    let Ok(url) = std::env::var(CHILD_ENV) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // The parent closes our stdin when it is done (or dies): leave then.
    std::thread::spawn(|| {
        let mut sink = String::new();
        while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {}
        std::process::exit(0);
    });
    rt.block_on(async move {
        let store = RedisStore::connect_with(&url, RedisOptions::new().prefix("distributed"))
            .await
            .expect("connect")
            .with_deny_cache(10_000)
            .await
            .expect("subscribe");
        let limiter = Limiter::new(store);
        let rules = Arc::new(rules());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("PORT {}", listener.local_addr().unwrap().port());
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let (limiter, rules) = (limiter.clone(), Arc::clone(&rules));
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<_>| {
                    let (limiter, rules) = (limiter.clone(), Arc::clone(&rules));
                    async move {
                        let rule = if req.uri().path() == "/log" {
                            &rules[1]
                        } else {
                            &rules[0]
                        };
                        let response = match limiter.check_one(rule, b"shared").await {
                            Ok(outcome) if outcome.is_admitted() => {
                                let reset = outcome.rules[0].info.reset.as_micros();
                                Response::new(Full::new(Bytes::from(reset.to_string())))
                            }
                            Ok(_) => {
                                let mut r = Response::new(Full::new(Bytes::new()));
                                *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                                r
                            }
                            Err(e) => {
                                let mut r = Response::new(Full::new(Bytes::from(e.to_string())));
                                *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                                r
                            }
                        };
                        Ok::<_, std::convert::Infallible>(response)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
}

/// A child server process, killed on drop.
struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Server {
    fn start(redis_url: &str) -> Self {
        let exe = std::env::current_exe().expect("the test binary");
        let mut child = Command::new(exe)
            .arg(crate::support::test_name(module_path!(), "child_server"))
            .args(["--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, redis_url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start a server process");
        let stdout = child.stdout.take().expect("its stdout");
        let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
        // The harness writes its own "test distributed::child_server ... " before it on the
        // same line.
        let port = lines
            .find_map(|line| line.split("PORT ").nth(1)?.trim().parse::<u16>().ok())
            .expect("the server printed its port");
        // Keep reading, so the child never writes into a closed pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One admitted request: the local instants before it was sent and after its answer came
/// (the admission happened in between, on the same machine's clock as Redis's), and the
/// rule's reset in µs.
#[derive(Debug, Clone, Copy)]
struct Admitted {
    sent: u64,
    answered: u64,
    reset: u64,
}

/// `CLIENTS` clients hammer `path` for `run`, each over its own connection to one of the
/// servers; the admissions, and the instants the run started and ended.
async fn hammer(
    servers: &[SocketAddr],
    path: &'static str,
    run: Duration,
) -> (Vec<Admitted>, u64, u64) {
    let start = wall_micros();
    let deadline = Instant::now() + run;
    let mut clients = Vec::new();
    for i in 0..CLIENTS {
        let addr = servers[i % servers.len()];
        clients.push(tokio::spawn(async move {
            let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .expect("handshake");
            tokio::spawn(conn);
            let mut admitted = Vec::new();
            let mut denied = 0u64;
            while Instant::now() < deadline {
                let request = Request::get(path)
                    .header("host", "tollgate")
                    .body(Empty::<Bytes>::new())
                    .unwrap();
                let sent = wall_micros();
                let response = sender.send_request(request).await.expect("a response");
                let status = response.status();
                let body = response
                    .into_body()
                    .collect()
                    .await
                    .expect("a body")
                    .to_bytes();
                let answered = wall_micros();
                match status {
                    StatusCode::OK => admitted.push(Admitted {
                        sent,
                        answered,
                        reset: String::from_utf8_lossy(&body).parse().expect("a reset"),
                    }),
                    StatusCode::TOO_MANY_REQUESTS => denied += 1,
                    other => panic!("{other}: {}", String::from_utf8_lossy(&body)),
                }
            }
            (admitted, denied)
        }));
    }
    let mut all = Vec::new();
    let mut denied = 0;
    for client in clients {
        let (admitted, d) = client.await.expect("a client");
        all.extend(admitted);
        denied += d;
    }
    assert!(denied > 0, "the clients never exceeded the limit");
    (all, start, wall_micros())
}

/// Servers in four processes sharing one Redis never admit more than the limit in any
/// window, and admit close to it while busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_never_admit_more_than_the_limit() {
    let redis = RedisServer::start();
    let servers: Vec<Server> = (0..SERVERS).map(|_| Server::start(&redis.url())).collect();
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr).collect();

    // Fixed window: the admission's window ends at its instant plus its reset, a multiple of
    // the window; the answer's round trip brackets the instant well within half a window.
    let (admitted, start, end) = hammer(&addrs, "/fixed", Duration::from_millis(4_500)).await;
    let mut per_window = std::collections::BTreeMap::<u64, u64>::new();
    for a in &admitted {
        assert!(
            a.answered - a.sent < WINDOW_US / 2,
            "a round trip of {} µs",
            a.answered - a.sent
        );
        let window_end = (a.sent + a.reset + WINDOW_US / 2) / WINDOW_US;
        *per_window.entry(window_end).or_default() += 1;
    }
    for (&window_end, &n) in &per_window {
        assert!(
            n <= LIMIT,
            "fixed window ending at {window_end} s admitted {n}"
        );
    }
    // Windows the clients were busy in from start to end.
    let busy = (start / WINDOW_US + 2)..=(end / WINDOW_US);
    assert!(busy.clone().count() >= 2, "too short a run");
    for window_end in busy {
        let n = per_window.get(&window_end).copied().unwrap_or(0);
        assert!(
            n >= LIMIT - 1,
            "fixed window ending at {window_end} s admitted only {n}"
        );
    }

    // Sliding log: admission `j` happened within [sent, answered]. Every interval
    // [sent_i, sent_i + window) is one window long, so the admissions that surely fell in it
    // are at most the limit.
    let (mut admitted, start, end) = hammer(&addrs, "/log", Duration::from_millis(3_500)).await;
    admitted.sort_by_key(|a| a.sent);
    for a in &admitted {
        let inside = admitted
            .iter()
            .filter(|b| b.sent >= a.sent && b.answered < a.sent + WINDOW_US)
            .count() as u64;
        assert!(
            inside <= LIMIT,
            "{inside} admissions within one window from {} µs",
            a.sent
        );
    }
    // The log admits in bursts one window apart, from the first admission on: each window
    // around a burst the clients were busy for admits at least the limit less one.
    let first = admitted.first().expect("admissions").answered;
    let mut k = 1;
    while first + k * WINDOW_US + WINDOW_US / 2 <= end {
        let centre = first + k * WINDOW_US;
        let n = admitted
            .iter()
            .filter(|a| a.sent + WINDOW_US / 2 >= centre && a.sent < centre + WINDOW_US / 2)
            .count() as u64;
        assert!(
            n >= LIMIT - 1,
            "the window around {centre} µs admitted only {n}"
        );
        k += 1;
    }
    assert!(
        k >= 3,
        "too short a run: started {start}, first admission {first}, ended {end}"
    );
    drop(servers);
}
