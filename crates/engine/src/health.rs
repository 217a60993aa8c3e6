//! The health book: per target, the active check state (healthy/unhealthy after the
//! configured streaks of probe results), passive ejection (consecutive failed requests
//! eject a target for a time that doubles with each ejection in a row, capped), latency
//! outlier ejection (a target whose TTFT or inter-token time stays `latency_factor` times
//! above its route peers' median for `latency_for` is ejected the same way), with a cap on
//! the share of any route's targets ejected at once; and slow start (a target that joins
//! ramps its share over `slow_start_window`).
//!
//! Owned by the control thread; pure state with time passed in, so it is tested without
//! sockets. It must not do I/O: probes and request outcomes arrive as values, and the
//! caller publishes [`HealthBook::eligible`] to the workers.

use std::time::{Duration, Instant};

use rolter_core::{Sample, TargetId, Verdict};

use crate::fleet::{FleetRoute, FleetTarget, HealthSettings};

/// A change worth a log line and a metric.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum HealthEvent {
    /// Passive ejection after consecutive failures, for this long.
    Ejected {
        target: TargetId,
        duration: Duration,
    },
    /// The failure streak reached the threshold but ejecting would exceed a route's cap.
    EjectionCapped { target: TargetId },
    /// An ejected target is back in rotation.
    Returned { target: TargetId },
    /// Active checks failed `unhealthy_threshold` times in a row.
    Unhealthy { target: TargetId },
    /// Active checks passed `healthy_threshold` times in a row.
    Healthy { target: TargetId },
    /// Latency outlier ejection: `ratio` times its peers' median for `latency_for`.
    SlowEjected {
        target: TargetId,
        duration: Duration,
        ratio: f64,
    },
}

/// A running average over about the last `span` samples: the plain mean of the first
/// `span`, then an exponential average with weight `1 / span`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Average {
    mean: f64,
    samples: u32,
}

impl Average {
    fn add(&mut self, v: f64, span: u32) {
        self.samples = self.samples.saturating_add(1);
        let n = f64::from(self.samples.min(span.max(1)));
        self.mean += (v - self.mean) / n;
    }
}

#[derive(Debug, Clone, Default)]
struct TargetHealth {
    /// Probed by active checks.
    probed: bool,
    /// Active check state (true until checks say otherwise).
    unhealthy: bool,
    probe_passes: u32,
    probe_failures: u32,
    /// Passive: consecutive failed requests.
    failures: u32,
    /// Passive: out of rotation until this instant.
    ejected_until: Option<Instant>,
    /// The ejection time is over but a passing probe must bring the target back.
    awaiting_probe: bool,
    /// Ejections in a row (the next ejection lasts `ejection_time × 2^ejections`).
    ejections: u32,
    /// When the target last came back, and the ejection it served then.
    returned: Option<(Instant, Duration)>,
    /// How many times this target was ejected since start.
    total_ejections: u64,
    /// TTFT and inter-token time of its successful attempts, in milliseconds.
    ttft: Average,
    itl: Average,
    /// A latency outlier since then.
    slow_since: Option<Instant>,
    /// When its latency was last forgotten (its last ejection): attempts sent before then
    /// (a slow request still in flight when it was ejected) no longer teach it.
    latency_since: Option<Instant>,
    /// When it last joined (returned, became healthy, was added by a reload), for slow
    /// start.
    joined_at: Option<Instant>,
}

impl TargetHealth {
    fn ejected(&self) -> bool {
        self.ejected_until.is_some() || self.awaiting_probe
    }
}

/// What the admin API shows for one target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthState {
    /// Active checks run for this target.
    pub probed: bool,
    /// Active checks currently pass (always true when not probed).
    pub healthy: bool,
    /// Passively ejected (including waiting for a passing probe to return).
    pub ejected: bool,
    /// Remaining ejection time.
    pub ejected_for: Option<Duration>,
    pub consecutive_failures: u32,
    pub total_ejections: u64,
}

pub struct HealthBook {
    cfg: HealthSettings,
    targets: Vec<TargetHealth>,
    /// Targets per route, for the ejection cap.
    routes: Vec<Vec<TargetId>>,
    /// Scratch for the peers' averages.
    peers: Vec<f64>,
}

