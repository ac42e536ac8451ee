//! Rules from a file: the example file builds and enforces what it says, from TOML and from
//! JSON; every kind of mistake is reported with the file, line and field, all at once; the
//! layer's own checks are located at the limit or route they name; and a reloaded file
//! that cannot work leaves the running rules in place.

use crate::support::service::policy;

#[path = "../../examples/reload.rs"]
#[allow(dead_code)]
mod reload_example;

use std::time::Duration;

use crate::support::service::with;
use http::{Request, StatusCode};
use tollgate::key;
use tollgate::layer::rules_file::Loader;
use tollgate::layer::{Limit, RateLimitLayer, RateLimitLayerBuilder};
use tollgate::{store::MemoryStore, ConfigError, Limiter, Rule};
use tower::ServiceExt;

fn builder() -> RateLimitLayerBuilder {
    RateLimitLayer::builder()
}

fn loader() -> Loader {
    Loader::new().key("api-key", key::header("x-api-key"))
}

fn errors(toml: &str) -> Vec<String> {
    let err: ConfigError = loader()
        .from_toml(toml, "rules.toml", builder())
        .unwrap_err();
    err.problems().map(str::to_owned).collect()
}

fn from(peer: &str) -> http::request::Builder {
    let addr: std::net::SocketAddr = format!("{peer}:5000").parse().unwrap();
    let mut builder = Request::builder();
    builder.extensions_mut().unwrap().insert(addr);
    builder
}

/// The example rules file builds a layer that enforces what it says: per-IP and SMS
/// windows, plans by header, and an unknown plan counted as free.
#[tokio::test]
async fn the_example_file_builds_and_enforces_what_it_says() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/rules.toml");
    let layer = loader().load(path, builder()).unwrap();
    let svc = with(layer.clone());

    let sms = || {
        from("127.0.0.1")
            .method("POST")
            .uri("/sms/send")
            .header("user-id", "u1")
            .header("x-forwarded-for", "203.0.113.9")
            .body(String::new())
            .unwrap()
    };
    let first = svc.clone().oneshot(sms()).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(
        policy(&first),
        "\"ip\";q=100;w=10, \"sms-min\";q=1;w=60, \"sms-hour\";q=5;w=3600"
    );
    assert_eq!(
        svc.clone().oneshot(sms()).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );

    // Plans, with the key extractor the code registered.
    let api = |plan: &str| {
        from("127.0.0.1")
            .uri("/api/x")
            .header("x-api-key", "k1")
            .header("x-plan", plan)
            .header("x-forwarded-for", "203.0.113.10")
            .body(String::new())
            .unwrap()
    };
    for _ in 0..3 {
        assert_eq!(
            svc.clone().oneshot(api("free")).await.unwrap().status(),
            StatusCode::OK
        );
    }
    // Unknown plans count as free.
    assert_eq!(
        svc.clone().oneshot(api("gold")).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    let pro = svc.clone().oneshot(api("pro")).await.unwrap();
    assert_eq!(pro.status(), StatusCode::OK);
    assert!(
        policy(&pro).contains("\"api-pro\";q=20;w=2"),
        "{}",
        policy(&pro)
    );
}

/// A rules file in JSON builds like one in TOML, and limits written in code sit beside its
/// limits in the same batch; a problem in it is located by its path.
#[tokio::test]
async fn json_works_too_and_code_limits_sit_beside_the_files() {
    let file: serde_json::Value = serde_json::from_str(
        r#"{ "route": [{ "pattern": "GET /files/{id}", "limit": [
              { "name": "per-user", "fixed_window": { "limit": 2, "window": "1m" },
                "key": { "or": [{ "header": "user-id" }, "global"] } } ] }] }"#,
    )
    .unwrap();
    // A limit that needs code (a cost function) stays in the code, in the same batch.
    let downloads = Limit::new(
        Rule::fixed_window("download-mb", 10, Duration::from_secs(60)),
        key::global(),
    )
    .cost(|_req| 4);
    let layer = Loader::new()
        .from_deserializer(file, builder().limit(downloads))
        .unwrap();
    let svc = with(layer.clone());
    let get = || Request::get("/files/1").body(String::new()).unwrap();
    let first = svc.clone().oneshot(get()).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(
        policy(&first),
        "\"download-mb\";q=10;w=60, \"per-user\";q=2;w=60"
    );
    assert_eq!(
        svc.clone().oneshot(get()).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(
        svc.clone().oneshot(get()).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );

    // Paths, without lines, for a problem in a format without spans.
    let file: serde_json::Value = serde_json::from_str(
        r#"{ "limit": [{ "name": "x", "sliding_log": { "limit": 0, "window": "1s" }, "key": "global" }] }"#,
    )
    .unwrap();
    let err = Loader::new()
        .from_deserializer(file, builder())
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("limit[0].name: rule \"x\": sliding log limit must be at least 1"),
        "{err}"
    );
}

