//! Cost of turning a chat request into token ids in the gateway (chat template + encode),
//! for a 1 KiB and a 32 KiB `messages` array of realistic English (see [`SENTENCES`]).
//!
//! Two tokenizers: the small test fixture (`tests/fixtures/tokenizer/chatml`, ~640 ids) and a
//! byte-level BPE with a 32k vocabulary trained here, in the setup, with the same Qwen2-style
//! pipeline and template, on pseudo-words (which fill the vocabulary) and the sentences
//! (whose words become whole tokens, as in a real vocabulary). A real vocabulary (150k
//! entries for Qwen2.5, 128k for Llama 3) has bigger tables than either.
//!
//! Cases, for each tokenizer and size:
//! - `chat_ids/cold`: the piece cache and the BPE word cache emptied before each iteration,
//!   so every piece is encoded as if never seen;
//! - `chat_ids/history_seen` (32 KiB): a conversation whose earlier turns were tokenized by
//!   the request before; each iteration's last user turn (about 400 bytes) is new;
//! - `render_only`: the chat template alone;
//! - `encode_only/cold` and `library_encode`: the rendered text through this crate's encoder
//!   (caches emptied) and through `tokenizers`' `encode_fast` as a whole, for comparison.

use std::hint::black_box;
use std::path::{Path, PathBuf};

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use rolter::tokenize::ChatRequest;
use rolter::tokenize::LocalTokenizer;
use tokenizers::models::bpe::{BpeTrainer, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::AddedToken;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer/chatml")
}

/// Deterministic pseudo-English: words of 1-4 syllables from a fixed syllable list, some
/// punctuation, numbers and newlines.
struct Words(u64);

impl Words {
    const SYLLABLES: [&'static str; 48] = [
        "ka", "to", "ri", "men", "sa", "lo", "ver", "in", "ta", "ble", "con", "de", "pro", "ex",
        "ing", "tion", "al", "er", "ly", "ment", "com", "re", "un", "dis", "pre", "ous", "ful",
        "ness", "ity", "an", "or", "ist", "ic", "ive", "ize", "able", "cat", "dog", "sun", "moon",
        "the", "and", "of", "to", "is", "ca", "che", "rou",
    ];

    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn push_word(&mut self, out: &mut String) {
        let r = self.next();
        match r % 29 {
            0 => out.push_str(&(r % 100_000).to_string()),
            1 => out.push_str(". "),
            2 => out.push_str(", "),
            3 => out.push('\n'),
            _ => {
                let n = 1 + (r >> 8) % 4;
                if r.is_multiple_of(7) {
                    out.push(' ');
                }
                out.push(' ');
                for i in 0..n {
                    let s = Self::SYLLABLES[((r >> (16 + 6 * i)) % 48) as usize];
                    out.push_str(s);
                }
            }
        }
    }

    fn text(&mut self, bytes: usize) -> String {
        let mut out = String::with_capacity(bytes + 32);
        while out.len() < bytes {
            self.push_word(&mut out);
        }
        out
    }
}