impl HealthBook {
    pub fn new(cfg: &HealthSettings, targets: &[FleetTarget], routes: &[FleetRoute]) -> Self {
        HealthBook {
            targets: targets
                .iter()
                .map(|t| TargetHealth {
                    probed: cfg.active && t.health_path.as_deref() != Some(""),
                    ..Default::default()
                })
                .collect(),
            routes: routes.iter().map(|r| r.targets.clone()).collect(),
            cfg: cfg.clone(),
            peers: Vec::new(),
        }
    }

    /// Targets a reload added (`map[t]` is `None`) join now: they ramp up with slow start.
    pub fn joined_by_reload(&mut self, map: &[Option<usize>], now: Instant) {
        for (t, from) in map.iter().enumerate() {
            if from.is_none() {
                if let Some(h) = self.targets.get_mut(t) {
                    h.joined_at = Some(now);
                }
            }
        }
    }

    /// A target joins now (it stopped cooling after a 429, say): slow start ramps it up.
    pub fn joined(&mut self, t: TargetId, now: Instant) {
        if let Some(h) = self.targets.get_mut(t) {
            h.joined_at = Some(now);
        }
    }

    /// The slow-start factor of `t`'s share at `now`: 1 outside a ramp, else
    /// `max(min_weight, (elapsed / window)^(1 / aggression))`.
    pub fn ramp(&self, t: TargetId, now: Instant) -> f32 {
        let window = self.cfg.slow_start_window;
        let Some(at) = self.targets[t].joined_at else {
            return 1.0;
        };
        let elapsed = now.saturating_duration_since(at);
        if window.is_zero() || elapsed >= window {
            return 1.0;
        }
        let x = elapsed.as_secs_f64() / window.as_secs_f64();
        x.powf(1.0 / self.cfg.slow_start_aggression)
            .max(self.cfg.slow_start_min_weight)
            .min(1.0) as f32
    }

    /// Folds a finished attempt's latency in (successful attempts only): its TTFT, and
    /// for a response of several tokens its inter-token time.
    pub fn on_sample(&mut self, s: &Sample) {
        if self.cfg.latency_factor <= 0.0 || !s.success {
            return;
        }
        let span = self.cfg.latency_min_samples;
        let Some(h) = self.targets.get_mut(s.target) else {
            return;
        };
        // A stream's first token, or a plain answer's whole time: route peers get the same
        // mix of both, so their averages compare.
        let Some(first_byte) = s.first_byte else {
            return;
        };
        let sent = s.finished.checked_sub(s.duration);
        if h.latency_since
            .is_some_and(|since| sent.is_none_or(|sent| sent < since))
        {
            return;
        }
        h.ttft.add(first_byte.as_secs_f64() * 1e3, span);
        // Inter-token time from streams only: a plain answer's tokens all come at once.
        if let (Some(ttft), Some(u)) = (s.ttft, s.usage.filter(|u| u.completion_tokens > 1)) {
            let rest = s.duration.saturating_sub(ttft).as_secs_f64() * 1e3;
            h.itl.add(rest / f64::from(u.completion_tokens - 1), span);
        }
    }

