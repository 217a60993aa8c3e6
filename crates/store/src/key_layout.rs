//! The key layout: every key of one fleet is `{<prefix>}:<kind>:…`.
//!
//! Owns the key names, so the layout is written down in one place (the operator's docs
//! quote it). The braces make the prefix the keys' hash tag: on Redis Cluster every key of
//! a fleet lives in one slot, so scripts and pipelines touch one node. It must not talk to
//! the server.

/// The key names under one prefix.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    /// `{<prefix>}:`
    head: String,
}

impl Keys {
    pub(crate) fn new(prefix: &str) -> Keys {
        Keys {
            head: format!("{{{prefix}}}:"),
        }
    }

    /// The smooth weighted rotation of `route`: a hash member name → current weight.
    pub(crate) fn rotation(&self, route: &str) -> String {
        format!("{}rr:{route}", self.head)
    }

    /// One wall-clock bucket of `route`'s fair_catchup ledger: `#` → picks, target → received.
    pub(crate) fn ledger(&self, route: &str, bucket: u64) -> String {
        format!("{}fc:{route}:{bucket}", self.head)
    }

    /// What the client API keys used in one minute of the Unix clock.
    pub(crate) fn key_use(&self, minute: u64) -> String {
        format!("{}keyuse:{minute}", self.head)
    }

    /// The stream of shared routing items.
    pub(crate) fn items(&self) -> String {
        format!("{}items", self.head)
    }

    /// The stream of the replicas' in-flight counts, one entry per change.
    pub(crate) fn loads(&self) -> String {
        format!("{}loads", self.head)
    }

    /// The prefix of one replica's in-flight counts (`{p}:load:<replica>`).
    pub(crate) fn load_head(&self) -> String {
        format!("{}load:", self.head)
    }

    /// One replica's in-flight counts per target.
    pub(crate) fn load(&self, replica: &str) -> String {
        format!("{}load:{replica}", self.head)
    }

    /// The replicas that published load, scored by the time they last did (unix ms).
    pub(crate) fn replicas(&self) -> String {
        format!("{}replicas", self.head)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_carries_the_prefix_as_its_hash_tag() {
        let k = Keys::new("fleet-a");
        assert_eq!(k.rotation("chat"), "{fleet-a}:rr:chat");
        assert_eq!(k.ledger("chat", 42), "{fleet-a}:fc:chat:42");
        assert_eq!(k.items(), "{fleet-a}:items");
        assert_eq!(k.loads(), "{fleet-a}:loads");
        assert_eq!(k.load("r1"), "{fleet-a}:load:r1");
        assert_eq!(k.load_head(), "{fleet-a}:load:");
        assert_eq!(k.replicas(), "{fleet-a}:replicas");
    }
}
