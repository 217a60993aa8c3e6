//! Piece-wise encoding (between added tokens, with the piece cache and the direct byte-level
//! encoder) gives the ids of the library's whole-text encode, on the fixture tokenizers;
//! and a tokenizer whose added tokens take their neighbours' spaces is encoded whole.

use std::path::{Path, PathBuf};

use rolter_tokenize::LocalTokenizer;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tokenizer")
        .join(name)
}

fn load(dir: &Path) -> LocalTokenizer {
    LocalTokenizer::from_files(
        &dir.join("tokenizer.json"),
        Some(&dir.join("tokenizer_config.json")),
    )
    .unwrap()
}

/// Texts that exercise the pre-tokenizer regex, the byte-level table and NFC.
const TEXTS: &[&str] = &[
    "",
    "Hello, world!",
    "  leading and trailing spaces   ",
    "tabs\tand\r\nCRLF\r\n\r\nlines\n\n\n  \n",
    "It's, you're, we've, I'm, they'll, he'd, DON'T, She'S",
    "numbers 1234567 3.14159 -42 1e10 0x1F",
    "unicode: café naïve Ærøskøbing Straße 東京 русский 😀👍🏽 \u{200b}",
    "combining: cafe\u{301} A\u{30a} n\u{303} (NFC composes these)",
    "code: fn main() { let x = vec![1, 2, 3]; println!(\"{x:?}\"); } // done",
    "punctuation!!! ??? ... --- *** ### @@@ $$$ %%% ^^^ &&& ((( )))",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|><|im_end|><|im_start|>",
    "text<|im_end|>text <|im_end|> text\n<|im_end|>\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "almost a token: <|im_start| <im_end|> <|eot_id <|endoftext|x",
    "\u{0}\u{1}\u{7f}\u{80}\u{a0}\u{ad}\u{ff}",
];

fn whole(tok: &LocalTokenizer, text: &str) -> Vec<u32> {
    let enc = tok.tokenizer().encode_fast(text, false).unwrap();
    enc.get_ids().to_vec()
}

#[test]
fn piecewise_ids_equal_a_whole_encode() {
    for name in ["chatml", "llama3"] {
        let tok = load(&fixture(name));
        assert_eq!(tok.encodes_by_segment(), Ok(()), "{name}");
        assert!(tok.encodes_directly(), "{name}");
        let mut all = String::new();
        for text in TEXTS {
            all.push_str(text);
            for _ in 0..2 {
                // Twice: cold, then from the piece cache.
                let mut ids = Vec::new();
                tok.encode(text, false, &mut ids).unwrap();
                assert_eq!(ids, whole(&tok, text), "{name}: {text:?}");
            }
        }
        let mut ids = vec![9];
        tok.encode(&all, false, &mut ids).unwrap();
        assert_eq!(ids[1..], whole(&tok, &all), "{name}: all texts in one");
        assert!(tok.cached_segments() > 0);
        tok.clear_caches();
        assert_eq!(tok.cached_segments(), 0);
    }
}

/// With `lstrip` on `<|im_end|>`, the token takes the spaces before it: `"hi <|im_end|>"`
/// is `hi` + `<|im_end|>`, while the piece `"hi "` alone would end in a space token. Such a
/// tokenizer must be encoded whole.
#[test]
fn a_token_that_strips_its_neighbours_falls_back_to_a_whole_encode() {
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture("chatml").join("tokenizer.json")).unwrap())
            .unwrap();
    for t in json["added_tokens"].as_array_mut().unwrap() {
        if t["content"] == "<|im_end|>" {
            t["lstrip"] = true.into();
        }
    }
    let dir = std::env::temp_dir().join(format!("rolter-pieces-lstrip-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tokenizer.json"), json.to_string()).unwrap();
    std::fs::copy(
        fixture("chatml").join("tokenizer_config.json"),
        dir.join("tokenizer_config.json"),
    )
    .unwrap();
    let tok = load(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    let why = tok.encodes_by_segment().unwrap_err();
    assert!(
        why.contains("<|im_end|>") && why.contains("lstrip"),
        "{why}"
    );
    assert!(!tok.encodes_directly());

    let text = "<|im_start|>user\nhi   <|im_end|>\n";
    let mut ids = Vec::new();
    tok.encode(text, false, &mut ids).unwrap();
    assert_eq!(ids, whole(&tok, text));
    // Piece by piece would have been wrong here: the spaces are a token of their own.
    let im_end = tok.tokenizer().token_to_id("<|im_end|>").unwrap();
    let mut naive = whole(&tok, "<|im_start|>user\nhi   ");
    naive.push(im_end);
    naive.extend(whole(&tok, "\n"));
    assert_ne!(naive, ids);
}
