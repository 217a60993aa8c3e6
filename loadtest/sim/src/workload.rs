//! Generated workloads: sessions of one or more turns, each turn carrying the canonical
//! prompt bytes the gateway would hand a strategy (whitespace-free JSON of the messages).
//!
//! Every generator is driven by a seeded generator, so a seed gives the same workload.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::engine::{block_hashes, prompt_tokens, BYTES_PER_TOKEN};

/// One request of a session.
#[derive(Debug, Clone)]
pub struct Turn {
    /// Canonical prompt bytes (compact JSON of the messages array).
    pub prompt: Arc<[u8]>,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    /// Pause between the previous turn's answer and this turn (zero for the first turn).
    pub think: Duration,
    /// The LoRA adapter the request names in `model` (see [`adapter_name`]); `None`: the
    /// base model.
    pub adapter: Option<u32>,
}

/// A sequence of turns from one user; later turns are sent once the previous one finished.
#[derive(Debug, Clone)]
pub struct Session {
    pub id: u64,
    /// The unit of prefix sharing the oracle keeps on one engine: the conversation for
    /// multi-turn chat, the document for RAG, the template for few-shot.
    pub group: u64,
    /// When the first turn arrives.
    pub start: Duration,
    pub turns: Vec<Turn>,
}

/// The workload kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    MultiTurn,
    /// Multi-turn chat without `x-session-id`.
    MultiTurnNoHeader,
    Rag,
    FewShot,
    Mixed,
    /// Multi-turn chat on a fleet with one slow replica.
    Hetero,
    /// Single requests for many LoRA adapters (skewed popularity) on engines with adapter
    /// slots.
    Lora,
    /// A few users, each sending one conversation after another without `x-session-id`,
    /// the next turn a short think time after the answer.
    FewUsers,
}

impl Kind {
    pub const ALL: [Kind; 8] = [
        Kind::MultiTurn,
        Kind::MultiTurnNoHeader,
        Kind::Rag,
        Kind::FewShot,
        Kind::Mixed,
        Kind::Hetero,
        Kind::Lora,
        Kind::FewUsers,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::MultiTurn => "multi-turn",
            Kind::MultiTurnNoHeader => "multi-turn-no-header",
            Kind::Rag => "rag",
            Kind::FewShot => "few-shot",
            Kind::Mixed => "mixed",
            Kind::Hetero => "hetero",
            Kind::Lora => "lora",
            Kind::FewUsers => "few-users",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        if s == "many-adapters" {
            return Some(Kind::Lora);
        }
        Kind::ALL.into_iter().find(|k| k.name() == s)
    }

    /// Whether requests carry `x-session-id`.
    pub fn header(self) -> bool {
        !matches!(self, Kind::MultiTurnNoHeader | Kind::FewUsers)
    }
}

/// Sizes of the generated workloads; `scale` multiplies user and request counts.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Sizes {
    pub scale: f64,
    /// Multi-turn: shared system prompts, their length, users, turns per user.
    pub systems: usize,
    pub system_tokens: usize,
    pub users: usize,
    pub min_turns: usize,
    pub max_turns: usize,
    /// Multi-turn: tokens per question and per answer (uniform between the bounds).
    pub question_tokens: (usize, usize),
    pub answer_tokens: (usize, usize),
    /// Mean think time between turns, seconds.
    pub think_s: f64,
    /// Multi-turn users arrive over this many seconds (Poisson).
    pub user_window_s: f64,
    /// RAG: documents, their length, questions and their arrival rate.
    pub documents: usize,
    pub document_tokens: usize,
    pub rag_requests: usize,
    pub rag_rate: f64,
    /// Few-shot: templates, their length, requests and rate.
    pub templates: usize,
    pub template_tokens: usize,
    pub few_shot_requests: usize,
    pub few_shot_rate: f64,
    /// Mixed: requests, rate and share of long (unique, 6–12k tokens) prompts.
    pub mixed_requests: usize,
    pub mixed_rate: f64,
    pub long_share: f64,
    /// LoRA: adapters, the Zipf exponent of their popularity, requests, rate, and the share
    /// of requests for the base model.
    pub lora_adapters: usize,
    pub lora_zipf: f64,
    pub lora_requests: usize,
    pub lora_rate: f64,
    pub lora_base_share: f64,
    /// Few users: users, requests (over every user), turns per conversation, tokens per
    /// answer, and the think time between an answer and the next turn (uniform between the
    /// bounds, milliseconds).
    pub few_users: usize,
    pub few_user_requests: usize,
    pub few_user_turns: (usize, usize),
    pub few_user_answer_tokens: (usize, usize),
    /// Few users: the shared system prompts conversations start with (0: each
    /// conversation has its own).
    pub few_user_systems: usize,
    pub think_ms: (f64, f64),
}

