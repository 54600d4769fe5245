//! The house rules: which room of `src/` may import which (ARCHITECTURE.md), and how long
//! a file or a function may grow. The data flows tree → speculate → store → model → engine
//! → drafting → serve → CLI, and a room imports only rooms below it; a test fails when a
//! file breaks that, naming the file, the room it took from, and the line. Read from the
//! source as text (`crate::ROOM` outside comments), so a new import is caught before
//! anyone looks at a picture of the house. Files stay under 1,000 lines and functions
//! under 150, so that each can be read whole.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Modules every room may use and which import no room: the vocabulary's identity, chat
/// messages and templates, opening an operator's files, the process's memory.
const SHARED: &[&str] = &["chat", "files", "vocab", "memory"];

/// What each room may import besides itself and [`SHARED`].
const ALLOWED: &[(&str, &[&str])] = &[
    ("tree", &[]),
    ("speculate", &["tree"]),
    ("corpus", &[]),
    ("store", &["tree", "corpus"]),
    ("model", &["speculate"]),
    ("engine", &["model", "speculate"]),
    ("replicate", &["store"]),
    ("simulate", &["corpus", "speculate", "store", "tree"]),
    ("fuzzing", &["speculate", "store", "tree"]),
    // Its tests replay a corpus through the simulator.
    (
        "drafting",
        &[
            "engine",
            "model",
            "speculate",
            "store",
            "tree",
            "corpus",
            "simulate",
        ],
    ),
    (
        "serve",
        &[
            "drafting",
            "engine",
            "model",
            "replicate",
            "speculate",
            "store",
            "tree",
        ],
    ),
    (
        "cli",
        &[
            "corpus",
            "drafting",
            "engine",
            "model",
            "replicate",
            "serve",
            "simulate",
            "speculate",
            "store",
            "tree",
        ],
    ),
    ("main", &["cli"]),
];

/// `src/` and every `.rs` file under it.
fn src_files() -> (PathBuf, Vec<PathBuf>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    (src, files)
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    files_under(
        dir,
        &[],
        &|p| p.extension().is_some_and(|e| e == "rs"),
        found,
    );
}

/// Every file under `dir` that `keep` takes, folders named in `skip` left out.
fn files_under(dir: &Path, skip: &[&str], keep: &dyn Fn(&Path) -> bool, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if !path
                .file_name()
                .is_some_and(|n| skip.iter().any(|s| n == *s))
            {
                files_under(&path, skip, keep, found);
            }
        } else if keep(&path) {
            found.push(path);
        }
    }
}

/// The rooms `text` names as `crate::ROOM`, outside comments, with the first line each.
fn rooms_named(text: &str) -> BTreeMap<String, usize> {
    let mut named = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let room: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !room.is_empty() {
                named.entry(room).or_insert(n + 1);
            }
        }
    }
    named
}