/// A syntax or type error in a rules file is reported with the file, line and field it is
/// in.
#[test]
fn syntax_and_type_errors_name_the_line_and_field() {
    let problems = errors(
        "[[limit]]\nname = \"x\"\nfixed_window = { limit = 1, window = \"1m\" \nkey = \"global\"\n",
    );
    assert_eq!(problems.len(), 1, "{problems:?}");
    // TOML 1.1 lets an inline table go on on the next line: the comma is missing there.
    assert!(
        problems[0].starts_with("rules.toml:4:") && problems[0].contains("missing comma"),
        "{problems:?}"
    );

    let problems = errors(
        "[[limit]]\nname = \"x\"\nfixed_window = { limit = 1, windw = \"1m\" }\nkey = \"global\"\n",
    );
    assert!(
        problems[0].starts_with("rules.toml:3:")
            && problems[0].contains("limit[0].fixed_window")
            && problems[0].contains("unknown field `windw`"),
        "{problems:?}"
    );

    let problems = errors(
        "[[limit]]\nname = \"x\"\nfixed_window = { limit = 1, window = \"1 fortnight\" }\nkey = \"global\"\n",
    );
    assert!(
        problems[0].starts_with("rules.toml:3:")
            && problems[0].contains("limit[0].fixed_window.window")
            && problems[0].contains("\"1 fortnight\" is not a duration"),
        "{problems:?}"
    );

    let problems = errors("mode = \"loud\"\n");
    assert!(
        problems[0].starts_with("rules.toml:1:8: mode") && problems[0].contains("`loud`"),
        "{problems:?}"
    );

    let problems = errors(
        "[[limit]]\nname = \"x\"\nfixed_window = { limit = 1, window = \"1m\" }\nkey = \"peer\"\n",
    );
    assert!(
        problems[0].starts_with("rules.toml:4:")
            && problems[0].contains("limit[0].key")
            && problems[0].contains("unknown key extractor \"peer\""),
        "{problems:?}"
    );
}

/// A field of the wrong type hides nothing: the file's other problems (a zero limit, a
/// route limit of the wrong type, an unknown setting) are reported with it, each at its
/// line and field, and the entries that read are still checked by the layer.
#[test]
fn a_type_error_and_a_zero_limit_are_both_reported() {
    let problems = errors(concat!(
        "log_interval = 5\n",
        "[[limit]]\n",
        "name = \"hourly\"\n",
        "fixed_window = { limit = 5, window = \"1 hour\" }\n",
        "key = \"global\"\n",
        "[[limit]]\n",
        "name = \"none\"\n",
        "fixed_window = { limit = 0, window = \"1m\" }\n",
        "key = \"global\"\n",
        "[[route]]\n",
        "pattern = \"POST /sms\"\n",
        "[[route.limit]]\n",
        "name = \"sms\"\n",
        "sliding_log = { limit = \"one\", window = \"1m\" }\n",
        "key = \"global\"\n",
        "[[route.limit]]\n",
        "name = \"sms-day\"\n",
        "sliding_log = { limit = 0, window = \"1d\" }\n",
        "key = \"global\"\n",
    ));
    assert_eq!(problems.len(), 5, "{problems:?}");
    let found = |at: &str, what: &str| {
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with(at) && p.contains(what)),
            "no {at} … {what} in {problems:?}"
        );
    };
    found("rules.toml:1:", "log_interval");
    found("rules.toml:4:", "\"1 hour\" is not a duration");
    found(
        "rules.toml:7:1: limit[1].name",
        "fixed window limit must be at least 1",
    );
    found("rules.toml:14:", "route[0].limit[0].sliding_log.limit");
    found(
        "rules.toml:17:1: route[0].limit[1].name",
        "must be at least 1",
    );
}

