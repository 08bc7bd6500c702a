//! The shape of the code (issue 30, "measures that must hold"), checked by
//! reading the sources as text: no new dependency, no compiler plugin.
//!
//! Covers: SPEC §3.
//!
//! (§3 for the third check: the tests read the objects of §3 only through
//! their typed mirrors. The others check no section of the contract: they
//! keep the code one a maintainer can carry on.)
//!
//! 1. **No import circle between modules** ([`no_import_circle_between_modules`]).
//!    The module tree is walked from `src/lib.rs` along its `mod NAME;`
//!    declarations (`#[path]` ones too, so a platform's file joins the module
//!    it stands for: `run/windows.rs` is `run` on Windows); a file is one
//!    node, its inline modules part of it, except `#[cfg(test)]` ones, whose
//!    code is left out. An edge goes from a module to every module a path
//!    in its code names: `crate::a::b`, `super::…` and `self::…`, in a `use`
//!    (braces expanded) or written out in code, resolved to the deepest
//!    module the path reaches (comments and string literals are not code).
//!    The rule: for every module P, collapse each child's subtree into that
//!    child and draw the edges between P's children (a reference from
//!    anywhere under child A to anywhere under child B is A → B); that
//!    sibling graph must have no cycle. A module's use of its parent's
//!    items, and a parent's `mod`/`pub use` of its own children, are thus
//!    never circles; two siblings that each reach into the other are. A
//!    failure names each cycle with one reference per edge (file:line).
//! 2. **No block of six or more lines repeated in `src/`**
//!    ([`no_block_of_six_lines_repeated_in_src`]). Lines are compared with
//!    their whitespace collapsed; blank lines, comment-only lines and lines
//!    of nothing but brackets and punctuation (`}`, `)`, `});`, `]`, `{`)
//!    are skipped. Six such lines in a row that appear twice are a repeated
//!    block, reported with file:line of each copy (a longer run of repeated
//!    lines is one block). Left out: the generated `src/store/etcd/proto.rs`,
//!    and deliberate mirrors: a comment line `// mirror: <why>` exempts the
//!    lines after it up to the next blank line.
//! 3. **The tests read no reply field raw outside the harness**
//!    ([`tests_read_no_reply_field_raw_outside_the_harness`]). In every
//!    `tests/integration/*.rs` but `harness.rs`, `harness/**` and this file
//!    (whose patterns would match themselves), a code line (comments
//!    skipped) must not index JSON by a string (`v["holder"]`, `["fence"]`),
//!    call `.get("…")` or `.pointer(`, nor use `serde_json::Value`'s own
//!    readers `.as_u64()`, `.as_i64()`, `.as_f64()`, `.as_bool()`,
//!    `.as_array()`, `.as_object()`, `.is_null()`. A failure counts the
//!    reads per file.
//! 4. **No function over 70 lines outside tests**: already enforced by
//!    clippy's `too_many_lines` with `too-many-lines-threshold = 70` in
//!    `clippy.toml` (`cargo clippy --all-targets -- -D warnings`); not
//!    checked again here.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

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

// ---------------------------------------------------------------- the lexer

