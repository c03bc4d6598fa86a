//! What a render may use, what it sees and how it fails.

use int4_template::{ChatInput, ChatTemplate, Clock, Limits, Messages, TemplateError};
use minijinja::Value;

fn render(source: &str, messages: &Messages, limits: Limits) -> Result<String, TemplateError> {
    let t = ChatTemplate::new(source, Clock::System, limits)?;
    t.render(&ChatInput {
        messages,
        tools: None,
        add_generation_prompt: true,
        special_tokens: &[("bos_token".into(), "<s>".into())],
        extra: &[("flag".into(), Value::from(7))],
    })
}

fn chat() -> Messages {
    let mut m = Messages::new();
    m.push("user", "hi");
    m
}

#[test]
fn endless_loops_run_out_of_fuel_and_long_output_is_cut() {
    let limits = Limits { fuel: 10_000, output_bytes: 1 << 20 };
    let endless = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
    assert!(matches!(render(endless, &chat(), limits), Err(TemplateError::OutOfFuel(10_000))));
    let long = "{% for i in range(5000) %}{{ 'x' * 1000 }}{% endfor %}";
    let limits = Limits { fuel: 10_000_000, output_bytes: 1 << 20 };
    assert!(matches!(render(long, &chat(), limits), Err(TemplateError::TooLong(_))));
}

#[test]
fn raise_exception_carries_its_message() {
    let e = render("{{ raise_exception('roles must alternate') }}", &chat(), Limits::default()).unwrap_err();
    assert!(matches!(&e, TemplateError::Raised(m) if m == "roles must alternate"), "{e}");
}

#[test]
fn the_context_holds_what_transformers_passes() {
    let src = "{{ bos_token }}|{{ tools is none }}|{{ documents is none }}|{{ add_generation_prompt }}|{{ flag }}|\
               {% for m in messages %}{% if m.content.startswith('h') %}{{ m.role.upper() }}{% endif %}{% endfor %}|\
               {% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}";
    assert_eq!(render(src, &chat(), Limits::default()).unwrap(), "<s>|True|True|True|7|USER|02");
}

#[test]
fn blocks_are_trimmed_and_left_stripped_as_transformers_sets_them() {
    let src = "{% for m in messages %}\n    {% if true %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}\n";
    assert_eq!(render(src, &chat(), Limits::default()).unwrap(), "[hi]\n");
}

#[test]
fn tojson_takes_json_dumps_arguments_by_position_or_name() {
    let m = Messages::from_json(r#"[{"role": "user", "content": "x", "b": 1, "a": [1.5, "é"]}]"#).unwrap();
    let src = "{{ messages[0] | tojson }}|{{ messages[0] | tojson(sort_keys=true) }}|{{ messages[0].a | tojson(true) }}|\
               {{ messages[0].a | tojson(indent=1, separators=[';', '=']) }}";
    assert_eq!(
        render(src, &m, Limits::default()).unwrap(),
        "{\"role\": \"user\", \"content\": \"x\", \"b\": 1, \"a\": [1.5, \"é\"]}|\
         {\"a\": [1.5, \"é\"], \"b\": 1, \"content\": \"x\", \"role\": \"user\"}|[1.5, \"\\u00e9\"]|[\n 1.5;\n \"é\"\n]"
    );
    assert!(render("{{ nothing | tojson }}", &m, Limits::default()).is_err());
    assert!(render("{{ 1 | tojson(indent=[1]) }}", &m, Limits::default()).is_err());
    assert!(render("{{ 1 | tojson(true, ensure_ascii=true) }}", &m, Limits::default()).is_err());
    assert!(render("{{ 1 | tojson(bogus=1) }}", &m, Limits::default()).is_err());
}

#[test]
fn strftime_now_reads_the_clock_and_refuses_a_bad_format() {
    let t = jiff::Timestamp::from_second(1_700_000_000).unwrap().to_zoned_datetime(jiff::tz::TimeZone::UTC);
    let tpl = ChatTemplate::new("{{ strftime_now('%d %b %Y %H:%M') }}", Clock::Fixed(t), Limits::default()).unwrap();
    let input =
        ChatInput { messages: &chat(), tools: None, add_generation_prompt: false, special_tokens: &[], extra: &[] };
    assert_eq!(tpl.render(&input).unwrap(), "14 Nov 2023 22:13");
    let now = render("{{ strftime_now('%Y') }}", &chat(), Limits::default()).unwrap();
    assert!(now.parse::<i32>().unwrap() >= 2026, "{now}");
    assert!(render("{{ strftime_now('%Y %') }}", &chat(), Limits::default()).is_err());
}

#[test]
fn messages_are_prepared_as_transformers_prepares_them() {
    let m = Messages::from_json(
        r#"[{"role": "assistant", "content": "42", "tool_calls": null, "reasoning": "because"},
            {"role": "user", "content": [{"type": "text", "text": "parts"}]}]"#,
    )
    .unwrap();
    let src = "{% for m in messages %}{{ m | tojson }}\n{% endfor %}";
    assert_eq!(
        render(src, &m, Limits::default()).unwrap(),
        "{\"thinking\": \"because\", \"role\": \"assistant\", \"content\": \"42\", \"reasoning\": \"because\", \
         \"reasoning_content\": \"because\"}\n{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"parts\"}]}\n"
    );
    for bad in
        [r#"{"role": "user"}"#, r#"[1]"#, r#"[{"content": "x"}]"#, r#"[{"role": 3}]"#, "[", r#"[{"role": null}]"#]
    {
        assert!(Messages::from_json(bad).is_err(), "{bad}");
    }
}