/// Every semantic problem in a rules file is reported at once, each at the line and field
/// where it is written, and the layer's own checks at the limit or route they name.
#[test]
fn every_semantic_problem_at_once_each_where_it_is_written() {
    let toml = r#"
mode = "wait"

[[limit]]
name = "zero"
token_bucket = { capacity = 10, refill = "0/s" }
key = { named = "user" }

[[limit]]
name = "two"
fixed_window = { limit = 1, window = "1m" }
gcra = { rate = "1/s", burst = 1 }
key = "global"

[[limit]]
name = "bad-proxy"
fixed_window = { limit = 1, window = "1m" }
key = { client_ip = { trusted = ["10.0.0.0/8", "not-a-net"] } }
"#;
    let problems = errors(toml);
    let find = |needle: &str| {
        problems
            .iter()
            .find(|p| p.contains(needle))
            .unwrap_or_else(|| panic!("no problem with {needle:?} in {problems:#?}"))
            .clone()
    };
    assert!(find("mode \"wait\" needs max_wait").starts_with("rules.toml:2:1: mode"));
    let named = find("unknown key extractor \"user\"");
    assert!(named.starts_with("rules.toml:7:1: limit[0].key"), "{named}");
    assert!(named.contains("registered: [\"api-key\"]"), "{named}");
    assert!(find("needs exactly one algorithm").starts_with("rules.toml:9:1: limit[1]"));
    assert!(find("not-a-net").starts_with("rules.toml:18:1: limit[2].key"));
    // The layer's own check, in the same reading.
    assert!(find("refill amount must be at least 1").starts_with("rules.toml:5:1: limit[0].name"));
    assert_eq!(problems.len(), 5, "{problems:#?}");

    // The layer's own checks, each located at the limit or route it names.
    let toml = r#"
[[limit]]
name = "zero"
token_bucket = { capacity = 10, refill = "0/s" }
key = "global"

[[route]]
pattern = "/sms/{provider}"
[[route.limit]]
name = "sms"
fixed_window = { limit = 1, window = "1m" }
key = "global"

[[route]]
pattern = "POST /sms/{name}"
[[route.limit]]
name = "sms"
fixed_window = { limit = 2, window = "1m" }
key = "global"
"#;
    let problems = errors(toml);
    let find = |needle: &str| {
        problems
            .iter()
            .find(|p| p.contains(needle))
            .unwrap_or_else(|| panic!("no problem with {needle:?} in {problems:#?}"))
            .clone()
    };
    assert!(find("rule \"zero\"").starts_with("rules.toml:3:1: limit[0].name"));
    assert!(find("can never match").starts_with("rules.toml:15:1: route[1].pattern"));
    assert!(
        find("bound to two different rules").starts_with("rules.toml:10:1: route[0].limit[0].name")
    );
}

/// Plans in a rules file are checked: an unregistered plan lookup, a missing `unknown_plan`
/// and an `unknown_plan` naming no plan are each reported where they are written.
#[test]
fn plans_in_a_file_are_checked() {
    let problems = errors(
        r#"
[[limit]]
key = "global"
plan_of = { named = "nobody" }
plans = [{ plan = "free", name = "free", fixed_window = { limit = 1, window = "1m" } }]
"#,
    );
    assert!(
        problems
            .iter()
            .any(|p| p.starts_with("rules.toml:4:1: limit[0].plan_of")
                && p.contains("unknown plan lookup \"nobody\"")),
        "{problems:#?}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p.starts_with("rules.toml:2:1: limit[0]") && p.contains("need unknown_plan")),
        "{problems:#?}"
    );

    let problems = errors(
        r#"
[[limit]]
key = "global"
plan_of = { header = "x-plan" }
unknown_plan = { plan = "gold" }
plans = [{ plan = "free", name = "free", fixed_window = { limit = 1, window = "1m" } }]
"#,
    );
    assert!(
        problems[0].starts_with("rules.toml:2:1: limit[0]") && problems[0].contains("\"gold\""),
        "{problems:#?}"
    );
}

