//! The shape of the code where no other tool looks (issue 30's measures,
//! cut by issue 37 to what neither clippy nor a duplicate finder checks),
//! read from the sources' tokens: proc-macro2, the tokenizer syn uses, so
//! comments and the insides of string literals never read as code.
//!
//! Covers: SPEC §3.
//!
//! (§3 for the second check: the tests read the objects of §3 only through
//! their typed mirrors. The first checks no section of the contract: it
//! keeps the code one a maintainer can carry on.)
//!
//! 1. **No import circle between modules** ([`no_import_circle_between_modules`]).
//!    The module tree is walked from `src/lib.rs` along its `mod NAME;`
//!    declarations to `NAME.rs` or `NAME/mod.rs`: whatever their `#[cfg]`
//!    (`unix.rs` and `windows.rs` are both walked on any host), inside inline
//!    modules too, and those a `macro_rules!` of the crate spells (`per_os!()`
//!    declares the `mod unix;` and `mod windows;` its definition names). A
//!    `#[path]` would be followed; src/ has none. A file is one node, its
//!    inline modules part of it; the code of `#[cfg(test)]` modules, inline
//!    or in files of their own, is left out. An edge goes from a module to
//!    every module a path in its code names: `crate::a::b`, `super::…` and
//!    `self::…`, in a `use` (braces expanded), in code, in a macro's
//!    arguments or in a `macro_rules!` body (counted where it is written),
//!    resolved to the deepest module the path reaches. The rule:
//!    for every module P, collapse each child's subtree into that child and
//!    draw the edges between P's children (a reference from anywhere under
//!    child A to anywhere under child B is A → B); that sibling graph must
//!    have no cycle. A module's use of its parent's items, and a parent's
//!    `mod`/`pub use` of its own children, are thus never circles; two
//!    siblings that each reach into the other are. A failure names each
//!    cycle with one reference per edge (file:line).
//! 2. **The tests read no reply field raw outside the harness**
//!    ([`tests_read_no_reply_field_raw_outside_the_harness`]). In every
//!    `tests/integration/**/*.rs` but `harness.rs`, `harness/**` and this
//!    file, no code (a macro's arguments included) indexes a value by a name
//!    (`v["holder"]`), calls `.get("…")` or `.pointer(…)`, nor uses
//!    `serde_json::Value`'s own readers `.as_u64()`, `.as_i64()`,
//!    `.as_f64()`, `.as_bool()`, `.as_array()`, `.as_object()`,
//!    `.is_null()`. A failure counts the reads per file, with the first's line.
//!
//! Not here: a block repeated in `src/` is a duplicate finder's to find; a
//! function over 70 lines is clippy's `too_many_lines`
//! (`too-many-lines-threshold = 70` in `clippy.toml`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{Delimiter, Group, Spacing, TokenStream, TokenTree};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Prints `findings` under `title` and fails when there are any.
fn verdict(title: &str, findings: &[String]) {
    for f in findings {
        println!("{f}");
    }
    assert!(
        findings.is_empty(),
        "{title}: {} finding(s), printed above (run with --nocapture)",
        findings.len()
    );
}

// ---------------------------------------------------------------- tokens

/// The tokens of `text` (comments dropped, literals whole).
fn lex(text: &str) -> Vec<TokenTree> {
    let stream: TokenStream = text.parse().unwrap_or_else(|e| panic!("{e:?}"));
    stream.into_iter().collect()
}

/// The tokens of the file `path`.
fn lex_file(path: &Path) -> Vec<TokenTree> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let stream: TokenStream = text
        .parse()
        .unwrap_or_else(|e| panic!("{}: {e:?}", path.display()));
    stream.into_iter().collect()
}

fn ident_is(t: Option<&TokenTree>, name: &str) -> bool {
    matches!(t, Some(TokenTree::Ident(i)) if i == name)
}

fn punct_is(t: Option<&TokenTree>, c: char) -> bool {
    matches!(t, Some(TokenTree::Punct(p)) if p.as_char() == c)
}

fn group_of(t: Option<&TokenTree>, d: Delimiter) -> Option<&Group> {
    match t {
        Some(TokenTree::Group(g)) if g.delimiter() == d => Some(g),
        _ => None,
    }
}

