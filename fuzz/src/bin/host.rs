//! The `host` fuzz target's binary: under `cargo afl build` (`--cfg fuzzing`) the AFL++
//! persistent loop over [`rolter_fuzz::host`]; under plain cargo, a replay of the files
//! named on the command line (or of standard input).

#[cfg(fuzzing)]
fn main() {
    rolter_fuzz::warm_up(rolter_fuzz::host);
    afl::fuzz!(|data: &[u8]| { rolter_fuzz::host(data) });
}

#[cfg(not(fuzzing))]
fn main() {
    rolter_fuzz::replay_main(rolter_fuzz::host);
}
