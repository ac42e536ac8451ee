//! The admin page's HTML: server-rendered, every value escaped, no external asset, usable
//! without JavaScript (a small inline script only reloads it every few seconds while
//! nobody is typing).

use std::fmt::Write;

use super::text::{clock_time, html, key_html, wait_text};
use super::view::{DecisionsView, Found, HealthView, KeyState, LockedView, RuleView, TopView};

/// The page's style. A tuple key's separator is drawn as a rule between its parts (the
/// `␟` glyph is missing from many fonts), its text kept in the page for copying back.
const STYLE: &str = "body{font:14px system-ui,sans-serif;margin:1.5em;color:#222;max-width:1100px}\
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}\
table{border-collapse:collapse}td,th{padding:.25em .7em;text-align:left;border-bottom:1px solid #eee}\
code{background:#f4f4f4;padding:0 .25em}.ok{color:#287a3e}.bad{color:#b3261e}.note{color:#666}\
.legend span{margin-right:1em}.a{color:#287a3e}.d{color:#c77700}.x{color:#b3261e}\
form.inline{display:inline}button{cursor:pointer}\
.part{border:1px dotted #aaa;padding:0 .15em}\
.sep{display:inline-block;width:0;height:14px;border-left:2px solid #999;margin:0 4px;\
vertical-align:middle;font-size:0}\
p.store{margin:.3em 0}";

/// Reloads the page every five seconds unless a field has the focus.
const SCRIPT: &str = "setInterval(function(){var a=document.activeElement;\
if(!a||a===document.body)location.reload();},5000);";

/// A whole page around `body`.
pub(crate) fn document(title: &str, body: &str, refresh: bool) -> String {
    let script = if refresh {
        format!("<script>{SCRIPT}</script>")
    } else {
        String::new()
    };
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width\"><title>{}</title>\
<style>{STYLE}</style></head><body>{body}{script}</body></html>",
        html(title)
    )
}

/// The login form, with a message when the last attempt failed.
pub(crate) fn login(base: &str, failed: bool) -> String {
    login_with(base, if failed { "That is not the token." } else { "" })
}

/// The login form, with `message` (if any) above it.
pub(crate) fn login_with(base: &str, message: &str) -> String {
    let message = if message.is_empty() {
        String::new()
    } else {
        format!("<p class=\"bad\">{}</p>", html(message))
    };
    let body = format!(
        "<h1>tollgate admin</h1>{message}<form method=\"post\" action=\"{}/login\">\
<label>Admin token <input type=\"password\" name=\"token\" autocomplete=\"current-password\" autofocus></label> \
<button type=\"submit\">Sign in</button></form>",
        html(base)
    );
    document("tollgate admin: sign in", &body, false)
}

/// What the page shows.
pub(crate) struct Page<'a> {
    /// Where the router is mounted (`/admin`), or empty at the root.
    pub(crate) base: &'a str,
    pub(crate) rules: &'a [RuleView],
    pub(crate) decisions: &'a [DecisionsView],
    pub(crate) top: &'a [TopView],
    /// The keys each rule with a penalty locks, or why the store could not say.
    pub(crate) locked: Result<Vec<LockedView>, String>,
    pub(crate) health: &'a HealthView,
    pub(crate) csrf: &'a str,
    pub(crate) lookup: Option<Result<Lookup, String>>,
    pub(crate) notice: Option<String>,
}

/// What the lookup form asked and found.
pub(crate) struct Lookup {
    /// The key as typed (in [`key_text`](super::text::key_text)'s form).
    pub(crate) key: String,
    /// The rule it was asked under, if one.
    pub(crate) rule: Option<String>,
    pub(crate) found: Found,
}

/// The admin page.
pub(crate) fn page(page: &Page<'_>) -> String {
    let mut body = String::from("<h1>tollgate: rate limits</h1>");
    let _ = write!(
        body,
        "<form class=\"inline\" method=\"post\" action=\"{}/logout\" id=\"logout\">\
<input type=\"hidden\" name=\"csrf\" value=\"{}\"><button type=\"submit\">Sign out</button></form>",
        html(page.base),
        html(page.csrf)
    );
    if let Some(notice) = &page.notice {
        let _ = write!(body, "<p class=\"ok\" id=\"notice\">{}</p>", html(notice));
    }
    body.push_str(&health(page.health));
    body.push_str(&locked_section(page));
    body.push_str(&lookup_form(page));
    for rule in page.rules {
        body.push_str(&rule_section(page, rule));
    }
    body.push_str("<p class=\"note\">Decisions and top keys are this instance's; a key's state is the store's, shared by every instance.</p>");
    document("tollgate admin", &body, page.lookup.is_none())
}

