//! The constraint hook of the sampler: only allowed tokens are drawn on every
//! path (greedy, top-k/p, penalties), drawn tokens are committed, logprobs stay
//! raw, and a failing or dead constraint ends cleanly with an error reason.

use std::sync::{Arc, Mutex};

use super::tests::{log_softmax, params, random_logits};
use super::*;

/// Allows a fixed token set; records commits; finishes after `finish_after`.
struct SetConstraint {
    allowed: Vec<u32>,
    committed: Arc<Mutex<Vec<u32>>>,
    finish_after: usize,
    fail_mask_at: Option<usize>,
}

impl SetConstraint {
    fn new(allowed: Vec<u32>) -> (Self, Arc<Mutex<Vec<u32>>>) {
        let committed = Arc::new(Mutex::new(Vec::new()));
        let c = SetConstraint {
            allowed,
            committed: committed.clone(),
            finish_after: usize::MAX,
            fail_mask_at: None,
        };
        (c, committed)
    }
}

impl TokenConstraint for SetConstraint {
    fn fill_mask(&mut self, allowed: &mut [u32]) -> Result<(), String> {
        allowed.fill(0);
        if Some(self.committed.lock().unwrap().len()) == self.fail_mask_at {
            return Err("lexer fuel exhausted".into());
        }
        for &t in &self.allowed {
            allowed[t as usize / 32] |= 1 << (t % 32);
        }
        Ok(())
    }
    fn commit(&mut self, token: u32) -> Result<(), String> {
        if !self.allowed.contains(&token) {
            return Err(format!("{token} not allowed"));
        }
        self.committed.lock().unwrap().push(token);
        Ok(())
    }
    fn is_finished(&self) -> bool {
        self.committed.lock().unwrap().len() >= self.finish_after
    }
}

fn knob_sets() -> Vec<SamplingParams> {
    vec![
        SamplingParams::greedy(),
        params(|_| {}),
        params(|p| p.temperature = 0.7),
        params(|p| p.top_k = 3),
        params(|p| p.top_k = 200),
        params(|p| p.top_p = 0.5),
        params(|p| p.min_p = 0.2),
        params(|p| {
            p.presence_penalty = 1.5;
            p.frequency_penalty = 0.5;
            p.logprobs = Some(5);
        }),
    ]
}

#[test]
fn only_allowed_tokens_are_drawn_and_committed() {
    let n = 1000;
    // Far from the row's best tokens, across word boundaries, and the last id.
    let allowed = vec![3, 31, 32, 63, 500, 777, 999];
    for p in knob_sets() {
        let (c, committed) = SetConstraint::new(allowed.clone());
        let mut s = Sampler::new(p.clone(), n).with_constraint(Some(Box::new(c)));
        assert!(s.is_constrained());
        for step in 0..200 {
            let mut logits = random_logits(step, n, 8.0);
            // The unconstrained favourite is never allowed.
            logits[100] = 50.0;
            let t = s.sample(&logits);
            assert!(allowed.contains(&t.id), "{p:?}: drew {}", t.id);
            // Logprobs are of the raw row (the sampled token's own, unmasked).
            let want = log_softmax(&logits)[t.id as usize];
            assert!((t.logprob as f64 - want).abs() < 1e-4, "{p:?}");
            assert!(t
                .top_logprobs
                .iter()
                .all(|&(id, _)| p.logprobs.is_some() && id < n as u32));
            if let Some((best, _)) = t.top_logprobs.first() {
                assert_eq!(*best, 100, "top logprobs are of the raw distribution");
            }
        }
        assert_eq!(committed.lock().unwrap().len(), 200);
        assert_eq!(s.constraint_end(), None);
    }
}