fn inside(g: &Group) -> Vec<TokenTree> {
    g.stream().into_iter().collect()
}

/// Is `tts[i..]` a `::`?
fn path_sep(tts: &[TokenTree], i: usize) -> bool {
    matches!(tts.get(i), Some(TokenTree::Punct(p)) if p.as_char() == ':' && p.spacing() == Spacing::Joint)
        && punct_is(tts.get(i + 1), ':')
}

fn line(t: &TokenTree) -> usize {
    t.span().start().line
}

// ------------------------------------------------------ 1. the module graph

/// A `mod NAME;` a file declares, inside the inline modules `inline`.
struct Decl {
    inline: Vec<String>,
    name: String,
    test: bool,
    path_attr: Option<String>,
}

/// A path `crate::…`, `super::…` or `self::…` in code, inside `depth`
/// inline modules, at `line`.
struct Named {
    depth: usize,
    segs: Vec<String>,
    line: usize,
}

/// What one file's tokens hold.
#[derive(Default)]
struct Scan {
    mods: Vec<Decl>,
    paths: Vec<Named>,
}

/// Reads `tts` (the items of a file or an inline module `inline`, test
/// code when `test`) into `out`; `macros` are the crate's `macro_rules!`
/// seen so far, each with the modules it declares.
fn scan(
    tts: &[TokenTree],
    inline: &mut Vec<String>,
    test: bool,
    macros: &mut BTreeMap<String, Vec<String>>,
    out: &mut Scan,
) {
    let mut attrs: Vec<String> = Vec::new();
    let mut i = 0;
    while i < tts.len() {
        let tt = &tts[i];
        let marked_test = test || attrs.iter().any(|a| a.replace(' ', "") == "cfg(test)");
        if let (true, Some(g)) = (
            punct_is(Some(tt), '#'),
            group_of(tts.get(i + 1), Delimiter::Bracket),
        ) {
            attrs.push(g.stream().to_string());
            i += 2;
            continue;
        }
        if let (true, Some(TokenTree::Ident(name))) = (ident_is(Some(tt), "mod"), tts.get(i + 1)) {
            if punct_is(tts.get(i + 2), ';') {
                let path_attr = attrs.iter().find_map(|a| {
                    let p = a.strip_prefix("path = \"")?.strip_suffix('"')?;
                    Some(p.to_owned())
                });
                out.mods.push(Decl {
                    inline: inline.clone(),
                    name: name.to_string(),
                    test: marked_test,
                    path_attr,
                });
            } else if let Some(g) = group_of(tts.get(i + 2), Delimiter::Brace) {
                inline.push(name.to_string());
                scan(&inside(g), inline, marked_test, macros, out);
                inline.pop();
            }
            attrs.clear();
            i += 3;
            continue;
        }
        if ident_is(Some(tt), "macro_rules")
            && punct_is(tts.get(i + 1), '!')
            && let (Some(TokenTree::Ident(name)), Some(TokenTree::Group(body))) =
                (tts.get(i + 2), tts.get(i + 3))
        {
            let body = inside(body);
            macros.insert(name.to_string(), mods_spelled(&body));
            // Its paths count where it is written (its `mod`s where it expands).
            let mut spelled = Scan::default();
            scan(&body, inline, marked_test, macros, &mut spelled);
            out.paths.extend(spelled.paths);
            attrs.clear();
            i += 4;
            continue;
        }
        match tt {
            TokenTree::Ident(name) if punct_is(tts.get(i + 1), '!') => {
                for m in macros.get(&name.to_string()).into_iter().flatten() {
                    out.mods.push(Decl {
                        inline: inline.clone(),
                        name: m.clone(),
                        test: marked_test,
                        path_attr: None,
                    });
                }
            }
            TokenTree::Ident(id)
                if (id == "crate" || id == "super" || id == "self")
                    && path_sep(tts, i + 1)
                    && !(i > 0 && punct_is(tts.get(i - 1), '$')) =>
            {
                let (paths, end) = path_tree(tts, i);
                if !test {
                    out.paths.extend(paths.into_iter().map(|segs| Named {
                        depth: inline.len(),
                        segs,
                        line: line(tt),
                    }));
                }
                i = end;
                continue;
            }
            TokenTree::Group(g) => {
                scan(&inside(g), inline, test, macros, out);
                if g.delimiter() == Delimiter::Brace {
                    attrs.clear();
                }
            }
            TokenTree::Punct(p) if p.as_char() == ';' => attrs.clear(),
            _ => {}
        }
        i += 1;
    }
}

