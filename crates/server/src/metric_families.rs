//! Every metric family `sloserve serve` exposes on `/metrics`, declared once
//! (name, type, labels, help) as the engine's knobs are; `metrics.rs` renders
//! them with `sloserve_api::prom`'s writer, the Batch API's own families come
//! after them (`sloserve_batch::metrics`).

sloserve_api::families! { ALL;
    TTFT = Histogram "sloserve:time_to_first_token_seconds" ["model_name", "slo_class"]
        "Time from arrival to the first token.";
    ITL = Histogram "sloserve:inter_token_latency_seconds" ["model_name", "slo_class"]
        "Time between consecutive tokens of a request.";
    TPOT = Histogram "sloserve:time_per_output_token_seconds" ["model_name", "slo_class"]
        "Mean time per output token after the first, per request.";
    E2E = Histogram "sloserve:e2e_request_latency_seconds" ["model_name", "slo_class"]
        "Time from arrival to the request's end.";
    QUEUE_TIME = Histogram "sloserve:request_queue_time_seconds" ["model_name", "slo_class"]
        "Time from arrival to the first scheduled step.";
    PREFILL_TIME = Histogram "sloserve:request_prefill_time_seconds" ["model_name", "slo_class"]
        "Time from the first scheduled step to the first token.";
    GRAMMAR_MASK_TIME = Histogram "sloserve:grammar_mask_time_seconds" ["model_name"]
        "Time the grammar took to compute each constrained token's mask.";
    NUM_REQUESTS_RUNNING = Gauge "sloserve:num_requests_running" ["model_name", "slo_class"]
        "Requests running in the engine.";
    NUM_REQUESTS_WAITING = Gauge "sloserve:num_requests_waiting" ["model_name", "slo_class"]
        "Requests waiting to start.";
    KV_CACHE_USAGE_PERC = Gauge "sloserve:kv_cache_usage_perc" ["model_name"]
        "Fraction of KV blocks held by running requests (0-1).";
    KV_CACHE_BLOCKS_TOTAL = Gauge "sloserve:kv_cache_blocks_total" ["model_name"]
        "KV blocks in the pool.";
    KV_CACHE_BLOCKS_USED = Gauge "sloserve:kv_cache_blocks_used" ["model_name"]
        "KV blocks held by running requests.";
    PREFILL_TOKENS_PER_SECOND = Gauge "sloserve:prefill_tokens_per_second" ["model_name"]
        "Measured prefill rate (moving average).";
    PREFIX_CACHE_QUERIES_TOTAL = Counter "sloserve:prefix_cache_queries_total" ["model_name"]
        "Prompt tokens looked up in the prefix cache.";
    PREFIX_CACHE_HITS_TOTAL = Counter "sloserve:prefix_cache_hits_total" ["model_name"]
        "Prompt tokens found in the prefix cache.";
    PREFIX_CACHE_TIER_HITS_TOTAL = Counter "sloserve:prefix_cache_tier_hits_total" ["model_name", "tier"]
        "Prompt tokens found cached, by tier: ram (the radix cache), disk (--prefix-cache-dir; loaded or recomputed, see prefix_cache_disk_decisions_total).";
    PREFIX_CACHE_DISK_DECISIONS_TOTAL = Counter "sloserve:prefix_cache_disk_decisions_total" ["model_name", "decision"]
        "Prefixes found on disk: loaded (the step-time model predicted loading cheaper) or recomputed.";
    PREFIX_CACHE_DISK_BYTES_TOTAL = Counter "sloserve:prefix_cache_disk_bytes_total" ["model_name", "direction"]
        "Bytes of KV block files read back from or written to the disk tier.";
    PREFIX_CACHE_DISK_SPILL_DROPS_TOTAL = Counter "sloserve:prefix_cache_disk_spill_drops_total" ["model_name"]
        "Blocks not written to the disk tier because its writer's queue was full.";
    PREFIX_CACHE_DISK_BAD_FILES_TOTAL = Counter "sloserve:prefix_cache_disk_bad_files_total" ["model_name"]
        "Block files found damaged or foreign when read back (skipped with a warning, deleted).";
    PREFIX_CACHE_DISK_EVICTIONS_TOTAL = Counter "sloserve:prefix_cache_disk_evictions_total" ["model_name"]
        "Block files deleted by --prefix-cache-disk-size, least recently used first.";
    PREFIX_CACHE_DISK_BYTES = Gauge "sloserve:prefix_cache_disk_bytes" ["model_name"]
        "Bytes of KV block files the disk tier holds.";
    PROMPT_TOKENS_TOTAL = Counter "sloserve:prompt_tokens_total" ["model_name"]
        "Prompt tokens of started requests (computed plus cached).";
    GENERATION_TOKENS_TOTAL = Counter "sloserve:generation_tokens_total" ["model_name"]
        "Tokens generated.";
    ENGINE_RESTARTS_TOTAL = Counter "sloserve:engine_restarts_total" ["model_name"]
        "Engine restarts after a panic on its thread (in-flight requests failed).";
    NUM_PREEMPTIONS_TOTAL = Counter "sloserve:num_preemptions_total" ["model_name"]
        "Sequences preempted (their KV kept while they wait, or released: see preemption_resumptions_total).";
    PREEMPTION_RESUMPTIONS_TOTAL = Counter "sloserve:preemption_resumptions_total" ["model_name", "kv"]
        "Preempted sequences resumed, by what became of their KV: kept (paused with their blocks, nothing recomputed), spilled (released for memory, every full block found again in the prefix cache, RAM or disk) or recomputed (some full blocks computed again).";
    PREEMPTION_PAUSED_RELEASED_TOTAL = Counter "sloserve:preemption_paused_released_total" ["model_name"]
        "Paused (preempted) sequences whose kept KV was released because memory was needed.";
    RECOMPUTED_TOKENS_TOTAL = Counter "sloserve:recomputed_tokens_total" ["model_name", "part"]
        "Tokens whose KV a preempted sequence had and computed again when it resumed, by part: prompt, or generated.";
    REQUESTS_REJECTED_TOTAL = Counter "sloserve:requests_rejected_total" ["model_name", "slo_class"]
        "Requests refused by admission control (HTTP 429).";
    REQUEST_SUCCESS_TOTAL = Counter "sloserve:request_success_total" ["model_name", "slo_class", "finished_reason"]
        "Requests finished, by reason.";
    SLO_ATTAINMENT_TOTAL = Counter "sloserve:slo_attainment_total" ["model_name", "slo_class", "slo", "result"]
        "Finished requests that met or missed their absolute TTFT / TPOT target.";
    BATCH_ROWS_DEFERRED_TOTAL = Counter "sloserve:batch_rows_deferred_total" ["model_name"]
        "Batch decode rows left out of a step to keep an interactive target.";
    SLO_UNREACHABLE_STEPS_TOTAL = Counter "sloserve:slo_unreachable_steps_total" ["model_name"]
        "Steps whose interactive work alone was predicted to miss the tightest interactive target (the machine cannot meet it even without batch work).";
    ENGINE_STEPS_TOTAL = Counter "sloserve:engine_steps_total" ["model_name"]
        "Engine steps run (generation_tokens_total over this: tokens per step).";
    SPEC_DECODE_NUM_DRAFTS_TOTAL = Counter "sloserve:spec_decode_num_drafts_total" ["model_name", "slo_class"]
        "N-gram speculation: decode rows that carried a draft to verify (batch-class rows never draft).";
    SPEC_DECODE_NUM_DRAFT_TOKENS_TOTAL = Counter "sloserve:spec_decode_num_draft_tokens_total" ["model_name", "slo_class"]
        "N-gram speculation: draft tokens verified.";
    SPEC_DECODE_NUM_ACCEPTED_TOKENS_TOTAL = Counter "sloserve:spec_decode_num_accepted_tokens_total" ["model_name", "slo_class"]
        "N-gram speculation: draft tokens accepted (the output is the same as without speculation).";
    SPEC_DECODE_NUM_EMITTED_TOKENS_TOTAL = Counter "sloserve:spec_decode_num_emitted_tokens_total" ["model_name", "slo_class"]
        "N-gram speculation: tokens the verifying rows emitted (accepted drafts plus the one sampled where each draft ended).";
    SPEC_DECODE_ACCEPTANCE_RATE = Gauge "sloserve:spec_decode_acceptance_rate" ["model_name", "slo_class"]
        "N-gram speculation: accepted over drafted tokens since start (0 before any draft).";
    CONSTRAINED_REQUESTS_TOTAL = Counter "sloserve:constrained_requests_total" ["model_name"]
        "Requests decoded under a grammar (response_format json_schema / json_object, constrained tool calls): constraints compiled or found in the compile cache.";
    GRAMMAR_COMPILE_ERRORS_TOTAL = Counter "sloserve:grammar_compile_errors_total" ["model_name"]
        "Constraints that did not compile (answered 400, naming why).";
    GRAMMAR_FORCED_DRAFT_TOKENS_TOTAL = Counter "sloserve:grammar_forced_draft_tokens_total" ["model_name", "slo_class"]
        "Grammar fast-forward: tokens a grammar forced (its only continuation), verified as a draft instead of a step each.";
    GRAMMAR_FORCED_TOKENS_TOTAL = Counter "sloserve:grammar_forced_tokens_total" ["model_name", "slo_class"]
        "Grammar fast-forward: forced tokens accepted, each emitted without a step of its own (the model may draw another tokenization of the forced text, which ends the run).";
    KV_EVENTS_DROPPED_TOTAL = Counter "sloserve:kv_events_dropped_total" ["model_name"]
        "KV-cache event batches dropped because the publisher's queue was full (--kv-events-endpoint not connected or not keeping up).";
    STEP_COST_SECONDS = Gauge "sloserve:step_cost_seconds" ["model_name", "term"]
        "The online step-time model: seconds per unit of each term (fixed per step, per prefill token, per decode row, per 1000 attention context tokens, and the jump past the runner's small-batch path).";
    STEP_COST_RELATIVE_ERROR = Gauge "sloserve:step_cost_relative_error" ["model_name"]
        "Mean absolute relative error of the step-time prediction (moving average).";
    LAST_STEP_SECONDS = Gauge "sloserve:last_step_seconds" ["model_name", "kind"]
        "The latest step: predicted and measured seconds, and its time limit (0 when no interactive target bounded it).";
    VLLM_NUM_REQUESTS_WAITING = Gauge "vllm:num_requests_waiting" ["model_name"]
        "Requests admitted and waiting to start, preempted ones included, both SLO classes (vLLM's name and meaning).";
    VLLM_NUM_REQUESTS_RUNNING = Gauge "vllm:num_requests_running" ["model_name"]
        "Requests in the engine's running set (prefill or decode), both SLO classes (vLLM's name and meaning).";
    VLLM_KV_CACHE_USAGE_PERC = Gauge "vllm:kv_cache_usage_perc" ["model_name"]
        "KV-cache usage, 0-1: blocks held by running requests over all blocks; blocks only the prefix cache holds count as free (vLLM's name and meaning).";
    VLLM_CACHE_CONFIG_INFO = Gauge "vllm:cache_config_info" ["model_name", "block_size", "num_gpu_blocks"]
        "The KV cache's configuration as labels: block_size (tokens per block), num_gpu_blocks (blocks in the pool); value 1 (vLLM's info gauge).";
}