#[test]
fn the_mask_time_of_each_constrained_token_is_kept() {
    let mut s = Sampler::new(SamplingParams::greedy(), 64);
    s.sample_lean(&random_logits(1, 64, 2.0));
    assert_eq!(s.last_mask_time(), None);
    let (c, _) = SetConstraint::new(vec![3, 9]);
    let mut s = Sampler::new(SamplingParams::greedy(), 64).with_constraint(Some(Box::new(c)));
    assert_eq!(s.last_mask_time(), None);
    s.sample_lean(&random_logits(1, 64, 2.0));
    assert!(s.last_mask_time().is_some());
}

#[test]
fn every_allowed_token_is_reachable() {
    let n = 64;
    let allowed = vec![1, 2, 40];
    let (c, _) = SetConstraint::new(allowed.clone());
    let mut s = Sampler::new(params(|_| {}), n).with_constraint(Some(Box::new(c)));
    let logits = vec![0.0; n];
    let mut seen = [0usize; 64];
    for _ in 0..600 {
        let t = s.sample_lean(&logits);
        seen[t.id as usize] += 1;
    }
    for &a in &allowed {
        assert!(
            seen[a as usize] > 100,
            "{a} drawn {} times",
            seen[a as usize]
        );
    }
    assert_eq!(seen.iter().sum::<usize>(), 600);
}

#[test]
fn finished_grammar_stops_the_sequence() {
    let (mut c, committed) = SetConstraint::new(vec![5, 6]);
    c.finish_after = 3;
    let mut s = Sampler::new(SamplingParams::greedy(), 16).with_constraint(Some(Box::new(c)));
    let logits = random_logits(1, 16, 4.0);
    for _ in 0..2 {
        s.sample_lean(&logits);
        assert_eq!(s.constraint_end(), None);
    }
    s.sample_lean(&logits);
    assert_eq!(s.constraint_end(), Some(FinishReason::Stop));
    assert_eq!(committed.lock().unwrap().len(), 3);
}

#[test]
fn dead_or_failing_constraint_ends_with_an_error_not_a_panic() {
    // Nothing allowed: the draw falls back to the raw row (never sent: see
    // `Sequence::emit`), the sequence ends by its constraint.
    let (c, committed) = SetConstraint::new(vec![]);
    let mut s = Sampler::new(params(|_| {}), 40).with_constraint(Some(Box::new(c)));
    let t = s.sample_lean(&random_logits(2, 40, 3.0));
    assert!(t.id < 40);
    match s.constraint_end() {
        Some(FinishReason::Constraint(m)) => assert!(m.contains("allows no next token"), "{m}"),
        other => panic!("{other:?}"),
    }
    // The fallback token is not committed after the failure.
    assert!(committed.lock().unwrap().is_empty());

    // A mask error at the second token names the cause.
    let (mut c, _) = SetConstraint::new(vec![7]);
    c.fail_mask_at = Some(1);
    let mut s = Sampler::new(SamplingParams::greedy(), 40).with_constraint(Some(Box::new(c)));
    assert_eq!(s.sample(&random_logits(3, 40, 3.0)).id, 7);
    assert_eq!(s.constraint_end(), None);
    s.sample(&random_logits(4, 40, 3.0));
    match s.constraint_end() {
        Some(FinishReason::Constraint(m)) => assert!(m.contains("lexer fuel exhausted"), "{m}"),
        other => panic!("{other:?}"),
    }

    // A row longer than the mask: tokens past it are never drawn.
    let (c, _) = SetConstraint::new(vec![0]);
    let mut s = Sampler::new(SamplingParams::greedy(), 8).with_constraint(Some(Box::new(c)));
    let mut logits = vec![0.0; 100];
    logits[99] = 9.0;
    assert_eq!(s.sample(&logits).id, 0);
    // An empty row still yields the documented id 0 without touching the matcher.
    assert_eq!(s.sample(&[]).id, 0);
}

