//! The command line's rule for a model argument. Relative paths are relative to the working directory, so
//! this file holds one test, which alone in its process changes the working directory.
#![cfg(unix)]

mod common;

use common::{C1, Hub};
use int4_hub::{HubErrorKind, ModelSource, Resolved, resolve_model_arg};

#[test]
fn model_arguments_prefer_local_paths_then_repo_ids() {
    let hub = Hub::new("model-arg");
    let work = hub.tmp.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    std::env::set_current_dir(&work).unwrap();
    let cache = hub.cache();
    hub.safetensors_repo("org/name", C1);
    hub.safetensors_repo("org/other", C1);
    hub.file("bartowski/m-GGUF", C1, "m-Q4_0.gguf", b"gguf");
    hub.set_ref("bartowski/m-GGUF", "main", C1);

    // A local directory with the same name as a cached repo wins.
    std::fs::create_dir_all(work.join("org/name")).unwrap();
    assert_eq!(resolve_model_arg("org/name", &cache).unwrap(), ModelSource::Local("org/name".into()));
    // A local file with no slash at all.
    std::fs::write(work.join("model.gguf"), b"").unwrap();
    assert_eq!(resolve_model_arg("model.gguf", &cache).unwrap(), ModelSource::Local("model.gguf".into()));
    let abs = work.join("model.gguf");
    assert_eq!(resolve_model_arg(abs.to_str().unwrap(), &cache).unwrap(), ModelSource::Local(abs.clone()));

    // Not a local path: the cache.
    let src = resolve_model_arg("org/other", &cache).unwrap();
    assert_eq!(src.path(), hub.snapshot("org/other", C1));
    assert!(matches!(&src, ModelSource::Hub { reference, resolved: Resolved::Directory(_) }
        if reference.to_string() == "org/other"));
    let src = resolve_model_arg("bartowski/m-GGUF:q4_0", &cache).unwrap();
    assert_eq!(src.path(), hub.snapshot("bartowski/m-GGUF", C1).join("m-Q4_0.gguf"));

    // Only ever paths: never looked up, even though `org/other` is cached.
    for arg in ["./org/other", "/org/other", "~/org/other", "a/b/c", "org/other/", "org\\other", "../org/other"] {
        let e = resolve_model_arg(arg, &cache).unwrap_err();
        assert!(matches!(e.kind(), HubErrorKind::NoSuchPath { not_a_repo: None, .. }), "{arg}: {e}");
        assert!(e.to_string().contains("no such file or directory"), "{arg}: {e}");
    }
    // Could have been either, is neither.
    for arg in ["a--b/c", "nothing-here", "", "org/na me"] {
        let e = resolve_model_arg(arg, &cache).unwrap_err();
        assert!(matches!(e.kind(), HubErrorKind::NoSuchPath { not_a_repo: Some(_), .. }), "{arg:?}: {e}");
        assert!(e.to_string().contains("not a Hugging Face repo id"), "{arg:?}: {e}");
    }
    // A repo id that is not cached says so.
    let e = resolve_model_arg("org/missing", &cache).unwrap_err();
    assert!(matches!(e.kind(), HubErrorKind::NotCached { .. }), "{e}");
    assert_eq!(e.reference(), Some("org/missing"));
    // A revision may hold slashes without making the argument a path.
    hub.set_ref("org/other", "refs/pr/2", C1);
    assert!(resolve_model_arg("org/other@refs/pr/2", &cache).is_ok());
}
