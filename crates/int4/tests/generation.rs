//! The generation API: every sampling parameter changes what is drawn (each test would fail if its
//! parameter were ignored), stop strings across token boundaries, stop ids, budgets, cancellation,
//! log-probabilities, `generation_config.json`'s defaults, incremental decoding, and seeded runs that
//! repeat across thread counts — on synthetic logits, the tiny model and the real default model.

use std::collections::BTreeSet;

use int4::{
    CancelToken, Engine, FinishReason, GenerationRequest, LoadOptions, Messages, Next, Prompt, RunPath, Sampler,
    SamplingOverrides, SamplingParams,
};
use int4_test_support::tiny_model;

/// Logits whose softmax at temperature 1 is `probs` (over a vocabulary of `vocab`, the rest at -inf-ish).
fn logits_of(probs: &[f64], vocab: usize) -> Vec<f32> {
    let mut l = vec![-1e4f32; vocab];
    for (i, p) in probs.iter().enumerate() {
        l[i] = p.ln() as f32;
    }
    l
}

/// The ids `params` draws from `logits` over `n` draws (a fresh sampler per draw, seeds 0..n).
fn drawn(params: SamplingParams, logits: &[f32], n: u64) -> BTreeSet<u32> {
    (0..n).map(|seed| Sampler::new(SamplingParams { seed, ..params }).sample(&mut logits.to_vec())).collect()
}

fn sampled(temperature: f32) -> SamplingParams {
    SamplingParams { temperature, ..SamplingParams::greedy() }
}

const PROBS: [f64; 5] = [0.4, 0.3, 0.15, 0.1, 0.05];

#[test]
fn temperature_top_k_top_p_and_min_p_each_shape_the_draw() {
    for vocab in [5, 49_152] {
        let l = logits_of(&PROBS, vocab);
        let ids = |s: &[u32]| s.iter().copied().collect::<BTreeSet<u32>>();
        assert_eq!(drawn(SamplingParams::greedy(), &l, 50), ids(&[0]), "greedy");
        assert_eq!(drawn(sampled(1.0), &l, 600), ids(&[0, 1, 2, 3, 4]), "temperature 1 reaches every token");
        assert_eq!(drawn(SamplingParams { top_k: 2, ..sampled(1.0) }, &l, 400), ids(&[0, 1]), "top-k 2");
        assert_eq!(drawn(SamplingParams { top_k: 1, ..sampled(5.0) }, &l, 50), ids(&[0]), "top-k 1");
        // Mass 0.4 + 0.3 = 0.7 reaches 0.65; 0.85 needs the third token.
        assert_eq!(drawn(SamplingParams { top_p: 0.65, ..sampled(1.0) }, &l, 400), ids(&[0, 1]), "top-p 0.65");
        assert_eq!(drawn(SamplingParams { top_p: 0.8, ..sampled(1.0) }, &l, 400), ids(&[0, 1, 2]), "top-p 0.8");
        // min-p 0.3: tokens below 0.3 × 0.4 = 0.12 go.
        assert_eq!(drawn(SamplingParams { min_p: 0.3, ..sampled(1.0) }, &l, 400), ids(&[0, 1, 2]), "min-p 0.3");
        assert_eq!(drawn(SamplingParams { min_p: 0.8, ..sampled(1.0) }, &l, 400), ids(&[0]), "min-p 0.8");
        // With top-k the same filters run on the k kept.
        let p = SamplingParams { top_k: 4, top_p: 0.8, ..sampled(1.0) };
        assert_eq!(drawn(p, &l, 400), ids(&[0, 1, 2]), "top-k 4 then top-p 0.8");
        // A low temperature sharpens: at 0.02, 0.4 against 0.3 is a ratio of (4/3)^50 ≈ 1.8 million.
        let sharp = drawn(sampled(0.02), &l, 300);
        assert_eq!(sharp, ids(&[0]), "temperature 0.02");
    }
}