    /// Ejects latency outliers: per route, a target with enough samples whose TTFT (or
    /// inter-token time) average is above `latency_factor` times the median of its
    /// eligible peers' (with enough samples), continuously for `latency_for`.
    fn eject_outliers(&mut self, now: Instant, events: &mut Vec<HealthEvent>) {
        let factor = self.cfg.latency_factor;
        if factor <= 0.0 {
            return;
        }
        let min = self.cfg.latency_min_samples;
        let n = self.targets.len();
        let mut outlier = vec![None::<f64>; n];
        let mut judged = vec![false; n];
        for r in 0..self.routes.len() {
            for i in 0..self.routes[r].len() {
                let t = self.routes[r][i];
                let h = &self.targets[t];
                if h.ejected() || h.unhealthy || h.ttft.samples < min {
                    continue;
                }
                judged[t] = true;
                let mut worst: Option<f64> = None;
                for pick in [|h: &TargetHealth| h.ttft, |h: &TargetHealth| h.itl] {
                    let own = pick(h);
                    if own.samples < min {
                        continue;
                    }
                    self.peers.clear();
                    for &p in &self.routes[r] {
                        let ph = &self.targets[p];
                        if p != t && !ph.ejected() && !ph.unhealthy && pick(ph).samples >= min {
                            self.peers.push(pick(ph).mean);
                        }
                    }
                    if self.peers.is_empty() {
                        continue;
                    }
                    self.peers.sort_by(f64::total_cmp);
                    let k = self.peers.len();
                    let median = if k % 2 == 1 {
                        self.peers[k / 2]
                    } else {
                        (self.peers[k / 2 - 1] + self.peers[k / 2]) / 2.0
                    };
                    if median > 0.0 && own.mean > factor * median {
                        let ratio = own.mean / median;
                        worst = Some(worst.map_or(ratio, |w: f64| w.max(ratio)));
                    }
                }
                if let Some(ratio) = worst {
                    outlier[t] = Some(outlier[t].map_or(ratio, |w: f64| w.max(ratio)));
                }
            }
        }
        for t in 0..n {
            if !judged[t] {
                continue;
            }
            let Some(ratio) = outlier[t] else {
                self.targets[t].slow_since = None;
                continue;
            };
            let since = *self.targets[t].slow_since.get_or_insert(now);
            if now.saturating_duration_since(since) < self.cfg.latency_for {
                continue;
            }
            if !self.may_eject(t) {
                continue;
            }
            let duration = self.eject(t, now);
            events.push(HealthEvent::SlowEjected {
                target: t,
                duration,
                ratio,
            });
        }
    }

    /// Takes `t` out for its next ejection time; what it learned about its latency starts
    /// over when it is back.
    fn eject(&mut self, t: TargetId, now: Instant) -> Duration {
        let h = &mut self.targets[t];
        let duration = self
            .cfg
            .ejection_time
            .saturating_mul(1u32 << h.ejections.min(20))
            .min(self.cfg.max_ejection_time);
        h.ejected_until = Some(now + duration);
        h.ejections = h.ejections.saturating_add(1);
        h.failures = 0;
        h.total_ejections += 1;
        h.returned = None;
        h.slow_since = None;
        h.ttft = Average::default();
        h.itl = Average::default();
        h.latency_since = Some(now);
        duration
    }

    /// Takes over `old`'s state (health, ejections, failure counts) of the targets a reload
    /// left unchanged: `map[t]` is target `t`'s index in `old`, when it is the same target.
    /// Whether a target is probed follows the new configuration.
    pub fn inherit(&mut self, old: &HealthBook, map: &[Option<usize>]) {
        for (t, from) in map.iter().enumerate() {
            if let (Some(o), Some(h)) = (from, self.targets.get_mut(t)) {
                if let Some(prev) = old.targets.get(*o) {
                    let probed = h.probed;
                    *h = prev.clone();
                    h.probed = probed;
                }
            }
        }
    }

    /// Whether strategies may see the target.
    pub fn eligible(&self, t: TargetId) -> bool {
        let h = &self.targets[t];
        !h.unhealthy && !h.ejected()
    }

    /// Whether active checks run for the target.
    pub fn probed(&self, t: TargetId) -> bool {
        self.targets[t].probed
    }

    pub fn state(&self, t: TargetId, now: Instant) -> HealthState {
        let h = &self.targets[t];
        HealthState {
            probed: h.probed,
            healthy: !h.unhealthy,
            ejected: h.ejected(),
            ejected_for: h.ejected_until.map(|u| u.saturating_duration_since(now)),
            consecutive_failures: h.failures,
            total_ejections: h.total_ejections,
        }
    }

