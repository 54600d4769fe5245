//! The house rules: which room of `src/` may import which (ARCHITECTURE.md). The data
//! flows tree → speculate → store → model → drafting → serve → CLI, and a room imports
//! only rooms below it; a test fails when a file breaks that, naming the file, the room it took
//! from, and the line. Read from the source as text (`crate::ROOM` outside comments),
//! so a new import is caught before anyone looks at a picture of the house.

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
    ("replicate", &["store"]),
    ("simulate", &["corpus", "speculate", "store", "tree"]),
    ("fuzzing", &["speculate", "store", "tree"]),
    // Its tests replay a corpus through the simulator.
    (
        "drafting",
        &["model", "speculate", "store", "tree", "corpus", "simulate"],
    ),
    (
        "serve",
        &[
            "drafting",
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

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
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
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
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