#[test]
fn draws_follow_the_tempered_distribution() {
    // 20,000 draws at temperature 2 over a 49,152-token vocabulary with five likely tokens; each
    // frequency within 0.015 of the tempered probability.
    let l = logits_of(&PROBS, 49_152);
    let tempered: Vec<f64> = PROBS.iter().map(|p| p.sqrt()).collect();
    let z: f64 = tempered.iter().sum::<f64>() + (49_152 - 5) as f64 * (-1e4f64 / 2.0).exp();
    let mut sampler = Sampler::new(SamplingParams { seed: 11, ..sampled(2.0) });
    let mut counts = [0usize; 5];
    let n = 20_000;
    for _ in 0..n {
        counts[sampler.sample(&mut l.clone()) as usize] += 1;
    }
    for (i, &c) in counts.iter().enumerate() {
        let want = tempered[i] / z;
        let got = c as f64 / n as f64;
        assert!((got - want).abs() < 0.015, "token {i}: drawn {got:.4}, expected {want:.4}");
    }
}

#[test]
fn top_p_over_a_flat_tail_takes_the_nucleus_a_full_sort_takes() {
    // A long flat tail: the nucleus needs thousands of tokens, below the sampler's first cut-off.
    let vocab = 49_152;
    let mut l = vec![0.0f32; vocab];
    l[7] = 6.0;
    for (i, v) in l.iter_mut().enumerate().skip(100) {
        *v = -((i % 97) as f32) / 50.0;
    }
    let p = SamplingParams { top_p: 0.9, ..sampled(1.0) };
    // The nucleus by a full sort, in f64.
    let mut order: Vec<usize> = (0..vocab).collect();
    order.sort_by(|&a, &b| l[b].total_cmp(&l[a]).then(a.cmp(&b)));
    let w: Vec<f64> = l.iter().map(|&x| (f64::from(x) - 6.0).exp()).collect();
    let total: f64 = w.iter().sum();
    let mut acc = 0.0;
    let mut nucleus = BTreeSet::new();
    for &i in &order {
        nucleus.insert(i as u32);
        acc += w[i];
        if acc >= 0.9 * total {
            break;
        }
    }
    let got = drawn(p, &l, 3000);
    assert!(got.is_subset(&nucleus), "drew {} tokens outside the nucleus", got.difference(&nucleus).count());
    assert!(nucleus.len() > 1000 && got.len() > 500, "nucleus {} tokens, {} drawn", nucleus.len(), got.len());
    // The heaviest tail tokens (i % 97 == 0, logit 0) are in; the lightest (i % 97 == 96) out.
    assert!(nucleus.contains(&194) && !nucleus.contains(&193));
}

#[test]
fn top_k_is_a_full_sort_s_first_k() {
    // Logits with many exact ties, spread, and a masked tail.
    let mut state = 7u64;
    let mut l: Vec<f32> = (0..49_152)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 40) % 2000) as f32 / 100.0 - 10.0
        })
        .collect();
    l[49_000..].fill(f32::NEG_INFINITY);
    let mut order: Vec<(f32, u32)> = l.iter().enumerate().map(|(i, &x)| (x, i as u32)).collect();
    order.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    for k in [1, 2, 40, 100, 767, 1000, 5000, 49_152] {
        assert_eq!(int4::top_k(&l, k), order[..k], "k = {k}");
    }
    let few = [0.5f32, 0.5, -1.0, 3.0];
    assert_eq!(int4::top_k(&few, 3), [(3.0, 3), (0.5, 0), (0.5, 1)]);
}