/// `text` with comments and the contents of string and char literals
/// blanked (replaced by spaces, newlines kept), so lines keep their numbers
/// and no path in a comment or a message reads as code.
fn code_only(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(b[i]));
                    i += 1;
                }
            }
        } else if let Some(hashes) = raw_string_start(&b, i) {
            // r"..." / r#"..."# (and br): up to the quote and as many #.
            let open = i + b[i..].iter().position(|&c| c == '"').unwrap_or(0);
            out.extend(std::iter::repeat_n(' ', open + 1 - i));
            i = open + 1;
            while i < b.len() {
                let closes = b[i] == '"' && (0..hashes).all(|k| b.get(i + 1 + k) == Some(&'#'));
                if closes {
                    out.extend(std::iter::repeat_n(' ', hashes + 1));
                    i += hashes + 1;
                    break;
                }
                out.push(blank(b[i]));
                i += 1;
            }
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < b.len() {
                    out.push(blank(b[i]));
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' && next == Some('\\') {
            // '\n', '\'', '\u{..}'
            let end = if b.get(i + 2) == Some(&'\'') && b.get(i + 3) == Some(&'\'') {
                i + 3
            } else {
                (i + 2..b.len())
                    .find(|&k| b[k] == '\'')
                    .unwrap_or(b.len() - 1)
            };
            out.extend(std::iter::repeat_n(' ', end + 1 - i));
            i = end + 1;
        } else if c == '\'' && b.get(i + 2) == Some(&'\'') {
            out.push_str("   ");
            i += 3;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// At `i` a raw string starts (`r"`, `r#`, `br"`, `br#`, not part of a
/// longer identifier): its number of `#`.
fn raw_string_start(b: &[char], i: usize) -> Option<usize> {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    if i > 0 && ident(b[i - 1]) {
        return None;
    }
    let mut j = i;
    if b.get(j) == Some(&'b') {
        j += 1;
    }
    if b.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let hashes = b[j..].iter().take_while(|&&c| c == '#').count();
    (b.get(j + hashes) == Some(&'"')).then_some(hashes)
}

// ------------------------------------------------------ 1. the module graph

/// The modules of `src/`: module path (`crate::store::etcd`) → its files.
fn module_tree(src: &Path) -> BTreeMap<String, Vec<PathBuf>> {
    let mut tree: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    let mut todo = vec![("crate".to_owned(), src.join("lib.rs"))];
    while let Some((module, file)) = todo.pop() {
        let text =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for (name, path_attr) in file_mods(&code_only(&text), &text) {
            let dir = file.parent().unwrap();
            let child = match path_attr {
                Some(p) => dir.join(p),
                None => {
                    let stem = file.file_stem().unwrap().to_string_lossy();
                    let base = if ["lib", "main", "mod"].contains(&stem.as_ref()) {
                        dir.to_path_buf()
                    } else {
                        dir.join(stem.as_ref())
                    };
                    let flat = base.join(format!("{name}.rs"));
                    if flat.is_file() {
                        flat
                    } else {
                        base.join(&name).join("mod.rs")
                    }
                }
            };
            todo.push((format!("{module}::{name}"), child));
        }
        let files = tree.entry(module).or_default();
        if !files.contains(&file) {
            files.push(file);
        }
    }
    tree
}

/// The `mod NAME;` declarations of a file (not inline `mod NAME { }`), each
/// with its `#[path = "..."]`, read from the raw text at the same offsets.
fn file_mods(code: &str, raw: &str) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    let lines: Vec<&str> = code.lines().collect();
    let raw_lines: Vec<&str> = raw.lines().collect();
    for (n, line) in lines.iter().enumerate() {
        let t = line.trim();
        let t = t
            .strip_prefix("pub(crate) ")
            .or_else(|| t.strip_prefix("pub "))
            .unwrap_or(t);
        // `per_os!(…);` (lib.rs's macro of the one platform pattern)
        // declares `mod unix;` and `mod windows;`.
        if t.starts_with("per_os!(") {
            out.push(("unix".to_owned(), None));
            out.push(("windows".to_owned(), None));
            continue;
        }
        let Some(name) = t.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) else {
            continue;
        };
        // Attributes directly above: a #[path = "..."] among them.
        let mut path = None;
        for k in (0..n).rev() {
            let above = raw_lines[k].trim();
            if !above.starts_with("#[") {
                break;
            }
            if let Some(p) = above
                .strip_prefix("#[path = \"")
                .and_then(|r| r.strip_suffix("\"]"))
            {
                path = Some(p.to_owned());
            }
        }
        out.push((name.trim().to_owned(), path));
    }
    out
}

/// One reference: from module, to module, where.
struct Reference {
    from: String,
    to: String,
    at: String,
}

/// Every module path named in `module`'s `file`.
fn references(module: &str, file: &Path, modules: &BTreeSet<String>, src: &Path) -> Vec<Reference> {
    let raw = std::fs::read_to_string(file).unwrap();
    let code = without_test_modules(&code_only(&raw));
    let chars: Vec<char> = code.chars().collect();
    let inline = inline_depths(&chars);
    let rel = file
        .strip_prefix(src.parent().unwrap())
        .unwrap_or(file)
        .display()
        .to_string();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '\n' {
            line += 1;
        }
        let starts = ["crate::", "super::", "self::"].into_iter().find(|s| {
            chars[i..].starts_with(&s.chars().collect::<Vec<_>>())
                && (i == 0
                    || !(chars[i - 1].is_alphanumeric()
                        || chars[i - 1] == '_'
                        || chars[i - 1] == '$'))
        });
        let Some(_) = starts else {
            i += 1;
            continue;
        };
        let (paths, end) = path_tree(&chars, i);
        for p in paths {
            if let Some(to) = resolve(module, inline[i], &p, modules) {
                out.push(Reference {
                    from: module.to_owned(),
                    to,
                    at: format!("{rel}:{line}"),
                });
            }
        }
        // Count the newlines skipped over.
        line += chars[i..end].iter().filter(|&&c| c == '\n').count();
        i = end.max(i + 1);
    }
    out
}

