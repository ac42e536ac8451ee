//! A fixed workload for instruction-count profiles of redis-server (`valgrind
//! --tool=callgrind redis-server …`), whose counts stay steady on a noisy machine where
//! `INFO commandstats` times do not: `rounds` calls of tollgate's function library (`FCALL`),
//! each deciding `batches` one-GCRA-rule requests on distinct keys (all admitted, so every
//! rule reads and writes its state), as a coalescing `RedisStore` sends them.
//!
//! `cargo bench -p tollgate-bench --bench redis_profile --no-run`, start `valgrind --tool=callgrind
//! redis-server --port P --save ''`, then
//! `target/release/deps/redis_profile-* redis://127.0.0.1:P <batches> <rounds> [rules]`:
//! it warms up (loads the library, writes every key once), zeroes the counters
//! (`callgrind_control -z`), runs the rounds and dumps (`callgrind_control -d`); the dump's
//! total divided by `batches * rounds` is the server's instructions per decision.
//! Without valgrind it prints Redis's `usec` per decision from `INFO commandstats`.
//! `TOLLGATE_PROFILE_KEYS=1` decides every request on one hot key (the batches of a call
//! fold into one read and one write of its record, lua/call.lua) instead of 1000 keys.
//! `TOLLGATE_LUA_DIR` and `TOLLGATE_PROFILE_ANY_REPLY`: see below.

use redis::Value;
use tollgate::{store::RedisStore, Check, Limiter};

#[path = "support/redis_args.rs"]
mod redis_args;

use redis_args::{rules, sent_argument};

const KEYS: usize = 1000;

