//! Bounds on the JSON schemas a request may bring, checked before a schema reaches the
//! grammar compiler.
//!
//! llguidance compiles a schema by recursion: into each subschema and through each
//! `$ref` it has not defined yet. A chain of references (`$defs` whose entries refer to
//! the next) nests without limit in a flat document, and a few hundred links overflow a
//! thread's stack, which aborts the whole process. So before compiling, the schema is
//! read as a graph, without recursion: a node for every object and array in the
//! document, an edge to each child and from each `$ref` to what it names. A compile can
//! only recurse along a path of this graph that visits no node twice (the compiler
//! defines each reference once), and such a path is no longer than the longest path
//! through the graph's strongly connected components, each counted at its size. That
//! bound, the node count and the widest object are checked against [`SchemaLimits`].
//!
//! References the reader cannot resolve to a node (anchors, `$id`-relative URIs,
//! pointers into nothing) are taken to lead anywhere a reference can land: the root and
//! every node that declares an `$id` or an anchor. The bound stays an upper bound; it is
//! only looser for such schemas.
//!
//! The compile itself also runs on a thread with a large stack
//! ([`super::COMPILE_STACK_BYTES`]), sized far beyond what a schema within these limits
//! needs, so a case this reading misses fails one request, not the process.

use serde_json::Value;

use super::GrammarError;

/// How large a schema may be.
#[derive(Clone, Copy, Debug)]
pub struct SchemaLimits {
    /// Most objects and arrays on one path through the schema, references followed.
    /// A property of an object is two levels (the `properties` map and the property).
    pub max_depth: usize,
    /// Most objects and arrays in the whole schema.
    pub max_nodes: usize,
    /// Most properties (or `required` names) one object may list.
    pub max_properties: usize,
    /// Most characters in all the schema's `const` and `enum` strings together. The
    /// grammar engine walks what a long literal forces again at every token, so one
    /// request with a 200 KB `const` slowed every other sequence in the batch.
    pub max_literal_chars: usize,
}

impl Default for SchemaLimits {
    /// Well beyond what real schemas use (OpenAI's structured outputs allow 10 levels of
    /// nesting and 5,000 properties in all), and far inside what the compile thread's
    /// stack holds (a test compiles schemas at these limits). Literals: OpenAI's own
    /// bound, 120,000 characters of names, `enum` and `const` values in all.
    fn default() -> Self {
        SchemaLimits {
            max_depth: 256,
            max_nodes: 50_000,
            max_properties: 2_000,
            max_literal_chars: 120_000,
        }
    }
}

/// A schema's graph: the nodes each node leads to (node 0 is the root).
struct Graph {
    edges: Vec<Vec<u32>>,
}

/// The objects and arrays of a schema as they are found, breadth first.
#[derive(Default)]
struct Nodes<'a> {
    /// Node ids by the address of their value, which is stable while the schema is
    /// borrowed.
    id_of: std::collections::HashMap<*const Value, u32>,
    values: Vec<&'a Value>,
    edges: Vec<Vec<u32>>,
}

impl<'a> Nodes<'a> {
    fn add(&mut self, v: &'a Value) -> u32 {
        let id = self.values.len() as u32;
        self.id_of.insert(v as *const Value, id);
        self.values.push(v);
        self.edges.push(Vec::new());
        id
    }
}

/// Refuse `schema` if it is past `limits`, naming the limit and how to stay within it.
pub fn check_schema(schema: &Value, limits: &SchemaLimits) -> Result<(), GrammarError> {
    let graph = build_graph(schema, limits)?;
    let depth = longest_path(&graph);
    if depth > limits.max_depth {
        return Err(GrammarError::TooComplex(format!(
            "the schema nests up to {depth} levels (objects and arrays, `$ref`s followed), more than the {} this server compiles; flatten it or shorten its chains of references",
            limits.max_depth
        )));
    }
    Ok(())
}