/// Realistic English for the prompts: sentences of a chat assistant's everyday traffic
/// (questions, answers, prose, a little code), picked in a pseudo-random order. Random
/// syllables, which the benchmark used before, make nearly every word new and so measure the
/// BPE merges of unseen words rather than what a real prompt costs.
const SENTENCES: &[&str] = &[
    "The report arrived on Tuesday morning, two days later than the team had promised, and it was longer than anyone expected.",
    "Most of the delay came from the second survey, which had to be repeated after the first set of answers was lost.",
    "She read the summary twice before she called the others into the meeting room.",
    "\"We have three options,\" she said, \"and none of them is cheap.\"",
    "The first option is to keep the old system running for another year and replace it in stages.",
    "The second is to move everything to the new platform at once, over a single weekend in March.",
    "The third, which nobody liked, is to stop the project and spend the money on hiring more support staff.",
    "How long would the migration take if we started next week?",
    "Could you explain the difference between a process and a thread in simple terms?",
    "A process has its own memory, while the threads inside one process share the same memory and can talk to each other cheaply.",
    "Write a short function that returns the largest number in a list, and explain how it works.",
    "Here is a simple version in Python:",
    "def largest(values):",
    "    best = values[0]",
    "    for v in values[1:]:",
    "        if v > best:",
    "            best = v",
    "    return best",
    "It walks through the list once, keeping the biggest value it has seen so far.",
    "If the list is empty, it raises an error, so you may want to check for that first.",
    "The weather in the mountains changes quickly, especially in the late afternoon.",
    "Bring a warm jacket, some water and a map, even if the forecast looks good.",
    "The trail starts near the old bridge and climbs steadily for about four kilometres.",
    "After the second lake, the path becomes narrow and rocky, and you should keep to the left.",
    "Thank you, that is very helpful. What should I do if it starts to rain?",
    "If it rains, turn back at the shelter; the upper part of the trail gets slippery and dangerous.",
    "In 1869 the railway reached the western coast, and the journey that once took months could be made in a week.",
    "Towns grew along the line, and farmers could sell their grain in cities they had never seen.",
    "Prices fell, trade increased, and within twenty years the population of the region had doubled.",
    "Summarize the main points of the article in three sentences.",
    "The article argues that small changes in daily habits matter more than large plans.",
    "It gives examples from sleep, exercise and diet, and it cites several studies.",
    "Its conclusion is that people should pick one habit, track it for a month, and only then add another.",
    "Please translate the following sentence into French: \"The library opens at nine o'clock.\"",
    "La bibliothèque ouvre à neuf heures.",
    "Can you help me plan a dinner for eight people, two of whom are vegetarian?",
    "Start with a green salad and fresh bread, then serve a roasted vegetable lasagne and a chicken dish side by side.",
    "For dessert, a lemon tart or a bowl of fruit with cream works well and can be prepared in advance.",
    "The committee will meet on the 14th to review the budget, the schedule and the list of open risks.",
    "Each department should send its figures by Friday, including the costs of travel, equipment and training.",
    "We found that 42% of the users never opened the settings page, and 7% changed the default language.",
    "The error appears only when the file is larger than 2 GB and the disk is almost full.",
    "Restarting the service clears the error for a few hours, but it always comes back.",
    "Check the logs for lines that start with \"WARN\", and send me the ten lines before the first one.",
    "I think the problem is in the cache: it never removes old entries, so memory keeps growing.",
    "That makes sense. How would you fix it without slowing down the common case?",
    "Give each entry a size, keep a running total, and evict the oldest entries when the total passes a limit.",
    "Reading is to the mind what exercise is to the body, an old saying goes, and there is some truth in it.",
    "Children who are read to every evening learn new words faster and enjoy school more.",
    "My grandmother kept a small garden behind the house, with tomatoes, beans, herbs and a single apple tree.",
    "Every autumn we picked the apples together and she made jam that lasted until spring.",
    "What are the main causes of inflation, and how do central banks respond to it?",
    "Inflation rises when demand grows faster than supply, when costs such as energy go up, or when people expect prices to rise.",
    "Central banks usually raise interest rates, which makes borrowing more expensive and slows spending.",
];

/// Realistic text of about `bytes` bytes: sentences from [`SENTENCES`] in the order `words`
/// draws, joined by spaces and now and then a newline.
fn prose(words: &mut Words, bytes: usize) -> String {
    let mut out = String::with_capacity(bytes + 160);
    while out.len() < bytes {
        let r = words.next();
        out.push_str(SENTENCES[(r % SENTENCES.len() as u64) as usize]);
        out.push(if (r >> 32).is_multiple_of(4) {
            '\n'
        } else {
            ' '
        });
    }
    out
}

/// The messages of a conversation of about `bytes` bytes: a system prompt and alternating
/// turns, ending with a user turn.
fn conversation(bytes: usize) -> Vec<serde_json::Value> {
    let mut words = Words(0x9e37_79b9_7f4a_7c15);
    let mut msgs =
        vec![serde_json::json!({"role": "system", "content": prose(&mut words, bytes / 8)})];
    let mut total = bytes / 8;
    let mut user = true;
    while total < bytes {
        let chunk = (bytes / 6).clamp(200, 4096).min(bytes - total + 16);
        let role = if user { "user" } else { "assistant" };
        msgs.push(serde_json::json!({"role": role, "content": prose(&mut words, chunk)}));
        total += chunk;
        user = !user;
    }
    if !user {
        msgs.push(serde_json::json!({"role": "user", "content": "Go on."}));
    }
    msgs
}

/// A `messages` array of about `bytes` bytes.
fn messages(bytes: usize) -> Vec<u8> {
    serde_json::to_vec(&conversation(bytes)).unwrap()
}

/// The conversation of about `bytes` bytes with its last user turn replaced by a new one,
/// different for each `n`.
fn with_new_turn(history: &[serde_json::Value], n: u64) -> Vec<u8> {
    let mut msgs = history[..history.len() - 1].to_vec();
    let mut words = Words(n.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1);
    let content = format!("Question {n}: {}", prose(&mut words, 400));
    msgs.push(serde_json::json!({"role": "user", "content": content}));
    serde_json::to_vec(&msgs).unwrap()
}