#[test]
fn every_room_imports_only_the_rooms_below_it() {
    let (src, files) = src_files();
    assert!(files.len() > 50, "found the sources: {}", files.len());
    let mut broken = Vec::new();
    let mut seen_rooms = std::collections::BTreeSet::new();
    for path in &files {
        let relative = path
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        let room = relative
            .split('/')
            .next()
            .unwrap()
            .trim_end_matches(".rs")
            .to_string();
        if room == "lib" {
            continue;
        }
        seen_rooms.insert(room.clone());
        let allowed: Vec<&str> = if SHARED.contains(&room.as_str()) {
            Vec::new()
        } else {
            let Some((_, rooms)) = ALLOWED.iter().find(|(r, _)| *r == room) else {
                broken.push(format!(
                    "src/{relative}: room {room} has no rule here; add it to ALLOWED (and to ARCHITECTURE.md)"
                ));
                continue;
            };
            let mut allowed: Vec<&str> = rooms.to_vec();
            allowed.extend(SHARED);
            allowed
        };
        let text = std::fs::read_to_string(path).unwrap();
        for (named, line) in rooms_named(&text) {
            if named != room && !allowed.contains(&named.as_str()) {
                broken.push(format!(
                    "src/{relative}:{line}: room {room} imports {named}, which it may not"
                ));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "the house rules are broken:\n{}",
        broken.join("\n")
    );
    // The rules name rooms that exist: a renamed room must not leave a rule that
    // checks nothing.
    for (room, _) in ALLOWED {
        assert!(
            seen_rooms.contains(*room),
            "no room {room} in src/ any more"
        );
    }
}

#[test]
fn a_forbidden_import_is_found_and_comments_are_not() {
    let text = "//! see [`crate::store::snapshot`]\nuse crate::speculate::Draft;\n\
                let x = crate::serve::thing(); // crate::cli in a comment\n";
    let named = rooms_named(text);
    assert_eq!(
        named.into_iter().collect::<Vec<_>>(),
        [("serve".to_string(), 3), ("speculate".to_string(), 2)]
    );
}

/// A file's module path under `src/`: `model/cuda/mod.rs` is `model::cuda`.
fn module_of(relative: &str) -> Vec<String> {
    let trimmed = relative.trim_end_matches(".rs");
    let mut path: Vec<String> = trimmed.split('/').map(str::to_string).collect();
    if matches!(
        path.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        path.pop();
    }
    path
}

/// The path segments at the start of `text` (`a::b::{c::d, e}` gives `[a, b, c, d]` and
/// `[a, b, e]`), each a list of names.
fn paths_at(text: &str) -> Vec<Vec<String>> {
    let ident = |s: &str| -> usize {
        s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(s.len())
    };
    let mut segments = Vec::new();
    let mut rest = text;
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            // Each item of the group, at depth one, after the segments so far.
            let mut out = Vec::new();
            let (mut depth, mut start) = (0, 0);
            for (i, c) in group.char_indices() {
                let end_of_item = match c {
                    '{' => {
                        depth += 1;
                        false
                    }
                    '}' if depth > 0 => {
                        depth -= 1;
                        false
                    }
                    '}' => true,
                    ',' => depth == 0,
                    _ => false,
                };
                if end_of_item {
                    for tail in paths_at(group[start..i].trim_start()) {
                        out.push([segments.clone(), tail].concat());
                    }
                    start = i + 1;
                    if c == '}' {
                        break;
                    }
                }
            }
            return out;
        }
        let n = ident(rest);
        if n == 0 {
            break;
        }
        segments.push(rest[..n].to_string());
        rest = &rest[n..];
        match rest.strip_prefix("::") {
            Some(after) => rest = after.trim_start(),
            None => break,
        }
    }
    vec![segments]
}