#[test]
fn penalties_change_the_greedy_choice() {
    let l = logits_of(&PROBS, 8);
    let pick = |p: SamplingParams, prompt: &[u32], outputs: &[u32]| {
        let mut s = Sampler::new(p);
        s.observe_prompt(prompt);
        for &t in outputs {
            // Records `t` as output through a draw that must return it.
            let mut one = vec![-1e9f32; 8];
            one[t as usize] = 0.0;
            assert_eq!(s.sample(&mut one), t);
        }
        s.sample(&mut l.clone())
    };
    let g = SamplingParams::greedy();
    assert_eq!(pick(g, &[0], &[]), 0, "no penalty");
    // ln 0.4 = -0.92 and ln 0.3 = -1.20 are negative: a penalty of 1.5 multiplies token 0's to -1.37.
    assert_eq!(pick(SamplingParams { repetition_penalty: 1.5, ..g }, &[0], &[]), 1, "repetition, prompt");
    assert_eq!(pick(SamplingParams { repetition_penalty: 1.5, ..g }, &[], &[0]), 1, "repetition, output");
    assert_eq!(pick(SamplingParams { presence_penalty: 0.5, ..g }, &[0], &[]), 0, "presence ignores the prompt");
    assert_eq!(pick(SamplingParams { presence_penalty: 0.5, ..g }, &[], &[0]), 1, "presence");
    // Frequency 0.2 per occurrence: once (-1.12) token 0 still wins, twice (-1.32) it loses.
    assert_eq!(pick(SamplingParams { frequency_penalty: 0.2, ..g }, &[], &[0]), 0, "frequency once");
    assert_eq!(pick(SamplingParams { frequency_penalty: 0.2, ..g }, &[], &[0, 0]), 1, "frequency twice");
    // ln 0.1 = -2.30, raised by 2 to -0.30, passes ln 0.4.
    assert_eq!(pick(SamplingParams { presence_penalty: -2.0, ..g }, &[], &[3]), 3, "a negative presence favours");
}

#[test]
fn logprobs_are_the_models_log_softmax_with_the_top_ones_in_order() {
    let l = logits_of(&PROBS, 1000);
    let mut s = Sampler::new(SamplingParams::greedy());
    let lp = s.logprobs(&l, 2, 4);
    assert!((f64::from(lp.logprob) - 0.15f64.ln()).abs() < 1e-5, "{}", lp.logprob);
    let ids: Vec<u32> = lp.top.iter().map(|t| t.0).collect();
    assert_eq!(ids, [0, 1, 2, 3]);
    for (i, &(_, p)) in lp.top.iter().enumerate() {
        assert!((f64::from(p) - PROBS[i].ln()).abs() < 1e-5, "top {i}: {p}");
    }
    assert!(s.logprobs(&l, 2, 0).top.is_empty());
}

#[test]
fn the_same_seed_draws_the_same_tokens_and_another_seed_others() {
    let l = logits_of(&[0.2; 5], 64);
    let run = |seed| {
        let mut s = Sampler::new(SamplingParams { seed, ..sampled(1.0) });
        (0..40).map(|_| s.sample(&mut l.clone())).collect::<Vec<u32>>()
    };
    assert_eq!(run(3), run(3));
    assert_ne!(run(3), run(4));
}

#[test]
fn invalid_values_are_refused_with_their_name() {
    let g = SamplingParams::greedy();
    let cases = [
        (SamplingParams { temperature: f32::NAN, ..g }, "is not a temperature"),
        (SamplingParams { temperature: -0.5, ..g }, "is not a temperature"),
        (SamplingParams { top_p: 0.0, ..g }, "is not a probability mass"),
        (SamplingParams { top_p: 1.5, ..g }, "is not a probability mass"),
        (SamplingParams { min_p: -0.1, ..g }, "min_p"),
        (SamplingParams { min_p: f32::NAN, ..g }, "min_p"),
        (SamplingParams { repetition_penalty: 0.0, ..g }, "repetition_penalty"),
        (SamplingParams { repetition_penalty: f32::INFINITY, ..g }, "repetition_penalty"),
        (SamplingParams { presence_penalty: 2.5, ..g }, "presence_penalty"),
        (SamplingParams { frequency_penalty: f32::NAN, ..g }, "frequency_penalty"),
    ];
    for (p, want) in cases {
        let e = p.check().unwrap_err().to_string();
        assert!(e.contains(want), "{p:?}: {e}");
    }
}

// --- the engine, on the tiny model --------------------------------------------------------------------

fn tiny_engine(name: &str) -> Engine {
    Engine::load(
        &tiny_model(name),
        &LoadOptions { path: RunPath::F32, context: 64, cache: None, ..LoadOptions::default() },
    )
    .unwrap()
}

const PROMPT: [u32; 4] = [1, 10, 20, 7];