/// The fixture's pipeline with its model retrained to a `vocab`-entry BPE, saved beside a copy
/// of the fixture's tokenizer_config.json.
fn trained(vocab: usize) -> (LocalTokenizer, PathBuf) {
    let mut tok = tokenizers::Tokenizer::from_file(fixture().join("tokenizer.json")).unwrap();
    tok.with_model(BPE::default());
    let mut corpus = Words(0x0123_4567_89ab_cdef);
    let mut lines: Vec<String> = (0..4000).map(|_| corpus.text(1024)).collect();
    lines.extend((0..400).map(|_| prose(&mut corpus, 1024)));
    let specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        .iter()
        .map(|t| AddedToken::from(*t, true))
        .collect();
    let mut trainer: TrainerWrapper = BpeTrainer::builder()
        .vocab_size(vocab)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(specials)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build()
        .into();
    tok.train(&mut trainer, lines.iter()).unwrap();
    let dir = std::env::temp_dir().join(format!("rolter-bench-bpe{vocab}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    tok.save(dir.join("tokenizer.json"), false).unwrap();
    std::fs::copy(
        fixture().join("tokenizer_config.json"),
        dir.join("tokenizer_config.json"),
    )
    .unwrap();
    let local = LocalTokenizer::from_files(
        &dir.join("tokenizer.json"),
        Some(&dir.join("tokenizer_config.json")),
    )
    .unwrap();
    (local, dir)
}

fn bench_tokenizer(c: &mut Criterion, label: &str, tok: &LocalTokenizer) {
    let mut g = c.benchmark_group(format!("tokenize/{label}"));
    let mut ids = Vec::with_capacity(16 * 1024);
    for size in [1024usize, 32 * 1024] {
        let body = messages(size);
        let request = ChatRequest {
            messages: &body,
            tools: None,
            add_generation_prompt: true,
            chat_template_kwargs: None,
        };
        ids.clear();
        tok.chat_request_ids(&request, &mut ids).unwrap();
        let name = format!("{}KiB", size / 1024);
        eprintln!(
            "{label} {name}: {} message bytes -> {} ids ({:.2} bytes/id), vocab {}",
            body.len(),
            ids.len(),
            body.len() as f64 / ids.len() as f64,
            tok.tokenizer().get_vocab_size(true)
        );
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_with_input(
            BenchmarkId::new("chat_ids/cold", &name),
            &request,
            |b, r| {
                b.iter_batched(
                    || tok.clear_caches(),
                    |()| {
                        ids.clear();
                        tok.chat_request_ids(black_box(r), &mut ids).unwrap();
                        black_box(ids.len())
                    },
                    BatchSize::PerIteration,
                )
            },
        );
        if size > 1024 {
            let history = conversation(size);
            let mut n = 0u64;
            tok.clear_caches();
            ids.clear();
            tok.chat_request_ids(&request, &mut ids).unwrap();
            g.bench_function(BenchmarkId::new("chat_ids/history_seen", &name), |b| {
                b.iter_batched(
                    || {
                        n += 1;
                        with_new_turn(&history, n)
                    },
                    |body| {
                        let r = ChatRequest {
                            messages: &body,
                            tools: None,
                            add_generation_prompt: true,
                            chat_template_kwargs: None,
                        };
                        ids.clear();
                        tok.chat_request_ids(black_box(&r), &mut ids).unwrap();
                        black_box(ids.len())
                    },
                    BatchSize::SmallInput,
                )
            });
        }
        g.bench_with_input(BenchmarkId::new("render_only", &name), &request, |b, r| {
            b.iter(|| black_box(tok.render_chat(black_box(r)).unwrap().len()))
        });
        let text = tok.render_chat(&request).unwrap();
        g.bench_with_input(
            BenchmarkId::new("encode_only/cold", &name),
            &text,
            |b, t| {
                b.iter_batched(
                    || tok.clear_caches(),
                    |()| {
                        ids.clear();
                        tok.encode(black_box(t), false, &mut ids).unwrap();
                        black_box(ids.len())
                    },
                    BatchSize::PerIteration,
                )
            },
        );
        g.bench_with_input(BenchmarkId::new("library_encode", &name), &text, |b, t| {
            b.iter(|| {
                let e = tok
                    .tokenizer()
                    .encode_fast(black_box(t.as_str()), false)
                    .unwrap();
                black_box(e.get_ids().len())
            })
        });
    }
    g.finish();
}

fn benches(c: &mut Criterion) {
    let small = LocalTokenizer::from_files(
        &fixture().join("tokenizer.json"),
        Some(&fixture().join("tokenizer_config.json")),
    )
    .unwrap();
    bench_tokenizer(c, "fixture", &small);

    let start = std::time::Instant::now();
    let (bpe, dir) = trained(32_000);
    eprintln!("trained the 32k BPE in {:.1?}", start.elapsed());
    bench_tokenizer(c, "bpe32k", &bpe);
    let _ = std::fs::remove_dir_all(dir);
}

criterion_group!(tokenize, benches);
criterion_main!(tokenize);
