//! Prefix affinity against real replicas: two shared prefixes, two replicas whose
//! KV cache holds about one prompt each. With affinity each prefix's requests land
//! on one replica and its prefix cache hits; round-robin sends both prefixes to
//! both replicas, which evict each other's blocks. The replicas' own
//! `prefix_cache_hits_total` counters are compared.

mod common;

use std::collections::BTreeSet;

use common::*;
use serde_json::json;
use sloserve_router::{Policy, RouterConfig};

const WORDS: &str = "river mountain lantern copper violet harbor meadow thunder silver garden \
    pencil window marble orchard falcon winter canyon ribbon candle forest velvet pepper \
    compass glacier saddle timber crystal beacon willow ember quartz prairie anchor blossom \
    cobalt feather granite hollow jasmine kettle lagoon mosaic nectar oyster pebble quiver \
    raven sapphire tundra umber vessel walnut yarrow zephyr amber basalt cedar dune";

/// A system-prompt-like prefix of about 130 tokens, different for each `seed`.
fn prefix(seed: usize) -> String {
    let words: Vec<&str> = WORDS.split_whitespace().collect();
    let body: Vec<&str> = (0..110)
        .map(|i| words[(i * 7 + seed * 13) % words.len()])
        .collect();
    format!("Instructions {seed}: {}.", body.join(" "))
}

/// Sends each prefix's requests in pairs (P, P, Q, Q, P, P, Q, Q), one at a time;
/// returns the replica each prefix's requests reached.
fn run(router: &TestRouter, prefixes: [usize; 2]) -> Vec<BTreeSet<String>> {
    let mut seen = vec![BTreeSet::new(), BTreeSet::new()];
    for round in 0..2 {
        for (p, &seed) in prefixes.iter().enumerate() {
            for q in 0..2 {
                let body = json!({
                    "prompt": format!("{} Question {round}{q}: which word comes first?", prefix(seed)),
                    "max_tokens": 2, "temperature": 0,
                });
                let r = post(router.addr, "/v1/completions", &body);
                assert_eq!(r.status, 200, "{}", r.text());
                seen[p].insert(r.header("x-sloserve-backend").unwrap().to_owned());
            }
        }
    }
    seen
}

fn hits(replicas: &[Replica]) -> f64 {
    replicas
        .iter()
        .map(|r| metric(&r.metrics(), "sloserve:prefix_cache_hits_total").unwrap())
        .sum()
}

#[test]
fn each_prefix_stays_on_one_replica_and_hits_its_cache() {
    let mut args = replica_args("interactive");
    // 12 blocks of 16 tokens: one ~140-token prompt and what is left of another.
    args.engine.set("num-kv-blocks", "12").unwrap();
    args.engine.set("max-model-len", "192").unwrap();
    let replicas = [Replica::start(args.clone(), 0), Replica::start(args, 0)];
    let urls: Vec<String> = replicas.iter().map(Replica::url).collect();
    let router_with = |policy| {
        let mut cfg = RouterConfig::with_fleets(&[("interactive", &urls)]).unwrap();
        cfg.policy = policy;
        TestRouter::start(cfg)
    };

    let affinity = router_with(Policy::Affinity);
    let h0 = hits(&replicas);
    let seen = run(&affinity, [1, 2]);
    let affinity_hits = hits(&replicas) - h0;
    for (p, s) in seen.iter().enumerate() {
        assert_eq!(s.len(), 1, "prefix {p} went to {s:?}");
    }
    drop(affinity);

    let rr = router_with(Policy::RoundRobin);
    let h0 = hits(&replicas);
    let seen = run(&rr, [3, 4]);
    let rr_hits = hits(&replicas) - h0;
    assert!(
        seen.iter().all(|s| s.len() == 2),
        "round-robin spreads: {seen:?}"
    );
    eprintln!("prefix cache hit tokens: affinity {affinity_hits}, round-robin {rr_hits}");
    assert!(affinity_hits > 0.0);
    assert!(
        affinity_hits >= 2.0 * rr_hits,
        "affinity {affinity_hits} hit tokens against round-robin {rr_hits}"
    );
}