/// `code` with every `#[cfg(test)]` inline module blanked (lines kept).
fn without_test_modules(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut skip_depth: Option<i64> = None;
    let mut depth: i64 = 0;
    let mut armed = false;
    for line in code.split_inclusive('\n') {
        let t = line.trim();
        if skip_depth.is_none() && armed && t.contains("mod ") && t.ends_with('{') {
            skip_depth = Some(depth);
        }
        if t.starts_with("#[cfg(test)]") {
            armed = true;
        } else if !t.starts_with("#[") && !t.is_empty() {
            armed = false;
        }
        for c in line.chars() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => {}
            }
        }
        if let Some(d) = skip_depth {
            out.extend(line.chars().map(|c| if c == '\n' { '\n' } else { ' ' }));
            if depth <= d {
                skip_depth = None;
            }
        } else {
            out.push_str(line);
        }
    }
    out
}

/// For each char: how many inline `mod NAME {` blocks enclose it.
fn inline_depths(chars: &[char]) -> Vec<usize> {
    let text: String = chars.iter().collect();
    let mut out = vec![0; chars.len()];
    let mut stack: Vec<i64> = Vec::new();
    let mut depth: i64 = 0;
    let mut pending = false;
    let mut i = 0;
    for (n, c) in text.chars().enumerate() {
        if c == 'm' && text[i..].starts_with("mod ") && (n == 0 || !chars[n - 1].is_alphanumeric())
        {
            let rest = &text[i + 4..];
            let name_end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            pending = rest[name_end..].trim_start().starts_with('{');
        }
        match c {
            '{' => {
                depth += 1;
                if pending {
                    stack.push(depth);
                    pending = false;
                }
            }
            '}' => {
                if stack.last() == Some(&depth) {
                    stack.pop();
                }
                depth -= 1;
            }
            _ => {}
        }
        out[n] = stack.len();
        i += c.len_utf8();
    }
    out
}

/// The paths of the path (or `use` tree) starting at `i`, braces
/// expanded, as segment lists; and where it ends.
fn path_tree(chars: &[char], i: usize) -> (Vec<Vec<String>>, usize) {
    let mut prefix = Vec::new();
    let mut j = i;
    loop {
        let start = j;
        while j < chars.len() && (chars[j].is_alphanumeric() || chars[j] == '_') {
            j += 1;
        }
        if j > start {
            prefix.push(chars[start..j].iter().collect::<String>());
        }
        let k = skip_ws(chars, j);
        if chars.get(k) == Some(&':') && chars.get(k + 1) == Some(&':') {
            j = skip_ws(chars, k + 2);
            if chars.get(j) == Some(&'{') {
                let mut out = Vec::new();
                j += 1;
                loop {
                    j = skip_ws(chars, j);
                    match chars.get(j) {
                        None => return (out, j),
                        Some('}') => return (out, j + 1),
                        Some(',') => j += 1,
                        Some(_) => {
                            let (inner, end) = path_tree(chars, j);
                            for p in inner {
                                out.push(prefix.iter().cloned().chain(p).collect());
                            }
                            if inner_is_empty(end, j) {
                                j += 1;
                            } else {
                                j = end;
                            }
                        }
                    }
                }
            }
            continue;
        }
        return (vec![prefix], j);
    }
}

fn inner_is_empty(end: usize, start: usize) -> bool {
    end <= start
}

fn skip_ws(chars: &[char], mut j: usize) -> usize {
    while j < chars.len() && chars[j].is_whitespace() {
        j += 1;
    }
    j
}