impl Sizes {
    pub fn full() -> Sizes {
        Sizes {
            scale: 1.0,
            systems: 4,
            system_tokens: 400,
            users: 2000,
            min_turns: 4,
            max_turns: 12,
            question_tokens: (50, 200),
            answer_tokens: (100, 400),
            think_s: 8.0,
            user_window_s: 300.0,
            documents: 24,
            document_tokens: 4000,
            rag_requests: 3000,
            rag_rate: 14.0,
            templates: 6,
            template_tokens: 3000,
            few_shot_requests: 3000,
            few_shot_rate: 20.0,
            mixed_requests: 3000,
            mixed_rate: 20.0,
            long_share: 0.15,
            lora_adapters: 48,
            lora_zipf: 1.0,
            lora_requests: 3000,
            lora_rate: 12.0,
            lora_base_share: 0.1,
            few_users: 6,
            few_user_requests: 300,
            few_user_turns: (4, 12),
            few_user_answer_tokens: (10, 40),
            few_user_systems: 4,
            think_ms: (20.0, 50.0),
        }
    }

    /// Small enough to run every workload and strategy in a few seconds.
    pub fn quick() -> Sizes {
        Sizes {
            scale: 0.2,
            ..Sizes::full()
        }
    }

    fn n(&self, v: usize) -> usize {
        ((v as f64 * self.scale).round() as usize).max(1)
    }
}

/// A generated workload.
#[derive(Debug, Clone)]
pub struct Workload {
    pub kind: Kind,
    pub sessions: Arc<Vec<Session>>,
    /// LoRA adapters requests may name (`0..adapters`, see [`adapter_name`]).
    pub adapters: usize,
}

/// The `model` of a request for adapter `i` (every adapter serves the same base model).
pub fn adapter_name(i: u32) -> String {
    format!("adapter-{i:02}")
}

/// The `model` of a request for the base model.
pub const BASE_MODEL: &str = "m";

impl Workload {
    /// Names of the adapters, by index.
    pub fn adapter_names(&self) -> Vec<String> {
        (0..self.adapters as u32).map(adapter_name).collect()
    }

    pub fn requests(&self) -> usize {
        self.sessions.iter().map(|s| s.turns.len()).sum()
    }

    /// Distinct prompt blocks over every request: the cache capacity that would hold all.
    pub fn footprint_blocks(&self) -> usize {
        let mut seen = HashSet::new();
        for s in self.sessions.iter() {
            for t in &s.turns {
                seen.extend(block_hashes(&t.prompt));
            }
        }
        seen.len()
    }
}

#[derive(Serialize)]
struct Message<'a> {
    role: &'a str,
    content: &'a str,
}

/// Compact JSON of a messages array, as the gateway's canonical form has it.
fn canonical(messages: &[(&str, &str)]) -> Arc<[u8]> {
    let msgs: Vec<Message> = messages
        .iter()
        .map(|&(role, content)| Message { role, content })
        .collect();
    serde_json::to_vec(&msgs)
        .expect("messages serialise")
        .into()
}

fn turn(messages: &[(&str, &str)], output_tokens: u32, think: Duration) -> Turn {
    let prompt = canonical(messages);
    Turn {
        prompt_tokens: prompt_tokens(&prompt),
        prompt,
        output_tokens,
        think,
        adapter: None,
    }
}

const WORDS: &[&str] = &[
    "the", "model", "answer", "request", "cache", "engine", "token", "prompt", "latency", "router",
    "gateway", "quickly", "system", "user", "context", "document", "question", "returns", "with",
    "under", "value", "batch", "queue", "prefix", "block", "memory", "replica", "fleet", "score",
    "weight", "load", "sample", "window", "stream", "reply", "example", "result", "output",
    "input", "policy", "strategy", "target", "session", "turn", "history", "summary", "detail",
    "table", "index", "vector", "search", "chunk", "of", "to", "and", "in", "for", "is", "on",
    "that", "by", "this", "it", "as",
];

