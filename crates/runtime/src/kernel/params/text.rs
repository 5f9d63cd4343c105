//! Reading C declarations: object-like macros, comments, identifiers, parentheses, top-level
//! commas, and one parameter's type (see the [parent module](super); type aliases are read in
//! `alias`).

use super::{vector_size, Elem, Kind, Param, Plain};

/// The object-like macros a source `#define`s, for expansion in parameter lists.
pub(super) struct Macros<'s> {
    /// Each name with its body; `None` for a function-like macro, one defined twice with
    /// other bodies, or one `#undef`ined: a parameter list naming it cannot be read.
    defined: std::collections::HashMap<&'s str, Option<String>>,
}

impl<'s> Macros<'s> {
    pub(super) fn of(source: &'s str) -> Macros<'s> {
        let mut defined = std::collections::HashMap::new();
        let mut lines = source.lines();
        while let Some(line) = lines.next() {
            let Some(directive) = line.trim_start().strip_prefix('#') else {
                continue;
            };
            let directive = directive.trim_start();
            let (undef, rest) = if let Some(r) = directive.strip_prefix("define") {
                (false, r)
            } else if let Some(r) = directive.strip_prefix("undef") {
                (true, r)
            } else {
                continue;
            };
            if !rest.starts_with([' ', '\t']) {
                continue;
            }
            let rest = rest.trim_start();
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            let (name, after) = rest.split_at(end);
            if name.is_empty() {
                continue;
            }
            // The body runs over continued lines.
            let mut body = after.to_string();
            while body.trim_end().ends_with('\\') {
                let cut = body.trim_end().len() - 1;
                body.truncate(cut);
                body.push(' ');
                body.push_str(lines.next().unwrap_or(""));
            }
            let body = (!undef && !after.starts_with('(')).then(|| body.trim().to_string());
            defined
                .entry(name)
                .and_modify(|b: &mut Option<String>| {
                    if *b != body {
                        *b = None;
                    }
                })
                .or_insert(body);
        }
        Macros { defined }
    }

    /// `list` with its object-like macros expanded, or `None` when it names a macro that
    /// cannot be expanded so.
    pub(super) fn expand(&self, list: &str) -> Option<String> {
        let mut text = list.to_string();
        // Bounded: a macro that names itself stays unexpanded in C; here it is unreadable.
        for _ in 0..16 {
            let mut out = String::with_capacity(text.len());
            let mut changed = false;
            let mut rest = text.as_str();
            while let Some(c) = rest.chars().next() {
                if c.is_ascii_alphabetic() || c == '_' {
                    let end = rest
                        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .unwrap_or(rest.len());
                    let word = &rest[..end];
                    match self.defined.get(word) {
                        Some(Some(body)) => {
                            out.push(' ');
                            out.push_str(body);
                            out.push(' ');
                            changed = true;
                        }
                        Some(None) => return None,
                        None => out.push_str(word),
                    }
                    rest = &rest[end..];
                } else {
                    out.push(c);
                    rest = &rest[c.len_utf8()..];
                }
            }
            if !changed {
                return Some(out);
            }
            text = out;
        }
        None
    }
}

pub(super) fn strip_comments(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("//") {
            rest = r.find('\n').map_or("", |i| &r[i..]);
        } else if let Some(r) = rest.strip_prefix("/*") {
            rest = r.find("*/").map_or("", |i| &r[i + 2..]);
            out.push(' ');
        } else {
            let c = rest.chars().next().unwrap_or(' ');
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// The byte offset of `name` in `text` as a whole identifier.
pub(super) fn find_ident(text: &str, name: &str) -> Option<usize> {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut from = 0;
    while let Some(i) = text[from..].find(name) {
        let at = from + i;
        let before = text[..at].chars().next_back().is_none_or(|c| !is_ident(c));
        let after = text[at + name.len()..]
            .chars()
            .next()
            .is_none_or(|c| !is_ident(c));
        if before && after {
            return Some(at);
        }
        from = at + name.len();
    }
    None
}

pub(super) fn matching_paren(text: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in text[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return Some(open + i);
                }
            }
            _ => {}
        }
    }
    None
}

pub(super) fn split_top_level(list: &str) -> impl Iterator<Item = &str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in list.char_indices() {
        match c {
            '(' | '<' | '[' => depth += 1,
            ')' | '>' | ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&list[start..]);
    parts.into_iter()
}