fn main() {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .expect("usage: redis_profile URL BATCHES ROUNDS [RULES]");
    let batches: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(32);
    let rounds: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(1000);
    let nrules: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(1);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    if std::env::var("TOLLGATE_PROFILE_CLIENT").is_ok() {
        rt.block_on(client(url, batches, rounds, nrules));
        return;
    }
    rt.block_on(async move {
        let store = RedisStore::connect(&url).await.expect("connect");
        let rules = rules(nrules);
        // Loads the library.
        let limiter = Limiter::new(store);
        let batch: Vec<Check<'_>> = rules.iter().map(|r| Check::new(r, b"warm")).collect();
        limiter.check(&batch).await.expect("decided");
        let client = redis::Client::open(url.as_str()).expect("client");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connection");
        let list: Value = redis::cmd("FUNCTION")
            .arg("LIST")
            .query_async(&mut conn)
            .await
            .expect("FUNCTION LIST");
        let listed = format!("{list:?}");
        // The crate's library: `tollgate_` and 16 hex digits (not redis_floor.py's
        // `tollgate_floor`, nor the `tollgate_profile` loaded below).
        let ours = |at: usize| {
            let hash = listed.get(at + "tollgate_".len()..at + "tollgate_".len() + 16)?;
            hash.bytes()
                .all(|b| b.is_ascii_hexdigit())
                .then(|| format!("tollgate_{hash}"))
        };
        let mut name = listed
            .match_indices("tollgate_")
            .find_map(|(at, _)| ours(at))
            .expect("the library is loaded");
        // TOLLGATE_LUA_DIR=lua: the library built from the files as they are now (as
        // src/store/redis/script.rs builds it), for trying Lua changes without a rebuild.
        if let Ok(dir) = std::env::var("TOLLGATE_LUA_DIR") {
            name = "tollgate_profile".to_owned();
            let source = RedisStore::lua_source(Some(&name), |file, _| {
                std::fs::read_to_string(format!("{dir}/{file}.lua")).expect("lua file")
            });
            let _: Value = redis::cmd("FUNCTION")
                .arg("LOAD")
                .arg("REPLACE")
                .arg(source)
                .query_async(&mut conn)
                .await
                .expect("FUNCTION LOAD");
        }
        let name = name.as_str();
        let keys: usize = std::env::var("TOLLGATE_PROFILE_KEYS")
            .ok()
            .and_then(|k| k.parse().ok())
            .unwrap_or(KEYS);
        let argument = sent_argument(&url, &rules).await;
        let call = |round: usize| {
            let mut cmd = redis::cmd("FCALL");
            cmd.arg(name).arg(batches * rules.len());
            for b in 0..batches {
                let key = (round * batches + b) % keys;
                for r in &rules {
                    cmd.arg(format!("p:{{user-{key}}}:{}", r.name()));
                }
            }
            // As the store sends them (src/store/redis/script.rs `command`): the shape whole
            // for the first batch, "" for each that repeats the one before it.
            for b in 0..batches {
                cmd.arg(if b == 0 { argument.as_slice() } else { &[] });
            }
            cmd
        };
        // One flat array for the call (lua/call.lua): per batch its opening (odd: admitted;
        // 2 added: the instants of the batch before, left out; over 4, the values per rule),
        // now and the wait unless left out, then per rule its values (lua/record.lua's reply).
        let n = rules.len();
        // TOLLGATE_PROFILE_ANY_REPLY=1: any array will do (a library of TOLLGATE_LUA_DIR cut
        // short to see what a stage costs may answer less).
        let any_reply = std::env::var("TOLLGATE_PROFILE_ANY_REPLY").is_ok();
        let check = |reply: &Value| {
            let Value::Array(values) = reply else {
                panic!("{reply:?}")
            };
            if any_reply {
                return;
            }
            let (mut at, mut decided) = (0, 0);
            while at < values.len() {
                at += match values[at] {
                    Value::Int(o) if o % 2 == 1 && (o & 2 == 0 || at > 0) => {
                        let instants = if o & 2 == 0 { 2 } else { 0 };
                        1 + instants + (o / 4) as usize * n
                    }
                    _ => panic!("not admitted: {:?}", &values[at..]),
                };
                decided += 1;
            }
            assert_eq!((at, decided), (values.len(), batches), "{reply:?}");
        };
        for round in 0..KEYS.div_ceil(batches) {
            let reply: Value = call(round).query_async(&mut conn).await.expect("FCALL");
            check(&reply);
        }
        let pid: Value = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut conn)
            .await
            .expect("INFO");
        let pid = match pid {
            Value::BulkString(b) => String::from_utf8_lossy(&b)
                .lines()
                .find_map(|l| l.strip_prefix("process_id:").map(str::to_owned))
                .unwrap_or_default(),
            Value::VerbatimString { text, .. } => text
                .lines()
                .find_map(|l| l.strip_prefix("process_id:").map(str::to_owned))
                .unwrap_or_default(),
            _ => String::new(),
        };
        let callgrind = std::process::Command::new("callgrind_control")
            .args(["-z", pid.trim()])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).contains("OK"))
            .unwrap_or(false);
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut conn)
            .await
            .expect("RESETSTAT");
        let started = std::time::Instant::now();
        for round in 0..rounds {
            let reply: Value = call(round).query_async(&mut conn).await.expect("FCALL");
            check(&reply);
        }
        let elapsed = started.elapsed();
        let decisions = (rounds * batches) as f64;
        if callgrind {
            let _ = std::process::Command::new("callgrind_control")
                .args(["-d", pid.trim()])
                .status();
            println!("dumped; divide the total by {decisions} decisions");
        }
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await
            .expect("INFO");
        let usec: f64 = stats
            .lines()
            .find_map(|l| l.trim().strip_prefix("cmdstat_fcall:"))
            .and_then(|rest| rest.split(',').find_map(|kv| kv.strip_prefix("usec=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        println!(
            "{batches} batches per call, {rounds} calls: {:.2} µs of FCALL per decision, {:.2} µs wall per decision",
            usec / decisions,
            elapsed.as_secs_f64() * 1e6 / decisions
        );
    });
}

/// The client's side (`TOLLGATE_PROFILE_CLIENT=1`, for `perf record` or callgrind on this
/// process): `concurrency` tasks deciding `requests` one-rule requests in all, back to back,
/// through a default (coalescing) `RedisStore`, as benches/redis.rs does.
async fn client(url: String, concurrency: usize, requests: usize, nrules: usize) {
    let store = RedisStore::connect(&url).await.expect("connect");
    let limiter = Limiter::new(store);
    let rules = std::sync::Arc::new(rules(nrules));
    let per_task = requests / concurrency;
    let started = std::time::Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|t| {
            let (limiter, rules) = (limiter.clone(), rules.clone());
            tokio::spawn(async move {
                for i in 0..per_task {
                    let key = format!("user-{}", (t * 7919 + i) % KEYS).into_bytes();
                    let batch: Vec<Check<'_>> = rules.iter().map(|r| Check::new(r, &key)).collect();
                    let outcome = limiter.check(&batch).await.expect("decided");
                    assert!(outcome.is_admitted());
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    let elapsed = started.elapsed();
    println!(
        "{} decisions at concurrency {concurrency}: {:.0}/s",
        per_task * concurrency,
        (per_task * concurrency) as f64 / elapsed.as_secs_f64()
    );
}
