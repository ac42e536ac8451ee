//! What the layer tells operators: the shadow-mode log names the rule that would have
//! refused, and every metric it records is described (Prometheus's `# HELP`) with its unit.

use std::time::Duration;

use http::{Request, StatusCode};
use tollgate::layer::{Limit, Mode, RateLimitLayer};
use tollgate::{key, Rule};

use crate::support::log::Captured;
use crate::support::service::{call, limiter, with};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn get() -> Request<String> {
    Request::get("/").body(String::new()).unwrap()
}

/// In shadow mode nothing is enforced, and the log line of a would-be refusal names the rule
/// that would have refused (not `rule=""`).
#[tokio::test]
async fn the_shadow_mode_log_line_names_the_rule() -> Result<(), BoxError> {
    let captured = Captured::default();
    let _guard = tracing::subscriber::set_default(captured.clone());
    let svc = with(
        RateLimitLayer::builder()
            .limiter(limiter())
            .limit(Limit::new(
                Rule::fixed_window("wide", 1000, Duration::from_secs(60)),
                key::global(),
            ))
            .limit(Limit::new(
                Rule::sliding_log("sms-minute", 1, Duration::from_secs(60)),
                key::global(),
            ))
            .mode(Mode::Shadow)
            .build()?,
    );
    assert_eq!(call(&svc, get()).await.status(), StatusCode::OK);
    captured.lines();
    assert_eq!(call(&svc, get()).await.status(), StatusCode::OK);
    let lines = captured.lines();
    let line = lines
        .iter()
        .find(|l| l.contains("shadow mode: request would be rate limited"))
        .unwrap_or_else(|| panic!("no shadow-mode line in {lines:?}"));
    assert!(line.contains("rule=\"sms-minute\""), "{line}");
    Ok(())
}

/// The metrics, with the feature that records them.
#[cfg(feature = "metrics")]
mod metrics_described {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, SharedString, Unit};
    use tollgate::layer::{Limit, RateLimitLayer};
    use tollgate::{key, Rule};

    use super::{get, BoxError};
    use crate::support::service::{call, limiter, with};

    /// Each metric's unit and description, by name.
    type Descriptions = BTreeMap<String, (Option<Unit>, String)>;

    /// What a recorder was told: each metric's description and unit, and the metrics recorded.
    #[derive(Clone, Default)]
    struct Told {
        described: Arc<Mutex<Descriptions>>,
        recorded: Arc<Mutex<Vec<String>>>,
    }

    impl Told {
        fn describe(&self, key: KeyName, unit: Option<Unit>, text: SharedString) {
            let mut described = self.described.lock().unwrap();
            described.insert(key.as_str().to_owned(), (unit, text.into_owned()));
        }

        fn record(&self, key: &Key) {
            self.recorded.lock().unwrap().push(key.name().to_owned());
        }
    }

    impl metrics::Recorder for Told {
        fn describe_counter(&self, key: KeyName, unit: Option<Unit>, text: SharedString) {
            self.describe(key, unit, text);
        }
        fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, text: SharedString) {
            self.describe(key, unit, text);
        }
        fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, text: SharedString) {
            self.describe(key, unit, text);
        }
        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            self.record(key);
            Counter::noop()
        }
        fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
            self.record(key);
            Gauge::noop()
        }
        fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
            self.record(key);
            Histogram::noop()
        }
    }

    /// The metric names of the table in the `observe` module's docs.
    fn documented() -> Vec<&'static str> {
        let docs = include_str!("../../src/layer/observe/mod.rs");
        let names: Vec<&str> = docs
            .lines()
            .filter_map(|l| l.strip_prefix("//! | `tollgate_"))
            .filter_map(|l| Some(&l[..l.find('`')?]))
            .collect();
        assert!(names.len() >= 7, "the metrics table moved: {names:?}");
        names
    }

    /// Every metric the docs list is described to the recorder installed when the layer is
    /// built, with a unit where it has one; so is every metric a request records.
    #[test]
    fn every_metric_is_described() -> Result<(), BoxError> {
        let told = Told::default();
        metrics::with_local_recorder(&told, || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()?;
            runtime.block_on(async {
                let svc = with(
                    RateLimitLayer::builder()
                        .limiter(limiter())
                        .limit(Limit::new(
                            Rule::fixed_window("per-minute", 1, Duration::from_secs(60)),
                            key::global(),
                        ))
                        .build()?,
                );
                call(&svc, get()).await;
                call(&svc, get()).await;
                Ok::<_, BoxError>(())
            })
        })?;
        let described = told.described.lock().unwrap();
        for name in documented() {
            let name = format!("tollgate_{name}");
            let (_, text) = described
                .get(&name)
                .unwrap_or_else(|| panic!("{name} is not described: {described:?}"));
            assert!(text.ends_with('.'), "{name}: {text:?}");
        }
        let recorded = told.recorded.lock().unwrap();
        assert!(recorded.contains(&"tollgate_decisions_total".to_owned()));
        for name in recorded.iter() {
            assert!(described.contains_key(name), "{name} is not described");
        }
        let duration = &described["tollgate_store_duration_seconds"];
        assert_eq!(duration.0, Some(Unit::Seconds));
        assert!(described["tollgate_store_health"].1.contains("0 healthy"));
        Ok(())
    }
}