/// The `mod NAME;` a macro's rules spell (`$`-names left out).
fn mods_spelled(tts: &[TokenTree]) -> Vec<String> {
    let mut out = Vec::new();
    for (i, tt) in tts.iter().enumerate() {
        match (tt, tts.get(i + 1)) {
            (TokenTree::Group(g), _) => out.extend(mods_spelled(&inside(g))),
            (TokenTree::Ident(m), Some(TokenTree::Ident(name)))
                if m == "mod" && punct_is(tts.get(i + 2), ';') =>
            {
                out.push(name.to_string());
            }
            _ => {}
        }
    }
    out
}

/// The paths of the path or `use` tree starting at `tts[i]`, braces
/// expanded, as segment lists; and the index after it.
fn path_tree(tts: &[TokenTree], mut i: usize) -> (Vec<Vec<String>>, usize) {
    let mut prefix = Vec::new();
    while let Some(TokenTree::Ident(seg)) = tts.get(i) {
        prefix.push(seg.to_string());
        i += 1;
        if !path_sep(tts, i) {
            break;
        }
        i += 2;
        if let Some(g) = group_of(tts.get(i), Delimiter::Brace) {
            let items = inside(g);
            let paths = items
                .split(|t| punct_is(Some(t), ','))
                .flat_map(|item| path_tree(item, 0).0)
                .map(|p| prefix.iter().cloned().chain(p).collect())
                .collect();
            return (paths, i + 1);
        }
    }
    (vec![prefix], i)
}

/// One module of `src/`: its file, whether it is test code, what it names.
struct Module {
    file: PathBuf,
    test: bool,
    paths: Vec<Named>,
}

/// The modules of `src/` (a directory holding `lib.rs`), by module path
/// (`crate::store::etcd`).
fn module_tree(src: &Path) -> BTreeMap<String, Module> {
    let mut tree = BTreeMap::new();
    let mut macros = BTreeMap::new();
    let mut todo = vec![("crate".to_owned(), src.join("lib.rs"), false)];
    while let Some((module, file, test)) = todo.pop() {
        let mut found = Scan::default();
        scan(
            &lex_file(&file),
            &mut Vec::new(),
            test,
            &mut macros,
            &mut found,
        );
        let parent = file.parent().unwrap().to_path_buf();
        let stem = file.file_stem().unwrap().to_string_lossy().into_owned();
        let dir = if ["lib", "main", "mod"].contains(&stem.as_str()) {
            parent.clone()
        } else {
            parent.join(&stem)
        };
        for d in found.mods {
            let base = d.inline.iter().fold(dir.clone(), |b, m| b.join(m));
            let child = match d.path_attr {
                Some(p) => parent.join(p),
                None if base.join(format!("{}.rs", d.name)).is_file() => {
                    base.join(format!("{}.rs", d.name))
                }
                None => base.join(&d.name).join("mod.rs"),
            };
            let path = [module.as_str()]
                .into_iter()
                .chain(d.inline.iter().map(String::as_str))
                .chain([d.name.as_str()])
                .collect::<Vec<_>>()
                .join("::");
            todo.push((path, child, d.test));
        }
        let paths = found.paths;
        tree.insert(module, Module { file, test, paths });
    }
    tree
}

/// The deepest module `path` (as written in `module`, inside `inline`
/// inline modules) reaches; `None` for `self`/`super` that stay in the file.
fn resolve(
    module: &str,
    inline: usize,
    path: &[String],
    modules: &BTreeSet<&str>,
) -> Option<String> {
    let mut segs: Vec<&str> = module.split("::").collect();
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            segs = vec!["crate"];
            rest = &rest[1..];
        }
        Some("self") if inline > 0 => return None,
        Some("self") => rest = &rest[1..],
        Some("super") => {
            let supers = rest.iter().take_while(|s| *s == "super").count();
            if supers <= inline {
                return None;
            }
            segs.truncate(segs.len().saturating_sub(supers - inline));
            rest = &rest[supers..];
        }
        _ => return None,
    }
    let mut at = segs.join("::");
    for s in rest {
        let deeper = format!("{at}::{s}");
        if !modules.contains(deeper.as_str()) {
            break;
        }
        at = deeper;
    }
    Some(at)
}