/// Random words of about `tokens` tokens (`tokens × 4` bytes).
fn text(rng: &mut fastrand::Rng, tokens: usize) -> String {
    let target = tokens * BYTES_PER_TOKEN;
    let mut s = String::with_capacity(target + 16);
    while s.len() < target {
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str(WORDS[rng.usize(..WORDS.len())]);
    }
    s
}

/// Random words of between `lo` and `hi` tokens.
fn text_between(rng: &mut fastrand::Rng, lo: usize, hi: usize) -> String {
    let n = range(rng, lo, hi);
    text(rng, n)
}

/// An exponential variate with the given mean.
fn exp(rng: &mut fastrand::Rng, mean: f64) -> f64 {
    -mean * (1.0 - rng.f64()).ln()
}

fn range(rng: &mut fastrand::Rng, lo: usize, hi: usize) -> usize {
    rng.usize(lo..=hi)
}

/// Poisson arrival times for `n` requests at `rate` per second.
fn arrivals(rng: &mut fastrand::Rng, n: usize, rate: f64) -> Vec<Duration> {
    let mut t = 0.0;
    (0..n)
        .map(|_| {
            t += exp(rng, 1.0 / rate);
            Duration::from_secs_f64(t)
        })
        .collect()
}

/// Generates workload `kind` for `seed`.
pub fn generate(kind: Kind, sizes: &Sizes, seed: u64) -> Workload {
    let sessions = match kind {
        Kind::MultiTurn | Kind::MultiTurnNoHeader | Kind::Hetero => multi_turn(sizes, seed),
        Kind::Rag => rag(sizes, seed),
        Kind::FewShot => few_shot(sizes, seed),
        Kind::Mixed => mixed(sizes, seed),
        Kind::Lora => lora(sizes, seed),
        Kind::FewUsers => few_users(sizes, seed),
    };
    Workload {
        kind,
        sessions: Arc::new(sessions),
        adapters: if kind == Kind::Lora {
            sizes.lora_adapters.max(1)
        } else {
            0
        },
    }
}

/// A handful of shared system prompts and many users; each turn appends the previous
/// answer and a new question.
pub fn multi_turn(sizes: &Sizes, seed: u64) -> Vec<Session> {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x6d75_6c74);
    let systems: Vec<String> = (0..sizes.systems)
        .map(|i| {
            format!(
                "You are assistant {i}. {}",
                text(&mut rng, sizes.system_tokens)
            )
        })
        .collect();
    let users = sizes.n(sizes.users);
    let rate = users as f64 / (sizes.user_window_s * sizes.scale).max(1.0);
    let starts = arrivals(&mut rng, users, rate);
    let mut sessions = Vec::with_capacity(users);
    for (u, start) in starts.into_iter().enumerate() {
        let system = &systems[rng.usize(..systems.len())];
        let turns_n = range(&mut rng, sizes.min_turns, sizes.max_turns);
        let mut history: Vec<(&str, String)> = vec![("system", system.clone())];
        let mut turns = Vec::with_capacity(turns_n);
        for k in 0..turns_n {
            let (qlo, qhi) = sizes.question_tokens;
            let question = format!("user {u} asks: {}", text_between(&mut rng, qlo, qhi));
            history.push(("user", question));
            let (alo, ahi) = sizes.answer_tokens;
            let output = range(&mut rng, alo, ahi) as u32;
            let think = if k == 0 {
                Duration::ZERO
            } else {
                Duration::from_secs_f64(1.0 + exp(&mut rng, (sizes.think_s - 1.0).max(0.1)))
            };
            let msgs: Vec<(&str, &str)> = history.iter().map(|(r, c)| (*r, c.as_str())).collect();
            turns.push(turn(&msgs, output, think));
            history.push(("assistant", text(&mut rng, output as usize)));
        }
        sessions.push(Session {
            id: u as u64,
            group: u as u64,
            start,
            turns,
        });
    }
    sessions
}

