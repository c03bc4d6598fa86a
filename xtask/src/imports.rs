//! `cargo xtask lint`: the workspace's two structural rules, checked from the sources themselves.
//!
//! * **Crate arrows run one way.** Each workspace crate may depend (normal and build dependencies) only on
//!   the crates [`ALLOWED_DEPENDENCIES`] lists for it, read from every `Cargo.toml`; the table is the
//!   layering `docs/architecture.md` draws.
//! * **No import cycle between the files of a crate.** Every path a file names that starts with `crate::`,
//!   `super::` or `self::` (in `use` trees, expressions, types and macros alike; comments and string
//!   literals skipped) is resolved to the file that defines the module it reaches, by the longest module
//!   prefix that is a file. The result is a directed graph of files per crate; a cycle in it is an error
//!   naming every file on the cycle and one line in each that makes the edge. A crate root that re-exports
//!   a module's item is an edge from the root to that module, so a module names its siblings by their own
//!   paths (`crate::error::Error`), not by the root's re-export.
//!
//! The scanner is a small tokenizer, not a Rust parser: it knows comments (nested block comments too),
//! string, raw string, byte and char literals, lifetimes, braces, `mod name {` blocks (whose `super::`
//! resolves inside them) and `use` trees with nested braces. Those are all the constructs that change what
//! a path resolves to; the unit tests below hold each of them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// Which workspace crates each workspace crate may depend on. A crate missing here is an error, so a new
/// crate has to be placed in the layering before it builds in CI.
pub const ALLOWED_DEPENDENCIES: &[(&str, &[&str])] = &[
    ("int4-layout", &[]),
    ("int4-files", &[]),
    ("int4-safetensors", &[]),
    ("int4-template", &[]),
    ("int4-hub", &["int4-files"]),
    ("int4-gguf", &["int4-layout", "int4-files", "int4-safetensors"]),
    ("int4-team", &[]),
    ("int4-kernels", &["int4-layout", "int4-team"]),
    ("int4-select", &["int4-layout", "int4-files", "int4-kernels"]),
    ("int4-cache", &["int4-layout", "int4-files", "int4-kernels", "int4-select"]),
    (
        "int4",
        &[
            "int4-layout",
            "int4-files",
            "int4-kernels",
            "int4-team",
            "int4-select",
            "int4-cache",
            "int4-gguf",
            "int4-hub",
            "int4-safetensors",
            "int4-template",
        ],
    ),
    (
        "int4-quant",
        &[
            "int4-layout",
            "int4-files",
            "int4-kernels",
            "int4-select",
            "int4-cache",
            "int4-gguf",
            "int4-safetensors",
            "int4",
        ],
    ),
    ("int4-serve", &["int4"]),
    ("int4-cli", &["int4", "int4-quant", "int4-serve"]),
    ("xtask", &["int4"]),
    ("int4-benches", &["int4-layout", "int4-kernels", "int4-select", "int4-cache", "int4", "int4-quant"]),
    // Shared by the integration tests (a dev-dependency only), so it sits beside the crates it serves.
    ("int4-test-support", &["int4-cache"]),
];

/// Runs both checks over the workspace at `root`, printing what it checked; fails on the first rule broken.
pub fn lint(root: &Path) -> Result<()> {
    let crates = workspace_crates(root)?;
    check_dependencies(&crates)?;
    let mut files = 0;
    let mut edges = 0;
    let mut failures = Vec::new();
    for c in &crates {
        let mut graph = crate_graph(&c.dir.join("src"))?;
        files += graph.files.len();
        edges += graph.edges.values().map(BTreeMap::len).sum::<usize>();
        // Every cycle, not only the first: report one, cut its first edge, look again.
        while let Some(cycle) = graph.find_cycle() {
            failures.push(format!("{}: {}", c.name, graph.describe_cycle(&cycle)));
            let next = &cycle[1 % cycle.len()];
            graph.edges.get_mut(&cycle[0]).expect("a cycle's edges exist").remove(next);
        }
    }
    if !failures.is_empty() {
        bail!("import cycles between files:\n{}", failures.join("\n"));
    }
    println!(
        "xtask lint: {} crates depend only downwards; {files} files, {edges} import edges, no cycle",
        crates.len()
    );
    Ok(())
}