/// The store's health, and the state of what the router watches beside it.
fn health(health: &HealthView) -> String {
    let class = |good: bool| if good { "ok" } else { "bad" };
    let mut out = format!(
        "<p class=\"store\">Store: <strong class=\"{}\" id=\"health\">{}</strong> <span class=\"note\">({})</span></p>",
        class(health.health == "healthy"),
        html(health.health),
        html(health.meaning)
    );
    if let Some(breaker) = &health.breaker {
        let _ = write!(
            out,
            "<p class=\"store\">Circuit breaker: <strong class=\"{}\" id=\"breaker\">{}</strong> <span class=\"note\">({})</span></p>",
            class(breaker.state == "closed"),
            html(breaker.state),
            html(breaker.meaning)
        );
    }
    if let Some(memory) = &health.memory_store {
        let state = if memory.full {
            format!(
                "<strong class=\"bad\" id=\"memory\">full</strong>: {} entries forgotten to make room for new keys, and {} decisions refused for want of room (a shard full of locked keys), in the last {}",
                memory.evicted_recently,
                memory.refused_recently,
                wait_text(u128::from(memory.recent_seconds) * 1000)
            )
        } else {
            "<strong class=\"ok\" id=\"memory\">not full</strong>: no entry forgotten lately"
                .to_owned()
        };
        let _ = write!(
            out,
            "<p class=\"store\">In-process store: {state}; {} keys held, {} forgotten and {} refused in all. <span class=\"note\">{}</span></p>",
            memory.keys,
            memory.evictions,
            memory.refusals,
            html(memory.when_full)
        );
    }
    out
}

/// The keys locked now, rule by rule, each with the end of its lock and an unblock button.
fn locked_section(page: &Page<'_>) -> String {
    let mut out = String::from("<h2>Locked keys</h2>");
    let views = match &page.locked {
        Ok(views) => views,
        Err(message) => {
            let _ = write!(out, "<p class=\"bad\">{}</p>", html(message));
            return out;
        }
    };
    if views.is_empty() {
        out.push_str("<p class=\"note\">No rule locks keys: none has a penalty.</p>");
        return out;
    }
    let count: usize = views.iter().map(|v| v.keys.len()).sum();
    if count == 0 {
        out.push_str(
            "<p class=\"note\" id=\"locked\">No key locked, of those this instance saw denied.</p>",
        );
        return out;
    }
    out.push_str(
        "<table id=\"locked\"><tr><th>rule</th><th>key</th><th>locked until</th><th></th></tr>",
    );
    for view in views {
        for key in &view.keys {
            let _ = write!(
                out,
                "<tr><td>{}</td><td><code class=\"key\">{}</code></td><td>{} <span class=\"note\">(in {})</span></td><td>{}</td></tr>",
                html(&view.rule),
                key_html(&key.key.key),
                clock_time(key.until_unix_ms),
                wait_text(key.retry_after_ms),
                unblock_button(page, &view.rule, &key.key.key_hex, key.key.digested)
            );
        }
    }
    out.push_str("</table>");
    let more: usize = views.iter().map(|v| v.more).sum();
    if more > 0 {
        let _ = write!(out, "<p class=\"note\">… and about {more} more.</p>");
    }
    let forgotten: u64 = views.iter().map(|v| v.forgotten).sum();
    if forgotten > 0 {
        let _ = write!(
            out,
            "<p class=\"bad\" id=\"locks-forgotten\">{forgotten} more locked keys were too many for this instance to remember: this list is not complete. Look a key up whole to see its state.</p>"
        );
    }
    out.push_str("<p class=\"note\">The keys this instance saw denied as locked, as the store has them now.</p>");
    out
}

fn lookup_form(page: &Page<'_>) -> String {
    let action = if page.base.is_empty() { "/" } else { page.base };
    let mut out = format!(
        "<h2>Look up a key</h2><form method=\"get\" action=\"{}\" id=\"lookup\">",
        html(action)
    );
    let asked = page.lookup.as_ref().and_then(|l| l.as_ref().ok());
    let asked_rule = asked.and_then(|l| l.rule.as_deref());
    out.push_str("<label>Rule <select name=\"rule\"><option value=\"\">any</option>");
    for rule in page.rules {
        let selected = if asked_rule == Some(rule.name.as_str()) {
            " selected"
        } else {
            ""
        };
        let _ = write!(out, "<option{selected}>{}</option>", html(&rule.name));
    }
    let _ = write!(
        out,
        "</select></label> <label>Key, or a part of one (a user, an address) <input name=\"key\" size=\"40\" value=\"{}\"></label> <button type=\"submit\">Look up</button></form>",
        html(asked.map_or("", |l| l.key.as_str()))
    );
    match &page.lookup {
        Some(Ok(lookup)) => out.push_str(&found(lookup, page)),
        Some(Err(message)) => {
            let _ = write!(
                out,
                "<p class=\"bad\" id=\"lookup-result\">{}</p>",
                html(message)
            );
        }
        None => {}
    }
    out
}