/// A few users (`few_users`), each sending conversations one after another until the
/// users have sent `few_user_requests` between them: a conversation starts with one of the
/// shared system prompts, each turn appends the previous answer and a new question, and
/// every turn (the first of a conversation too) follows the user's previous answer after
/// a think time drawn from `think_ms`. One session per user (its group too), so a session's
/// turns span several conversations. Users start within the first second.
pub fn few_users(sizes: &Sizes, seed: u64) -> Vec<Session> {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x6665_7775);
    let systems: Vec<String> = (0..sizes.few_user_systems)
        .map(|i| {
            format!(
                "You are assistant {i}. {}",
                text(&mut rng, sizes.system_tokens)
            )
        })
        .collect();
    let users = sizes.n(sizes.few_users);
    let requests = sizes.n(sizes.few_user_requests).max(users);
    let (tlo, thi) = sizes.think_ms;
    let (tlo, thi) = (tlo.max(0.0), thi.max(tlo.max(0.0)));
    (0..users)
        .map(|u| {
            let own = requests / users + usize::from(u < requests % users);
            let start = Duration::from_secs_f64(rng.f64());
            let mut turns = Vec::with_capacity(own);
            let mut conversation = 0;
            while turns.len() < own {
                let (lo, hi) = sizes.few_user_turns;
                let n = range(&mut rng, lo.max(1), hi.max(lo.max(1))).min(own - turns.len());
                let system = if systems.is_empty() {
                    let t = text(&mut rng, sizes.system_tokens);
                    format!("You are the assistant of user {u}, chat {conversation}. {t}")
                } else {
                    systems[rng.usize(..systems.len())].clone()
                };
                let mut history: Vec<(&str, String)> = vec![("system", system)];
                for _ in 0..n {
                    let (qlo, qhi) = sizes.question_tokens;
                    let q = text_between(&mut rng, qlo, qhi);
                    history.push(("user", format!("user {u}, chat {conversation}: {q}")));
                    let (alo, ahi) = sizes.few_user_answer_tokens;
                    let output = range(&mut rng, alo, ahi) as u32;
                    let think = if turns.is_empty() {
                        Duration::ZERO
                    } else {
                        Duration::from_secs_f64((tlo + rng.f64() * (thi - tlo)) / 1e3)
                    };
                    let msgs: Vec<(&str, &str)> =
                        history.iter().map(|(r, c)| (*r, c.as_str())).collect();
                    turns.push(turn(&msgs, output, think));
                    history.push(("assistant", text(&mut rng, output as usize)));
                }
                conversation += 1;
            }
            Session {
                id: u as u64,
                group: u as u64,
                start,
                turns,
            }
        })
        .collect()
}

/// Index drawn from a cumulative weight table ([`zipf_table`]).
fn zipf(rng: &mut fastrand::Rng, cumulative: &[f64]) -> usize {
    let x = rng.f64() * cumulative[cumulative.len() - 1];
    cumulative
        .partition_point(|&c| c <= x)
        .min(cumulative.len() - 1)
}

/// Cumulative Zipf-like weights 1/(i+1)^0.8 over `n` items.
fn zipf_table(n: usize) -> Vec<f64> {
    zipf_table_with(n, 0.8)
}

/// Cumulative Zipf-like weights 1/(i+1)^`exponent` over `n` items.
fn zipf_table_with(n: usize, exponent: f64) -> Vec<f64> {
    let mut acc = 0.0;
    (0..n)
        .map(|i| {
            acc += 1.0 / ((i + 1) as f64).powf(exponent);
            acc
        })
        .collect()
}

/// Questions over a set of shared documents (Zipf popularity), one request each.
pub fn rag(sizes: &Sizes, seed: u64) -> Vec<Session> {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x7261_6700);
    let system = format!("Answer from the document only. {}", text(&mut rng, 60));
    let docs: Vec<String> = (0..sizes.documents)
        .map(|i| format!("Document {i}: {}", text(&mut rng, sizes.document_tokens)))
        .collect();
    let table = zipf_table(docs.len());
    let n = sizes.n(sizes.rag_requests);
    let starts = arrivals(&mut rng, n, sizes.rag_rate);
    starts
        .into_iter()
        .enumerate()
        .map(|(i, start)| {
            let d = zipf(&mut rng, &table);
            let user = format!(
                "{}\n\nQuestion {i}: {}",
                docs[d],
                text_between(&mut rng, 10, 60)
            );
            let output = range(&mut rng, 50, 250) as u32;
            Session {
                id: i as u64,
                group: d as u64,
                start,
                turns: vec![turn(
                    &[("system", &system), ("user", &user)],
                    output,
                    Duration::ZERO,
                )],
            }
        })
        .collect()
}