/// The graph of `schema`'s objects and arrays (node 0 is the root; the last node stands
/// for "wherever an unresolved reference lands").
fn build_graph(schema: &Value, limits: &SchemaLimits) -> Result<Graph, GrammarError> {
    if !schema.is_object() && !schema.is_array() {
        return Ok(Graph {
            edges: vec![Vec::new()],
        });
    }
    let mut nodes = Nodes::default();
    let mut refs: Vec<(u32, &str)> = Vec::new();
    let mut landing: Vec<u32> = vec![0];
    let too_many = || {
        GrammarError::TooComplex(format!(
            "the schema has more than {} objects and arrays, more than this server compiles; send a smaller schema",
            limits.max_nodes
        ))
    };
    nodes.add(schema);
    let mut literal_chars = 0usize;
    let mut next = 0;
    while next < nodes.values.len() {
        let (id, value) = (next as u32, nodes.values[next]);
        next += 1;
        let children: Box<dyn Iterator<Item = &Value>> = match value {
            Value::Object(map) => {
                if let Some(Value::String(target)) = map.get("$ref") {
                    refs.push((id, target));
                }
                let strings = |v: Option<&Value>| -> usize {
                    match v {
                        Some(Value::String(s)) => s.chars().count(),
                        Some(Value::Array(items)) => items
                            .iter()
                            .filter_map(Value::as_str)
                            .map(|s| s.chars().count())
                            .sum(),
                        _ => 0,
                    }
                };
                literal_chars += strings(map.get("const")) + strings(map.get("enum"));
                if literal_chars > limits.max_literal_chars {
                    return Err(GrammarError::TooComplex(format!(
                        "the schema's `const` and `enum` strings hold more than {} characters in all, more than this server compiles (OpenAI's bound too); send shorter literals, or a pattern",
                        limits.max_literal_chars
                    )));
                }
                if ["$id", "id", "$anchor", "$dynamicAnchor"]
                    .iter()
                    .any(|k| map.get(*k).is_some_and(Value::is_string))
                {
                    landing.push(id);
                }
                for key in ["properties", "required"] {
                    let n = match map.get(key) {
                        Some(Value::Object(m)) => m.len(),
                        Some(Value::Array(a)) => a.len(),
                        _ => 0,
                    };
                    if n > limits.max_properties {
                        return Err(GrammarError::TooComplex(format!(
                            "an object of the schema lists {n} `{key}`, more than the {} this server compiles; split it",
                            limits.max_properties
                        )));
                    }
                }
                Box::new(map.values())
            }
            Value::Array(items) => Box::new(items.iter()),
            _ => Box::new(std::iter::empty()),
        };
        for child in children.filter(|c| c.is_object() || c.is_array()) {
            if nodes.values.len() >= limits.max_nodes {
                return Err(too_many());
            }
            let child_id = nodes.add(child);
            nodes.edges[id as usize].push(child_id);
        }
    }
    let Nodes {
        id_of, mut edges, ..
    } = nodes;
    let anywhere = edges.len() as u32;
    edges.push(landing);
    for (from, target) in refs {
        let to = target
            .strip_prefix('#')
            .and_then(|fragment| schema.pointer(&percent_decode(fragment)?))
            .and_then(|v| id_of.get(&(v as *const Value)).copied())
            .unwrap_or(anywhere);
        edges[from as usize].push(to);
    }
    Ok(Graph { edges })
}