/// The keys a lookup found, each with its state and an unblock button.
fn found(lookup: &Lookup, page: &Page<'_>) -> String {
    let keys = &lookup.found.keys;
    if keys.is_empty() {
        return format!(
            "<p id=\"lookup-result\">No key <code>{0}</code>, nor any this instance saw denied with <code>{0}</code> as a part, has state in the store{1}.</p>{2}",
            key_html(&lookup.key),
            lookup.rule.as_deref().map(|r| format!(" under {}", html(r))).unwrap_or_else(|| " under any rule".to_owned()),
            forgotten_locks(&lookup.found)
        );
    }
    let mut out = String::from("<table id=\"lookup-result\"><tr><th>rule</th><th>key</th><th>next request</th><th>quota</th><th></th></tr>");
    for state in keys {
        out.push_str(&key_state(state, page));
    }
    out.push_str("</table>");
    if lookup.found.more > 0 {
        let _ = write!(
            out,
            "<p class=\"note\">… and {} more keys with that part.</p>",
            lookup.found.more
        );
    }
    out.push_str(&forgotten_locks(&lookup.found));
    out
}

/// The warning that a lookup by a part may miss locked keys this instance forgot.
fn forgotten_locks(found: &Found) -> String {
    if found.locks_forgotten == 0 {
        return String::new();
    }
    format!(
        "<p class=\"bad\" id=\"locks-forgotten\">{} locked keys were too many for this instance to remember: a key with this part may be locked and not found here. Look it up whole (every part) to see its state in the store.</p>",
        found.locks_forgotten
    )
}

fn key_state(state: &KeyState, page: &Page<'_>) -> String {
    let verdict = match (state.locked, state.admitted) {
        (true, _) => "<strong class=\"bad\">locked</strong>",
        (false, true) => "<strong class=\"ok\">admitted</strong>",
        (false, false) => "<strong class=\"bad\">denied</strong>",
    };
    let retry = match (state.locked_until_unix_ms, state.retry_after_ms) {
        (Some(until), Some(ms)) => format!(" until {} (in {})", clock_time(until), wait_text(ms)),
        (None, Some(ms)) => format!(", retry in {}", wait_text(ms)),
        _ => String::new(),
    };
    format!(
        "<tr><td>{}</td><td><code class=\"key\">{}</code></td><td>{verdict}{retry}</td>\
<td>{} of {} left, full again in {}</td><td>{}</td></tr>",
        html(&state.rule),
        key_html(&state.key.key),
        state.remaining,
        state.limit,
        wait_text(state.reset_ms),
        unblock_button(page, &state.rule, &state.key.key_hex, state.key.digested),
    )
}

/// A form that unblocks one key: a POST carrying the anti-forgery token.
fn unblock_button(page: &Page<'_>, rule: &str, key_hex: &str, digested: bool) -> String {
    format!(
        "<form class=\"inline\" method=\"post\" action=\"{}/unblock\">\
<input type=\"hidden\" name=\"rule\" value=\"{}\"><input type=\"hidden\" name=\"key_hex\" value=\"{}\">\
<input type=\"hidden\" name=\"digested\" value=\"{digested}\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">\
<button type=\"submit\">Unblock</button></form>",
        html(page.base),
        html(rule),
        html(key_hex),
        html(page.csrf)
    )
}

fn rule_section(page: &Page<'_>, rule: &RuleView) -> String {
    let mut out = format!(
        "<h2 id=\"rule-{0}\">{0}</h2><p><code>{1}</code>: {2} per {3} s",
        html(&rule.name),
        rule.algorithm,
        rule.limit,
        rule.period_ms as f64 / 1000.0
    );
    if let Some(p) = &rule.penalty {
        let _ = write!(
            out,
            "; locked for {} s after {} denials within {} s",
            p.lock_for_ms / 1000,
            p.after,
            p.within_ms / 1000
        );
    }
    let routes: Vec<String> = rule.routes.iter().map(|r| html(r)).collect();
    let _ = write!(
        out,
        "; routes <code>{}</code>; mode {}.</p>",
        routes.join("</code>, <code>"),
        rule.mode
    );
    if let Some(decisions) = page.decisions.iter().find(|d| d.rule == rule.name) {
        out.push_str(&chart(decisions));
    }
    if let Some(top) = page.top.iter().find(|t| t.rule == rule.name) {
        out.push_str(&top_table(top, page));
    }
    out
}