/// The files each file takes names from: `crate::`, `super::` and `self::` paths, and a
/// `use` of a child module, resolved to the deepest module that is a file. A file's use
/// of its own ancestors (a child reading its parent's items) is not counted: a module
/// and its parent are one room.
fn file_imports(src: &Path, files: &[PathBuf]) -> BTreeMap<String, BTreeMap<String, usize>> {
    let relative: Vec<String> = files
        .iter()
        .map(|p| {
            p.strip_prefix(src)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/")
        })
        .collect();
    let modules: BTreeMap<Vec<String>, String> =
        relative.iter().map(|r| (module_of(r), r.clone())).collect();
    let mut imports = BTreeMap::new();
    for (path, rel) in files.iter().zip(&relative) {
        let here = module_of(rel);
        let text = std::fs::read_to_string(path).unwrap();
        let mut found: BTreeMap<String, usize> = BTreeMap::new();
        let code: Vec<&str> = text
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect();
        // The code as one text, for `use` groups over several lines, and where each
        // line starts in it.
        let joined = code.join("\n");
        let line_starts: Vec<usize> = code
            .iter()
            .scan(0, |at, line| {
                let start = *at;
                *at += line.len() + 1;
                Some(start)
            })
            .collect();
        for (n, line) in code.iter().enumerate() {
            let mut starts: Vec<(Vec<String>, usize)> = Vec::new();
            for (at, _) in line.match_indices("crate::") {
                starts.push((Vec::new(), at + "crate::".len()));
            }
            for (at, _) in line.match_indices("self::") {
                let before = line[..at].chars().last();
                if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                    starts.push((here.clone(), at + "self::".len()));
                }
            }
            let mut search = 0;
            while let Some(at) = line[search..].find("super::") {
                let at = search + at;
                let before = line[..at].chars().last();
                if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                    search = at + 1;
                    continue;
                }
                let mut base = here.clone();
                let mut end = at;
                while line[end..].starts_with("super::") {
                    base.pop();
                    end += "super::".len();
                }
                starts.push((base, end));
                search = end;
            }
            let trimmed = line.trim_start();
            let use_body = trimmed
                .strip_prefix("pub use ")
                .or_else(|| trimmed.strip_prefix("pub(super) use "))
                .or_else(|| trimmed.strip_prefix("pub(crate) use "))
                .or_else(|| trimmed.strip_prefix("use "));
            if let Some(body) = use_body {
                let at = line.len() - body.len();
                let first: String = body
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                let child = [here.clone(), vec![first]].concat();
                if modules.contains_key(&child) {
                    starts.push((here.clone(), at));
                }
            }
            for (base, at) in starts {
                let from = joined.get(line_starts[n] + at..).unwrap_or("");
                for tail in paths_at(from) {
                    let full = [base.clone(), tail].concat();
                    let target = (0..=full.len())
                        .rev()
                        .find_map(|k| modules.get(&full[..k]).map(|f| (k, f)));
                    let Some((k, target)) = target else { continue };
                    let ancestor = k <= here.len() && full[..k] == here[..k];
                    if !ancestor && target != rel {
                        found.entry(target.clone()).or_insert(n + 1);
                    }
                }
            }
        }
        imports.insert(rel.clone(), found);
    }
    imports
}

/// One circle of `imports`, as the files around it, if there is one.
fn a_circle(imports: &BTreeMap<String, BTreeMap<String, usize>>) -> Option<Vec<String>> {
    // Depth-first, colouring files: 1 on the path, 2 done.
    fn visit(
        file: &str,
        imports: &BTreeMap<String, BTreeMap<String, usize>>,
        colour: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        colour.insert(file.to_string(), 1);
        path.push(file.to_string());
        for next in imports.get(file).into_iter().flat_map(|m| m.keys()) {
            match colour.get(next.as_str()) {
                Some(1) => {
                    let from = path.iter().position(|f| f == next).unwrap();
                    return Some(path[from..].to_vec());
                }
                Some(_) => {}
                None => {
                    if let Some(circle) = visit(next, imports, colour, path) {
                        return Some(circle);
                    }
                }
            }
        }
        path.pop();
        colour.insert(file.to_string(), 2);
        None
    }
    let mut colour = BTreeMap::new();
    for file in imports.keys() {
        if !colour.contains_key(file)
            && let Some(circle) = visit(file, imports, &mut colour, &mut Vec::new())
        {
            return Some(circle);
        }
    }
    None
}

#[test]
fn no_files_import_each_other_in_a_circle() {
    let (src, files) = src_files();
    let imports = file_imports(&src, &files);
    // The resolution finds what it must: the forward pass takes its errors from
    // model/error.rs, and the stream its answers' fields from serve/api/answer.rs.
    assert!(imports["model/forward.rs"].contains_key("model/error.rs"));
    assert!(imports["serve/api/stream.rs"].contains_key("serve/api/answer.rs"));
    if let Some(circle) = a_circle(&imports) {
        let ties: Vec<String> = circle
            .iter()
            .zip(circle.iter().cycle().skip(1))
            .map(|(a, b)| format!("src/{a}:{} takes from src/{b}", imports[a][b]))
            .collect();
        panic!(
            "files import each other in a circle; move what they share into a module of its own:\n{}",
            ties.join("\n")
        );
    }
}

