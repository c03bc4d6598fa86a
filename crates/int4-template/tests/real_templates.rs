//! Real models' chat templates render byte for byte as transformers renders them.
//!
//! The templates (Llama 3.1 and 3.2, Qwen2.5, Qwen3, Mistral-Nemo, SmolLM2; sources and licences in
//! `fixtures/templates/SOURCES.md`) and the conversations (`fixtures/cases.json`: plain chat, no
//! generation prompt, a system message, several turns, tools, a tool call and its result, reasoning,
//! `enable_thinking`, and roles out of order) are committed; `fixtures/expected.json` holds what
//! transformers' `render_jinja_template` made of them (`scripts/chat_template_reference.py`), with the
//! same fixed clock for `strftime_now`.

use std::path::Path;

use int4_template::{ChatInput, ChatTemplate, Clock, Limits, Messages, TemplateError};
use minijinja::Value;

fn fixtures() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures"))
}

fn json(name: &str) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join(name)).unwrap()).unwrap()
}

/// The same text as JSON, parsed with key order kept (as a request's body is).
fn ordered(v: &serde_json::Value) -> Value {
    serde_json::from_str(&serde_json::to_string(v).unwrap()).unwrap()
}

#[test]
fn real_templates_render_as_transformers_renders_them() {
    let cases_text = std::fs::read_to_string(fixtures().join("cases.json")).unwrap();
    // Parsed twice: once in key order (what the template sees), once as a plain value to walk.
    let cases_ordered: Value = serde_json::from_str(&cases_text).unwrap();
    let cases = json("cases.json");
    let expected = json("expected.json");
    let clock: jiff::Timestamp = cases["clock"].as_str().unwrap().parse().unwrap();
    let clock = Clock::Fixed(clock.to_zoned_datetime(jiff::tz::TimeZone::UTC));
    let tools = cases_ordered.get_attr("tools").unwrap();
    let case_list = cases_ordered.get_attr("cases").unwrap();
    let mut checked = 0;
    for want in expected["renders"].as_array().unwrap() {
        let model = want["model"].as_str().unwrap();
        let case_name = want["case"].as_str().unwrap();
        let source = std::fs::read_to_string(fixtures().join("templates").join(format!("{model}.jinja"))).unwrap();
        let template = ChatTemplate::new(&source, clock.clone(), Limits::default()).unwrap();
        let index = cases["cases"].as_array().unwrap().iter().position(|c| c["name"] == case_name).unwrap();
        let case = &cases["cases"][index];
        let case_ordered = case_list.get_item_by_index(index).unwrap();
        let messages = Messages::from_value(&case_ordered.get_attr("messages").unwrap()).unwrap();
        let special: Vec<(String, String)> = cases["models"][model]["special_tokens"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
            .collect();
        let extra: Vec<(String, Value)> = case
            .get("extra")
            .and_then(|e| e.as_object())
            .map(|m| m.iter().map(|(k, v)| (k.clone(), ordered(v))).collect())
            .unwrap_or_default();
        let input = ChatInput {
            messages: &messages,
            tools: case.get("tools").and_then(|t| t.as_bool()).unwrap_or(false).then_some(&tools),
            add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
            special_tokens: &special,
            extra: &extra,
        };
        let got = template.render(&input);
        match (want.get("output").and_then(|o| o.as_str()), got) {
            (Some(w), Ok(g)) => assert!(w == g, "{model} / {case_name}:\n--- transformers\n{w}\n--- int4\n{g}"),
            (None, Err(TemplateError::Raised(m))) => {
                assert_eq!(m, want["error"].as_str().unwrap(), "{model} / {case_name}")
            }
            (w, g) => panic!("{model} / {case_name}: transformers gave {w:?}, int4 {g:?}"),
        }
        checked += 1;
    }
    assert_eq!(checked, 38, "every render of expected.json was compared");
}
