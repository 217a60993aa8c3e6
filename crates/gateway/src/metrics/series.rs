//! The gateway's counters and histograms, fed from worker records by the control thread, and
//! rendering of the whole metric set.
//!
//! Owns the series of every `rolter_*` counter and histogram. Series are indexed by
//! (route, target) and by the few values seen per pair (status codes, fallback reasons), so a
//! record costs an index and a short scan; a label set is allocated only when a series first
//! appears. Per-target counters exist from the start at zero; the others appear with their
//! first record, so routes and targets that never met add no series. It must not be used
//! from worker threads.

use std::borrow::Cow;
use std::cell::Cell;
use std::marker::PhantomData;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Metric, Registry};

use super::gauges::{self, TargetGauges};
use rolter_engine::kv::reports::KvTargetReport;
use rolter_strategy::Sample;

/// `rolter_ttft_seconds` bucket bounds: 5 ms (a warm prefix cache) to 60 s (a long queue
/// in front of a long prefill).
pub const TTFT_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0,
];

/// `rolter_request_duration_seconds` bucket bounds: 10 ms (an error or an embedding) to
/// 10 min (a long streamed generation).
pub const DURATION_BUCKETS: [f64; 16] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// `rolter_time_per_output_token_seconds` bucket bounds: 1 ms to 1 s between tokens.
pub const TPOT_BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0,
];

/// The `codes` key of cut-off responses (no HTTP status is 1).
const INTERRUPTED: u16 = 1;

fn ttft_histogram() -> Histogram {
    Histogram::new(TTFT_BUCKETS)
}

fn tpot_histogram() -> Histogram {
    Histogram::new(TPOT_BUCKETS)
}

fn handshake_histogram() -> Histogram {
    Histogram::new(HANDSHAKE_BUCKETS)
}

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

