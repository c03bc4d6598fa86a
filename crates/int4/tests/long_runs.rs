//! Long runs and shared use: sessions past 4096 tokens without growth in anonymous memory, and several
//! threads generating at once from one loaded model with the results of running alone.

use int4::{Engine, FinishReason, GenerationRequest, LoadOptions, Prompt, RunPath, SamplingOverrides, argmax};
use int4_test_support::tiny_model;

fn rss_anon() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines().find(|l| l.starts_with("RssAnon:"))?.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb * 1024)
}

/// Three sessions of 4200 positions each (the KV cache filled past 4096) on one loaded model: after the
/// first, anonymous memory does not grow, and a full context is the `ContextFull` stop, not an error. Run
/// in a process of its own: `RssAnon` is process-wide.
#[test]
fn sessions_past_4096_tokens_do_not_grow_memory() {
    if !int4_test_support::in_own_process("long_runs::sessions_past_4096_tokens_do_not_grow_memory") {
        return;
    }
    let dir = tiny_model("long");
    let context = 4200;
    let e = Engine::load(&dir, &LoadOptions { path: RunPath::W4a16, context, cache: None, ..LoadOptions::default() })
        .unwrap();
    let eos = e.model.config().eos_token_ids.clone();
    let mut after = Vec::new();
    for session in 0..3u32 {
        let mut kv = e.new_cache().unwrap();
        let mut logits = e.model.forward(&[1 + session], &mut kv, false).unwrap();
        while kv.len() < context {
            // Greedy, but never the end-of-sequence id, so the session runs to the end of its context.
            let mut next = argmax(&logits);
            if eos.contains(&next) {
                next = 3;
            }
            logits = e.model.forward(&[next], &mut kv, false).unwrap();
        }
        assert!(e.model.forward(&[5], &mut kv, false).is_err(), "a token past the context must be refused");
        drop(kv);
        after.push(rss_anon().unwrap_or(0));
    }
    let growth = after[2].saturating_sub(after[1]);
    assert!(growth < 1 << 20, "anonymous memory grew by {growth} bytes between sessions 2 and 3 ({after:?})");
    let mut req = GenerationRequest::new(Prompt::Ids(vec![1, 2, 3]));
    req.sampling = SamplingOverrides { temperature: Some(1.0), seed: Some(7), ..SamplingOverrides::default() };
    let out = e.generate(req, |_| {}).unwrap();
    assert!(matches!(out.finish, FinishReason::ContextFull | FinishReason::Eos), "{:?}", out.finish);
}

/// One loaded model shared by four threads, each generating from its own prompt at the same time: every
/// thread gets exactly the tokens it gets alone (the weights are read-only and shared, caches are per
/// session).
#[test]
fn threads_sharing_one_model_get_the_results_of_running_alone() {
    let dir = tiny_model("threads-long");
    let e =
        Engine::load(&dir, &LoadOptions { path: RunPath::W4a16, context: 64, cache: None, ..LoadOptions::default() })
            .unwrap();
    let prompts: Vec<Vec<u32>> = (0..4u32).map(|i| vec![1, 10 + i, 20 + 2 * i, 7]).collect();
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| e.generate(GenerationRequest::greedy(Prompt::Ids(p.to_vec()), 24), |_| {}).unwrap().tokens)
        .collect();
    let together: Vec<Vec<u32>> = std::thread::scope(|s| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| {
                s.spawn(|| e.generate(GenerationRequest::greedy(Prompt::Ids(p.to_vec()), 24), |_| {}).unwrap().tokens)
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(together, alone);
}
