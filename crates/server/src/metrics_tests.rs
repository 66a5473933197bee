//! Tests of `metrics.rs`: lock-free observation, the exposition, and the `vllm:`
//! families as llm-d's endpoint picker parses them.

use super::*;
use sloserve_engine::RequestTimings;
use std::time::Instant;

#[test]
fn concurrent_observations_are_all_counted() {
    let m = Metrics::new("smol");
    let (threads, each) = (4u64, 5_000u64);
    std::thread::scope(|s| {
        for t in 0..threads {
            let m = &m;
            s.spawn(move || {
                for i in 0..each {
                    // 1 ms or 40 ms: buckets 0.005 and 0.05, exact f64 sums.
                    let ms = if (i + t) % 2 == 0 { 1 } else { 40 };
                    m.observe_itl(SloClass::Interactive, Duration::from_millis(ms));
                }
                m.observe_disconnect(SloClass::Batch);
            });
        }
    });
    let h = m.hist[H::Itl as usize][SloClass::Interactive.index()].snapshot();
    let n = threads * each;
    assert_eq!(h.count, n);
    assert_eq!(h.counts[0], n / 2);
    assert_eq!(h.counts[4], n / 2);
    assert!((h.sum - (n / 2) as f64 * 0.041).abs() < 1e-6, "{}", h.sum);
    let s = m.render(&EngineStats::default());
    let itl =
        "sloserve:inter_token_latency_seconds_bucket{model_name=\"smol\",slo_class=\"interactive\"";
    assert!(s.contains(&format!("{itl},le=\"0.03\"}} {}", n / 2)), "{s}");
    assert!(s.contains(&format!("{itl},le=\"+Inf\"}} {n}")), "{s}");
    assert!(s.contains(&format!(
        "slo_class=\"batch\",finished_reason=\"abort\"}} {threads}"
    )));
}

/// The exposition as the EPP's parser (Go's expfmt text format) takes it: every
/// family's TYPE once and before its samples, samples of a family contiguous, every
/// value a number; and the four `vllm:` families it reads are gauges with one series
/// each, summing both classes.
#[test]
fn vllm_families_parse_as_the_endpoint_picker_reads_them() {
    let m = Metrics::new("smol");
    let mut st = EngineStats {
        kv_usage: 0.5,
        kv_block_size: 16,
        kv_blocks_total: 300,
        ..Default::default()
    };
    st.waiting.interactive = 2;
    st.waiting.batch = 3;
    st.running.interactive = 1;
    st.running.batch = 6;
    let text = m.render(&st);
    let mut types: Vec<(String, String)> = Vec::new();
    let mut samples: Vec<(String, String, f64)> = Vec::new();
    let mut finished: Vec<String> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(
                types.iter().all(|(n, _)| n != name),
                "second TYPE for {name}"
            );
            if let Some((prev, _)) = types.last() {
                finished.push(prev.clone());
            }
            types.push((name.to_owned(), kind.to_owned()));
        } else if !line.starts_with('#') {
            let (series, value) = line.rsplit_once(' ').unwrap();
            let name = series.split('{').next().unwrap();
            let (family, kind) = types.last().expect("a sample before any TYPE");
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .filter(|_| kind == "histogram")
                .unwrap_or(name);
            assert_eq!(base, family, "{line}: not in the family just declared");
            assert!(
                !finished.iter().any(|f| f == base),
                "{line}: family resumed"
            );
            let v: f64 = value.parse().unwrap_or_else(|_| panic!("{line}: value"));
            samples.push((name.to_owned(), series.to_owned(), v));
        }
    }
    let one = |name: &str| -> (String, f64) {
        let kind = &types.iter().find(|(n, _)| n == name).unwrap().1;
        assert_eq!(kind, "gauge", "{name}");
        let rows: Vec<_> = samples.iter().filter(|(n, ..)| n == name).collect();
        assert_eq!(rows.len(), 1, "{name}: {rows:?}");
        (rows[0].1.clone(), rows[0].2)
    };
    assert_eq!(one("vllm:num_requests_waiting").1, 5.0);
    assert_eq!(one("vllm:num_requests_running").1, 7.0);
    assert_eq!(one("vllm:kv_cache_usage_perc").1, 0.5);
    let (series, v) = one("vllm:cache_config_info");
    assert_eq!(v, 1.0);
    let label = |key: &str| -> usize {
        let at = series.find(&format!("{key}=\"")).unwrap() + key.len() + 2;
        series[at..].split('"').next().unwrap().parse().unwrap()
    };
    assert_eq!((label("block_size"), label("num_gpu_blocks")), (16, 300));
}