    /// Folds one request attempt's verdict in; may eject the target.
    pub fn on_attempt(
        &mut self,
        t: TargetId,
        verdict: Verdict,
        now: Instant,
    ) -> Option<HealthEvent> {
        let threshold = self.cfg.failures;
        let h = &mut self.targets[t];
        match verdict {
            Verdict::ClientGone => None,
            Verdict::Success | Verdict::Answered => {
                h.failures = 0;
                if let Some((at, served)) = h.returned {
                    // Serving well for as long as the last ejection lasted forgives the
                    // earlier ejections: the next one starts short again.
                    if now.saturating_duration_since(at) >= served {
                        h.ejections = 0;
                        h.returned = None;
                    }
                }
                None
            }
            Verdict::TargetFailed => {
                h.failures = h.failures.saturating_add(1);
                if threshold == 0 || h.failures < threshold || h.ejected() {
                    return None;
                }
                if !self.may_eject(t) {
                    self.targets[t].failures = 0;
                    return Some(HealthEvent::EjectionCapped { target: t });
                }
                let duration = self.eject(t, now);
                Some(HealthEvent::Ejected {
                    target: t,
                    duration,
                })
            }
        }
    }

    /// Ejecting `t` keeps every route it belongs to within `max_ejected_percent`.
    fn may_eject(&self, t: TargetId) -> bool {
        let pct = u64::from(self.cfg.max_ejected_percent);
        self.routes.iter().filter(|r| r.contains(&t)).all(|r| {
            let allowed = (r.len() as u64 * pct / 100) as usize;
            let already = r.iter().filter(|&&x| self.targets[x].ejected()).count();
            already < allowed
        })
    }

    /// Folds one active probe result in.
    pub fn on_probe(&mut self, t: TargetId, ok: bool, now: Instant) -> Option<HealthEvent> {
        let (up, down) = (self.cfg.healthy_threshold, self.cfg.unhealthy_threshold);
        let h = &mut self.targets[t];
        if ok {
            h.probe_failures = 0;
            h.probe_passes = h.probe_passes.saturating_add(1);
            if h.awaiting_probe {
                // An ejected target whose time is over comes back on a passing check.
                h.awaiting_probe = false;
                h.returned = Some((now, self.cfg.ejection_time));
                h.joined_at = Some(now);
                return Some(HealthEvent::Returned { target: t });
            }
            if h.unhealthy && h.probe_passes >= up {
                h.unhealthy = false;
                h.joined_at = Some(now);
                return Some(HealthEvent::Healthy { target: t });
            }
        } else {
            h.probe_passes = 0;
            h.probe_failures = h.probe_failures.saturating_add(1);
            if !h.unhealthy && h.probe_failures >= down {
                h.unhealthy = true;
                return Some(HealthEvent::Unhealthy { target: t });
            }
        }
        None
    }

