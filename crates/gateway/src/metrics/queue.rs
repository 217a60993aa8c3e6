//! The routes' queues: `rolter_queue_depth{route}` (requests waiting now, over every
//! worker), `rolter_queue_wait_seconds{route}` (how long requests waited, however their
//! wait ended) and `rolter_queue_requests_total{route,result}` (admitted, timeout,
//! deadline_exceeded, overflow, displaced, client_gone, unavailable, dropped); and by
//! class and tenant: `rolter_queue_class_depth{route,class}`,
//! `rolter_queue_class_wait_seconds{route,class}`,
//! `rolter_queue_tenant_wait_seconds{route,tenant}` and
//! `rolter_admission_requests_total{route,class,tenant,result}` (the results above, and
//! `deadline_unmeetable` for a request refused before it queued). A tenant is a key's
//! name, `-` for callers without a key, or `by_header` for the tenants a route's
//! `tenant_header` names (their names are unbounded). Fed by the control thread from the
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteClass {
    route: String,
    class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteTenant {
    route: String,
    tenant: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Admission {
    route: String,
    class: String,
    tenant: String,
    result: &'static str,
}

/// The names the class and tenant labels take.
pub struct AdmissionNames {
    /// Every route's name.
    pub routes: Vec<String>,
    pub classes: Vec<String>,
    /// The keys' names (a tenant index past them is `-`, then `by_header`).
    pub keys: Vec<String>,
}

impl AdmissionNames {
    fn tenant(&self, t: u32) -> String {
        let t = t as usize;
        match t.cmp(&self.keys.len()) {
            std::cmp::Ordering::Less => self.keys[t].clone(),
            std::cmp::Ordering::Equal => "-".to_string(),
            std::cmp::Ordering::Greater => "by_header".to_string(),
        }
    }

    fn class(&self, c: u8) -> String {
        self.classes.get(c as usize).cloned().unwrap_or_default()
    }
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
    names: AdmissionNames,
    class_depth: Family<RouteClass, Gauge>,
    class_waits: Family<RouteClass, Histogram, fn() -> Histogram>,
    tenant_waits: Family<RouteTenant, Histogram, fn() -> Histogram>,
    admission: Family<Admission, Counter>,
}

impl QueueMetrics {
    /// `routes`: each route's name when it has a queue.
    pub fn new(routes: Vec<Option<String>>, names: AdmissionNames) -> Self {
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
            names,
            class_depth: Family::default(),
            class_waits: Family::new_with_constructor(wait_histogram),
            tenant_waits: Family::new_with_constructor(wait_histogram),
            admission: Family::default(),
        }
        .with_series()
    }

    /// Every queued route's class and tenant series, at zero, so a quiet gateway shows them.
    fn with_series(self) -> Self {
        for route in self.routes.iter().flatten() {
            for class in &self.names.classes {
                let l = RouteClass {
                    route: route.clone(),
                    class: class.clone(),
                };
                let _ = self.class_depth.get_or_create(&l);
                let _ = self.class_waits.get_or_create(&l);
                let _ = self.admission.get_or_create(&Admission {
                    route: route.clone(),
                    class: class.clone(),
                    tenant: "-".to_string(),
                    result: "admitted",
                });
            }
            let tenants = self.names.keys.iter().cloned().chain(["-".to_string()]);
            for tenant in tenants {
                let l = RouteTenant {
                    route: route.clone(),
                    tenant,
                };
                let _ = self.tenant_waits.get_or_create(&l);
            }
        }
        self
    }

    fn name(&self, route: u16) -> Option<&String> {
        self.routes.get(route as usize)?.as_ref()
    }

    /// A request entered `route`'s queue.
    pub fn queued(&mut self, route: u16, class: u8) {
        if let Some(n) = self.name(route) {
            self.depth
                .get_or_create(&RouteLabel { route: n.clone() })
                .inc();
            let l = RouteClass {
                route: n.clone(),
                class: self.names.class(class),
            };
            self.class_depth.get_or_create(&l).inc();
        }
    }

    /// The class and tenant series of a request that left `route`'s queue or never took
    /// a seat (`queued` false).
    fn by_class(
        &mut self,
        route: u16,
        (class, tenant): (u8, u32),
        result: &'static str,
        waited: Option<std::time::Duration>,
    ) {
        let Some(r) = self.names.routes.get(route as usize).cloned() else {
            return;
        };
        let (c, t) = (self.names.class(class), self.names.tenant(tenant));
        self.admission
            .get_or_create(&Admission {
                route: r.clone(),
                class: c.clone(),
                tenant: t.clone(),
                result,
            })
            .inc();
        let Some(w) = waited else {
            return;
        };
        let l = RouteClass {
            route: r.clone(),
            class: c,
        };
        self.class_depth.get_or_create(&l).dec();
        self.class_waits.get_or_create(&l).observe(w.as_secs_f64());
        self.tenant_waits
            .get_or_create(&RouteTenant {
                route: r,
                tenant: t,
            })
            .observe(w.as_secs_f64());
    }

    /// A request left `route`'s queue (or found it full: `overflow`, never queued).
    pub fn left(
        &mut self,
        route: u16,
        who: (u8, u32),
        result: &'static str,
        waited: std::time::Duration,
    ) {
        let seated = !matches!(result, "overflow" | "deadline_unmeetable");
        self.by_class(route, who, result, seated.then_some(waited));
        let Some(n) = self.name(route).cloned() else {
            return;
        };
        self.results
            .get_or_create(&RouteResult {
                route: n.clone(),
                result,
            })
            .inc();
        if !seated {
            return;
        }
        let l = RouteLabel { route: n };
        self.depth.get_or_create(&l).dec();
        self.waits.get_or_create(&l).observe(waited.as_secs_f64());
    }

    /// Appends the series to `out`; nothing when no route has a queue.
    pub fn render(&self, out: &mut String) {
        let mut r = Registry::default();
        r.register(
            "rolter_admission_requests",
            "Requests that met admission by class and tenant, by how it ended: the queue's results, and deadline_unmeetable (refused at once, no target predicted within the deadline)",
            self.admission.clone(),
        );
        if self.routes.iter().all(Option::is_none) {
            super::text::append(out, &r);
            return;
        }
        r.register(
            "rolter_queue_class_depth",
            "Requests waiting in the route's queue now, by class",
            self.class_depth.clone(),
        );
        r.register(
            "rolter_queue_class_wait_seconds",
            "How long requests waited in the route's queue, by class",
            self.class_waits.clone(),
        );
        r.register(
            "rolter_queue_tenant_wait_seconds",
            "How long requests waited in the route's queue, by tenant",
            self.tenant_waits.clone(),
        );
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
            "Requests that found every target of the route full, by how their wait ended: admitted, timeout (503 after queue_timeout), deadline_exceeded (504), overflow (503 at once, the queue was full), displaced (503, a higher class took the seat), client_gone, unavailable, dropped",
            self.results.clone(),
        );
        super::text::append(out, &r);
    }
}