#[test]
fn exposition_has_buckets_and_gauges() {
    let m = Metrics::new("smol");
    let t0 = Instant::now();
    let mut t = RequestTimings::new(t0);
    t.first_scheduled = Some(t0 + Duration::from_millis(2));
    t.first_token = Some(t0 + Duration::from_millis(80));
    t.last_token = Some(t0 + Duration::from_millis(180));
    t.finish = t.last_token;
    m.observe_finished(
        SloClass::Interactive,
        &FinishInfo {
            reason: FinishReason::Length,
            prompt_tokens: 5,
            completion_tokens: 11,
            cached_prompt_tokens: 0,
            timings: t,
            slo: Default::default(),
        },
    );
    m.observe_itl(SloClass::Batch, Duration::from_millis(7));
    let st = EngineStats {
        kv_usage: 0.25,
        kv_block_size: 16,
        kv_blocks_total: 300,
        ..Default::default()
    };
    let s = m.render(&st);
    let ttft =
        "sloserve:time_to_first_token_seconds_bucket{model_name=\"smol\",slo_class=\"interactive\"";
    assert!(s.contains(&format!("{ttft},le=\"0.075\"}} 0")), "{s}");
    assert!(s.contains(&format!("{ttft},le=\"0.1\"}} 1")), "{s}");
    assert!(s.contains(&format!("{ttft},le=\"+Inf\"}} 1")), "{s}");
    assert!(s.contains(
        "sloserve:inter_token_latency_seconds_count{model_name=\"smol\",slo_class=\"batch\"} 1"
    ));
    assert!(
        s.contains("vllm:kv_cache_usage_perc{model_name=\"smol\"} 0.25"),
        "{s}"
    );
    assert!(s.contains("# TYPE sloserve:requests_rejected_total counter"));
    assert!(
        s.contains(
            "vllm:cache_config_info{model_name=\"smol\",block_size=\"16\",num_gpu_blocks=\"300\"} 1"
        ),
        "{s}"
    );
    assert!(s.contains("finished_reason=\"length\"} 1"));
}

#[test]
fn grammar_families_render_the_mask_times_and_compile_counts() {
    use sloserve_engine::stats::MASK_TIME_BUCKETS;
    let m = Metrics::new("smol");
    let mut st = EngineStats::default();
    for us in [3, 3, 80, 4000, 90_000] {
        st.counters.mask_times.observe(Duration::from_micros(us));
    }
    let text = m.render(&st);
    let h = "sloserve:grammar_mask_time_seconds";
    let l = "model_name=\"smol\"";
    assert!(text.contains(&format!("# TYPE {h} histogram")), "{text}");
    // 3 us twice in le=5e-6, 80 us in 1e-4, 4 ms in 5e-3; 90 ms only in +Inf.
    for (le, n) in [
        ("0.000001", 0),
        ("0.000005", 2),
        ("0.0001", 3),
        ("0.005", 4),
        ("0.05", 4),
        ("+Inf", 5),
    ] {
        assert!(
            text.contains(&format!("{h}_bucket{{{l},le=\"{le}\"}} {n}")),
            "{le}: {text}"
        );
    }
    assert_eq!(MASK_TIME_BUCKETS.len(), 14);
    assert!(text.contains(&format!("{h}_count{{{l}}} 5")));
    assert!(text.contains(&format!("{h}_sum{{{l}}} 0.094086")), "{text}");
    for c in [
        "sloserve:constrained_requests_total",
        "sloserve:grammar_compile_errors_total",
    ] {
        assert!(text.contains(&format!("# TYPE {c} counter")));
        assert!(text.contains(&format!("{c}{{{l}}} ")));
    }
}

#[test]
fn summaries_estimate_quantiles_from_the_buckets() {
    let m = Metrics::new("smol");
    assert_eq!(m.ttft(SloClass::Interactive), LatencySummary::default());
    // 90 TTFTs of 40 ms (bucket 0.03-0.05) and 10 of 400 ms (bucket 0.3-0.5).
    let hist = &m.hist[H::Ttft as usize][SloClass::Interactive.index()];
    (0..90).for_each(|_| hist.observe(0.04));
    (0..10).for_each(|_| hist.observe(0.4));
    let s = m.ttft(SloClass::Interactive);
    assert_eq!(s.count, 100);
    assert!((s.mean_s.unwrap() - 0.076).abs() < 1e-9, "{s:?}");
    // As histogram_quantile: rank 50 of 90 in (0.03, 0.05]; rank 90 is that bucket's top.
    assert!(
        (s.p50_s.unwrap() - (0.03 + 0.02 * 50.0 / 90.0)).abs() < 1e-9,
        "{s:?}"
    );
    assert!((s.p90_s.unwrap() - 0.05).abs() < 1e-9, "{s:?}");
    assert!((s.p99_s.unwrap() - (0.3 + 0.2 * 0.9)).abs() < 1e-9, "{s:?}");
    // Past the last bound: the last bound.
    let tpot = &m.hist[H::Tpot as usize][SloClass::Batch.index()];
    tpot.observe(100.0);
    assert_eq!(m.tpot(SloClass::Batch).p50_s, Some(60.0));
    assert_eq!(m.tpot(SloClass::Interactive).count, 0);
    m.observe_itl(SloClass::Batch, Duration::from_millis(7));
    m.observe_disconnect(SloClass::Batch);
    assert_eq!(m.tokens_after_first(SloClass::Batch), 1);
    assert_eq!(m.tokens_after_first(SloClass::Interactive), 0);
    assert_eq!(m.finished(SloClass::Batch).abort, 1);
}

/// The exposition is exactly the declared families, in their order, each sample
/// under a declared family with its declared labels.
#[test]
fn the_exposition_is_the_declared_families() {
    let text = Metrics::new("smol").render(&EngineStats::default());
    let typed: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    let declared: Vec<&str> = F::ALL.iter().map(|f| f.name).collect();
    assert_eq!(typed, declared);
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let series = line.split(['{', ' ']).next().unwrap();
        let f = F::ALL
            .iter()
            .find(|f| {
                series == f.name
                    || ["_bucket", "_sum", "_count"]
                        .iter()
                        .any(|s| series.strip_suffix(s) == Some(f.name))
            })
            .unwrap_or_else(|| panic!("{line}: no declared family"));
        for l in f.labels {
            assert!(line.contains(&format!("{l}=\"")), "{line}: no {l}");
        }
    }
}
