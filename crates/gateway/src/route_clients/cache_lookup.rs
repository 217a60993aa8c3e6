//! The worker's client of a route's LMCache controller: asks `POST /lookup` how much of the
//! prompt each instance holds, before an `lmcache_aware` route picks.
//!
//! Owns, per route and core, a few idle keep-alive connections to the controller, a memo of
//! recent answers (the same prompt prefix within `lookup_window` is asked once; a request
//! routed meanwhile is written into the remembered answer, since its engine stores the
//! prompt) and a pause
//! after a failure (`retry_after`), so a dead controller costs one timeout per pause, not
//! one per request. It must not fail a request: every failure is an empty answer, and the
//! strategy falls back to load and says so. It never blocks and makes at most one call per
//! request, within `lookup_timeout`.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use rolter_config::{CacheController, Route, Target};
use rolter_engine::lmcache::{self, Backoff, Holdings, Instances, LookupMemo};
use rolter_strategy::CacheLookupOptions;

use crate::upstream::connect::connect;
use crate::upstream::pool::{Pool, PoolLimits};
use crate::upstream::reuse;
use crate::upstream::side_request;

/// Largest `/lookup` answer read (one entry per instance; a few KiB at most).
const MAX_ANSWER: usize = 256 * 1024;
/// Idle connections kept per route and core, and how long one stays idle before it is
/// closed.
const POOL: PoolLimits = PoolLimits {
    max_idle: 4,
    idle_timeout: Duration::from_secs(60),
};
/// Answers remembered per route and core.
const MEMO_ENTRIES: usize = 4096;

/// What became of one request's lookup, as counted in `rolter_cache_lookups_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookupResult {
    /// The controller answered.
    Answered,
    /// A recent answer for the same prefix was reused.
    Memo,
    /// No answer within `lookup_timeout`.
    TimedOut,
    /// Connect refused, a broken exchange, a non-2xx status or a malformed answer.
    Failed,
    /// Not asked: the controller failed within the last `retry_after`.
    Paused,
}

impl LookupResult {
    pub fn label(self) -> &'static str {
        match self {
            LookupResult::Answered => "answered",
            LookupResult::Memo => "memo",
            LookupResult::TimedOut => "timeout",
            LookupResult::Failed => "error",
            LookupResult::Paused => "paused",
        }
    }
}

/// A lookup's holdings (`None` unless usable), its result, and how many instance ids in the
/// answer named no target of the route.
pub struct Lookup {
    /// The prompt's memo key, for [`CacheLookup::routed`].
    pub key: u64,
    pub holdings: Option<Holdings>,
    pub result: LookupResult,
    pub unknown_instances: usize,
}

/// One route's controller client on one core.
pub struct CacheLookup {
    controller: CacheController,
    path: String,
    instances: Instances,
    options: CacheLookupOptions,
    /// Keep-alive connections to the controller (one pool slot).
    pool: Pool,
    memo: RefCell<LookupMemo>,
    backoff: Cell<Backoff>,
}

impl CacheLookup {
    /// The client of `route`'s controller, when its strategy asks one (`options`).
    pub fn for_route(
        route: &Route,
        targets: &[Target],
        options: Option<&CacheLookupOptions>,
    ) -> Option<CacheLookup> {
        let options = options?.clone();
        let controller = route.cache_controller.clone()?;
        let instances = Instances::new(
            route
                .targets
                .iter()
                .map(|&t| (targets[t].lmcache_instance.as_str(), t)),
        );
        Some(CacheLookup {
            path: format!("{}/lookup", controller.base_path),
            controller,
            instances,
            pool: Pool::new(vec![POOL]),
            memo: RefCell::new(LookupMemo::new(options.window, MEMO_ENTRIES)),
            backoff: Cell::new(Backoff::new(options.retry_after)),
            options,
        })
    }

    /// What the controller says the route's targets hold of `ids`. `body` and `scratch`
    /// are the request's reusable buffers.
    pub async fn lookup(&self, ids: &[u32], body: &mut Vec<u8>, scratch: &mut Vec<u8>) -> Lookup {
        let now = Instant::now();
        let key = lmcache::memo_key(ids, self.options.chunk_tokens);
        if let Some(h) = self.memo.borrow().get(key, now) {
            return Lookup {
                key,
                holdings: Some(h),
                result: LookupResult::Memo,
                unknown_instances: 0,
            };
        }
        if !self.backoff.get().open(now) {
            return self.failed(key, LookupResult::Paused, now);
        }
        lmcache::lookup_body(ids, body);
        let answer =
            match monoio::time::timeout(self.options.timeout, self.call(body, scratch)).await {
                Ok(Ok(a)) => a,
                Ok(Err(())) => return self.failed(key, LookupResult::Failed, Instant::now()),
                Err(_) => return self.failed(key, LookupResult::TimedOut, Instant::now()),
            };
        let prompt_len = u32::try_from(ids.len()).unwrap_or(u32::MAX);
        match lmcache::parse_lookup(&answer, &self.instances, prompt_len) {
            Ok(parsed) => {
                let mut b = self.backoff.get();
                b.succeeded();
                self.backoff.set(b);
                let holdings: Holdings = Rc::from(parsed.holdings);
                self.memo.borrow_mut().put(key, now, holdings.clone());
                Lookup {
                    key,
                    holdings: Some(holdings),
                    result: LookupResult::Answered,
                    unknown_instances: parsed.unknown_instances,
                }
            }
            Err(_) => self.failed(key, LookupResult::Failed, Instant::now()),
        }
    }

    /// The request whose lookup had memo key `key` went to `target`, whose engine will
    /// store its `tokens` prompt tokens; see [`LookupMemo::note_routed`].
    pub fn routed(&self, key: u64, target: usize, tokens: u32) {
        self.memo.borrow_mut().note_routed(key, target, tokens);
    }

    fn failed(&self, key: u64, result: LookupResult, now: Instant) -> Lookup {
        if result != LookupResult::Paused {
            let mut b = self.backoff.get();
            b.failed(now);
            self.backoff.set(b);
        }
        Lookup {
            key,
            holdings: None,
            result,
            unknown_instances: 0,
        }
    }

    /// One exchange with the controller on a pooled connection (or a fresh one); the
    /// answer's body on a 2xx.
    async fn call(&self, body: &[u8], scratch: &mut Vec<u8>) -> Result<Vec<u8>, ()> {
        side_request::build_request_to(
            scratch,
            &self.controller.host_header,
            &[],
            "POST",
            &self.path,
            Some(body),
            true,
        );
        let (addr, timeout) = (self.controller.addr, self.options.timeout);
        let connect = async || {
            connect(addr, timeout, None)
                .await
                .map_err(|e| e.to_string())
        };
        match reuse::call(&self.pool, 0, connect, scratch, MAX_ANSWER).await {
            Ok(resp) if (200..300).contains(&resp.status) => Ok(resp.body),
            _ => Err(()),
        }
    }
}
