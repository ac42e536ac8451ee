//! A read-only view of the rules a layer runs now, for a dashboard.

use std::time::Duration;

use crate::layer::config::Mode;
use crate::layer::RateLimitLayer;
use crate::limiter::Limiter;
use crate::rule::Rule;

/// A rule a layer runs, as [`RateLimitLayer::rules`] describes it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RuleInfo {
    /// The rule: its [name](Rule::name), [cost](Rule::cost) and
    /// [penalty](Rule::penalty).
    pub rule: Rule,
    /// The algorithm's name as a rules file writes it: `"fixed_window"`, `"sliding_log"`,
    /// `"sliding_window"`, `"token_bucket"`, `"leaky_bucket"` or `"gcra"`.
    pub algorithm: &'static str,
    /// The most units admitted at once.
    pub quota: u64,
    /// The period over which the quota is restored.
    pub period: Duration,
    /// The route patterns the rule applies to, `"*"` for the layer's own limits (every
    /// request), in the order of the layer's configuration.
    pub routes: Vec<String>,
    /// The mode the rule runs in: the layer's, or [`Mode::Shadow`] for a
    /// [`Limit::shadow`](super::super::Limit::shadow).
    pub mode: Mode,
}

impl<St> RateLimitLayer<St> {
    /// The rules the layer runs now, once each: the layer's own limits, then the routes'.
    /// A [reloadable](Self::reloadable) layer answers with the configuration of the last
    /// reload, so a dashboard holding a clone of it follows reloads.
    pub fn rules(&self) -> Vec<RuleInfo> {
        let scope = self.shared.config.current();
        let config = &scope.config;
        let mut infos: Vec<RuleInfo> = Vec::new();
        let global = config.global.iter().map(|l| (l, "*"));
        let routed = config
            .routes
            .iter()
            .flat_map(|r| r.limits.iter().map(move |l| (l, r.pattern.as_str())));
        for (limit, route) in global.chain(routed) {
            let rule = &limit.rule;
            if let Some(info) = infos.iter_mut().find(|i| i.rule.name() == rule.name()) {
                info.routes.push(route.to_owned());
                continue;
            }
            let (quota, period) = rule.algorithm().quota();
            infos.push(RuleInfo {
                rule: rule.clone(),
                algorithm: rule.algorithm().kind(),
                quota,
                period,
                routes: vec![route.to_owned()],
                mode: if limit.shadow {
                    Mode::Shadow
                } else {
                    config.mode
                },
            });
        }
        infos
    }

    /// The layer's limiter: a handle on its store, for [`peek`](Limiter::peek) and
    /// [`reset`](Limiter::reset) of the keys it decides.
    pub fn limiter(&self) -> &Limiter<St> {
        &self.shared.limiter
    }
}