#[test]
fn masked_copy_sanitises_and_masks() {
    let src: Vec<f32> = (0..70).map(|i| i as f32).collect();
    let mut src = src;
    src[1] = f32::NAN;
    src[33] = f32::INFINITY;
    let mask = [0b11u32, 1 << 1, u32::MAX];
    let mut dst = Vec::new();
    constraint::masked_copy(&mut dst, &src, &mask);
    assert_eq!(dst.len(), 70);
    assert_eq!(dst[0], 0.0);
    assert_eq!(dst[1], f32::NEG_INFINITY);
    assert_eq!(dst[2], f32::NEG_INFINITY);
    assert_eq!(dst[33], f32::MAX);
    assert_eq!(dst[34], f32::NEG_INFINITY);
    assert!((64..70).all(|i| dst[i] == i as f32));
    // A mask shorter than the row disallows the rest.
    constraint::masked_copy(&mut dst, &src, &mask[..1]);
    assert!((32..70).all(|i| dst[i] == f32::NEG_INFINITY));
}

/// Makes a fresh [`SetConstraint`] per sequence.
#[derive(Debug)]
struct SetFactory {
    allowed: Vec<u32>,
    finish_after: usize,
}

impl constraint::ConstraintFactory for SetFactory {
    fn matcher(&self) -> Box<dyn TokenConstraint> {
        let (mut c, _) = SetConstraint::new(self.allowed.clone());
        c.finish_after = self.finish_after;
        Box::new(c)
    }
}

#[test]
fn engine_requests_follow_their_constraint_and_end_cleanly() {
    use crate::tests::{assert_all_blocks_return, cfg, new_core, prompt, run_to_idle, submit};
    let (mut core, _) = new_core(cfg(64));
    let constrained = |allowed: Vec<u32>, finish_after, max_tokens| {
        let mut r = crate::Request::greedy(prompt(allowed.len() as u64, 12), max_tokens);
        r.constraint = Some(std::sync::Arc::new(SetFactory {
            allowed,
            finish_after,
        }));
        r
    };
    // Finishes by its grammar after 4 tokens, well before max_tokens.
    let mut a = submit(&mut core, 1, constrained(vec![5, 9, 700], 4, 50));
    // Never finishes: length.
    let mut b = submit(&mut core, 2, constrained(vec![42], usize::MAX, 6));
    // Dead from the start: its constraint's failure, and no token (the draw
    // without a mask is never sent).
    let mut c = submit(&mut core, 3, constrained(vec![], usize::MAX, 50));
    // Unconstrained beside them.
    let mut d = submit(&mut core, 4, crate::Request::greedy(prompt(9, 8), 5));
    run_to_idle(&mut core, 200);
    for cl in [&mut a, &mut b, &mut c, &mut d] {
        assert!(cl.done());
    }
    assert_eq!(a.tokens.len(), 4);
    assert!(
        a.tokens.iter().all(|t| [5, 9, 700].contains(t)),
        "{:?}",
        a.tokens
    );
    assert_eq!(a.finish.as_ref().unwrap().reason, FinishReason::Stop);
    assert_eq!(b.tokens, vec![42; 6]);
    assert_eq!(b.finish.as_ref().unwrap().reason, FinishReason::Length);
    assert_eq!(c.tokens, Vec::<u32>::new());
    assert!(
        matches!(&c.finish.as_ref().unwrap().reason, FinishReason::Constraint(m) if m.contains("no next token"))
    );
    assert_eq!(c.finish.as_ref().unwrap().completion_tokens, 0);
    assert_eq!(d.tokens.len(), 5);
    assert_eq!(d.finish.as_ref().unwrap().reason, FinishReason::Length);
    // One mask time per constrained draw (c's failed one too), none for the
    // free one.
    let mt = core.sched().counters().mask_times;
    assert_eq!(
        mt.count,
        (a.tokens.len() + b.tokens.len() + c.tokens.len() + 1) as u64
    );
    assert_eq!(mt.buckets.iter().sum::<u64>(), mt.count, "{mt:?}");
    assert!(mt.sum_ns > 0);
    assert_all_blocks_return(&mut core);
}