/// One reference: from module, to module, where (file:line).
struct Reference {
    from: String,
    to: String,
    at: String,
}

/// Every reference from a module of `tree` that is not test code.
fn references(tree: &BTreeMap<String, Module>) -> Vec<Reference> {
    let modules: BTreeSet<&str> = tree.keys().map(String::as_str).collect();
    let mut out = Vec::new();
    for (module, m) in tree.iter().filter(|(_, m)| !m.test) {
        let rel = m
            .file
            .strip_prefix(root())
            .unwrap_or(&m.file)
            .display()
            .to_string();
        for p in &m.paths {
            if let Some(to) = resolve(module, p.depth, &p.segs, &modules) {
                out.push(Reference {
                    from: module.clone(),
                    to,
                    at: format!("{rel}:{}", p.line),
                });
            }
        }
    }
    out
}

/// The child of `parent` whose subtree holds `module`, if any.
fn child_of<'a>(parent: &str, module: &'a str) -> Option<&'a str> {
    let rest = module.strip_prefix(parent)?.strip_prefix("::")?;
    let name = rest.split("::").next()?;
    Some(&module[..parent.len() + 2 + name.len()])
}

/// The edges between `parent`'s children: child → child → the references
/// that make the edge.
type Siblings<'a> = BTreeMap<&'a str, BTreeMap<&'a str, Vec<&'a str>>>;

/// Every elementary cycle of every sibling graph, each as `a -> b -> a`
/// with the first reference of each edge and how many there are.
fn sibling_cycles<'a>(parents: impl Iterator<Item = &'a str>, refs: &[Reference]) -> Vec<String> {
    let mut found = Vec::new();
    for parent in parents {
        let mut edges: Siblings = BTreeMap::new();
        for r in refs {
            let (Some(a), Some(b)) = (child_of(parent, &r.from), child_of(parent, &r.to)) else {
                continue;
            };
            if a != b {
                edges
                    .entry(a)
                    .or_default()
                    .entry(b)
                    .or_default()
                    .push(&r.at);
            }
        }
        for cycle in elementary_cycles(&edges) {
            let mut text = format!("import circle under {parent}: {}", cycle.join(" -> "));
            for pair in cycle.windows(2) {
                let at = &edges[pair[0]][pair[1]];
                text.push_str(&format!(
                    "\n    {} -> {}: {} reference(s), first at {}",
                    pair[0],
                    pair[1],
                    at.len(),
                    at[0]
                ));
            }
            found.push(text);
        }
    }
    found
}

/// Every elementary cycle of `edges`, each starting (and ending) at its
/// smallest node: a depth-first search from each node through larger ones
/// (the graphs are a handful of modules).
fn elementary_cycles<'a>(edges: &Siblings<'a>) -> Vec<Vec<&'a str>> {
    fn walk<'a>(
        start: &'a str,
        path: &mut Vec<&'a str>,
        edges: &Siblings<'a>,
        out: &mut Vec<Vec<&'a str>>,
    ) {
        let last = *path.last().unwrap();
        for &next in edges.get(last).into_iter().flat_map(BTreeMap::keys) {
            if next == start {
                let mut cycle = path.clone();
                cycle.push(start);
                out.push(cycle);
            } else if next > start && !path.contains(&next) {
                path.push(next);
                walk(start, path, edges, out);
                path.pop();
            }
        }
    }
    let mut out = Vec::new();
    for &start in edges.keys() {
        walk(start, &mut vec![start], edges, &mut out);
    }
    out
}

#[test]
fn no_import_circle_between_modules() {
    let tree = module_tree(&root().join("src"));
    let refs = references(&tree);
    verdict(
        "import circles",
        &sibling_cycles(tree.keys().map(String::as_str), &refs),
    );
}