/// The deepest module `path` (as written in `module`, inside `inline`
/// inline modules) reaches; `None` for `self`/`super` that stay in the file.
fn resolve(
    module: &str,
    inline: usize,
    path: &[String],
    modules: &BTreeSet<String>,
) -> Option<String> {
    let mut segs: Vec<String> = module.split("::").map(str::to_owned).collect();
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            segs = vec!["crate".to_owned()];
            rest = &rest[1..];
        }
        Some("self") if inline > 0 => return None,
        Some("self") => rest = &rest[1..],
        Some("super") => {
            let supers = rest.iter().take_while(|s| *s == "super").count();
            if supers <= inline {
                return None;
            }
            for _ in 0..supers - inline {
                segs.pop();
            }
            rest = &rest[supers..];
        }
        _ => return None,
    }
    for s in rest {
        let deeper = format!("{}::{s}", segs.join("::"));
        if modules.contains(&deeper) {
            segs.push(s.clone());
        } else {
            break;
        }
    }
    Some(segs.join("::"))
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
fn sibling_cycles(tree: &BTreeMap<String, Vec<PathBuf>>, refs: &[Reference]) -> Vec<String> {
    let mut found = Vec::new();
    for parent in tree.keys() {
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
    let src = root().join("src");
    let tree = module_tree(&src);
    let modules: BTreeSet<String> = tree.keys().cloned().collect();
    let mut refs = Vec::new();
    for (module, files) in &tree {
        for f in files {
            refs.extend(references(module, f, &modules, &src));
        }
    }
    verdict("import circles", &sibling_cycles(&tree, &refs));
}

/// The module walk reaches every file of `src/` (but the binary's
/// `main.rs`), so no file escapes the import check.
#[test]
fn the_module_walk_reaches_every_source_file() {
    let src = root().join("src");
    let tree = module_tree(&src);
    let walked: BTreeSet<PathBuf> = tree.values().flatten().cloned().collect();
    let mut missing = Vec::new();
    for f in rust_files(&src) {
        if f != src.join("main.rs") && !walked.contains(&f) {
            missing.push(f.display().to_string());
        }
    }
    assert!(
        missing.is_empty(),
        "not reached from src/lib.rs: {missing:?}"
    );
    assert!(
        tree.contains_key("crate::store::etcd::round"),
        "{:?}",
        tree.keys()
    );
}

/// The checker finds a circle it is shown, and none where there is none.
#[test]
fn the_circle_check_finds_a_planted_circle() {
    let tree: BTreeMap<String, Vec<PathBuf>> =
        ["crate", "crate::a", "crate::a::x", "crate::b", "crate::c"]
            .iter()
            .map(|m| ((*m).to_owned(), Vec::new()))
            .collect();
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
    assert!(sibling_cycles(&tree, &fine).is_empty());
    let circle = [
        r("crate::a::x", "crate::b"),
        r("crate::b", "crate::c"),
        r("crate::c", "crate::a"),
    ];
    let found = sibling_cycles(&tree, &circle);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0]
            .starts_with("import circle under crate: crate::a -> crate::b -> crate::c -> crate::a"),
        "{}",
        found[0]
    );
    // Paths in use trees and in code, comments and strings left out.
    let code = code_only(
        "use crate::{a::x, b};\n// crate::c\nlet s = \"crate::c\";\nsuper::super::c::f();\n",
    );
    let chars: Vec<char> = code.chars().collect();
    let (paths, _) = path_tree(&chars, 4);
    assert_eq!(paths, [vec!["crate", "a", "x"], vec!["crate", "b"]]);
    assert!(!code.contains("crate::c"));
}

// --------------------------------------------------- 2. repeated blocks

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

/// The lines of `text` that count: (line number, whitespace collapsed).
fn significant_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut mirror = false;
    for (n, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.is_empty() {
            mirror = false;
            continue;
        }
        if t.starts_with("// mirror:") {
            mirror = true;
            continue;
        }
        let punctuation = t
            .chars()
            .all(|c| "{}()[];,".contains(c) || c.is_whitespace());
        if mirror || t.starts_with("//") || punctuation {
            continue;
        }
        out.push((n + 1, t.split_whitespace().collect::<Vec<_>>().join(" ")));
    }
    out
}

/// Blocks of at least `min` significant lines found twice: one line per
/// pair of copies, `file:line-line` of each.
fn repeated_blocks(files: &[(String, Vec<(usize, String)>)], min: usize) -> Vec<String> {
    // Every window of `min` lines, by its text.
    let mut seen: HashMap<Vec<&str>, Vec<(usize, usize)>> = HashMap::new();
    for (fi, (_, lines)) in files.iter().enumerate() {
        for start in 0..lines.len().saturating_sub(min - 1) {
            let key: Vec<&str> = lines[start..start + min]
                .iter()
                .map(|(_, l)| l.as_str())
                .collect();
            seen.entry(key).or_default().push((fi, start));
        }
    }
    // Window pairs, then runs of consecutive pairs merged into one block.
    let mut pairs: BTreeSet<((usize, usize), (usize, usize))> = BTreeSet::new();
    for places in seen.values() {
        for (k, a) in places.iter().enumerate() {
            for b in &places[k + 1..] {
                let overlapping = a.0 == b.0 && b.1 < a.1 + min;
                if !overlapping {
                    pairs.insert((*a, *b));
                }
            }
        }
    }
    let mut out = Vec::new();
    for &(a, b) in &pairs {
        let continues = a.1 > 0 && b.1 > 0 && pairs.contains(&((a.0, a.1 - 1), (b.0, b.1 - 1)));
        if continues {
            continue;
        }
        let mut len = min;
        while pairs.contains(&((a.0, a.1 + len - min + 1), (b.0, b.1 + len - min + 1))) {
            len += 1;
        }
        let span = |(f, s): (usize, usize)| {
            let (name, lines) = &files[f];
            format!("{name}:{}-{}", lines[s].0, lines[s + len - 1].0)
        };
        out.push(format!("{len} lines repeated: {} and {}", span(a), span(b)));
    }
    out
}