/// A workspace member: its package name, directory and the workspace crates it depends on.
#[derive(Debug)]
struct Member {
    name: String,
    dir: PathBuf,
    deps: Vec<String>,
}

/// The members listed in the root `Cargo.toml`, each with the workspace crates among its normal and build
/// dependencies (a minimal TOML reading: section headers and `name = …` / `name.workspace = true` keys).
fn workspace_crates(root: &Path) -> Result<Vec<Member>> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).context("cannot read the root Cargo.toml")?;
    let members = toml_string_array(&manifest, "members").context("the root Cargo.toml lists no members")?;
    let mut out = Vec::new();
    let mut names = BTreeSet::new();
    let mut parsed = Vec::new();
    for m in members {
        let dir = root.join(&m);
        let text = std::fs::read_to_string(dir.join("Cargo.toml"))
            .with_context(|| format!("cannot read {}", dir.join("Cargo.toml").display()))?;
        let name = package_name(&text).with_context(|| format!("{m}/Cargo.toml has no package name"))?;
        names.insert(name.clone());
        parsed.push((name, dir, text));
    }
    for (name, dir, text) in parsed {
        let deps = dependency_names(&text).into_iter().filter(|d| names.contains(d)).collect();
        out.push(Member { name, dir, deps });
    }
    Ok(out)
}

fn check_dependencies(crates: &[Member]) -> Result<()> {
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED_DEPENDENCIES.iter().copied().collect();
    let mut problems = Vec::new();
    for c in crates {
        let Some(ok) = allowed.get(c.name.as_str()) else {
            problems.push(format!("{} is not in xtask's ALLOWED_DEPENDENCIES: place it in the layering", c.name));
            continue;
        };
        for d in &c.deps {
            if !ok.contains(&d.as_str()) {
                problems.push(format!("{} depends on {d}, which the layering does not allow", c.name));
            }
        }
    }
    if !problems.is_empty() {
        bail!("crate dependencies break the layering:\n  {}", problems.join("\n  "));
    }
    Ok(())
}

/// The strings of `key = [ "…", … ]` (possibly over several lines) in a TOML text.
fn toml_string_array(text: &str, key: &str) -> Option<Vec<String>> {
    let start = text.lines().position(|l| l.trim_start().starts_with(key) && l.contains('['))?;
    let mut body = String::new();
    for line in text.lines().skip(start) {
        body.push_str(line.split('#').next().unwrap_or(""));
        if line.contains(']') {
            break;
        }
    }
    let inner = body.split_once('[')?.1.split(']').next()?;
    Some(inner.split(',').map(|s| s.trim().trim_matches('"').to_string()).filter(|s| !s.is_empty()).collect())
}

fn package_name(text: &str) -> Option<String> {
    let mut in_package = false;
    for line in text.lines() {
        let l = line.trim();
        if l.starts_with('[') {
            in_package = l == "[package]";
        } else if in_package && let Some(v) = l.strip_prefix("name") {
            return Some(v.trim_start().strip_prefix('=')?.trim().trim_matches('"').to_string());
        }
    }
    None
}

/// Keys of the `[dependencies]` and `[build-dependencies]` tables (dev-dependencies may point anywhere
/// below the tests' crate, and Cargo itself refuses cycles through them).
fn dependency_names(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_deps = false;
    for line in text.lines() {
        let l = line.trim();
        if l.starts_with('[') {
            in_deps = matches!(l, "[dependencies]" | "[build-dependencies]");
            continue;
        }
        if in_deps && !l.is_empty() && !l.starts_with('#') {
            let key = l.split(['=', '.']).next().unwrap_or("").trim().trim_matches('"');
            if !key.is_empty() {
                out.push(key.to_string());
            }
        }
    }
    out
}