type HistogramFamily<S> = Family<S, Histogram, fn() -> Histogram>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteTargetCode {
    route: String,
    target: String,
    code: Cow<'static, str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteTarget {
    route: String,
    target: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteTargetCause {
    route: String,
    target: String,
    cause: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TargetKind {
    target: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Decision {
    route: String,
    strategy: &'static str,
    target: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Fallback {
    route: String,
    strategy: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteBasis {
    route: String,
    basis: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteReason {
    route: String,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabel {
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CacheLookupLabel {
    route: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AdapterLoadLabel {
    target: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TlsVersionLabel {
    version: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TlsReasonLabel {
    reason: &'static str,
}

/// `rolter_tls_handshake_duration_seconds` bucket bounds: 1 ms (a resumed session on a
/// local client) to 10 s (the default handshake timeout).
pub const HANDSHAKE_BUCKETS: [f64; 10] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.0, 10.0];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GatewayResponse {
    status: u16,
    code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TargetLabel {
    target: String,
}

/// The series of one (route, target) pair, created on first use.
#[derive(Debug, Default)]
struct PairSeries {
    /// `rolter_requests_total` per status seen (0 = no response, [`INTERRUPTED`] = cut).
    codes: Vec<(u16, Counter)>,
    /// `rolter_stream_interrupted_total` per cause seen.
    cuts: Vec<(&'static str, Counter)>,
    ttft: Option<Histogram>,
    tpot: Option<Histogram>,
    duration: Option<Histogram>,
    decisions: Option<Counter>,
}

/// Per-target counters, created with the metric set.
#[derive(Debug)]
struct TargetSeries {
    prompt_tokens: Counter,
    completion_tokens: Counter,
    ejections: Counter,
    scrape_failures: Counter,
    cooldowns: Counter,
    usage_unreported: Counter,
}

/// The gateway's counters and histograms. Owned and mutated by the control thread only.
#[derive(Debug)]
pub struct GatewayMetrics {
    registry: Registry,
    routes: Vec<String>,
    strategies: Vec<&'static str>,
    targets: Vec<String>,
    requests: Family<RouteTargetCode, Counter>,
    ttft: HistogramFamily<RouteTarget>,
    tpot: HistogramFamily<RouteTarget>,
    duration: HistogramFamily<RouteTarget>,
    decisions: Family<Decision, Counter>,
    fallbacks: Family<Fallback, Counter>,
    bases: Family<RouteBasis, Counter>,
    gateway_responses: Family<GatewayResponse, Counter>,
    interrupted: Family<RouteTargetCause, Counter>,
    access_log_dropped: Counter,
    /// Indexed by `route * targets.len() + target`.
    pairs: Vec<PairSeries>,
    per_target: Vec<TargetSeries>,
    /// Per route: `rolter_strategy_fallbacks_total` per reason seen.
    route_fallbacks: Vec<Vec<(&'static str, Counter)>>,
    /// Per route: `rolter_routing_basis_total` per basis seen.
    route_bases: Vec<Vec<(&'static str, Counter)>>,
    cache_lookups: Family<CacheLookupLabel, Counter>,
    adapter_loads: Family<AdapterLoadLabel, Counter>,
    /// Per route: `rolter_cache_lookups_total` per result seen.
    route_lookups: Vec<Vec<(&'static str, Counter)>>,
    /// `rolter_gateway_responses_total` per (status, code) seen.
    responses: Vec<(u16, &'static str, Counter)>,
    retries: Family<RouteReason, Counter>,
    /// Per route: `rolter_retries_total` per reason seen.
    route_retries: Vec<Vec<(&'static str, Counter)>>,
    /// Per route: `rolter_retry_budget_exhausted_total`.
    budget_exhausted: Vec<Counter>,
    /// Per route: `rolter_hedges_sent_total` and `rolter_hedges_won_total`.
    hedges_sent: Vec<Counter>,
    hedges_won: Vec<Counter>,
    hedges_skipped: Family<RouteReason, Counter>,
    /// Client TLS: handshakes completed by version, failed by reason, and how long the
    /// completed ones took.
    tls_handshakes: Family<TlsVersionLabel, Counter>,
    tls_failures: Family<TlsReasonLabel, Counter>,
    tls_handshake_seconds: HistogramFamily<TlsVersionLabel>,
    /// One owner: `Send` (moved to the control thread) but not `Sync`.
    _owner: PhantomData<Cell<()>>,
}

/// Registers `metric` under `name` and gives it back, for the metric set to keep a handle
/// on the same series (counter names get their `_total` suffix from the encoder).
fn registered<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// The families of upstream attempts: outcomes, timings and the tokens they used.
struct AttemptFamilies {
    requests: Family<RouteTargetCode, Counter>,
    ttft: HistogramFamily<RouteTarget>,
    tpot: HistogramFamily<RouteTarget>,
    duration: HistogramFamily<RouteTarget>,
    tokens: Family<TargetKind, Counter>,
}

impl AttemptFamilies {
    /// Registers `rolter_requests`, `rolter_ttft_seconds`,
    /// `rolter_time_per_output_token_seconds`, `rolter_request_duration_seconds` and
    /// `rolter_tokens`, in that order.
    fn register(registry: &mut Registry) -> Self {
        AttemptFamilies {
            requests: registered(
                registry,
                "rolter_requests",
                "Upstream attempts by route, target and the status the client received (none: no response; interrupted: a response cut off after it started reaching the client, see rolter_stream_interrupted_total)",
                Family::default(),
            ),
            ttft: registered(
                registry,
                "rolter_ttft_seconds",
                "Time from sending an upstream request to the first body byte of its event stream (successful streams only)",
                HistogramFamily::new_with_constructor(ttft_histogram),
            ),
            tpot: registered(
                registry,
                "rolter_time_per_output_token_seconds",
                "Time per output token after the first, of successful event streams with at least two completion tokens: (end - first body byte) / (completion tokens - 1)",
                HistogramFamily::new_with_constructor(tpot_histogram),
            ),
            duration: registered(
                registry,
                "rolter_request_duration_seconds",
                "Time from sending an upstream request to the end of its response",
                HistogramFamily::new_with_constructor(duration_histogram),
            ),
            tokens: registered(
                registry,
                "rolter_tokens",
                "Tokens the targets reported in responses' usage, by kind (prompt, completion); for a successful stream without usage, its content deltas are counted as completion tokens (an estimate)",
                Family::default(),
            ),
        }
    }
}

/// The families of the strategies' picks and what they asked before picking.
struct PickFamilies {
    decisions: Family<Decision, Counter>,
    fallbacks: Family<Fallback, Counter>,
    bases: Family<RouteBasis, Counter>,
    cache_lookups: Family<CacheLookupLabel, Counter>,
    adapter_loads: Family<AdapterLoadLabel, Counter>,
}

impl PickFamilies {
    /// Registers `rolter_strategy_decisions`, `rolter_strategy_fallbacks`,
    /// `rolter_routing_basis`, `rolter_cache_lookups` and `rolter_adapter_loads`, in that
    /// order.
    fn register(registry: &mut Registry) -> Self {
        PickFamilies {
            decisions: registered(
                registry,
                "rolter_strategy_decisions",
                "Targets chosen by each route's strategy",
                Family::default(),
            ),
            fallbacks: registered(
                registry,
                "rolter_strategy_fallbacks",
                "Picks a strategy made by its fallback path, by reason",
                Family::default(),
            ),
            bases: registered(
                registry,
                "rolter_routing_basis",
                "Picks of routes that share state with the other replicas, by what decided them: local (this replica's own information), shared_pin, shared_prefix or shared_load (what the other replicas shared)",
                Family::default(),
            ),
            cache_lookups: registered(
                registry,
                "rolter_cache_lookups",
                "Cache-controller lookups made before a pick, by result (answered, memo, timeout, error, paused, unknown_instance)",
                Family::default(),
            ),
            adapter_loads: registered(
                registry,
                "rolter_adapter_loads",
                "LoRA adapters the gateway loaded on a target before forwarding (lora_aware load_from), by result",
                Family::default(),
            ),
        }
    }
}

/// The families of client TLS handshakes.
struct TlsFamilies {
    handshakes: Family<TlsVersionLabel, Counter>,
    failures: Family<TlsReasonLabel, Counter>,
    seconds: HistogramFamily<TlsVersionLabel>,
}

impl TlsFamilies {
    /// Registers `rolter_tls_handshakes`, `rolter_tls_handshake_failures` and
    /// `rolter_tls_handshake_duration_seconds`, in that order.
    fn register(registry: &mut Registry) -> Self {
        TlsFamilies {
            handshakes: registered(
                registry,
                "rolter_tls_handshakes",
                "Client TLS handshakes completed, by protocol version (1.2, 1.3)",
                Family::default(),
            ),
            failures: registered(
                registry,
                "rolter_tls_handshake_failures",
                "Client TLS handshakes that failed, by reason (timeout, closed, not_tls, incompatible, alert, error)",
                Family::default(),
            ),
            seconds: registered(
                registry,
                "rolter_tls_handshake_duration_seconds",
                "Time from an accepted client connection to its completed TLS handshake, by protocol version",
                HistogramFamily::new_with_constructor(handshake_histogram),
            ),
        }
    }
}

/// The families of what the gateway did to clients on its own: its own error responses,
/// the responses it cut off, the access-log lines it dropped.
struct OwnFamilies {
    gateway_responses: Family<GatewayResponse, Counter>,
    interrupted: Family<RouteTargetCause, Counter>,
    access_log_dropped: Counter,
}

impl OwnFamilies {
    /// Registers `rolter_gateway_responses`, `rolter_stream_interrupted` and
    /// `rolter_access_log_dropped`, in that order.
    fn register(registry: &mut Registry) -> Self {
        OwnFamilies {
            gateway_responses: registered(
                registry,
                "rolter_gateway_responses",
                "Responses the gateway produced itself without reaching a target, by status and code",
                Family::default(),
            ),
            interrupted: registered(
                registry,
                "rolter_stream_interrupted",
                "Responses cut off after they started reaching the client, by cause (upstream_reset, upstream_timeout, client_gone, shutdown)",
                Family::default(),
            ),
            access_log_dropped: registered(
                registry,
                "rolter_access_log_dropped",
                "Access-log lines dropped because the writer's buffer was full (a slow disk or stdout)",
                Counter::default(),
            ),
        }
    }
}

/// The families of second tries: retries, the budget that refuses them, and hedges, with
/// the per-route counters that exist from the start.
struct RetryFamilies {
    retries: Family<RouteReason, Counter>,
    /// Per route: `rolter_retry_budget_exhausted_total`.
    budget_exhausted: Vec<Counter>,
    /// Per route: `rolter_hedges_sent_total` and `rolter_hedges_won_total`.
    hedges_sent: Vec<Counter>,
    hedges_won: Vec<Counter>,
    hedges_skipped: Family<RouteReason, Counter>,
}

impl RetryFamilies {
    /// Registers `rolter_retries`, `rolter_retry_budget_exhausted`, `rolter_hedges_sent`,
    /// `rolter_hedges_won` and `rolter_hedges_skipped`, in that order, with a series per
    /// route in the per-route families.
    fn register(registry: &mut Registry, route_names: &[String]) -> Self {
        let per_route = |family: Family<RouteLabel, Counter>| -> Vec<Counter> {
            route_names
                .iter()
                .map(|r| family.get_or_create_owned(&RouteLabel { route: r.clone() }))
                .collect()
        };
        RetryFamilies {
            retries: registered(
                registry,
                "rolter_retries",
                "Requests tried again on another target, by route and the retry_on reason (connect_failure, reset_before_response, 502, 503, 504, 429, first_byte_timeout)",
                Family::default(),
            ),
            budget_exhausted: per_route(registered(
                registry,
                "rolter_retry_budget_exhausted",
                "Retries not made because the route's retry budget (retry_budget, retry_budget_min) was spent on the core; the client got the last attempt's error",
                Family::default(),
            )),
            hedges_sent: per_route(registered(
                registry,
                "rolter_hedges_sent",
                "Hedges sent: second attempts raced against a first that had sent no response byte within the route's hedge_after",
                Family::default(),
            )),
            hedges_won: per_route(registered(
                registry,
                "rolter_hedges_won",
                "Hedges whose response head arrived first and was relayed (the first attempt was dropped, its engine let go)",
                Family::default(),
            )),
            hedges_skipped: registered(
                registry,
                "rolter_hedges_skipped",
                "Hedges due but not sent, by reason (budget: the route's retry budget was spent; no_target: no other candidate)",
                Family::default(),
            ),
        }
    }
}

/// The per-target families that exist from the start at zero (besides `rolter_tokens`).
struct TargetFamilies {
    cooldowns: Family<TargetLabel, Counter>,
    ejections: Family<TargetLabel, Counter>,
    scrape_failures: Family<TargetLabel, Counter>,
    usage_unreported: Family<TargetLabel, Counter>,
}

impl TargetFamilies {
    /// Registers `rolter_target_cooldowns`, `rolter_ejections`, `rolter_scrape_failures` and
    /// `rolter_stream_usage_unreported`, in that order.
    fn register(registry: &mut Registry) -> Self {
        TargetFamilies {
            cooldowns: registered(
                registry,
                "rolter_target_cooldowns",
                "Times the target answered 429 (or 503 with Retry-After) and cooled: out of the candidates for the time it gave, capped by retry_after_max",
                Family::default(),
            ),
            ejections: registered(
                registry,
                "rolter_ejections",
                "Times passive health checking ejected the target",
                Family::default(),
            ),
            scrape_failures: registered(
                registry,
                "rolter_scrape_failures",
                "Failed scrapes of the target's metrics endpoint",
                Family::default(),
            ),
            usage_unreported: registered(
                registry,
                "rolter_stream_usage_unreported",
                "Workers that found the target's stream without the usage they asked it for (stream_usage = \"ask\"): that worker counts its streams' content deltas until the next reload",
                Family::default(),
            ),
        }
    }

    /// Each target's counters, created at zero: its tokens (from `tokens`) and these.
    fn series(&self, tokens: &Family<TargetKind, Counter>, names: &[String]) -> Vec<TargetSeries> {
        names
            .iter()
            .map(|name| {
                let kind = |kind| TargetKind {
                    target: name.clone(),
                    kind,
                };
                let target = TargetLabel {
                    target: name.clone(),
                };
                TargetSeries {
                    prompt_tokens: tokens.get_or_create_owned(&kind("prompt")),
                    completion_tokens: tokens.get_or_create_owned(&kind("completion")),
                    ejections: self.ejections.get_or_create_owned(&target),
                    scrape_failures: self.scrape_failures.get_or_create_owned(&target),
                    cooldowns: self.cooldowns.get_or_create_owned(&target),
                    usage_unreported: self.usage_unreported.get_or_create_owned(&target),
                }
            })
            .collect()
    }
}

impl GatewayMetrics {
    /// A metric set for the configured routes (names and strategy names, by route index) and
    /// targets (names, by target index).
    pub fn new(
        route_names: &[String],
        route_strategies: &[&'static str],
        target_names: &[String],
    ) -> Self {
        assert_eq!(
            route_names.len(),
            route_strategies.len(),
            "one strategy name per route"
        );
        // The registration order is the order of the families in `/metrics`.
        let mut registry = Registry::default();
        let attempts = AttemptFamilies::register(&mut registry);
        let picks = PickFamilies::register(&mut registry);
        let tls = TlsFamilies::register(&mut registry);
        let own = OwnFamilies::register(&mut registry);
        let second_tries = RetryFamilies::register(&mut registry, route_names);
        let targets = TargetFamilies::register(&mut registry);
        let per_target = targets.series(&attempts.tokens, target_names);
        let routes = route_names.len();

        GatewayMetrics {
            registry,
            routes: route_names.to_vec(),
            strategies: route_strategies.to_vec(),
            targets: target_names.to_vec(),
            requests: attempts.requests,
            ttft: attempts.ttft,
            tpot: attempts.tpot,
            duration: attempts.duration,
            decisions: picks.decisions,
            fallbacks: picks.fallbacks,
            bases: picks.bases,
            gateway_responses: own.gateway_responses,
            interrupted: own.interrupted,
            access_log_dropped: own.access_log_dropped,
            pairs: (0..routes * target_names.len())
                .map(|_| PairSeries::default())
                .collect(),
            per_target,
            route_fallbacks: vec![Vec::new(); routes],
            route_bases: vec![Vec::new(); routes],
            cache_lookups: picks.cache_lookups,
            adapter_loads: picks.adapter_loads,
            route_lookups: vec![Vec::new(); routes],
            responses: Vec::new(),
            retries: second_tries.retries,
            route_retries: vec![Vec::new(); routes],
            budget_exhausted: second_tries.budget_exhausted,
            hedges_sent: second_tries.hedges_sent,
            hedges_won: second_tries.hedges_won,
            hedges_skipped: second_tries.hedges_skipped,
            tls_handshakes: tls.handshakes,
            tls_failures: tls.failures,
            tls_handshake_seconds: tls.seconds,
            _owner: PhantomData,
        }
    }

    /// Index of a (route, target) pair; `None` (and a debug panic) for indices outside the
    /// configuration this set was built for.
    fn pair(&self, route: usize, target: usize) -> Option<usize> {
        let valid = route < self.routes.len() && target < self.targets.len();
        debug_assert!(valid, "route {route} / target {target} out of range");
        valid.then_some(route * self.targets.len() + target)
    }

    /// Whether `route` is a route of the configuration this set was built for (a debug
    /// panic if not).
    fn route_in_range(&self, route: usize) -> bool {
        let valid = route < self.routes.len();
        debug_assert!(valid, "route {route} out of range");
        valid
    }

    /// One finished upstream attempt on `route` whose response, if any, was not cut off.
    pub fn record_attempt(&mut self, route: usize, sample: &Sample) {
        self.record_outcome(route, sample, None, 0);
    }

    /// One finished upstream attempt on `route`: `cut` names how its response was cut off
    /// after it started reaching the client (counted as `code="interrupted"`, not as its
    /// status), `estimated_completion` the completion tokens counted from a stream that
    /// reported no usage.
    pub fn record_outcome(
        &mut self,
        route: usize,
        sample: &Sample,
        cut: Option<&'static str>,
        estimated_completion: u32,
    ) {
        let Some(index) = self.pair(route, sample.target) else {
            return;
        };
        let route_name = &self.routes[route];
        let target_name = &self.targets[sample.target];
        let pair = &mut self.pairs[index];

        let status = if cut.is_some() {
            INTERRUPTED
        } else {
            sample.status
        };
        if let Some(cause) = cut {
            let interrupted = &self.interrupted;
            counter_for(&mut pair.cuts, cause, || {
                interrupted.get_or_create_owned(&RouteTargetCause {
                    route: route_name.clone(),
                    target: target_name.clone(),
                    cause,
                })
            })
            .inc();
        }
        let code = match pair.codes.iter().position(|(s, _)| *s == status) {
            Some(i) => i,
            None => {
                let code = match status {
                    0 => Cow::Borrowed("none"),
                    INTERRUPTED => Cow::Borrowed("interrupted"),
                    s => Cow::Owned(s.to_string()),
                };
                let counter = self.requests.get_or_create_owned(&RouteTargetCode {
                    route: route_name.clone(),
                    target: target_name.clone(),
                    code,
                });
                pair.codes.push((status, counter));
                pair.codes.len() - 1
            }
        };
        pair.codes[code].1.inc();

        let labels = || RouteTarget {
            route: route_name.clone(),
            target: target_name.clone(),
        };
        // TTFT describes the target's speed: only successful attempts count.
        if let (true, Some(ttft)) = (sample.success, sample.ttft) {
            pair.ttft
                .get_or_insert_with(|| self.ttft.get_or_create_owned(&labels()))
                .observe(ttft.as_secs_f64());
            let completion = sample
                .usage
                .map_or(estimated_completion, |u| u.completion_tokens);
            if completion >= 2 {
                let after = sample.duration.saturating_sub(ttft).as_secs_f64();
                pair.tpot
                    .get_or_insert_with(|| self.tpot.get_or_create_owned(&labels()))
                    .observe(after / f64::from(completion - 1));
            }
        }
        pair.duration
            .get_or_insert_with(|| self.duration.get_or_create_owned(&labels()))
            .observe(sample.duration.as_secs_f64());

        let t = &self.per_target[sample.target];
        if let Some(usage) = sample.usage {
            t.prompt_tokens.inc_by(u64::from(usage.prompt_tokens));
            t.completion_tokens
                .inc_by(u64::from(usage.completion_tokens));
        } else {
            t.completion_tokens.inc_by(u64::from(estimated_completion));
        }
    }

    /// `n` access-log lines did not fit the writer's buffer.
    pub fn record_access_log_drops(&mut self, n: u64) {
        self.access_log_dropped.inc_by(n);
    }

    /// `route`'s strategy chose `target`.
    pub fn record_decision(&mut self, route: usize, target: usize) {
        let Some(index) = self.pair(route, target) else {
            return;
        };
        let (routes, targets, strategies) = (&self.routes, &self.targets, &self.strategies);
        self.pairs[index]
            .decisions
            .get_or_insert_with(|| {
                self.decisions.get_or_create_owned(&Decision {
                    route: routes[route].clone(),
                    strategy: strategies[route],
                    target: targets[target].clone(),
                })
            })
            .inc();
    }

    /// `route`'s strategy picked by its fallback path, for `reason`.
    pub fn record_fallback(&mut self, route: usize, reason: &'static str) {
        if !self.route_in_range(route) {
            return;
        }
        let (fallbacks, routes, strategies) = (&self.fallbacks, &self.routes, &self.strategies);
        counter_for(&mut self.route_fallbacks[route], reason, || {
            fallbacks.get_or_create_owned(&Fallback {
                route: routes[route].clone(),
                strategy: strategies[route],
                reason,
            })
        })
        .inc();
    }

    /// `counts[b]` picks of `route` were decided on basis `Basis::ALL[b]`.
    pub fn record_bases(&mut self, route: usize, counts: &[u32; 4]) {
        if !self.route_in_range(route) {
            return;
        }
        for (basis, &n) in rolter_core::Basis::ALL.iter().zip(counts) {
            if n == 0 {
                continue;
            }
            let (bases, routes) = (&self.bases, &self.routes);
            let label = basis.label();
            counter_for(&mut self.route_bases[route], label, || {
                bases.get_or_create_owned(&RouteBasis {
                    route: routes[route].clone(),
                    basis: label,
                })
            })
            .inc_by(u64::from(n));
        }
    }

    /// A request on `route` was tried again for `reason`.
    pub fn record_retry(&mut self, route: usize, reason: &'static str) {
        if !self.route_in_range(route) {
            return;
        }
        let (retries, routes) = (&self.retries, &self.routes);
        counter_for(&mut self.route_retries[route], reason, || {
            retries.get_or_create_owned(&RouteReason {
                route: routes[route].clone(),
                reason,
            })
        })
        .inc();
    }

    /// A hedge on `route` was sent (`won`: its head arrived first and was relayed).
    pub fn record_hedge(&mut self, route: usize, won: bool) {
        let counters = if won {
            &self.hedges_won
        } else {
            &self.hedges_sent
        };
        if let Some(c) = counters.get(route) {
            c.inc();
        }
    }

    /// A hedge on `route` was due but not sent, for `reason`.
    pub fn record_hedge_skipped(&mut self, route: usize, reason: &'static str) {
        let Some(name) = self.routes.get(route) else {
            return;
        };
        self.hedges_skipped
            .get_or_create(&RouteReason {
                route: name.clone(),
                reason,
            })
            .inc();
    }

    /// A retry on `route` was refused by its budget.
    pub fn record_budget_exhausted(&mut self, route: usize) {
        if let Some(c) = self.budget_exhausted.get(route) {
            c.inc();
        }
    }

    /// `route` asked its cache controller before a pick, with `result` (an answer naming
    /// an instance of no route target counts once more as `unknown_instance`).
    pub fn record_cache_lookup(&mut self, route: usize, result: &'static str) {
        if !self.route_in_range(route) {
            return;
        }
        let (lookups, routes) = (&self.cache_lookups, &self.routes);
        counter_for(&mut self.route_lookups[route], result, || {
            lookups.get_or_create_owned(&CacheLookupLabel {
                route: routes[route].clone(),
                result,
            })
        })
        .inc();
    }

    /// The gateway loaded a LoRA adapter on `target` (or failed to).
    pub fn record_adapter_load(&mut self, target: usize, loaded: bool) {
        let Some(name) = self.targets.get(target) else {
            return;
        };
        self.adapter_loads
            .get_or_create(&AdapterLoadLabel {
                target: name.clone(),
                result: if loaded { "loaded" } else { "failed" },
            })
            .inc();
    }

    /// A response the gateway produced itself without reaching a target (`code` is the
    /// OpenAI error code, e.g. `model_not_found`).
    pub fn record_gateway_response(&mut self, status: u16, code: &'static str) {
        let i = match self
            .responses
            .iter()
            .position(|(s, c, _)| *s == status && *c == code)
        {
            Some(i) => i,
            None => {
                let counter = self
                    .gateway_responses
                    .get_or_create_owned(&GatewayResponse { status, code });
                self.responses.push((status, code, counter));
                self.responses.len() - 1
            }
        };
        self.responses[i].2.inc();
    }

    /// A client TLS handshake: completed with `Ok(version)` after `seconds`, or failed
    /// with `Err(reason)`.
    pub fn record_tls_handshake(
        &mut self,
        result: Result<&'static str, &'static str>,
        seconds: f64,
    ) {
        match result {
            Ok(version) => {
                self.tls_handshakes
                    .get_or_create(&TlsVersionLabel { version })
                    .inc();
                self.tls_handshake_seconds
                    .get_or_create(&TlsVersionLabel { version })
                    .observe(seconds);
            }
            Err(reason) => {
                self.tls_failures
                    .get_or_create(&TlsReasonLabel { reason })
                    .inc();
            }
        }
    }

    /// Passive health checking ejected `target`.
    pub fn record_ejection(&mut self, target: usize) {
        if let Some(t) = self.target(target) {
            t.ejections.inc();
        }
    }

    /// `target` asked to be left alone and cools.
    pub fn record_cooldown(&mut self, target: usize) {
        if let Some(t) = self.target(target) {
            t.cooldowns.inc();
        }
    }

    /// A worker found `target`'s stream without the usage it asked for.
    pub fn record_usage_unreported(&mut self, target: usize) {
        if let Some(t) = self.target(target) {
            t.usage_unreported.inc();
        }
    }

    /// A scrape of `target`'s metrics endpoint failed (connect, status, timeout, body).
    pub fn record_scrape_failure(&mut self, target: usize) {
        if let Some(t) = self.target(target) {
            t.scrape_failures.inc();
        }
    }

    fn target(&self, target: usize) -> Option<&TargetSeries> {
        let t = self.per_target.get(target);
        debug_assert!(t.is_some(), "target {target} out of range");
        t
    }

    /// Appends the whole metric set to `out` in the Prometheus text format: the counters and
    /// histograms recorded so far, then the target gauges given here (`gauges[i]` for target
    /// `i`) and `rolter_adaptive_enabled`. Families without any series are left out.
    pub fn render(&self, gauges: &[TargetGauges], adaptive_enabled: bool, out: &mut String) {
        self.render_with_kv(gauges, adaptive_enabled, &[], None, out);
    }

    /// [`Self::render`], plus the KV-event plane's series when the gateway subscribes to
    /// any target's events.
    pub fn render_with_kv(
        &self,
        gauges: &[TargetGauges],
        adaptive_enabled: bool,
        mesh_dropped: &[(&'static str, u64)],
        kv: Option<&[KvTargetReport]>,
        out: &mut String,
    ) {
        super::text::append(out, &self.registry);
        let live = gauges::registry(&self.targets, gauges, adaptive_enabled, mesh_dropped);
        super::text::append(out, &live);
        if let Some(reports) = kv {
            super::text::append(out, &super::kv_events::registry(&self.targets, reports));
        }
    }
}

/// The counter kept for `key` among a route's few (key, counter) pairs, created with
/// `create` (which builds the label set) the first time `key` appears.
fn counter_for<'a>(
    seen: &'a mut Vec<(&'static str, Counter)>,
    key: &'static str,
    create: impl FnOnce() -> Counter,
) -> &'a Counter {
    let i = match seen.iter().position(|(k, _)| *k == key) {
        Some(i) => i,
        None => {
            seen.push((key, create()));
            seen.len() - 1
        }
    };
    &seen[i].1
}
