//! Running a target without AFL++: over the files and folders named on the command line, or
//! over standard input. The target binaries use it when they are built by plain cargo, so a
//! crash file reproduces with `cargo run --bin <target> -- <file>`.

use std::io::Read;
use std::path::{Path, PathBuf};

/// Runs `target` over every file named in the arguments (a folder: every file in it), or
/// over standard input when there is no argument.
pub fn replay_main(target: fn(&[u8])) {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    if args.is_empty() {
        let mut data = Vec::new();
        std::io::stdin()
            .read_to_end(&mut data)
            .expect("read standard input");
        target(&data);
        return;
    }
    for arg in &args {
        for file in files(arg) {
            eprintln!("{}", file.display());
            let data = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            target(&data);
        }
    }
}

/// `path` itself, or the files of the folder `path` in name order (none when it is missing).
pub fn files(path: &Path) -> Vec<PathBuf> {
    if !path.is_dir() {
        return if path.exists() {
            vec![path.to_path_buf()]
        } else {
            Vec::new()
        };
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .map(|entry| entry.expect("read a folder entry").path())
        .filter(|p| p.is_file())
        .collect();
    found.sort();
    found
}
