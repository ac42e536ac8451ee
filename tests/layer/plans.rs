//! Plans through the real layer: the rule is chosen per request from the plan, the policy
//! for an unknown plan is the one chosen, each plan keeps its own state (so moving a key
//! between plans is well defined), plans share one batch with the other limits, and the
//! same holds on Redis.

use crate::support::service::policy;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::support::service::{with, Svc};
use http::{Request, StatusCode};
use parking_lot::Mutex;
use tollgate::layer::{Limit, MissingKey, PlanOf, Plans, RateLimitLayer, UnknownPlan};
use tollgate::{key, Limiter, Rule};
use tower::ServiceExt;

const MINUTE: Duration = Duration::from_secs(60);

/// free: 1 a minute, pro: 3 a minute, per API key.
fn plans(plan_of: PlanOf, unknown: UnknownPlan) -> Plans {
    let limit = |rule| Limit::new(rule, key::header("x-api-key"));
    Plans::new(plan_of, unknown)
        .plan("free", limit(Rule::fixed_window("api-free", 1, MINUTE)))
        .plan("pro", limit(Rule::fixed_window("api-pro", 3, MINUTE)))
}

fn request(api_key: &str, plan: Option<&str>) -> Request<String> {
    let mut r = Request::get("/").header("x-api-key", api_key);
    if let Some(plan) = plan {
        r = r.header("x-plan", plan);
    }
    r.body(String::new()).unwrap()
}

async fn status(svc: &Svc, request: Request<String>) -> StatusCode {
    svc.clone().oneshot(request).await.unwrap().status()
}

fn layer(plans: Plans) -> RateLimitLayer {
    RateLimitLayer::builder().limits(plans).build().unwrap()
}