/// Whether `text` has the word `const` outside angle brackets (in `Pair<const int, float>`
/// it qualifies a template argument, not the elements).
fn has_outer_const(text: &str) -> bool {
    let (mut depth, mut start) = (0i32, None);
    for (i, c) in text.char_indices().chain([(text.len(), ' ')]) {
        if c.is_ascii_alphanumeric() || c == '_' {
            start = start.or(Some(i));
            continue;
        }
        if let Some(s) = start.take() {
            if depth == 0 && &text[s..i] == "const" {
                return true;
            }
        }
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            _ => {}
        }
    }
    false
}

pub(super) fn parse_param(text: &str) -> Option<Param> {
    if text.is_empty() {
        return None;
    }
    let shown = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let param = |kind| {
        Some(Param {
            text: shown.clone(),
            kind,
            unresolved: None,
        })
    };
    if text.contains('(') {
        // A function pointer, or a call in the declaration: nothing more is read from it.
        return if text.contains('*') {
            param(Kind::Pointer {
                writable: true,
                elem: Elem::Unknown,
            })
        } else {
            param(Kind::Value(Elem::Unknown))
        };
    }
    // The levels of indirection outside template arguments and array sizes (`float x[N*M]`
    // has one level, an array): `*`s, then `[`s.
    let (mut depth, mut in_size) = (0i32, 0i32);
    let (mut stars, mut brackets) = (Vec::new(), Vec::new());
    for (i, c) in text.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            '*' if depth == 0 && in_size == 0 => stars.push(i),
            '[' => {
                if depth == 0 && in_size == 0 {
                    brackets.push(i);
                }
                in_size += 1;
            }
            ']' => in_size -= 1,
            _ => {}
        }
    }
    let (last_star, first_bracket) = (stars.last().copied(), brackets.first().copied());
    let Some(level) = first_bracket.or(last_star) else {
        return param(Kind::Value(Elem::of_c(&type_words(text, true))));
    };
    // The pointer passed is the first array level (`int c[]`, `float* p[]`), else the last `*`
    // (`float* x`, `const float** p`); its elements' qualifiers stand between it and the level
    // before it.
    let qualifiers_from = match first_bracket {
        Some(_) => last_star.map_or(0, |s| s + 1),
        None => stars.iter().rev().nth(1).map_or(0, |s| s + 1),
    };
    // Empty where a `*` follows the array (not C): no qualifier is read from it.
    let writable = !has_outer_const(text.get(qualifiers_from..level).unwrap_or_default());
    let elem = match (stars.len(), brackets.len()) {
        // The elements are pointers, or arrays.
        (_, 2..) => Elem::Unknown,
        (1.., 1) | (2.., 0) => Elem::Sized(8),
        // `const int c[]` names its parameter before the bracket; `int* x` after the star.
        (0, _) => Elem::of_c(&type_words(&text[..level], true)),
        (_, 0) => Elem::of_c(&type_words(&text[..level], false)),
    };
    param(Kind::Pointer { writable, elem })
}

/// The words of the type in `text`, without its qualifiers and, where `named` and one is
/// given, the parameter's name: the last word, unless it belongs to the type (`unsigned
/// short` has no name). Empty for a template.
fn type_words(text: &str, named: bool) -> Vec<&str> {
    if text.contains(['<', ':']) {
        return Vec::new();
    }
    let mut words: Vec<&str> = text
        .split(|c: char| c.is_whitespace() || matches!(c, '&'))
        .filter(|w| {
            !w.is_empty()
                && !matches!(
                    *w,
                    "const"
                        | "volatile"
                        | "__restrict__"
                        | "restrict"
                        | "__restrict"
                        | "struct"
                        | "__grid_constant__"
                )
        })
        .collect();
    let type_word = |w: &str| {
        matches!(
            w,
            "int"
                | "char"
                | "short"
                | "long"
                | "unsigned"
                | "signed"
                | "float"
                | "double"
                | "bool"
                | "void"
        ) || Plain::of_c(&[w]).is_some()
            || vector_size(w).is_some()
    };
    if named && words.len() > 1 && words.last().is_some_and(|w| !type_word(w)) {
        words.pop();
    }
    words
}