#[test]
fn a_stop_string_spanning_two_tokens_stops_the_stream_and_is_not_emitted() {
    let e = tiny_engine("gen-stop");
    let mut ends = Vec::new();
    let mut text = String::new();
    let full = e
        .generate(GenerationRequest::greedy(Prompt::Ids(PROMPT.to_vec()), 12), |ev| {
            text.push_str(&ev.text);
            ends.push(text.len());
        })
        .unwrap();
    assert!(full.tokens.len() >= 6, "{full:?}");
    let pieces: Vec<String> = full.tokens.iter().map(|&t| e.text.decode(&[t]).unwrap()).collect();
    // The tail of token 3 and the head of token 4 ("3 w4"-like): across the boundary.
    let (a, b) = (&pieces[3], &pieces[4]);
    let stop = format!("{} {}", &a[a.len() - 1..], &b[..2]);
    let at = full.text.find(&stop).unwrap();
    // The token whose text completes its first occurrence.
    let last = ends.iter().position(|&end| end >= at + stop.len()).unwrap();
    assert!(last >= 1 && ends[last - 1] > at, "the stop string spans a token boundary");
    let mut req = GenerationRequest::greedy(Prompt::Ids(PROMPT.to_vec()), 12);
    req.stop = vec!["never appears".into(), stop.clone()];
    let mut streamed = String::new();
    let out = e.generate(req, |ev| streamed.push_str(&ev.text)).unwrap();
    assert_eq!(out.finish, FinishReason::StopString(stop.clone()));
    assert_eq!(out.text, full.text[..at], "the text before the stop string, and nothing of it");
    assert_eq!(streamed, out.text, "the stream released exactly the text");
    assert_eq!(out.tokens, full.tokens[..=last], "stopped at the token that completed it");
    assert_eq!(out.usage.completion_tokens, last + 1);
    assert_eq!(out.usage.prompt_tokens, PROMPT.len());
}

#[test]
fn stop_ids_budgets_and_cancellation_end_the_stream() {
    let e = tiny_engine("gen-ends");
    let full = e.generate(GenerationRequest::greedy(Prompt::Ids(PROMPT.to_vec()), 10), |_| {}).unwrap();
    assert_eq!(full.finish, FinishReason::MaxTokens);
    assert_eq!(full.tokens.len(), 10);
    let mut req = GenerationRequest::greedy(Prompt::Ids(PROMPT.to_vec()), 10);
    req.stop_token_ids = vec![full.tokens[2]];
    let out = e.generate(req, |_| {}).unwrap();
    let first = full.tokens.iter().position(|&t| t == full.tokens[2]).unwrap();
    assert_eq!(out.finish, FinishReason::StopToken(full.tokens[2]));
    assert_eq!(out.tokens, full.tokens[..=first]);
    // Cancelled from the token it is told of: nothing more is drawn.
    let mut req = GenerationRequest::greedy(Prompt::Ids(PROMPT.to_vec()), 10);
    let cancel = CancelToken::new();
    req.cancel = cancel.clone();
    let mut n = 0;
    let out = e
        .generate(req, |_| {
            n += 1;
            if n == 3 {
                cancel.cancel();
            }
        })
        .unwrap();
    assert_eq!((out.finish, out.tokens.len()), (FinishReason::Cancelled, 3));
    let out = e.generate(GenerationRequest::greedy(Prompt::Ids(PROMPT.to_vec()), 10), |_| Next::Stop).unwrap();
    assert_eq!((out.finish, out.tokens.len()), (FinishReason::Cancelled, 1));
}

#[test]
fn requests_with_values_that_cannot_run_are_refused() {
    let e = tiny_engine("gen-refused");
    let run = |edit: &dyn Fn(&mut GenerationRequest)| {
        let mut r = GenerationRequest::greedy(Prompt::Ids(PROMPT.to_vec()), 4);
        edit(&mut r);
        e.generate(r, |_| {}).unwrap_err().to_string()
    };
    assert!(run(&|r| r.stop = vec![String::new()]).contains("empty stop string"));
    assert!(run(&|r| r.stop = vec!["x".repeat(2000)]).contains("at most 1024"));
    assert!(run(&|r| r.stop = vec!["x".into(); 65]).contains("at most 64"));
    assert!(run(&|r| r.logprobs = Some(21)).contains("at most 20"));
    assert!(run(&|r| r.max_tokens = Some(0)).contains("max_tokens"));
    assert!(run(&|r| r.sampling.temperature = Some(f32::NAN)).contains("temperature"));
    assert!(run(&|r| r.sampling.min_p = Some(2.0)).contains("min_p"));
    assert!(run(&|r| r.prompt = Prompt::Ids(vec![1, 100_000])).contains("outside the vocabulary"));
    assert!(
        run(&|r| r.prompt = Prompt::Chat { messages: Messages::new(), options: Default::default() }).contains("empty")
    );
}