#[test]
fn a_circle_is_found_and_a_parent_is_not_one() {
    let dir = std::env::temp_dir().join(format!("house-rules-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("room")).unwrap();
    let write = |name: &str, text: &str| std::fs::write(dir.join(name), text).unwrap();
    write(
        "room/mod.rs",
        "mod a;\nmod b;\npub use a::Thing;\npub struct Shared;\n",
    );
    write(
        "room/a.rs",
        "use super::{Shared, b::{Other,\n    More}};\npub struct Thing;\n",
    );
    write(
        "room/b.rs",
        "// use super::a::Thing; in a comment\npub struct Other;\n",
    );
    let mut files = Vec::new();
    sources(&dir, &mut files);
    let imports = file_imports(&dir, &files);
    assert_eq!(
        imports["room/a.rs"].keys().collect::<Vec<_>>(),
        ["room/b.rs"],
        "a takes from b; its parent's items are its own room's"
    );
    assert_eq!(a_circle(&imports), None);
    write(
        "room/b.rs",
        "pub struct Other;\nfn f() { crate::room::a::Thing; }\n",
    );
    let imports = file_imports(&dir, &files);
    assert_eq!(
        a_circle(&imports),
        Some(vec!["room/a.rs".to_string(), "room/b.rs".to_string()])
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Most lines a file of `src/` may have.
const MOST_FILE_LINES: usize = 1_000;
/// Most lines a function may span, from its `fn` line to its closing brace.
const MOST_FUNCTION_LINES: usize = 150;

/// `text` with comments, string literals and character literals blanked (each byte made
/// a space, newlines kept), so that braces and `fn` are counted in code only.
fn code_only(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = bytes.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for b in &mut out[from..to.min(bytes.len())] {
            if *b != b'\n' {
                *b = b' ';
            }
        }
    };
    let mut i = 0;
    while i < bytes.len() {
        let rest = &text[i..];
        let end = if rest.starts_with("//") {
            i + rest.find('\n').unwrap_or(rest.len())
        } else if rest.starts_with("/*") {
            // Block comments nest in Rust.
            let (mut depth, mut j) = (0usize, i);
            loop {
                if text[j..].starts_with("/*") {
                    depth += 1;
                    j += 2;
                } else if text[j..].starts_with("*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break j;
                    }
                } else if j >= bytes.len() {
                    break j;
                } else {
                    j += 1;
                }
            }
        } else if let Some(hashes) = raw_string_hashes(rest) {
            let body = i + 2 + hashes.len();
            let close = format!("\"{hashes}");
            body + text[body..]
                .find(&close)
                .map_or(text.len() - body, |at| at + close.len())
        } else if rest.starts_with('"') {
            let mut j = i + 1;
            while j < bytes.len() && bytes[j] != b'"' {
                j += if bytes[j] == b'\\' { 2 } else { 1 };
            }
            j + 1
        } else if let Some(len) = char_literal_len(rest) {
            i + len
        } else {
            i += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        };
        blank(&mut out, i, end);
        i = end;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The `#`s of a raw string literal starting `rest` (`r"`, `r#"`, `br#"`…).
fn raw_string_hashes(rest: &str) -> Option<&str> {
    let after = rest.strip_prefix("br").or_else(|| rest.strip_prefix('r'))?;
    let hashes = &after[..after.len() - after.trim_start_matches('#').len()];
    after[hashes.len()..].starts_with('"').then_some(hashes)
}

/// The length of a character literal starting `rest` (`'x'`, `'\n'`, `'\u{7f}'`), or
/// None for a lifetime or label (`'a`).
fn char_literal_len(rest: &str) -> Option<usize> {
    let after = rest.strip_prefix('\'')?;
    let body = if after.starts_with('\\') {
        let close = after.find('\'')?;
        (close <= 10).then_some(close)?
    } else {
        after.chars().next()?.len_utf8()
    };
    after[body..].starts_with('\'').then_some(body + 2)
}

/// Each function of `text` that has a body: its name, first line and number of lines.
fn function_spans(text: &str) -> Vec<(String, usize, usize)> {
    let code = code_only(text);
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    let is_word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let bytes = code.as_bytes();
    let mut spans = Vec::new();
    let mut from = 0;
    while let Some(found) = code[from..].find("fn ") {
        let at = from + found;
        from = at + 3;
        if at > 0 && is_word(bytes[at - 1]) {
            continue;
        }
        let name: String = code[from..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            continue; // a `fn(…)` pointer type
        }
        // The body opens at the first `{` before any `;` (a declaration has none).
        let Some(open) = code[from..].find(['{', ';']).map(|o| from + o) else {
            break;
        };
        if bytes[open] == b';' {
            continue;
        }
        let mut depth = 0;
        let close = (open..bytes.len()).find(|&j| {
            match bytes[j] {
                b'{' => depth += 1,
                b'}' => depth -= 1,
                _ => {}
            }
            depth == 0
        });
        let close = close.unwrap_or(bytes.len() - 1);
        spans.push((name, line_of(at), line_of(close) - line_of(at) + 1));
    }
    spans
}

#[test]
fn no_file_is_over_its_limit_and_no_function_over_its_own() {
    let (src, files) = src_files();
    let mut broken = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let relative = path.strip_prefix(&src).unwrap().display();
        let lines = text.lines().count();
        if lines > MOST_FILE_LINES {
            broken.push(format!(
                "src/{relative}: {lines} lines (most {MOST_FILE_LINES})"
            ));
        }
        for (name, line, span) in function_spans(&text) {
            if span > MOST_FUNCTION_LINES {
                broken.push(format!(
                    "src/{relative}:{line}: fn {name} spans {span} lines (most \
                     {MOST_FUNCTION_LINES}): give its stages functions of their own"
                ));
            }
        }
    }
    assert!(files.len() > 100, "found the sources");
    assert!(
        broken.is_empty(),
        "over the house's limits:\n{}",
        broken.join("\n")
    );
}

#[test]
fn function_spans_skip_comments_strings_and_declarations() {
    let text = "/// fn not_this() {\nfn one() {\n    let s = \"}{ fn no() {\";\n    \
                let c = '}';\n    let r = r#\"}\"#;\n}\ntrait T {\n    fn declared(&self);\n    \
                fn with_body<'a>(&'a self) -> &'a str {\n        /* } */ \"\"\n    }\n}\n";
    assert_eq!(
        function_spans(text),
        [("one".to_string(), 2, 5), ("with_body".to_string(), 9, 3)]
    );
}

/// Every code file of the repository, not only the Rust under `src/`: kernels, tests,
/// tools, examples, benches and CI scripts (`.rs`, `.cu`, `.cpp`, `.h`, `.py`, `.sh`, and
/// files that start with `#!`), data folders left out. The same most lines as a Rust source, so that
/// a CUDA, Python or shell file cannot grow past it unseen (kernels.cu reached 1,079).
#[test]
fn no_code_file_of_any_language_is_over_the_file_limit() {
    let code = |path: &Path| {
        let by_extension = path
            .extension()
            .is_some_and(|e| ["rs", "cu", "cpp", "h", "py", "sh"].iter().any(|x| e == *x));
        let script = path.extension().is_none()
            && std::fs::read(path).is_ok_and(|bytes| bytes.starts_with(b"#!"));
        by_extension || script
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "tests", "tools", "examples", "benches", ".ci"] {
        let data = ["fixtures", "data", "workloads", "__pycache__"];
        files_under(&root.join(dir), &data, &code, &mut files);
    }
    let kinds = |ext: &str| {
        files
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == ext))
            .count()
    };
    assert!(
        kinds("cu") >= 2 && kinds("cpp") >= 3 && kinds("py") >= 10 && kinds("sh") >= 5,
        "found the code files"
    );
    assert!(
        files.iter().any(|p| p.ends_with(".ci/run")),
        "found the scripts without a suffix"
    );
    let broken: Vec<String> = files
        .iter()
        .filter_map(|path| {
            let lines = std::fs::read_to_string(path).ok()?.lines().count();
            let relative = path.strip_prefix(root).unwrap().display();
            (lines > MOST_FILE_LINES)
                .then(|| format!("{relative}: {lines} lines (most {MOST_FILE_LINES})"))
        })
        .collect();
    assert!(
        broken.is_empty(),
        "over the house's limit:\n{}",
        broken.join("\n")
    );
}