/// How long `seconds` span, in whole minutes from a minute on and in seconds below it (a
/// process's first minute is not "0 minutes"), with the unit words given.
fn span(seconds: usize, unit_seconds: &str, unit_minutes: &str) -> String {
    match seconds {
        0..60 => format!("{seconds} {unit_seconds}"),
        _ => format!("{} {unit_minutes}", seconds / 60),
    }
}

/// Decisions per second over the ring's minutes as an inline SVG chart.
pub(crate) fn chart(d: &DecisionsView) -> String {
    let (width, height) = (600.0, 120.0);
    let series = [
        (&d.admitted, "#287a3e", "admitted"),
        (&d.delayed, "#c77700", "delayed"),
        (&d.denied, "#b3261e", "denied"),
    ];
    let max = series
        .iter()
        .flat_map(|s| s.0.iter())
        .copied()
        .max()
        .unwrap_or(0)
        .max(1);
    let n = d.admitted.len().max(2);
    let mut out = format!(
        "<svg class=\"chart\" role=\"img\" width=\"{width}\" height=\"{}\" viewBox=\"0 0 {width} {}\" xmlns=\"http://www.w3.org/2000/svg\">\
<title>{}: decisions per second, last {}</title>\
<rect x=\"0\" y=\"0\" width=\"{width}\" height=\"{height}\" fill=\"#fafafa\" stroke=\"#ddd\"/>",
        height + 16.0,
        height + 16.0,
        html(&d.rule),
        span(n, "seconds", "minutes")
    );
    for (values, colour, name) in series {
        let points: Vec<String> = values
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let x = i as f64 * width / (n - 1) as f64;
                let y = height - v as f64 * (height - 4.0) / max as f64;
                format!("{x:.1},{y:.1}")
            })
            .collect();
        let _ = write!(
            out,
            "<polyline class=\"{name}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{}\"/>",
            points.join(" ")
        );
    }
    let _ = write!(
        out,
        "<text x=\"4\" y=\"12\" font-size=\"11\" fill=\"#666\">{max}/s</text>\
<text x=\"0\" y=\"{0}\" font-size=\"11\" fill=\"#666\">−{1}</text>\
<text x=\"{2}\" y=\"{0}\" font-size=\"11\" fill=\"#666\" text-anchor=\"end\">now</text></svg>",
        height + 14.0,
        span(n, "s", "min"),
        width
    );
    let total = |v: &Vec<u64>| v.iter().sum::<u64>();
    let _ = write!(
        out,
        "<p class=\"legend\"><span class=\"a\">■ admitted {}</span><span class=\"d\">■ delayed {}</span><span class=\"x\">■ denied {}</span></p>",
        total(&d.admitted),
        total(&d.delayed),
        total(&d.denied)
    );
    out
}

fn top_table(top: &TopView, page: &Page<'_>) -> String {
    let mut out = format!(
        "<p>Most denied keys, last {}–{} min: {} denials, about {} distinct keys \
<span class=\"note\">(counts are at most ± {} off; a key denied more often is listed)</span></p>",
        top.period_seconds / 60,
        2 * top.period_seconds / 60,
        top.denials,
        top.distinct_keys,
        top.error_bound
    );
    if top.keys.is_empty() {
        out.push_str("<p class=\"note\">No key denied.</p>");
        return out;
    }
    out.push_str("<table class=\"top\"><tr><th>key</th><th>denials</th><th></th></tr>");
    for key in &top.keys {
        let error = if key.error > 0 {
            format!(" (≤ {} over)", key.error)
        } else {
            String::new()
        };
        let _ = write!(
            out,
            "<tr><td><code class=\"key\">{}</code></td><td>{}{error}</td><td>{}</td></tr>",
            key_html(&key.key.key),
            key.denials,
            unblock_button(page, &top.rule, &key.key.key_hex, key.key.digested)
        );
    }
    out.push_str("</table>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chart's time axis never reads "−0 min": under a minute of history it counts
    /// seconds, from a minute on whole minutes.
    #[test]
    fn a_short_history_is_labelled_in_seconds() {
        let view = |seconds: usize| DecisionsView {
            rule: "api".into(),
            admitted: vec![1; seconds],
            delayed: vec![0; seconds],
            denied: vec![0; seconds],
        };
        let young = chart(&view(12));
        assert!(
            young.contains(">−12 s<") && young.contains("last 12 seconds"),
            "{young}"
        );
        assert!(!young.contains("0 min"), "{young}");
        let old = chart(&view(600));
        assert!(
            old.contains(">−10 min<") && old.contains("last 10 minutes"),
            "{old}"
        );
    }
}
