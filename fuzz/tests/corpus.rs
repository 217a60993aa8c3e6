//! Replays every seed of `corpus/<target>/` and every saved crash of
//! `regressions/<target>/` through the targets' checks, with plain `cargo test` (no AFL++),
//! so that an input that once broke a parser stays a test.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn every_seed_and_regression_passes_its_target() {
    let mut failures = Vec::new();
    let mut replayed = 0;
    for &(name, target) in rolter_fuzz::TARGETS {
        let seeds = rolter_fuzz::files(&root().join("corpus").join(name));
        assert!(!seeds.is_empty(), "corpus/{name}/ holds no seed");
        let regressions = rolter_fuzz::files(&root().join("regressions").join(name));
        for file in seeds.iter().chain(&regressions) {
            let data = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            if catch_unwind(AssertUnwindSafe(|| target(&data))).is_err() {
                failures.push(file.clone());
            }
            replayed += 1;
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {replayed} inputs broke their target's checks (messages above): {failures:#?}",
        failures.len()
    );
}

#[test]
fn the_warm_up_inputs_pass_every_target() {
    for &(_, target) in rolter_fuzz::TARGETS {
        rolter_fuzz::warm_up(target);
    }
}

#[test]
fn every_target_has_a_binary_and_a_corpus_and_nothing_else_does() {
    let names: Vec<&str> = rolter_fuzz::TARGETS.iter().map(|t| t.0).collect();
    let stems = |dir: &str, files: bool| -> Vec<String> {
        let mut found: Vec<String> = std::fs::read_dir(root().join(dir))
            .unwrap_or_else(|e| panic!("{dir}: {e}"))
            .map(|entry| entry.unwrap().path())
            .filter(|p| p.is_file() == files)
            .map(|p: PathBuf| p.file_stem().unwrap().to_string_lossy().into_owned())
            .collect();
        found.sort();
        found
    };
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(stems("src/bin", true), sorted, "src/bin/ against TARGETS");
    assert_eq!(stems("corpus", false), sorted, "corpus/ against TARGETS");
}
