//! An axum hello-world over real loopback TCP: bare, behind tollgate's layer and behind
//! tower_governor's, all admitted and all refused (429). tower_governor runs both as its
//! README configures it (no rate-limit headers on admitted responses) and with
//! `use_headers()`; tollgate's cases that send headers are compared with the latter, like
//! for like. A plain `main`, about two minutes:
//!
//! `cargo bench -p tollgate-bench --bench http`
//!
//! The servers (one port per case) run on a current-thread runtime pinned to core 0; the
//! load generator (hyper's HTTP/1.1 client, keep-alive connections that each send one request
//! after the other) runs on another pinned to core 1. Every round measures every case at
//! every number of connections, interleaved, so each ratio compares figures taken minutes
//! apart at most; each ratio is the median over the rounds of (case ÷ bare of the same round
//! and concurrency). The server thread's CPU time per request is read from
//! `/proc/self/task/<tid>/schedstat` around each measured window (Linux): on a machine shared
//! with other work it moves far less with the load than requests per second. Prints a
//! Markdown table, writes `target/bench-http.csv` (series, connections, requests/s) and
//! draws it to `target/bench-http.png`.
//!
//! `HTTP_BENCH_SECS` (measured seconds per case, default 1), `HTTP_BENCH_ROUNDS` (default 3)
//! and `HTTP_BENCH_CONNECTIONS` (default `1,4,16,64`) shorten or lengthen it;
//! `HTTP_BENCH_CASES` (names separated by `;`) keeps some cases and the bare app.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::serve::ListenerExt;
use axum::Router;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tollgate::layer::{Limit, RateLimitLayer};
use tollgate::{key, Rule};
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::GovernorLayer;

#[path = "support/apps.rs"]
mod apps;
use apps::{hello, roomy, tight};
use tollgate_bench::chart;

/// What a case's every response must be.
#[derive(Clone, Copy, PartialEq)]
enum Expect {
    Admitted,
    Refused,
}

struct Case {
    name: &'static str,
    expect: Expect,
    app: Router,
}

fn tollgate(rule: Rule, key: impl tollgate::key::KeyExtractor) -> RateLimitLayer {
    tollgate_headers(rule, key, true)
}

/// With `headers_on_allowed(false)`: like for like with tower_governor's default, which
/// sends no rate-limit headers on admitted responses.
fn tollgate_headers(
    rule: Rule,
    key: impl tollgate::key::KeyExtractor,
    on_allowed: bool,
) -> RateLimitLayer {
    RateLimitLayer::builder()
        .limit(Limit::new(rule, key))
        .headers_on_allowed(on_allowed)
        .build()
        .expect("a valid layer")
}

fn cases() -> Vec<Case> {
    // tower_governor's README configuration (peer IP, no headers on admitted responses),
    // with a quota the load never reaches, and one of a single request per hour.
    let governor_roomy = GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(u32::MAX)
        .finish()
        .expect("a valid governor config");
    let governor_tight = GovernorConfigBuilder::default()
        .per_second(3600)
        .burst_size(1)
        .finish()
        .expect("a valid governor config");
    // The same, sending its `x-ratelimit-*` headers on every response, as tollgate does.
    let governor_roomy_headers = GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(u32::MAX)
        .use_headers()
        .finish()
        .expect("a valid governor config");
    let governor_tight_headers = GovernorConfigBuilder::default()
        .per_second(3600)
        .burst_size(1)
        .use_headers()
        .finish()
        .expect("a valid governor config");
    vec![
        Case {
            name: "bare",
            expect: Expect::Admitted,
            app: hello(),
        },
        Case {
            name: "tollgate, peer IP",
            expect: Expect::Admitted,
            app: hello().layer(tollgate(roomy(), key::peer_ip())),
        },
        Case {
            name: "tollgate, peer IP, no headers",
            expect: Expect::Admitted,
            app: hello().layer(tollgate_headers(roomy(), key::peer_ip(), false)),
        },
        Case {
            name: "tollgate, header",
            expect: Expect::Admitted,
            app: hello().layer(tollgate(roomy(), key::header("user-id"))),
        },
        Case {
            name: "tower_governor, peer IP",
            expect: Expect::Admitted,
            app: hello().layer(GovernorLayer::new(governor_roomy)),
        },
        Case {
            name: "tower_governor, peer IP, headers",
            expect: Expect::Admitted,
            app: hello().layer(GovernorLayer::new(governor_roomy_headers)),
        },
        Case {
            name: "tollgate, peer IP, 429",
            expect: Expect::Refused,
            app: hello().layer(tollgate(tight(), key::peer_ip())),
        },
        Case {
            name: "tower_governor, peer IP, 429",
            expect: Expect::Refused,
            app: hello().layer(GovernorLayer::new(governor_tight)),
        },
        Case {
            name: "tower_governor, peer IP, headers, 429",
            expect: Expect::Refused,
            app: hello().layer(GovernorLayer::new(governor_tight_headers)),
        },
    ]
}

