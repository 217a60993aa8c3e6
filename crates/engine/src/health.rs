//! The health book: per target, the active check state (healthy/unhealthy after the
//! configured streaks of probe results) and passive ejection (consecutive failed requests
//! eject a target for a time that doubles with each ejection in a row, capped), with a cap on
//! the share of any route's targets ejected at once.
//!
//! Owned by the control thread; pure state with time passed in, so it is tested without
//! sockets. It must not do I/O: probes and request outcomes arrive as values, and the
//! caller publishes [`HealthBook::eligible`] to the workers.

use std::time::{Duration, Instant};

use rolter_config::{HealthConfig, Route, Target, TargetId};
use rolter_core::Verdict;

/// A change worth a log line and a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    cfg: HealthConfig,
    targets: Vec<TargetHealth>,
    /// Targets per route, for the ejection cap.
    routes: Vec<Vec<TargetId>>,
}

impl HealthBook {
    pub fn new(cfg: &HealthConfig, targets: &[Target], routes: &[Route]) -> Self {
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
        }
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
                return Some(HealthEvent::Returned { target: t });
            }
            if h.unhealthy && h.probe_passes >= up {
                h.unhealthy = false;
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
                events.push(HealthEvent::Returned { target: t });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn book(targets: usize, cfg: HealthConfig) -> HealthBook {
        let config = rolter_config::load_str(
            &{
                let mut s = String::new();
                for i in 0..targets {
                    s.push_str(&format!(
                        "[[targets]]\nname = \"t{i}\"\nurl = \"http://127.0.0.1:{}\"\n",
                        9000 + i
                    ));
                }
                let names: Vec<String> = (0..targets).map(|i| format!("\"t{i}\"")).collect();
                s.push_str(&format!(
                    "[[routes]]\nname = \"r\"\ntargets = [{}]\n",
                    names.join(",")
                ));
                s
            },
            "t.toml",
        )
        .unwrap();
        HealthBook::new(&cfg, &config.targets, &config.routes)
    }

    fn cfg() -> HealthConfig {
        HealthConfig {
            failures: 3,
            ejection_time: Duration::from_secs(10),
            max_ejection_time: Duration::from_secs(35),
            max_ejected_percent: 50,
            ..HealthConfig::default()
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
            HealthConfig {
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
            HealthConfig {
                failures: 0,
                ..cfg()
            },
        );
        for _ in 0..100 {
            assert_eq!(b.on_attempt(0, Verdict::TargetFailed, Instant::now()), None);
        }
        assert!(b.eligible(0));
    }
}
