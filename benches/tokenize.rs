//! Cost of turning a chat request into token ids in the gateway (chat template + encode),
//! for a 1 KiB and a 32 KiB `messages` array.
//!
//! Two tokenizers: the small test fixture (`tests/fixtures/tokenizer/chatml`, ~640 ids) and a
//! byte-level BPE with a 32k vocabulary trained here, in the setup, on generated text with the
//! same Qwen2-style pipeline and template. A real vocabulary (150k entries for Qwen2.5,
//! 128k for Llama 3) costs more per byte than either: longer merge lists and bigger tables.

use std::hint::black_box;
use std::path::{Path, PathBuf};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
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

/// A `messages` array of about `bytes` bytes: a system prompt and alternating turns.
fn messages(bytes: usize) -> Vec<u8> {
    let mut words = Words(0x9e37_79b9_7f4a_7c15);
    let mut msgs = vec![serde_json::json!({"role": "system", "content": words.text(bytes / 8)})];
    let mut total = bytes / 8;
    let mut user = true;
    while total < bytes {
        let chunk = (bytes / 6).clamp(200, 4096).min(bytes - total + 16);
        let role = if user { "user" } else { "assistant" };
        msgs.push(serde_json::json!({"role": role, "content": words.text(chunk)}));
        total += chunk;
        user = !user;
    }
    if !user {
        msgs.push(serde_json::json!({"role": "user", "content": "Go on."}));
    }
    serde_json::to_vec(&msgs).unwrap()
}

/// The fixture's pipeline with its model retrained to a `vocab`-entry BPE, saved beside a copy
/// of the fixture's tokenizer_config.json.
fn trained(vocab: usize) -> (LocalTokenizer, PathBuf) {
    let mut tok = tokenizers::Tokenizer::from_file(fixture().join("tokenizer.json")).unwrap();
    tok.with_model(BPE::default());
    let mut corpus = Words(0x0123_4567_89ab_cdef);
    let lines: Vec<String> = (0..4000).map(|_| corpus.text(1024)).collect();
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
        g.bench_with_input(BenchmarkId::new("chat_ids", &name), &request, |b, r| {
            b.iter(|| {
                ids.clear();
                tok.chat_request_ids(black_box(r), &mut ids).unwrap();
                black_box(ids.len())
            })
        });
        g.bench_with_input(BenchmarkId::new("render_only", &name), &request, |b, r| {
            b.iter(|| black_box(tok.render_chat(black_box(r)).unwrap().len()))
        });
        let text = tok.render_chat(&request).unwrap();
        g.bench_with_input(BenchmarkId::new("encode_only", &name), &text, |b, t| {
            b.iter(|| {
                ids.clear();
                tok.encode(black_box(t), false, &mut ids).unwrap();
                black_box(ids.len())
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