/// A module's path in its crate: `[]` for the root, `["w4a8"]` for `w4a8/mod.rs` or `w4a8.rs`.
type Module = Vec<String>;

/// Where an edge is made: the line number and text of the first reference.
type Site = (usize, String);

/// The import graph of one crate's files.
#[derive(Debug, Default)]
pub struct Graph {
    /// The file of each module that is a file.
    files: BTreeMap<Module, PathBuf>,
    /// `from → to → site` of the first reference making the edge.
    edges: BTreeMap<Module, BTreeMap<Module, Site>>,
}

/// Builds the graph of the crate whose sources are under `src` (`lib.rs` or `main.rs` the root).
pub fn crate_graph(src: &Path) -> Result<Graph> {
    let mut sources = Vec::new();
    collect_rs(src, &mut sources)?;
    let mut graph = Graph::default();
    let mut texts = Vec::new();
    for path in sources {
        let rel = path.strip_prefix(src).expect("collected under src").to_path_buf();
        let Some(module) = module_of(&rel) else { continue };
        let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        graph.files.insert(module.clone(), rel);
        texts.push((module, text));
    }
    for (module, text) in &texts {
        for reference in references(module, text) {
            let Some(absolute) = graph.resolve(&reference.module, &reference.path) else { continue };
            let Some(target) = graph.file_for(&absolute) else { continue };
            if &target != module {
                graph
                    .edges
                    .entry(module.clone())
                    .or_default()
                    .entry(target)
                    .or_insert((reference.line, reference.text));
            }
        }
    }
    Ok(graph)
}