#[test]
fn logprobs_come_with_each_token_and_the_greedy_choice_is_the_top_one() {
    let e = tiny_engine("gen-logprobs");
    let mut req = GenerationRequest::greedy(Prompt::Ids(PROMPT.to_vec()), 6);
    req.logprobs = Some(5);
    let mut events = Vec::new();
    e.generate(req, |ev| events.push(ev.clone())).unwrap();
    assert_eq!(events.len(), 6);
    for ev in &events {
        let lp = ev.logprobs.as_ref().unwrap();
        assert_eq!(lp.top.len(), 5);
        assert_eq!(lp.top[0], (ev.id, lp.logprob));
        assert!(lp.top.windows(2).all(|w| w[0].1 >= w[1].1) && lp.logprob <= 0.0);
    }
}

#[test]
fn generation_config_gives_the_defaults_and_a_request_overrides_them() {
    let dir = tiny_model("gen-defaults");
    let write = |v: serde_json::Value| std::fs::write(dir.join("generation_config.json"), v.to_string()).unwrap();
    let load = || {
        Engine::load(&dir, &LoadOptions { path: RunPath::F32, context: 64, cache: None, ..LoadOptions::default() })
            .unwrap()
    };
    let run = |e: &Engine, seed: u64, o: SamplingOverrides| {
        let mut r = GenerationRequest::new(Prompt::Ids(PROMPT.to_vec()));
        r.max_tokens = Some(8);
        r.sampling = SamplingOverrides { seed: Some(seed), ..o };
        e.generate(r, |_| {}).unwrap().tokens
    };
    // Without do_sample: greedy, whatever the seed.
    write(serde_json::json!({"temperature": 5.0, "max_new_tokens": 3}));
    let e = load();
    assert_eq!(e.defaults.sampling.temperature, Some(0.0));
    assert_eq!(run(&e, 1, SamplingOverrides::default()), run(&e, 2, SamplingOverrides::default()));
    assert_eq!(
        e.generate(GenerationRequest::new(Prompt::Ids(PROMPT.to_vec())), |_| {}).unwrap().tokens.len(),
        3,
        "max_new_tokens is the default budget"
    );
    // do_sample at a high temperature: seeds differ; top_k 1 from the request makes it greedy again.
    write(serde_json::json!({"do_sample": true, "temperature": 50.0, "top_p": 1.0, "top_k": 0, "min_p": "x"}));
    let e = load();
    assert_eq!(e.defaults.sampling.temperature, Some(50.0));
    assert!(e.warnings.iter().any(|w| w.contains("\"min_p\"")), "{:?}", e.warnings);
    let seeds: BTreeSet<Vec<u32>> = (0..4).map(|s| run(&e, s, SamplingOverrides::default())).collect();
    assert!(seeds.len() > 1, "sampling at temperature 50 must depend on the seed");
    let greedy = run(&e, 0, SamplingOverrides { temperature: Some(0.0), ..SamplingOverrides::default() });
    let top1 = run(&e, 5, SamplingOverrides { top_k: Some(1), ..SamplingOverrides::default() });
    assert_eq!(top1, greedy);
}