/// The rule a request is checked against is the one of its plan, and only that rule is
/// advertised.
#[tokio::test]
async fn the_rule_is_the_plans() {
    let svc = with(layer(plans(PlanOf::header("x-plan"), UnknownPlan::Reject)));
    let free = svc
        .clone()
        .oneshot(request("k1", Some("free")))
        .await
        .unwrap();
    assert_eq!(free.status(), StatusCode::OK);
    assert_eq!(policy(&free), "\"api-free\";q=1;w=60");
    assert_eq!(
        status(&svc, request("k1", Some("free"))).await,
        StatusCode::TOO_MANY_REQUESTS
    );

    for _ in 0..3 {
        let pro = svc
            .clone()
            .oneshot(request("k2", Some("pro")))
            .await
            .unwrap();
        assert_eq!(pro.status(), StatusCode::OK);
        assert_eq!(policy(&pro), "\"api-pro\";q=3;w=60");
    }
    assert_eq!(
        status(&svc, request("k2", Some("pro"))).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// An unknown or missing plan follows the chosen policy: refused with a 400, counted as the
/// default plan in that plan's own state, or let through without a limit or its headers.
#[tokio::test]
async fn unknown_plans_follow_the_chosen_policy() {
    // Reject: a plan that is not one, and a request without a plan, are refused.
    let svc = with(layer(plans(PlanOf::header("x-plan"), UnknownPlan::Reject)));
    let gold = svc
        .clone()
        .oneshot(request("k1", Some("gold")))
        .await
        .unwrap();
    assert_eq!(gold.status(), StatusCode::BAD_REQUEST);
    let body = http_body_util::BodyExt::collect(gold.into_body())
        .await
        .unwrap()
        .to_bytes();
    assert!(
        String::from_utf8_lossy(&body).contains("unknown plan"),
        "{body:?}"
    );
    assert_eq!(
        status(&svc, request("k1", None)).await,
        StatusCode::BAD_REQUEST
    );

    // A default plan: counted as free, in free's own state.
    let svc = with(layer(plans(
        PlanOf::header("x-plan"),
        UnknownPlan::Plan("free".into()),
    )));
    assert_eq!(
        status(&svc, request("k1", Some("gold"))).await,
        StatusCode::OK
    );
    assert_eq!(
        status(&svc, request("k1", None)).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        status(&svc, request("k1", Some("free"))).await,
        StatusCode::TOO_MANY_REQUESTS
    );

    // No limit: unknown plans pass without one, and without its headers.
    let svc = with(layer(plans(
        PlanOf::header("x-plan"),
        UnknownPlan::Unlimited,
    )));
    for _ in 0..5 {
        let res = svc
            .clone()
            .oneshot(request("k1", Some("gold")))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(policy(&res), "");
    }
    assert_eq!(
        status(&svc, request("k1", Some("free"))).await,
        StatusCode::OK
    );
    assert_eq!(
        status(&svc, request("k1", Some("free"))).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// A plan header sent twice (a client's own, then the one a gateway appends) names no plan:
/// neither value is trusted, as `key::header` trusts neither, and the request gets what an
/// unknown plan gets.
#[tokio::test]
async fn a_plan_header_sent_twice_names_no_plan() {
    let twice = |first: &str, second: &str| {
        Request::get("/")
            .header("x-api-key", "k1")
            .header("x-plan", first)
            .header("x-plan", second)
            .body(String::new())
            .unwrap()
    };
    let svc = with(layer(plans(PlanOf::header("x-plan"), UnknownPlan::Reject)));
    assert_eq!(
        status(&svc, twice("pro", "free")).await,
        StatusCode::BAD_REQUEST
    );
    let svc = with(layer(plans(
        PlanOf::header("x-plan"),
        UnknownPlan::Plan("free".into()),
    )));
    let res = svc.clone().oneshot(twice("pro", "free")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(policy(&res), "\"api-free\";q=1;w=60");
}

/// A plan in shadow (a new free plan on trial) does not lift the group's refusal of an
/// unknown plan: the refusal is the group's, told by its first enforced plan; only a group
/// all in shadow reports it without refusing.
#[tokio::test]
async fn a_shadow_plan_does_not_lift_the_refusal_of_an_unknown_plan() {
    let limit = |rule| Limit::new(rule, key::header("x-api-key"));
    let group = |free_shadow: bool, pro_shadow: bool| {
        let free = limit(Rule::fixed_window("api-free", 1, MINUTE));
        let pro = limit(Rule::fixed_window("api-pro", 3, MINUTE));
        let shadow = |l: Limit, yes: bool| if yes { l.shadow() } else { l };
        Plans::new(PlanOf::header("x-plan"), UnknownPlan::Reject)
            .plan("free", shadow(free, free_shadow))
            .plan("pro", shadow(pro, pro_shadow))
    };
    let svc = with(layer(group(true, false)));
    assert_eq!(
        status(&svc, request("k1", Some("gold"))).await,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        status(&svc, request("k1", None)).await,
        StatusCode::BAD_REQUEST
    );
    let svc = with(layer(group(true, true)));
    assert_eq!(
        status(&svc, request("k1", Some("gold"))).await,
        StatusCode::OK
    );
}

/// A key moved between plans uses each plan's own state: an upgrade gets the new plan's
/// full quota at once, and a downgrade within the window finds the old plan's units still
/// used.
#[tokio::test]
async fn moving_a_key_between_plans_uses_each_plans_own_state() {
    // The server's records, changed at run time (an upgrade, then a downgrade).
    let records: Arc<Mutex<HashMap<String, &'static str>>> =
        Arc::new(Mutex::new([("k1".to_owned(), "free")].into()));
    let plan_of = {
        let records = records.clone();
        PlanOf::from_fn(move |req| {
            let api_key = req.headers().get("x-api-key")?.to_str().ok()?;
            records.lock().get(api_key).copied()
        })
    };
    let svc = with(layer(plans(plan_of, UnknownPlan::Reject)));
    assert_eq!(status(&svc, request("k1", None)).await, StatusCode::OK);
    assert_eq!(
        status(&svc, request("k1", None)).await,
        StatusCode::TOO_MANY_REQUESTS
    );

    // Upgraded: pro's own quota at once, not what free has used.
    records.lock().insert("k1".to_owned(), "pro");
    for _ in 0..3 {
        assert_eq!(status(&svc, request("k1", None)).await, StatusCode::OK);
    }
    assert_eq!(
        status(&svc, request("k1", None)).await,
        StatusCode::TOO_MANY_REQUESTS
    );

    // Downgraded within the window: free's state still holds its used unit.
    records.lock().insert("k1".to_owned(), "free");
    assert_eq!(
        status(&svc, request("k1", None)).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // A key the records do not know is refused, as chosen.
    assert_eq!(
        status(&svc, request("k9", None)).await,
        StatusCode::BAD_REQUEST
    );
}

/// Plans share one batch with the other limits, so a request its plan refuses consumes
/// nothing of them.
#[tokio::test]
async fn plans_are_one_batch_with_the_other_limits() {
    // A global limit of 2 beside the plans: a request the plan refuses consumes none of it.
    let layer = RateLimitLayer::builder()
        .limit(Limit::new(
            Rule::fixed_window("global", 2, MINUTE),
            key::global(),
        ))
        .route(
            "GET /api/*",
            plans(PlanOf::header("x-plan"), UnknownPlan::Reject),
        )
        .build()
        .unwrap();
    let svc = with(layer.clone());
    let api = |plan: &str| {
        Request::get("/api/x")
            .header("x-api-key", "k1")
            .header("x-plan", plan)
            .body(String::new())
            .unwrap()
    };
    let first = svc.clone().oneshot(api("free")).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(policy(&first), "\"global\";q=2;w=60, \"api-free\";q=1;w=60");
    for _ in 0..3 {
        assert_eq!(
            status(&svc, api("free")).await,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    // The refusals consumed nothing of the global limit: one left.
    assert_eq!(status(&svc, api("pro")).await, StatusCode::OK);
    assert_eq!(
        status(&svc, api("pro")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// Plans that cannot work (an unknown default plan, a plan given twice, no plan at all, or
/// one rule name for two plans' rules) are errors when the layer is built.
#[test]
fn plans_that_cannot_work_are_build_errors() {
    let build = |plans: Plans| RateLimitLayer::builder().limits(plans).build().map(|_| ());
    let global = |rule| Limit::new(rule, key::global());
    let err = build(plans(
        PlanOf::header("x-plan"),
        UnknownPlan::Plan("gold".into()),
    ))
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("\"gold\", which is not one of the plans"),
        "{err}"
    );

    let err = build(
        Plans::new(PlanOf::header("x-plan"), UnknownPlan::Reject)
            .plan("free", global(Rule::fixed_window("api-free", 1, MINUTE)))
            .plan("free", global(Rule::fixed_window("api-free-2", 1, MINUTE))),
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("plan \"free\" is given twice"),
        "{err}"
    );

    let err = build(Plans::new(PlanOf::header("x-plan"), UnknownPlan::Reject)).unwrap_err();
    assert!(err.to_string().contains("no plan given"), "{err}");

    // One name for two plans' different rules: the name is one state, refused.
    let err = build(
        Plans::new(PlanOf::header("x-plan"), UnknownPlan::Reject)
            .plan("free", global(Rule::fixed_window("api", 1, MINUTE)))
            .plan("pro", global(Rule::fixed_window("api", 5, MINUTE))),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("rule name \"api\" is bound to two different rules"),
        "{err}"
    );

    let err = RateLimitLayer::builder()
        .limits(
            Plans::new(PlanOf::header("x plan"), UnknownPlan::Reject).plan(
                "p",
                global(Rule::fixed_window("p", 1, Duration::from_secs(1))),
            ),
        )
        .build()
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("\"x plan\" is not a valid header name"),
        "{err}"
    );
}

/// On Redis, each plan keeps its own state under its own key, and an unknown plan is
/// refused.
#[tokio::test]
async fn plans_on_redis() {
    let server = crate::support::redis_server::RedisServer::start();
    let store = tollgate::store::RedisStore::connect(&server.url())
        .await
        .unwrap();
    let layer = RateLimitLayer::builder()
        .limiter(Limiter::new(store))
        .limits(plans(PlanOf::header("x-plan"), UnknownPlan::Reject))
        .build()
        .unwrap();
    let svc = with(layer.clone());
    assert_eq!(
        status(&svc, request("k1", Some("free"))).await,
        StatusCode::OK
    );
    assert_eq!(
        status(&svc, request("k1", Some("free"))).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // The same key under pro: pro's own state, in its own Redis key.
    for _ in 0..3 {
        assert_eq!(
            status(&svc, request("k1", Some("pro"))).await,
            StatusCode::OK
        );
    }
    assert_eq!(
        status(&svc, request("k1", Some("pro"))).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        status(&svc, request("k1", Some("gold"))).await,
        StatusCode::BAD_REQUEST
    );
    let keys = server.must(&["KEYS", "*"]);
    assert!(
        keys.contains("api-free") && keys.contains("api-pro"),
        "{keys}"
    );
}

/// An unknown plan is refused even when the plan's limit skips requests without a key.
#[tokio::test]
async fn an_unknown_plan_is_refused_even_by_a_limit_that_skips_missing_keys() {
    // free skips requests without an API key; an unknown plan is still refused.
    let free = Limit::new(
        Rule::fixed_window("api-free", 1, MINUTE),
        key::header("x-api-key"),
    )
    .on_missing_key(MissingKey::Skip);
    let pro = Limit::new(
        Rule::fixed_window("api-pro", 3, MINUTE),
        key::header("x-api-key"),
    );
    let plans = Plans::new(PlanOf::header("x-plan"), UnknownPlan::Reject)
        .plan("free", free)
        .plan("pro", pro);
    let svc = with(layer(plans));
    let anonymous_free = Request::get("/")
        .header("x-plan", "free")
        .body(String::new())
        .unwrap();
    assert_eq!(status(&svc, anonymous_free).await, StatusCode::OK);
    assert_eq!(
        status(&svc, request("k1", Some("gold"))).await,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        status(&svc, request("k1", None)).await,
        StatusCode::BAD_REQUEST
    );
}