fn collect_rs(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("cannot list {}", dir.display()))?;
    entries.sort_by_key(|e| e.path());
    for e in entries {
        let path = e.path();
        if path.is_dir() {
            collect_rs(&path, out)?;
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// `lib.rs`/`main.rs` → root; `a/b.rs`, `a/b/mod.rs` → `[a, b]`; `bin/x.rs` is another crate (skipped).
fn module_of(rel: &Path) -> Option<Vec<String>> {
    let parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if parts.first().is_some_and(|p| p == "bin") {
        return None;
    }
    let (last, dirs) = parts.split_last()?;
    let stem = last.strip_suffix(".rs")?;
    let mut module = dirs.to_vec();
    match stem {
        "lib" | "main" if dirs.is_empty() => {}
        "mod" => {}
        _ => module.push(stem.to_string()),
    }
    Some(module)
}

impl Graph {
    fn resolve(&self, current: &[String], path: &[String]) -> Option<Vec<String>> {
        resolve(current, path, |m| self.files.contains_key(m))
    }

    /// The file defining the longest prefix of `path` that is a file's module.
    fn file_for(&self, path: &[String]) -> Option<Vec<String>> {
        (0..=path.len()).rev().map(|n| path[..n].to_vec()).find(|p| self.files.contains_key(p))
    }

    /// One cycle, as the files on it in order, if there is any.
    pub fn find_cycle(&self) -> Option<Vec<Vec<String>>> {
        // Iterative depth-first search with colours: 0 unvisited, 1 on the stack, 2 done.
        let mut colour: BTreeMap<&Vec<String>, u8> = BTreeMap::new();
        for start in self.files.keys() {
            if colour.get(start).copied().unwrap_or(0) != 0 {
                continue;
            }
            let mut stack: Vec<(&Vec<String>, Vec<&Vec<String>>)> = vec![(start, self.successors(start))];
            colour.insert(start, 1);
            while let Some((node, next)) = stack.last_mut() {
                let node = *node;
                match next.pop() {
                    Some(succ) => match colour.get(succ).copied().unwrap_or(0) {
                        0 => {
                            colour.insert(succ, 1);
                            let s = self.successors(succ);
                            stack.push((succ, s));
                        }
                        1 => {
                            let from = stack.iter().position(|(n, _)| *n == succ).expect("grey nodes are on the stack");
                            return Some(stack[from..].iter().map(|(n, _)| (*n).clone()).collect());
                        }
                        _ => {}
                    },
                    None => {
                        colour.insert(node, 2);
                        stack.pop();
                    }
                }
            }
        }
        None
    }

    fn successors(&self, node: &Vec<String>) -> Vec<&Vec<String>> {
        self.edges.get(node).map(|m| m.keys().collect()).unwrap_or_default()
    }

    /// `a.rs:12 (use crate::b::X) → b.rs:40 (…) → a.rs`.
    pub fn describe_cycle(&self, cycle: &[Vec<String>]) -> String {
        let mut parts = Vec::new();
        for (i, from) in cycle.iter().enumerate() {
            let to = &cycle[(i + 1) % cycle.len()];
            let (line, text) = &self.edges[from][to];
            parts.push(format!("{}:{line} `{text}`", self.files[from].display()));
        }
        format!("{} → back to {}", parts.join(" → "), self.files[&cycle[0]].display())
    }
}

/// A path a file names as written, the module it is named in, and where.
#[derive(Debug, PartialEq)]
struct Reference {
    module: Vec<String>,
    path: Vec<String>,
    line: usize,
    text: String,
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Ident(String),
    PathSep,
    Punct(char),
}

/// Tokens with their line numbers; comments, literals and lifetimes are dropped.
fn tokenize(text: &str) -> Vec<(Token, usize)> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let mut line = 1;
    let count_lines = |from: usize, to: usize, line: &mut usize| {
        *line += chars[from..to].iter().filter(|&&c| c == '\n').count();
    };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let start = i;
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            count_lines(start, i.min(chars.len()), &mut line);
        } else if c == '"' || ((c == 'b' || c == 'c') && next == Some('"')) {
            let start = i;
            i += if c == '"' { 1 } else { 2 };
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            count_lines(start, i.min(chars.len()), &mut line);
        } else if let Some(hashes) = raw_string_start(&chars, i) {
            let start = i;
            // Skip the prefix (`r`, `br`, `cr`), the hashes and the quote.
            while chars[i] != '"' {
                i += 1;
            }
            i += 1;
            let close: Vec<char> = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
            while i < chars.len() && !chars[i..].starts_with(&close) {
                i += 1;
            }
            i += close.len();
            count_lines(start, i.min(chars.len()), &mut line);
        } else if c == '\'' {
            // A char literal ('a', '\n', '\u{1F600}', '\'') or a lifetime / label ('a, 'static).
            if next == Some('\\') {
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
            }
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let word = word.strip_prefix("r#").map(str::to_string).unwrap_or(word);
            out.push((Token::Ident(word), line));
        } else if c.is_ascii_digit() {
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_' || chars[i] == '.') {
                // `1..n`: a range, not a float.
                if chars[i] == '.' && chars.get(i + 1) == Some(&'.') {
                    break;
                }
                i += 1;
            }
        } else if c == ':' && next == Some(':') {
            out.push((Token::PathSep, line));
            i += 2;
        } else {
            out.push((Token::Punct(c), line));
            i += 1;
        }
    }
    out
}