#[test]
fn a_continued_prompt_reuses_the_cached_prefix() {
    let e = tiny_engine("gen-prefix");
    let mut cache = e.new_cache().unwrap();
    let first = e.generate_in(&mut cache, GenerationRequest::greedy(Prompt::Ids(PROMPT.to_vec()), 5), |_| {}).unwrap();
    assert_eq!(first.prefill_tokens, PROMPT.len());
    let mut longer = PROMPT.to_vec();
    longer.extend(&first.tokens[..4]);
    longer.push(3);
    let alone = e.generate(GenerationRequest::greedy(Prompt::Ids(longer.clone()), 5), |_| {}).unwrap();
    let cont = e.generate_in(&mut cache, GenerationRequest::greedy(Prompt::Ids(longer.clone()), 5), |_| {}).unwrap();
    assert_eq!(cont.prefill_tokens, 1, "only the new position runs");
    assert_eq!(cont.tokens, alone.tokens);
    // A prompt that departs from the cache early: the rest is forgotten and run again.
    let other = vec![1, 11, 20, 7, 3];
    let alone = e.generate(GenerationRequest::greedy(Prompt::Ids(other.clone()), 5), |_| {}).unwrap();
    let cont = e.generate_in(&mut cache, GenerationRequest::greedy(Prompt::Ids(other), 5), |_| {}).unwrap();
    assert_eq!(cont.prefill_tokens, 4);
    assert_eq!(cont.tokens, alone.tokens);
}

/// The same seed gives the same tokens with one worker thread or two.
fn same_across_thread_counts(e: &Engine, req: impl Fn() -> GenerationRequest + Sync) -> Vec<u32> {
    let with = |threads| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| e.generate(req(), |_| {}).unwrap().tokens)
    };
    let one = with(1);
    assert_eq!(one, with(2), "one thread against two");
    one
}

#[test]
fn a_seeded_sampled_run_repeats_across_thread_counts_on_every_path() {
    for path in [RunPath::F32, RunPath::W4a16, RunPath::Wna16, RunPath::W4a8] {
        let e = Engine::load(
            &tiny_model("gen-threads"),
            &LoadOptions { path, context: 64, cache: None, ..LoadOptions::default() },
        )
        .unwrap();
        let req = |seed| {
            move || {
                let mut r = GenerationRequest::new(Prompt::Ids(PROMPT.to_vec()));
                r.max_tokens = Some(16);
                r.sampling = SamplingOverrides {
                    temperature: Some(1.5),
                    top_p: Some(0.95),
                    seed: Some(seed),
                    ..Default::default()
                };
                r
            }
        };
        let a = same_across_thread_counts(&e, req(9));
        let b = same_across_thread_counts(&e, req(10));
        assert_ne!(a, b, "{path:?}: another seed draws other tokens");
    }
}

/// A server keeps a prompt's cache and starts a later prompt that begins the same way from a copy of its
/// whole 256-position chunks: continued from the copy, the later prompt's logits are those of a fresh run
/// in the same chunks, bit for bit, on every path; a copy that cannot be made is refused.
#[test]
fn a_cache_started_from_a_copy_of_whole_chunks_gives_a_fresh_run_s_bits_on_every_path() {
    // The tiny model with room for three chunks.
    let dir = tiny_model("gen-copy-prefix");
    let config = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let config = config.replace("\"max_position_embeddings\": 256", "\"max_position_embeddings\": 1024");
    std::fs::write(dir.join("config.json"), config).unwrap();
    let prompt =
        |n: usize, salt: u32| -> Vec<u32> { (0..n as u32).map(|i| 3 + (i * 7 + salt * (i / 300)) % 90).collect() };
    let fresh = |e: &Engine, tokens: &[u32]| -> (Vec<f32>, int4::KvCache) {
        let mut cache = e.new_cache().unwrap();
        let mut logits = Vec::new();
        for chunk in tokens.chunks(256) {
            logits = e.model.forward(chunk, &mut cache, false).unwrap();
        }
        (logits, cache)
    };
    for path in [RunPath::F32, RunPath::Bf16, RunPath::W4a16, RunPath::Wna16, RunPath::W4a8] {
        let e = Engine::load(&dir, &LoadOptions { path, context: 768, cache: None, ..LoadOptions::default() }).unwrap();
        // The earlier prompt: 600 positions; the later one shares its first 300 and then departs.
        let (_, earlier) = fresh(&e, &prompt(600, 0));
        let later = prompt(700, 1);
        assert_eq!(later[..300], prompt(600, 0)[..300]);
        assert_ne!(later[300..600], prompt(600, 0)[300..]);
        let (alone, _) = fresh(&e, &later);
        let mut cache = e.new_cache().unwrap();
        cache.copy_prefix_from(&earlier, 256).unwrap();
        assert_eq!(cache.ids(), &later[..256]);
        let mut logits = Vec::new();
        for chunk in later[256..].chunks(256) {
            logits = e.model.forward(chunk, &mut cache, false).unwrap();
        }
        assert_eq!(alone.len(), logits.len());
        assert!(
            alone.iter().zip(&logits).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{path:?}: the continued copy's logits differ from a fresh run's"
        );
        // A kept cache shrunk to its positions still copies the same bits.
        let (_, mut kept) = fresh(&e, &prompt(600, 0));
        kept.truncate(512);
        kept.shrink_to_len();
        assert_eq!((kept.len(), kept.capacity()), (512, 512));
        let mut from_kept = e.new_cache().unwrap();
        from_kept.copy_prefix_from(&kept, 256).unwrap();
        let logits = e.model.forward(&later[256..512], &mut from_kept, false).unwrap();
        let (alone, _) = fresh(&e, &later[..512]);
        assert_eq!(alone.len(), logits.len());
        assert!(alone.iter().zip(&logits).all(|(a, b)| a.to_bits() == b.to_bits()), "{path:?}: from a shrunk cache");
        // Refused: more than the source holds, more than the destination fits.
        let mut small = e.model.kv_cache(100, usize::MAX).unwrap();
        assert!(small.copy_prefix_from(&kept, 256).is_err());
        assert!(cache.copy_prefix_from(&kept, 513).is_err());
        assert_eq!(cache.ids(), &later[..], "a refused copy leaves the cache as it was");
    }
}