/// A JSON pointer from a URI fragment (`%25` is `%`, and so on); None if malformed.
fn percent_decode(fragment: &str) -> Option<String> {
    if !fragment.contains('%') {
        return Some(fragment.to_string());
    }
    let bytes = fragment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The most nodes on a path from the root that repeats no node, bounded above by the longest path
/// through the strongly connected components, each weighing its size. Iterative
/// (Tarjan's algorithm with an explicit stack): the graph may be as deep as it is large.
fn longest_path(graph: &Graph) -> usize {
    let n = graph.edges.len();
    const UNSEEN: u32 = u32::MAX;
    let mut index = vec![UNSEEN; n];
    let mut low = vec![0u32; n];
    let mut on_stack = vec![false; n];
    let mut component = vec![UNSEEN; n];
    let mut stack: Vec<u32> = Vec::new();
    // The longest path starting in each component, known once the component closes:
    // Tarjan closes a component after every component it reaches.
    let mut longest_from: Vec<usize> = Vec::new();
    let mut counter = 0u32;
    // From the root only: every node a compile can reach is reachable from it.
    for start in 0..n.min(1) as u32 {
        if index[start as usize] != UNSEEN {
            continue;
        }
        // (node, next edge to look at)
        let mut calls: Vec<(u32, usize)> = vec![(start, 0)];
        index[start as usize] = counter;
        low[start as usize] = counter;
        counter += 1;
        stack.push(start);
        on_stack[start as usize] = true;
        while let Some(&mut (v, ref mut edge)) = calls.last_mut() {
            let vu = v as usize;
            if let Some(&w) = graph.edges[vu].get(*edge) {
                *edge += 1;
                let wu = w as usize;
                if index[wu] == UNSEEN {
                    index[wu] = counter;
                    low[wu] = counter;
                    counter += 1;
                    stack.push(w);
                    on_stack[wu] = true;
                    calls.push((w, 0));
                } else if on_stack[wu] {
                    low[vu] = low[vu].min(index[wu]);
                }
                continue;
            }
            calls.pop();
            if let Some(&(parent, _)) = calls.last() {
                low[parent as usize] = low[parent as usize].min(low[vu]);
            }
            if low[vu] != index[vu] {
                continue;
            }
            // v roots a component: pop it, then weigh it.
            let id = longest_from.len() as u32;
            let mut members = Vec::new();
            loop {
                let w = stack.pop().expect("v is on the stack");
                on_stack[w as usize] = false;
                component[w as usize] = id;
                members.push(w);
                if w == v {
                    break;
                }
            }
            let beyond = members
                .iter()
                .flat_map(|&m| graph.edges[m as usize].iter())
                .map(|&w| component[w as usize])
                .filter(|&c| c != id)
                .map(|c| longest_from[c as usize])
                .max()
                .unwrap_or(0);
            longest_from.push(members.len() + beyond);
        }
    }
    // Compiles start at the root (node 0): paths from elsewhere are not walked.
    component.first().map_or(0, |&c| longest_from[c as usize])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn depth(schema: &Value) -> usize {
        longest_path(&build_graph(schema, &SchemaLimits::default()).unwrap())
    }

    /// `$defs` d0 → d1 → … → d{n}: a flat document, nested n levels deep.
    pub(crate) fn reference_chain(n: usize) -> Value {
        let mut defs = serde_json::Map::new();
        for i in 0..n {
            defs.insert(
                format!("d{i}"),
                json!({"$ref": format!("#/$defs/d{}", i + 1)}),
            );
        }
        defs.insert(format!("d{n}"), json!({"type": "string"}));
        json!({"$ref": "#/$defs/d0", "$defs": defs})
    }

    #[test]
    fn reference_chains_count_every_link() {
        // root → $defs map → d0; d0 → d1 → … → d{n} by reference (d{n} is a leaf object).
        for n in [0, 1, 10, 300] {
            let d = depth(&reference_chain(n));
            assert!((n + 1..=n + 3).contains(&d), "chain of {n}: depth {d}");
        }
        let e = check_schema(&reference_chain(300), &SchemaLimits::default()).unwrap_err();
        assert!(
            matches!(e, GrammarError::TooComplex(_)) && e.to_string().contains("256"),
            "{e}"
        );
    }

    #[test]
    fn recursive_schemas_are_bounded_by_their_size_not_refused() {
        // A tree type: refers to itself.
        let tree = json!({
            "type": "object",
            "properties": {"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}},
        });
        let d = depth(&tree);
        assert!((3..=6).contains(&d), "{d}");
        check_schema(&tree, &SchemaLimits::default()).unwrap();
    }

    #[test]
    fn unresolved_references_lead_to_every_anchor() {
        // d0 → (anchor "x", by name) → a chain of 300 objects: the anchor is not a JSON
        // pointer, but the depth still counts the chain behind it.
        let mut chain = json!({"type": "string"});
        for _ in 0..150 {
            chain = json!({"type": "array", "items": chain});
        }
        let schema = json!({"$ref": "#x", "$defs": {"a": {"$anchor": "x", "allOf": [chain]}}});
        assert!(depth(&schema) > 150, "{}", depth(&schema));
        assert!(depth(&json!({"$ref": "#/nowhere"})) <= 2);
    }

    #[test]
    fn wide_objects_and_huge_schemas_are_refused_by_name() {
        let limits = SchemaLimits::default();
        let names: Vec<String> = (0..limits.max_properties + 1)
            .map(|i| format!("p{i}"))
            .collect();
        let wide = json!({"type": "object", "required": names});
        assert!(
            check_schema(&wide, &limits)
                .unwrap_err()
                .to_string()
                .contains("`required`")
        );
        let many = Value::Array(vec![json!({}); limits.max_nodes + 1]);
        assert!(
            check_schema(&json!({"enum": many}), &limits)
                .unwrap_err()
                .to_string()
                .contains("objects and arrays")
        );
        // Literals: a 200 KB `const`, or many `enum` strings adding up past the bound,
        // are refused; the bound itself compiles.
        let long = "x".repeat(limits.max_literal_chars + 1);
        let refused = check_schema(&json!({"const": long}), &limits).unwrap_err();
        assert!(
            refused.to_string().contains("`const` and `enum`"),
            "{refused}"
        );
        let options: Vec<String> = (0..2_001).map(|i| format!("{i:061}")).collect();
        let nested =
            json!({"type": "object", "properties": {"a": {"enum": options}, "b": {"const": "x"}}});
        assert!(check_schema(&nested, &limits).is_err());
        let at = json!({"const": "é".repeat(limits.max_literal_chars)});
        assert!(check_schema(&at, &limits).is_ok());
    }

    #[test]
    fn percent_escapes_in_pointers_resolve() {
        let schema = json!({"$ref": "#/$defs/a%20b", "$defs": {"a b": {"type": "object", "properties": {"x": {"type": "string"}}}}});
        // root → ($ref) "a b" → properties → x (4); without resolving, the ref would land
        // on the root only.
        assert_eq!(depth(&schema), 4 + 1, "root, $defs, a b, properties, x");
    }
}