/// A handful of long few-shot templates (system + example pairs) with a short query each.
pub fn few_shot(sizes: &Sizes, seed: u64) -> Vec<Session> {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x6665_7773);
    let examples = 8;
    let per_example = sizes.template_tokens / (2 * examples + 1);
    let templates: Vec<Vec<(&'static str, String)>> = (0..sizes.templates)
        .map(|i| {
            let mut m = vec![(
                "system",
                format!("Task {i}. {}", text(&mut rng, per_example)),
            )];
            for _ in 0..examples {
                m.push(("user", text(&mut rng, per_example)));
                m.push(("assistant", text(&mut rng, per_example)));
            }
            m
        })
        .collect();
    let table = zipf_table(templates.len());
    let n = sizes.n(sizes.few_shot_requests);
    let starts = arrivals(&mut rng, n, sizes.few_shot_rate);
    starts
        .into_iter()
        .enumerate()
        .map(|(i, start)| {
            let t = zipf(&mut rng, &table);
            let query = format!("query {i}: {}", text_between(&mut rng, 20, 120));
            let mut msgs: Vec<(&str, &str)> =
                templates[t].iter().map(|(r, c)| (*r, c.as_str())).collect();
            msgs.push(("user", &query));
            let output = range(&mut rng, 20, 100) as u32;
            Session {
                id: i as u64,
                group: t as u64,
                start,
                turns: vec![turn(&msgs, output, Duration::ZERO)],
            }
        })
        .collect()
}

/// Short chats behind one shared system prompt, mixed with long unique prompts.
pub fn mixed(sizes: &Sizes, seed: u64) -> Vec<Session> {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x6d69_7864);
    let system = format!("You are a helpful assistant. {}", text(&mut rng, 400));
    let n = sizes.n(sizes.mixed_requests);
    let starts = arrivals(&mut rng, n, sizes.mixed_rate);
    starts
        .into_iter()
        .enumerate()
        .map(|(i, start)| {
            let long = rng.f64() < sizes.long_share;
            let (user, output) = if long {
                (
                    format!(
                        "Summarise report {i}: {}",
                        text_between(&mut rng, 6000, 12000)
                    ),
                    range(&mut rng, 100, 300),
                )
            } else {
                (
                    format!("chat {i}: {}", text_between(&mut rng, 30, 200)),
                    range(&mut rng, 30, 200),
                )
            };
            Session {
                id: i as u64,
                group: i as u64,
                start,
                turns: vec![turn(
                    &[("system", &system), ("user", &user)],
                    output as u32,
                    Duration::ZERO,
                )],
            }
        })
        .collect()
}