#[test]
fn no_block_of_six_lines_repeated_in_src() {
    let src = root().join("src");
    let files: Vec<(String, Vec<(usize, String)>)> = rust_files(&src)
        .into_iter()
        .filter(|f| !f.ends_with("store/etcd/proto.rs"))
        .map(|f| {
            let text = std::fs::read_to_string(&f).unwrap();
            let name = f.strip_prefix(root()).unwrap().display().to_string();
            (name, significant_lines(&text))
        })
        .collect();
    verdict("repeated blocks", &repeated_blocks(&files, 6));
}

/// The block check finds a planted copy, merges a longer run into one
/// block, skips punctuation and marked mirrors.
#[test]
fn the_block_check_finds_a_planted_copy() {
    let block = "let a = 1;\nlet b = 2;\n}\nlet c = 3;\nlet d = 4;\n// note\nlet e = 5;\nlet f = 6;\nlet g = 7;\n";
    let one = significant_lines(&format!("fn x() {{\n{block}}}\n"));
    let two = significant_lines(&format!("\n\nfn y() {{\n{block}}}\n"));
    let files = vec![
        ("one.rs".to_owned(), one),
        ("two.rs".to_owned(), two.clone()),
    ];
    let found = repeated_blocks(&files, 6);
    assert_eq!(
        found,
        ["7 lines repeated: one.rs:2-10 and two.rs:4-12"],
        "{found:?}"
    );
    let mirrored = significant_lines(&format!("// mirror: of one.rs, for the test\n{block}"));
    let files = vec![("one.rs".to_owned(), two), ("m.rs".to_owned(), mirrored)];
    assert!(repeated_blocks(&files, 6).is_empty());
}

// ------------------------------------------------- 3. raw reply reads

/// The raw JSON reads on one line of test code.
fn raw_reads(line: &str) -> usize {
    let t = line.trim_start();
    if t.starts_with("//") {
        return 0;
    }
    let readers = [
        ".get(\"",
        ".pointer(",
        ".as_u64()",
        ".as_i64()",
        ".as_f64()",
        ".as_bool()",
        ".as_array()",
        ".as_object()",
        ".is_null()",
    ];
    let calls: usize = readers.iter().map(|r| line.matches(r).count()).sum();
    calls + string_indexes(line)
}

/// How many `["ident"]` indexes `line` holds.
fn string_indexes(line: &str) -> usize {
    let mut n = 0;
    let mut rest = line;
    while let Some(i) = rest.find("[\"") {
        let after = &rest[i + 2..];
        let name_end = after
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        // An index follows a value (a name, `)` or `]`); `["x"]` after
        // `(`, `&`, `,` or a space is an array literal, not a read.
        let indexes = rest[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ')' || c == ']');
        if indexes && name_end > 0 && after[name_end..].starts_with("\"]") {
            n += 1;
        }
        rest = after;
    }
    n
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
        let text = std::fs::read_to_string(&f).unwrap();
        let reads: usize = text.lines().map(raw_reads).sum();
        if reads > 0 {
            total += reads;
            findings.push(format!("{rel}: {reads} raw reads"));
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
    assert_eq!(raw_reads(r#"assert_eq!(v["holder"]["fence"], 1);"#), 2);
    assert_eq!(
        raw_reads(r#"let t = v.get("token").and_then(|t| t.as_str());"#),
        1
    );
    assert_eq!(
        raw_reads("let n = v.as_u64().unwrap() + w.as_array().len();"),
        2
    );
    assert_eq!(raw_reads(r#"// v["holder"] in a comment"#), 0);
    // Array literals of one word are not reads.
    assert_eq!(
        raw_reads(r#"lock.op("run").command(["true"]); git(&["prune"]);"#),
        0
    );
    assert_eq!(
        raw_reads(r#"let lock = Lock::new(&cwd, "s", "o/r"); a[0]; m["x y"];"#),
        0
    );
}
