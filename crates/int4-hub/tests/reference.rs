//! Parsing and validating references: nothing a user types may reach outside the cache's folders.

use int4_hub::{HubErrorKind, ModelRef, RepoId};

#[test]
fn references_parse_into_repo_revision_and_quant() {
    let r = ModelRef::parse("HuggingFaceTB/SmolLM2-135M-Instruct").unwrap();
    assert_eq!((r.repo().org(), r.repo().name()), ("HuggingFaceTB", "SmolLM2-135M-Instruct"));
    assert_eq!((r.revision(), r.quant()), ("main", None));
    assert_eq!(r.repo().folder_name(), "models--HuggingFaceTB--SmolLM2-135M-Instruct");

    let r: ModelRef = "bartowski/SmolLM2-135M-Instruct-GGUF:Q4_0".parse().unwrap();
    assert_eq!((r.revision(), r.quant()), ("main", Some("Q4_0")));
    assert_eq!(r.fetch_command(), "hf download bartowski/SmolLM2-135M-Instruct-GGUF --include \"*Q4_0*.gguf\"");

    let r = ModelRef::parse("org/name@refs/pr/1:UD-Q4_K_XL").unwrap();
    assert_eq!((r.revision(), r.quant()), ("refs/pr/1", Some("UD-Q4_K_XL")));
    assert_eq!(r.to_string(), "org/name@refs/pr/1:UD-Q4_K_XL");
    assert_eq!(r.fetch_command(), "hf download org/name --revision refs/pr/1 --include \"*UD-Q4_K_XL*.gguf\"");

    let r = ModelRef::parse("a_b/c.d-e@v1.0").unwrap();
    assert_eq!((r.revision(), r.quant()), ("v1.0", None));
    assert_eq!(ModelRef::new("o/n".parse().unwrap()).to_string(), "o/n");
}

#[test]
fn invalid_repo_ids_are_refused() {
    let long = format!("org/{}", "a".repeat(97));
    let cases = [
        "../x/y", "a--b/c", "a/b/c", "a..b/c", "a", "", "/a", "a/", "-a/b", "a/b-", ".a/b", "a/b.", "a/b.git", "a b/c",
        "a/b%2F", "ä/b", &long,
    ];
    for id in cases {
        let e = RepoId::parse(id).unwrap_err();
        assert!(matches!(e.kind(), HubErrorKind::InvalidReference { .. }), "{id}: {e}");
        assert!(ModelRef::parse(id).is_err(), "{id}");
    }
    assert!(RepoId::parse(&format!("org/{}", "a".repeat(96))).is_ok());
    let e = RepoId::parse("a--b/c").unwrap_err();
    assert!(e.to_string().contains("may not contain `--` or `..`"), "{e}");
}

#[test]
fn invalid_revisions_and_quants_are_refused() {
    for r in [
        "o/n@",
        "o/n@../../etc",
        "o/n@a/../b",
        "o/n@.hidden",
        "o/n@a//b",
        "o/n@/abs",
        "o/n@a/",
        "o/n@a b",
        "o/n@a\\b",
        "o/n@x.lock",
        "o/n@a@{1}",
        "o/n@a~1",
        "o/n@a\n",
    ] {
        let e = ModelRef::parse(r).unwrap_err();
        assert!(matches!(e.kind(), HubErrorKind::InvalidReference { .. }), "{r:?}: {e}");
        assert!(e.to_string().contains("revision"), "{r:?}: {e}");
    }
    for q in ["o/n:", "o/n:Q4/0", "o/n:Q4 0", "o/n:a:b", "o/n@main:*"] {
        let e = ModelRef::parse(q).unwrap_err();
        assert!(matches!(e.kind(), HubErrorKind::InvalidReference { .. }), "{q:?}: {e}");
    }
}