// --- the real default model ----------------------------------------------------------------------------

fn default_engine(path: RunPath) -> Option<Engine> {
    let dir = int4_test_support::default_model_or_skip!("generation")?;
    Some(Engine::load(&dir, &LoadOptions { path, context: 1024, ..LoadOptions::default() }).unwrap())
}

#[test]
fn a_repetition_penalty_breaks_a_loop_the_greedy_output_falls_into() {
    let Some(e) = default_engine(RunPath::Auto) else { return };
    let run = |o: SamplingOverrides| {
        let mut r = GenerationRequest::greedy(Prompt::Text("He was charismatic, charismatic,".into()), 40);
        r.sampling = SamplingOverrides { temperature: Some(0.0), ..o };
        e.generate(r, |_| {}).unwrap().text
    };
    let phrase = "a master of his craft";
    let greedy = run(SamplingOverrides::default());
    assert!(greedy.matches(phrase).count() >= 3, "the greedy output loops: {greedy:?}");
    let penalised = run(SamplingOverrides { repetition_penalty: Some(1.3), ..Default::default() });
    assert!(penalised.matches(phrase).count() <= 1, "{penalised:?}");
    let frequency = run(SamplingOverrides { frequency_penalty: Some(1.0), ..Default::default() });
    assert!(frequency.matches(phrase).count() < greedy.matches(phrase).count(), "{frequency:?}");
}

#[test]
fn streamed_text_is_the_decoded_output_and_a_seed_repeats_across_threads() {
    let Some(e) = default_engine(RunPath::Auto) else { return };
    let mut messages = Messages::new();
    messages.push("user", "Écris trois phrases en français, puis en japonais, avec des emojis 🎉.");
    let req = || {
        let mut r = GenerationRequest::new(Prompt::Chat { messages: messages.clone(), options: Default::default() });
        r.max_tokens = Some(80);
        r.sampling = SamplingOverrides {
            temperature: Some(0.9),
            top_p: Some(0.95),
            min_p: Some(0.02),
            seed: Some(42),
            ..Default::default()
        };
        r
    };
    let mut streamed = String::new();
    let out = e.generate(req(), |ev| streamed.push_str(&ev.text)).unwrap();
    assert_eq!(streamed, out.text);
    assert_eq!(out.text, e.text.decode_for_display(&out.tokens).unwrap());
    assert!(!out.text.is_ascii(), "{:?}", out.text);
    let tokens = same_across_thread_counts(&e, req);
    assert_eq!(tokens, out.tokens);
}
