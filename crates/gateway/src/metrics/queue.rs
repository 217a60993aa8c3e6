//! The routes' queues: `rolter_queue_depth{route}` (requests waiting now, over every
//! worker), `rolter_queue_wait_seconds{route}` (how long requests waited, however their
//! wait ended) and `rolter_queue_requests_total{route,result}` (admitted, timeout,
//! overflow, client_gone, unavailable, dropped), fed by the control thread from the
//! workers' records.
//!
//! Owns these series' names, labels and buckets. It must not be used from worker threads.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// `rolter_queue_wait_seconds` bucket bounds: 1 ms to 60 s.
pub const WAIT_BUCKETS: [f64; 13] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabel {
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteResult {
    route: String,
    result: &'static str,
}

fn wait_histogram() -> Histogram {
    Histogram::new(WAIT_BUCKETS)
}

/// The queue series of the routes that have a queue.
pub struct QueueMetrics {
    routes: Vec<Option<String>>,
    depth: Family<RouteLabel, Gauge>,
    waits: Family<RouteLabel, Histogram, fn() -> Histogram>,
    results: Family<RouteResult, Counter>,
}

impl QueueMetrics {
    /// `routes`: each route's name when it has a queue.
    pub fn new(routes: Vec<Option<String>>) -> Self {
        let depth = Family::<RouteLabel, Gauge>::default();
        let waits = Family::<RouteLabel, Histogram, fn() -> Histogram>::new_with_constructor(
            wait_histogram,
        );
        for name in routes.iter().flatten() {
            let l = RouteLabel {
                route: name.clone(),
            };
            let _ = depth.get_or_create(&l);
            let _ = waits.get_or_create(&l);
        }
        QueueMetrics {
            routes,
            depth,
            waits,
            results: Family::default(),
        }
    }

    fn name(&self, route: u16) -> Option<&String> {
        self.routes.get(route as usize)?.as_ref()
    }

    /// A request entered `route`'s queue.
    pub fn queued(&mut self, route: u16) {
        if let Some(n) = self.name(route) {
            self.depth
                .get_or_create(&RouteLabel { route: n.clone() })
                .inc();
        }
    }

    /// A request left `route`'s queue (or found it full: `overflow`, never queued).
    pub fn left(&mut self, route: u16, result: &'static str, waited: std::time::Duration) {
        let Some(n) = self.name(route).cloned() else {
            return;
        };
        self.results
            .get_or_create(&RouteResult {
                route: n.clone(),
                result,
            })
            .inc();
        if result == "overflow" {
            return;
        }
        let l = RouteLabel { route: n };
        self.depth.get_or_create(&l).dec();
        self.waits.get_or_create(&l).observe(waited.as_secs_f64());
    }

    /// Appends the series to `out`; nothing when no route has a queue.
    pub fn render(&self, out: &mut String) {
        if self.routes.iter().all(Option::is_none) {
            return;
        }
        let mut r = Registry::default();
        r.register(
            "rolter_queue_depth",
            "Requests waiting in the route's queue for a target under its max_concurrent, over every worker",
            self.depth.clone(),
        );
        r.register(
            "rolter_queue_wait_seconds",
            "How long requests waited in the route's queue, however the wait ended",
            self.waits.clone(),
        );
        r.register(
            "rolter_queue_requests",
            "Requests that found every target of the route full, by how their wait ended: admitted, timeout (503 after queue_timeout), overflow (503 at once, the queue was full), client_gone, unavailable, dropped",
            self.results.clone(),
        );
        super::text::append(out, &r);
    }
}
