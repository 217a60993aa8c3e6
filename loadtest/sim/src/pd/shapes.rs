//! The workload shapes the P/D comparison runs: multi-turn conversations from the
//! multi-turn generator ([`crate::workload::multi_turn`]) sized to long prompts with short
//! answers, short prompts with long answers, or the simulator's own chat sizes.
//!
//! Arrival rates are the shapes' own times `rate`; `scale` changes only how many users
//! come (not how fast), as elsewhere in the simulator.

use std::sync::Arc;

use crate::workload::{multi_turn, Kind, Sizes, Workload};

/// A workload shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Shape {
    /// 8 shared system prompts of 6000 tokens, 2–5 turns of 300–800-token questions and
    /// 64–128-token answers: prompts of 6.4k to about 10k tokens.
    LongPrompt,
    /// One turn: a ~100-token system prompt (4 shared) and a 50–150-token question, an
    /// 800–1200-token answer.
    LongOutput,
    /// The simulator's `multi-turn` sizes: 400-token system prompts, 4–12 turns,
    /// 50–200-token questions, 100–400-token answers.
    Chat,
}

impl Shape {
    pub fn name(self) -> &'static str {
        match self {
            Shape::LongPrompt => "long-prompt",
            Shape::LongOutput => "long-output",
            Shape::Chat => "chat",
        }
    }

    /// The shape's sizes at `scale`, arriving `rate` times as fast as its own rate.
    pub fn sizes(self, scale: f64, rate: f64) -> Sizes {
        let full = Sizes::full();
        let s = match self {
            // 12 users/s, ~3.5 turns each: ~41 requests/s once the first users are on
            // their later turns, near what four co-located engines carry.
            Shape::LongPrompt => Sizes {
                systems: 8,
                system_tokens: 6000,
                users: 4800,
                user_window_s: 400.0,
                min_turns: 2,
                max_turns: 5,
                question_tokens: (300, 800),
                answer_tokens: (64, 128),
                ..full
            },
            // 14 requests/s, near what four co-located engines carry (64 sequences of
            // ~1000 steps of ~16 ms each: ~15.7 requests/s).
            Shape::LongOutput => Sizes {
                systems: 4,
                system_tokens: 100,
                users: 2800,
                user_window_s: 200.0,
                min_turns: 1,
                max_turns: 1,
                question_tokens: (50, 150),
                answer_tokens: (800, 1200),
                ..full
            },
            // ~6.7 users/s, 8 turns each: ~53 requests/s.
            Shape::Chat => full,
        };
        Sizes {
            scale,
            user_window_s: s.user_window_s / rate.max(1e-6),
            ..s
        }
    }

    /// The workload for `seed`; `header`: requests carry `x-session-id`.
    pub fn generate(self, scale: f64, rate: f64, seed: u64, header: bool) -> Workload {
        Workload {
            kind: if header {
                Kind::MultiTurn
            } else {
                Kind::MultiTurnNoHeader
            },
            sessions: Arc::new(multi_turn(&self.sizes(scale, rate), seed)),
            adapters: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_have_their_prompt_and_output_lengths() {
        let long = Shape::LongPrompt.generate(0.05, 1.0, 1, false);
        let turns: Vec<_> = long.sessions.iter().flat_map(|s| s.turns.iter()).collect();
        let (lo, hi) = turns.iter().fold((u32::MAX, 0), |(lo, hi), t| {
            (lo.min(t.prompt_tokens), hi.max(t.prompt_tokens))
        });
        assert!(lo >= 6000 && hi < 11_000, "prompts of {lo}..{hi} tokens");
        assert!(turns.iter().all(|t| (64..=128).contains(&t.output_tokens)));
        assert!(!long.kind.header());
        let short = Shape::LongOutput.generate(0.05, 1.0, 1, true);
        assert!(short.sessions.iter().all(|s| s.turns.len() == 1));
        let t = &short.sessions[0].turns[0];
        assert!((150..300).contains(&t.prompt_tokens), "{}", t.prompt_tokens);
        assert!((800..=1200).contains(&t.output_tokens));
        assert!(short.kind.header());
    }

    #[test]
    fn rate_shortens_the_arrival_window() {
        let a = Shape::LongOutput.sizes(1.0, 1.0);
        let b = Shape::LongOutput.sizes(1.0, 2.0);
        assert_eq!(a.users, b.users);
        assert_eq!(a.user_window_s, 2.0 * b.user_window_s);
    }
}