/// What one case gave in one round at one number of connections.
struct Run {
    requests_per_s: f64,
    latencies_us: Vec<u32>,
    /// The server thread's CPU time per request, if the system tells it.
    server_cpu_ns: Option<f64>,
}

/// The CPU time a thread has run, in ns (Linux: `/proc/self/task/<tid>/schedstat`).
/// On a machine shared with other work, the server's CPU time per request moves much less
/// with the load than its requests per second do.
fn cpu_ns(thread: Option<&str>) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{}/schedstat", thread?)).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// The calling thread's id, as `/proc` names it.
fn thread_id() -> Option<String> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    Some(link.file_name()?.to_string_lossy().into_owned())
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let secs: f64 = env_or("HTTP_BENCH_SECS", 1.0);
    let rounds: usize = env_or("HTTP_BENCH_ROUNDS", 3);
    let connections: Vec<usize> = std::env::var("HTTP_BENCH_CONNECTIONS")
        .unwrap_or_else(|_| "1,4,16,64".into())
        .split(',')
        .filter_map(|c| c.trim().parse().ok())
        .collect();
    let measure = Duration::from_secs_f64(secs);
    let warm_up = Duration::from_millis(200);

    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let pinned = cores.len() >= 2;
    if !pinned {
        eprintln!("fewer than 2 cores: server and load are not pinned");
    }
    let (server_core, load_core) = (cores.first().copied(), cores.get(1).copied());

    // `HTTP_BENCH_CASES="tollgate, peer IP;tower_governor, peer IP"` keeps those cases
    // (and the bare app, which every ratio needs): for a profile of one path.
    let only = std::env::var("HTTP_BENCH_CASES").ok();
    let cases: Vec<Case> = cases()
        .into_iter()
        .filter(|c| {
            c.name == "bare"
                || only
                    .as_deref()
                    .is_none_or(|o| o.split(';').any(|n| n == c.name))
        })
        .collect();
    let names: Vec<&'static str> = cases.iter().map(|c| c.name).collect();
    let expects: Vec<Expect> = cases.iter().map(|c| c.expect).collect();

    // The servers: one port per case, all on one thread pinned to the first core.
    let (addrs_tx, addrs_rx) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || {
        if let (true, Some(core)) = (pinned, server_core) {
            core_affinity::set_for_current(core);
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(async move {
            let mut addrs = Vec::new();
            for case in cases {
                let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
                addrs.push(listener.local_addr().expect("its address"));
                let listener = listener.tap_io(|tcp| {
                    let _ = tcp.set_nodelay(true);
                });
                let app = case.app.into_make_service_with_connect_info::<SocketAddr>();
                tokio::spawn(async move { axum::serve(listener, app).await });
            }
            addrs_tx
                .send((addrs, thread_id()))
                .expect("the load thread waits");
            // Serve until the process exits.
            std::future::pending::<()>().await;
        });
    });
    let (addrs, server_thread): (Vec<SocketAddr>, Option<String>) =
        addrs_rx.recv().expect("the servers start");
    let server_thread = server_thread.as_deref();
    drop(server);

    if let (true, Some(core)) = (pinned, load_core) {
        core_affinity::set_for_current(core);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");

    // runs[case][connections index][round]
    let mut runs: Vec<Vec<Vec<Run>>> = names
        .iter()
        .map(|_| connections.iter().map(|_| Vec::new()).collect())
        .collect();
    let started = Instant::now();
    for round in 0..rounds {
        for (ci, &n) in connections.iter().enumerate() {
            // Rotate the order each round so no case always follows the same one.
            for k in 0..names.len() {
                let case = (k + round) % names.len();
                let run = rt.block_on(load(
                    addrs[case],
                    n,
                    warm_up,
                    measure,
                    expects[case],
                    server_thread,
                ));
                runs[case][ci].push(run);
            }
        }
        eprintln!(
            "round {}/{rounds} done after {:.0} s",
            round + 1,
            started.elapsed().as_secs_f64()
        );
    }

    report(&names, &connections, &runs, secs, rounds, pinned);
}