/// A named key extractor in a rules file reads what the code registered under that name,
/// and a request without the key gets the limit's missing-key policy.
#[tokio::test]
async fn a_named_extractor_is_the_codes() {
    // The file names it; the code decides what it reads.
    let toml = "[[limit]]\nname = \"k\"\nfixed_window = { limit = 1, window = \"1m\" }\nkey = { named = \"api-key\" }\n";
    let layer = loader().from_toml(toml, "rules.toml", builder()).unwrap();
    let svc = with(layer.clone());
    let with_key = |k: &str| {
        Request::get("/")
            .header("x-api-key", k)
            .body(String::new())
            .unwrap()
    };
    assert_eq!(
        svc.clone().oneshot(with_key("a")).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(
        svc.clone().oneshot(with_key("a")).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        svc.clone().oneshot(with_key("b")).await.unwrap().status(),
        StatusCode::OK
    );
    // Without it: the limit's missing-key policy (reject, by default).
    let bare = Request::get("/").body(String::new()).unwrap();
    assert_eq!(
        svc.oneshot(bare).await.unwrap().status(),
        StatusCode::BAD_REQUEST
    );
}

/// Reloading a file that cannot build leaves the running rules in place, and a later good
/// file replaces them while keeping the units counted under the same rule name.
#[tokio::test]
async fn an_invalid_file_leaves_the_running_rules() {
    let dir = std::env::temp_dir().join(format!("tollgate-rules-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rules.toml");
    let write = |limit: u64| {
        let text = format!(
            "[[limit]]\nname = \"all\"\nfixed_window = {{ limit = {limit}, window = \"1m\" }}\nkey = \"global\"\n"
        );
        std::fs::write(&path, text).unwrap();
    };
    write(1);
    let (layer, handle) = loader().load(&path, builder()).unwrap().reloadable();
    let svc = with(layer.clone());
    let get = || Request::get("/").body(String::new()).unwrap();
    assert_eq!(
        policy(&svc.clone().oneshot(get()).await.unwrap()),
        "\"all\";q=1;w=60"
    );

    write(0);
    let err = loader().load(&path, handle.builder()).unwrap_err();
    assert!(
        err.to_string().contains("rules.toml:2:1: limit[0].name"),
        "{err}"
    );
    // Not replaced: still the old rule's limit.
    assert_eq!(
        svc.clone().oneshot(get()).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );

    write(3);
    handle.reload(loader().load(&path, handle.builder()).unwrap());
    let res = svc.clone().oneshot(get()).await.unwrap();
    assert_eq!(policy(&res), "\"all\";q=3;w=60");
    // The same name with other parameters: the unit used under the old rule still counts.
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        svc.clone().oneshot(get()).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(
        svc.oneshot(get()).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The reload example picks up a changed rules file, keeps the running rules when the file
/// is broken, and takes a later good file.
#[tokio::test]
async fn the_example_reloads_a_changed_file_and_keeps_the_rules_of_a_broken_one() {
    let dir = std::env::temp_dir().join(format!("tollgate-watch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rules.toml");
    let rules = |limit: &str| {
        format!("[[limit]]\nname = \"all\"\nfixed_window = {{ limit = {limit}, window = \"1m\" }}\nkey = \"global\"\n")
    };
    std::fs::write(&path, rules("1")).unwrap();
    let loader = reload_example::loader();
    let (layer, handle) =
        reload_example::load(&loader, &path, Limiter::new(MemoryStore::new())).unwrap();
    let svc = with(layer.clone());
    let watcher = tokio::spawn(reload_example::watch(
        loader,
        path.clone(),
        handle,
        Duration::from_millis(10),
    ));
    let current = || async {
        let res = svc
            .clone()
            .oneshot(Request::get("/").body(String::new()).unwrap())
            .await
            .unwrap();
        policy(&res)
    };
    let wait_for = |want: &'static str| {
        let current = &current;
        async move {
            for _ in 0..500 {
                if current().await == want {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            false
        }
    };
    assert!(wait_for("\"all\";q=1;w=60").await);
    std::fs::write(&path, rules("7")).unwrap();
    assert!(
        wait_for("\"all\";q=7;w=60").await,
        "the changed file was loaded"
    );
    // Broken: a limit of "many". The rules stay; a later good file is still taken.
    std::fs::write(&path, rules("\"many\"")).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(current().await, "\"all\";q=7;w=60");
    std::fs::write(&path, rules("12")).unwrap();
    assert!(
        wait_for("\"all\";q=12;w=60").await,
        "a good file after a broken one"
    );
    watcher.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A file that trusts every address as a proxy is refused with the way out named, and
/// loads once it asks for that by name.
#[test]
fn trusting_everyone_in_a_file_is_refused_unless_asked_for() {
    let toml = |allow: &str| {
        format!(
            r#"
[[limit]]
name = "per-client"
fixed_window = {{ limit = 1, window = "1m" }}
key = {{ client_ip = {{ trusted = ["0.0.0.0/0"]{allow} }} }}
"#
        )
    };
    let problems = errors(&toml(""));
    assert!(
        problems
            .iter()
            .any(|p| p.contains("allow_trusting_everyone")),
        "{problems:#?}"
    );
    assert!(loader()
        .from_toml(
            &toml(", allow_trusting_everyone = true"),
            "rules.toml",
            builder()
        )
        .is_ok());
}

/// A route in a rules file whose method no client sends, or whose path is in axum 0.7's
/// syntax, is refused where it is written, with the pattern to write.
#[test]
fn a_route_that_cannot_mean_what_it_says_is_refused_in_a_file() {
    for (pattern, fix) in [
        ("POTS /sms/send", "write \"POST\""),
        ("GET /files/:id", "write \"/files/{id}\""),
    ] {
        let toml = format!(
            "[[route]]\npattern = \"{pattern}\"\n[[route.limit]]\nname = \"r\"\nfixed_window = {{ limit = 1, window = \"1m\" }}\nkey = \"global\"\n"
        );
        let problems = errors(&toml);
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("rules.toml:2:1: route[0].pattern") && p.contains(fix)),
            "{pattern}: {problems:#?}"
        );
    }
}

/// A file's problems come in one reading, in the order they are written, whatever kind
/// they are: a method typo and a zero capacity (the layer's checks) beside an unknown key
/// (the file's), in the same entry or another, and a typo of a known name names it.
#[test]
fn every_problem_in_one_reading_by_line_with_the_name_a_typo_stands_for() {
    let problems = errors(concat!(
        "mode = \"enforc\"\n",
        "[[route]]\n",
        "pattern = \"POTS /sms\"\n",
        "[[route.limit]]\n",
        "name = \"sms\"\n",
        "token_bucket = { capacity = 0, refill = \"1/m\" }\n",
        "key = \"global\"\n",
        "colour = \"red\"\n",
        "[[limit]]\n",
        "name = \"ip\"\n",
        "token_bukcet = { capacity = 1, refill = \"1/s\" }\n",
        "key = \"peer_ip\"\n",
    ));
    let expected = [
        "rules.toml:1:8: mode: unknown variant `enforc`: did you mean `enforce`?",
        "rules.toml:3:1: route[0].pattern: route \"POTS /sms\": \"POTS\" is not an HTTP method",
        "rules.toml:5:1: route[0].limit[0].name: rule \"sms\": token bucket capacity must be at least 1",
        "rules.toml:8:1: route[0].limit[0].colour: unknown field `colour`, expected one of",
        "rules.toml:11:1: limit[0].token_bukcet: unknown field `token_bukcet`: did you mean `token_bucket`?",
    ];
    assert_eq!(problems.len(), expected.len(), "{problems:#?}");
    for (problem, expected) in problems.iter().zip(expected) {
        assert!(
            problem.starts_with(expected),
            "{problem:?}, not {expected:?}"
        );
    }
}

/// A key extractor's name with a typo, built-in or registered by the code, names the one it
/// stands for; so does a plan lookup's.
#[test]
fn a_typo_in_a_key_or_plan_lookup_name_names_the_known_one() {
    let limit = |key: &str| {
        format!("[[limit]]\nname = \"x\"\nfixed_window = {{ limit = 1, window = \"1m\" }}\nkey = {key}\n")
    };
    for (key, near) in [
        ("\"peer-ip\"", "did you mean \"peer_ip\"?"),
        ("{ named = \"api_key\" }", "did you mean \"api-key\"?"),
    ] {
        let problems = errors(&limit(key));
        assert!(
            problems.len() == 1
                && problems[0].starts_with("rules.toml:4:")
                && problems[0].contains(near),
            "{key}: {problems:#?}"
        );
    }
    let loader = loader().plan_of(
        "plan-of-key",
        tollgate::layer::PlanOf::from_fn(|_| Some("free")),
    );
    let toml = "[[limit]]\nkey = \"global\"\nplan_of = { named = \"plan_of_key\" }\nunknown_plan = \"reject\"\nplans = [{ plan = \"free\", name = \"f\", fixed_window = { limit = 1, window = \"1m\" } }]\n";
    let err = loader.from_toml(toml, "rules.toml", builder()).unwrap_err();
    assert!(
        err.to_string().contains("did you mean \"plan-of-key\"?"),
        "{err}"
    );
}
