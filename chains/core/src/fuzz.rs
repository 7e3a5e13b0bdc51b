//! Property-test strategies for the chain crates' decoders: every chain reads JSON that a node
//! or a man in the middle controls, so each decoder is fed recorded responses with one part
//! replaced by anything JSON can carry (wrong types, huge and negative numbers, odd strings,
//! missing fields). The rule the properties check is the same everywhere: a malformed answer
//! is an error, never a panic, and never a transfer that was not there. Shared here so the
//! chains do not each grow their own mutator.
//!
//! Proptest rather than `cargo fuzz`: fuzzing needs a nightly toolchain, which the project's
//! machines do not have, while these run on stable inside `cargo test`, briefly, in CI.

use proptest::prelude::*;
use serde_json::{Map, Value};

/// Any JSON value, leaning to what breaks decoders: numbers at and past every integer
/// width, negative amounts, hex and base58-looking strings, empty and nested containers.
pub fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        Just(Value::from(u64::MAX)),
        Just(Value::from(i64::MIN)),
        any::<f64>().prop_map(Value::from),
        // Beyond u64 and beyond u128: numbers serde_json keeps only as text.
        Just(serde_json::from_str::<Value>("340282366920938463463374607431768211456").unwrap()),
        Just(serde_json::from_str::<Value>("1e400").unwrap_or(Value::Null)),
        ".*".prop_map(Value::String),
        "(0x)?[0-9a-fA-F]{0,80}".prop_map(Value::String),
        "[1-9A-HJ-NP-Za-km-z]{0,90}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-zA-Z_]{1,12}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// `original` with one of its nodes (chosen by `at`) replaced by `with`, removed from its
/// object or array, or its array element repeated; the root itself may be replaced.
pub fn mutated(original: &Value) -> impl Strategy<Value = Value> + use<> {
    let original = original.clone();
    (any::<prop::sample::Index>(), any_json(), 0..3u8).prop_map(move |(at, with, how)| {
        let mut value = original.clone();
        let count = nodes(&value);
        mutate(&mut value, at.index(count), &with, how);
        value
    })
}

/// Recorded values with up to three mutations each.
pub fn mutated_n(original: &Value) -> impl Strategy<Value = Value> + use<> {
    let once = mutated(original);
    (
        once,
        prop::collection::vec((any::<prop::sample::Index>(), any_json(), 0..3u8), 0..3),
    )
        .prop_map(|(mut value, more)| {
            for (at, with, how) in more {
                let count = nodes(&value);
                mutate(&mut value, at.index(count), &with, how);
            }
            value
        })
}

fn nodes(value: &Value) -> usize {
    1 + match value {
        Value::Array(items) => items.iter().map(nodes).sum(),
        Value::Object(fields) => fields.values().map(nodes).sum(),
        _ => 0,
    }
}

/// Applies the mutation to the node numbered `target` in depth-first order; returns the
/// nodes still to skip when the target is further on.
fn mutate(value: &mut Value, target: usize, with: &Value, how: u8) -> Option<usize> {
    if target == 0 {
        *value = with.clone();
        return None;
    }
    let mut left = target - 1;
    match value {
        Value::Array(items) => {
            for i in 0..items.len() {
                if left == 0 && how > 0 {
                    if how == 1 {
                        items.remove(i);
                    } else {
                        let again = items[i].clone();
                        items.insert(i, again);
                    }
                    return None;
                }
                left = mutate(&mut items[i], left, with, how)?;
            }
        }
        Value::Object(fields) => {
            let keys: Vec<String> = fields.keys().cloned().collect();
            for key in keys {
                if left == 0 && how == 1 {
                    fields.remove(&key);
                    return None;
                }
                left = mutate(fields.get_mut(&key).expect("key listed"), left, with, how)?;
            }
        }
        _ => {}
    }
    Some(left)
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest! {
        #[test]
        fn a_mutation_changes_at_most_the_chosen_node(original in any_json(), at in any::<prop::sample::Index>(), with in any_json()) {
            let mut value = original.clone();
            let target = at.index(nodes(&original));
            mutate(&mut value, target, &with, 0);
            if target == 0 {
                prop_assert_eq!(value, with);
            } else {
                prop_assert_eq!(nodes(&value), nodes(&original) - nodes_at(&original, target) + nodes(&with));
            }
        }
    }

    fn nodes_at(value: &Value, target: usize) -> usize {
        fn walk(value: &Value, left: &mut usize) -> Option<usize> {
            if *left == 0 {
                return Some(nodes(value));
            }
            *left -= 1;
            let children: Vec<&Value> = match value {
                Value::Array(items) => items.iter().collect(),
                Value::Object(fields) => fields.values().collect(),
                _ => Vec::new(),
            };
            children.into_iter().find_map(|child| walk(child, left))
        }
        let mut left = target;
        walk(value, &mut left).expect("target within the value")
    }
}