/// `n` keep-alive connections to `addr`, each sending `GET /` after `GET /` for the warm-up
/// and the measured time; the requests that complete within the measured time count.
async fn load(
    addr: SocketAddr,
    n: usize,
    warm_up: Duration,
    measure: Duration,
    expect: Expect,
    server_thread: Option<&str>,
) -> Run {
    let start = Instant::now();
    let (from, until) = (start + warm_up, start + warm_up + measure);
    let mut tasks = Vec::new();
    for i in 0..n {
        tasks.push(tokio::spawn(connection(addr, i, from, until, expect)));
    }
    tokio::time::sleep_until(from.into()).await;
    let cpu_from = cpu_ns(server_thread);
    tokio::time::sleep_until(until.into()).await;
    let cpu_until = cpu_ns(server_thread);
    let mut latencies_us = Vec::new();
    for task in tasks {
        latencies_us.extend(task.await.expect("a connection task"));
    }
    let requests = latencies_us.len().max(1) as f64;
    Run {
        requests_per_s: latencies_us.len() as f64 / measure.as_secs_f64(),
        latencies_us,
        server_cpu_ns: cpu_from
            .zip(cpu_until)
            .map(|(a, b)| b.saturating_sub(a) as f64 / requests),
    }
}

/// One keep-alive connection; the latencies (µs) of its requests started in `from..until`
/// and finished by `until`. Panics on a response the case does not expect: a benchmark
/// of the wrong path is worse than none.
async fn connection(
    addr: SocketAddr,
    i: usize,
    from: Instant,
    until: Instant,
    expect: Expect,
) -> Vec<u32> {
    let stream = TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let user = format!("user-{i}");
    let mut latencies = Vec::new();
    loop {
        let begin = Instant::now();
        if begin >= until {
            break;
        }
        let request = http::Request::get("/")
            .header(http::header::HOST, "127.0.0.1")
            .header("user-id", &user)
            .body(Empty::<Bytes>::new())
            .expect("a request");
        let response = sender.send_request(request).await.expect("a response");
        let status = response.status();
        let body = response.into_body().collect().await.expect("a body");
        std::hint::black_box(body);
        let end = Instant::now();
        let ok = match expect {
            Expect::Admitted => status == http::StatusCode::OK,
            // The first request of a refusing case may be admitted (its quota is 1).
            Expect::Refused => status == http::StatusCode::TOO_MANY_REQUESTS || begin < from,
        };
        assert!(ok, "unexpected status {status} on {addr}");
        if begin >= from && end <= until {
            latencies.push((end - begin).as_micros().min(u128::from(u32::MAX)) as u32);
        }
    }
    latencies
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn report(
    names: &[&str],
    connections: &[usize],
    runs: &[Vec<Vec<Run>>],
    secs: f64,
    rounds: usize,
    pinned: bool,
) {
    let position = |name: &str| names.iter().position(|n| *n == name);
    // tollgate's case against tower_governor's like it: with headers unless tollgate sends
    // none (a 429 always carries them), each falling back to the other configuration
    // when the run left it out.
    let baseline = |name: &str| -> Option<usize> {
        let (headers, plain) = if name.ends_with("429") {
            (
                "tower_governor, peer IP, headers, 429",
                "tower_governor, peer IP, 429",
            )
        } else if name.contains("no headers") {
            (
                "tower_governor, peer IP",
                "tower_governor, peer IP, headers",
            )
        } else {
            (
                "tower_governor, peer IP, headers",
                "tower_governor, peer IP",
            )
        };
        position(headers).or_else(|| position(plain))
    };
    // The ratio of case `c` to the bare app, per round, at connections index `ci`.
    let ratios = |c: usize, ci: usize| -> Vec<f64> {
        runs[c][ci]
            .iter()
            .zip(&runs[0][ci])
            .map(|(r, bare)| r.requests_per_s / bare.requests_per_s)
            .collect()
    };
    println!(
        "\n{rounds} rounds × {secs} s per case; server and load {}pinned to separate cores\n",
        if pinned { "" } else { "NOT " }
    );
    println!("| connections | case | requests/s | p50 µs | p99 µs | vs bare | vs tower_governor | server CPU µs/req | CPU over bare µs |");
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    let mut rows = Vec::new();
    for (ci, &n) in connections.iter().enumerate() {
        for (c, name) in names.iter().enumerate() {
            let rps = median(runs[c][ci].iter().map(|r| r.requests_per_s).collect());
            let mut lat: Vec<u32> = runs[c][ci]
                .iter()
                .flat_map(|r| r.latencies_us.iter().copied())
                .collect();
            lat.sort_unstable();
            let vs_bare = median(ratios(c, ci));
            let vs_governor = match baseline(name) {
                Some(g) if !name.starts_with("tower_governor") && c != 0 => {
                    // The ratio of the two ratios, round by round.
                    let per_round = ratios(c, ci)
                        .into_iter()
                        .zip(ratios(g, ci))
                        .map(|(a, b)| a / b)
                        .collect();
                    format!("{:.2}×", median(per_round))
                }
                _ => "—".to_owned(),
            };
            let cpu = |c: usize| -> Vec<f64> {
                runs[c][ci].iter().filter_map(|r| r.server_cpu_ns).collect()
            };
            let (cpu_us, extra_us) = match (cpu(c).is_empty(), cpu(0).is_empty()) {
                (false, false) => {
                    let own = median(cpu(c)) / 1000.0;
                    // The extra CPU per request over the bare app's, round by round.
                    let extra = median(cpu(c).iter().zip(cpu(0)).map(|(a, b)| a - b).collect());
                    (format!("{own:.1}"), format!("{:+.2}", extra / 1000.0))
                }
                _ => ("—".to_owned(), "—".to_owned()),
            };
            println!(
                "| {n} | {name} | {rps:.0} | {} | {} | {vs_bare:.2}× | {vs_governor} | {cpu_us} | {extra_us} |",
                percentile(&lat, 0.50),
                percentile(&lat, 0.99),
            );
            rows.push(chart::Row {
                series: name.replace(',', ""),
                concurrency: n as u32,
                value: rps,
            });
        }
    }
    // Added server CPU per request over the bare app's, against the peer's, round by round:
    // the figure a layer's own cost is judged by.
    for (ci, &n) in connections.iter().enumerate() {
        for (c, name) in names.iter().enumerate() {
            let Some(g) = baseline(name).filter(|_| !name.starts_with("tower_governor") && c != 0)
            else {
                continue;
            };
            let added = |c: usize| -> Vec<f64> {
                let bare = runs[0][ci].iter().map(|r| r.server_cpu_ns);
                let own = runs[c][ci].iter().map(|r| r.server_cpu_ns);
                own.zip(bare).filter_map(|(a, b)| Some(a? - b?)).collect()
            };
            // The ratio of the medians: a round's own ratio swings without bound when the
            // peer's added CPU nears the noise of the bare app's (a few tenths of a µs).
            let per_round: Vec<f64> = added(c).iter().zip(added(g)).map(|(a, b)| a / b).collect();
            if !per_round.is_empty() {
                let shown: Vec<String> = per_round.iter().map(|r| format!("{r:.2}")).collect();
                let (own, peer) = (median(added(c)), median(added(g)));
                println!(
                    "added CPU, {n} connections, {name} / {}: {:.2}× (median added {:+.3} against \
                     {:+.3} µs; per round: {})",
                    names[g],
                    own / peer,
                    own / 1000.0,
                    peer / 1000.0,
                    shown.join(" ")
                );
            }
        }
    }
    let csv = tollgate_bench::target_file("bench-http.csv");
    let png = csv.with_extension("png");
    if let Err(e) = std::fs::write(&csv, chart::to_csv(&rows, "requests_per_s")) {
        eprintln!("could not write {}: {e}", csv.display());
    }
    match chart::draw(
        &rows,
        &png,
        "axum hello over loopback TCP (in-process store)",
        "keep-alive connections",
        "requests/s",
    ) {
        Ok(()) => println!("\nwrote {} and {}", csv.display(), png.display()),
        Err(e) => eprintln!("could not draw {}: {e}", png.display()),
    }
}