/// The module walk reaches every file of `src/` (but the binary's
/// `main.rs`), the per-OS ones of both platforms among them, so no file
/// escapes the import check.
#[test]
fn the_module_walk_reaches_every_source_file() {
    let src = root().join("src");
    let tree = module_tree(&src);
    let walked: BTreeSet<&PathBuf> = tree.values().map(|m| &m.file).collect();
    let missing: Vec<PathBuf> = rust_files(&src)
        .into_iter()
        .filter(|f| *f != src.join("main.rs") && !walked.contains(f))
        .collect();
    assert!(
        missing.is_empty(),
        "not reached from src/lib.rs: {missing:?}"
    );
    for os in ["::unix", "::windows"] {
        assert!(
            tree.keys().any(|m| m.ends_with(os)),
            "no {os} module walked"
        );
    }
}

/// The walk follows every kind of `mod` (cfg'd, in an inline module, from
/// a crate macro, `#[path]`) and leaves test modules' code out.
#[test]
fn the_module_walk_follows_every_kind_of_mod() {
    let dir = tempfile::tempdir().unwrap();
    let files = [
        (
            "lib.rs",
            "macro_rules! per_os { ($($v:tt)*) => { #[cfg(unix)] $($v)* mod unix;\n\
             #[cfg(windows)] $($v)* mod windows; }; }\n\
             mod a;\n#[cfg(windows)]\npub(crate) mod w;\n#[path = \"elsewhere.rs\"] mod p;\n\
             #[cfg(test)]\nmod tests;\n",
        ),
        (
            "a/mod.rs",
            "per_os!();\nmod inner {\n    pub mod deep;\n}\n",
        ),
        ("a/unix.rs", "use crate::w;"),
        ("a/windows.rs", ""),
        ("a/inner/deep.rs", "use super::super::unix;"),
        ("w.rs", ""),
        ("elsewhere.rs", ""),
        ("tests.rs", "use crate::a; use crate::w;"),
    ];
    for (name, text) in files {
        let path = dir.path().join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    let tree = module_tree(dir.path());
    let names: Vec<&str> = tree.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "crate",
            "crate::a",
            "crate::a::inner::deep",
            "crate::a::unix",
            "crate::a::windows",
            "crate::p",
            "crate::tests",
            "crate::w"
        ]
    );
    let refs: Vec<String> = references(&tree)
        .iter()
        .map(|r| format!("{} -> {}", r.from, r.to))
        .collect();
    assert_eq!(
        refs,
        [
            "crate::a::inner::deep -> crate::a::unix",
            "crate::a::unix -> crate::w"
        ]
    );
}

/// The checker finds a circle it is shown, and none where there is none;
/// paths are read from use trees, code and macro arguments, never from
/// comments, strings or test modules.
#[test]
fn the_circle_check_finds_a_planted_circle() {
    let parents = ["crate", "crate::a", "crate::b", "crate::c"];
    let r = |from: &str, to: &str| Reference {
        from: from.into(),
        to: to.into(),
        at: format!("{from}->{to}"),
    };
    // A child using its parent, and a parent its child: no circle.
    let fine = [
        r("crate::a::x", "crate::a"),
        r("crate::a", "crate::a::x"),
        r("crate::a", "crate::b"),
    ];
    assert!(sibling_cycles(parents.into_iter(), &fine).is_empty());
    let circle = [
        r("crate::a::x", "crate::b"),
        r("crate::b", "crate::c"),
        r("crate::c", "crate::a"),
    ];
    let found = sibling_cycles(parents.into_iter(), &circle);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0]
            .starts_with("import circle under crate: crate::a -> crate::b -> crate::c -> crate::a"),
        "{}",
        found[0]
    );
    let mut found = Scan::default();
    let code = "use crate::{a::x, b};\n// crate::c\nlet s = \"crate::c\";\n\
                f!(super::super::d::g());\n$crate::e::h();\n\
                macro_rules! m { () => { mod n; crate::f::i() }; }\n\
                #[cfg(test)]\nmod tests {\n    use crate::c;\n}\n";
    scan(
        &lex(code),
        &mut Vec::new(),
        false,
        &mut BTreeMap::new(),
        &mut found,
    );
    let paths: Vec<(Vec<&str>, usize)> = found
        .paths
        .iter()
        .map(|p| (p.segs.iter().map(String::as_str).collect(), p.line))
        .collect();
    assert_eq!(
        paths,
        [
            (vec!["crate", "a", "x"], 1),
            (vec!["crate", "b"], 1),
            (vec!["super", "super", "d", "g"], 4),
            (vec!["crate", "f", "i"], 6)
        ]
    );
}

