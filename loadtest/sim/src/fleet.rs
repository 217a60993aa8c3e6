//! The simulated fleet as the gateway's configuration describes it: `n` equal targets
//! behind one route, parsed by the gateway's own loader, so the strategies see the targets
//! (names, weights) a worker would.

use rolter::config::Target;

/// A configuration of `n` equal targets `engine-0..` behind one route `sim` with
/// `strategy`, after the `head` tables, parsed by the gateway's own loader.
pub fn fleet_config(n: usize, head: &str, strategy: &str) -> rolter::config::Config {
    let mut text = head.to_string();
    for i in 0..n {
        text.push_str(&format!(
            "[[targets]]\nname = \"engine-{i}\"\nurl = \"http://127.0.0.1:{}\"\n\n",
            9000 + i
        ));
    }
    let names: Vec<String> = (0..n).map(|i| format!("\"engine-{i}\"")).collect();
    text.push_str(&format!(
        "[[routes]]\nname = \"sim\"\ntargets = [{}]\n[routes.strategy]\nname = \"{strategy}\"\n",
        names.join(",")
    ));
    rolter::config::load_str(&text, "sim.toml").expect("simulator fleet configuration")
}

/// The targets of a fleet of `n` equal engines ([`fleet_config`]).
pub fn fleet_targets(n: usize) -> Vec<Target> {
    fleet_config(n, "", "round_robin").targets
}