    /// Ends ejections whose time is over. A probed target then waits for a passing check;
    /// an unprobed one returns at once. Returns the events.
    pub fn tick(&mut self, now: Instant, events: &mut Vec<HealthEvent>) {
        let base = self.cfg.ejection_time;
        let max = self.cfg.max_ejection_time;
        for (t, h) in self.targets.iter_mut().enumerate() {
            let Some(until) = h.ejected_until else {
                continue;
            };
            if now < until {
                continue;
            }
            h.ejected_until = None;
            let served = base
                .saturating_mul(1u32 << h.ejections.saturating_sub(1).min(20))
                .min(max);
            if h.probed {
                h.awaiting_probe = true;
            } else {
                h.returned = Some((now, served));
                h.joined_at = Some(now);
                events.push(HealthEvent::Returned { target: t });
            }
        }
        self.eject_outliers(now, events);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn book(targets: usize, cfg: HealthSettings) -> HealthBook {
        let targets: Vec<FleetTarget> = (0..targets)
            .map(|i| FleetTarget {
                name: format!("t{i}"),
                scrape: true,
                health_path: None,
            })
            .collect();
        let routes = [FleetRoute {
            targets: (0..targets.len()).collect(),
        }];
        HealthBook::new(&cfg, &targets, &routes)
    }

    fn cfg() -> HealthSettings {
        HealthSettings {
            failures: 3,
            ejection_time: Duration::from_secs(10),
            max_ejection_time: Duration::from_secs(35),
            max_ejected_percent: 50,
            ..HealthSettings::default()
        }
    }

    #[test]
    fn consecutive_failures_eject_and_a_success_resets_the_streak() {
        let mut b = book(4, cfg());
        let now = Instant::now();
        assert_eq!(b.on_attempt(0, Verdict::TargetFailed, now), None);
        assert_eq!(b.on_attempt(0, Verdict::TargetFailed, now), None);
        assert_eq!(b.on_attempt(0, Verdict::Success, now), None);
        assert_eq!(b.on_attempt(0, Verdict::TargetFailed, now), None);
        assert_eq!(b.on_attempt(0, Verdict::ClientGone, now), None);
        assert_eq!(b.on_attempt(0, Verdict::TargetFailed, now), None);
        assert!(b.eligible(0));
        assert_eq!(
            b.on_attempt(0, Verdict::TargetFailed, now),
            Some(HealthEvent::Ejected {
                target: 0,
                duration: Duration::from_secs(10)
            })
        );
        assert!(!b.eligible(0));
        assert!(b.eligible(1));
    }

    #[test]
    fn ejection_time_grows_caps_and_is_forgiven_after_serving_well() {
        let mut b = book(2, cfg());
        let mut now = Instant::now();
        let mut events = Vec::new();
        let eject = |b: &mut HealthBook, now: Instant| {
            let mut last = None;
            for _ in 0..3 {
                last = b.on_attempt(0, Verdict::TargetFailed, now);
            }
            match last {
                Some(HealthEvent::Ejected { duration, .. }) => duration.as_secs(),
                other => panic!("expected an ejection, got {other:?}"),
            }
        };
        let mut durations = Vec::new();
        for _ in 0..4 {
            let d = eject(&mut b, now);
            durations.push(d);
            now += Duration::from_secs(d - 1);
            b.tick(now, &mut events);
            assert!(!b.eligible(0), "still ejected one second before the end");
            now += Duration::from_secs(1);
            b.tick(now, &mut events);
            assert!(
                b.eligible(0),
                "back when the time is over (no active checks)"
            );
        }
        assert_eq!(durations, [10, 20, 35, 35]);
        // Serving well for the last ejection's length resets the growth.
        b.on_attempt(0, Verdict::Success, now);
        now += Duration::from_secs(36);
        b.on_attempt(0, Verdict::Success, now);
        assert_eq!(eject(&mut b, now), 10);
    }

    #[test]
    fn the_cap_keeps_part_of_a_route_in_rotation() {
        let mut b = book(4, cfg());
        let now = Instant::now();
        let fail3 = |b: &mut HealthBook, t| {
            (0..3)
                .map(|_| b.on_attempt(t, Verdict::TargetFailed, now))
                .last()
                .flatten()
        };
        assert!(matches!(
            fail3(&mut b, 0),
            Some(HealthEvent::Ejected { .. })
        ));
        assert!(matches!(
            fail3(&mut b, 1),
            Some(HealthEvent::Ejected { .. })
        ));
        assert_eq!(
            fail3(&mut b, 2),
            Some(HealthEvent::EjectionCapped { target: 2 }),
            "50% of 4 targets: two at most"
        );
        assert!(b.eligible(2) && b.eligible(3));
        // A route of one target never ejects it.
        let mut single = book(1, cfg());
        assert_eq!(
            fail3(&mut single, 0),
            Some(HealthEvent::EjectionCapped { target: 0 })
        );
        assert!(single.eligible(0));
    }

    #[test]
    fn active_checks_need_streaks_and_bring_ejected_targets_back() {
        let mut b = book(
            2,
            HealthSettings {
                active: true,
                healthy_threshold: 2,
                unhealthy_threshold: 2,
                ..cfg()
            },
        );
        let mut now = Instant::now();
        assert!(b.probed(0));
        assert_eq!(b.on_probe(0, false, now), None);
        assert!(b.eligible(0), "one failed probe is not enough");
        assert_eq!(
            b.on_probe(0, false, now),
            Some(HealthEvent::Unhealthy { target: 0 })
        );
        assert!(!b.eligible(0));
        assert_eq!(b.on_probe(0, true, now), None);
        assert!(!b.eligible(0), "one pass is not enough");
        assert_eq!(
            b.on_probe(0, true, now),
            Some(HealthEvent::Healthy { target: 0 })
        );
        assert!(b.eligible(0));

        // An ejected, probed target waits for a passing probe after its time.
        for _ in 0..3 {
            b.on_attempt(1, Verdict::TargetFailed, now);
        }
        assert!(!b.eligible(1));
        now += Duration::from_secs(10);
        let mut events = Vec::new();
        b.tick(now, &mut events);
        assert!(events.is_empty());
        assert!(!b.eligible(1), "time is over, but no probe has passed yet");
        assert_eq!(
            b.on_probe(1, true, now),
            Some(HealthEvent::Returned { target: 1 })
        );
        assert!(b.eligible(1));
    }

    #[test]
    fn passive_ejection_can_be_turned_off() {
        let mut b = book(
            2,
            HealthSettings {
                failures: 0,
                ..cfg()
            },
        );
        for _ in 0..100 {
            assert_eq!(b.on_attempt(0, Verdict::TargetFailed, Instant::now()), None);
        }
        assert!(b.eligible(0));
    }

    fn sample(target: usize, ttft_ms: u64, tokens: u32, total_ms: u64) -> Sample {
        Sample {
            target,
            status: 200,
            success: true,
            ttft: Some(Duration::from_millis(ttft_ms)),
            first_byte: Some(Duration::from_millis(ttft_ms)),
            duration: Duration::from_millis(total_ms),
            load_at_send: 0,
            prompt_tokens: 10,
            usage: Some(rolter_core::Usage {
                prompt_tokens: 10,
                completion_tokens: tokens,
            }),
            finished: Instant::now(),
        }
    }

    /// `n` rounds of one single-token success per target, target `i` answering in
    /// `ttft_ms[i]`.
    fn feed(b: &mut HealthBook, ttft_ms: [u64; 3], n: usize) {
        for _ in 0..n {
            for (t, ms) in ttft_ms.into_iter().enumerate() {
                b.on_sample(&sample(t, ms, 1, ms));
            }
        }
    }

    fn latency_cfg() -> HealthSettings {
        HealthSettings {
            latency_factor: 3.0,
            latency_for: Duration::from_secs(5),
            latency_min_samples: 10,
            ..cfg()
        }
    }

    #[test]
    fn a_target_far_slower_than_its_peers_for_long_enough_is_ejected() {
        let mut b = book(3, latency_cfg());
        let t0 = Instant::now();
        let mut events = Vec::new();
        feed(&mut b, [20, 25, 100], 10);
        // 100 ms against a median of 22.5 ms: an outlier from now on, not yet for long.
        b.tick(t0, &mut events);
        b.tick(t0 + Duration::from_secs(4), &mut events);
        assert!(events.is_empty() && b.eligible(2));
        b.tick(t0 + Duration::from_secs(5), &mut events);
        match events.as_slice() {
            [HealthEvent::SlowEjected {
                target: 2,
                duration,
                ratio,
            }] => {
                assert_eq!(*duration, Duration::from_secs(10));
                assert!((*ratio - 100.0 / 22.5).abs() < 1e-9, "{ratio}");
            }
            other => panic!("{other:?}"),
        }
        assert!(!b.eligible(2));
        // It returns through the same path, with its latency forgotten.
        events.clear();
        b.tick(t0 + Duration::from_secs(15), &mut events);
        assert_eq!(events, [HealthEvent::Returned { target: 2 }]);
        assert!(b.eligible(2));
        b.tick(t0 + Duration::from_secs(30), &mut events);
        assert_eq!(events.len(), 1, "not judged again before new samples");
    }

    #[test]
    fn an_attempt_sent_before_its_ejection_does_not_teach_the_returning_target() {
        let mut b = book(3, latency_cfg());
        let t0 = Instant::now();
        let mut events = Vec::new();
        feed(&mut b, [20, 20, 100], 10);
        b.tick(t0, &mut events);
        b.tick(t0 + Duration::from_secs(5), &mut events);
        assert!(!b.eligible(2));
        // A slow request sent before the ejection ends during it: forgotten with the rest.
        let mut late = sample(2, 100, 1, 100);
        late.finished = t0 + Duration::from_secs(5) + Duration::from_millis(50);
        b.on_sample(&late);
        assert_eq!(b.targets[2].ttft, Average::default());
        // One sent afterwards counts.
        let mut fresh = sample(2, 20, 1, 20);
        fresh.finished = t0 + Duration::from_secs(16);
        b.on_sample(&fresh);
        assert_ne!(b.targets[2].ttft, Average::default());
    }

    #[test]
    fn a_slow_spell_shorter_than_latency_for_is_forgiven_and_too_few_samples_never_judge() {
        let mut b = book(3, latency_cfg());
        let t0 = Instant::now();
        let mut events = Vec::new();
        feed(&mut b, [20, 20, 100], 10);
        b.tick(t0, &mut events);
        // Fast again: the average falls back under 3x the peers' before latency_for ends.
        for _ in 0..40 {
            b.on_sample(&sample(2, 20, 1, 20));
        }
        b.tick(t0 + Duration::from_secs(3), &mut events);
        b.tick(t0 + Duration::from_secs(9), &mut events);
        assert!(events.is_empty() && b.eligible(2));
        // Nine samples are not enough to judge.
        let mut fresh = book(3, latency_cfg());
        feed(&mut fresh, [20, 20, 500], 9);
        fresh.tick(t0, &mut events);
        fresh.tick(t0 + Duration::from_secs(60), &mut events);
        assert!(events.is_empty());
    }

    #[test]
    fn inter_token_time_counts_too_and_the_cap_holds() {
        let mut b = book(2, latency_cfg());
        let t0 = Instant::now();
        let mut events = Vec::new();
        // The same TTFT, but target 1 streams its 100 tokens after the first at 40 ms
        // each against target 0's 10 ms: four times slower.
        for _ in 0..10 {
            b.on_sample(&sample(0, 20, 101, 20 + 1000));
            b.on_sample(&sample(1, 20, 101, 20 + 4000));
        }
        b.tick(t0, &mut events);
        b.tick(t0 + Duration::from_secs(5), &mut events);
        assert!(
            matches!(events[..], [HealthEvent::SlowEjected { target: 1, .. }]),
            "{events:?}"
        );
        // With max_ejected_percent = 50 and two targets, only one can be out at once.
        let mut capped = book(
            2,
            HealthSettings {
                max_ejected_percent: 0,
                ..latency_cfg()
            },
        );
        for _ in 0..10 {
            capped.on_sample(&sample(0, 20, 1, 20));
            capped.on_sample(&sample(1, 200, 1, 200));
        }
        let mut none = Vec::new();
        capped.tick(t0, &mut none);
        capped.tick(t0 + Duration::from_secs(9), &mut none);
        assert!(none.is_empty() && capped.eligible(1), "the cap keeps it in");
    }

    #[test]
    fn slow_start_ramps_a_returning_target() {
        let cfg = HealthSettings {
            slow_start_window: Duration::from_secs(10),
            slow_start_min_weight: 0.1,
            slow_start_aggression: 1.0,
            failures: 1,
            ..cfg()
        };
        let mut b = book(2, cfg.clone());
        let t0 = Instant::now();
        assert_eq!(b.ramp(0, t0), 1.0, "no ramp at start");
        b.on_attempt(0, Verdict::TargetFailed, t0);
        let mut events = Vec::new();
        let back = t0 + Duration::from_secs(10);
        b.tick(back, &mut events);
        assert_eq!(events, [HealthEvent::Returned { target: 0 }]);
        assert_eq!(b.ramp(0, back), 0.1, "the minimum weight first");
        assert!((b.ramp(0, back + Duration::from_secs(5)) - 0.5).abs() < 1e-6);
        assert_eq!(b.ramp(0, back + Duration::from_secs(10)), 1.0);
        assert_eq!(b.ramp(1, back), 1.0);
        // Aggression 2: the square root, a faster start.
        let mut fast = book(
            2,
            HealthSettings {
                slow_start_aggression: 2.0,
                ..cfg
            },
        );
        fast.joined(1, t0);
        assert!((fast.ramp(1, t0 + Duration::from_millis(2500)) - 0.5).abs() < 1e-6);
        // Off by default.
        let mut off = book(2, super::tests::cfg());
        off.joined(0, t0);
        assert_eq!(off.ramp(0, t0), 1.0);
    }
}