// ------------------------------------------------- 2. raw reply reads

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The lines of the raw JSON reads in `tts` and every group inside it.
fn raw_reads(tts: &[TokenTree], out: &mut Vec<usize>) {
    const READERS: [&str; 7] = [
        "as_u64",
        "as_i64",
        "as_f64",
        "as_bool",
        "as_array",
        "as_object",
        "is_null",
    ];
    for (i, tt) in tts.iter().enumerate() {
        let prev = i.checked_sub(1).map(|k| &tts[k]);
        let args = group_of(tts.get(i + 1), Delimiter::Parenthesis).map(inside);
        let read = match tt {
            TokenTree::Group(g) => {
                let items = inside(g);
                raw_reads(&items, out);
                // An index follows a value (a name, `)` or `]`); `["x"]`
                // after `(`, `&`, `,` or a keyword is an array literal.
                let indexes = match prev {
                    Some(TokenTree::Ident(k)) => !["in", "return", "break", "match", "if", "while"]
                        .contains(&k.to_string().as_str()),
                    Some(TokenTree::Group(p)) => p.delimiter() != Delimiter::Brace,
                    _ => false,
                };
                g.delimiter() == Delimiter::Bracket && indexes && name_literal(&items)
            }
            TokenTree::Ident(m) if punct_is(prev, '.') => match (m.to_string().as_str(), args) {
                ("get", Some(a)) => {
                    matches!(a.first(), Some(TokenTree::Literal(l)) if l.to_string().starts_with('"'))
                }
                ("pointer", Some(_)) => true,
                (name, Some(a)) => a.is_empty() && READERS.contains(&name),
                _ => false,
            },
            _ => false,
        };
        if read {
            out.push(line(tt));
        }
    }
}

/// Are `items` one string literal spelling a name (`"holder"`)?
fn name_literal(items: &[TokenTree]) -> bool {
    let [TokenTree::Literal(l)] = items else {
        return false;
    };
    let text = l.to_string();
    text.strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .is_some_and(|t| !t.is_empty() && t.chars().all(|c| c.is_alphanumeric() || c == '_'))
}

#[test]
fn tests_read_no_reply_field_raw_outside_the_harness() {
    let dir = root().join("tests/integration");
    let mut findings = Vec::new();
    let mut total = 0;
    for f in rust_files(&dir) {
        let rel = f.strip_prefix(&dir).unwrap().display().to_string();
        if rel == "harness.rs" || rel.starts_with("harness/") || rel == "shape.rs" {
            continue;
        }
        let mut reads = Vec::new();
        raw_reads(&lex_file(&f), &mut reads);
        if let Some(first) = reads.first() {
            total += reads.len();
            findings.push(format!(
                "{rel}: {} raw reads, first at line {first}",
                reads.len()
            ));
        }
    }
    if total > 0 {
        findings.push(format!("total: {total} raw reads"));
    }
    verdict("raw reply reads", &findings);
}

/// The raw-read patterns count what they should and nothing else.
#[test]
fn the_raw_read_patterns_count_what_they_should() {
    let count = |code: &str| {
        let mut reads = Vec::new();
        raw_reads(&lex(code), &mut reads);
        reads.len()
    };
    assert_eq!(count(r#"assert_eq!(v["holder"]["fence"], 1);"#), 2);
    assert_eq!(
        count(r#"let t = v.get("token").and_then(|t| t.as_str());"#),
        1
    );
    assert_eq!(
        count("let n = v.as_u64().unwrap() + w.as_array().len();"),
        2
    );
    assert_eq!(count("let p = v.pointer(\"/holder/fence\");"), 1);
    assert_eq!(
        count("// v[\"holder\"] in a comment\nlet s = \"v.as_u64()\";"),
        0
    );
    // Array literals of one word are not reads.
    assert_eq!(
        count(r#"lock.op("run").command(["true"]); git(&["prune"]); for a in ["x"] {}"#),
        0
    );
    assert_eq!(
        count(r#"let lock = Lock::new(&cwd, "s", "o/r"); a[0]; m["x y"]; m.get(0);"#),
        0
    );
}