/// Single requests, each for one of many LoRA adapters (Zipf popularity over a shuffled
/// order, so adapter 0 is not always the hottest) or, for a share of them, the base model.
/// Each adapter has its own short system prompt (vLLM keys prefix-cache blocks per
/// adapter, so adapters share no blocks).
pub fn lora(sizes: &Sizes, seed: u64) -> Vec<Session> {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x6c6f_7261);
    let adapters = sizes.lora_adapters.max(1);
    let systems: Vec<String> = (0..adapters)
        .map(|a| {
            format!(
                "You are {}, a tuned assistant. {}",
                adapter_name(a as u32),
                text(&mut rng, 100)
            )
        })
        .collect();
    let base_system = format!("You are a helpful assistant. {}", text(&mut rng, 100));
    let mut rank: Vec<u32> = (0..adapters as u32).collect();
    rng.shuffle(&mut rank);
    let table = zipf_table_with(adapters, sizes.lora_zipf);
    let n = sizes.n(sizes.lora_requests);
    let starts = arrivals(&mut rng, n, sizes.lora_rate);
    starts
        .into_iter()
        .enumerate()
        .map(|(i, start)| {
            let adapter =
                (rng.f64() >= sizes.lora_base_share).then(|| rank[zipf(&mut rng, &table)]);
            let system = match adapter {
                Some(a) => &systems[a as usize],
                None => &base_system,
            };
            let user = format!("request {i}: {}", text_between(&mut rng, 100, 500));
            let output = range(&mut rng, 50, 250) as u32;
            let mut t = turn(
                &[("system", system), ("user", &user)],
                output,
                Duration::ZERO,
            );
            t.adapter = adapter;
            Session {
                id: i as u64,
                // The oracle keeps each adapter on one engine; base requests are their own.
                group: adapter.map_or((1 << 32) + i as u64, u64::from),
                start,
                turns: vec![t],
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Sizes {
        Sizes {
            scale: 0.05,
            ..Sizes::full()
        }
    }

    #[test]
    fn multi_turn_prompts_grow_by_prefix() {
        let s = multi_turn(&tiny(), 3);
        assert_eq!(s.len(), 100);
        for sess in &s {
            assert!(sess.turns.len() >= 4 && sess.turns.len() <= 12);
            for w in sess.turns.windows(2) {
                let (a, b) = (&w[0].prompt, &w[1].prompt);
                // The earlier turn's array minus its closing `]` is a prefix of the next.
                assert!(b.starts_with(&a[..a.len() - 1]));
                assert!(w[1].think >= Duration::from_secs(1));
            }
            let v: serde_json::Value = serde_json::from_slice(&sess.turns[0].prompt).unwrap();
            assert_eq!(v[0]["role"], "system");
            assert!(!sess.turns[0].prompt.contains(&b'\n'));
        }
    }

    #[test]
    fn generation_is_deterministic() {
        for kind in Kind::ALL {
            let a = generate(kind, &tiny(), 9);
            let b = generate(kind, &tiny(), 9);
            assert_eq!(a.requests(), b.requests());
            for (x, y) in a.sessions.iter().zip(b.sessions.iter()) {
                assert_eq!(x.start, y.start);
                assert_eq!(x.turns[0].prompt, y.turns[0].prompt);
            }
        }
    }

    #[test]
    fn lora_popularity_is_skewed_and_adapters_share_no_blocks() {
        let sizes = Sizes {
            scale: 0.5,
            ..Sizes::full()
        };
        let w = generate(Kind::Lora, &sizes, 4);
        assert_eq!(w.adapters, 48);
        assert_eq!(w.adapter_names()[7], "adapter-07");
        let mut counts = vec![0usize; w.adapters];
        let mut base = 0;
        for s in w.sessions.iter() {
            match s.turns[0].adapter {
                Some(a) => counts[a as usize] += 1,
                None => base += 1,
            }
        }
        let n = w.requests();
        assert_eq!(n, 1500);
        assert!((n / 20..n / 5).contains(&base), "{base} base requests");
        let mut hot: Vec<u32> = (0..w.adapters as u32).collect();
        hot.sort_by_key(|&a| std::cmp::Reverse(counts[a as usize]));
        counts.sort_unstable();
        // Zipf(1) over 48: the hottest adapter draws ~22%, the median ~1%.
        assert!(counts[47] > 10 * counts[24], "{counts:?}");
        // An adapter's requests share its system prompt's blocks; two adapters share none.
        let first = |a: u32| {
            w.sessions
                .iter()
                .filter(|s| s.turns[0].adapter == Some(a))
                .map(|s| block_hashes(&s.turns[0].prompt))
                .take(2)
                .collect::<Vec<_>>()
        };
        let (x, y) = (first(hot[0]), first(hot[1]));
        assert_eq!(x[0][..4], x[1][..4]);
        assert_ne!(x[0][0], y[0][0]);
    }

    #[test]
    fn few_users_send_conversations_one_after_another() {
        let w = generate(Kind::FewUsers, &Sizes::full(), 2);
        assert!(!w.kind.header());
        assert_eq!(w.sessions.len(), 6);
        assert_eq!(w.requests(), 300);
        let mut firsts = 0;
        for s in w.sessions.iter() {
            assert_eq!(s.turns.len(), 50);
            assert_eq!(s.turns[0].think, Duration::ZERO);
            for p in s.turns.windows(2) {
                let (a, b) = (&p[0].prompt, &p[1].prompt);
                let think = p[1].think.as_secs_f64() * 1e3;
                assert!((20.0..=50.0).contains(&think), "{think}");
                if !b.starts_with(&a[..a.len() - 1]) {
                    firsts += 1;
                }
            }
        }
        // 4–12 turns per conversation: every user starts several.
        assert!((18..=80).contains(&firsts), "{firsts} new conversations");
    }

    #[test]
    fn rag_shares_documents() {
        let w = generate(Kind::Rag, &tiny(), 1);
        let groups: HashSet<u64> = w.sessions.iter().map(|s| s.group).collect();
        assert!(groups.len() < w.sessions.len());
        // Prompts of one document share at least the document's blocks.
        let total: usize = w
            .sessions
            .iter()
            .map(|s| block_hashes(&s.turns[0].prompt).len())
            .sum();
        assert!(w.footprint_blocks() < total / 2);
    }
}
