//! The layer against hostile clients and careless configuration: route patterns that can
//! never match, exemptions, shadow rules in the headers and in the batch, logs that cannot
//! flood (issue #10).

use std::convert::Infallible;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tollgate::layer::{Limit, RateLimitLayer};
use tollgate::{key, Limiter, ManualClock, MemoryStore, Rule, Store};
use tower::util::BoxCloneService;
use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};

type Svc =
    BoxCloneService<Request<String>, Response<tollgate::layer::RateLimitBody<String>>, Infallible>;

fn with<St: Store + Clone>(layer: RateLimitLayer<St>) -> Svc {
    let svc =
        ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(|_req: Request<String>| async {
                Ok::<_, Infallible>(Response::new(String::from("ok")))
            }));
    BoxCloneService::new(svc)
}

fn limiter() -> Limiter<MemoryStore> {
    Limiter::new(MemoryStore::with_clock(ManualClock::new(
        1_700_000_000_000_000,
    )))
}

async fn call(
    svc: &Svc,
    request: Request<String>,
) -> Response<tollgate::layer::RateLimitBody<String>> {
    svc.clone().oneshot(request).await.unwrap()
}

fn one_per_minute(name: &str) -> Result<Limit, BoxError> {
    Ok(Limit::new(
        Rule::fixed_window(name, 1, Duration::from_secs(60))?,
        key::global(),
    ))
}

fn route_error(layer: Result<RateLimitLayer, tollgate::ConfigError>) -> String {
    match layer {
        Ok(_) => panic!("the route table was accepted"),
        Err(e) => e.to_string(),
    }
}

// ---- 5: route patterns that can never match ----

#[test]
fn a_pattern_that_can_never_match_is_refused_when_built() -> Result<(), BoxError> {
    let route = |pattern: &str| {
        route_error(RateLimitLayer::new(limiter()).route(pattern, [one_per_minute("r").unwrap()]))
    };
    // Methods are case-sensitive: "post" is an extension method no client sends for POST.
    let lower = route("post /sms/send");
    assert!(lower.contains("\"POST\""), "{lower}");
    assert!(route("Get /x").contains("\"GET\""));
    // The query and the fragment are never part of the path a request is matched on.
    assert!(route("GET /search?q=1").contains('?'));
    assert!(route("/page#top").contains('#'));
    // A client sends neither spaces, non-ASCII nor dot segments in a path.
    assert!(!route("GET /a b").is_empty());
    assert!(!route("/café").is_empty());
    assert!(!route("/a/../b").is_empty());
    assert!(!route("/a/./b").is_empty());
    Ok(())
}

#[test]
fn a_route_an_earlier_route_shadows_is_refused_naming_both() -> Result<(), BoxError> {
    let table = |patterns: &[&str]| {
        let mut layer = Ok(RateLimitLayer::new(limiter()));
        for (i, p) in patterns.iter().enumerate() {
            layer = layer.and_then(|l| l.route(p, [one_per_minute(&format!("r{i}")).unwrap()]));
        }
        layer
    };
    let shadowed = route_error(table(&["/sms/*", "POST /sms/send"]));
    assert!(shadowed.contains("\"POST /sms/send\""), "{shadowed}");
    assert!(shadowed.contains("\"/sms/*\""), "{shadowed}");
    assert!(!route_error(table(&["/files/{id}", "GET /files/latest"])).is_empty());
    assert!(!route_error(table(&["GET /x", "HEAD /x"])).is_empty());
    assert!(!route_error(table(&["/x", "/x/"])).is_empty());
    assert!(!route_error(table(&["/*", "/anything/{id}"])).is_empty());
    assert!(!route_error(table(&["/api/{*rest}", "/api"])).is_empty());

    // Specific first, then the prefix that contains it: fine. So are overlaps that leave the
    // later route some requests of its own.
    table(&["POST /sms/send", "/sms/*"])?;
    table(&["GET /files/latest", "/files/{id}"])?;
    table(&["HEAD /x", "GET /x"])?;
    table(&["POST /x", "/x"])?;
    table(&["/api/{id}", "/api/*"])?;
    table(&["/a/{id}/b", "/a/c/{id}"])?;
    Ok(())
}

#[tokio::test]
async fn every_accepted_route_still_limits_through_the_layer() -> Result<(), BoxError> {
    let svc = with(
        RateLimitLayer::new(limiter())
            .route("POST /sms/send", [one_per_minute("sms")?])?
            .route("/sms/*", [one_per_minute("sms-other")?])?,
    );
    let post = || Request::post("/sms/send").body(String::new()).unwrap();
    assert_eq!(call(&svc, post()).await.status(), StatusCode::OK);
    assert_eq!(call(&svc, post()).await.status(), StatusCode::TOO_MANY_REQUESTS);
    let other = || Request::get("/sms/send").body(String::new()).unwrap();
    assert_eq!(call(&svc, other()).await.status(), StatusCode::OK);
    assert_eq!(call(&svc, other()).await.status(), StatusCode::TOO_MANY_REQUESTS);
    Ok(())
}
