//! The cache root's precedence, read through a pure lookup: the process environment is never touched.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::Path;

use int4_hub::HubCache;

fn cache(vars: &[(&str, &str)]) -> HubCache {
    let map: HashMap<String, OsString> = vars.iter().map(|(k, v)| (k.to_string(), OsString::from(v))).collect();
    HubCache::from_env_with(|var| map.get(var).cloned())
}

fn root(vars: &[(&str, &str)]) -> Option<String> {
    cache(vars).root().map(|p| p.display().to_string())
}

#[test]
fn env_precedence_follows_huggingface_hub() {
    let all = [
        ("HF_HUB_CACHE", "/hub-cache"),
        ("HUGGINGFACE_HUB_CACHE", "/legacy-cache"),
        ("HF_HOME", "/hf-home"),
        ("XDG_CACHE_HOME", "/xdg"),
        ("HOME", "/home/u"),
    ];
    assert_eq!(root(&all).as_deref(), Some("/hub-cache"));
    assert_eq!(root(&all[1..]).as_deref(), Some("/legacy-cache"));
    assert_eq!(root(&all[2..]).as_deref(), Some("/hf-home/hub"));
    assert_eq!(root(&all[3..]).as_deref(), Some("/xdg/huggingface/hub"));
    assert_eq!(root(&all[4..]).as_deref(), Some("/home/u/.cache/huggingface/hub"));
    assert_eq!(root(&[]), None);
}

#[test]
fn empty_variables_are_skipped() {
    let vars = [("HF_HUB_CACHE", ""), ("HUGGINGFACE_HUB_CACHE", ""), ("HF_HOME", ""), ("HOME", "/home/u")];
    assert_eq!(root(&vars).as_deref(), Some("/home/u/.cache/huggingface/hub"));
    assert_eq!(root(&[("HOME", "")]), None);
}

#[test]
fn a_leading_tilde_is_home() {
    let c = cache(&[("HF_HOME", "~/hf"), ("HOME", "/home/u")]);
    assert_eq!(c.root(), Some(Path::new("/home/u/hf/hub")));
    let c = cache(&[("HF_HUB_CACHE", "~"), ("HOME", "/home/u")]);
    assert_eq!(c.root(), Some(Path::new("/home/u")));
    // `~user` is not expanded, and without HOME nothing is.
    assert_eq!(cache(&[("HF_HUB_CACHE", "~bob/x"), ("HOME", "/home/u")]).root(), Some(Path::new("~bob/x")));
    assert_eq!(cache(&[("HF_HUB_CACHE", "~/x")]).root(), Some(Path::new("~/x")));
}

#[test]
fn explicit_roots_and_repo_dirs() {
    let c = HubCache::at("/somewhere");
    assert_eq!(c.root(), Some(Path::new("/somewhere")));
    let repo = "HuggingFaceTB/SmolLM2-135M-Instruct".parse().unwrap();
    assert_eq!(c.repo_dir(&repo).unwrap(), Path::new("/somewhere/models--HuggingFaceTB--SmolLM2-135M-Instruct"));
    assert_eq!(cache(&[]).repo_dir(&repo), None);
}
