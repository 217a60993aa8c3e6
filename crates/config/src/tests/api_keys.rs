//! `[[keys]]` and `[auth] keys_file`.

use super::*;

const HASH: &str = "sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae";

fn with_keys(keys: &str) -> String {
    format!("{ONE_TARGET}{keys}")
}

#[test]
fn a_key_loads_with_its_hash_routes_models_and_limits() {
    let c = load(&with_keys(&format!(
        "[[keys]]\nname = \"team-a\"\nhash = \"{HASH}\"\nroutes = [\"default\"]\nmodels = [\"m\"]\nrequests_per_minute = 60\ntokens_per_minute = 1000\n"
    )))
    .unwrap();
    let k = &c.keys.keys[0];
    assert_eq!(k.name, "team-a");
    assert_eq!(k.hash, parse_hash(HASH).unwrap());
    assert_eq!(key_hash("foo"), HASH, "the hash is the SHA-256 of the key");
    assert_eq!(k.routes, Some(vec![0]));
    assert_eq!(k.models, Some(vec!["m".to_string()]));
    assert_eq!(
        (k.requests_per_minute, k.tokens_per_minute),
        (Some(60), Some(1000))
    );
    assert_eq!(c.keys.by_hash.get(&k.hash), Some(&0));
    assert!(
        !format!("{c:?}").contains(&HASH[7..]),
        "Debug never shows a hash"
    );
}

#[test]
fn without_keys_the_gateway_is_open() {
    assert!(load(ONE_TARGET).unwrap().keys.is_empty());
}

#[test]
fn a_hash_that_is_not_sha256_names_the_key_and_the_command() {
    for bad in [
        "rolter_abc",
        "sha256:abc",
        "md5:2c26b46b68ffc68ff99b453c1d304134",
        &HASH.replace('2', "g"),
    ] {
        let errs = errors(&with_keys(&format!(
            "[[keys]]\nname = \"a\"\nhash = \"{bad}\"\n"
        )));
        let e = error_at(&errs, "keys[0].hash");
        assert!(e.fix.contains("rolter keys hash"), "{e}");
    }
    let errs = errors(&with_keys("[[keys]]\nname = \"a\"\n"));
    error_at(&errs, "keys[0].hash");
}

#[test]
fn duplicate_names_and_hashes_unknown_routes_and_bad_limits_are_errors() {
    let errs = errors(&with_keys(&format!(
        "[[keys]]\nname = \"a\"\nhash = \"{HASH}\"\n[[keys]]\nname = \"a\"\nhash = \"{HASH}\"\n"
    )));
    error_at(&errs, "keys[1].name");
    error_at(&errs, "keys[1].hash");
    let errs = errors(&with_keys(&format!(
        "[[keys]]\nname = \"a\"\nhash = \"{HASH}\"\nroutes = [\"nope\"]\nrequests_per_minute = 0\n"
    )));
    assert!(error_at(&errs, "keys[0].routes[0]").fix.contains("default"));
    error_at(&errs, "keys[0].requests_per_minute");
    let errs = errors(&with_keys(&format!(
        "[[keys]]\nname = \"-\"\nhash = \"{HASH}\"\n"
    )));
    error_at(&errs, "keys[0].name");
}

#[test]
fn the_keys_file_holds_keys_only_and_shares_uniqueness_with_the_configuration() {
    let dir = std::env::temp_dir().join(format!("rolter-cfg-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("keys.toml");
    std::fs::write(
        &file,
        format!("[[keys]]\nname = \"b\"\nhash = \"{HASH}\"\n"),
    )
    .unwrap();
    let text = with_keys(&format!("[auth]\nkeys_file = \"{}\"\n", file.display()));
    let c = load(&text).unwrap();
    assert_eq!(c.keys.keys[0].name, "b");
    assert_eq!(c.keys.file.as_deref(), Some(file.as_path()));

    // The same hash in the configuration too.
    let errs = errors(&format!(
        "{text}[[keys]]\nname = \"a\"\nhash = \"{HASH}\"\n"
    ));
    assert!(
        errs.iter().any(|e| e.message.contains("already the hash")),
        "{errs:?}"
    );

    // Anything but [[keys]] in the keys file, and its errors name that file.
    std::fs::write(
        &file,
        "[server]\nworkers = 1\n[[keys]]\nname = \"b\"\nhash = \"x\"\n",
    )
    .unwrap();
    let errs = errors(&text);
    let e = error_at(&errs, "server");
    assert_eq!(e.file, file.display().to_string());
    assert_eq!(
        error_at(&errs, "keys[0].hash").file,
        file.display().to_string()
    );

    // A type error in the keys file is reported with the file's other errors.
    std::fs::write(
        &file,
        "[[keys]]\nname = \"b\"\nhash = \"x\"\nrequests_per_minute = \"10\"\n",
    )
    .unwrap();
    let errs = errors(&text);
    let e = error_at(&errs, "keys[0].requests_per_minute");
    assert_eq!(e.file, file.display().to_string());
    assert!(e.message.contains("expected an integer"), "{e}");
    error_at(&errs, "keys[0].hash");

    let errs = errors(&with_keys(
        "[auth]\nkeys_file = \"/nonexistent/keys.toml\"\n",
    ));
    error_at(&errs, "auth.keys_file");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn share_limits_needs_the_shared_state_store() {
    let keys = format!(
        "[auth]\nshare_limits = true\n[[keys]]\nname = \"a\"\nhash = \"{HASH}\"\nrequests_per_minute = 10\n"
    );
    let errs = errors(&with_keys(&keys));
    let e = error_at(&errs, "auth.share_limits");
    assert!(e.fix.contains("[state]"), "{e:?}");
    let with_state =
        format!("{keys}[state]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\n");
    let c = load(&with_keys(&with_state)).unwrap();
    assert!(c.keys.share_limits);
    assert!(
        !load(&with_keys(&format!(
            "[[keys]]\nname = \"a\"\nhash = \"{HASH}\"\n"
        )))
        .unwrap()
        .keys
        .share_limits
    );
}