/// At a raw string literal (`r"…"`, `r#"…"#`, `br#"…"#`, `cr"…"`): how many `#`s it uses.
fn raw_string_start(chars: &[char], i: usize) -> Option<usize> {
    let mut j = i;
    if matches!(chars.get(j), Some('b' | 'c')) {
        j += 1;
    }
    if chars.get(j) != Some(&'r') || (j > 0 && j == i && i > 0 && is_ident_char(chars[i - 1])) {
        return None;
    }
    if i > 0 && is_ident_char(chars[i - 1]) {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while chars.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    (chars.get(j) == Some(&'"')).then_some(hashes)
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Every path of two or more segments the file at module `file` names (resolved later: most are external
/// crates or types).
fn references(file: &[String], text: &str) -> Vec<Reference> {
    let tokens = tokenize(text);
    let lines: Vec<&str> = text.lines().collect();
    let line_text = |n: usize| lines.get(n - 1).map_or(String::new(), |l| l.trim().to_string());
    let mut out = Vec::new();
    // Inline `mod name {` blocks: (name, brace depth inside the block).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < tokens.len() {
        let current: Vec<String> = file.iter().cloned().chain(inline.iter().map(|(n, _)| n.clone())).collect();
        match &tokens[i].0 {
            Token::Punct('{') => {
                depth += 1;
                i += 1;
            }
            Token::Punct('}') => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
                i += 1;
            }
            Token::Ident(w) if w == "mod" => {
                if let (Some((Token::Ident(name), _)), Some((Token::Punct('{'), _))) =
                    (tokens.get(i + 1), tokens.get(i + 2))
                {
                    depth += 1;
                    inline.push((name.clone(), depth));
                    i += 3;
                } else {
                    i += 1;
                }
            }
            Token::Ident(w) if w == "use" => {
                let line = tokens[i].1;
                let (paths, end) = use_tree(&tokens, i + 1);
                for path in paths {
                    out.push(Reference { module: current.clone(), path, line, text: line_text(line) });
                }
                i = end;
            }
            Token::Ident(w) if tokens.get(i + 1).is_some_and(|t| t.0 == Token::PathSep) => {
                // An expression, type or macro path: `crate::a::b`, `super::x`, `child::f`, `Vec::new`.
                let line = tokens[i].1;
                let preceded_by_sep = i > 0 && tokens[i - 1].0 == Token::PathSep;
                let mut segs = vec![w.clone()];
                let mut j = i + 1;
                while let (Some((Token::PathSep, _)), Some((Token::Ident(s), _))) = (tokens.get(j), tokens.get(j + 1)) {
                    segs.push(s.clone());
                    j += 2;
                }
                if !preceded_by_sep {
                    out.push(Reference { module: current, path: segs, line, text: line_text(line) });
                }
                i = j.max(i + 1);
            }
            _ => i += 1,
        }
    }
    out
}

/// The flat paths of a `use` tree starting at token `i`, and the index after its `;`.
fn use_tree(tokens: &[(Token, usize)], i: usize) -> (Vec<Vec<String>>, usize) {
    let mut out = Vec::new();
    let mut j = i;
    use_subtree(tokens, &mut j, &[], &mut out);
    while j < tokens.len() && tokens[j].0 != Token::Punct(';') {
        j += 1;
    }
    (out, j + 1)
}

/// One tree of a `use`: `a::b`, `a::b as c`, `a::*`, `a::{tree, tree}`, each pushed with `prefix`.
fn use_subtree(tokens: &[(Token, usize)], j: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    loop {
        match tokens.get(*j).map(|t| &t.0) {
            Some(Token::Ident(s)) if s == "as" => {
                *j += 2;
                out.push(path);
                return;
            }
            Some(Token::Ident(s)) => {
                path.push(s.clone());
                *j += 1;
            }
            Some(Token::PathSep) | Some(Token::Punct('*')) => *j += 1,
            Some(Token::Punct('{')) => {
                *j += 1;
                loop {
                    match tokens.get(*j).map(|t| &t.0) {
                        Some(Token::Punct('}')) => {
                            *j += 1;
                            return;
                        }
                        Some(Token::Punct(',')) => *j += 1,
                        None | Some(Token::Punct(';')) => return,
                        Some(_) => use_subtree(tokens, j, &path, out),
                    }
                }
            }
            _ => {
                out.push(path);
                return;
            }
        }
    }
}

/// `path`, named in module `current`, as an absolute module path: `crate::`, `self::` and `super::` paths,
/// and paths whose first segment is a child module of `current` that is a file (2018 edition `use
/// child::X`); `None` for anything else (external crates, types, variables).
fn resolve(current: &[String], path: &[String], is_file: impl Fn(&[String]) -> bool) -> Option<Vec<String>> {
    let first = path.first()?;
    let mut base: Vec<String> = match first.as_str() {
        "crate" => Vec::new(),
        "self" | "super" => current.to_vec(),
        _ => {
            let mut child = current.to_vec();
            child.push(first.clone());
            if !is_file(&child) {
                return None;
            }
            child.pop();
            let mut abs = child;
            abs.extend(path.iter().cloned());
            return Some(abs);
        }
    };
    let mut rest = &path[1..];
    if first == "super" {
        base.pop()?;
        while rest.first().is_some_and(|s| s == "super") {
            base.pop()?;
            rest = &rest[1..];
        }
    }
    // `use super::{self, x}` names the module itself.
    base.extend(rest.iter().filter(|s| *s != "self").cloned());
    Some(base)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(parts: &[&str]) -> Vec<String> {
        parts.iter().map(|s| s.to_string()).collect()
    }

    /// The resolved paths, with `a::child` the only file module besides those named by `crate::`.
    fn paths(file: &[&str], text: &str) -> Vec<Vec<String>> {
        let is_file = |m: &[String]| m == v(&["a", "child"]).as_slice();
        references(&v(file), text).into_iter().filter_map(|r| resolve(&r.module, &r.path, is_file)).collect()
    }

    #[test]
    fn use_trees_expand_nested_braces_aliases_and_globs() {
        let got = paths(&["a"], "use crate::{b::{C, d::E as F}, g};\nuse super::*;\nuse crate::h::I;");
        assert_eq!(got, vec![v(&["b", "C"]), v(&["b", "d", "E"]), v(&["g"]), v(&[]), v(&["h", "I"])]);
    }

    #[test]
    fn expression_paths_count_and_external_crates_do_not() {
        let got =
            paths(&["x", "y"], "fn f() { crate::k::run(); std::mem::drop(1); super::z::Z::new(); int4_layout::a(); }");
        assert_eq!(got, vec![v(&["k", "run"]), v(&["x", "z", "Z", "new"])]);
    }

    #[test]
    fn comments_strings_and_char_literals_are_not_code() {
        let text = r####"
            // use crate::a;
            /* use crate::b; /* nested */ use crate::c; */
            /// [`crate::d`]
            const S: &str = "crate::e";
            const R: &str = r#"crate::f "quoted""#;
            const C: char = '"';
            fn g<'a>(x: &'a str) -> char { '\'' }
            use crate::real;
        "####;
        let refs = references(&v(&["m"]), text);
        assert_eq!(refs.iter().map(|r| r.path.clone()).collect::<Vec<_>>(), vec![v(&["crate", "real"])]);
        assert_eq!(refs[0].line, 9, "line numbers survive multi-line comments and strings");
    }

    #[test]
    fn a_path_through_a_child_file_module_is_relative() {
        let got = paths(&["a"], "pub use child::X;\nfn f() { child::g(); other::h(); }");
        assert_eq!(got, vec![v(&["a", "child", "X"]), v(&["a", "child", "g"])]);
    }

    #[test]
    fn super_inside_an_inline_module_is_the_file_itself() {
        let got = paths(
            &["a"],
            "fn x() {}\n#[cfg(test)]\nmod tests {\n use super::*;\n use super::super::b;\n}\nuse self::c::D;",
        );
        assert_eq!(got, vec![v(&["a"]), v(&["b"]), v(&["a", "c", "D"])]);
    }

    #[test]
    fn module_paths_of_files() {
        assert_eq!(module_of(Path::new("lib.rs")), Some(vec![]));
        assert_eq!(module_of(Path::new("w4a8/mod.rs")), Some(v(&["w4a8"])));
        assert_eq!(module_of(Path::new("x86_64/w4a8.rs")), Some(v(&["x86_64", "w4a8"])));
        assert_eq!(module_of(Path::new("bin/tool.rs")), None);
    }

    fn graph(files: &[(&[&str], &str)]) -> Graph {
        let dir = std::env::temp_dir().join(format!("xtask-imports-{}-{}", std::process::id(), files.len()));
        let _ = std::fs::remove_dir_all(&dir);
        for (module, text) in files {
            let rel: PathBuf = if module.is_empty() {
                "lib.rs".into()
            } else {
                let mut p: PathBuf = module.iter().collect();
                p.set_extension("rs");
                p
            };
            std::fs::create_dir_all(dir.join(&rel).parent().unwrap()).unwrap();
            std::fs::write(dir.join(rel), text).unwrap();
        }
        let g = crate_graph(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        g
    }

    #[test]
    fn a_cycle_through_three_files_is_found_and_named() {
        let g = graph(&[
            (&[], "mod a; mod b; mod c;"),
            (&["a"], "use crate::b::B;"),
            (&["b"], "pub struct B;\nfn f() { crate::c::g() }"),
            (&["c"], "pub fn g() {}\nuse crate::a;"),
        ]);
        let cycle = g.find_cycle().expect("a → b → c → a");
        assert_eq!(cycle.len(), 3);
        let text = g.describe_cycle(&cycle);
        assert!(text.contains("a.rs:1 `use crate::b::B;`") && text.contains("c.rs:2 `use crate::a;`"), "{text}");
    }

    #[test]
    fn a_layered_crate_has_no_cycle_and_a_root_reexport_is_an_edge() {
        let g =
            graph(&[(&[], "mod a; mod b;\npub use b::B;"), (&["a"], "use crate::b::B;"), (&["b"], "pub struct B;")]);
        assert!(g.find_cycle().is_none());
        let back = graph(&[(&[], "mod b;\npub use b::B;\npub struct R;"), (&["b"], "pub struct B;\nuse crate::R;")]);
        assert!(back.find_cycle().is_some(), "b uses the root, which re-exports b");
    }

    #[test]
    fn dependency_tables_are_read_and_checked() {
        let toml = "[package]\nname = \"int4-gguf\"\n[dependencies]\nint4-layout.workspace = true\nhalf = \"2\"\n\
                    [dev-dependencies]\nint4-kernels.workspace = true\n";
        assert_eq!(package_name(toml).as_deref(), Some("int4-gguf"));
        assert_eq!(dependency_names(toml), vec!["int4-layout", "half"]);
        let ok = Member { name: "int4-gguf".into(), dir: PathBuf::new(), deps: vec!["int4-layout".into()] };
        assert!(check_dependencies(&[ok]).is_ok());
        let up = Member { name: "int4-gguf".into(), dir: PathBuf::new(), deps: vec!["int4".into()] };
        let err = check_dependencies(&[up]).unwrap_err().to_string();
        assert!(err.contains("int4-gguf depends on int4"), "{err}");
        let unknown = Member { name: "int4-new".into(), dir: PathBuf::new(), deps: vec![] };
        assert!(
            check_dependencies(&[unknown]).unwrap_err().to_string().contains("not in xtask's ALLOWED_DEPENDENCIES")
        );
    }

    #[test]
    fn the_kernel_crates_graph_has_its_known_edges() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/int4-kernels/src");
        let g = crate_graph(&src).unwrap();
        let edge = |from: &[&str], to: &[&str]| g.edges.get(&v(from)).is_some_and(|m| m.contains_key(&v(to)));
        // `use crate::w4a8::block::Block` from a sibling tree, `use crate::tile::…`, and the root's
        // `pub use error::…` through a child module named without `crate::`.
        assert!(edge(&["x86_64", "w4a8"], &["w4a8", "block"]));
        assert!(edge(&["w4a16"], &["tile"]));
        assert!(edge(&[], &["error"]));
        assert!(!edge(&["tile"], &["x86_64", "amx"]), "the tile interface does not know the hardware unit");
    }

    #[test]
    fn this_workspace_passes() {
        lint(Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()).unwrap();
    }
}
